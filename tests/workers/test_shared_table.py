"""The shared index's compiled probe loops (workers/shared_table.py) against a plain model of
linear probing: every entry is found from its home before an empty one, runs wrap around the
table's end, and a bad call changes nothing."""

from __future__ import annotations

import random
from array import array

import pytest

from workers.shared_table import insert_entries, probed_table

pytestmark = pytest.mark.timeout(60)


def model_insert(table: array, mask: int, h: int, offset: int) -> None:
    i = h & mask
    while table[2 * i + 1]:
        i = (i + 1) & mask
    table[2 * i], table[2 * i + 1] = h, offset + 1


def reachable(table: array, mask: int, h: int, offset: int) -> bool:
    i = h & mask
    while table[2 * i + 1]:
        if (table[2 * i], table[2 * i + 1]) == (h, offset + 1):
            return True
        i = (i + 1) & mask
    return False


@pytest.mark.parametrize("seed", range(30))
def test_a_batch_lands_where_one_insert_after_another_puts_it(seed) -> None:
    """Into a table already holding entries (homes crowding its end in some seeds, hashes
    repeated in others): the same table as a loop of single inserts, whole 64-bit hashes."""
    rng = random.Random(seed)
    capacity = 1 << rng.randrange(1, 10)
    mask = capacity - 1
    crowd = rng.random() < 0.5
    def draw() -> int:
        high = rng.getrandbits(64 - capacity.bit_length()) << capacity.bit_length()
        low = (capacity - 1 - rng.randrange(min(4, capacity))) if crowd else rng.randrange(8)
        return (high | low) & ((1 << 64) - 1)
    table = array("Q", bytes(16 * capacity))
    before = [(draw(), k) for k in range(rng.randrange(capacity // 2))]
    for h, offset in before:
        model_insert(table, mask, h, offset)
    room = capacity // 2 - len(before)
    batch = [(draw(), 1000 + k) for k in range(rng.randrange(room + 1))]
    expected = array("Q", table)
    for h, offset in batch:
        model_insert(expected, mask, h, offset)
    with memoryview(table) as view:
        insert_entries(view, mask, [h for h, _ in batch], [o for _, o in batch])
    assert table == expected
    assert all(reachable(table, mask, h, o) for h, o in before + batch)


def test_hashes_and_offsets_of_different_lengths_change_nothing() -> None:
    table = array("Q", bytes(16 * 8))
    with memoryview(table) as view, pytest.raises(ValueError, match="2 hashes given 1"):
        insert_entries(view, 7, [1, 2], [0])
    assert not any(table)


def test_a_table_of_a_dict_index_holds_each_offset_of_a_shared_hash() -> None:
    """A fragment's dict index holds a tuple of offsets where two keys' hashes collide."""
    rng = random.Random(3)
    entries: dict[int, int | tuple[int, ...]] = {}
    for k in range(40):
        h = rng.getrandbits(64) if k % 5 else 127  # one hash many times, homed at the end
        old = entries.get(h)
        entries[h] = k if old is None else (old if isinstance(old, tuple) else (old,)) + (k,)
    table = probed_table(entries, 128)
    expected = array("Q", bytes(16 * 128))
    for h, entry in entries.items():
        for offset in (entry,) if isinstance(entry, int) else entry:
            model_insert(expected, 127, h, offset)
    assert table == expected
    assert table[2 * 127] == 127 and table[0] == 127  # the run of hash 127 wrapped around
