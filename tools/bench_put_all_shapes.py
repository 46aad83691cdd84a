"""Where a put_all's time goes: the same batches of 100 keys, shaped to reach more or fewer
members and partitions, with the members' and the client's CPU per call.

    python tools/bench_put_all_shapes.py                   # starts a 3-member cluster, backup 1
    python tools/bench_put_all_shapes.py --rounds 3 --seconds 3
    python tools/bench_put_all_shapes.py --cluster-name dev

The cluster's backups are spread over the members (``--backup-placement spread``; the cluster
it starts is). A put_all of keys spread over every partition is one message to each of the 3
owners; each owner backs its part up on both other members: 3 requests, 6 backup
operations, 6 acknowledgements and 3 replies, and some 80 partitions on the owners and again
on the backups. The shapes take their keys from sets of partitions chosen by the table:

- spread: any partition (the workload of ``tools/bench_ops.py``);
- ring: only partitions whose first backup is the "next" member of their owner (A's backed
  up on B, B's on C, C's on A): each owner's part has one backup, which answers the client
  itself (grid/cluster/chain.py): 3 requests, 3 operations, 3 answers, and 3
  acknowledgements that the client does not wait for; as many partitions as spread;
- one pair: only partitions of one owner with one backup: 1 request, 1 operation, 1 answer;
  some 40 partitions (fewer exist);
- few partitions: one partition of each (owner, backup) pair, 6 in all: the messages of
  spread with hardly any partitions.

So ring against spread is what the message pattern costs, few partitions against spread what
the partitions cost. A cluster with paired backups (the default placement) is a ring: there
every spread batch has the ring's shape, and the shapes cannot be told apart. Each shape runs
``--seconds`` a turn, in ``--rounds`` turns taken in order; keys are overwritten in place
(100-byte values), as in a steady workload. The members' CPU counts their busy polling too
(``member_busy_poll_us``), the client's its own.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import psutil
from bench_ops import grid_cluster
from rich.console import Console
from rich.table import Table

import grid

BATCH = 100
SHAPES = ("spread", "ring", "one pair", "few partitions")


def shaped_keys(client: grid.Client, keys_per_shape: int) -> dict[str, list[str]]:
    """Keys of each shape, from the cluster's partition table."""
    replicas = client.partition_replicas()
    owners = sorted({row[0] for row in replicas.values() if row and row[0]})
    if len(owners) < 3:
        raise SystemExit(f"the shapes need 3 data members; the table names {len(owners)}")
    following = {owner: owners[(i + 1) % len(owners)] for i, owner in enumerate(owners)}
    pair_of = {pid: (row[0], row[1] if len(row) > 1 else None)
               for pid, row in replicas.items()}
    if any(backup is None for _, backup in pair_of.values()):
        raise SystemExit("every partition needs a backup (backup_count >= 1)")
    pairs = sorted(set(pair_of.values()))
    if len(pairs) < 6:
        raise SystemExit(f"the shapes need backups spread over the members (a cluster started "
                         f"with --backup-placement spread); the table has {len(pairs)} owner "
                         f"and backup pairs, not 6")
    one_pair = max(pairs, key=lambda pair: sum(p == pair for p in pair_of.values()))
    few = {min(pid for pid, p in pair_of.items() if p == pair) for pair in pairs}
    wanted = {
        "spread": lambda pid: True,
        "ring": lambda pid: pair_of[pid][1] == following[pair_of[pid][0]],
        "one pair": lambda pid: pair_of[pid] == one_pair,
        "few partitions": lambda pid: pid in few,
    }
    shaped: dict[str, list[str]] = {shape: [] for shape in SHAPES}
    i = 0
    while min(map(len, shaped.values())) < keys_per_shape:
        key = f"key-{i}"
        pid = client.partition_id(key)
        for shape, keys in shaped.items():
            if len(keys) < keys_per_shape and wanted[shape](pid):
                keys.append(key)
        i += 1
    return shaped


def cpu_seconds(processes: list[psutil.Process]) -> tuple[float, float]:
    """User and system CPU seconds of ``processes`` together."""
    times = [process.cpu_times() for process in processes]
    return sum(t.user for t in times), sum(t.system for t in times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster-name", help="a running cluster of 3 data members, backup 1, "
                        "backups spread (default: start one)")
    parser.add_argument("--keys", type=int, default=20_000, help="keys a shape (default 20000)")
    parser.add_argument("--seconds", type=float, default=2.0, help="a turn (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each shape (default 2)")
    args = parser.parse_args()
    value = b"v" * 100
    rng = random.Random(7)
    spread = ("--backup-count", "1", "--backup-placement", "spread")
    with grid_cluster(args.cluster_name, spread) as name, grid.connect(cluster_name=name) as client:
        shaped = shaped_keys(client, args.keys)
        members = [psutil.Process(member.pid) for member in client.cluster.members]
        me = psutil.Process()
        orders = client.get_map("put_all_shapes")
        for keys in shaped.values():  # every key present: later turns overwrite in place
            orders.put_all(dict.fromkeys(keys, value))
        totals = {shape: [0, 0.0, 0.0, 0.0, 0.0] for shape in SHAPES}  # calls, s, cpu...
        for _ in range(args.rounds):
            for shape in SHAPES:
                keys = shaped[shape]
                batches = [dict.fromkeys(rng.sample(keys, BATCH), value) for _ in range(200)]
                user, system = cpu_seconds(members)
                mine = me.cpu_times()
                calls, start = 0, time.perf_counter()
                while (elapsed := time.perf_counter() - start) < args.seconds:
                    orders.put_all(batches[calls % len(batches)])
                    calls += 1
                user_after, system_after = cpu_seconds(members)
                mine_after = me.cpu_times()
                total = totals[shape]
                total[0] += calls
                total[1] += elapsed
                total[2] += user_after - user
                total[3] += system_after - system
                total[4] += (mine_after.user + mine_after.system) - (mine.user + mine.system)
        orders.clear()
    table = Table(title=f"put_all of {BATCH} keys, 100-byte values, one synchronous client, "
                        f"{args.rounds} turns of {args.seconds:g} s a shape")
    for column in ("shape", "keys/s", "µs a call", "members' CPU µs a call (system)",
                   "client CPU µs a call", "vs spread"):
        table.add_column(column, justify="left" if column == "shape" else "right",
                         no_wrap=column == "shape")
    spread_rate = totals["spread"][0] / totals["spread"][1]
    for shape in SHAPES:
        calls, seconds, user, system, client_cpu = totals[shape]
        table.add_row(shape, f"{calls * BATCH / seconds:,.0f}", f"{seconds / calls * 1e6:,.0f}",
                      f"{(user + system) / calls * 1e6:,.0f} ({system / calls * 1e6:,.0f})",
                      f"{client_cpu / calls * 1e6:,.0f}",
                      f"{calls / seconds / spread_rate:.2f}x")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
