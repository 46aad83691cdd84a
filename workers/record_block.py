"""Batches of records sent as the record store lays them out: parsed, checked and hashed in
bulk, with no Python object per record.

A put_all from the Spark writer (grid/spark/packed_write.py), and the backup operations its
owner makes of it, say ``laid_out`` and come as one frame: a table of every record's key and
value sizes (two little-endian u32 a record), then the records, each
``[u32 key size][u32 value size] key value`` as ``RecordStore`` keeps them in its arenas,
grouped by partition in the order of the request's ``pids``. The table finds every record at
once (a cumulative sum), where the records alone would have to be walked one by one; each
record's own header must say what the table says. The keys are hashed in numpy (the store's
``key_hash``: MurmurHash3 x64 128, its low 64 bits). An append of new keys then copies a
partition's records into its arena in one piece and indexes them in one dict update
(``RecordStore.put_groups``); the owner hands each backup the same layout, cut from the frame
it got (``records_frame``). Decoding the same rows as msgpack items made two bytes objects a
row and cost the member about 1 µs a row on the owner and again on the backup.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from grid.errors import ProtocolError
from grid.local_reads import RECORD_HEADER, key_hash
from workers.shm import Segment

__all__ = ["RecordBlock", "iterate_records", "murmur3_x64_64", "parse_records", "records_frame"]

HEADER_BYTES = RECORD_HEADER.size  # 8: the key's and the value's size
# Keys longer than this are hashed one by one: the padded matrix would be large.
KEY_MATRIX_MAX = 512
_U64 = np.uint64
_C1, _C2 = _U64(0x87C37B91114253D5), _U64(0x4CF5AD432745937F)
_EIGHT = np.arange(HEADER_BYTES)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U64(r)) | (x >> _U64(64 - r))


def _fmix(k: np.ndarray) -> np.ndarray:
    k ^= k >> _U64(33)
    k *= _U64(0xFF51AFD7ED558CCD)
    k ^= k >> _U64(33)
    k *= _U64(0xC4CEB9FE1A85EC53)
    k ^= k >> _U64(33)
    return k


def murmur3_x64_64(words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """MurmurHash3 x64 128 (seed 0) of each row of ``words``, its low 64 bits (as
    ``mmh3.hash128(key) & (2**64 - 1)``): the keys zero-padded to whole 16-byte blocks, read
    as little-endian u64 (two a block), one key a row; ``lengths`` their sizes in bytes."""
    n, width = words.shape
    h1, h2 = np.zeros(n, _U64), np.zeros(n, _U64)
    full_blocks = lengths >> 4
    with np.errstate(over="ignore"):
        for b in range(width // 2):
            full = full_blocks > b
            if not full.any():
                break
            k1 = words[:, 2 * b] * _C1
            k1 = _rotl(k1, 31) * _C2
            m1 = _rotl(h1 ^ k1, 27) + h2
            m1 = m1 * _U64(5) + _U64(0x52DCE729)
            k2 = words[:, 2 * b + 1] * _C2
            k2 = _rotl(k2, 33) * _C1
            m2 = _rotl(h2 ^ k2, 31) + m1
            m2 = m2 * _U64(5) + _U64(0x38495AB5)
            h1, h2 = np.where(full, m1, h1), np.where(full, m2, h2)
        tail = lengths & 15
        if tail.any():
            # The bytes past a key's end are zero, so its last block is its tail.
            column = np.minimum(full_blocks, width // 2 - 1) * 2
            rows = np.arange(n)
            k2 = _rotl(words[rows, column + 1] * _C2, 33) * _C1
            h2 = np.where(tail > 8, h2 ^ k2, h2)
            k1 = _rotl(words[rows, column] * _C1, 31) * _C2
            h1 = np.where(tail > 0, h1 ^ k1, h1)
        sizes = lengths.astype(_U64)
        h1 ^= sizes
        h2 ^= sizes
        h1 += h2
        h2 += h1
        h1 = _fmix(h1)
        h2 = _fmix(h2)
        h1 += h2
    return h1


class _Frame:
    """What every block of one parsed frame shares: the frame, the sizes table and each
    record's start (a record ends where the next starts, the last where the frame does) as
    arrays, and the key hashes as a list (the store's index takes them as they are). A
    block's starts become ints only where its records land (``starts_at``): lists of every
    start and every end, made when parsing, were half of its time."""

    __slots__ = ("view", "sizes", "starts", "hashes", "largest")

    def __init__(self, view: memoryview, sizes: np.ndarray, starts: np.ndarray,
                 hashes: list[int], largest: int) -> None:
        self.view, self.sizes, self.starts = view, sizes, starts
        self.hashes, self.largest = hashes, largest

    def end(self, row: int) -> int:
        """Where record ``row - 1`` ends (``row`` starts)."""
        return int(self.starts[row]) if row < len(self.starts) else len(self.view)


class RecordBlock:
    """Records ``lo`` to ``hi`` of a parsed frame. As a put_all's items are, it is
    ``2 * rows`` long and sliced in items (a key and a value each), so that a batch's
    partitions are cut from it as from a list of items; ``items()`` makes that list."""

    __slots__ = ("frame", "lo", "hi")

    def __init__(self, frame: _Frame, lo: int, hi: int) -> None:
        self.frame, self.lo, self.hi = frame, lo, hi

    @property
    def rows(self) -> int:
        return self.hi - self.lo

    def __len__(self) -> int:
        return 2 * (self.hi - self.lo)

    def __getitem__(self, items: slice) -> RecordBlock | list[bytes]:
        """Whole records (a slice of step 1 from a key to a key): a block of them; any other
        slice: the items it selects, as a list would give them (``[::2]``: the keys)."""
        start, stop, step = items.indices(len(self))
        if step != 1 or start & 1 or stop & 1:
            return self.items()[items]
        return RecordBlock(self.frame, self.lo + start // 2, self.lo + max(start, stop) // 2)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.items())

    def record_bytes(self) -> int:
        """The bytes of these records, headers included."""
        hi, lo = self.hi, self.lo
        return self.frame.end(hi) - int(self.frame.starts[lo]) if hi > lo else 0

    def largest(self) -> int:
        """The largest key and value size together (0 for no record)."""
        if self.hi == self.lo:
            return 0
        return int(self.frame.sizes[self.lo:self.hi].sum(axis=1).max())

    def block(self) -> memoryview:
        """These records, laid end to end as the store lays them."""
        if self.hi == self.lo:
            return self.frame.view[0:0]
        return self.frame.view[int(self.frame.starts[self.lo]):self.frame.end(self.hi)]

    def table(self) -> memoryview:
        """Their part of the frame's table of sizes."""
        return self.frame.view[HEADER_BYTES * self.lo:HEADER_BYTES * self.hi]

    def starts_at(self, top: int) -> list[int]:
        """Where each record starts once ``block()`` is copied to offset ``top``."""
        if self.hi == self.lo:
            return []
        starts = self.frame.starts[self.lo:self.hi]
        return (starts + (top - int(starts[0]))).tolist()

    def hash_list(self) -> list[int]:
        return self.frame.hashes[self.lo:self.hi]

    def items(self) -> list[bytes]:
        """Key, value, key, value...: the records as a put_all's items (a bytes object each,
        for the paths that take a record at a time)."""
        view, items = self.frame.view, []
        for start, (key_size, value_size) in zip(self.frame.starts[self.lo:self.hi].tolist(),
                                                 self.frame.sizes[self.lo:self.hi].tolist(),
                                                 strict=True):
            middle = start + HEADER_BYTES + key_size
            items.append(bytes(view[start + HEADER_BYTES:middle]))
            items.append(bytes(view[middle:middle + value_size]))
        return items


def iterate_records(segment: Segment, offsets: list[int]) -> Iterator:
    """Yield (key, value) copies of the records at ``offsets`` in a segment; the first
    ``next`` only pins the segment, and the iterator unpins it when it ends or is dropped.
    (The record store's snapshot iterator. It lives here, run from source: a generator
    compiled with the store (grid/compiled.py) would not run its ``finally`` when dropped
    before its end, and the segment would stay pinned.)"""
    segment.pin()
    try:
        yield None
        mm = segment.mm
        unpack = RECORD_HEADER.unpack_from
        for offset in offsets:
            key_size, value_size = unpack(mm, offset)
            start = offset + HEADER_BYTES
            middle = start + key_size
            yield mm[start:middle], mm[middle : middle + value_size]
    finally:
        segment.unpin()


def parse_records(frame: bytes, rows: int) -> RecordBlock:
    """The ``rows`` records of a frame laid out as this module says, checked (the table and
    each record's header agree, and the records fill the frame exactly) and hashed;
    ProtocolError for anything else."""
    table_bytes = HEADER_BYTES * rows
    if rows < 0 or len(frame) < table_bytes:
        raise ProtocolError("a records frame is shorter than its table of sizes")
    data = np.frombuffer(frame, np.uint8)
    sizes = data[:table_bytes].view("<u4").reshape(rows, 2).astype(np.int64)
    lengths = sizes.sum(axis=1) + HEADER_BYTES
    ends = np.cumsum(lengths) + table_bytes
    if (int(ends[-1]) if rows else table_bytes) != len(frame):
        raise ProtocolError("a records frame's sizes do not add up to its records")
    starts = ends - lengths
    # Each little-endian u64 of the frame (8 zero bytes after it: the last record's key may
    # end less than 8 bytes before the frame does), read at any byte.
    padded = bytes(frame) + bytes(HEADER_BYTES)
    at = np.ndarray((len(padded) - 7,), "<u8", padded, 0, (1,))
    if not np.array_equal(at[starts], data[:table_bytes].view("<u8")):
        raise ProtocolError("a record's header differs from the frame's table of sizes")
    key_sizes = sizes[:, 0]
    largest = int(lengths.max()) - HEADER_BYTES if rows else 0
    return RecordBlock(_Frame(memoryview(frame), sizes, starts,
                              _key_hashes(at, starts + HEADER_BYTES, key_sizes).tolist(),
                              largest), 0, rows)


# Masks of a u64's first 0..8 bytes.
_BYTE_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(9)], _U64)


def _key_hashes(at: np.ndarray, key_starts: np.ndarray, key_sizes: np.ndarray) -> np.ndarray:
    """The store's ``key_hash`` of each key, in numpy: its 8-byte words read where it starts
    (``at``: the frame's u64 at every byte), the bytes past its end masked off. A key
    longer than ``KEY_MATRIX_MAX`` is hashed alone."""
    rows = len(key_sizes)
    longest = int(key_sizes.max()) if rows else 0
    if longest > KEY_MATRIX_MAX:
        frame = at.base if isinstance(at.base, bytes) else bytes(at.base)
        return np.array([key_hash(frame[start:start + size]) for start, size
                         in zip(key_starts.tolist(), key_sizes.tolist(), strict=True)], _U64)
    words = max(2, ((longest + 15) >> 4) * 2)  # whole 16-byte blocks
    last = len(at) - 1
    matrix = np.empty((rows, words), _U64)
    for w in range(words):
        left = np.clip(key_sizes - 8 * w, 0, 8)
        matrix[:, w] = at[np.minimum(key_starts + 8 * w, last)] & _BYTE_MASKS[left]
    return murmur3_x64_64(matrix, key_sizes)


def records_frame(blocks: Sequence[RecordBlock]) -> bytes:
    """One frame of these blocks' records, in order: their tables, then their records."""
    return b"".join([*(block.table() for block in blocks),
                     *(block.block() for block in blocks)])
