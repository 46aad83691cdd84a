"""The member's record store: every key and value lives in shared memory the member created.

A fragment is one (partition id, namespace). Each fragment owns one shared-memory segment used
as a bump-allocated arena of records ``[u32 key_len][u32 value_len][key][value]`` (little
endian, unaligned). The Python heap holds only the index: a dict from a 64-bit MurmurHash3 of
the key to the record's offset (on a hash collision, a tuple of offsets; the key bytes in
shared memory decide). An arena is made large (``ARENA_SPAN_BYTES``) and holds only the pages
its records fill: a fragment grows in place. Overwrites and removes leave garbage in it; when
half of the memory it holds is garbage, or a record does not fit, the live records are copied
into a fresh segment (compaction, growing it when needed) and the old segment is unlinked.

Records are immutable once written while any iterator holds the segment (see ``items``), so an
iterator sees a consistent snapshot: later puts append elsewhere, compaction writes a new
segment, and a retired segment stays mapped until its last iterator finishes.

A fragment may also keep a Merkle tree of its entries (grid/partition/merkle.py) for
differential replica sync: built on the first ``tree`` call, then updated by every write of
that fragment; dropped with the fragment (clear, drop, a received fragment replacing it).

The store is not thread-safe: only the member's main thread calls it, from its poll loop
(a ``zmq.Poller`` loop in workers/member.py, no asyncio); the persistence writer thread
never touches it.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Collection, Iterable, Iterator, Sequence
from itertools import accumulate, chain, repeat
from operator import add
from typing import Any

from mypy_extensions import mypyc_attr

from grid.local_reads import RECORD_HEADER, key_hash, key_hashes
from grid.partition.merkle import (
    DEPTH_MAX,
    DEPTH_MIN,
    MerkleTree,
    entry_hash,
    entry_hashes,
    leaf_shift,
)
from workers.local_reads import LocalReadDirectory, SharedFragment
from workers.record_block import RecordBlock, iterate_records
from workers.shm import Segment, SegmentReader, reserves_lazily, validate_prefix

__all__ = ["FragmentLoan", "RecordStore", "RecordStoreClosedError", "ValueTooLargeError",
           "key_hash"]

_HEADER = RECORD_HEADER  # [u32 key_len][u32 value_len]: local readers parse it too
header_bytes = _HEADER.size
_unpack_header = _HEADER.unpack_from
_pack_header = _HEADER.pack_into
_header = _HEADER.pack
Buffer = bytes | bytearray | memoryview  # a value as the store takes it: its len() is its size
# A batch of at least this many pairs tries the block append (``_Fragment.append_new``).
BLOCK_APPEND_MIN = 8
BULK_GROWTH = 4  # how much an arena grows when a block of records does not fit
# An arena's size when made, where its memory is reserved as it fills (workers/shm.py): it
# holds only the pages its records fill, so it can be made large, and a fragment grows in
# place, without the copies and new pages of a move, up to this much. Where memory is
# reserved whole when the segment is made, ``ARENA_BYTES_WHOLE``, doubled as it fills.
ARENA_SPAN_BYTES = 256 * 1024 * 1024
ARENA_BYTES_WHOLE = 64 * 1024
# Garbage (overwritten or removed records) worth compacting an arena for, once it is half of
# the memory the arena holds.
COMPACT_GARBAGE_MIN = 32 * 1024
# Rows of bulk-loaded fragments whose shared index ``loads_over`` builds in one call (once a
# tick), about 15 ms of the member's loop; a fragment is built whole, so one may exceed it.
LOAD_BUILD_ROWS_MAX = 100_000
_HASH_MASK = (1 << 64) - 1
HASH_SPACE = 1 << 64  # key hashes are below this: where a scan ends
_NO_FRAGMENTS: dict[str, Any] = {}
u32_max = (1 << 32) - 1
segment_name_attempts_max = 1000  # names already taken (stale segments) skipped per creation

assert header_bytes == 8


class ValueTooLargeError(ValueError):
    """A record (header + key + value) is larger than the store's ``max_record_bytes``.

    ``record_bytes`` and ``limit_bytes`` let the member translate it into the grid's error.
    """

    def __init__(self, message: str, record_bytes: int, limit_bytes: int) -> None:
        super().__init__(message)
        self.record_bytes = record_bytes
        self.limit_bytes = limit_bytes


@mypyc_attr(native_class=False)
class RecordStoreClosedError(RuntimeError):
    """A write reached a store after ``close``: a bug in the caller's shutdown order."""


@mypyc_attr(native_class=False)
class RecordStoreInvariantError(RuntimeError):
    """The store's own bookkeeping disagrees with its segments: a bug, never user input."""


def _key_bytes(key: object) -> bytes:
    """A bytes-like key as bytes, copied unless it is bytes (keys are small; a str or int
    raises TypeError)."""
    if type(key) is bytes:
        return key
    return memoryview(key).tobytes()  # type: ignore[arg-type]  # (TypeError: not bytes-like)


def _as_bytes(value: object) -> bytes:
    """bytes of a value (mmh3 hashes only read-only bytes, not a bytearray or view)."""
    if type(value) is bytes:
        return value
    return bytes(value)  # type: ignore[call-overload]  # (TypeError: not bytes-like)


def _value_buffer(value: object) -> Buffer:
    """A view of a bytes-like value whose len() is its size in bytes, without copying."""
    if type(value) is bytes or type(value) is bytearray:
        return value
    view = memoryview(value)  # type: ignore[arg-type]  # (TypeError: not bytes-like)
    if not view.c_contiguous:
        return view.tobytes()
    if view.ndim != 1 or view.format != "B":
        return view.cast("B")
    return view


class _Fragment:
    """One (pid, namespace): an arena segment plus the hash index of its records."""

    __slots__ = (
        "store",
        "segment",
        "mm",
        "capacity",
        "reserved",
        "index",
        "top",
        "count",
        "live_bytes",
        "garbage_bytes",
        "tuple_entry_count",
        "tree",
        "shared",
    )

    def __init__(self, store: RecordStore, segment: Segment) -> None:
        self.store = store
        self.segment = segment
        self.mm = segment.mm
        self.capacity = segment.size_bytes
        # The arena's first ``reserved`` bytes have memory behind them (workers/shm.py):
        # every write past them reserves first, before anything changes.
        self.reserved = segment.reserved
        self.index: dict[int, int | tuple[int, ...]] = {}
        self.top = 0  # next free offset
        self.count = 0  # live records
        self.live_bytes = 0  # bytes of live records, headers included
        self.garbage_bytes = 0  # bytes of overwritten or removed records below top
        self.tuple_entry_count = 0  # index entries holding colliding offsets
        # The Merkle tree of the entries, built on the first ``RecordStore.tree`` call and
        # then updated by every write; None until then, so writes without one pay one check.
        self.tree: MerkleTree | None = None
        # Its published copy for local reads (workers/local_reads.py), None unless its
        # namespace is published; every write then keeps the shared index in step, but a
        # bulk load's blocks, which it takes once the load is over (``loads_over``).
        self.shared: SharedFragment | None = None

    # -- lookups ---------------------------------------------------------------------------

    def locate(self, entry: int | tuple[int, ...], key: bytes) -> int:
        """Offset of the record with ``key`` among the entry's offsets, or -1."""
        mm = self.mm
        key_size = len(key)
        offsets = (entry,) if entry.__class__ is int else entry
        for offset in offsets:  # type: ignore[union-attr]
            record_key_size = _unpack_header(mm, offset)[0]
            start = offset + header_bytes
            if record_key_size == key_size and mm[start : start + key_size] == key:
                return offset
        return -1

    def get(self, key: bytes) -> bytes | None:
        entry = self.index.get(key_hash(key))
        if entry is None:
            return None
        mm = self.mm
        if entry.__class__ is int:
            key_size, value_size = _unpack_header(mm, entry)
            start = entry + header_bytes
            middle = start + key_size
            if key_size == len(key) and mm[start:middle] == key:
                return mm[middle : middle + value_size]
            return None
        offset = self.locate(entry, key)
        if offset < 0:
            return None
        key_size, value_size = _unpack_header(mm, offset)
        middle = offset + header_bytes + key_size
        return mm[middle : middle + value_size]

    def contains(self, key: bytes) -> bool:
        entry = self.index.get(key_hash(key))
        return entry is not None and self.locate(entry, key) >= 0

    # -- index entries ---------------------------------------------------------------------

    def entry_with(self, entry: int | tuple[int, ...] | None, offset: int) -> int | tuple:
        """The index entry after adding ``offset`` (a new record with this hash)."""
        if entry is None:
            return offset
        if entry.__class__ is int:
            self.tuple_entry_count += 1
            return (entry, offset)
        return entry + (offset,)  # type: ignore[operator]

    def entry_without(self, entry: int | tuple[int, ...], offset: int) -> int | tuple | None:
        """The index entry after dropping ``offset``; None when no offset is left."""
        if entry.__class__ is int:
            assert entry == offset
            return None
        rest = tuple(other for other in entry if other != offset)  # type: ignore[union-attr]
        assert len(rest) == len(entry) - 1  # type: ignore[arg-type]
        if len(rest) == 1:
            self.tuple_entry_count -= 1
            return rest[0]
        return rest

    # -- writes ----------------------------------------------------------------------------

    def put(self, key: bytes, value: Buffer) -> bytes | None:
        """Write key → value; return the old value. The caller checked the record size."""
        key_size = len(key)
        value_size = len(value)
        record_size = header_bytes + key_size + value_size
        if self.top + record_size > self.reserved:
            self.make_room(record_size)  # may move records: look up offsets only after this
        index = self.index
        mm = self.mm
        h = key_hash(key)
        entry = index.get(h)
        old = None
        offset = -1
        if entry is not None:
            if entry.__class__ is int:  # (no colliding hash: nearly always; no call then)
                record_key_size, old_value_size = _unpack_header(mm, entry)
                start = entry + header_bytes
                if record_key_size == key_size and mm[start : start + key_size] == key:
                    offset = entry
            else:
                offset = self.locate(entry, key)
                if offset >= 0:
                    old_value_size = _unpack_header(mm, offset)[1]
            if offset >= 0:
                start = offset + header_bytes + key_size
                old = mm[start : start + old_value_size]
                if old_value_size == value_size and self.segment.pin_count == 0:
                    mm[start : start + value_size] = value  # no iterator sees this segment
                    if self.tree is not None:
                        self.tree_update(h, old, value)
                    return old
                dead_size = header_bytes + key_size + old_value_size
                self.garbage_bytes += dead_size
                self.live_bytes -= dead_size
                self.count -= 1
                entry = self.entry_without(entry, offset)
        top = self.top
        _pack_header(mm, top, key_size, value_size)
        start = top + header_bytes
        mm[start : start + key_size] = key
        mm[start + key_size : top + record_size] = value
        self.top = top + record_size
        self.live_bytes += record_size
        self.count += 1
        index[h] = top if entry is None else self.entry_with(entry, top)
        if self.tree is not None:
            self.tree_update(h, old, value)
        if self.shared is not None:
            self.shared.placed(self, h, offset, top)
        return old

    def put_many(self, keys: Sequence[bytes], values: Sequence[Buffer],
                 record_bytes_sum: int) -> None:
        """Write every key and value in order; room for all of them is made once, up
        front. A batch of new keys is appended as one block (``append_new``); otherwise new
        keys and same-size overwrites are written inline (a batch's records are most of
        what a put_all, a Spark write or a restore costs a member), and anything else goes
        through ``put``."""
        if self.top + record_bytes_sum > self.reserved:
            self.make_room(record_bytes_sum)
        if len(keys) >= BLOCK_APPEND_MIN and self.append_new(keys, values, record_bytes_sum):
            return
        # Every put below appends at most its own record, so none of them compacts.
        capacity_before = self.capacity
        index = self.index
        mm = self.mm
        tree = self.tree
        shared = self.shared
        in_place = self.segment.pin_count == 0  # else an iterator may be reading the value
        top, live_bytes, count = self.top, self.live_bytes, self.count
        try:
            for key, value in zip(keys, values, strict=True):
                key_size = len(key)
                value_size = len(value)
                h = key_hash(key)
                entry = index.get(h)
                if entry is not None:
                    if in_place and entry.__class__ is int:
                        record_key_size, record_value_size = _unpack_header(mm, entry)
                        start = entry + header_bytes
                        middle = start + key_size
                        if record_key_size == key_size and record_value_size == value_size \
                                and mm[start:middle] == key:
                            if tree is not None:
                                self.tree_update(h, mm[middle : middle + value_size],
                                                 value)
                            mm[middle : middle + value_size] = value
                            continue
                    self.top, self.live_bytes, self.count = top, live_bytes, count
                    self.put(key, value)
                    top, live_bytes, count = self.top, self.live_bytes, self.count
                    continue
                record_end = top + header_bytes + key_size + value_size
                _pack_header(mm, top, key_size, value_size)
                start = top + header_bytes
                mm[start : start + key_size] = key
                mm[start + key_size : record_end] = value
                index[h] = top
                if tree is not None:
                    tree.update(h, None, entry_hash(h, _as_bytes(value)))
                live_bytes += record_end - top
                count += 1
                if shared is not None:  # it may read the count (to build its index again)
                    self.top, self.live_bytes, self.count = record_end, live_bytes, count
                    shared.placed(self, h, -1, top)
                top = record_end
        finally:
            self.top, self.live_bytes, self.count = top, live_bytes, count
        if self.capacity != capacity_before or self.top > self.capacity:
            raise RecordStoreInvariantError("put_many outgrew the room it made")

    def append_new(self, keys: Sequence[bytes], values: Sequence[Buffer],
                   record_bytes_sum: int) -> bool:
        """Write a batch of keys that are all new to this fragment (and each once in the
        batch) as one block: one copy into the arena and one index update, each record laid
        out as ``put`` lays it, with no Python call per pair (a Spark write or a first
        put_all into an empty map is all new keys). False, having written nothing, when
        some key may be here already; the caller made room for ``record_bytes_sum`` (and,
        for a published fragment, holds its seqlock: readers retry until the records and
        their slots in the shared index are all written)."""
        index = self.index
        if key_hash(keys[0]) in index:  # a batch of overwrites: no need to hash them all
            return False
        hashes = key_hashes(keys)
        if len(set(hashes)) != len(hashes) or not index.keys().isdisjoint(hashes):
            return False
        key_sizes, value_sizes = list(map(len, keys)), list(map(len, values))
        parts: list[Any] = [None] * (3 * len(keys))
        parts[0::3] = map(_header, key_sizes, value_sizes)
        parts[1::3] = keys
        parts[2::3] = values
        top = self.top
        starts = list(accumulate(map(add, map(add, key_sizes, value_sizes),
                                     repeat(header_bytes)), initial=top))
        size = starts.pop() - top
        if size != record_bytes_sum or top + size > self.capacity:
            raise RecordStoreInvariantError("a block append does not fit the room made for it")
        if self.tree is not None:
            try:
                entries = entry_hashes(hashes, values)  # type: ignore[arg-type]  # (below)
            except TypeError:  # a bytearray or view among the values: mmh3 hashes bytes only
                entries = entry_hashes(hashes, list(map(_as_bytes, values)))
            self.tree.add_many(hashes, entries)
        index.update(zip(hashes, starts, strict=True))
        self._place(b"".join(parts), hashes, starts)
        return True

    def append_block(self, records: RecordBlock) -> bool:
        """``append_new`` of records laid out already (workers/record_block.py), copied
        whole and indexed by the key hashes they came with.
        False, having written nothing, when a key is here already or twice in the block.
        The caller holds the seqlock of a published fragment; the fragment keeps no Merkle
        tree (whose entries would need each value)."""
        index, hashes = self.index, records.hash_list()
        if not index.keys().isdisjoint(hashes):
            return False
        if self.tree is not None:
            raise RecordStoreInvariantError("a block append into a fragment with a tree")
        block = records.block()
        if self.top + len(block) > self.reserved:
            # A fragment that grows by blocks is being loaded in bulk (a Spark write): past
            # its arena (256 MiB, or 64 KiB where reserved whole) each move costs a new
            # segment, its pages and a copy, so it grows by four at a time.
            self.make_room(len(block), BULK_GROWTH)  # may move records: offsets only after
        starts = records.starts_at(self.top)
        count = len(index)
        index.update(zip(hashes, starts, strict=True))
        if len(index) - count != len(hashes):  # a key twice in the block: undo
            for h in hashes:
                index.pop(h, None)
            return False
        self._place(block, hashes, starts, True)
        return True

    def _place(self, block: bytes | memoryview, hashes: list[int], starts: list[int],
               bulk: bool = False) -> None:
        """Write records laid out end to end at ``top`` (the index has them at ``starts``
        already), and count them; ``bulk``: a block of a bulk load, which a published
        fragment's shared index takes only once the load is over."""
        top, size = self.top, len(block)
        self.mm[top : top + size] = block
        self.top = top + size
        self.live_bytes += size
        self.count += len(hashes)
        if self.shared is not None:
            self.shared.placed_new(self, hashes, starts, bulk)

    def remove(self, key: bytes) -> bytes | None:
        """Drop key; return its value, or None when absent."""
        index = self.index
        h = key_hash(key)
        entry = index.get(h)
        if entry is None:
            return None
        offset = self.locate(entry, key)
        if offset < 0:
            return None
        mm = self.mm
        key_size, value_size = _unpack_header(mm, offset)
        start = offset + header_bytes + key_size
        old = mm[start : start + value_size]
        rest = self.entry_without(entry, offset)
        if rest is None:
            del index[h]
        else:
            index[h] = rest
        dead_size = header_bytes + key_size + value_size
        self.garbage_bytes += dead_size
        self.live_bytes -= dead_size
        self.count -= 1
        if self.tree is not None:
            self.tree_update(h, old, None)
        if self.shared is not None:
            self.shared.removed(h, offset)
        if self.count == 0 and self.segment.pin_count == 0:
            # Nothing live and no iterator: reuse the arena from the start, no compaction.
            assert self.live_bytes == 0 and not index
            self.top = 0
            self.garbage_bytes = 0
        return old

    # -- Merkle tree ----------------------------------------------------------------------

    def tree_update(self, h: int, old: bytes | None, new: object) -> None:
        """An entry changed from ``old`` to ``new`` (None: absent); the tree exists."""
        self.tree.update(  # type: ignore[union-attr]
            h,
            None if old is None else entry_hash(h, old),
            None if new is None else entry_hash(h, _as_bytes(new)),
        )

    def records_of(self, entries: Iterable[tuple[int, int | tuple[int, ...]]]
                   ) -> Iterator[tuple[int, bytes, bytes]]:
        """(key hash, key, value) of each record the index entries point at (a colliding
        entry: each of its records). Reads only those records."""
        mm = self.mm
        for h, entry in entries:
            for offset in (entry,) if entry.__class__ is int else entry:  # type: ignore[union-attr]
                key_size, value_size = _unpack_header(mm, offset)
                start = offset + header_bytes
                middle = start + key_size
                yield h, mm[start:middle], mm[middle : middle + value_size]

    def build_tree(self, depth: int) -> MerkleTree:
        """A tree of the live records from the hashes in the index (no key is hashed again).
        Entry hashes are summed per leaf first: one tree update per leaf, not per entry."""
        tree = MerkleTree(depth)
        leaf_of = tree.leaf_of
        sums: dict[int, list[int]] = {}  # leaf -> [a key hash in it, sum of entry hashes]
        for h, _key, value in self.records_of(self.index.items()):
            leaf = leaf_of(h)
            leaf_sum = sums.get(leaf)
            if leaf_sum is None:
                sums[leaf] = [h, entry_hash(h, value)]
            else:
                leaf_sum[1] += entry_hash(h, value)
        for h, total in sums.values():
            tree.update(h, None, total & _HASH_MASK)
        return tree

    # -- growth and compaction -------------------------------------------------------------

    def reserve(self, end: int) -> None:
        """Reserve the arena's memory up to ``end`` (OSError, ENOSPC, and nothing changed
        when /dev/shm is full)."""
        if end > self.reserved:
            self.segment.reserve(end)
            self.reserved = self.segment.reserved

    def make_room(self, record_size: int, growth: int = 2) -> None:
        """Reserve the memory of ``record_size`` more bytes at ``top``; first move the live
        records to a new segment (``move_to``) when the arena has no room for them, or when
        half of the memory it holds is garbage worth a copy of the records
        (``COMPACT_GARBAGE_MIN`` at least: an arena of a few keys rewritten is not moved at
        every page). The new segment is as large as the old when that makes room, else
        max(``growth`` times, needed). A failure changes nothing.
        """
        garbage = self.garbage_bytes
        compact = garbage * 2 >= self.reserved and garbage >= COMPACT_GARBAGE_MIN
        if compact or self.top + record_size > self.capacity:
            required = self.live_bytes + record_size
            if required <= self.capacity and (compact or garbage * 2 >= self.capacity):
                capacity_new = self.capacity
            else:
                capacity_new = max(growth * self.capacity, required)
            self.move_to(capacity_new)
            if self.top + record_size > self.capacity:
                raise RecordStoreInvariantError("compaction made too little room")
        self.reserve(self.top + record_size)

    def move_to(self, capacity_new: int) -> None:
        """Copy the live records into a new segment of ``capacity_new`` bytes (at least the
        live bytes) and retire the old one."""
        segment_new = self.store.new_segment(capacity_new, lazy=True)
        remap = None
        try:
            segment_new.reserve(self.live_bytes)
            if self.garbage_bytes == 0:
                # Pure growth: the arena is all live records, so copy it whole and keep the
                # offsets (and the index) as they are.
                assert self.top == self.live_bytes
                with memoryview(self.mm) as source, memoryview(segment_new.mm) as target:
                    target[0 : self.top] = source[0 : self.top]
            else:
                remap = self.copy_live_records(segment_new)
        except BaseException:
            segment_new.retire()
            raise
        if remap is not None:
            self.remap_index(remap)
        segment_old = self.segment
        self.segment = segment_new
        self.mm = segment_new.mm
        self.capacity = capacity_new
        self.reserved = segment_new.reserved
        self.top = self.live_bytes
        self.garbage_bytes = 0
        if self.shared is not None:
            if remap is None:  # the records kept their offsets: the shared index stands
                self.shared.rehomed(segment_new)
            else:
                self.shared.moved(segment_new, self.index, self.count)
        segment_old.retire()

    def remap_index(self, remap: dict[int, int]) -> None:
        """Point every index entry at the records' new offsets."""
        index = self.index
        for h, entry in index.items():  # replaces values only, so iterating is safe
            if entry.__class__ is int:
                index[h] = remap[entry]
            else:
                index[h] = tuple(remap[offset] for offset in entry)  # type: ignore[union-attr]

    def copy_live_records(self, segment_new: Segment) -> dict[int, int]:
        """Copy live records in offset order, coalescing adjacent ones; return old → new."""
        mm = self.mm
        remap: dict[int, int] = {}
        position = 0
        run_start = run_end = 0  # the current run of adjacent live records [start, end)
        with memoryview(mm) as source, memoryview(segment_new.mm) as target:
            for offset in self.offsets_sorted():
                key_size, value_size = _unpack_header(mm, offset)
                if offset != run_end:
                    size = run_end - run_start
                    target[position - size : position] = source[run_start:run_end]
                    run_start = offset
                remap[offset] = position
                run_end = offset + header_bytes + key_size + value_size
                position += run_end - offset
            size = run_end - run_start
            target[position - size : position] = source[run_start:run_end]
        if position != self.live_bytes or len(remap) != self.count:
            raise RecordStoreInvariantError(
                f"compaction copied {position} bytes in {len(remap)} records, index says"
                f" {self.live_bytes} bytes in {self.count} records"
            )
        return remap

    def offsets_sorted(self) -> list[int]:
        """Every live record's offset, ascending (sequential reads of the arena)."""
        if self.tuple_entry_count == 0:
            offsets = list(self.index.values())
        else:
            offsets = []
            for entry in self.index.values():
                if entry.__class__ is int:
                    offsets.append(entry)
                else:
                    offsets.extend(entry)  # type: ignore[arg-type]
        offsets.sort()  # type: ignore[call-arg]
        return offsets  # type: ignore[return-value]

    # -- iteration and release -------------------------------------------------------------

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """A snapshot iterator: pins the segment now, so later writes never touch its records."""
        iterator = iterate_records(self.segment, self.offsets_sorted())
        next(iterator)  # runs the pin; from here on, dropping the iterator unpins it
        return iterator

    def concatenated(self, offsets: list[int] | None = None) -> tuple[bytes, int]:
        """Every live record's key and value bytes laid end to end (or only the records at
        ``offsets``), and the record count.

        In the arena a record's key and value are adjacent, so this is one slice a record (a
        scan's hot path: the client decodes the whole run with one msgpack call)."""
        mm = self.mm
        parts: list[bytes] = []
        append = parts.append
        for offset in self.offsets_sorted() if offsets is None else offsets:
            key_size, value_size = _unpack_header(mm, offset)
            start = offset + header_bytes
            append(mm[start : start + key_size + value_size])
        return b"".join(parts), len(parts)

    def release(self) -> None:
        """Unlink the segment (unmapped now, or when its last iterator ends)."""
        self.index = {}
        self.count = 0
        self.tree = None
        self.unpublish()
        self.segment.retire()

    def unpublish(self) -> None:
        """Drop the shared index, if there is one (the slot then points at nothing)."""
        if self.shared is not None:
            self.shared.unpublish()
            self.shared = None

    def check(self) -> None:
        """Walk every record and compare with the counters (tests; O(records))."""
        sizes = 0
        keys = set()
        for offset in self.offsets_sorted():
            key_size, value_size = _unpack_header(self.mm, offset)
            start = offset + header_bytes
            key = self.mm[start : start + key_size]
            if key_hash(key) not in self.index or key in keys:
                raise RecordStoreInvariantError(f"record at {offset} is not indexed once")
            keys.add(key)
            sizes += header_bytes + key_size + value_size
            if offset + header_bytes + key_size + value_size > self.top:
                raise RecordStoreInvariantError(f"record at {offset} ends past top {self.top}")
        if sizes != self.live_bytes or len(keys) != self.count:
            raise RecordStoreInvariantError("live_bytes or count disagrees with the records")
        if self.top != self.live_bytes + self.garbage_bytes or self.top > self.capacity:
            raise RecordStoreInvariantError("top != live + garbage, or top past capacity")
        if self.top > self.reserved or self.reserved != self.segment.reserved:
            raise RecordStoreInvariantError("records past the arena's reserved memory")
        tuple_count = sum(1 for entry in self.index.values() if entry.__class__ is tuple)
        if tuple_count != self.tuple_entry_count:
            raise RecordStoreInvariantError("tuple_entry_count disagrees with the index")
        tree = self.tree
        if tree is not None and tree.nodes != self.build_tree(tree.depth).nodes:
            raise RecordStoreInvariantError("the Merkle tree disagrees with the records")
        self.check_shared()

    def check_shared(self) -> None:
        """Compare the shared index, if any, with the dict index (tests; O(capacity))."""
        shared = self.shared
        if shared is not None and shared.deferred:
            if shared.settled():
                raise RecordStoreInvariantError("a slot settled with its shared index behind")
        elif shared is not None:
            expected = {h: sorted((entry,) if entry.__class__ is int else entry)  # type: ignore[arg-type]
                        for h, entry in self.index.items()}
            found = {h: sorted(offsets) for h, offsets in shared.index.entries().items()}  # type: ignore[union-attr]
            if found != expected:
                raise RecordStoreInvariantError("the shared index disagrees with the index")


class FragmentLoan:
    """One fragment lent, read-only, to a migration destination on this host.

    What is lent is the arena segment itself: pinned, so no write overwrites a record in
    place and no reset reuses it while the destination reads. (The migration flag stops
    writes anyway; were one to compact the fragment, the old segment would be unlinked and
    the destination's next read would fail, which fails the migration, never corrupts it.)
    The index travels in a second segment of this store: every 64-bit key hash, then every
    offset, so that the destination rebuilds its dict with one C-level update instead of
    hashing each key. Hash collisions (two keys, one hash) are rare enough to go on the wire.

    ``chunks`` cuts the arena bytes and the index entries into messages of about
    ``max_bytes``; ``release`` (idempotent; also done by the store's ``close``) unpins the
    arena and unlinks the index segment.
    """

    __slots__ = ("store", "namespace", "segment", "index_segment", "top", "entries",
                 "collisions", "count", "live_bytes", "garbage_bytes", "released")

    def __init__(self, store: RecordStore, namespace: str, fragment: _Fragment) -> None:
        self.store = store
        self.namespace = namespace
        self.released = False
        index = fragment.index
        if fragment.tuple_entry_count:
            singles = {h: entry for h, entry in index.items() if entry.__class__ is int}
            self.collisions = [[h, list(entry)] for h, entry in index.items()  # type: ignore[arg-type]
                               if entry.__class__ is not int]
        else:
            singles, self.collisions = index, []  # type: ignore[assignment]
        self.entries = len(singles)
        self.index_segment = None
        if singles:
            self.index_segment = store.new_segment(16 * self.entries)
            hashes = array("Q", singles.keys())
            offsets = array("Q", singles.values())
            with memoryview(self.index_segment.mm) as view, memoryview(hashes) as h, \
                    memoryview(offsets) as o:
                view[: 8 * self.entries] = h.cast("B")
                view[8 * self.entries :] = o.cast("B")
        self.segment = fragment.segment
        self.segment.pin()
        self.top = fragment.top
        self.count = fragment.count
        self.live_bytes = fragment.live_bytes
        self.garbage_bytes = fragment.garbage_bytes

    def chunks(self, max_bytes: float) -> list[dict[str, Any]]:
        """Wire descriptions of the loan in parts of about ``max_bytes`` of arena, each with
        its share of the index; ``RecordStore.receive`` takes them in order."""
        parts = max(1, math.ceil(self.top / max_bytes))
        top, entries = self.top, self.entries
        out = []
        for k in range(parts):
            out.append({
                "ns": self.namespace, "arena": self.segment.name, "top": top,
                "index": self.index_segment.name if self.index_segment else "",
                "n": entries, "a": top * k // parts, "b": top * (k + 1) // parts,
                "e0": entries * k // parts, "e1": entries * (k + 1) // parts,
                "first": k == 0, "end": None,
            })
        out[-1]["end"] = {"count": self.count, "live": self.live_bytes,
                          "garbage": self.garbage_bytes, "collisions": self.collisions}
        return out

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.store.loans.discard(self)
        self.segment.unpin()
        if self.index_segment is not None:
            self.index_segment.retire()

    def __repr__(self) -> str:
        return f"FragmentLoan({self.segment.name!r}, {self.count} records)"


class FragmentTransferError(ValueError):
    """A lent fragment's description does not fit what its segments hold."""


def _int_field(chunk: dict[str, Any], name: str, low: int, high: int) -> int:
    value = chunk.get(name)
    if value.__class__ is not int or not low <= value <= high:
        raise FragmentTransferError(f"fragment chunk field {name}={value!r} is not in"
                                    f" {low}..{high}")
    return value


def _changing(fragment: _Fragment, method: Any, *args: Any) -> Any:
    """Call a method that changes ``fragment`` inside its seqlock, if it is published (local
    readers then retry instead of seeing it half done). The single-record writes test
    ``fragment.shared`` themselves first: they are the member's hot path."""
    shared = fragment.shared
    if shared is None:
        return method(*args)
    shared.begin()
    try:
        return method(*args)
    finally:
        shared.end()


# The simulation watches it, and its broken-protocol tests break it, through subclasses
# (tests/cluster/sim.py): compiled (grid/compiled.py), it must let Python subclass it.
@mypyc_attr(allow_interpreted_subclasses=True)
class RecordStore:
    """Keys and values of every partition replica this member holds, in shared memory.

    Segments are named ``{segment_prefix}-{n}``; ``close`` unlinks all of them, and after a
    kill the supervisor's ``workers.shm.remove_segments(segment_prefix)`` does. Keys and values
    are bytes-like; results are bytes copies (never views that would pin a mapping). After
    ``close``, reads see an empty store and writes raise RecordStoreClosedError.
    """

    def __init__(
        self,
        segment_prefix: str,
        initial_segment_bytes: int | None = None,
        max_record_bytes: int = 64 * 1024 * 1024,
        merkle_depth: object = 10,
    ) -> None:
        validate_prefix(segment_prefix)
        if initial_segment_bytes is None:
            initial_segment_bytes = ARENA_SPAN_BYTES if reserves_lazily() else ARENA_BYTES_WHOLE
        if not isinstance(initial_segment_bytes, int) or initial_segment_bytes <= 0:
            raise ValueError(f"initial_segment_bytes must be > 0, got {initial_segment_bytes!r}")
        if not isinstance(max_record_bytes, int) or not 0 < max_record_bytes <= u32_max:
            raise ValueError(f"max_record_bytes must be in 1..{u32_max}, got {max_record_bytes!r}")
        if type(merkle_depth) is not int or not (
                merkle_depth == 0 or DEPTH_MIN <= merkle_depth <= DEPTH_MAX):
            raise ValueError(f"merkle_depth must be 0 (no trees) or {DEPTH_MIN}..{DEPTH_MAX},"
                             f" got {merkle_depth!r}")
        self._segment_prefix = segment_prefix
        self._initial_segment_bytes = initial_segment_bytes
        self._max_record_bytes = max_record_bytes
        self._merkle_depth = merkle_depth
        self._partitions: dict[int, dict[str, _Fragment]] = {}
        self._receiving: dict[tuple[int, str], _Fragment] = {}  # lent fragments arriving
        self.loans: set[FragmentLoan] = set()  # fragments this store has lent out
        # Hot restart (workers/journal.py): told of every mutation, once it is applied.
        self.journal: Any = None
        # Local reads (workers/local_reads.py): set by the member; None keeps none.
        self.local: LocalReadDirectory | None = None
        # The partitions whose fragments keep a shared index, or None: every partition's.
        # A member shares only the partitions it serves to local readers (``share``): a
        # backup's index would be upkeep on every write that nobody reads.
        self.shared_partitions: set[int] | None = None
        # Bulk-loaded fragments whose shared index waits for the load to end (``settle``).
        self.loading: dict[tuple[int, str], SharedFragment] = {}
        self._segment_number = 0
        self._closed = False

    # -- single records --------------------------------------------------------------------

    def put(self, pid: int, namespace: str, key: object, value: object) -> bytes | None:
        """Store key → value (bytes-like); return the previous value or None."""
        key = _key_bytes(key)
        value = _value_buffer(value)
        record_size = header_bytes + len(key) + len(value)
        if record_size > self._max_record_bytes:
            raise self._too_large(len(key), len(value))
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            fragment = self._new_fragment(pid, namespace, record_size)
        if fragment.shared is None:
            old = fragment.put(key, value)
        else:
            old = _changing(fragment, fragment.put, key, value)
        if self.journal is not None:
            self.journal.put(pid, namespace, key, value)
        return old

    def get(self, pid: int, namespace: str, key: object) -> bytes | None:
        """The value of key, or None."""
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return None
        return fragment.get(_key_bytes(key))

    def remove(self, pid: int, namespace: str, key: object) -> bytes | None:
        """Remove key; return the removed value, or None if it was absent."""
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return None
        key = _key_bytes(key)
        if fragment.shared is None:
            old = fragment.remove(key)
        else:
            old = _changing(fragment, fragment.remove, key)
        if old is not None and self.journal is not None:
            self.journal.remove(pid, namespace, key)
        return old

    def contains(self, pid: int, namespace: str, key: object) -> bool:
        """Whether key is present."""
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return False
        return fragment.contains(_key_bytes(key))

    # -- batches ---------------------------------------------------------------------------

    def put_many(self, pid: int, namespace: str, pairs: Iterable[Sequence[object]]) -> None:
        """Store every pair (later pairs win). A too-large record fails the batch unchanged."""
        checked, record_bytes_sum = self._checked(pairs)
        if checked:
            keys, values = zip(*checked, strict=True)
            self._put_checked(pid, namespace, keys, values, record_bytes_sum)

    def put_groups(self, namespace: str, groups: Sequence[tuple[int, Any]]) -> None:
        """``put_many`` over several partitions, each group's items flat bytes (key, value,
        key, value, ..., as a batch message decodes them). A batch of 100 keys spans about 80
        partitions, a pair or so each, so the checks are made per batch where they can be:
        a batch whose bytes together fit in a record holds no record too large. A too-large
        record fails the whole batch unchanged. Groups may instead be record blocks
        (workers/record_block.py: a Spark write's), all of them."""
        if groups and groups[0][1].__class__ is RecordBlock:
            self._put_blocks(namespace, groups)  # type: ignore[arg-type]
            return
        counts = []
        for _, items in groups:
            if len(items) & 1:
                raise ValueError("a group's items are keys and values in turn")
            counts.append(len(items) >> 1)
        self.put_runs(namespace, [pid for pid, _ in groups], counts,
                      list(chain.from_iterable(items for _, items in groups)))

    def put_runs(self, namespace: str, pids: Sequence[int], counts: Sequence[int],
                 items: Sequence[bytes]) -> None:
        """``put_groups`` of items laid out as a batch message carries them: ``counts[i]``
        pairs (key, value; bytes) of partition ``pids[i]``, after those of ``pids[i - 1]``.
        A batch of 100 keys spans about 80 partitions, a pair or so each: the pairs a
        fragment takes as they come (a new key with room for it, or a key overwritten with
        a value of its old size) are written in one loop with no call per pair or per
        partition (about a sixth of the bytecodes of a put each); the rest of a partition's
        go through ``put`` or ``put_many``. A too-large record fails the batch unchanged."""
        if len(items) != 2 * sum(counts) or len(pids) != len(counts):
            raise ValueError("a batch's items are its counts' keys and values in turn")
        limit = self._max_record_bytes
        if sum(map(len, items)) + header_bytes > limit:  # else no record is too large
            self._checked(zip(items[0::2], items[1::2], strict=True))
        keys, values = items[0::2], items[1::2]
        hashes = key_hashes(keys)
        partitions = self._partitions
        journal = self.journal
        unpack, pack = _unpack_header, _pack_header
        at = 0
        for pid, count in zip(pids, counts, strict=True):
            end = at + count
            fragment = partitions.get(pid, _NO_FRAGMENTS).get(namespace)
            if fragment is not None and fragment.tree is None and not fragment.segment.pin_count:
                first = at
                shared = fragment.shared
                if shared is not None:
                    shared.begin()
                try:
                    index, mm = fragment.index, fragment.mm
                    # (Up to the reserved memory: past it, ``put`` and ``put_many`` reserve.)
                    top, capacity = fragment.top, fragment.reserved
                    while at < end:
                        h = hashes[at]
                        key, value = keys[at], values[at]
                        key_size, value_size = len(key), len(value)
                        entry = index.get(h)
                        if entry is None:  # a new key: appended where there is room
                            record_end = top + header_bytes + key_size + value_size
                            if record_end > capacity:
                                break
                            pack(mm, top, key_size, value_size)
                            mm[top + header_bytes : record_end - value_size] = key
                            mm[record_end - value_size : record_end] = value
                            index[h] = top
                            fragment.top = record_end
                            fragment.live_bytes += record_end - top
                            fragment.count += 1
                            if shared is not None:
                                shared.placed(fragment, h, -1, top)
                            top = record_end
                        elif entry.__class__ is int:  # overwritten in place, if it fits
                            start = entry + header_bytes
                            middle = start + key_size
                            if unpack(mm, entry) != (key_size, value_size) \
                                    or mm[start:middle] != key:
                                break
                            mm[middle : middle + value_size] = value
                        else:
                            break
                        at += 1
                finally:
                    if shared is not None:
                        shared.end()
                if journal is not None and at > first:
                    journal.put_many(pid, namespace,
                                     zip(keys[first:at], values[first:at], strict=True))
            if at == end - 1:
                self.put(pid, namespace, keys[at], values[at])
            elif at < end:
                rest_keys, rest_values = keys[at:end], values[at:end]
                self._put_checked(pid, namespace, rest_keys, rest_values,
                                  sum(map(len, rest_keys)) + sum(map(len, rest_values))
                                  + header_bytes * (end - at))
            at = end

    def _put_blocks(self, namespace: str, groups: Sequence[tuple[int, RecordBlock]]) -> None:
        """``put_groups`` of record blocks: each partition's records copied into its arena in
        one piece and indexed in one update where they are all new keys of a fragment with
        no tree and no journal to tell (a Spark write into an empty or a staging map); else
        as items, a record at a time."""
        limit = self._max_record_bytes - header_bytes
        if max(block.frame.largest for _, block in groups) > limit:  # then block by block
            for _, block in groups:
                if block.largest() > limit:
                    items = block.items()
                    self._checked(zip(items[0::2], items[1::2], strict=True))
        partitions = self._partitions
        for pid, block in groups:
            if not block.rows:
                continue
            size = block.record_bytes()
            fragment = partitions.get(pid, _NO_FRAGMENTS).get(namespace)
            if fragment is None:
                fragment = self._new_fragment(pid, namespace, size)
            if self.journal is None and fragment.tree is None \
                    and _changing(fragment, fragment.append_block, block):
                continue
            items = block.items()
            self._put_checked(pid, namespace, items[0::2], items[1::2], size)

    def _checked(self, pairs: Iterable[Sequence[object]]
                 ) -> tuple[list[tuple[bytes, Buffer]], int]:
        """The pairs as bytes (keys) and buffers (values), and their records' size in all;
        ValueTooLargeError for a record the store cannot hold."""
        checked: list[tuple[bytes, Buffer]] = []
        record_bytes_sum = 0
        record_bytes_max = self._max_record_bytes
        for pair in pairs:
            key, value = pair
            key_bytes, buffer = _key_bytes(key), _value_buffer(value)
            record_size = header_bytes + len(key_bytes) + len(buffer)
            if record_size > record_bytes_max:
                raise self._too_large(len(key_bytes), len(buffer))
            record_bytes_sum += record_size
            checked.append((key_bytes, buffer))
        return checked, record_bytes_sum

    def _put_checked(self, pid: int, namespace: str, keys: Sequence[bytes],
                     values: Sequence[Buffer], record_bytes_sum: int) -> None:
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            fragment = self._new_fragment(pid, namespace, record_bytes_sum)
        if fragment.shared is None:
            fragment.put_many(keys, values, record_bytes_sum)
        else:
            _changing(fragment, fragment.put_many, keys, values, record_bytes_sum)
        if self.journal is not None:
            self.journal.put_many(pid, namespace, zip(keys, values, strict=True))

    def get_many(self, pid: int, namespace: str, keys: Iterable[object]) -> list[bytes | None]:
        """The value (or None) of each key, in order."""
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return [None for _ in keys]
        get = fragment.get
        return [get(_key_bytes(key)) for key in keys]

    def found_in(self, namespace: str, pids: Sequence[int], keys: Sequence[bytes],
                 skip: Collection[int] = ()) -> list[bytes]:
        """The keys (bytes) present among ``keys``, each followed by its value: a batched
        get over many partitions in one call (a batch of 100 keys spans about 80). Key
        ``keys[i]`` is of partition ``pids[i]``, in any order, or all of ``pids[0]`` if it is
        the only one; the partitions in ``skip`` are not read. The keys are hashed in one
        pass, and each key's record read in line, with no work per partition but finding its
        fragment (``_Fragment.get`` is a call per key, and its ``key_hash`` another)."""
        hashes = key_hashes(keys)
        partitions = self._partitions
        fragment_of = {pid: None if pid in skip else
                       partitions.get(pid, _NO_FRAGMENTS).get(namespace)
                       for pid in set(pids)}.__getitem__
        found: list[bytes] = []
        append = found.append
        fragments = map(fragment_of, pids) if len(pids) != 1 \
            else repeat(fragment_of(pids[0]), len(keys))
        for key, h, fragment in zip(keys, hashes, fragments, strict=True):
            if fragment is None:
                continue
            entry = fragment.index.get(h)
            if entry is None:
                continue
            if entry.__class__ is not int:  # colliding hashes: find its record
                entry = fragment.locate(entry, key)
                if entry < 0:
                    continue
            mm = fragment.mm
            key_size, value_size = _unpack_header(mm, entry)
            start = entry + header_bytes
            middle = start + key_size
            if key_size == len(key) and mm[start:middle] == key:
                append(key)
                append(mm[middle : middle + value_size])
        return found

    def items(self, pid: int, namespace: str) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs as of this call; writes during the iteration are not seen."""
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return iter(())
        return fragment.items()

    def concatenated(self, pid: int, namespace: str) -> tuple[bytes, int]:
        """The fragment's keys and values laid end to end (k1 v1 k2 v2 ...), and how many
        records: a consistent snapshot, taken in one call."""
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return b"", 0
        return fragment.concatenated()

    def concatenated_from(self, pid: int, namespace: str, low: int, max_bytes: int
                          ) -> tuple[bytes, int, int | None]:
        """One chunk of a scan that reads the fragment in ranges of key hashes: the records
        whose hash is at least ``low`` and below a bound chosen so that their keys and values
        (laid end to end, as ``concatenated``) take about ``max_bytes`` at most, though
        always at least one record when any is left; their count; and the bound, where the
        next chunk starts, or None when no record is left above it.

        Each chunk is one state of its hash range; an entry present throughout a scan is in
        exactly one chunk (its hash never changes), whichever replica serves the next chunk.
        Choosing the bound costs a pass over the index, not a sort: hashes are uniform, so a
        range's share of the hash space is its expected share of the records. So a scan of
        a fragment of n records in c chunks costs c passes over its index."""
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return b"", 0, None
        if low == 0 and fragment.live_bytes <= max_bytes:
            return (*fragment.concatenated(), None)  # the whole fragment fits: the fast path
        # Records are spread uniformly over the hash space: take the share of the range above
        # ``low`` that should hold ``max_bytes`` (90% of it, so that most chunks fit at once).
        expected = fragment.live_bytes * (HASH_SPACE - low) / HASH_SPACE
        high = HASH_SPACE if expected <= max_bytes else \
            low + int((HASH_SPACE - low) * 0.9 * max_bytes / expected)
        index = fragment.index
        while True:
            selected = [(h, entry) for h, entry in index.items() if low <= h < high]
            if not selected:  # nothing in range: end it just after the next record, if any
                following = min((h for h in index if h >= high), default=None)
                if following is None:
                    return b"", 0, None
                high = following + 1
                continue
            data, count = fragment.concatenated(sorted(
                offset for _, entry in selected
                for offset in ((entry,) if entry.__class__ is int else entry)))  # type: ignore[union-attr]
            if len(data) <= max_bytes or len(selected) == 1:
                return data, count, (None if high >= HASH_SPACE else high)
            high = low + (high - low) // 2  # an unlucky spread: half the range

    # -- fragments and partitions ----------------------------------------------------------

    def live_bytes(self, pid: int, namespace: str) -> int:
        """Bytes of the fragment's live records, headers included (0 when it has none)."""
        try:
            return self._partitions[pid][namespace].live_bytes
        except KeyError:
            return 0

    def size(self, pid: int, namespace: str) -> int:
        """Number of records in the fragment."""
        try:
            return self._partitions[pid][namespace].count
        except KeyError:
            return 0

    def clear(self, pid: int, namespace: str) -> int:
        """Drop the fragment and unlink its segment; return how many records it held."""
        namespaces = self._partitions.get(pid)
        if namespaces is None or namespace not in namespaces:
            return 0
        fragment = namespaces.pop(namespace)
        if not namespaces:
            del self._partitions[pid]
        count = fragment.count
        fragment.release()
        if self.journal is not None:
            self.journal.clear(pid, namespace)
        return count

    def move_fragment(self, pid: int, source: str, target: str) -> int:
        """Make ``source``'s fragment the ``target``'s, dropping what ``target`` held, and
        leave ``source`` empty: one dict operation, no copy. Returns the records moved."""
        if source == target:
            raise ValueError("source and target namespaces must differ")
        namespaces = self._partitions.get(pid)
        moved = namespaces.pop(source, None) if namespaces is not None else None
        self.clear(pid, target)
        if moved is None:
            return 0
        moved.unpublish()
        self._partitions.setdefault(pid, {})[target] = moved
        self._publish_fragment(pid, target, moved)
        if self.journal is not None:  # the log has no rename: the records again, then a clear
            self.journal.put_many(pid, target, moved.items())
            self.journal.clear(pid, source)
        return moved.count

    # -- Merkle trees (differential replica sync) -----------------------------------------

    def tree(self, pid: int, namespace: str) -> MerkleTree | None:
        """The fragment's Merkle tree, for comparing replicas (None when ``merkle_depth`` is
        0). Built on the first call, then kept up to date by every write, so only fragments
        that are compared pay for one. The tree returned is the live one: read, never change
        it. A fragment that does not exist has an all-zero tree (a new one, not kept)."""
        depth = self._merkle_depth
        if depth == 0:
            return None
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return MerkleTree(depth)
        if fragment.tree is None:
            fragment.tree = fragment.build_tree(depth)
        return fragment.tree

    def leaf_entries(self, pid: int, namespace: str, leaves: Iterable[int]
                     ) -> list[tuple[bytes, bytes]]:
        """The (key, value) pairs under these leaves: what a replica sends for the leaves
        where its tree and its peer's differ. Selected by the hashes in the index, so only
        those records are read."""
        wanted = self._leaves(leaves)
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return []
        shift = leaf_shift(self._merkle_depth)
        selected = [(h, entry) for h, entry in fragment.index.items()
                    if (h & _HASH_MASK) >> shift in wanted]
        return [(key, value) for _, key, value in fragment.records_of(selected)]

    def replace_leaves(self, pid: int, namespace: str, leaves: Iterable[int],
                       pairs: Iterable[Sequence[object]]) -> int:
        """Make the fragment's entries under these leaves exactly ``pairs`` (the peer's
        ``leaf_entries``): put what differs, remove what the pairs lack, through ``put_many``
        and ``remove`` so that the journal and the tree follow. A pair outside the leaves is a
        ValueError, and a too-large one a ValueTooLargeError, before anything changes.
        Returns the entries written or removed."""
        wanted = self._leaves(leaves)
        shift = leaf_shift(self._merkle_depth)
        new: dict[bytes, object] = {}
        for pair in pairs:
            key, value = pair
            key_bytes = _key_bytes(key)
            if (key_hash(key_bytes) & _HASH_MASK) >> shift not in wanted:
                raise ValueError(f"key {key_bytes!r} is not under the leaves being replaced")
            new[key_bytes] = value
        current = dict(self.leaf_entries(pid, namespace, wanted))
        changed = [(key, value) for key, value in new.items() if current.get(key) != value]
        self.put_many(pid, namespace, changed)  # checks every size before it writes
        removed = [key for key in current if key not in new]
        for key in removed:
            self.remove(pid, namespace, key)
        return len(changed) + len(removed)

    def _leaves(self, leaves: Iterable[int]) -> set[int]:
        """The leaf numbers as a set, each checked against the store's depth."""
        depth = self._merkle_depth
        if depth == 0:
            raise ValueError("this store has no Merkle trees (merkle_depth=0), so no leaves")
        wanted: set[Any] = set(leaves)  # (each checked below: not yet known to be ints)
        leaf_count = 1 << (depth - 1)
        for leaf in wanted:
            if type(leaf) is not int or not 0 <= leaf < leaf_count:
                raise ValueError(f"leaf must be an int in 0..{leaf_count - 1}, got {leaf!r}")
        return wanted

    # -- migration transfer ----------------------------------------------------------------

    def lend(self, pid: int, namespace: str) -> FragmentLoan | None:
        """Lend the fragment to a destination on this host (None when it has none). A
        fragment that is more garbage than records is compacted first, so that the loan
        carries records, not garbage."""
        try:
            fragment = self._partitions[pid][namespace]
        except KeyError:
            return None
        if fragment.garbage_bytes > fragment.live_bytes:
            _changing(fragment, fragment.move_to, fragment.capacity)
        loan = FragmentLoan(self, namespace, fragment)
        self.loans.add(loan)
        return loan

    def receive(self, pid: int, chunk: dict[str, Any]) -> int:
        """Take one chunk of another store's ``FragmentLoan`` (in order): bulk copies of its
        arena bytes and index entries. The last chunk installs the fragment, replacing what
        this store held of the namespace; until then nothing of it is visible. Returns the
        index entries taken. FragmentTransferError when the chunk does not fit its segments,
        FileNotFoundError when the lender's segments are gone."""
        namespace = chunk.get("ns")
        if not isinstance(namespace, str):
            raise FragmentTransferError("a fragment chunk names its namespace")
        key = (pid, namespace)
        with SegmentReader(str(chunk.get("arena"))) as arena:
            top = _int_field(chunk, "top", 0, arena.size_bytes)
            start = _int_field(chunk, "a", 0, top)
            end = _int_field(chunk, "b", start, top)
            if chunk.get("first"):
                stale = self._receiving.pop(key, None)
                if stale is not None:
                    stale.release()
                self._receiving[key] = _Fragment(self, self.new_segment(arena.size_bytes,
                                                                        lazy=True))
            fragment = self._receiving.get(key)
            if fragment is None or fragment.capacity != arena.size_bytes:
                raise FragmentTransferError(f"a chunk of {namespace!r} without its first")
            fragment.reserve(end)
            with memoryview(fragment.mm) as target:
                arena.read_into(target[start:end], start)
        entries = _int_field(chunk, "n", 0, top)
        first_entry = _int_field(chunk, "e0", 0, entries)
        last_entry = _int_field(chunk, "e1", first_entry, entries)
        if last_entry > first_entry:
            with SegmentReader(str(chunk.get("index"))) as index_segment:
                if index_segment.size_bytes < 16 * entries:
                    raise FragmentTransferError("the index segment is shorter than its entries")
                width = 8 * (last_entry - first_entry)
                hashes, offsets = bytearray(width), bytearray(width)
                index_segment.read_into(memoryview(hashes), 8 * first_entry)
                index_segment.read_into(memoryview(offsets), 8 * (entries + first_entry))
            with memoryview(hashes) as h, memoryview(offsets) as o:
                h, o = h.cast("Q"), o.cast("Q")
                if max(o) + header_bytes > top:
                    raise FragmentTransferError("an index offset lies past the records")
                fragment.index.update(zip(h, o, strict=True))
        taken = last_entry - first_entry
        if chunk.get("end") is not None:
            taken += self._install(key, fragment, top, chunk["end"])
        return taken

    def _install(self, key: tuple[int, str], fragment: _Fragment, top: int,
                 end: dict[str, Any]) -> int:
        """The last chunk: counters, colliding entries, then the fragment goes live."""
        index = fragment.index
        collisions = end.get("collisions")
        if not isinstance(collisions, list):
            raise FragmentTransferError("the last chunk carries the colliding entries")
        colliding = 0
        for h, offsets in collisions:
            if h in index or not isinstance(offsets, list) or len(offsets) < 2 or \
                    not all(o.__class__ is int and 0 <= o < top for o in offsets):
                raise FragmentTransferError(f"bad colliding entry for hash {h!r}")
            index[h] = tuple(offsets)
            colliding += len(offsets)
        fragment.tuple_entry_count = len(collisions)
        fragment.top = top
        fragment.count = _int_field(end, "count", 0, top)
        fragment.live_bytes = _int_field(end, "live", 0, top)
        fragment.garbage_bytes = _int_field(end, "garbage", 0, top)
        if fragment.count != len(index) - len(collisions) + colliding or \
                fragment.live_bytes + fragment.garbage_bytes != top:
            raise FragmentTransferError(
                f"the fragment says {fragment.count} records in {fragment.live_bytes} live"
                f" bytes, its index has {len(index)} entries and top is {top}")
        del self._receiving[key]
        pid, namespace = key
        namespaces = self._partitions.setdefault(pid, {})
        old = namespaces.pop(namespace, None)
        if old is not None:
            old.release()
        namespaces[namespace] = fragment
        self._publish_fragment(pid, namespace, fragment)
        if self.journal is not None:
            self.journal.clear(pid, namespace)
            self.journal.put_many(pid, namespace, fragment.items())
        return colliding

    def drop_partition(self, pid: int) -> None:
        """Drop every namespace of the partition (and any arriving) and unlink their
        segments."""
        for key in [key for key in self._receiving if key[0] == pid]:
            self._receiving.pop(key).release()
        namespaces = self._partitions.pop(pid, None)
        if namespaces is None:
            return
        for namespace, fragment in namespaces.items():
            fragment.release()
            if self.journal is not None:
                self.journal.clear(pid, namespace)

    def namespaces(self, pid: int) -> list[str]:
        """Namespaces with a fragment (created by a put, gone after clear/drop), sorted."""
        return sorted(self._partitions.get(pid, ()))

    def partitions(self) -> list[int]:
        """Partition ids with at least one fragment, sorted."""
        return sorted(self._partitions)

    @property
    def segment_prefix(self) -> str:
        """What every segment name of this store starts with (then ``-{n}``)."""
        return self._segment_prefix

    def arriving_partitions(self) -> set[int]:
        """Partition ids with a lent fragment part-way received."""
        return {pid for pid, _ in self._receiving}

    def shm_bytes(self) -> int:
        """The memory the arenas in use hold in /dev/shm: their reserved pages (retired
        ones still read by iterators excluded)."""
        return sum(
            fragment.segment.held_bytes
            for namespaces in self._partitions.values()
            for fragment in namespaces.values()
        )

    def close(self) -> None:
        """Unlink every segment. Idempotent."""
        if self.local is not None:
            self.local.fence()  # before anything goes: no reader may trust what is left
        self._closed = True
        partitions = self._partitions
        self._partitions = {}
        self.loading.clear()
        for loan in list(self.loans):
            loan.release()
        receiving, self._receiving = self._receiving, {}
        failures: list[BaseException] = []
        for namespaces in [*partitions.values(), receiving]:
            for fragment in namespaces.values():  # type: ignore[attr-defined]
                try:
                    fragment.release()
                except Exception as error:  # unlink the others before reporting it
                    failures.append(error)
        if self.local is not None:
            self.local.close()
        if failures:
            raise failures[0]

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._partitions)} partitions"
        return f"RecordStore({self._segment_prefix!r}, {state})"

    # -- internals -------------------------------------------------------------------------

    def new_segment(self, size_bytes: int, lazy: bool = False) -> Segment:
        """Create the next ``{prefix}-{n}`` segment, skipping names a stale process left;
        ``lazy`` for an arena, which reserves its memory as it fills (workers/shm.py)."""
        if self._closed:
            raise RecordStoreClosedError(f"record store {self._segment_prefix!r} is closed")
        for _ in range(segment_name_attempts_max):
            name = f"{self._segment_prefix}-{self._segment_number}"
            self._segment_number += 1
            try:
                return Segment(name, size_bytes, lazy)
            except FileExistsError:
                continue
        raise FileExistsError(
            f"{segment_name_attempts_max} segment names after {self._segment_prefix!r} are"
            " taken; remove stale segments with workers.shm.remove_segments"
        )

    def _new_fragment(self, pid: int, namespace: str, record_bytes: int) -> _Fragment:
        if type(pid) is not int or pid < 0:
            raise TypeError(f"partition id must be an int >= 0, got {pid!r}")
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
        size_bytes = max(self._initial_segment_bytes, record_bytes)
        fragment = _Fragment(self, self.new_segment(size_bytes, lazy=True))
        self._partitions.setdefault(pid, {})[namespace] = fragment
        self._publish_fragment(pid, namespace, fragment)
        return fragment

    # -- local reads -----------------------------------------------------------------------

    def publish(self, namespace: str) -> bool:
        """Keep a shared index of every fragment of ``namespace``, now and from now on, so
        that clients on this host read it without a message. False when this store has no
        directory or the directory cannot take the namespace."""
        if self.local is None or self._closed:
            return False
        if self.local.slots_of(namespace) is None:
            if self.local.publish(namespace) is None:
                return False
            for pid, namespaces in self._partitions.items():
                fragment = namespaces.get(namespace)
                if fragment is not None:
                    self._publish_fragment(pid, namespace, fragment)
        return True

    def share(self, pid: int, shared: bool) -> None:
        """Keep shared indexes of the partition's published fragments (built now, from its
        dict indexes), or drop them (its slots then point at nothing). The member calls this
        before it serves a partition to local readers and after it stops; only with
        ``shared_partitions`` set."""
        partitions = self.shared_partitions
        if partitions is None:
            raise ValueError("share() needs shared_partitions (every partition is shared)")
        if shared == (pid in partitions):
            return
        fragments = self._partitions.get(pid, {})
        if shared:
            partitions.add(pid)
            for namespace, fragment in fragments.items():
                self._publish_fragment(pid, namespace, fragment)
            return
        partitions.discard(pid)
        for fragment in fragments.values():
            fragment.unpublish()

    def settle(self, pid: int, namespace: str) -> None:
        """No write to (pid, namespace) waits for its backups: local reads may answer, or,
        while a bulk load leaves the fragment's shared index behind, may once the load is
        over (``loads_over``)."""
        if self.local is None:
            return
        fragment = self._partitions.get(pid, _NO_FRAGMENTS).get(namespace)
        shared = None if fragment is None else fragment.shared
        if shared is not None and shared.deferred:
            shared.settle_wanted, shared.quiet = True, False
            self.loading[(pid, namespace)] = shared
            return
        self.local.settle(namespace, pid)

    def loads_over(self, rows_max: int = LOAD_BUILD_ROWS_MAX) -> list[tuple[int, str]]:
        """The member calls this once a tick. The fragments whose shared index a bulk load
        left behind (``SharedFragment``), which the member wanted settled at the last call
        and which nothing changed since, get their shared index now, built once from the
        dict (up to about ``rows_max`` rows a call, so that a tick stays short; the rest
        at the next): their (pid, namespace), which the member settles as it would have."""
        over: list[tuple[int, str]] = []
        rows = 0
        for slot, shared in list(self.loading.items()):
            fragment = self._partitions.get(slot[0], _NO_FRAGMENTS).get(slot[1])
            if fragment is None or fragment.shared is not shared or not shared.deferred \
                    or not shared.settle_wanted:
                del self.loading[slot]  # gone, built, or changed: settled again when it may
            elif not shared.quiet:
                shared.quiet = True  # wait a whole tick: a load's next call may be coming
            elif rows < rows_max:
                rows += fragment.count
                try:
                    _changing(fragment, shared.moved, fragment.segment, fragment.index,
                              fragment.count)
                except OSError:  # no room in /dev/shm for the index (ENOSPC): readers go on
                    shared.settle_wanted = True  # asking the owner (nothing changed, but
                    break  # ``begin`` cleared the wish), and the next tick tries again
                del self.loading[slot]
                over.append(slot)
        return over

    def _publish_fragment(self, pid: int, namespace: str, fragment: _Fragment) -> None:
        """Point the namespace's slot at ``fragment`` (now the one for (pid, namespace))."""
        slots = None if self.local is None else self.local.slots_of(namespace)
        if slots is None or (self.shared_partitions is not None
                             and pid not in self.shared_partitions):
            return
        shared = SharedFragment(slots, pid, self.new_segment)
        shared.begin()
        try:
            shared.moved(fragment.segment, fragment.index, fragment.count)
        finally:
            shared.end()
        fragment.shared = shared

    def _too_large(self, key_size: int, value_size: int) -> ValueTooLargeError:
        record_size = header_bytes + key_size + value_size
        return ValueTooLargeError(
            f"record of {record_size} bytes (key {key_size} + value {value_size} + header"
            f" {header_bytes}) exceeds max_record_bytes {self._max_record_bytes}; store a"
            " smaller value or raise max_record_bytes",
            record_size,
            self._max_record_bytes,
        )

    def _check(self) -> None:
        """Verify every fragment's bookkeeping against its records (tests)."""
        for namespaces in self._partitions.values():
            for fragment in namespaces.values():
                fragment.check()
