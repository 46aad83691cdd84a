"""Gets answered from the owner's shared memory, for a client on the grid's host.

A member that publishes a map keeps a directory and a shared copy of each fragment's index
(layout: grid/local_reads.py). ``LocalReader.get`` maps them read-only, probes, copies the
value and checks the fragment's seqlock; whenever it cannot be sure, it says MISS (or
UNPUBLISHED) and the map asks the owner with a message instead. It answers only when all of
these hold, each read from the owner's memory at the time of the get:

- the member the client's table names as owner is the one whose directory this is (same
  uuid), it has not been fenced (it closed, or the supervisor saw it die), and its membership
  lease has not run out (grid/cluster/lease.py: before then nobody can have removed it);
- that member's own table says it owns the partition (and it is ready, and not lite);
- no write to the partition and map waits for its backups on the owner (``settled``);
- the seqlock shows no write changed the fragment while it was read.

So a local read answers what a get sent to that owner would have answered at that moment.
What it can miss, and a get routed through a fresher table would not: writes that a new owner
took before this owner applied the table that moved the partition away (a get to the old
owner misses them too), bounded by the table's propagation; and after the supervisor itself
has died, writes a new owner takes after this owner's death, up to the owner's lease.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import threading
import time
from typing import Any

from grid.local_reads import (
    DIRECTORY_MAGIC,
    HEADER,
    NAME_BYTES,
    NAME_LENGTH,
    NAMESPACE_COUNT_OFFSET,
    RETRY,
    SEQ,
    SLOT,
    STATE,
    TOO_LARGE,
    VALID_UNTIL_OFFSET,
    directory_name,
    fragment_copy,
    key_hash,
    map_segment,
    names_offset,
    namespace_name,
    probe,
    records,
    segment_name,
    segment_prefix,
)

__all__ = ["MISS", "UNPUBLISHED", "LocalReader"]

MISS = object()  # no local answer now: ask the owner
UNPUBLISHED = object()  # the owner does not publish this map (yet): ask it, and to publish
ATTEMPTS = 8  # seqlock retries before asking the owner instead
ABSENT_RETRY_S = 0.5  # a member without a directory is looked for again after this
SWEEP_S = 1.0  # how often mappings of segments no slot points at any more are dropped
_U64 = SEQ
_SERVED = HEADER.size  # the served byte of partition p is at _SERVED + p (served_offset)
_READ_ERRORS = (struct.error, IndexError, ValueError, OSError)
_NOTHING_MAPPED: dict[int, Any] = {}


class _MemberView:
    """One member's directory, its published namespaces and the segments read so far."""

    __slots__ = ("prefix", "uuid", "mm", "partition_count", "namespaces",
                 "namespaces_seen", "slots", "segments", "pointing")

    def __init__(self, prefix: str, mm: mmap.mmap) -> None:
        magic, _, _, partition_count, _, uuid, _ = HEADER.unpack_from(mm, 0)
        if magic != DIRECTORY_MAGIC:
            raise ValueError(f"{directory_name(prefix)} is not a local read directory")
        self.prefix = prefix
        self.uuid = uuid.rstrip(b"\0").decode()
        self.mm = mm
        self.partition_count = partition_count
        self.namespaces: dict[str, int] = {}
        self.namespaces_seen = 0
        self.slots: dict[int, mmap.mmap] = {}  # namespace k -> its slot segment
        self.segments: dict[int, mmap.mmap] = {}  # segment number -> mapping
        # namespace -> pid -> what its slot pointed at when last read: (arena + 1,
        # index + 1, the index's mapping, the arena's mapping), so that a read of a slot
        # that still points there looks nothing else up
        self.pointing: dict[str, dict[int, tuple[int, int, mmap.mmap, mmap.mmap]]] = {}

    def slots_of(self, namespace: str) -> mmap.mmap | None:
        k = self.namespaces.get(namespace)
        if k is None:
            count = _U64.unpack_from(self.mm, NAMESPACE_COUNT_OFFSET)[0]
            if count == self.namespaces_seen:
                return None
            base = names_offset(self.partition_count)
            for j in range(self.namespaces_seen, count):
                at = base + j * NAME_BYTES
                length = NAME_LENGTH.unpack_from(self.mm, at)[0]
                name = self.mm[at + NAME_LENGTH.size:at + NAME_LENGTH.size + length]
                self.namespaces[name.decode()] = j
            self.namespaces_seen = count
            k = self.namespaces.get(namespace)
            if k is None:
                return None
        slots = self.slots.get(k)
        if slots is None:
            slots = self.slots[k] = map_segment(namespace_name(self.prefix, k))
        return slots

    def segment(self, number: int) -> mmap.mmap:
        mm = self.segments.get(number)
        if mm is None:
            mm = self.segments[number] = map_segment(segment_name(self.prefix, number))
        return mm

    def repoint(self, namespace: str, pid: int, arena_1: int, index_1: int
                ) -> tuple[int, int, mmap.mmap, mmap.mmap]:
        """A slot points at other segments than last time: map the new ones, unmap the ones
        it left; returns what ``pointing`` now holds for it."""
        fragments = self.pointing.get(namespace)
        if fragments is None:
            fragments = self.pointing[namespace] = {}
        self._leave(fragments.pop(pid, None), (arena_1, index_1))
        now = (arena_1, index_1, self.segment(index_1 - 1), self.segment(arena_1 - 1))
        fragments[pid] = now
        return now

    def forget(self, namespace: str, pid: int) -> None:
        """Unmap what the slot pointed at when last read; the next read maps it afresh."""
        self._leave(self.pointing.get(namespace, _NOTHING_MAPPED).pop(pid, None), ())

    def _leave(self, before: tuple[int, int, Any, Any] | None, kept: tuple[int, ...]) -> None:
        if before is not None:
            for number in before[:2]:
                if number not in kept:
                    mm = self.segments.pop(number - 1, None)
                    if mm is not None:
                        mm.close()

    def sweep(self) -> None:
        """Unmap the segments of slots that point elsewhere now: a partition that moved
        away, or was compacted, is not read here again, and its retired segments would
        stay in memory for as long as this client maps them."""
        for namespace, fragments in self.pointing.items():
            slots = self.slots.get(self.namespaces.get(namespace, -1))
            for pid, before in list(fragments.items()):
                now = (0, 0) if slots is None else SLOT.unpack_from(slots, SLOT.size * pid)[2:]
                if now != before[:2]:
                    del fragments[pid]  # mapped again by the next read that needs it
                    self._leave(before, now)

    def close(self) -> None:
        for mm in [*self.segments.values(), *self.slots.values(), self.mm]:
            with contextlib.suppress(BufferError):
                mm.close()
        self.segments.clear()
        self.slots.clear()


class LocalReader:
    """Reads of published maps from members' shared memory on this host (one per client)."""

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name
        self._views: dict[str, _MemberView] = {}  # member name -> its directory
        self._asked: dict[tuple[str, str], float] = {}  # (member, map) -> when publish asked
        self._absent: dict[str, float] = {}  # member -> when its directory was not there
        self._next_sweep = 0.0
        # A client may be shared by threads: one read at a time (they share mappings).
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.oversized = 0  # of the misses: fragments past a scan's limit, left to the owner

    def get(self, namespace: str, key: bytes, pid: int, owner_uuid: str,
            owner_name: str) -> bytes | None | Any:
        """The value's bytes, None when absent, or MISS / UNPUBLISHED (ask the owner)."""
        return self._read(namespace, pid, owner_uuid, owner_name, None, probe,
                          key_hash(key), key)

    def scan(self, namespace: str, pid: int, owner_uuid: str, owner_name: str,
             max_bytes: int | None = None) -> tuple[bytes, int] | Any:
        """The partition's keys and values laid end to end (k1 v1 k2 v2 ..., as a member's
        ENTRIES reply has them) and the record count: one state of the fragment, under the
        same conditions as ``get``. Or MISS / UNPUBLISHED; MISS, too, when the keys and
        values take more than ``max_bytes`` (the owner sends such a partition in chunks)."""
        return self._read(namespace, pid, owner_uuid, owner_name, (b"", 0), records,
                          max_bytes)

    def copy_fragment(self, namespace: str, pid: int, owner_uuid: str, owner_name: str,
                      max_bytes: int | None = None) -> tuple[bytes, bytes] | None | Any:
        """``scan`` for a reader that decodes in bulk: the fragment's index table and arena
        as copied (grid/local_reads.py, ``fragment_copy``), None when there is no fragment;
        MISS when its part of the arena is larger than ``max_bytes``."""
        return self._read(namespace, pid, owner_uuid, owner_name, None, fragment_copy,
                          max_bytes)

    def _read(self, namespace: str, pid: int, owner_uuid: str, owner_name: str,
              empty: Any, read: Any, *args: Any) -> Any:
        """``read(index, arena, *args)`` of the owner's fragment inside its seqlock (``empty``
        when there is no fragment), or MISS / UNPUBLISHED."""
        lock = self._lock
        lock.acquire()
        try:
            return self._read_locked(namespace, pid, owner_uuid, owner_name, empty, read,
                                     args)
        finally:
            lock.release()

    def get_many(self, namespace: str, reads: list[tuple[int, str, str, bytes]]
                 ) -> list[bytes | None | Any]:
        """``get`` of many (pid, owner uuid, owner name, key) at once, under the same
        conditions: each owner's directory is looked up once, while its lease and served
        flags are still checked for every key. A slot that is settled and points where it
        pointed at the last read is read in line, once (a batch of 100 keys is about 80
        partitions: most of a batch's time is per key); any other goes the way ``get`` goes."""
        out: list[bytes | None | Any] = []
        append = out.append
        owners: dict[str, Any] = {}  # owner name -> (view, slots, valid until), or a miss
        monotonic = time.monotonic
        unpack_slot, unpack_seq, slot_size = SLOT.unpack_from, _U64.unpack_from, SLOT.size
        hits = 0
        with self._lock:
            for pid, owner_uuid, owner_name, key in reads:
                checked = owners.get(owner_name)
                if checked is None or (checked.__class__ is tuple
                                       and monotonic() >= checked[2]):
                    checked = owners[owner_name] = self._owner_slots(namespace, owner_uuid,
                                                                     owner_name)
                if checked.__class__ is not tuple or checked[0].mm[_SERVED + pid] != 1:
                    self.misses += 1
                    append(UNPUBLISHED if checked is UNPUBLISHED else MISS)
                    continue
                slots = checked[1]
                base = slot_size * pid
                seq, settled, arena_1, index_1 = unpack_slot(slots, base)
                view = checked[0]
                mapped = view.pointing.get(namespace, _NOTHING_MAPPED).get(pid)
                if settled and not seq & 1 and mapped is not None and mapped[0] == arena_1 \
                        and mapped[1] == index_1:
                    try:
                        value = probe(mapped[2], mapped[3], key_hash(key), key)
                    except _READ_ERRORS:
                        value = RETRY
                    if value is not RETRY and unpack_seq(slots, base)[0] == seq:
                        hits += 1
                        append(value)
                        continue
                append(self._read_slot(view, slots, namespace, pid, None, probe,
                                       (key_hash(key), key)))
            self.hits += hits
        return out

    def _read_locked(self, namespace: str, pid: int, owner_uuid: str, owner_name: str,
                     empty: Any, read: Any, args: tuple) -> Any:
        checked = self._owner_slots(namespace, owner_uuid, owner_name)
        if checked.__class__ is not tuple or checked[0].mm[_SERVED + pid] != 1:
            self.misses += 1
            return UNPUBLISHED if checked is UNPUBLISHED else MISS
        return self._read_slot(checked[0], checked[1], namespace, pid, empty, read, args)

    def _read_slot(self, view: _MemberView, slots: mmap.mmap, namespace: str, pid: int,
                   empty: Any, read: Any, args: tuple) -> Any:
        """``read`` of the fragment that partition ``pid``'s slot points at, within the
        slot's seqlock; MISS when it does not settle in ATTEMPTS tries."""
        base = SLOT.size * pid
        for _ in range(ATTEMPTS):
            seq, settled, arena_1, index_1 = SLOT.unpack_from(slots, base)
            if seq & 1:
                continue
            if not settled:
                break
            if arena_1 == 0:
                result = empty
            else:
                try:
                    mapped = view.pointing.get(namespace, _NOTHING_MAPPED).get(pid)
                    if mapped is None or mapped[0] != arena_1 or mapped[1] != index_1:
                        mapped = view.repoint(namespace, pid, arena_1, index_1)
                    result = read(mapped[2], mapped[3], *args)
                except _READ_ERRORS:
                    # A segment retired meanwhile, or bytes being rewritten; or a mapping
                    # closed by the sweep of another slot that pointed at the same segment
                    # (a fragment moved between maps): map them again on the next try.
                    view.forget(namespace, pid)
                    result = RETRY
                if result is TOO_LARGE:
                    self.oversized += 1
                    break
            if result is not RETRY and _U64.unpack_from(slots, base)[0] == seq:
                self.hits += 1
                return result
        self.misses += 1
        return MISS

    def should_ask_to_publish(self, owner_name: str, namespace: str, now: float) -> bool:
        """Whether to ask the owner to publish the map (at most once a second each)."""
        key = (owner_name, namespace)
        if now - self._asked.get(key, -1.0) < 1.0:
            return False
        self._asked[key] = now
        return True

    def _owner_slots(self, namespace: str, owner_uuid: str, owner_name: str
                     ) -> tuple[_MemberView, mmap.mmap, float] | None | Any:
        """The owner's view, the namespace's slot segment there and the end of the owner's
        lease, when the owner may be read now (its directory is this process's, not fenced,
        within its lease); None when not, UNPUBLISHED when it does not publish the
        namespace. The caller still checks that the owner serves the partition."""
        view = self._views.get(owner_name)
        if view is None or view.uuid != owner_uuid:
            view = self._open(owner_name, owner_uuid)
            if view is None:
                return None
        mm = view.mm
        valid_until, fenced = STATE.unpack_from(mm, VALID_UNTIL_OFFSET)
        if fenced:
            self._drop(owner_name)
            return None
        slots = view.slots_of(namespace)
        if slots is None:
            return UNPUBLISHED
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            for other in self._views.values():
                other.sweep()
        if now >= valid_until:
            return None
        return view, slots, valid_until

    def _open(self, name: str, uuid: str) -> _MemberView | None:
        self._drop(name)
        now = time.monotonic()
        if now - self._absent.get(name, -1.0) < ABSENT_RETRY_S:
            return None
        prefix = segment_prefix(self.cluster_name, name)
        try:
            mm = map_segment(directory_name(prefix))
        except (FileNotFoundError, ValueError, OSError):
            self._absent[name] = now  # not on this host, or publishes nothing: look later
            return None
        try:
            view = _MemberView(prefix, mm)
        except (ValueError, struct.error):
            mm.close()
            return None
        if view.uuid != uuid:  # an earlier process of that name, or not yet the new one
            view.close()
            return None
        self._views[name] = view
        return view

    def _drop(self, name: str) -> None:
        view = self._views.pop(name, None)
        if view is not None:
            view.close()

    def close(self) -> None:
        with self._lock:
            for name in list(self._views):
                self._drop(name)
