"""What the master does to the partition table when members leave (seed 002, section 1.1).

Only the master calls these, and publishes the result; the others act when they receive it.
A left member's slots become empty; where the owner left, the hottest remaining backup is
promoted to owner (it has every acknowledged write: backups are synchronous), and the
synchronous backups after it move up to close the holes (they hold the same writes, so no
data moves; leaving the holes would make the planner shift them up by migrations); where every
replica left, the least loaded data member becomes the (empty) owner. Re-creating the lost
backups is the migration planner's work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from grid.partition.assignment import SPREAD, assign
from grid.partition.table import MAX_REPLICA_COUNT, PartitionTable


def remove_members(table: PartitionTable, removed: Iterable[str],
                   data_members: Sequence[str], backup_count: int = 0) -> PartitionTable:
    """A new table without the removed members; ``data_members`` are the ones that remain.
    The synchronous backups (indexes 1..``backup_count``) close up behind a gone replica;
    colder (asynchronous) ones stay where they are, they may lack writes."""
    gone = set(removed)
    result = table.copy()
    if not gone:
        return result
    owner_counts = {m: 0 for m in data_members}
    orphans = []
    for pid in range(result.partition_count):
        replicas = [None if r in gone else r for r in result.replicas(pid)]
        if replicas[0] is None:
            hottest = next((i for i in range(1, MAX_REPLICA_COUNT) if replicas[i]), None)
            if hottest is not None:
                replicas[0], replicas[hottest] = replicas[hottest], None
        synchronous = [r for r in replicas[1:1 + backup_count] if r is not None]
        replicas[1:1 + backup_count] = synchronous + [None] * (backup_count - len(synchronous))
        if replicas != list(result.replicas(pid)):
            result.set_replicas(pid, replicas)
        owner = result.owner(pid)
        if owner is None:
            orphans.append(pid)
        elif owner in owner_counts:
            owner_counts[owner] += 1
    for pid in orphans:
        if not owner_counts:
            break
        # Deterministic: least loaded first, ties broken by age (the list order).
        owner = min(owner_counts, key=lambda m: owner_counts[m])
        result.set_replica(pid, 0, owner)
        owner_counts[owner] += 1
    return result


def initial_assignment(table: PartitionTable, data_members: Sequence[str],
                       backup_count: int, placement: str = SPREAD) -> PartitionTable:
    """A copy of ``table`` with a balanced assignment over the data members, its backups
    placed by ``placement``. Setting the replicas raises each partition's version above
    ``table``'s, so every member takes it."""
    target = assign(table, list(data_members), backup_count, placement)
    result = table.copy()
    for pid in range(result.partition_count):
        result.set_replicas(pid, target.replicas(pid))
    return result


def required_replicas(data_member_count: int, backup_count: int) -> int:
    return min(data_member_count, backup_count + 1, MAX_REPLICA_COUNT)


def is_cluster_safe(table: PartitionTable, data_members: Sequence[str], backup_count: int,
                    migrating: bool = False) -> bool:
    """Every partition has its configured replicas on live data members and nothing migrates."""
    if migrating or not table.is_assigned():
        return False
    live = set(data_members)
    need = required_replicas(len(live), backup_count)
    for pid in range(table.partition_count):
        replicas = table.replicas(pid)
        if any(replicas[i] is None or replicas[i] not in live for i in range(need)):
            return False
    return True
