"""Compaction (seed 003's garbage collection): rewrite sealed segments without their garbage.

A segment whose garbage ratio passes the threshold is rewritten in place: its live records,
and the tombstones and clears that still hide older records, are copied in order to a new
file that replaces it by rename; small neighbours that follow are merged into the same file.
In place, not at the head of the log, so that file order stays write order: recovery then
needs no sequence comparisons, and a crash leaves either the old file or the new one.

The index is only read while deciding (in short locked chunks, so writers wait at most a few
milliseconds) and only changed after the rename, so an abandoned compaction needs no undo.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import LogInvariantError, PersistenceError
from .fileio import FileOps, fsync_dir, write_all
from .index import KEEP, LogIndex
from .records import (
    RECORD_KIND_SEQ_LENGTHS_PREFIX,
    block_payload_bytes_target,
    pack_block_head,
    pack_segment_head,
    record_head_bytes,
)
from .segment import (
    COMPACTING_SUFFIX,
    Damage,
    RecordSink,
    read_segment_head,
    read_segments,
    scan_segment,
    segment_file_name,
)

log = logging.getLogger("shmgrid.persistence")

# Records decided or released per hold of the store's lock: about a millisecond of work.
chunk_record_count = 1024


@dataclass(frozen=True, slots=True)
class SegmentUsage:
    """A sealed segment's record bytes (damage included) and how many of them are live."""

    segment_id: int
    record_bytes: int
    live_bytes: int

    @property
    def garbage_bytes(self) -> int:
        return self.record_bytes - self.live_bytes

    @property
    def garbage_ratio(self) -> float:
        return 1.0 if self.record_bytes == 0 else self.garbage_bytes / self.record_bytes


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """One rewritten run of segments."""

    segment_ids: tuple[int, ...]
    bytes_read: int
    bytes_written: int
    records_kept: int
    records_dropped: int
    damages: tuple[Damage, ...] = ()

    @property
    def bytes_reclaimed(self) -> int:
        return self.bytes_read - self.bytes_written


def choose_run(usages: list[SegmentUsage], garbage_ratio_min: float,
               segment_bytes_max: int, exclude: frozenset[int] = frozenset()) -> list[int]:
    """The ids of the next run of sealed segments to compact, or [] if none is worth it.

    The victim is the segment with the highest garbage ratio at or above the threshold (an
    empty one counts as all garbage), else the first of two adjacent small segments. Segments
    after it join while the merged live data still fits one segment and each is garbage-heavy
    or small. Segments in exclude (done in this round already) neither start nor join a run.
    """
    best_index, best_ratio = -1, -1.0
    for index, usage in enumerate(usages):
        if usage.segment_id in exclude:
            continue
        if usage.garbage_bytes <= 0 and usage.record_bytes > 0:
            continue
        ratio = usage.garbage_ratio
        if ratio >= garbage_ratio_min and ratio > best_ratio:
            best_index, best_ratio = index, ratio
    small_bytes = segment_bytes_max // 4
    if best_index < 0:
        for index in range(len(usages) - 1):
            pair = usages[index:index + 2]
            if all(u.record_bytes < small_bytes and u.segment_id not in exclude for u in pair):
                best_index = index
                break
    if best_index < 0:
        return []
    run = [usages[best_index]]
    live_bytes = run[0].live_bytes
    for usage in usages[best_index + 1:]:
        if usage.segment_id in exclude or live_bytes + usage.live_bytes > segment_bytes_max:
            break
        if usage.garbage_ratio < garbage_ratio_min and usage.record_bytes >= small_bytes * 2:
            break
        run.append(usage)
        live_bytes += usage.live_bytes
    return [usage.segment_id for usage in run]


class CompactionAborted(Exception):
    """The store is closing; the run was abandoned before anything changed."""


class CompactionIncomplete(PersistenceError):
    """A compaction failed after its new file replaced the old: the index may be off."""


def compact_run(folder: str, lock: threading.Lock, index: LogIndex,
                segment_record_bytes: dict[int, int], segment_ids: list[int],
                durable_seq: int, stop: threading.Event) -> CompactionResult:
    """Rewrite segments segment_ids (adjacent, sealed, oldest first) as one file.

    Records superseded by anything newer than durable_seq stay (see LogIndex.decide).
    Raises CompactionAborted if stop is set before the new file replaces the old ones.
    """
    assert segment_ids == sorted(set(segment_ids))
    paths = [(segment_id, os.path.join(folder, segment_file_name(segment_id)))
             for segment_id in segment_ids]
    target_id = segment_ids[0]
    # Keep the widest "replaces through" of the inputs: should an earlier merge have failed
    # to remove one of its inputs, that file must stay recognisable as a leftover.
    through_id = max([segment_ids[-1]] + [
        head[1] for head in map(read_segment_head, (path for _id, path in paths)) if head])
    refs: list[tuple] = []  # (segment id, start, end, kind, seq, prefix, key)
    views: dict[int, memoryview] = {}
    damages: list[Damage] = []
    bytes_read = 0
    for segment in read_segments(paths):
        views[segment.segment_id] = memoryview(segment.data)
        bytes_read += len(segment.data)
        scan_segment(segment, _collect_sink(refs, segment.segment_id), damages)
    decisions = _decide(lock, index, refs, durable_seq, stop)
    kept = [ref for ref, decision in zip(refs, decisions, strict=True) if decision == KEEP]
    target_path = paths[0][1]
    bytes_written = 0
    if kept:
        temp_path = target_path + COMPACTING_SUFFIX
        try:
            bytes_written = _write_output(temp_path, target_id, through_id, kept, views)
            if stop.is_set():
                raise CompactionAborted()
            os.replace(temp_path, target_path)
        except BaseException:
            _unlink_quietly(temp_path)
            raise
        removed = paths[1:]
    else:
        if stop.is_set():
            raise CompactionAborted()
        removed = paths
    views.clear()
    try:
        _finish(folder, lock, index, segment_record_bytes, refs, decisions, kept, removed,
                target_id)
    except BaseException as exc:
        raise CompactionIncomplete(
            f"compaction of segments {segment_ids} in {folder} failed after replacing "
            f"files ({exc!r}); background compaction stops until the store is reopened"
        ) from exc
    return CompactionResult(tuple(segment_ids), bytes_read, bytes_written, len(kept),
                            len(refs) - len(kept), tuple(damages))


def _finish(folder: str, lock: threading.Lock, index: LogIndex,
            segment_record_bytes: dict[int, int], refs: list[tuple], decisions: bytearray,
            kept: list[tuple], removed: list[tuple[int, str]], target_id: int) -> None:
    if kept:
        fsync_dir(folder)
    for _segment_id, path in removed:
        # In order, each removal durable before the next: every prefix of them leaves a log
        # that recovers to the same state.
        _unlink_quietly(path)
        fsync_dir(folder)
    _release(lock, index, refs, decisions, target_id)
    with lock:
        for segment_id, _path in removed:
            index.forget_segment(segment_id)
            segment_record_bytes.pop(segment_id, None)
        if kept:
            segment_record_bytes[target_id] = sum(ref[2] - ref[1] for ref in kept)


def yield_to_writers() -> None:
    """Let other threads run now. Compaction is pure Python on its own thread: without this it
    keeps the GIL for whole switch intervals (5 ms) at a time, and a writer's put() waits
    several of them (p99 21 ms measured); with it, between chunks of about a millisecond."""
    time.sleep(0)


def _collect_sink(refs: list[tuple], segment_id: int) -> RecordSink:
    unpack = RECORD_KIND_SEQ_LENGTHS_PREFIX.unpack_from
    append = refs.append

    def sink(buf: bytes, view: memoryview, start: int, end: int) -> None:
        off = start
        while off < end:
            kind, seq, key_bytes, value_bytes, prefix = unpack(buf, off)
            key_start = off + record_head_bytes
            stop = key_start + key_bytes + value_bytes
            append((segment_id, off, stop, kind, seq, prefix,
                    buf[key_start:key_start + key_bytes]))
            off = stop
        if off != end:
            raise LogInvariantError(f"records of a checked block end at {off}, not {end}")
        yield_to_writers()

    return sink


def _decide(lock: threading.Lock, index: LogIndex, refs: list[tuple], durable_seq: int,
            stop: threading.Event) -> bytearray:
    decisions = bytearray(len(refs))
    pending_keys: dict[tuple[int, bytes], int] = {}
    pending_clears: dict[int, int] = {}
    decide = index.decide
    for chunk_start in range(0, len(refs), chunk_record_count):
        if stop.is_set():
            raise CompactionAborted()
        with lock:
            for position in range(chunk_start, min(chunk_start + chunk_record_count, len(refs))):
                segment_id, _start, _end, kind, seq, prefix, key = refs[position]
                decisions[position] = decide(kind, seq, prefix, key, segment_id, durable_seq,
                                             pending_keys, pending_clears)
        yield_to_writers()
    return decisions


def _release(lock: threading.Lock, index: LogIndex, refs: list[tuple], decisions: bytearray,
             target_id: int) -> None:
    release = index.release
    for chunk_start in range(0, len(refs), chunk_record_count):
        with lock:
            for position in range(chunk_start, min(chunk_start + chunk_record_count, len(refs))):
                segment_id, _start, _end, kind, seq, prefix, key = refs[position]
                release(decisions[position], kind, seq, prefix, key, segment_id, target_id)
        yield_to_writers()


def _write_output(path: str, segment_id: int, through_id: int, kept: list[tuple],
                  views: dict[int, memoryview]) -> int:
    """Write the kept records as a segment file (fsynced); returns its size."""
    ops = FileOps()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = write_all(ops, fd, [pack_segment_head(segment_id, through_id)])
        for pieces, payload_bytes, record_count, seq_last in _blocks(kept, views):
            payload = b"".join(pieces)
            assert len(payload) == payload_bytes
            head = pack_block_head(record_count, payload_bytes, seq_last, zlib.crc32(payload))
            written += write_all(ops, fd, [head, payload])
            yield_to_writers()
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def _blocks(kept: list[tuple], views: dict[int, memoryview]
            ) -> Iterator[tuple[list[memoryview], int, int, int]]:
    pieces: list[memoryview] = []
    payload_bytes = 0
    seq_last = 0
    for segment_id, start, end, _kind, seq, _prefix, _key in kept:
        pieces.append(views[segment_id][start:end])
        payload_bytes += end - start
        seq_last = seq
        if payload_bytes >= block_payload_bytes_target:
            yield pieces, payload_bytes, len(pieces), seq_last
            pieces, payload_bytes = [], 0
    if pieces:
        yield pieces, payload_bytes, len(pieces), seq_last


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
