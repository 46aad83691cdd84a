"""Record frames (workers/record_block.py): parsed, checked and hashed in bulk, cut by items,
and laid out again for a backup."""

from __future__ import annotations

import random
import struct

import mmh3
import numpy as np
import pytest

from grid.errors import ProtocolError
from workers.record_block import (
    KEY_MATRIX_MAX,
    RecordBlock,
    murmur3_x64_64,
    parse_records,
    records_frame,
)
from workers.record_store import ValueTooLargeError, key_hash

pytestmark = pytest.mark.timeout(60)


def frame_of(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """The frame a client sends for these records: the table of sizes, then the records."""
    table = b"".join(struct.pack("<II", len(k), len(v)) for k, v in pairs)
    return table + b"".join(struct.pack("<II", len(k), len(v)) + k + v for k, v in pairs)


def padded(keys: list[bytes], width: int) -> np.ndarray:
    """The keys zero-padded to ``width`` bytes, a key a row (what the numpy hashes take)."""
    matrix = np.zeros((len(keys), width), np.uint8)
    for row, key in enumerate(keys):
        matrix[row, :len(key)] = list(key)
    return matrix


def test_murmur3_of_padded_rows_is_the_stores_key_hash() -> None:
    rng = random.Random(5)
    keys = [rng.randbytes(rng.randrange(70)) for _ in range(3000)] + [b""]
    lengths = np.array([len(key) for key in keys], np.int64)
    assert murmur3_x64_64(padded(keys, 80).view("<u8"), lengths).tolist() == \
        [mmh3.hash128(key) & (2**64 - 1) for key in keys] == list(map(key_hash, keys))


@pytest.mark.parametrize("longest", [40, KEY_MATRIX_MAX + 1])  # (the second: one by one)
def test_a_frame_gives_its_records_their_hashes_and_its_layout_back(longest: int) -> None:
    rng = random.Random(longest)
    pairs = [(rng.randbytes(rng.randrange(longest)), rng.randbytes(rng.randrange(300)))
             for _ in range(200)] + [(b"k" * longest, b"")]
    frame = frame_of(pairs)
    block = parse_records(frame, len(pairs))
    assert len(block) == 2 * len(pairs) and block.rows == len(pairs)
    assert block.items() == [item for pair in pairs for item in pair]
    assert block.hash_list() == [key_hash(key) for key, _ in pairs]
    assert block.largest() == max(len(k) + len(v) for k, v in pairs)
    part = block[20:60]  # records 10 to 29, as a slice of items cuts them
    assert part.items() == [item for pair in pairs[10:30] for item in pair]
    assert part.hash_list() == [key_hash(key) for key, _ in pairs[10:30]]
    assert bytes(part.block()) == frame_of(pairs[10:30])[8 * 20:]
    assert part.starts_at(100)[0] == 100 and len(part.starts_at(100)) == 20
    assert part.record_bytes() == len(part.block())
    again = parse_records(records_frame([block[0:4], part, block[398:]]), 24)
    assert again.items() == [item for pair in pairs[:2] + pairs[10:30] + pairs[199:]
                             for item in pair]
    assert list(part) == part.items()
    empty = block[6:6]
    assert (len(empty), empty.items(), empty.record_bytes(), empty.largest()) == (0, [], 0, 0)
    assert parse_records(b"", 0).items() == []
    assert block[1:4] == [pairs[0][1], *pairs[1]]  # not whole records: the items, a list


@pytest.mark.parametrize("bad", ["short table", "long", "short", "header", "rows"])
def test_a_malformed_frame_is_a_protocol_error(bad: str) -> None:
    pairs = [(b"a", b"1"), (b"key", b"value"), (b"", b"")]
    frame, rows = frame_of(pairs), len(pairs)
    if bad == "short table":
        frame = frame[:10]
    elif bad == "long":
        frame += b"x"
    elif bad == "short":
        frame = frame[:-1]
    elif bad == "header":  # the table says (1, 1), the first record (1, 2) and a byte less
        frame = frame[:24] + struct.pack("<II", 1, 2) + frame[32:]
    else:
        rows = 4
    with pytest.raises(ProtocolError):
        parse_records(frame, rows)


def test_a_block_is_sliced_as_a_list_of_its_items_is() -> None:
    block = parse_records(frame_of([(b"a", b"1"), (b"b", b"2")]), 2)
    assert isinstance(block[0:2], RecordBlock) and block[0:2].items() == [b"a", b"1"]
    assert block[2:].items() == [b"b", b"2"] and block[:].rows == 2
    assert block[::2] == [b"a", b"b"] and block[1::2] == [b"1", b"2"]


def test_blocks_are_stored_as_their_items_are(make_store) -> None:
    """put_groups of record blocks leaves the store as put_groups of the same records as
    items: new keys appended in one piece (arena growth included), and a block with a key
    present already, or twice, or a fragment with a Merkle tree, a record at a time."""
    blocks, items = (make_store(merkle_depth=6, initial_segment_bytes=512) for _ in "ab")
    for store in (blocks, items):
        store.put(3, "m", b"there", b"t")
        store.put(4, "m", b"tree", b"t")
        store.tree(4, "m")  # kept from here on
    rng = random.Random(2)
    batches = [
        {1: [(b"a%d" % i, rng.randbytes(rng.randrange(200))) for i in range(30)],
         2: [(b"b", b"1")]},
        {1: [(b"a3", b"again"), (b"new", b"n")], 3: [(b"x", b"1"), (b"there", b"t2")],
         4: [(b"y", b"2")], 5: []},
        {2: [(b"c", b"1"), (b"c", b"2")], 6: [(b"d%d" % i, b"v" * i) for i in range(50)],
         1: [(b"z%d" % i, b"w" * 300) for i in range(20)]},  # new keys: the arena grows
    ]
    for batch in batches:
        pairs = [pair for pairs in batch.values() for pair in pairs]
        block = parse_records(frame_of(pairs), len(pairs))
        groups, at = [], 0
        for pid, group in batch.items():
            groups.append((pid, block[at:at + 2 * len(group)]))
            at += 2 * len(group)
        blocks.put_groups("m", groups)
        items.put_groups("m", [(pid, [item for pair in group for item in pair])
                               for pid, group in batch.items()])
    for pid in range(1, 7):
        assert blocks.concatenated(pid, "m") == items.concatenated(pid, "m"), pid
        assert (pid in blocks._partitions) == (pid in items._partitions) == (pid != 5)
        if pid == 5:
            continue  # (an empty group makes no fragment)
        ours, theirs = blocks._partitions[pid]["m"], items._partitions[pid]["m"]
        assert (ours.index, ours.count, ours.live_bytes, ours.garbage_bytes) == \
            (theirs.index, theirs.count, theirs.live_bytes, theirs.garbage_bytes), pid
    assert blocks.tree(4, "m").nodes == items.tree(4, "m").nodes
    assert blocks.get(2, "m", b"c") == b"2" and blocks.get(1, "m", b"a3") == b"again"
    blocks._check()
    items._check()


def test_a_block_with_a_record_too_large_changes_nothing(make_store) -> None:
    store = make_store(max_record_bytes=100)
    pairs = [(b"a", b"1"), (b"big", b"x" * 100)]
    block = parse_records(frame_of(pairs), 2)
    with pytest.raises(ValueTooLargeError):
        store.put_groups("m", [(1, block[0:2]), (2, block[2:4])])
    assert store.partitions() == []
