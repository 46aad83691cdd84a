"""Operation benchmark: ops/s and p50/p99 latency of put, get, put_all and get_all.

With ``--clients N`` the operations run in N client processes at once (each its own
connection), and the table gives their combined rate and the latencies of all calls. For a
cluster found by name, it also gives the CPU time the member processes spent per entry while
each operation ran (their spins for a next message included): the cost a faster member loop
cuts, which a rate shows only once the cores are busy.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

import psutil

from grid.compiled import summary as compiled_summary

BATCH = 100
OPERATIONS = ("put", "get", f"put_all ({BATCH})", f"get_all ({BATCH})")
PAUSE_S = 0.5  # between one operation's window and the next


def _window(start_at: float, seconds: float, number: int) -> tuple[float, float]:
    """When operation ``number`` runs, in every client at once."""
    begin = start_at + number * (seconds + PAUSE_S)
    return begin, begin + seconds


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
    parser.add_argument("--hash-tags", action="store_true",
                        help=f"give each batch of {BATCH} keys one hash tag ({{b7}}key-700...): "
                             "a put_all or get_all is then one partition, one owner and one "
                             "backup operation (Redis Cluster's MSET with one tag is the like)")


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
            (1, len(keys), lambda i: m.put(keys[i], value)),
            (1, len(keys), lambda i: m.get(keys[i])),
            (BATCH, len(batches), lambda i: m.put_all({k: value for k in batches[i]})),
            (BATCH, len(batches), lambda i: m.get_all(batches[i])),
        ]
        for number, (name, (per_call, count, fn)) in enumerate(
                zip(OPERATIONS, operations, strict=True)):
            begin, end = _window(start_at, seconds, number)
            time.sleep(max(0.0, begin - time.time()))
            latencies = []
            i = 0
            while time.time() < end:
                t0 = time.perf_counter()
                fn(i % count)
                latencies.append(time.perf_counter() - t0)
                i += 1
            results.append((name, i * per_call, latencies))
    return results


def member_processes(cluster_name: str | None) -> list[psutil.Process]:
    """The member processes of the local cluster ``cluster_name`` (None: the default), from
    its registry; none when it is not running."""
    from grid.client.registry import is_registered_process, read_registry
    from grid.config import GridConfig
    from grid.errors import ClusterNotRunningError

    try:  # (the file grid.connect reads)
        data = read_registry(GridConfig.load(cluster_name=cluster_name).registry_path())
    except ClusterNotRunningError:
        return []
    processes = []
    for entry in data["members"]:
        if is_registered_process(entry):
            try:
                processes.append(psutil.Process(entry["pid"]))
            except psutil.Error:
                continue
    return processes


def _cpu_seconds(processes: list[psutil.Process]) -> float | None:
    """User and system CPU of all ``processes`` so far; None if one of them is gone."""
    try:
        return sum(sum(p.cpu_times()[:2]) for p in processes)
    except psutil.Error:
        return None


class _CpuWindows(threading.Thread):
    """Samples the members' CPU at the start and end of each operation's window (the
    clients start every operation at the same moment), in a thread beside the clients."""

    def __init__(self, processes: list[psutil.Process], windows: list[tuple[float, float]]):
        super().__init__(daemon=True)
        self.processes, self.windows = processes, windows
        self.spent: list[float | None] = []

    def run(self) -> None:
        for begin, end in self.windows:
            time.sleep(max(0.0, begin - time.time()))
            before = _cpu_seconds(self.processes)
            time.sleep(max(0.0, end - time.time()))
            after = _cpu_seconds(self.processes)
            self.spent.append(None if before is None or after is None else after - before)


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
    # none for --address: a member that may be on another host
    processes = [] if args.address else member_processes(args.cluster_name)
    sampler = _CpuWindows(processes, [_window(start_at, args.seconds, n)
                                      for n in range(len(OPERATIONS))]) if processes else None
    if sampler is not None:
        sampler.start()
    run_args = [(args.address, args.cluster_name, args.map,
                 _tagged(keys[n::clients] or keys, n) if args.hash_tags else
                 keys[n::clients] or keys, args.value_size, args.seconds, start_at)
                for n in range(clients)]
    if clients == 1:
        per_client = [_client_run(*run_args[0])]
    else:
        with multiprocess.get_context("spawn").Pool(clients) as pool:
            per_client = pool.starmap(_client_run, run_args)
    if sampler is not None:
        sampler.join()
    with grid.connect(args.address, cluster_name=args.cluster_name) as client:
        client.get_map(args.map).clear()
    _print(per_client, members, args, clients, sampler.spent if sampler else None, Console(),
           Table)
    return 0


def _tagged(keys: list[str], client: int) -> list[str]:
    """The keys with one hash tag a batch (``{b0-7}key-700``...), the batches being the
    ones ``_client_run`` cuts."""
    return [f"{{b{client}-{i // BATCH}}}{key}" for i, key in enumerate(keys)]


def _print(per_client: list[list[tuple[str, int, list]]], members: int,
           args: argparse.Namespace, clients: int, member_cpu: list[float | None] | None,
           console: Any, table_class: Any) -> None:
    table = table_class(title=f"{members} members, {clients} client process"
                        f"{'es' if clients > 1 else ''}, {args.keys} keys, "
                        f"{args.value_size}-byte values"
                        f"{', one hash tag a batch' if args.hash_tags else ''}",
                        caption=compiled_summary())
    columns = ["operation", "entries/s", "p50 ms", "p99 ms", "calls"]
    if member_cpu is not None:
        columns.append("member CPU µs/entry")
    for col in columns:
        table.add_column(col, justify="left" if col == "operation" else "right")
    for index, (name, _, _) in enumerate(per_client[0]):
        entries = sum(run[index][1] for run in per_client)
        latencies = sorted(lat for run in per_client for lat in run[index][2])
        row = [name, f"{entries / args.seconds:,.0f}",
               f"{_percentile(latencies, 0.5) * 1e3:.3f}",
               f"{_percentile(latencies, 0.99) * 1e3:.3f}", str(len(latencies))]
        if member_cpu is not None:
            spent = member_cpu[index]
            row.append("-" if spent is None or not entries else f"{spent / entries * 1e6:,.1f}")
        table.add_row(*row)
    console.print(table)
