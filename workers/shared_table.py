"""The shared index's table loops, compiled with the hot path (grid/compiled.py).

A shared index (workers/local_reads.py) is a linear-probing table of (key hash, record offset
+ 1) pairs of u64s. Into a map published for local reads, an owner's bulk write inserts each
of its new keys into it, one probe loop an entry: run as Python that was about 0.3 µs a row,
nearly half of the shared index's upkeep in a bulk load (which was about a third of the
members' CPU of a Spark append after a read). These loops are plain functions on the table's
u64s so that mypyc compiles them with native ints; ``SharedIndex`` itself stays Python (the
simulation's broken-protocol tests replace its methods). Its single ``insert`` keeps its own
probe on the mapping: the views ``insert_entries`` needs cost more than one entry's probe.
"""

from __future__ import annotations

from array import array

from mypy_extensions import i64

__all__ = ["insert_entries", "probed_table"]


def insert_entries(table: memoryview, mask: int, hashes: list[int], offsets: list[int]) -> None:
    """Insert each (hash, offset) pair into ``table`` (u64s, two an entry, ``mask + 1``
    entries), each at the first empty entry from its home ``hash & mask``. The caller has
    checked that they fit: the loop ends only at an empty entry."""
    if len(hashes) != len(offsets):
        raise ValueError(f"{len(hashes)} hashes given {len(offsets)} offsets")
    m: i64 = mask  # (a hash is a u64: beyond an i64, so it is masked as a Python int)
    n: i64 = len(hashes)
    k: i64 = 0
    while k < n:
        h = hashes[k]
        i: i64 = h & mask
        while table[2 * i + 1]:
            i = (i + 1) & m
        table[2 * i] = h
        table[2 * i + 1] = offsets[k] + 1
        k += 1


def probed_table(entries: dict[int, int | tuple[int, ...]], capacity: int) -> array:
    """The table of ``entries`` (a fragment's dict index: hash -> offset, or a tuple of
    offsets where 64-bit hashes collide), inserted one by one, as u64s."""
    hashes: list[int] = []
    offsets: list[int] = []
    for h, entry in entries.items():
        if isinstance(entry, int):
            hashes.append(h)
            offsets.append(entry)
        else:
            for offset in entry:
                hashes.append(h)
                offsets.append(offset)
    table = array("Q", bytes(16 * capacity))
    with memoryview(table) as view:
        insert_entries(view, capacity - 1, hashes, offsets)
    return table
