"""The member's side of local reads: it keeps the directory and the shared indexes that let a
client on this host read a published map's records without a message (the layout is in
grid/local_reads.py).

- ``LocalReadDirectory`` owns ``{prefix}-local`` and one slot segment per published
  namespace. The member writes its lease (``renew``), which partitions it serves
  (``set_served``) and which (partition, namespace) slots are settled (``settle``).
- ``SharedFragment`` binds one fragment of the record store to its slot: the record store
  brackets every change of the fragment with ``begin`` / ``end`` (the seqlock, which also
  clears ``settled``) and tells it where records went (``placed``, ``removed``, ``moved``).
- ``SharedIndex`` is the open-addressing copy of the fragment's dict index, in a segment of
  the store (so it is named ``{prefix}-{n}`` and unlinked with the rest).

Only the member's main thread calls these, as it does the record store.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from itertools import compress
from typing import Any

from grid.local_reads import (
    DIRECTORY_MAGIC,
    FENCED_OFFSET,
    HEADER,
    INDEX_ENTRY,
    INDEX_HEADER,
    NAME_BYTES,
    NAME_LENGTH,
    NAMESPACE_COUNT_OFFSET,
    SLOT,
    VALID_UNTIL,
    VALID_UNTIL_OFFSET,
    directory_bytes,
    directory_name,
    map_segment,
    names_offset,
    namespace_name,
    served_offset,
)
from workers.shared_table import insert_entries, probed_table
from workers.shm import Segment, unlink_segment

NewSegment = Callable[[int], Segment]  # RecordStore.new_segment: the next {prefix}-{n}

__all__ = ["LocalReadDirectory", "SharedFragment", "SharedIndex", "fence"]

NAMESPACE_CAPACITY = 256
INDEX_CAPACITY_MIN = 16
VECTOR_BUILD_MIN = 256  # a smaller index is built as fast one entry at a time
_SETTLED_OFFSET = 8  # in a slot: seq, settled, arena + 1, index + 1
_SEGMENTS_OFFSET = 16
_U64 = struct.Struct("<Q")
_TWO_U64 = struct.Struct("<QQ")  # seq and settled, or arena + 1 and index + 1


def _capacity_for(count: int) -> int:
    """A power of two with the table at most half full after one more entry."""
    capacity = INDEX_CAPACITY_MIN
    while capacity < 2 * (count + 1):
        capacity *= 2
    return capacity


def _placed(entries: dict[int, int | tuple[int, ...]], count: int, capacity: int) -> Any:
    """A table of the entries ``probed_table`` takes, as valid (each reachable from its home slot
    with no empty slot between; the slots may differ), placed in bulk. Inserted in order of
    home slot, each entry lands at max(its home, the slot after the previous one's); those
    pushed past the end wrap around to the first empty slots, in that order."""
    import numpy as np  # only members that build large shared indexes pay for the import

    try:
        hashes = np.fromiter(entries.keys(), np.uint64, len(entries))
        offsets = np.fromiter(entries.values(), np.uint64, len(entries))
    except (TypeError, ValueError):  # a tuple: keys whose 64-bit hashes collide
        pairs = [(h, offset) for h, entry in entries.items()
                 for offset in ((entry,) if entry.__class__ is int else entry)]  # type: ignore[union-attr]
        hashes = np.array([h for h, _ in pairs], np.uint64)
        offsets = np.array([offset for _, offset in pairs], np.uint64)
    if len(hashes) != count:
        raise ValueError(f"a shared index of {count} entries given {len(hashes)}")
    home = (hashes & np.uint64(capacity - 1)).astype(np.int64)
    if capacity <= 1 << 32:
        # The order of (home, entry number): one sort of u64s, several times faster than a
        # stable argsort of the homes (a mergesort), with the same result.
        keyed = (home.astype(np.uint64) << np.uint64(32)) | np.arange(len(home), dtype=np.uint64)
        keyed.sort()
        order = (keyed & np.uint64(0xFFFFFFFF)).astype(np.int64)
    else:
        order = np.argsort(home, kind="stable")
    steps = np.arange(len(order))
    slots = np.maximum.accumulate(home[order] - steps) + steps
    table = np.zeros((capacity, 2), np.uint64)
    inside = slots < capacity
    placed = order[inside]
    table[slots[inside], 0] = hashes[placed]
    table[slots[inside], 1] = offsets[placed] + np.uint64(1)
    wrapped = order[~inside]
    if len(wrapped):
        free = np.flatnonzero(table[:, 1] == 0)[: len(wrapped)]
        table[free, 0] = hashes[wrapped]
        table[free, 1] = offsets[wrapped] + np.uint64(1)
    return table


class SharedIndex:
    """Key hash -> record offset, in a segment a reader probes (linear probing)."""

    __slots__ = ("segment", "mm", "capacity", "mask", "count")

    def __init__(self, segment: Segment, capacity: int) -> None:
        self.segment = segment
        self.mm = segment.mm
        self.capacity = capacity
        self.mask = capacity - 1
        self.count = 0

    @classmethod
    def build(cls, new_segment: NewSegment, entries: dict[int, int | tuple[int, ...]],
              count: int, room: int = 0) -> SharedIndex:
        """A table of every (hash, offset) in a fragment's dict index, written in one copy,
        with room for ``room`` more entries. A large one is placed by numpy: a bulk write
        into a published map builds each partition's index again every time it doubles, and
        one entry at a time that was half of the store's work."""
        capacity = _capacity_for(count + room)
        segment = new_segment(INDEX_HEADER.size + INDEX_ENTRY.size * capacity)
        table = _placed(entries, count, capacity) if count >= VECTOR_BUILD_MIN \
            else probed_table(entries, capacity)
        shared = cls(segment, capacity)
        shared.count = count
        INDEX_HEADER.pack_into(shared.mm, 0, capacity, count)
        with memoryview(table) as view:
            shared.mm[INDEX_HEADER.size:] = view.cast("B")
        return shared

    def full(self, adding: int = 1) -> bool:
        """Whether ``adding`` more entries would leave the table more than half full."""
        return 2 * (self.count + adding) > self.capacity

    def _find(self, h: int, offset: int) -> int:
        """The entry number holding (h, offset); it must be there."""
        mm, mask, target = self.mm, self.mask, offset + 1
        unpack = INDEX_ENTRY.unpack_from
        i = h & mask
        for _ in range(self.capacity):
            entry_hash, offset_1 = unpack(mm, 16 + 16 * i)
            if offset_1 == target and entry_hash == h:
                return i
            if offset_1 == 0:
                break
            i = (i + 1) & mask
        raise LookupError(f"shared index has no entry for hash {h:#x} at offset {offset}")

    def insert(self, h: int, offset: int) -> None:
        mm, mask = self.mm, self.mask
        unpack = INDEX_ENTRY.unpack_from
        i = h & mask
        while unpack(mm, 16 + 16 * i)[1]:
            i = (i + 1) & mask
        INDEX_ENTRY.pack_into(mm, 16 + 16 * i, h, offset + 1)
        self.count += 1
        _U64.pack_into(mm, 8, self.count)

    def insert_many(self, hashes: list[int], offsets: list[int]) -> None:
        """``insert`` of each (hash, offset), the caller having checked that they fit (a
        batch of new keys): probed and written in place (compiled: workers/shared_table.py),
        through a view of the table as u64s (no copy of a table of thousands of entries for
        a batch of a hundred)."""
        start, end = INDEX_HEADER.size, INDEX_HEADER.size + INDEX_ENTRY.size * self.capacity
        with memoryview(self.mm) as raw, raw[start:end] as entries, entries.cast("Q") as table:
            insert_entries(table, self.mask, hashes, offsets)
        self.count += len(hashes)
        _U64.pack_into(self.mm, 8, self.count)

    def replace(self, h: int, old: int, new: int) -> None:
        _U64.pack_into(self.mm, 16 + 16 * self._find(h, old) + 8, new + 1)

    def delete(self, h: int, offset: int) -> None:
        """Remove (h, offset) and shift later entries of the run back (no tombstones)."""
        mm, mask = self.mm, self.mask
        unpack, pack = INDEX_ENTRY.unpack_from, INDEX_ENTRY.pack_into
        hole = self._find(h, offset)
        j = hole
        while True:
            j = (j + 1) & mask
            entry_hash, offset_1 = unpack(mm, 16 + 16 * j)
            if offset_1 == 0:
                break
            home = entry_hash & mask
            # The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            if (hole < j and hole < home <= j) or (hole > j and (home > hole or home <= j)):
                continue
            pack(mm, 16 + 16 * hole, entry_hash, offset_1)
            hole = j
        pack(mm, 16 + 16 * hole, 0, 0)
        self.count -= 1
        _U64.pack_into(mm, 8, self.count)

    def entries(self) -> dict[int, list[int]]:
        """hash -> offsets, read back from the segment (tests; the simulation checks a
        served index at every settle, so the empty entries are skipped in C)."""
        start = INDEX_HEADER.size
        table = array("Q", self.mm[start:start + INDEX_ENTRY.size * self.capacity])
        offsets_1 = table[1::2]
        out: dict[int, list[int]] = {}
        for entry_hash, offset_1 in compress(zip(table[0::2], offsets_1, strict=True),
                                             offsets_1):
            out.setdefault(entry_hash, []).append(offset_1 - 1)
        return out


class NamespaceSlots:
    """The slot segment of one published namespace: a seqlock and pointers per partition."""

    __slots__ = ("segment", "mm", "seqs")

    def __init__(self, segment: Segment, partition_count: int) -> None:
        self.segment = segment
        self.mm = segment.mm
        self.seqs = [0] * partition_count

    def begin(self, pid: int) -> None:
        """A change of the fragment starts: readers retry, and it is not settled."""
        seq = self.seqs[pid] = self.seqs[pid] + 1
        _TWO_U64.pack_into(self.mm, SLOT.size * pid, seq, 0)

    def end(self, pid: int) -> None:
        seq = self.seqs[pid] = self.seqs[pid] + 1
        _U64.pack_into(self.mm, SLOT.size * pid, seq)

    def point(self, pid: int, arena: int, index: int) -> None:
        """Inside begin/end: the fragment's records and index are in these segment numbers
        (-1, -1: there is no fragment)."""
        _TWO_U64.pack_into(self.mm, SLOT.size * pid + _SEGMENTS_OFFSET, arena + 1, index + 1)

    def settle(self, pid: int, settled: bool = True) -> None:
        _U64.pack_into(self.mm, SLOT.size * pid + _SETTLED_OFFSET, 1 if settled else 0)


def _segment_number(segment: Segment) -> int:
    return int(segment.name.rsplit("-", 1)[1])


class SharedFragment:
    """One fragment's published state: its slot and its shared index.

    A fragment loaded in bulk (record blocks: a Spark write) leaves its shared index behind
    (``deferred``) instead of inserting every row as it comes, which cost its owner about a
    third of a published load (tools/bench_record_store.py): its slot is then not settled,
    so readers ask the owner, until the load is over and the index is built once from the
    dict (``RecordStore.loads_over``). The load is over when the member wanted the slot
    settled (``settle_wanted``: no write waits for its backups) and nothing changed it for
    a whole tick after (``quiet``)."""

    __slots__ = ("slots", "pid", "index", "new_segment", "deferred", "settle_wanted", "quiet")

    def __init__(self, slots: NamespaceSlots, pid: int, new_segment: NewSegment) -> None:
        self.slots = slots
        self.pid = pid
        self.index: SharedIndex | None = None
        self.new_segment = new_segment
        self.deferred = False  # the shared index lacks the writes since a block append
        self.settle_wanted = False  # deferred: the member would have settled the slot
        self.quiet = False  # deferred and wanted: one tick passed with no change

    def begin(self) -> None:
        self.slots.begin(self.pid)
        self.settle_wanted = False  # a change: the member settles again once it may

    def end(self) -> None:
        self.slots.end(self.pid)

    def moved(self, arena: Segment, entries: dict[int, int | tuple[int, ...]],
              count: int, room: int = 0) -> None:
        """Inside begin/end: the records are (now) in ``arena``, indexed by ``entries``
        (the new shared index with room for ``room`` more)."""
        old, self.index = self.index, SharedIndex.build(self.new_segment, entries, count, room)
        self.deferred = False
        self.slots.point(self.pid, _segment_number(arena), _segment_number(self.index.segment))
        if old is not None:
            old.segment.retire()

    def rehomed(self, arena: Segment) -> None:
        """Inside begin/end: the records were copied to ``arena`` at the same offsets (the
        arena grew), so the shared index stays as it is; only the slot points elsewhere."""
        self.slots.point(self.pid, _segment_number(arena),
                         _segment_number(self.index.segment))  # type: ignore[union-attr]

    def placed(self, fragment: object, h: int, old: int, new: int) -> None:
        """Inside begin/end: the record with hash ``h`` at ``old`` (-1: a new key) is at
        ``new`` now."""
        if self.deferred:
            return
        index = self.index
        if old >= 0:
            index.replace(h, old, new)  # type: ignore[union-attr]
        elif index.full():  # type: ignore[union-attr]
            # Grow by building again from the dict (which already holds the new record).
            self.moved(fragment.segment, fragment.index, fragment.count)  # type: ignore[attr-defined]
        else:
            index.insert(h, new)  # type: ignore[union-attr]

    def placed_new(self, fragment: object, hashes: list[int], offsets: list[int],
                   bulk: bool = False) -> None:
        """Inside begin/end: ``placed`` of a batch of new keys (already in the fragment's
        dict and count), into the table or, when they would fill it, a larger one; or, for
        a ``bulk`` load's block, into neither until the load is over (``deferred``)."""
        if bulk or self.deferred:
            self.deferred = True
            return
        index = self.index
        if index.full(len(hashes)):  # type: ignore[union-attr]
            # A fragment that grows by batches likely grows on: room for as many again, so
            # that the next build comes after it doubled (half the builds of a bulk load).
            count = fragment.count  # type: ignore[attr-defined]
            self.moved(fragment.segment, fragment.index, count, count)  # type: ignore[attr-defined]
        else:
            index.insert_many(hashes, offsets)  # type: ignore[union-attr]

    def removed(self, h: int, offset: int) -> None:
        if not self.deferred:
            self.index.delete(h, offset)  # type: ignore[union-attr]

    def settled(self) -> bool:
        """Whether the slot says readers may read (tests)."""
        return _U64.unpack_from(self.slots.mm, SLOT.size * self.pid + _SETTLED_OFFSET)[0] != 0

    def unpublish(self) -> None:
        """The fragment leaves its slot (dropped, cleared, replaced or moved)."""
        self.begin()
        self.slots.point(self.pid, -1, -1)
        self.end()
        if self.index is not None:
            self.index.segment.retire()
            self.index = None


class LocalReadDirectory:
    """``{prefix}-local`` and the slot segments of the namespaces published on this member."""

    def __init__(self, prefix: str, member_uuid: str, partition_count: int,
                 namespace_capacity: int = NAMESPACE_CAPACITY) -> None:
        self.prefix = prefix
        self.partition_count = partition_count
        self.namespace_capacity = namespace_capacity
        name = directory_name(prefix)
        unlink_segment(name)  # a stale one of an earlier process with this name
        self.segment = Segment(name, directory_bytes(partition_count, namespace_capacity))
        self.mm = self.segment.mm
        self.namespaces: dict[str, NamespaceSlots] = {}
        self.served = bytearray(partition_count)
        HEADER.pack_into(self.mm, 0, DIRECTORY_MAGIC, 0.0, 0, partition_count,
                         namespace_capacity, member_uuid.encode()[:48], 0)
        self.closed = False

    def slots_of(self, namespace: str) -> NamespaceSlots | None:
        return self.namespaces.get(namespace)

    def publish(self, namespace: str) -> NamespaceSlots | None:
        """Give ``namespace`` a slot segment (None when it cannot have one: the name is too
        long or the directory is full). Its slots start unsettled, pointing at nothing."""
        slots = self.namespaces.get(namespace)
        if slots is not None or self.closed:
            return slots
        name = namespace.encode()
        k = len(self.namespaces)
        if len(name) > NAME_BYTES - NAME_LENGTH.size or k >= self.namespace_capacity:
            return None
        segment_name = namespace_name(self.prefix, k)
        unlink_segment(segment_name)
        slots = NamespaceSlots(Segment(segment_name, SLOT.size * self.partition_count),
                               self.partition_count)
        at = names_offset(self.partition_count) + k * NAME_BYTES
        NAME_LENGTH.pack_into(self.mm, at, len(name))
        self.mm[at + NAME_LENGTH.size:at + NAME_LENGTH.size + len(name)] = name
        self.namespaces[namespace] = slots
        _U64.pack_into(self.mm, NAMESPACE_COUNT_OFFSET, k + 1)  # last: the name is written
        return slots

    def renew(self, valid_until: float) -> None:
        """Until when (CLOCK_MONOTONIC) readers may trust what this member serves."""
        if not self.closed:
            VALID_UNTIL.pack_into(self.mm, VALID_UNTIL_OFFSET, valid_until)

    def set_served(self, pid: int, served: bool) -> None:
        value = 1 if served else 0
        if self.served[pid] != value and not self.closed:
            self.served[pid] = value
            self.mm[served_offset(pid)] = value

    def settle(self, namespace: str, pid: int) -> None:
        slots = self.namespaces.get(namespace)
        if slots is not None:
            slots.settle(pid)

    def fence(self) -> None:
        """No reader trusts this directory again (the member is closing)."""
        if not self.closed:
            _U64.pack_into(self.mm, FENCED_OFFSET, 1)

    def unsettle(self, pid: int) -> None:
        """The partition stopped being served here: none of its slots is settled."""
        for slots in self.namespaces.values():
            slots.settle(pid, False)

    def close(self) -> None:
        """Fence, then unlink every segment of the directory. Idempotent."""
        if self.closed:
            return
        self.fence()
        self.closed = True
        for slots in self.namespaces.values():
            slots.segment.retire()
        self.segment.retire()


def fence(prefix: str) -> bool:
    """Mark a dead member's directory fenced, so that no client reads its memory again; the
    supervisor calls this before it tells anyone of the death. False when there is none."""
    try:
        mm = map_segment(directory_name(prefix), writable=True)
    except FileNotFoundError:
        return False
    with mm:
        if len(mm) >= HEADER.size and mm[:8] == DIRECTORY_MAGIC:
            _U64.pack_into(mm, FENCED_OFFSET, 1)
    return True
