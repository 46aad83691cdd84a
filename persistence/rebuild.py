"""Opening an existing log: clear away leftovers and rebuild the index from the segments."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from .errors import LogInvariantError
from .index import LogIndex
from .records import (
    KIND_CLEAR,
    KIND_TOMBSTONE,
    RECORD_KIND_SEQ_LENGTHS_PREFIX,
    block_head_bytes,
    record_head_bytes,
    segment_head_bytes,
)
from .segment import (
    COMPACTING_SUFFIX,
    Damage,
    RecordSink,
    list_segments,
    read_segments,
    scan_segment,
    split_leftovers,
)

log = logging.getLogger("shmgrid.persistence")


@dataclass(slots=True)
class RebuiltLog:
    """What opening a folder found in it."""

    index: LogIndex
    segment_bytes: dict[int, int]  # segment id -> bytes of records and damage in the file
    segment_id_last: int
    damages: list[Damage] = field(default_factory=list)
    record_count: int = 0


def remove_leftovers(path: str) -> None:
    """Delete unfinished compaction outputs and the inputs of a merge that did finish."""
    for name in os.listdir(path):
        if name.endswith(COMPACTING_SUFFIX):
            log.info("removing unfinished compaction output %s", name)
            os.unlink(os.path.join(path, name))
    _kept, leftovers = split_leftovers(list_segments(path))
    for segment_id, segment_path in leftovers:
        log.info("removing segment %d, already merged by an interrupted compaction", segment_id)
        os.unlink(segment_path)


def rebuild(path: str) -> RebuiltLog:
    """Read every segment in order and account for every record in a fresh index."""
    entries, leftovers = split_leftovers(list_segments(path))
    if leftovers:
        raise LogInvariantError(f"{path}: remove_leftovers must run before rebuild")
    rebuilt = RebuiltLog(LogIndex(), {}, -1)
    for segment_id, _path in entries:
        rebuilt.segment_id_last = max(rebuilt.segment_id_last, segment_id)
    for segment in read_segments(entries):
        sink = _index_sink(rebuilt.index, segment.segment_id)
        count = scan_segment(segment, sink, rebuilt.damages)
        rebuilt.record_count += count.record_count
        rebuilt.index.seq_last = max(rebuilt.index.seq_last, count.seq_last)
        # Record bytes, and damaged bytes, which are garbage; block heads are neither.
        rebuilt.segment_bytes[segment.segment_id] = max(
            0, len(segment.data) - segment_head_bytes - count.block_count * block_head_bytes)
        rebuilt.index.live_bytes.setdefault(segment.segment_id, 0)
    return rebuilt


def _index_sink(index: LogIndex, segment_id: int) -> RecordSink:
    unpack = RECORD_KIND_SEQ_LENGTHS_PREFIX.unpack_from
    add = index.add
    add_key_record = index.add_key_record
    head_bytes = record_head_bytes

    def sink(buf: bytes, view: memoryview, start: int, end: int) -> None:
        off = start
        while off < end:
            kind, seq, key_bytes, value_bytes, prefix = unpack(buf, off)
            key_start = off + head_bytes
            key_end = key_start + key_bytes
            stop = key_end + value_bytes
            if kind == KIND_CLEAR:
                add(kind, seq, prefix, b"", segment_id, stop - off)
            else:
                add_key_record(seq, prefix, buf[key_start:key_end], segment_id, stop - off,
                               kind == KIND_TOMBSTONE)
            off = stop
        if off != end:
            raise LogInvariantError(
                f"records of a checked block end at {off}, not at the block end {end}")

    return sink
