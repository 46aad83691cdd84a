"""Operation benchmark: ops/s and p50/p99 latency of put, get, put_all and get_all.

With ``--clients N`` the operations run in N client processes at once (each its own
connection), and the table gives their combined rate and the latencies of all calls.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

BATCH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", type=int, default=20_000, help="distinct keys (default 20000)")
    parser.add_argument("--value-size", type=int, default=100,
                        help="value size in bytes (default 100)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="time per operation (default 3)")
    parser.add_argument("--clients", type=int, default=1,
                        help="client processes running at once (default 1)")
    parser.add_argument("--address", help="a member address instead of the local registry")
    parser.add_argument("--map", default="bench", help="map to use (default bench)")


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _client_run(address: str | None, cluster_name: str | None, map_name: str, keys: list[str],
                value_size: int, seconds: float, start_at: float) -> list[tuple[str, int, list]]:
    """One client's part: every operation for ``seconds``; (name, entries, latencies)."""
    import grid

    value = os.urandom(value_size)
    batches = [keys[i:i + BATCH] for i in range(0, len(keys), BATCH)]
    results = []
    with grid.connect(address, cluster_name=cluster_name) as client:
        m = client.get_map(map_name)
        operations = [
            ("put", 1, len(keys), lambda i: m.put(keys[i], value)),
            ("get", 1, len(keys), lambda i: m.get(keys[i])),
            (f"put_all ({BATCH})", BATCH, len(batches),
             lambda i: m.put_all({k: value for k in batches[i]})),
            (f"get_all ({BATCH})", BATCH, len(batches), lambda i: m.get_all(batches[i])),
        ]
        for number, (name, per_call, count, fn) in enumerate(operations):
            # Every client starts each operation at the same moment.
            begin = start_at + number * (seconds + 0.5)
            time.sleep(max(0.0, begin - time.time()))
            latencies = []
            i = 0
            while time.time() - begin < seconds:
                t0 = time.perf_counter()
                fn(i % count)
                latencies.append(time.perf_counter() - t0)
                i += 1
            results.append((name, i * per_call, latencies))
    return results


def run_bench(args: argparse.Namespace) -> int:
    import multiprocess
    from rich.console import Console
    from rich.table import Table

    import grid

    clients = max(1, args.clients)
    keys = [f"key-{i}" for i in range(args.keys)]
    with grid.connect(args.address, cluster_name=args.cluster_name) as client:
        client.get_map(args.map).clear()
        members = len(client.cluster.members)
    start_at = time.time() + 1.0 + 0.2 * clients  # time for the processes to connect
    run_args = [(args.address, args.cluster_name, args.map, keys[n::clients] or keys,
                 args.value_size, args.seconds, start_at) for n in range(clients)]
    if clients == 1:
        per_client = [_client_run(*run_args[0])]
    else:
        with multiprocess.get_context("spawn").Pool(clients) as pool:
            per_client = pool.starmap(_client_run, run_args)
    with grid.connect(args.address, cluster_name=args.cluster_name) as client:
        client.get_map(args.map).clear()
    _print(per_client, members, args, clients, Console(), Table)
    return 0


def _print(per_client: list[list[tuple[str, int, list]]], members: int,
           args: argparse.Namespace, clients: int, console: Any, table_class: Any) -> None:
    table = table_class(title=f"{members} members, {clients} client process"
                        f"{'es' if clients > 1 else ''}, {args.keys} keys, "
                        f"{args.value_size}-byte values")
    for col in ("operation", "entries/s", "p50 ms", "p99 ms", "calls"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    for index, (name, _, _) in enumerate(per_client[0]):
        entries = sum(run[index][1] for run in per_client)
        latencies = sorted(lat for run in per_client for lat in run[index][2])
        table.add_row(name, f"{entries / args.seconds:,.0f}",
                      f"{_percentile(latencies, 0.5) * 1e3:.3f}",
                      f"{_percentile(latencies, 0.99) * 1e3:.3f}", str(len(latencies)))
    console.print(table)
