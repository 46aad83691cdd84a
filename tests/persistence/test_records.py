"""Framing: prefixes, record heads, block heads and segment heads, and resynchronising."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persistence import make_prefix, split_prefix
from persistence.records import (
    KIND_CLEAR,
    KIND_PUT,
    KIND_TOMBSTONE,
    key_value_crc,
    pack_block_head,
    pack_record_head,
    pack_segment_head,
    parse_block_head,
    parse_segment_head,
    record_end,
    record_head_bytes,
    resync,
)


def record(seq: int, kind: int, prefix: int, key: bytes, value: bytes) -> bytes:
    head = pack_record_head(seq, kind, prefix, len(key), len(value), key_value_crc(key, value))
    return head + key + value


@settings(database=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_prefix_round_trips(namespace_id: int, partition_id: int) -> None:
    prefix = make_prefix(namespace_id, partition_id)
    assert 0 <= prefix < 2**64
    assert split_prefix(prefix) == (namespace_id, partition_id)


@pytest.mark.parametrize("namespace_id, partition_id", [(-1, 0), (0, -1), (2**32, 0), (0, 2**32)])
def test_prefix_refuses_out_of_range_ids(namespace_id: int, partition_id: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        make_prefix(namespace_id, partition_id)


def test_split_prefix_refuses_out_of_range() -> None:
    with pytest.raises(ValueError):
        split_prefix(2**64)


@settings(database=None)
@given(st.integers(1, 2**63 - 1), st.sampled_from([KIND_PUT, KIND_TOMBSTONE]),
       st.integers(0, 2**64 - 1), st.binary(max_size=40), st.binary(max_size=200))
def test_record_reads_back_and_every_flipped_byte_is_caught(
        seq: int, kind: int, prefix: int, key: bytes, value: bytes) -> None:
    if kind == KIND_TOMBSTONE:
        value = b""
    data = record(seq, kind, prefix, key, value)
    assert len(data) == record_head_bytes + len(key) + len(value)
    assert record_end(data, memoryview(data), 0, len(data)) == len(data)
    for index in range(len(data)):
        damaged = bytearray(data)
        damaged[index] ^= 0x40
        damaged_bytes = bytes(damaged)
        assert record_end(damaged_bytes, memoryview(damaged_bytes), 0, len(data)) == -1
    for cut in range(len(data)):
        assert record_end(data, memoryview(data), 0, cut) == -1


def test_clear_records_carry_no_key_or_value() -> None:
    data = record(5, KIND_CLEAR, 9, b"", b"")
    assert record_end(data, memoryview(data), 0, len(data)) == len(data)
    odd = record(5, KIND_CLEAR, 9, b"k", b"")
    assert record_end(odd, memoryview(odd), 0, len(odd)) == -1


def test_block_head_round_trips_and_detects_damage() -> None:
    head = pack_block_head(3, 500, 77, 0xDEADBEEF)
    assert parse_block_head(head, 0, len(head)) == (3, 500, 77, 0xDEADBEEF)
    for index in range(len(head)):
        damaged = bytearray(head)
        damaged[index] ^= 1
        assert parse_block_head(bytes(damaged), 0, len(head)) is None
    assert parse_block_head(head, 0, len(head) - 1) is None


def test_segment_head_round_trips_and_detects_damage() -> None:
    head = pack_segment_head(12, 15)
    assert parse_segment_head(head, len(head)) == (12, 15)
    assert parse_segment_head(pack_segment_head(4), 32) == (4, 4)
    for index in range(len(head)):
        damaged = bytearray(head)
        damaged[index] ^= 1
        assert parse_segment_head(bytes(damaged), len(head)) is None


def test_resync_skips_garbage_to_the_next_record() -> None:
    first = record(1, KIND_PUT, 1, b"a", b"xx")
    second = record(2, KIND_PUT, 1, b"b", b"SR" * 20)  # values may contain the magic
    garbage = b"SR\x00\x01SBLK" * 5
    data = garbage + first + second
    view = memoryview(data)
    assert resync(data, view, 0, len(data)) == len(garbage)
    assert resync(data, view, len(garbage) + 1, len(data)) == len(garbage) + len(first)
    assert resync(data, view, len(garbage) + len(first) + 1, len(data)) == -1
