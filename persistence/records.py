"""On-disk framing: a segment header, then blocks, each holding whole records.

Segment file::

    segment head (32 B): magic "SHMGLOG1", format version, CRC of the head, segment id,
                         and the last segment id this file replaces (a compaction merge)
    block*:
        block head (32 B): magic "SBLK", CRC of the rest of the head, record count,
                           payload bytes, last sequence in the block, CRC of the payload
        record*:
            record head (32 B): CRC, magic "SR", kind, flags, sequence, key bytes,
                                value bytes, prefix
            key, value

A block is one writer batch for one segment. Recovery checks one CRC per block (in a helper
thread, where zlib releases the GIL) and then walks its records without checking each one;
when a block's CRC fails it falls back to each record's own CRC, so a torn or damaged block
still yields every intact record. The record CRC covers key and value first and then bytes
4..32 of the head, so the expensive part can be computed before the sequence is known.
"""

from __future__ import annotations

import struct
import zlib

KIND_PUT = 1
KIND_TOMBSTONE = 2
KIND_CLEAR = 3
KINDS = (KIND_PUT, KIND_TOMBSTONE, KIND_CLEAR)

SEGMENT_MAGIC = b"SHMGLOG1"
SEGMENT_FORMAT_VERSION = 1
# magic, version, flags, crc, segment id, last segment id this file replaces
SEGMENT_HEAD = struct.Struct("<8sHHIQQ")
segment_head_bytes = SEGMENT_HEAD.size

BLOCK_MAGIC_BYTES = b"SBLK"
BLOCK_MAGIC = int.from_bytes(BLOCK_MAGIC_BYTES, "little")
# magic, head crc, record count, payload bytes, last seq, payload crc, reserved
BLOCK_HEAD = struct.Struct("<IIIIQII")
BLOCK_HEAD_CHECKED = struct.Struct("<IIQII")  # the part the head crc covers: bytes 8..32
block_head_bytes = BLOCK_HEAD.size

RECORD_MAGIC_BYTES = b"SR"
RECORD_MAGIC = int.from_bytes(RECORD_MAGIC_BYTES, "little")
# crc, magic, kind, flags, seq, key bytes, value bytes, prefix
RECORD_HEAD = struct.Struct("<IHBBQIIQ")
RECORD_HEAD_CHECKED = struct.Struct("<HBBQIIQ")  # bytes 4..32, covered by the crc
# What the recovery loops need from a trusted record, with as few objects as possible.
RECORD_KIND_LENGTHS_PREFIX = struct.Struct("<6xB9xIIQ")
RECORD_KIND_SEQ_LENGTHS_PREFIX = struct.Struct("<6xBxQIIQ")
record_head_bytes = RECORD_HEAD.size

key_bytes_max = 1 << 20
value_bytes_max = 64 << 20
record_bytes_max = record_head_bytes + key_bytes_max + value_bytes_max
# The writer closes a block once its payload reaches this; a bigger record gets a block alone.
block_payload_bytes_target = 4 << 20
block_payload_bytes_max = max(block_payload_bytes_target, record_bytes_max)
seq_max = (1 << 63) - 1

assert segment_head_bytes == 32
assert block_head_bytes == 32
assert record_head_bytes == 32
assert RECORD_HEAD_CHECKED.size == record_head_bytes - 4
assert BLOCK_HEAD_CHECKED.size == block_head_bytes - 8
assert block_payload_bytes_max < 1 << 32
assert BLOCK_MAGIC_BYTES[:2] != RECORD_MAGIC_BYTES


def pack_segment_head(segment_id: int, replaces_through_id: int | None = None) -> bytes:
    """The 32 bytes every segment file starts with.

    A compaction that merges segments N..M writes them as N with replaces_through_id M, so
    that files N+1..M left behind by a crash before their removal are recognised as copies.
    """
    through_id = segment_id if replaces_through_id is None else replaces_through_id
    assert through_id >= segment_id
    head = SEGMENT_HEAD.pack(SEGMENT_MAGIC, SEGMENT_FORMAT_VERSION, 0, 0, segment_id, through_id)
    crc = zlib.crc32(head[16:], zlib.crc32(head[:12]))
    head = SEGMENT_HEAD.pack(SEGMENT_MAGIC, SEGMENT_FORMAT_VERSION, 0, crc, segment_id,
                             through_id)
    assert len(head) == segment_head_bytes
    return head


def parse_segment_head(buf: bytes, end: int) -> tuple[int, int] | None:
    """(segment id, last segment id it replaces) of an intact segment head, else None."""
    if end < segment_head_bytes:
        return None
    magic, version, flags, crc, segment_id, through_id = SEGMENT_HEAD.unpack_from(buf, 0)
    if magic != SEGMENT_MAGIC or version != SEGMENT_FORMAT_VERSION or flags != 0:
        return None
    if zlib.crc32(buf[16:segment_head_bytes], zlib.crc32(buf[:12])) != crc:
        return None
    if through_id < segment_id:
        return None
    return segment_id, through_id


def segment_head_valid(buf: bytes, end: int) -> bool:
    """Whether buf starts with an intact segment head of a version we can read."""
    return parse_segment_head(buf, end) is not None


def key_value_crc(key: bytes, value: bytes) -> int:
    """The first part of a record's CRC; costly for big values, so callers run it unlocked."""
    return zlib.crc32(value, zlib.crc32(key))


def pack_record_head(seq: int, kind: int, prefix: int, key_bytes: int, value_bytes: int,
                     kv_crc: int) -> bytes:
    """A record head whose CRC covers the key and value (given as kv_crc) and the head."""
    checked = RECORD_HEAD_CHECKED.pack(RECORD_MAGIC, kind, 0, seq, key_bytes, value_bytes,
                                       prefix)
    return zlib.crc32(checked, kv_crc).to_bytes(4, "little") + checked


def pack_block_head(record_count: int, payload_bytes: int, seq_last: int,
                    payload_crc: int) -> bytes:
    """The head of a block of payload_bytes of whole records."""
    assert record_count > 0
    assert record_count * record_head_bytes <= payload_bytes <= block_payload_bytes_max
    checked = BLOCK_HEAD_CHECKED.pack(record_count, payload_bytes, seq_last, payload_crc, 0)
    head = BLOCK_MAGIC_BYTES + zlib.crc32(checked).to_bytes(4, "little") + checked
    assert len(head) == block_head_bytes
    return head


def parse_block_head(buf: bytes, pos: int, end: int) -> tuple[int, int, int, int] | None:
    """(record count, payload bytes, last seq, payload crc) of an intact block head at pos."""
    if pos + block_head_bytes > end:
        return None
    magic, head_crc, count, payload_bytes, seq_last, payload_crc, reserved = \
        BLOCK_HEAD.unpack_from(buf, pos)
    if magic != BLOCK_MAGIC:
        return None
    if zlib.crc32(buf[pos + 8:pos + block_head_bytes]) != head_crc:
        return None
    if reserved != 0 or count == 0:
        return None
    if not count * record_head_bytes <= payload_bytes <= block_payload_bytes_max:
        return None
    return count, payload_bytes, seq_last, payload_crc


def record_end(buf: bytes, view: memoryview, pos: int, end: int) -> int:
    """The end offset of an intact record starting at pos, or -1 if there is none."""
    if pos + record_head_bytes > end:
        return -1
    crc, magic, kind, flags, _seq, key_bytes, value_bytes, _prefix = \
        RECORD_HEAD.unpack_from(buf, pos)
    if magic != RECORD_MAGIC or flags != 0 or kind not in KINDS:
        return -1
    if key_bytes > key_bytes_max or value_bytes > value_bytes_max:
        return -1
    if kind == KIND_TOMBSTONE and value_bytes:
        return -1
    if kind == KIND_CLEAR and (key_bytes or value_bytes):
        return -1
    stop = pos + record_head_bytes + key_bytes + value_bytes
    if stop > end:
        return -1
    kv_crc = zlib.crc32(view[pos + record_head_bytes:stop])
    if zlib.crc32(view[pos + 4:pos + record_head_bytes], kv_crc) != crc:
        return -1
    return stop


def resync(buf: bytes, view: memoryview, pos: int, end: int) -> int:
    """The first offset at or after pos where an intact block head or record starts, or -1.

    Only used after damage. A value that itself contains a framed record could be mistaken
    for one here; intact data never goes through this path.
    """
    block_at = buf.find(BLOCK_MAGIC_BYTES, pos, end)
    record_at = _next_record_candidate(buf, pos, end)
    for _attempt in range(end - pos + 1):
        if block_at < 0 and record_at < 0:
            return -1
        if block_at >= 0 and (record_at < 0 or block_at <= record_at):
            if parse_block_head(buf, block_at, end) is not None:
                return block_at
            block_at = buf.find(BLOCK_MAGIC_BYTES, block_at + 1, end)
        else:
            if record_end(buf, view, record_at, end) > 0:
                return record_at
            record_at = _next_record_candidate(buf, record_at + 1, end)
    raise AssertionError("resync made no progress")


def _next_record_candidate(buf: bytes, pos: int, end: int) -> int:
    """The next pos' >= pos whose bytes 4..6 are the record magic, or -1."""
    found = buf.find(RECORD_MAGIC_BYTES, pos + 4, end)
    return -1 if found < 0 else found - 4
