"""Operation benchmark: ops/s and p50/p99 latency of put, get, put_all and get_all."""

from __future__ import annotations

import argparse
import os
import time

BATCH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", type=int, default=20_000, help="distinct keys (default 20000)")
    parser.add_argument("--value-size", type=int, default=100,
                        help="value size in bytes (default 100)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="time per operation (default 3)")
    parser.add_argument("--address", help="a member address instead of the local registry")
    parser.add_argument("--map", default="bench", help="map to use (default bench)")


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _measure(name: str, fn, count: int, seconds: float, per_call: int) -> dict:
    latencies = []
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn(i % count)
        latencies.append(time.perf_counter() - t0)
        i += 1
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {"op": name, "calls": i, "ops_s": i * per_call / elapsed,
            "p50_ms": _percentile(latencies, 0.5) * 1e3,
            "p99_ms": _percentile(latencies, 0.99) * 1e3}


def run_bench(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    import grid

    value = os.urandom(args.value_size)
    keys = [f"key-{i}" for i in range(args.keys)]
    batches = [keys[i:i + BATCH] for i in range(0, len(keys), BATCH)]
    with grid.connect(args.address, cluster_name=args.cluster_name) as client:
        m = client.get_map(args.map)
        m.clear()
        results = [
            _measure("put", lambda i: m.put(keys[i], value), len(keys), args.seconds, 1),
            _measure("get", lambda i: m.get(keys[i]), len(keys), args.seconds, 1),
            _measure(f"put_all ({BATCH})", lambda i: m.put_all(
                {k: value for k in batches[i]}), len(batches), args.seconds, BATCH),
            _measure(f"get_all ({BATCH})", lambda i: m.get_all(batches[i]), len(batches),
                     args.seconds, BATCH),
        ]
        members = len(client.cluster.members)
        m.clear()
    table = Table(title=f"{members} members, {args.keys} keys, {args.value_size}-byte values")
    for col in ("operation", "entries/s", "p50 ms", "p99 ms", "calls"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    for r in results:
        table.add_row(r["op"], f"{r['ops_s']:,.0f}", f"{r['p50_ms']:.3f}",
                      f"{r['p99_ms']:.3f}", str(r["calls"]))
    Console().print(table)
    return 0
