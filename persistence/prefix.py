"""The record prefix: namespace id and partition id in one 64-bit int (seed 003's `long prefix`).

Recovery hands each record back with its prefix, so finding the partition (and the map) a
record belongs to is arithmetic, not a lookup.
"""

from __future__ import annotations

namespace_id_max = (1 << 32) - 1
partition_id_max = (1 << 32) - 1
prefix_max = (1 << 64) - 1


def make_prefix(namespace_id: int, partition_id: int) -> int:
    """Pack a namespace id (high 32 bits) and a partition id (low 32 bits)."""
    if not 0 <= namespace_id <= namespace_id_max:
        raise ValueError(f"namespace_id {namespace_id} is outside 0..{namespace_id_max}")
    if not 0 <= partition_id <= partition_id_max:
        raise ValueError(f"partition_id {partition_id} is outside 0..{partition_id_max}")
    prefix = namespace_id << 32 | partition_id
    assert 0 <= prefix <= prefix_max
    return prefix


def split_prefix(prefix: int) -> tuple[int, int]:
    """The (namespace_id, partition_id) that make_prefix packed."""
    if not 0 <= prefix <= prefix_max:
        raise ValueError(f"prefix {prefix} is outside 0..{prefix_max}")
    return prefix >> 32, prefix & partition_id_max
