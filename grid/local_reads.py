"""The shared-memory layout that lets a client on the member's host read without a message.

A member that publishes a map (namespace) keeps, beside each fragment's arena of records
(workers/record_store.py), an open-addressing copy of the fragment's index in a segment of its
own, and a directory that says where they are. A client maps these segments read-only and
answers a get with a hash, a probe and a copy (grid/client/local_reads.py). The member writes
them (workers/local_reads.py); this module is the format both sides agree on, and the probe.

Segments (``{prefix}`` is the member's ``shmgrid-{cluster}-{member}``):

- ``{prefix}-local``, the directory, one per member::

      0   magic           8s   DIRECTORY_MAGIC
      8   valid_until     f64  CLOCK_MONOTONIC seconds; no local read at or after it
      16  fenced          u64  nonzero: the member is gone or closing (the supervisor sets it
                               on a death before it tells anyone else)
      24  partition_count u32, namespace_capacity u32
      32  member uuid     48s  utf-8, zero padded
      80  namespace_count u64  published namespaces (append only: k never changes)
      88  served          partition_count bytes: 1 where this member owns the partition in its
                          own table and serves reads of it
      then namespace_capacity names of NAME_BYTES each: u32 length, then utf-8

- ``{prefix}-local-{k}``, the slots of published namespace k: partition_count slots of
  ``SLOT`` = (seq, settled, arena + 1, index + 1), u64 each. ``seq`` is a seqlock: odd while
  the member changes the fragment (records, index, or which segments hold them). ``settled`` is
  1 when no write to the (partition, namespace) waits for its backups (the member's reply order
  is empty there) and the shared index holds every record (a bulk load's are added once it is
  over), so what is read is what a get through the owner would answer now.
  ``arena`` and ``index`` are segment numbers n of ``{prefix}-{n}``; 0 means no fragment
  (every key absent).

- ``{prefix}-{index}``: u64 capacity (a power of two), u64 count, then capacity entries of
  (key hash, record offset + 1), u64 each; offset + 1 == 0 is an empty entry. Linear probing
  from ``hash & (capacity - 1)``; two keys with one hash take two entries.

- ``{prefix}-{arena}``: records ``[u32 key_len][u32 value_len][key][value]`` at their offsets.

A reader takes ``seq`` (even), reads what it needs, and takes ``seq`` again: equal means no
write touched the fragment meanwhile, so the bytes it copied are one state the member was in.
This relies on stores and loads not being reordered across CPython's C calls, which x86-64
(TSO) guarantees; on weaker memory models the seqlock would need fences.
"""

from __future__ import annotations

import _posixshmem
import mmap
import os
import struct
from array import array
from collections.abc import Iterable
from itertools import repeat
from operator import and_

import mmh3

__all__ = ["DIRECTORY_MAGIC", "HEADER", "INDEX_ENTRY", "INDEX_HEADER", "NAME_BYTES", "RETRY",
           "SLOT", "directory_bytes", "directory_name", "fragment_copy", "key_hash", "key_hashes",
           "map_segment", "names_offset", "namespace_name", "probe", "records", "segment_name",
           "segment_prefix", "served_offset"]

DIRECTORY_MAGIC = b"SHMGLR1\0"
HEADER = struct.Struct("<8sdQII48sQ")  # magic, valid_until, fenced, pc, capacity, uuid, count
VALID_UNTIL = struct.Struct("<d")
FENCED_OFFSET = 16
VALID_UNTIL_OFFSET = 8
NAMESPACE_COUNT_OFFSET = 80
NAME_BYTES = 128  # u32 length + up to 124 bytes of utf-8
NAME_LENGTH = struct.Struct("<I")
SLOT = struct.Struct("<QQQQ")  # seq, settled, arena + 1, index + 1
SEQ = struct.Struct("<Q")
INDEX_HEADER = struct.Struct("<QQ")  # capacity, count
INDEX_ENTRY = struct.Struct("<QQ")  # key hash, offset + 1
RECORD_HEADER = struct.Struct("<II")  # a record's key and value lengths (the arena's format)
STATE = struct.Struct("<dQ")  # valid_until, fenced: one read
RETRY = object()  # the probe met bytes that a concurrent write is changing: read again
TOO_LARGE = object()  # a fragment larger than the caller would copy: ask its owner instead
_HASH_MASK = (1 << 64) - 1
_FIRST_ENTRY = INDEX_HEADER.size
_KEY_AFTER_OFFSET_1 = RECORD_HEADER.size - 1  # a record's key starts at (offset + 1) + this

assert HEADER.size == 88


def key_hash(key: bytes) -> int:
    """The index hash of a key: MurmurHash3 x64 128 truncated to 64 bits (deterministic)."""
    return mmh3.hash128(key) & _HASH_MASK


def key_hashes(keys: Iterable[bytes]) -> list[int]:
    """``key_hash`` of each key, without a Python call per key (a batch of writes)."""
    return list(map(and_, map(mmh3.hash128, keys), repeat(_HASH_MASK)))


def map_segment(name: str, writable: bool = False) -> mmap.mmap:
    """Map a segment another process created, whole (read-only unless ``writable``);
    FileNotFoundError when it is gone. The mapping outlives an unlink, until it is closed."""
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR if writable else os.O_RDONLY, mode=0)
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED, prot=prot)
    finally:
        os.close(fd)


def segment_prefix(cluster_name: str, member_name: str) -> str:
    """What every shared-memory segment of a member is named after (workers/shm.py)."""
    return f"shmgrid-{cluster_name}-{member_name}"


def directory_name(prefix: str) -> str:
    return f"{prefix}-local"


def namespace_name(prefix: str, k: int) -> str:
    return f"{prefix}-local-{k}"


def segment_name(prefix: str, number: int) -> str:
    return f"{prefix}-{number}"


def served_offset(pid: int) -> int:
    return HEADER.size + pid


def names_offset(partition_count: int) -> int:
    return HEADER.size + (partition_count + 7) // 8 * 8


def directory_bytes(partition_count: int, namespace_capacity: int) -> int:
    return names_offset(partition_count) + namespace_capacity * NAME_BYTES


def records(index: object, arena: object, max_bytes: int | None = None
            ) -> tuple[bytes, int] | object:
    """Every record of a fragment, keys and values laid end to end in offset order, and how
    many; or RETRY when what was read cannot be a state of the fragment; or TOO_LARGE once
    the keys and values copied pass ``max_bytes`` (so a scan never holds more than that of
    a fragment that its owner would send in chunks)."""
    capacity = INDEX_HEADER.unpack_from(index, 0)[0]  # type: ignore[arg-type]
    if capacity == 0 or capacity & (capacity - 1):
        return RETRY
    table = array("Q")
    table.frombytes(index[INDEX_HEADER.size:INDEX_HEADER.size + 16 * capacity])  # type: ignore[index]
    offsets = sorted(offset_1 - 1 for offset_1 in table[1::2] if offset_1)
    unpack = RECORD_HEADER.unpack_from
    if max_bytes is not None and offsets:
        key_size, value_size = unpack(arena, offsets[-1])  # type: ignore[arg-type]
        span = offsets[-1] + RECORD_HEADER.size + key_size + value_size - offsets[0]
        if span > max_bytes:  # (else the records fit for sure: no count on the hot path)
            left = max_bytes
            for offset in offsets:
                key_size, value_size = unpack(arena, offset)  # type: ignore[arg-type]
                left -= key_size + value_size
                if left < 0:
                    return TOO_LARGE
    parts = []
    append = parts.append
    for offset in offsets:
        key_size, value_size = unpack(arena, offset)  # type: ignore[arg-type]
        start = offset + RECORD_HEADER.size
        part = arena[start:start + key_size + value_size]  # type: ignore[index]
        if len(part) != key_size + value_size:
            return RETRY
        append(part)
    return b"".join(parts), len(parts)


def fragment_copy(index: object, arena: object, max_bytes: int | None = None
                  ) -> tuple[bytes, bytes] | object:
    """A fragment's index table and its arena up to the end of its last indexed record,
    copied as they are: two copies and no Python per record, for a reader that decodes the
    records in bulk; ``records`` of the pair gives what ``records`` of the fragment gives.
    RETRY as ``records``; TOO_LARGE when that part of the arena is larger than ``max_bytes``.
    It holds the live records, and the garbage among them until the arena is compacted (once
    garbage is half of the memory it holds)."""
    import numpy as np  # (only a bulk reader, Spark's, copies fragments: it has numpy loaded)

    capacity = INDEX_HEADER.unpack_from(index, 0)[0]  # type: ignore[arg-type]
    if capacity == 0 or capacity & (capacity - 1):
        return RETRY
    size = INDEX_HEADER.size + 16 * capacity
    table = index[:size]  # type: ignore[index]
    if len(table) != size:
        return RETRY
    # The arena is large and mostly unwritten (workers/record_store.py): copy what the
    # records fill, to the end of the one at the highest offset.
    last_1 = int(np.frombuffer(table, "<u8", offset=INDEX_HEADER.size)[1::2].max())
    end = 0
    if last_1:
        if last_1 - 1 + RECORD_HEADER.size > len(arena):  # type: ignore[arg-type]
            return RETRY
        key_size, value_size = RECORD_HEADER.unpack_from(arena, last_1 - 1)  # type: ignore[arg-type]
        end = last_1 - 1 + RECORD_HEADER.size + key_size + value_size
        if end > len(arena):  # type: ignore[arg-type]
            return RETRY
    if max_bytes is not None and end > max_bytes:
        return TOO_LARGE
    return table, arena[:end]  # type: ignore[index]


def probe(index: object, arena: object, h: int, key: bytes,
          _entry=INDEX_ENTRY.unpack_from, _capacity=INDEX_HEADER.unpack_from,
          _record=RECORD_HEADER.unpack_from) -> bytes | None | object:
    """The value of ``key`` (hash ``h``) in a fragment's shared index and arena, None when
    absent, or RETRY when what was read cannot be a state of the fragment (a write was under
    way): the caller's seqlock check decides either way. (Every local get runs this: its
    unpackers are bound as defaults.)"""
    capacity = _capacity(index, 0)[0]
    if capacity == 0 or capacity & (capacity - 1):
        return RETRY
    mask = capacity - 1
    i = h & mask
    for _ in range(capacity):
        entry_hash, offset_1 = _entry(index, _FIRST_ENTRY + 16 * i)
        if offset_1 == 0:
            return None
        if entry_hash == h:
            key_size, value_size = _record(arena, offset_1 - 1)
            start = offset_1 + _KEY_AFTER_OFFSET_1
            middle = start + key_size
            if key_size == len(key) and arena[start:middle] == key:  # type: ignore[index]
                value = arena[middle:middle + value_size]  # type: ignore[index]
                return value if len(value) == value_size else RETRY
        i = (i + 1) & mask
    return RETRY  # a full table is never written: a torn read
