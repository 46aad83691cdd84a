"""Single and batched operations from one synchronous client, shmgrid beside Redis Cluster.

    python tools/bench_ops.py                      # shmgrid only (starts its own cluster)
    python tools/bench_ops.py --redis              # and Redis Cluster, in the same run
    python tools/bench_ops.py --cluster-name dev   # a running shmgrid cluster instead

shmgrid: 3 members, backup 1, through the public API; and, for a put that does not wait for
its copy (as a plain SET does not), a second cluster of 3 whose one backup is asynchronous
(backup_count 0, async_backup_count 1), and a third whose backups are spread over the members
(backup_placement "spread": a batch's part for an owner goes to both other members, where the
default "paired" sends it to one), both started here whatever --cluster-name says. Redis
Cluster (with --redis): 3 masters with one replica each, started here on loopback from
`redis-server` (Debian's redis-server package), driven by redis-py (`pip install
shmgrid[bench]`). 100-byte values; each workload runs for --seconds; entries/s and the p50
latency of a call are printed, and with --redis the ratio shmgrid / Redis. With --redis the
two sides of each row take turns (--rounds of each, the side that goes first alternating), so
that a ratio compares the same minutes of the machine: on a shared virtual machine a rate
drifts by half from one minute to the next, and run one after the other, the two sides of a
row were a minute apart. The last column gives the lowest and highest ratio of the row's
turns.

The rows: single get, and the same over the keys of one hash tag (one owner, one Redis
master: what spreading the calls over three processes costs each side); single put with one
synchronous copy (Redis: SET then WAIT 1), the same against a plain SET (no replica wait),
and a put with one asynchronous copy against SET; batches of 100 writes (and a put_all with
one asynchronous copy against mset_nonatomic, which does not wait for Redis's replicas
either) and reads (Redis: the non-atomic MSET/MGET over slots, and one hash tag: one slot,
one call; shmgrid: keys spread over partitions, and the same keys with one hash tag a batch:
one partition, one owner).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

BATCH = 100
# (workload, shmgrid's call, Redis's call); rows indented compare the same shmgrid call again.
ROWS = [("single get", "get", "GET"),
        ("  keys of one hash tag (one owner)", "get, one hash tag", "GET, one hash tag"),
        ("single get, local reads", "get, local reads", "GET"),
        ("single put, one sync copy", "put", "SET + WAIT 1"),
        ("  against a plain SET", "put", "SET"),
        ("  one async copy (not waited for, as SET)", "put, async copy", "SET"),
        ("  the map published for local reads", "put, published", "SET + WAIT 1"),
        ("batches of 100, writes", "put_all", "mset_nonatomic"),
        ("  one async copy (not waited for, as MSET)", "put_all, async copy", "mset_nonatomic"),
        ("  backups spread over the members", "put_all, spread backups", "mset_nonatomic"),
        ("  the map published for local reads", "put_all, published", "mset_nonatomic"),
        ("  against one hash tag", "put_all", "MSET, one hash tag"),
        ("  backups spread, against one hash tag", "put_all, spread backups",
         "MSET, one hash tag"),
        ("  keys with one hash tag a batch", "put_all, one hash tag", "MSET, one hash tag"),
        ("batches of 100, reads", "get_all", "mget_nonatomic"),
        ("  against one hash tag", "get_all", "MGET, one hash tag"),
        ("  keys with one hash tag a batch", "get_all, one hash tag", "MGET, one hash tag"),
        ("batches of 100, reads, local reads", "get_all, local reads", "mget_nonatomic"),
        ("  against one hash tag", "get_all, local reads", "MGET, one hash tag"),
        ("  keys with one hash tag a batch", "get_all, one hash tag, local reads",
         "MGET, one hash tag")]


def tagged(batches: list[list[str]]) -> list[list[str]]:
    """The batches' keys with one hash tag a batch (``{t7}key-700``...): in Redis Cluster one
    slot, in shmgrid one partition (grid/serialization.py), so one owner and one call."""
    return [[f"{{t{j}}}{k}" for k in batch] for j, batch in enumerate(batches)]


class Meter:
    """The calls of one workload over one or more stretches of time: entries/s over all of
    them, the p50 latency of a call, and each stretch's own rate."""

    def __init__(self, fn: Callable[[int], object], per_call: int) -> None:
        self.fn, self.per_call = fn, per_call
        self.calls, self.elapsed = 0, 0.0
        self.latencies: list[float] = []
        self.stretch_rates: list[float] = []

    def run(self, seconds: float) -> None:
        fn, latencies = self.fn, self.latencies
        i = self.calls  # (the keys go on where the last stretch left them)
        start = time.perf_counter()
        end = start + seconds
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                break
            fn(i)
            latencies.append(time.perf_counter() - t0)
            i += 1
        self.stretch_rates.append((i - self.calls) * self.per_call / (t0 - start))
        self.calls, self.elapsed = i, self.elapsed + t0 - start

    @property
    def rate(self) -> float:
        return self.calls * self.per_call / self.elapsed

    @property
    def p50(self) -> float:
        return sorted(self.latencies)[len(self.latencies) // 2] * 1e6


def measure(fn: Callable[[int], object], seconds: float, per_call: int) -> tuple[float, float]:
    """(entries per second, p50 latency of a call in µs), over ``seconds``."""
    meter = Meter(fn, per_call)
    meter.run(seconds)
    return meter.rate, meter.p50


Workloads = dict[str, tuple[Callable[[int], object], int]]  # name: (call, entries a call)
# shmgrid's workloads that need the map published for local reads; a published map stays
# published, so they run after the others.
PUBLISHED = {"get, local reads", "get_all, local reads", "get_all, one hash tag, local reads",
             "put, published", "put_all, published"}


@contextmanager
def grid_workloads(cluster_name: str, keys: list[str], value: bytes
                   ) -> Iterator[tuple[Workloads, Callable[[], None]]]:
    """shmgrid's workloads, on a map filled with ``keys`` (and their tagged twins), and the
    call that publishes the map for local reads."""
    import grid

    batches = [keys[i:i + BATCH] for i in range(0, len(keys), BATCH)]
    tags = tagged(batches)
    n, b = len(keys), len(batches)
    with grid.connect(cluster_name=cluster_name) as client:
        m = client.get_map("bench_ops")
        m.put_all({k: value for k in keys})
        m.put_all({k: value for batch in tags for k in batch})
        local = client.get_map("bench_ops", local_reads=True)
        put_all = (lambda i: m.put_all(dict.fromkeys(batches[i % b], value)), BATCH)
        workloads: Workloads = {
            "get": (lambda i: m.get(keys[i % n]), 1),
            "get, one hash tag": (lambda i: m.get(tags[0][i % len(tags[0])]), 1),
            "put": (lambda i: m.put(keys[i % n], value), 1),
            "put_all": put_all,
            "get_all": (lambda i: m.get_all(batches[i % b]), BATCH),
            "put_all, one hash tag": (lambda i: m.put_all(dict.fromkeys(tags[i % b], value)),
                                      BATCH),
            "get_all, one hash tag": (lambda i: m.get_all(tags[i % b]), BATCH),
            "get, local reads": (lambda i: local.get(keys[i % n]), 1),
            "get_all, local reads": (lambda i: local.get_all(batches[i % b]), BATCH),
            "get_all, one hash tag, local reads": (lambda i: local.get_all(tags[i % b]), BATCH),
            "put, published": (lambda i: m.put(keys[i % n], value), 1),
            "put_all, published": put_all,
        }
        reader = local._local
        counted = [0, 0]

        def publish() -> None:
            """Gets through ``local`` until every owner has published the map (its first get
            from each owner asks it to)."""
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                hits = reader.hits
                for key in keys[:2000]:
                    local.get(key)
                if reader.hits - hits == min(2000, len(keys)):
                    break
                time.sleep(0.1)
            counted[:] = [reader.hits, reader.misses]

        try:
            yield workloads, publish
            if counted != [0, 0]:
                hits, misses = reader.hits - counted[0], reader.misses - counted[1]
                print(f"local reads: {hits:,} of {hits + misses:,} keys read from shared "
                      "memory")
        finally:
            m.clear()


@contextmanager
def write_workloads(cluster_name: str, keys: list[str], value: bytes, label: str
                    ) -> Iterator[Workloads]:
    """The put and put_all of another cluster (its backup asynchronous, or placed otherwise),
    as ``put, LABEL`` and ``put_all, LABEL``, on a map filled with ``keys``."""
    import grid

    with grid.connect(cluster_name=cluster_name) as client:
        m = client.get_map("bench_ops")
        m.put_all({k: value for k in keys})
        n = len(keys)
        batches = [keys[i:i + BATCH] for i in range(0, n, BATCH)]
        try:
            yield {f"put, {label}": (lambda i: m.put(keys[i % n], value), 1),
                   f"put_all, {label}": (
                       lambda i: m.put_all(dict.fromkeys(batches[i % len(batches)], value)),
                       BATCH)}
        finally:
            m.clear()


@contextmanager
def grid_cluster(name: str | None, backups: tuple[str, ...] = ("--backup-count", "1")):
    """The cluster called ``name``, or one started here (3 members, ``backups``) and stopped
    after."""
    if name:
        yield name
        return
    name = f"bench{uuid.uuid4().hex[:8]}"
    subprocess.run([sys.executable, "-m", "grid", "start", "--detach", "--members", "3",
                    *backups, "--cluster-name", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run([sys.executable, "-m", "grid", "stop", "--cluster-name", name],
                       capture_output=True)


@contextmanager
def redis_cluster(base_port: int):
    """Six redis-server processes on loopback, made a cluster of 3 masters + 3 replicas."""
    server = shutil.which("redis-server")
    if server is None or shutil.which("redis-cli") is None:
        raise SystemExit("--redis needs redis-server and redis-cli: apt-get install "
                         "redis-server redis-tools")
    folder = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    ports = [base_port + i for i in range(6)]
    processes = []
    try:
        for port in ports:
            work = folder / str(port)
            work.mkdir()
            processes.append(subprocess.Popen(
                [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--appendonly", "no", "--save", "",
                 "--dir", str(work), "--protected-mode", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        subprocess.run(["redis-cli", "--cluster", "create",
                        *(f"127.0.0.1:{p}" for p in ports), "--cluster-replicas", "1",
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        yield ports[0]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def redis_workloads(port: int, keys: list[str], value: bytes) -> Iterator[Workloads]:
    """Redis Cluster's workloads, on the cluster at ``port`` filled with ``keys``."""
    from redis.cluster import RedisCluster

    client = RedisCluster(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the cluster agrees on its slots a moment later
        try:
            client.set("probe", b"x")
            if client.wait(1, 1000) >= 1:
                break
        except Exception:
            time.sleep(0.2)
    batches = [keys[i:i + BATCH] for i in range(0, len(keys), BATCH)]
    tags = tagged(batches)
    n, b = len(keys), len(batches)
    client.mset_nonatomic(dict.fromkeys(keys, value))
    client.mset(dict.fromkeys(tags[0], value))  # (one slot: what the one-tag GETs read)

    def set_wait(i: int) -> None:
        key = keys[i % n]
        client.set(key, value)
        client.wait(1, 0, target_nodes=client.get_node_from_key(key))

    try:
        yield {
            "GET": (lambda i: client.get(keys[i % n]), 1),
            "GET, one hash tag": (lambda i: client.get(tags[0][i % len(tags[0])]), 1),
            "SET + WAIT 1": (set_wait, 1),
            "SET": (lambda i: client.set(keys[i % n], value), 1),
            "mset_nonatomic": (lambda i: client.mset_nonatomic(
                dict.fromkeys(batches[i % b], value)), BATCH),
            "mget_nonatomic": (lambda i: client.mget_nonatomic(batches[i % b]), BATCH),
            "MSET, one hash tag": (lambda i: client.mset(dict.fromkeys(tags[i % b], value)),
                                   BATCH),
            "MGET, one hash tag": (lambda i: client.mget(tags[i % b]), BATCH),
        }
    finally:
        client.close()


def run_rows(ours: Workloads, publish: Callable[[], None], theirs: Workloads,
             seconds: float, rounds: int) -> dict[tuple[str, str | None], list[Meter]]:
    """Each row's workloads, shmgrid's and (with ``theirs``) Redis's in turn, ``rounds``
    times ``seconds / rounds`` each, the side that goes first alternating: both sides of a
    ratio see the same minutes of this machine, whose speed drifts from one minute to the
    next. Without ``theirs``, each of shmgrid's workloads once."""
    if theirs:
        pairs = list(dict.fromkeys((mine, other) for _, mine, other in ROWS))
    else:
        pairs = [(mine, None) for mine in dict.fromkeys(mine for _, mine, _ in ROWS)]
    pairs.sort(key=lambda pair: pair[0] in PUBLISHED)  # (a stable sort)
    meters: dict[tuple[str, str | None], list[Meter]] = {}
    published = False
    for mine, other in pairs:
        if mine in PUBLISHED and not published:
            publish()
            published = True
        sides = [Meter(*ours[mine])] + ([Meter(*theirs[other])] if other else [])
        for r in range(rounds):
            for meter in sides if r % 2 == 0 else sides[::-1]:
                meter.run(seconds / rounds)
        meters[(mine, other)] = sides
    return meters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster-name", help="a running shmgrid cluster (default: start one)")
    parser.add_argument("--redis", action="store_true", help="also run Redis Cluster")
    parser.add_argument("--redis-port", type=int, default=17000,
                        help="first of six loopback ports for Redis (default 17000)")
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="seconds of each workload, each side (default 3)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="turns a row's two sides take, alternately, in its seconds "
                             "(default 3)")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds is at least 1 and --seconds more than 0")
    if args.redis:
        try:
            import redis  # noqa: F401
        except ImportError:
            parser.error("--redis needs redis-py: pip install 'shmgrid[bench]'")
    from rich.console import Console
    from rich.table import Table

    from grid.compiled import summary as compiled_summary

    keys = [f"key-{i}" for i in range(args.keys)]
    value = os.urandom(args.value_size)
    with ExitStack() as stack:
        name = stack.enter_context(grid_cluster(args.cluster_name))
        ours, publish = stack.enter_context(grid_workloads(name, keys, value))
        for label, options in (("async copy", ("--backup-count", "0",
                                               "--async-backup-count", "1")),
                               ("spread backups", ("--backup-count", "1",
                                                   "--backup-placement", "spread"))):
            other = stack.enter_context(grid_cluster(None, options))
            ours.update(stack.enter_context(write_workloads(other, keys, value, label)))
        theirs = stack.enter_context(redis_workloads(
            stack.enter_context(redis_cluster(args.redis_port)), keys, value)) \
            if args.redis else {}
        meters = run_rows(ours, publish, theirs, args.seconds, args.rounds)
    title = f"one synchronous client, {args.keys:,} keys, {args.value_size}-byte values, " \
            f"{args.seconds:g} s each"
    if theirs:
        title += f", in {args.rounds} turns a side, alternately"
    table = Table(title=title, caption=compiled_summary())
    for col in ("workload", "shmgrid", "entries/s", "p50 µs", *(
            ("Redis Cluster", "entries/s", "p50 µs", "ratio", "ratio by turn") if theirs
            else ())):
        table.add_column(col, justify="left" if col in ("workload", "shmgrid", "Redis Cluster")
                         else "right")
    shown = set()  # without Redis, each shmgrid call once (a row that repeats one is left out)
    for workload, mine, other in ROWS:
        if theirs:
            ours_meter, their_meter = meters[(mine, other)]
        elif mine in shown:
            continue
        else:
            [ours_meter] = meters[(mine, None)]
            shown.add(mine)
        row = [workload, mine, f"{ours_meter.rate:,.0f}", f"{ours_meter.p50:,.0f}"]
        if theirs:
            turns = [a / b for a, b in zip(ours_meter.stretch_rates,
                                           their_meter.stretch_rates, strict=True)]
            row += [other, f"{their_meter.rate:,.0f}", f"{their_meter.p50:,.0f}",
                    f"{ours_meter.rate / their_meter.rate:.2f}×",
                    f"{min(turns):.2f}–{max(turns):.2f}×"]
        table.add_row(*row)
    Console(width=180).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
