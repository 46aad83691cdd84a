"""Measure the member's shared-memory record store in-process: ops/s per operation.

Run from the project root: ``python tools/bench_record_store.py [--keys N] [--value-bytes N]``.
Prints one line per measurement; numbers are for comparing variants within one run and one
machine, not thresholds. A plain dict doing the same work is printed as a reference ceiling.

Then a member's share of a bulk load (``--block-rows``, default 333,000: a third of a Spark
write of 1,000,000 rows) as it comes: calls of record blocks, one a partition of
``--partitions``, parsed and appended (``parse_records``, ``put_groups``), into a store of its
own, and again into one whose map is published for local reads (a Spark append after a read
on the grid's host), whose partitions' shared indexes are built once the load is over (as the
member's ticks build them): µs a row of each, and of the published load's the shared index's
builds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
import zlib
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from grid.local_reads import RECORD_HEADER  # noqa: E402
from workers.local_reads import LocalReadDirectory, SharedIndex  # noqa: E402
from workers.record_block import parse_records  # noqa: E402
from workers.record_store import RecordStore  # noqa: E402
from workers.shm import list_segments, remove_segments  # noqa: E402

repeat_count = 3  # best of, to damp noise from other processes
batch_size = 1000  # pairs per put_many / keys per get_many call
pid = 7
namespace = "bench"
# A bulk load's rows a call to one member: its third of the Spark writer's calls of 40,000.
load_call_rows = 40_000 // 3


def best_rate(
    operation_count: int, run: Callable[[], object], setup: Callable[[], object]
) -> float:
    """Best ops/s over ``repeat_count`` runs; ``setup`` runs untimed before each."""
    seconds_best = float("inf")
    for _ in range(repeat_count):
        setup()
        started = time.perf_counter()
        run()
        seconds_best = min(seconds_best, time.perf_counter() - started)
    return operation_count / seconds_best


def bench_store(keys: list[bytes], value: bytes, prefix: str) -> dict[str, float]:
    """ops/s of each store operation over ``keys``."""
    store = RecordStore(prefix)
    batches = [keys[i : i + batch_size] for i in range(0, len(keys), batch_size)]
    pair_batches = [[(key, value) for key in batch] for batch in batches]
    n = len(keys)
    rates: dict[str, float] = {}
    try:

        def fill() -> None:
            store.drop_partition(pid)
            for key in keys:
                store.put(pid, namespace, key, value)

        def put_new() -> None:
            for key in keys:
                store.put(pid, namespace, key, value)

        rates["put (new keys)"] = best_rate(n, put_new, lambda: store.drop_partition(pid))
        rates["put (overwrite, same size)"] = best_rate(n, put_new, fill)
        # As a member applies a batch (put_all, a Spark write): flat key, value, key, ...
        groups = [(pid, [item for key in batch for item in (key, value)]) for batch in batches]

        def put_groups() -> None:
            store.put_groups(namespace, groups)

        rates["put_groups (new keys)"] = best_rate(n, put_groups,
                                                   lambda: store.drop_partition(pid))
        rates["put_groups (overwrite, same size)"] = best_rate(n, put_groups, fill)
        value_other = value + b"x"

        def put_grow() -> None:
            for key in keys:
                store.put(pid, namespace, key, value_other)

        rates["put (overwrite, new size)"] = best_rate(n, put_grow, fill)

        def get_all() -> None:
            get = store.get
            for key in keys:
                get(pid, namespace, key)

        rates["get (hit)"] = best_rate(n, get_all, fill)
        misses = [b"miss-" + key for key in keys]

        def get_misses() -> None:
            get = store.get
            for key in misses:
                get(pid, namespace, key)

        rates["get (miss)"] = best_rate(n, get_misses, lambda: None)

        def put_many_all() -> None:
            for pairs in pair_batches:
                store.put_many(pid, namespace, pairs)

        rates[f"put_many (batches of {batch_size})"] = best_rate(
            n, put_many_all, lambda: store.drop_partition(pid)
        )
        rates[f"put_many (batches of {batch_size}, overwrite)"] = best_rate(
            n, put_many_all, fill
        )

        def get_many_all() -> None:
            for batch in batches:
                store.get_many(pid, namespace, batch)

        rates[f"get_many (batches of {batch_size})"] = best_rate(n, get_many_all, fill)

        def iterate() -> None:
            for _ in store.items(pid, namespace):
                pass

        rates["items() iteration"] = best_rate(n, iterate, lambda: None)

        def scan_whole() -> None:
            store.concatenated(pid, namespace)

        rates["scan: concatenated (one reply)"] = best_rate(n, scan_whole, lambda: None)

        def scan_chunks() -> None:
            low: int | None = 0
            while low is not None:
                low = store.concatenated_from(pid, namespace, low, 4 << 20)[2]

        rates["scan: 4 MiB hash-range chunks"] = best_rate(n, scan_chunks, lambda: None)

        def remove_all() -> None:
            for key in keys:
                store.remove(pid, namespace, key)

        rates["remove"] = best_rate(n, remove_all, fill)
        fill()
        peer = RecordStore(peer_prefix(prefix))
        try:

            def transfer() -> None:
                """A migration's copy: lend the fragment, the peer takes it in chunks."""
                loan = store.lend(pid, namespace)
                for chunk in loan.chunks(4 << 20):
                    peer.receive(pid, chunk)
                loan.release()

            rates["lend + receive (a migration's copy)"] = best_rate(
                n, transfer, lambda: peer.drop_partition(pid))
        finally:
            peer.close()
        rates["shm MiB for the keys"] = store.shm_bytes() / (1 << 20)
    finally:
        store.close()
    return rates


def block_calls(rows: int, partitions: int, call_rows: int, value: bytes
                ) -> list[list[tuple[int, bytes, int]]]:
    """The calls of a bulk load of ``rows`` new keys: ``call_rows`` rows a call, as (pid,
    frame, rows) of each partition it touches, the frame laid out as a record block."""
    calls = []
    for first in range(0, rows, call_rows):
        by_pid: dict[int, list[bytes]] = {}
        for i in range(first, min(rows, first + call_rows)):
            key = b"k%011d" % i
            by_pid.setdefault(zlib.crc32(key) % partitions, []).append(key)
        calls.append([(pid, b"".join([*(RECORD_HEADER.pack(len(k), len(value)) for k in keys),
                                      *(RECORD_HEADER.pack(len(k), len(value)) + k + value
                                        for k in keys)]), len(keys))
                      for pid, keys in sorted(by_pid.items())])
    return calls


class _Timed:
    """Seconds spent in the shared index's builds while in use."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.saved = SharedIndex.__dict__["build"]

    def __enter__(self) -> _Timed:
        build = self.saved.__func__

        def timed_build(cls: type, *args: object, **kwargs: object) -> SharedIndex:
            started = time.perf_counter()
            try:
                return build(cls, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        SharedIndex.build = classmethod(timed_build)  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        SharedIndex.build = self.saved  # type: ignore[method-assign]


def bench_block_loads(prefix: str, rows: int, partitions: int, value: bytes
                      ) -> dict[str, float]:
    """µs a row of a bulk load into a store of its own, unpublished and published (best of
    ``repeat_count``, a new store each), and the published one's shared-index builds."""
    calls = block_calls(rows, partitions, load_call_rows, value)
    out: dict[str, float] = {}
    for published in (False, True):
        best, build_seconds = float("inf"), 0.0
        for attempt in range(repeat_count):
            store_prefix = f"{prefix}-load{2 * attempt + published}"
            store = RecordStore(store_prefix)
            try:
                if published:
                    store.local = LocalReadDirectory(store_prefix, str(uuid.uuid4()), partitions)
                    store.publish(namespace)
                with _Timed() as timed:
                    started = time.perf_counter()
                    for call in calls:
                        store.put_groups(namespace, [(pid, parse_records(frame, n))
                                                     for pid, frame, n in call])
                    if published:  # the member's settles, and its ticks until it is over
                        for pid in range(partitions):
                            store.settle(pid, namespace)
                        while store.loading:
                            store.loads_over()
                    elapsed = time.perf_counter() - started
                if elapsed < best:
                    best, build_seconds = elapsed, timed.seconds
            finally:
                store.close()
                if store.local is not None:
                    store.local.close()
                remove_segments(store_prefix)
        label = "published" if published else "unpublished"
        out[f"block load, {label}"] = best / rows * 1e6
        if published:
            out["  of it, shared index build"] = build_seconds / rows * 1e6
    return out


def peer_prefix(prefix: str) -> str:
    return prefix[:-1] + "1"


def bench_dict(keys: list[bytes], value: bytes) -> dict[str, float]:
    """The same puts and gets on a plain dict: the ceiling for any Python-level store."""
    table: dict[bytes, bytes] = {}

    def put_new() -> None:
        for key in keys:
            table[key] = value

    def get_all() -> None:
        get = table.get
        for key in keys:
            get(key)

    return {
        "put (new keys)": best_rate(len(keys), put_new, table.clear),
        "get (hit)": best_rate(len(keys), get_all, lambda: None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--block-rows", type=int, default=333_000,
                        help="rows of the bulk load (default 333,000; 0: none)")
    parser.add_argument("--partitions", type=int, default=90,
                        help="partitions the bulk load spreads over (default 90: those a "
                             "member of three owns of 271)")
    arguments = parser.parse_args()
    if arguments.partitions < 1:
        parser.error("--partitions is at least 1")
    keys = [b"key-%012d" % i for i in range(arguments.keys)]
    value = os.urandom(arguments.value_bytes)
    prefix = f"shmgrid-bench{uuid.uuid4().hex[:8]}-0"
    print(
        f"{arguments.keys} keys of {len(keys[0])} bytes, values of {arguments.value_bytes}"
        f" bytes, best of {repeat_count}"
    )
    try:
        store_rates = bench_store(keys, value, prefix)
    finally:
        leaked = remove_segments(prefix) + remove_segments(peer_prefix(prefix))
    dict_rates = bench_dict(keys, value)
    for name, rate in store_rates.items():
        if name.startswith("shm MiB"):
            print(f"  {name:36s} {rate:12.1f}")
            continue
        reference = dict_rates.get(name)
        ratio = f"  (dict: {reference:12,.0f} ops/s, x{rate / reference:.2f})" if reference else ""
        print(f"  {name:36s} {rate:12,.0f} ops/s{ratio}")
        if name.startswith("lend"):
            record_bytes = 8 + len(keys[0]) + len(value)
            print(f"  {'':36s} {rate * record_bytes / 1e6:12,.0f} MB/s")
    if arguments.block_rows > 0:
        print(f"a bulk load of {arguments.block_rows:,} new keys over {arguments.partitions}"
              f" partitions, calls of {load_call_rows:,} rows, best of {repeat_count}")
        try:
            loads = bench_block_loads(prefix, arguments.block_rows, arguments.partitions, value)
        finally:
            leaked += remove_segments(prefix)
        for name, micros in loads.items():
            print(f"  {name:36s} {micros:12.3f} µs a row")
    if leaked or list_segments(prefix):
        print(f"LEAKED segments: {leaked}")
        sys.exit(1)


if __name__ == "__main__":
    main()
