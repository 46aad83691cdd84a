"""Which members a cluster restarts on, from what their files hold (seed 003, seed 001 §3.2).

Every member restored a partition table (or none: a fresh folder). Members whose tables are
equal (one stamp) form a group. The policy picks the group the cluster restarts on:

- ``full_recovery_only``: every member of the saved table is here and all restored the same
  table; anything else is refused, saying what differs or who is missing;
- ``partial_recovery_most_recent``: the group whose table has the greatest sum of partition
  versions (a stamp only says equal or not; the sum orders tables, seed 001 §3.2);
- ``partial_recovery_most_complete``: the largest group (on a tie, the most recent).

Members outside the chosen group hold stale data: with ``auto_remove_stale_data`` they join
with their data wiped (migrations give them a share), without it they are removed. Members
of the saved table that did not come are missing: the table is repaired without them, as on
any removal, and migrations re-create what they held.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from grid.partition.table import PartitionTable

POLICIES = ("full_recovery_only", "partial_recovery_most_recent",
            "partial_recovery_most_complete")


@dataclass
class RestartDecision:
    table: PartitionTable | None = None  # the table to restart on; None: a fresh assignment
    stale: set[str] = field(default_factory=set)  # members whose data is not the table's
    missing: set[str] = field(default_factory=set)  # replicas of the table that did not come
    refusal: str = ""  # why the cluster cannot restart (then nothing else is set)


def decide_restart(restored: Mapping[str, PartitionTable | None], names: Mapping[str, str],
                   policy: str) -> RestartDecision:
    """``restored``: each member here (uuid) and the table its files held, or None."""
    if policy not in POLICIES:
        raise ValueError(f"restart policy must be one of {', '.join(POLICIES)}")
    groups: dict[int, list[str]] = {}
    tables: dict[int, PartitionTable] = {}
    for uuid, table in restored.items():
        if table is not None:
            stamp = table.stamp()
            groups.setdefault(stamp, []).append(uuid)
            tables[stamp] = table
    if not groups:
        return RestartDecision()  # nobody holds data: a new cluster

    def recency(stamp: int) -> int:
        return tables[stamp].version_sum()

    if policy == "partial_recovery_most_complete":
        chosen = max(groups, key=lambda s: (len(groups[s]), recency(s)))
    else:
        chosen = max(groups, key=recency)
    table = tables[chosen]
    in_table = {u for pid in range(table.partition_count) for u in table.replicas(pid)
                if u is not None}
    missing = in_table - set(restored)
    stale = {u for u, t in restored.items() if t is not None and t.stamp() != chosen}
    if policy == "full_recovery_only":
        fresh = sorted(names.get(u, u) for u, t in restored.items() if t is None)
        if stale or fresh:
            others = sorted(names.get(u, u) for u in stale)
            return RestartDecision(refusal=(
                "the members' files do not hold one partition table: "
                + (f"{', '.join(others)} restored another table; " if others else "")
                + (f"{', '.join(fresh)} hold no data; " if fresh else "")
                + "start with a partial_recovery restart_policy, or `shmgrid force-start`"))
        if missing:
            return RestartDecision(refusal=(
                f"members of the saved table are missing: {len(missing)} "
                f"({', '.join(sorted(missing))[:200]}); bring their folders back, or start "
                f"with a partial_recovery restart_policy"))
    return RestartDecision(table=table.copy(), stale=stale, missing=missing)


def reclaim_target(table: PartitionTable, stable: PartitionTable,
                   data_members: list[str]) -> PartitionTable | None:
    """STABLE_CLUSTER (seed 003): ``table`` with every partition whose stable replicas are
    all data members again set back to its ``stable`` row, so that a member that came back
    takes back what it held; None when nothing differs. Partitions of a member still away
    keep their current row: nothing else moves."""
    here = set(data_members)
    target = table.copy()
    for pid in range(stable.partition_count):
        row = stable.replicas(pid)
        if all(u is None or u in here for u in row) and row != target.replicas(pid):
            target.set_replicas(pid, row)
    return None if target == table else target
