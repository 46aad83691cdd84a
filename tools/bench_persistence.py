"""Measure the persistence log: appends per fsync policy, recovery, and compaction.

Run from the project root::

    python tools/bench_persistence.py [--append-mb 256] [--recovery-mb 1024] [--dir /tmp]
                                      [--only append,recovery,compaction]

Prints one line per measurement. Data goes under a temporary folder inside --dir, removed at
the end. Recovery is measured with a warm page cache (the data were just written; dropping
the cache needs root), best of --repeat runs, so it measures the CPU path, not the disk.
Numbers compare variants on one machine in one run; they are not thresholds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from persistence import LogStore, WriteQueueFullError, make_prefix  # noqa: E402

MB = 1 << 20
record_head_bytes = 32
key_bytes = 16
partition_count = 271
always_thread_count = 8


def keys_for(count: int) -> list[bytes]:
    return [b"key-%012d" % index for index in range(count)]


def prefixes_for(count: int) -> list[int]:
    return [make_prefix(1, index % partition_count) for index in range(count)]


class Clock:
    """Wall time and this process's CPU time (all threads) since start()."""

    def __init__(self) -> None:
        self.wall_start = self.cpu_start = 0.0

    def start(self) -> Clock:
        self.wall_start, self.cpu_start = time.perf_counter(), time.process_time()
        return self

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall_start, time.process_time() - self.cpu_start


def report(what: str, seconds: float, record_count: int, value_bytes: int, extra: str = "",
           cpu_seconds: float | None = None) -> None:
    """One result line; with cpu_seconds, also the rate per CPU-second of this process,
    which says what the code does when other load on the machine steals the cores."""
    total_bytes = record_count * (record_head_bytes + key_bytes + value_bytes)
    cpu = "" if cpu_seconds is None else \
        f", {record_count / cpu_seconds:,.0f} records per CPU-second"
    print(f"{what:<58} {total_bytes / MB / seconds:9.1f} MB/s {record_count / seconds:12,.0f} "
          f"records/s  ({record_count:,} records in {seconds:.2f} s{cpu}){extra}", flush=True)


def put_all(store: LogStore, prefixes: list[int], keys: list[bytes], value: bytes) -> int:
    """Put every key as fast as the store accepts; back off while its queue is full."""
    seq = 0
    put = store.put
    for prefix, key in zip(prefixes, keys, strict=True):
        for _attempt in range(1_000_000):
            try:
                seq = put(prefix, key, value)
                break
            except WriteQueueFullError:
                time.sleep(0.0005)
    return seq


def bench_disk(folder: str, total_bytes: int) -> None:
    """Plain 4 MB os.write calls and one fsync: the ceiling for fsync="never" appends."""
    path = os.path.join(folder, "disk-speed")
    chunk = os.urandom(4 * MB)
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _index in range(max(1, total_bytes // len(chunk))):
            os.write(fd, chunk)
        written_at = time.perf_counter()
        os.fsync(fd)
    finally:
        os.close(fd)
    synced_at = time.perf_counter()
    size = max(1, total_bytes // len(chunk)) * len(chunk)
    print(f"{'disk: 4 MB os.write calls, page cache (no fsync)':<58} "
          f"{size / MB / (written_at - started):9.1f} MB/s")
    print(f"{'disk: the same, including one fsync at the end':<58} "
          f"{size / MB / (synced_at - started):9.1f} MB/s")
    os.unlink(path)


def bench_append(folder: str, value_bytes: int, fsync: str, total_bytes: int) -> None:
    path = os.path.join(folder, f"append-{value_bytes}-{fsync}")
    count = max(1000, total_bytes // (record_head_bytes + key_bytes + value_bytes))
    keys, prefixes, value = keys_for(count), prefixes_for(count), os.urandom(value_bytes)
    with LogStore(path, fsync=fsync, background_compaction=False) as store:
        clock = Clock().start()
        seq = put_all(store, prefixes, keys, value)
        accepted_seconds, _cpu = clock.read()
        store.wait_durable(seq)
        seconds, cpu_seconds = clock.read()
        syncs = store.stats().sync_count
    report(f"append {value_bytes:>5} B values, fsync={fsync:<8} (1 producer)", seconds, count,
           value_bytes, f"; put() alone {count / accepted_seconds:,.0f}/s, {syncs} fsyncs",
           cpu_seconds)
    shutil.rmtree(path)


def bench_append_waiting(folder: str, value_bytes: int, seconds_max: float) -> None:
    """fsync="always" with threads that each wait for every put: group commit at work."""
    path = os.path.join(folder, f"append-waiting-{value_bytes}")
    value = os.urandom(value_bytes)
    counts = [0] * always_thread_count
    with LogStore(path, fsync="always", background_compaction=False) as store:
        deadline = time.perf_counter() + seconds_max

        def writer(index: int) -> None:
            prefix = make_prefix(1, index)
            for number in range(10_000_000):
                if time.perf_counter() >= deadline:
                    return
                store.wait_durable(store.put(prefix, b"key-%012d" % number, value))
                counts[index] += 1

        started = time.perf_counter()
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(always_thread_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        syncs = store.stats().sync_count
    total = sum(counts)
    report(f"append {value_bytes:>5} B values, fsync=always, {always_thread_count} threads "
           "waiting", seconds, total, value_bytes,
           f", {syncs} fsyncs = {total / max(1, syncs):.1f} records per fsync")
    shutil.rmtree(path)


def best_of(repeat: int, run: Callable[[], tuple[int, float, float, float]]
            ) -> tuple[int, float, float, float]:
    results = [run() for _ in range(repeat)]
    return min(results, key=lambda result: result[1])


def bench_recovery(folder: str, total_bytes: int, repeat: int) -> None:
    value_bytes = 1000
    path = os.path.join(folder, "recovery")
    count = total_bytes // (record_head_bytes + key_bytes + value_bytes)
    keys, prefixes, value = keys_for(count), prefixes_for(count), os.urandom(value_bytes)
    with LogStore(path, fsync="never", background_compaction=False) as store:
        put_all(store, prefixes, keys, value)
    del keys, prefixes
    log_bytes = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    print(f"recovery data: {count:,} records of {value_bytes} B values, "
          f"{log_bytes / MB:,.0f} MB on disk, warm page cache")

    def recover(copy_values: bool) -> Callable[[], tuple[int, float, float, float]]:
        def run() -> tuple[int, float, float, float]:
            clock = Clock().start()
            recovery = LogStore.recover(path, copy_values=copy_values)
            scan_seconds, _cpu = clock.read()
            recovered = 0
            for _prefix, _key, _value in recovery:
                recovered += 1
            return (recovered, *clock.read(), scan_seconds)
        return run

    for copy_values, label in ((False, "values as memoryviews (default)"),
                               (True, "values copied to bytes")):
        recovered, seconds, cpu_seconds, scan_seconds = best_of(repeat, recover(copy_values))
        assert recovered == count, (recovered, count)
        report(f"recover + iterate, {label}", seconds, recovered, value_bytes,
               f"; the scan alone {recovered / scan_seconds:,.0f} records/s", cpu_seconds)

    def open_store(with_snapshot: bool) -> Callable[[], tuple[int, float, float, float]]:
        def run() -> tuple[int, float, float, float]:
            if not with_snapshot:
                os.unlink(os.path.join(path, "index.snapshot"))
            clock = Clock().start()
            store = LogStore(path, background_compaction=False)
            seconds, cpu_seconds = clock.read()
            assert store.index_source == ("snapshot" if with_snapshot else "scan")
            store.close()  # saves the snapshot again
            return count, seconds, cpu_seconds, 0.0
        return run

    for with_snapshot, label in ((True, "after a clean close (index snapshot)"),
                                 (False, "after a crash (index rebuilt from the log)")):
        opened, seconds, cpu_seconds, _ = best_of(repeat, open_store(with_snapshot))
        report(f"LogStore(path) open {label}", seconds, opened, value_bytes,
               cpu_seconds=cpu_seconds)
    shutil.rmtree(path)


def probe_put_latency(store: LogStore, stop: threading.Event, latencies: list[float]) -> None:
    """Time small puts, one every 0.2 ms, until stop: how long writers wait on compaction."""
    for number in range(10_000_000):
        if stop.is_set():
            return
        started = time.perf_counter()
        store.put(make_prefix(2, 0), b"probe-%d" % (number % 1000), b"p" * 100)
        latencies.append(time.perf_counter() - started)
        time.sleep(0.0002)


def latency_summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    if not ordered:
        return "no samples"
    pick = [ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000 for q in (0.5, 0.99)]
    return (f"p50 {pick[0]:.3f} ms, p99 {pick[1]:.3f} ms, max {ordered[-1] * 1000:.1f} ms "
            f"over {len(ordered):,} puts")


def bench_compaction(folder: str, total_bytes: int) -> None:
    """Every other key overwritten (a third of each segment is garbage), then compact()
    rewrites them all while another thread keeps putting and times its puts."""
    value_bytes = 1000
    path = os.path.join(folder, "compaction")
    count = total_bytes // (record_head_bytes + key_bytes + value_bytes) // 2
    keys, value = keys_for(count), os.urandom(value_bytes)
    with LogStore(path, fsync="never", segment_bytes=16 * MB,
                  background_compaction=False) as store:
        prefixes = prefixes_for(count)
        put_all(store, prefixes, keys, value)
        put_all(store, prefixes[::2], keys[::2], value)  # overwrite every other key
        # Seal the head: compaction only takes sealed segments.
        put_all(store, [0], [b"roll"], os.urandom(17 * MB))
        store.flush()
        idle_latencies: list[float] = []
        stop = threading.Event()
        probe = threading.Thread(target=probe_put_latency, args=(store, stop, idle_latencies))
        probe.start()
        time.sleep(1.0)
        stop.set()
        probe.join()
        before = store.stats()
        latencies: list[float] = []
        stop = threading.Event()
        probe = threading.Thread(target=probe_put_latency, args=(store, stop, latencies))
        probe.start()
        clock = Clock().start()
        results = store.compact(0.25)
        seconds, cpu_seconds = clock.read()
        stop.set()
        probe.join()
        after = store.stats()
    read_bytes = sum(r.bytes_read for r in results)
    written_bytes = sum(r.bytes_written for r in results)
    records = sum(r.records_kept + r.records_dropped for r in results)
    print(f"{'compaction (1/3 garbage per segment)':<58} {read_bytes / MB / seconds:9.1f} "
          f"MB/s read {written_bytes / MB / seconds:7.1f} MB/s written {records / seconds:10,.0f}"
          f" records/s  ({len(results)} runs, garbage {before.garbage_bytes / MB:.0f} MB -> "
          f"{after.garbage_bytes / MB:.0f} MB in {seconds:.2f} s, {cpu_seconds:.2f} CPU-s)",
          flush=True)
    print(f"{'put() latency of a second thread, no compaction':<58} "
          f"{latency_summary(idle_latencies)}")
    print(f"{'put() latency of a second thread, during compaction':<58} "
          f"{latency_summary(latencies)}", flush=True)
    shutil.rmtree(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--append-mb", type=int, default=256,
                        help="bytes per append measurement (default 256)")
    parser.add_argument("--always-seconds", type=float, default=3.0,
                        help="duration of the waiting-threads fsync=always run")
    parser.add_argument("--recovery-mb", type=int, default=1024,
                        help="size of the recovery data set (default 1024 = 1 GB)")
    parser.add_argument("--compaction-mb", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many recoveries")
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="where the temporary data folder goes")
    parser.add_argument("--only", default="append,recovery,compaction",
                        help="comma-separated sections to run (default: all three)")
    args = parser.parse_args()
    sections = set(args.only.split(","))
    folder = tempfile.mkdtemp(prefix="shmgrid-bench-persistence-", dir=args.dir)
    print(f"data under {folder}; append {args.append_mb} MB per run, recovery "
          f"{args.recovery_mb} MB, compaction {args.compaction_mb} MB; cpus {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    try:
        if "append" in sections:
            bench_disk(folder, args.append_mb * MB)
            for value_bytes in (100, 10 * 1024):
                for fsync in ("never", "interval", "always"):
                    bench_append(folder, value_bytes, fsync, args.append_mb * MB)
                bench_append_waiting(folder, value_bytes, args.always_seconds)
        if "recovery" in sections:
            bench_recovery(folder, args.recovery_mb * MB, args.repeat)
        if "compaction" in sections:
            bench_compaction(folder, args.compaction_mb * MB)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"removed {folder}")


if __name__ == "__main__":
    main()
