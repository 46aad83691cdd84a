"""Scans of a map, with local reads and through the owners: time and the client's peak memory.

    python tools/bench_scan.py                     # both cases below
    python tools/bench_scan.py --big-values 6000 --value-bytes 10000

Starts a 3-member cluster (backup 1, as bench_ops.py does) and scans two maps, each with local
reads on and off, alternately, `--rounds` times:
- "spread": `--keys` entries of 100 bytes over every partition (each partition far below a
  scan's 4 MiB chunk, so a local scan reads every partition from shared memory);
- "one big partition": `--big-values` values of `--value-bytes` in partition 0 alone (larger
  than a chunk, so even a local scan gets it from its owner, in chunks).
Prints entries/s (median) and the peak of the client's traced allocations (tracemalloc, the
highest of the rounds) per scan; the scans yield `--batch-size` entries at a time.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import tracemalloc

from bench_ops import grid_cluster  # (tools/: the same 3-member, backup 1 cluster)

import grid
from grid.client.map import Map
from grid.serialization import partition_id_of, serialize_key


def scan(m: Map, batch_size: int) -> tuple[int, float, float]:
    """(entries, seconds, peak MB) of scans of every partition of ``m``: one timed, then one
    traced (tracemalloc slows every allocation, and a local scan makes more of them)."""
    pids = range(m._invoker.table.partition_count)  # type: ignore[union-attr]
    began = time.perf_counter()
    n = sum(len(keys) for keys, _ in m.scan_partitions(pids, batch_size=batch_size))
    took = time.perf_counter() - began
    tracemalloc.start()
    for _ in m.scan_partitions(pids, batch_size=batch_size):
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return n, took, peak / 1e6


def fill(client: grid.Client, keys: int, big_values: int, value_bytes: int) -> None:
    """The map "spread" (``keys`` entries of 100 bytes), and "big": ``big_values`` values of
    ``value_bytes`` whose keys all fall in partition 0."""
    spread = client.get_map("spread")
    for at in range(0, keys, 1000):
        spread.put_all({f"k{i}": b"v" * 100 for i in range(at, min(at + 1000, keys))})
    count = client.partition_count
    in_first = (k for k in (f"big{i}" for i in itertools.count())
                if partition_id_of(serialize_key(k), count) == 0)
    big, value = client.get_map("big"), b"x" * value_bytes
    for at in range(0, big_values, 500):
        big.put_all({next(in_first): value for _ in range(min(500, big_values - at))})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000,
                        help="entries of the spread map (default 200000)")
    parser.add_argument("--big-values", type=int, default=6_000,
                        help="values in the one big partition (default 6000)")
    parser.add_argument("--value-bytes", type=int, default=10_000,
                        help="bytes per value of the big partition (default 10000)")
    parser.add_argument("--batch-size", type=int, default=1000,
                        help="entries per batch the scan yields (default 1000)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="scans of each map each way (default 3)")
    args = parser.parse_args()
    with grid_cluster(None) as name, grid.connect(cluster_name=name) as writer, \
            grid.connect(cluster_name=name, local_reads=True) as reader:
        fill(writer, args.keys, args.big_values, args.value_bytes)
        cases = {}
        for map_name in ("spread", "big"):
            local = reader.get_map(map_name)
            scan(local, args.batch_size)  # the first scan asks the owners to publish the map
            time.sleep(1.5)  # ... which they do within a heartbeat
            cases[(map_name, "local reads")] = local
            cases[(map_name, "owners")] = reader.get_map(map_name, local_reads=False)
        results: dict[tuple[str, str], list[tuple[int, float, float]]] = {
            case: [] for case in cases}
        for _ in range(args.rounds):
            for case, m in cases.items():
                results[case].append(scan(m, args.batch_size))
    print(f"{'map':<22}{'scan':<14}{'entries':>9}{'entries/s':>12}{'peak MB':>9}")
    for (map_name, how), runs in results.items():
        label = "spread" if map_name == "spread" else "one big partition"
        rate = statistics.median(n / took for n, took, _ in runs)
        peak = max(p for _, _, p in runs)
        print(f"{label:<22}{how:<14}{runs[0][0]:>9,}{rate:>12,.0f}{peak:>9.1f}")


if __name__ == "__main__":
    main()
