"""What is live in the log, per key, and how many bytes of each segment are live.

Pure bookkeeping, no I/O. The store calls it (under its lock) for every record it appends,
the rebuild on open calls it for every record it reads, and compaction asks it which
records of a segment to keep and then tells it which ones left the disk.

Each key's entry points at its newest record and counts the key's dead records still on
disk. A tombstone may leave the disk only when that count is zero: otherwise an older
record of the key, still in some segment, would come back at recovery. A clear record keeps
the same count for every record of its prefix written before it.
"""

from __future__ import annotations

from .errors import LogInvariantError
from .records import KIND_CLEAR, KIND_PUT, KIND_TOMBSTONE

# One int per entry keeps the heap small: seq | dead count | segment id | size | tombstone.
_MASK32 = (1 << 32) - 1
_SIZE_SHIFT = 1
_SEGMENT_SHIFT = 33
_DEAD_SHIFT = 65
_SEQ_SHIFT = 97

# Compaction decisions.
KEEP = 0
DROP_DEAD = 1  # superseded, by a newer record of its key or a clear of its prefix
DROP_OBSOLETE = 2  # a live tombstone or clear with nothing older left for it to hide


def pack_entry(seq: int, segment_id: int, size: int, dead_count: int, tombstone: bool) -> int:
    assert 0 <= segment_id <= _MASK32
    assert 0 < size <= _MASK32
    assert 0 <= dead_count <= _MASK32
    return (seq << _SEQ_SHIFT | dead_count << _DEAD_SHIFT | segment_id << _SEGMENT_SHIFT
            | size << _SIZE_SHIFT | int(tombstone))


def unpack_entry(entry: int) -> tuple[int, int, int, int, bool]:
    """(seq, segment id, size, dead count, tombstone) of a packed entry."""
    return (entry >> _SEQ_SHIFT, entry >> _SEGMENT_SHIFT & _MASK32, entry >> _SIZE_SHIFT & _MASK32,
            entry >> _DEAD_SHIFT & _MASK32, bool(entry & 1))


def _counts_live(entry: int) -> bool:
    """A put is live; a tombstone or clear only while something older needs hiding."""
    return not entry & 1 or entry >> _DEAD_SHIFT & _MASK32 > 0


class LogIndex:
    """Per-key entries, per-prefix clears and per-segment live bytes of one log."""

    def __init__(self) -> None:
        self.keys: dict[int, dict[bytes, int]] = {}
        self.clears: dict[int, int] = {}
        self.live_bytes: dict[int, int] = {}
        self.put_count = 0
        self.tombstone_count = 0
        self.seq_last = 0  # set by whoever fills the index from disk; puts don't track it

    # -- records appended (or read back in order) -------------------------------------

    def add(self, kind: int, seq: int, prefix: int, key: bytes, segment_id: int,
            size: int) -> None:
        """Account for a record appended to segment_id; records come in log order."""
        if kind == KIND_CLEAR:
            self._add_clear(seq, prefix, segment_id, size)
        else:
            self.add_key_record(seq, prefix, key, segment_id, size, kind == KIND_TOMBSTONE)

    def add_key_record(self, seq: int, prefix: int, key: bytes, segment_id: int, size: int,
                       tombstone: bool) -> None:
        """add() for a put or a tombstone: the hot path of every put."""
        keys = self.keys.get(prefix)
        if keys is None:
            keys = self.keys[prefix] = {}
        old = keys.get(key)
        live_bytes = self.live_bytes
        if old is None:
            dead_count = 0
        else:
            old_size = old >> _SIZE_SHIFT & _MASK32
            if not old & 1 or old >> _DEAD_SHIFT & _MASK32:
                live_bytes[old >> _SEGMENT_SHIFT & _MASK32] -= old_size
            if old & 1:
                self.tombstone_count -= 1
            else:
                self.put_count -= 1
            dead_count = (old >> _DEAD_SHIFT & _MASK32) + 1
            if dead_count > _MASK32:
                raise LogInvariantError("a key has 2**32 dead records; compaction is stuck")
        keys[key] = (seq << _SEQ_SHIFT | dead_count << _DEAD_SHIFT | segment_id << _SEGMENT_SHIFT
                     | size << _SIZE_SHIFT | tombstone)
        if tombstone:
            self.tombstone_count += 1
            if not dead_count:
                return
        else:
            self.put_count += 1
        live_bytes[segment_id] = live_bytes.get(segment_id, 0) + size

    def _add_clear(self, seq: int, prefix: int, segment_id: int, size: int) -> None:
        dead_count = 0
        keys = self.keys.pop(prefix, None)
        if keys:
            live_bytes = self.live_bytes
            for entry in keys.values():
                _seq, old_segment, old_size, old_dead, old_tombstone = unpack_entry(entry)
                dead_count += 1 + old_dead
                if _counts_live(entry):
                    live_bytes[old_segment] -= old_size
                if old_tombstone:
                    self.tombstone_count -= 1
                else:
                    self.put_count -= 1
        old = self.clears.get(prefix)
        if old is not None:
            _seq, old_segment, old_size, old_dead, _ = unpack_entry(old)
            dead_count += 1 + old_dead
            if _counts_live(old):
                self.live_bytes[old_segment] -= old_size
        entry = pack_entry(seq, segment_id, size, dead_count, True)
        self.clears[prefix] = entry
        if _counts_live(entry):
            self.live_bytes[segment_id] = self.live_bytes.get(segment_id, 0) + size

    # -- compaction ----------------------------------------------------------------------

    def decide(self, kind: int, seq: int, prefix: int, key: bytes, segment_id: int,
               durable_seq: int, pending_keys: dict[tuple[int, bytes], int],
               pending_clears: dict[int, int]) -> int:
        """KEEP, DROP_DEAD or DROP_OBSOLETE for a record of a segment being compacted.

        A dead record is dropped only if what superseded it is durable (seq <= durable_seq):
        dropping K=1 because of a K=2 still in the writer's queue would lose K altogether in
        a crash. Records of the compacted run come in log order; pending_* count the dead
        records already chosen for dropping, so a tombstone after them in the run may go
        too. Never mutates the index: a failed compaction leaves nothing to undo.
        """
        clear = self.clears.get(prefix)
        clear_seq = -1 if clear is None else clear >> _SEQ_SHIFT
        if kind == KIND_CLEAR:
            if clear is not None and _same_record(clear, seq, segment_id):
                dead = (clear >> _DEAD_SHIFT & _MASK32) - pending_clears.get(prefix, 0)
                if dead < 0:
                    raise LogInvariantError(f"prefix {prefix:#x}: negative pending count")
                return DROP_OBSOLETE if dead == 0 else KEEP
            if clear is None or clear_seq > durable_seq:
                return KEEP  # dead, but its killer may not survive a crash yet
            pending_clears[prefix] = pending_clears.get(prefix, 0) + 1
            return DROP_DEAD
        if seq < clear_seq:
            if clear_seq > durable_seq:
                return KEEP
            pending_clears[prefix] = pending_clears.get(prefix, 0) + 1
            return DROP_DEAD
        keys = self.keys.get(prefix)
        entry = None if keys is None else keys.get(key)
        if entry is None:
            raise LogInvariantError(
                f"record seq {seq} of prefix {prefix:#x} in segment {segment_id} has no entry")
        if not _same_record(entry, seq, segment_id):
            if entry >> _SEQ_SHIFT > durable_seq:
                return KEEP
            pending = pending_keys.get((prefix, key), 0) + 1
            pending_keys[(prefix, key)] = pending
            return DROP_DEAD
        if kind == KIND_PUT:
            return KEEP
        if not entry & 1:
            raise LogInvariantError(f"tombstone seq {seq} is indexed as a put")
        dead = (entry >> _DEAD_SHIFT & _MASK32) - pending_keys.get((prefix, key), 0)
        if dead < 0:
            raise LogInvariantError(f"key of prefix {prefix:#x}: negative pending count")
        return DROP_OBSOLETE if dead == 0 else KEEP

    def release(self, decision: int, kind: int, seq: int, prefix: int, key: bytes,
                segment_id: int, target_segment_id: int) -> None:
        """Account for a compaction that has replaced segment_id's file (rename done).

        Kept records now live in target_segment_id. The index may have changed since
        decide(): a record kept or judged obsolete may have died meanwhile.
        """
        if decision == KEEP:
            if segment_id != target_segment_id:
                self._move(kind, seq, prefix, key, segment_id, target_segment_id)
            return
        if decision == DROP_OBSOLETE:
            if kind == KIND_CLEAR:
                clear = self.clears.get(prefix)
                if clear is not None and _same_record(clear, seq, segment_id):
                    if clear >> _DEAD_SHIFT & _MASK32:
                        raise LogInvariantError(f"dropped a needed clear of {prefix:#x}")
                    del self.clears[prefix]
                    return
            else:
                keys = self.keys.get(prefix)
                entry = None if keys is None else keys.get(key)
                if entry is not None and _same_record(entry, seq, segment_id):
                    if entry >> _DEAD_SHIFT & _MASK32:
                        raise LogInvariantError(f"dropped a needed tombstone of {prefix:#x}")
                    del keys[key]
                    if not keys:
                        del self.keys[prefix]
                    self.tombstone_count -= 1
                    return
        self._release_dead(kind, seq, prefix, key)

    def _release_dead(self, kind: int, seq: int, prefix: int, key: bytes) -> None:
        clear = self.clears.get(prefix)
        if kind == KIND_CLEAR or (clear is not None and seq < clear >> _SEQ_SHIFT):
            if clear is None:
                raise LogInvariantError(f"dead record seq {seq} of {prefix:#x}: no clear")
            clear_seq, segment_id, size, dead, _ = unpack_entry(clear)
            if dead == 0:
                raise LogInvariantError(f"clear of {prefix:#x} counts no dead records")
            self.clears[prefix] = pack_entry(clear_seq, segment_id, size, dead - 1, True)
            if dead == 1:
                self.live_bytes[segment_id] -= size
            return
        keys = self.keys.get(prefix)
        entry = None if keys is None else keys.get(key)
        if entry is None:
            raise LogInvariantError(f"dead record seq {seq} of {prefix:#x} has no entry")
        entry_seq, segment_id, size, dead, tombstone = unpack_entry(entry)
        if dead == 0:
            raise LogInvariantError(f"key entry of {prefix:#x} counts no dead records")
        keys[key] = pack_entry(entry_seq, segment_id, size, dead - 1, tombstone)
        if tombstone and dead == 1:
            self.live_bytes[segment_id] -= size

    def _move(self, kind: int, seq: int, prefix: int, key: bytes, source_segment_id: int,
              target_segment_id: int) -> None:
        if kind == KIND_CLEAR:
            entry = self.clears.get(prefix)
        else:
            keys = self.keys.get(prefix)
            entry = None if keys is None else keys.get(key)
        if entry is None or not _same_record(entry, seq, source_segment_id):
            return  # it died after decide(); its bytes already left the live count
        entry_seq, _segment, size, dead, tombstone = unpack_entry(entry)
        moved = pack_entry(entry_seq, target_segment_id, size, dead, tombstone)
        if kind == KIND_CLEAR:
            self.clears[prefix] = moved
        else:
            keys[key] = moved  # type: ignore[index]
        if _counts_live(moved):
            self.live_bytes[source_segment_id] -= size
            self.live_bytes[target_segment_id] = self.live_bytes.get(target_segment_id, 0) + size

    def forget_segment(self, segment_id: int) -> None:
        """A segment file is gone; nothing live may have been left in it."""
        left = self.live_bytes.pop(segment_id, 0)
        if left != 0:
            raise LogInvariantError(f"segment {segment_id} removed with {left} live bytes")


def _same_record(entry: int, seq: int, segment_id: int) -> bool:
    return entry >> _SEQ_SHIFT == seq and entry >> _SEGMENT_SHIFT & _MASK32 == segment_id
