"""A new master's table: newest rows win, unresolved migrations commit or roll back."""

from __future__ import annotations

from grid.cluster.recovery import collected_table
from grid.partition.table import PartitionTable


def table_with(rows: dict[int, tuple[str | None, ...]], count: int = 4) -> PartitionTable:
    table = PartitionTable(count)
    for pid, row in rows.items():
        table.set_replicas(pid, row)
    return table


def test_the_newest_version_of_each_partition_wins_and_nothing_is_shared():
    own = table_with({0: ("a", "b"), 1: ("a", "b")})
    other = own.copy()
    other.set_replicas(1, ("c", "b"))  # a committed MOVE the old master had published there
    result = collected_table(own, [other], [])
    assert result.replicas(1)[:2] == ("c", "b") and result.version(1) == other.version(1)
    assert result.replicas(0) == own.replicas(0)
    assert own.replicas(1)[:2] == ("a", "b"), "the master's own table is not changed"


def test_a_migration_some_member_committed_stays_committed():
    own = table_with({2: ("a", "b")})
    initial = own.version(2)
    destination = own.copy()
    destination.set_replicas(2, ("a", "c"))  # took the step: one slot, version + 1
    result = collected_table(own, [destination], [[2, initial, 1]])
    assert result.replicas(2)[:2] == ("a", "c")
    assert result.version(2) == initial + 1


def test_a_migration_nobody_committed_rolls_back_past_the_commit_version():
    own = table_with({3: ("a", "b")})
    initial = own.version(3)
    result = collected_table(own, [own.copy()], [[3, initial, 1], [99, 0, 1]])
    assert result.replicas(3)[:2] == ("a", "b")
    # Above initial + 1: a destination that committed without a word accepts this row.
    assert result.version(3) == initial + 2
