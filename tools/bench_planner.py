"""How long a full repartition takes on the master: target assignment, then planning and
prioritising every partition's migrations (grid.partition; no cluster needed).

Run from the project root:

    python tools/bench_planner.py [--members 10] [--backup-count 1] [--repeat 5]

For 271 and 20,000 partitions it times three membership changes with ``--members`` members:
the initial assignment (empty table), a member joining (one fewer before) and a member
leaving (its slots already emptied by the master's repair step). "first" is the first run in
this process (it also computes the per-index partition orders, which are then cached); "best"
and "median" are over ``--repeat`` runs. The aims (issue 3) are printed as ratios: under 50 ms
for 271 partitions and under 2 s for 20,000. Numbers are for comparing variants on one machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from grid.partition.assignment import assign  # noqa: E402
from grid.partition.migration_plan import RepartitionPlan, plan_repartition  # noqa: E402
from grid.partition.table import PartitionTable  # noqa: E402

AIM_S = {271: 0.050, 20_000: 2.0}


def member_ids(count: int) -> list[str]:
    """UUID-shaped, fixed member ids, so that runs are comparable."""
    return [f"{k:08x}-0000-4000-8000-{k:012x}" for k in range(count)]


def repartition(current: PartitionTable, members: list[str], backup_count: int) -> RepartitionPlan:
    """What the master does on a membership change, minus the I/O."""
    target = assign(current, members, backup_count)
    return plan_repartition(current, target)


def scenarios(
    partition_count: int, member_count: int, backup_count: int
) -> dict[str, Callable[[], RepartitionPlan]]:
    members = member_ids(member_count)
    empty = PartitionTable(partition_count)
    before_join = assign(empty, members[:-1], backup_count)
    balanced = assign(empty, members, backup_count)
    after_leave = balanced.copy()
    gone = members[-1]
    for pid in range(partition_count):
        replicas = balanced.replicas(pid)
        if gone in replicas:
            after_leave.set_replica(pid, replicas.index(gone), None)
    return {
        "initial": lambda: repartition(empty, members, backup_count),
        "join": lambda: repartition(before_join, members, backup_count),
        "leave": lambda: repartition(after_leave, members[:-1], backup_count),
    }


def measure(run: Callable[[], RepartitionPlan], repeat: int) -> tuple[list[float], RepartitionPlan]:
    times = []
    plan = None
    for _ in range(repeat):
        start = time.perf_counter()
        plan = run()
        times.append(time.perf_counter() - start)
    assert plan is not None
    return times, plan


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--backup-count", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(
        f"members={args.members} backup_count={args.backup_count} repeat={args.repeat} "
        f"python={sys.version.split()[0]}"
    )
    header = (
        f"{'partitions':>10} {'change':>8} {'first ms':>9} {'best ms':>9} {'median ms':>10} "
        f"{'aim ms':>7} {'median/aim':>10} {'queued':>7} {'removals':>8} {'lost':>6}"
    )
    print(header)
    for partition_count, aim_s in AIM_S.items():
        cases = scenarios(partition_count, args.members, args.backup_count)
        for name, run in cases.items():
            times, plan = measure(run, args.repeat)
            median = statistics.median(times)
            print(
                f"{partition_count:>10} {name:>8} {times[0] * 1e3:>9.1f} {min(times) * 1e3:>9.1f} "
                f"{median * 1e3:>10.1f} {aim_s * 1e3:>7.0f} {median / aim_s:>10.2f} "
                f"{plan.migration_count:>7} {len(plan.removals):>8} {len(plan.lost_owners):>6}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
