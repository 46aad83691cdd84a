"""Single and batched operations from one synchronous client, shmgrid beside Redis Cluster.

    python tools/bench_ops.py                      # shmgrid only (starts its own cluster)
    python tools/bench_ops.py --redis              # and Redis Cluster, in the same run
    python tools/bench_ops.py --cluster-name dev   # a running shmgrid cluster instead

shmgrid: 3 members, backup 1, through the public API. Redis Cluster (with --redis): 3 masters
with one replica each, started here on loopback from `redis-server` (Debian's redis-server
package), driven by redis-py (`pip install shmgrid[bench]`). 100-byte values; each workload
runs for --seconds; entries/s and the p50 latency of a call are printed, and with --redis the
ratio shmgrid / Redis.

The rows: single get; single put with one synchronous copy (Redis: SET then WAIT 1) and the
same against a plain SET (no replica wait); batches of 100 writes and reads (Redis: the
non-atomic MSET/MGET over slots, and one hash tag: one slot, one call; shmgrid: keys spread
over partitions, and the same keys with one hash tag a batch: one partition, one owner).
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
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path

BATCH = 100
# (workload, shmgrid's call, Redis's call); rows indented compare the same shmgrid call again.
ROWS = [("single get", "get", "GET"),
        ("single get, local reads", "get, local reads", "GET"),
        ("single put, one sync copy", "put", "SET + WAIT 1"),
        ("  against a plain SET", "put", "SET"),
        ("  the map published for local reads", "put, published", "SET + WAIT 1"),
        ("batches of 100, writes", "put_all", "mset_nonatomic"),
        ("  the map published for local reads", "put_all, published", "mset_nonatomic"),
        ("  against one hash tag", "put_all", "MSET, one hash tag"),
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


def measure(fn: Callable[[int], object], seconds: float, per_call: int) -> tuple[float, float]:
    """(entries per second, p50 latency of a call in µs), over ``seconds``."""
    latencies = []
    i = 0
    end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        if t0 >= end:
            break
        fn(i)
        latencies.append(time.perf_counter() - t0)
        i += 1
    latencies.sort()
    return i * per_call / seconds, latencies[len(latencies) // 2] * 1e6


def grid_rows(cluster_name: str, keys: list[str], value: bytes, seconds: float
              ) -> dict[str, tuple[float, float]]:
    import grid

    batches = [keys[i:i + BATCH] for i in range(0, len(keys), BATCH)]
    tags = tagged(batches)
    with grid.connect(cluster_name=cluster_name) as client:
        m = client.get_map("bench_ops")
        m.put_all({k: value for k in keys})
        m.put_all({k: value for batch in tags for k in batch})
        n, b = len(keys), len(batches)
        rows = {
            "get": measure(lambda i: m.get(keys[i % n]), seconds, 1),
            "put": measure(lambda i: m.put(keys[i % n], value), seconds, 1),
            "put_all": measure(lambda i: m.put_all(dict.fromkeys(batches[i % b], value)),
                               seconds, BATCH),
            "get_all": measure(lambda i: m.get_all(batches[i % b]), seconds, BATCH),
            "put_all, one hash tag": measure(
                lambda i: m.put_all(dict.fromkeys(tags[i % b], value)), seconds, BATCH),
            "get_all, one hash tag": measure(lambda i: m.get_all(tags[i % b]), seconds, BATCH),
        }
        # Last: a published map stays published, and its writes keep the shared index.
        rows["get, local reads"] = local_get_row(client, keys, seconds)
        local = client.get_map("bench_ops", local_reads=True)
        rows["get_all, local reads"] = measure(lambda i: local.get_all(batches[i % b]),
                                               seconds, BATCH)
        rows["get_all, one hash tag, local reads"] = measure(
            lambda i: local.get_all(tags[i % b]), seconds, BATCH)
        rows["put, published"] = measure(lambda i: m.put(keys[i % n], value), seconds, 1)
        rows["put_all, published"] = measure(
            lambda i: m.put_all(dict.fromkeys(batches[i % b], value)), seconds, BATCH)
        m.clear()
    return rows


def local_get_row(client: object, keys: list[str], seconds: float) -> tuple[float, float]:
    """Gets from the owners' shared memory (``local_reads=True``), once every owner has
    published the map (its first get from each owner asks it to); prints the share of gets
    that were answered from memory."""
    m = client.get_map("bench_ops", local_reads=True)  # type: ignore[attr-defined]
    reader = m._local
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        hits = reader.hits
        for key in keys[:2000]:
            m.get(key)
        if reader.hits - hits == min(2000, len(keys)):
            break
        time.sleep(0.1)
    hits, misses = reader.hits, reader.misses
    n = len(keys)
    row = measure(lambda i: m.get(keys[i % n]), seconds, 1)
    hits, misses = reader.hits - hits, reader.misses - misses
    print(f"local reads: {hits:,} of {hits + misses:,} gets answered from shared memory")
    return row


@contextmanager
def grid_cluster(name: str | None):
    if name:
        yield name
        return
    name = f"bench{uuid.uuid4().hex[:8]}"
    subprocess.run([sys.executable, "-m", "grid", "start", "--detach", "--members", "3",
                    "--backup-count", "1", "--cluster-name", name], check=True,
                   capture_output=True)
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


def redis_rows(port: int, keys: list[str], value: bytes, seconds: float
               ) -> dict[str, tuple[float, float]]:
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

    def set_wait(i: int) -> None:
        key = keys[i % n]
        client.set(key, value)
        client.wait(1, 0, target_nodes=client.get_node_from_key(key))

    rows = {
        "GET": measure(lambda i: client.get(keys[i % n]), seconds, 1),
        "SET + WAIT 1": measure(set_wait, seconds, 1),
        "SET": measure(lambda i: client.set(keys[i % n], value), seconds, 1),
        "mset_nonatomic": measure(
            lambda i: client.mset_nonatomic(dict.fromkeys(batches[i % b], value)), seconds,
            BATCH),
        "mget_nonatomic": measure(lambda i: client.mget_nonatomic(batches[i % b]), seconds,
                                  BATCH),
        "MSET, one hash tag": measure(lambda i: client.mset(dict.fromkeys(tags[i % b], value)),
                                      seconds, BATCH),
        "MGET, one hash tag": measure(lambda i: client.mget(tags[i % b]), seconds, BATCH),
    }
    client.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster-name", help="a running shmgrid cluster (default: start one)")
    parser.add_argument("--redis", action="store_true", help="also run Redis Cluster")
    parser.add_argument("--redis-port", type=int, default=17000,
                        help="first of six loopback ports for Redis (default 17000)")
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    keys = [f"key-{i}" for i in range(args.keys)]
    value = os.urandom(args.value_size)
    with ExitStack() as stack:
        name = stack.enter_context(grid_cluster(args.cluster_name))
        ours = grid_rows(name, keys, value, args.seconds)
        theirs = redis_rows(stack.enter_context(redis_cluster(args.redis_port)), keys,
                            value, args.seconds) if args.redis else {}
    table = Table(title=f"one synchronous client, {args.keys:,} keys, {args.value_size}-byte "
                        f"values, {args.seconds:g} s each")
    for col in ("workload", "shmgrid", "entries/s", "p50 µs", *(
            ("Redis Cluster", "entries/s", "p50 µs", "ratio") if theirs else ())):
        table.add_column(col, justify="right" if col in ("entries/s", "p50 µs", "ratio")
                         else "left")
    for workload, mine, other in ROWS:
        if other not in theirs and (theirs or workload.startswith(" ")):
            continue
        rate, p50 = ours[mine]
        row = [workload, mine, f"{rate:,.0f}", f"{p50:,.0f}"]
        if theirs:
            their_rate, their_p50 = theirs[other]
            row += [other, f"{their_rate:,.0f}", f"{their_p50:,.0f}",
                    f"{rate / their_rate:.2f}×"]
        table.add_row(*row)
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
