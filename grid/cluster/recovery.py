"""The table a new master starts from (seed 002 sections 1.2 and 2.2).

A member that takes over mastership collects every member's table and the migrations each
has not resolved. Per partition the newest version wins: a migration that some member
committed is in that member's table at its raised version. A migration that no table took is
rolled back: its partition's version is raised past the one the commit would have given, so
that a destination that did take it (and did not answer) accepts the new master's row.
The new master then removes the members gone meanwhile, as on any removal
(``repair.remove_members``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from grid.partition.table import PartitionTable


def collected_table(own: PartitionTable, collected: Iterable[PartitionTable],
                    unresolved: Iterable[Sequence[int]]) -> PartitionTable:
    """``own`` merged with the ``collected`` tables (the newest version of each partition
    wins), with every ``unresolved`` migration ([partition id, initial version, version
    increment]) committed, where some table took it, or rolled back."""
    table = own.copy()
    for other in collected:
        table.apply(other)
    for pid, initial, increment in unresolved:
        if 0 <= pid < table.partition_count and table.version(pid) < initial + increment:
            table.raise_version(pid, initial + increment + 1 - table.version(pid))
    return table
