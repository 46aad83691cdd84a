"""A Spark write's put_all messages built from Arrow batches in bulk, with no Python per row.

The row path (``batch_to_entries`` then ``Map.put_all_into``) makes Python objects of every
key and value, packs each with msgpack, hashes each key and groups the pairs: about 2.5 µs a
row of the Python worker's CPU, on a core the members and the JVM share. Where the key
column is a string and the value column a string or binary without nulls (the usual key and
value table), the same bytes are made column-wise instead:

- each key's msgpack bytes (str header + UTF-8) and each value's (bin or str header +
  bytes), as Arrow arrays joined element-wise;
- each key's partition: MurmurHash3 x86 32 of those bytes in numpy, over a zero-padded
  matrix of the keys (a key with a ``{`` byte is placed by the client's own function, so
  hash tags are placed exactly as everywhere else);
- the rows sorted by partition (one Arrow ``take``), and each partition's rows a slice of
  one buffer: records as the members' store lays them out (``[u32 key size][u32 value
  size] key value``, the key and value bytes those the row path would store), and a slice of
  a table of their sizes (workers/record_block.py: a member finds every record from it at
  once, and indexes and copies a partition's records in one piece, with no Python object
  per row as msgpack items would make).

``Map.put_all_packed`` sends them, one message per owner as ``put_all_into`` does.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from grid.errors import ValueTooLargeError
from grid.serialization import INT32_MIN, partition_id_of

__all__ = ["PackedRows", "pack_rows", "packable", "murmur3_32"]

KEY_BYTES_MAX = 512  # longer keys: the padded matrix would be large; the row path takes them
_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_BRACE = ord("{")


def packable(batch: pa.RecordBatch, key_index: int, value_index: int | None) -> bool:
    """Whether ``pack_rows`` takes this batch: a string key and a string or binary value
    column, neither with nulls (the row path reports null keys, and writes null values)."""
    if value_index is None:
        return False
    key, value = batch.column(key_index), batch.column(value_index)
    return key.type == pa.string() and value.type in (pa.string(), pa.binary()) \
        and key.null_count == 0 and value.null_count == 0


class PackedRows:
    """One batch's rows as records, grouped by partition: ``pieces`` maps a partition id to
    (row count, its part of the table of sizes, its records laid end to end). ``size`` is
    their bytes in all."""

    __slots__ = ("pieces", "size", "rows")

    def __init__(self, pieces: dict[int, tuple[int, memoryview, memoryview]], size: int,
                 rows: int) -> None:
        self.pieces = pieces
        self.size = size
        self.rows = rows


def _headers(lengths: np.ndarray, codes: tuple[int, int, int], fix: int | None
             ) -> pa.BinaryArray:
    """The msgpack header of a str (``fix`` 0xA0, codes str8/16/32) or bin (no fix form,
    codes bin8/16/32) of each length, as an Arrow binary array."""
    n = len(lengths)
    longest = int(lengths.max()) if n else 0
    if fix is not None and longest < 32:  # one header byte each (the usual keys)
        return _binary_array((lengths | fix).astype(np.uint8), np.arange(n + 1, dtype=np.int32))
    if longest < 256 and (fix is None or int(lengths.min()) >= 32):  # two bytes each
        data = np.empty((n, 2), np.uint8)
        data[:, 0], data[:, 1] = codes[0], lengths
        return _binary_array(data, np.arange(0, 2 * n + 1, 2, dtype=np.int32))
    out = np.zeros((n, 5), np.uint8)
    size = np.empty(n, np.int64)
    small = lengths < 256
    mid = (lengths >= 256) & (lengths < 65536)
    big = lengths >= 65536
    out[small, 0], size[small] = codes[0], 2
    out[small, 1] = lengths[small]
    out[mid, 0], size[mid] = codes[1], 3
    out[mid, 1], out[mid, 2] = lengths[mid] >> 8, lengths[mid] & 0xFF
    out[big, 0], size[big] = codes[2], 5
    for i in range(4):
        out[big, 1 + i] = (lengths[big] >> (24 - 8 * i)) & 0xFF
    if fix is not None:
        tiny = lengths < 32
        out[tiny, 0], size[tiny] = fix | lengths[tiny], 1
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(size, out=offsets[1:])
    return _binary_array(out[np.arange(5) < size[:, None]], offsets)


def _binary_array(data: np.ndarray, offsets: np.ndarray) -> pa.BinaryArray:
    """A binary array of the rows that ``offsets`` (int32, n + 1) cut out of ``data``."""
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _str_headers(lengths: np.ndarray) -> pa.BinaryArray:
    return _headers(lengths, (0xD9, 0xDA, 0xDB), 0xA0)


def _bin_headers(lengths: np.ndarray) -> pa.BinaryArray:
    return _headers(lengths, (0xC4, 0xC5, 0xC6), None)


def _offsets_and_data(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The (n + 1) offsets and the data bytes of a string or binary array."""
    _, offsets, data = array.buffers()
    start = array.offset
    offsets_np = np.frombuffer(offsets, np.int32, len(array) + 1, 4 * start)
    data_np = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return offsets_np, data_np


def _lengths(array: pa.Array) -> np.ndarray:
    offsets, _ = _offsets_and_data(array)
    return np.diff(offsets).astype(np.int64)


def murmur3_32(words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """MurmurHash3 x86 32 (seed 0, signed, as ``mmh3.hash(b, 0, True)``) of each row of
    ``words``: the keys zero-padded to whole 32-bit little-endian words, one key a row,
    ``lengths`` their lengths in bytes."""
    n, blocks = words.shape
    h = np.zeros(n, np.uint32)
    block_count = lengths >> 2
    with np.errstate(over="ignore"):
        for b in range(blocks):
            k = words[:, b] * _C1
            k = (k << np.uint32(15)) | (k >> np.uint32(17))
            k *= _C2
            mixed = h ^ k
            mixed = (mixed << np.uint32(13)) | (mixed >> np.uint32(19))
            mixed = mixed * np.uint32(5) + np.uint32(0xE6546B64)
            h = np.where(block_count > b, mixed, h)
        tail = (lengths & 3) > 0
        if tail.any():
            # The bytes past a key's end are zero, so its last word is its tail.
            k = words[np.arange(n), np.minimum(block_count, blocks - 1)] * _C1
            k = (k << np.uint32(15)) | (k >> np.uint32(17))
            k *= _C2
            h = np.where(tail, h ^ k, h)
        h ^= lengths.astype(np.uint32)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h.view(np.int32).astype(np.int64)


def _partition_ids(keys: pa.BinaryArray, partition_count: int) -> np.ndarray | None:
    """The partition of each serialized key, as ``partition_id_of`` gives it; None when a
    key is longer than ``KEY_BYTES_MAX``."""
    offsets, data = _offsets_and_data(keys)
    lengths = np.diff(offsets).astype(np.int64)
    longest = int(lengths.max()) if len(lengths) else 0
    if longest > KEY_BYTES_MAX:
        return None
    width = max(4, (longest + 3) & ~3)
    matrix = np.zeros((len(keys), width), np.uint8)
    matrix[np.arange(width) < lengths[:, None]] = data[offsets[0]:offsets[-1]]
    hashes = murmur3_32(matrix.view("<u4"), lengths)
    hashes[hashes == INT32_MIN] = 0
    pids = np.abs(hashes) % partition_count
    # A hash tag, maybe: such a key is placed as the client places it. The bytes are looked
    # at whole first (most batches have no brace; by rows that took as long as the hashing).
    if (data[offsets[0]:offsets[-1]] == _BRACE).any():
        for row in np.flatnonzero((matrix == _BRACE).any(axis=1)).tolist():
            pids[row] = partition_id_of(keys[row].as_py(), partition_count)
    return pids


def pack_rows(batch: pa.RecordBatch, key_index: int, value_index: int,
              partition_count: int, max_entry_bytes: int) -> PackedRows | None:
    """The batch's rows as records by partition (the caller checked ``packable``);
    None when a key is too long to hash here (the row path writes the batch).
    ValueTooLargeError, before anything is sent, for a row larger than ``max_entry_bytes``
    (serialized key and value), as ``put_all_into`` raises it."""
    key = batch.column(key_index).cast(pa.binary())
    value_column = batch.column(value_index)
    value = value_column.cast(pa.binary())
    key_lengths, value_lengths = _lengths(key), _lengths(value)
    key_bytes = pc.binary_join_element_wise(_str_headers(key_lengths), key, b"")
    value_header = _str_headers(value_lengths) if value_column.type == pa.string() \
        else _bin_headers(value_lengths)
    key_sizes, value_sizes = _lengths(key_bytes), value_lengths + _lengths(value_header)
    sizes = key_sizes + value_sizes
    if len(sizes) and int(sizes.max()) > max_entry_bytes:
        raise ValueTooLargeError(int(sizes.max()), max_entry_bytes)
    pids = _partition_ids(key_bytes, partition_count)
    if pids is None:
        return None
    # A key's rows keep their order. Partition ids are below 65,536 (GridConfig), and numpy
    # sorts u16s stably by radix: 8x faster than a stable sort of the int64s.
    order = np.argsort(pids.astype(np.uint16), kind="stable")
    # Per row: its key's and value's sizes, then the key bytes and the value bytes (whose
    # own header is the value's).
    n = len(batch)
    sizes_table = np.empty((n, 2), "<u4")
    sizes_table[:, 0], sizes_table[:, 1] = key_sizes, value_sizes
    headers = _binary_array(sizes_table.view(np.uint8), np.arange(0, 8 * n + 1, 8, np.int32))
    records = pc.binary_join_element_wise(headers, key_bytes, value_header, value, b""
                                          ).take(pa.array(order))
    offsets, _ = _offsets_and_data(records)
    data = memoryview(records.buffers()[2])
    table = memoryview(sizes_table[order].tobytes())
    counts = np.bincount(pids, minlength=partition_count)
    present = np.flatnonzero(counts)
    ends = np.cumsum(counts[present])
    starts = ends - counts[present]
    pieces = {
        pid: (count, table[8 * start:8 * end], data[offsets[start]:offsets[end]])
        for pid, count, start, end in zip(present.tolist(), counts[present].tolist(),
                                          starts.tolist(), ends.tolist(), strict=True)
    }
    return PackedRows(pieces, int(offsets[-1] - offsets[0]) + len(table), n)
