"""The Spark writer's column-wise put_all records (grid/spark/packed_write.py) against the row
path: the same key and value bytes in the same partitions, the same placement (hash tags
included), the same refusals; the writer keeping the rows' order when it switches between the
two paths; and members storing and backing up the records (workers/record_block.py)."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import mmh3
import msgpack
import numpy as np
import pyarrow as pa
import pytest

from grid.errors import ValueTooLargeError
from grid.serialization import partition_id_of
from grid.spark import source
from grid.spark.packed_write import KEY_BYTES_MAX, murmur3_32, pack_rows, packable
from grid.spark.source import _PendingRows
from tests.spark.fake_grid import FakeGrid
from tests.workers.test_record_block import frame_of, padded

pytestmark = pytest.mark.timeout(60)

# Lengths on both sides of every msgpack header size (fixstr 31/32, 8 bit 255/256, 16 bit
# 65535/65536), 123 (the byte "{" as a str8 length) and a tag's braces.
KEY_LENGTHS = [0, 1, 3, 4, 5, 9, 31, 32, 33, 122, 123, 124, 255, 256, 300]
VALUE_LENGTHS = [0, 1, 100, 253, 254, 255, 256, 65533, 65535, 65536, 70000]


# Batches whose headers are all of one size take a shorter way: short keys and values only.
SHORT_KEY_LENGTHS = [0, 1, 5, 30, 31, 32]
SHORT_VALUE_LENGTHS = [0, 1, 31, 32, 100, 253, 254, 255]


def random_key(rng: random.Random, lengths: list[int] = KEY_LENGTHS) -> str:
    return "".join(rng.choice("ab{}xyz") for _ in range(rng.choice(lengths)))


def expected_pieces(keys: list[str], values: list, partition_count: int
                    ) -> dict[int, tuple[int, bytes, bytes]]:
    """What the row path's entries are as records: each pair's key and value bytes as the
    client serializes them, by partition, with the table of their sizes."""
    pairs: dict[int, list[tuple[bytes, bytes]]] = {}
    for key, value in zip(keys, values, strict=True):
        key_bytes = msgpack.packb(key, use_bin_type=True)
        pairs.setdefault(partition_id_of(key_bytes, partition_count), []).append(
            (key_bytes, msgpack.packb(value, use_bin_type=True)))
    return {pid: (len(group), *_table_and_records(group)) for pid, group in pairs.items()}


def _table_and_records(pairs: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    frame = frame_of(pairs)
    return frame[:8 * len(pairs)], frame[8 * len(pairs):]


@pytest.mark.parametrize("short", [False, True])
@pytest.mark.parametrize("value_type", [pa.binary(), pa.string()])
@pytest.mark.parametrize("seed", range(3))
def test_packed_rows_are_the_entries_the_row_path_sends(short, value_type, seed) -> None:
    rng = random.Random(seed)
    key_lengths = SHORT_KEY_LENGTHS if short else KEY_LENGTHS
    value_lengths = SHORT_VALUE_LENGTHS if short else VALUE_LENGTHS
    keys = [random_key(rng, key_lengths) for _ in range(2000)]
    if short:  # keys of one header size (fixstr: seed 0, str8: seed 1), or up to 32 bytes
        keys = [[key[:31], key.ljust(32, "z") + "€", key][seed] for key in keys]
        value_lengths = [n for n in value_lengths if n >= 32] if seed == 1 else value_lengths
    else:
        keys += ["{user42}:cart", "user42", "a{b}c", "{}x", "x" * 123, "{" * 40, "é€"]
    values: list = [rng.randbytes(rng.choice(value_lengths)) for _ in keys]
    if value_type == pa.string():
        values = [v.hex()[: len(v)] for v in values]
    batch = pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values, value_type)],
                                       ["key", "value"]).slice(3)  # Arrow offsets not at 0
    assert packable(batch, 0, 1)
    packed = pack_rows(batch, 0, 1, 271, 10**9)
    assert packed is not None and packed.rows == len(keys) - 3
    got = {pid: (count, bytes(table), bytes(data))
           for pid, (count, table, data) in packed.pieces.items()}
    assert got == expected_pieces(keys[3:], values[3:], 271)
    assert packed.size == sum(len(table) + len(data) for _, table, data in got.values())


def test_murmur3_of_padded_rows_is_mmh3() -> None:
    rng = random.Random(7)
    keys = [rng.randbytes(rng.randrange(41)) for _ in range(3000)]
    lengths = np.array([len(k) for k in keys], np.int64)
    assert murmur3_32(padded(keys, 44).view("<u4"), lengths).tolist() == \
        [mmh3.hash(k, 0, True) for k in keys]


def test_what_the_packed_path_leaves_to_the_row_path_or_refuses() -> None:
    def batch(keys, values, value_type=None, key_type=None):
        return pa.RecordBatch.from_arrays([pa.array(keys, key_type or pa.string()),
                                           pa.array(values, value_type or pa.binary())],
                                          ["key", "value"])

    assert not packable(batch(["a", None], [b"x", b"y"]), 0, 1)  # a null key: its error
    assert not packable(batch(["a", "b"], [b"x", None]), 0, 1)  # a null value: None stored
    assert not packable(batch([1, 2], [b"x", b"y"], key_type=pa.int64()), 0, 1)
    assert not packable(batch(["a"], [1], value_type=pa.int64()), 0, 1)
    assert not packable(batch(["a"], [b"x"], key_type=pa.large_string()), 0, 1)
    assert not packable(batch(["a"], [b"x"]), 0, None)  # row dicts
    long_key = batch(["k" * KEY_BYTES_MAX, "short"], [b"x", b"y"])
    assert pack_rows(long_key, 0, 1, 271, 10**9) is None
    # The serialized key (1 + 1) and value (2 + 100) bytes, as put_all_into counts them.
    with pytest.raises(ValueTooLargeError):
        pack_rows(batch(["a", "k"], [b"x", b"v" * 100]), 0, 1, 271, 103)
    assert pack_rows(batch(["a", "k"], [b"x", b"v" * 100]), 0, 1, 271, 104) is not None


def test_the_writer_keeps_the_rows_order_across_both_paths(monkeypatch) -> None:
    """Batches that are packed and batches that are not, with keys repeated across them:
    the last row of a key wins, as one put_all of all the rows in order would have it."""
    fake = FakeGrid()
    grid_map = fake.client().get_map("m")
    packed_calls, row_calls = [], []
    packed, by_rows = grid_map.put_all_packed, grid_map.put_all_into
    monkeypatch.setattr(grid_map, "put_all_packed",
                        lambda *args: packed_calls.append(1) or packed(*args))
    monkeypatch.setattr(grid_map, "put_all_into",
                        lambda *args: row_calls.append(1) or by_rows(*args))
    rng = random.Random(3)
    expected: dict[str, bytes | None] = {}
    touched: set[int] = set()
    rows = _PendingRows(grid_map, touched, batch_size=700, partition_count=271,
                        max_entry_bytes=10**9)
    for step in range(12):
        keys = [f"k{rng.randrange(300)}" for _ in range(200)]
        values = [None if step % 3 == 2 and i == 0 else rng.randbytes(8) for i in range(200)]
        rows.add(pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values, pa.binary())],
                                            ["key", "value"]), 0, 1, ())
        expected.update(zip(keys, values, strict=True))
    rows.flush()
    assert rows.written == 12 * 200
    assert grid_map.items() == expected
    assert touched == {partition_id_of(msgpack.packb(k), 271) for k in expected}
    assert packed_calls and row_calls  # both paths ran


def test_a_spark_like_write_goes_through_the_packed_path(fake_grid, monkeypatch) -> None:
    """A key and value frame of string and binary reaches the grid as packed items."""
    sent = []
    monkeypatch.setattr(source, "pack_rows",
                        lambda *args: sent.append(args[0].num_rows) or pack_rows(*args))
    rows = _PendingRows(fake_grid.client().get_map("m"), None, 50_000, 271, 10**9)
    batch = pa.RecordBatch.from_arrays([pa.array(["a", "b"]), pa.array([b"1", b"2"])],
                                       ["key", "value"])
    rows.add(batch, 0, 1, ())
    rows.flush()
    assert sent == [2] and fake_grid.client().get_map("m").items() == {"a": b"1", "b": b"2"}


def test_packed_records_are_held_by_owners_and_backups(cluster_factory) -> None:
    """A packed write to a real cluster: the owners take the records frames, and hand their
    backups records cut from them; a partition holding a key already takes its records one
    at a time. Every entry is read back, and still after two of the three members die
    (backup 2: the survivor was owner or backup of every partition)."""
    cluster = cluster_factory(members=3, backup_count=2)
    rng = random.Random(11)
    keys = [f"r{i}" for i in range(3000)]
    values = [rng.randbytes(rng.randrange(300)) for _ in keys]
    batch = pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values, pa.binary())],
                                       ["key", "value"])
    expected = dict(zip(keys, values, strict=True))
    with cluster.connect() as client:
        m = client.get_map("packed")
        m.put("r0", b"old")
        packed = pack_rows(batch, 0, 1, m._partition_count, 10**9)
        m.put_all_packed({pid: (count, [table], [data])
                          for pid, (count, table, data) in packed.pieces.items()}, None)
        assert m.get_all(keys) == expected
        assert m.size() == len(keys)
    for name in ("member-0", "member-2"):
        os.kill(cluster.member(name)["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while len(json.loads(cluster.cli("status", "--json").stdout)["members"]) != 1:
        assert time.monotonic() < deadline, "the two dead members were removed"
        time.sleep(0.1)
    with cluster.connect() as client:
        assert client.get_map("packed").get_all(keys) == expected


def test_a_member_refuses_packed_records_larger_than_its_limit(cluster_factory, tmp_path
                                                               ) -> None:
    """The owner checks a records frame's entries against max_value_bytes before it writes
    any (the writer checks them too, with the limit it was given)."""
    config = tmp_path / "shmgrid.toml"
    config.write_text("max_value_bytes = 200\n")
    cluster = cluster_factory(members=1, backup_count=0, config=str(config))
    batch = pa.RecordBatch.from_arrays([pa.array(["small", "big"]),
                                        pa.array([b"v", b"x" * 300], pa.binary())],
                                       ["key", "value"])
    with cluster.connect() as client:
        m = client.get_map("packed")
        packed = pack_rows(batch, 0, 1, m._partition_count, 10**9)
        with pytest.raises(ValueTooLargeError):
            m.put_all_packed({pid: (count, [table], [data])
                              for pid, (count, table, data) in packed.pieces.items()}, None)
        assert m.size() == 0
