"""Segment files: their names, reading them ahead in a helper thread, and walking their records.

Everything that reads the log (recovery, the index rebuild when a store opens, compaction)
goes through scan_segment, which hands trusted runs of records to a sink and reports damage:
a torn tail is dropped, a damaged region in the middle is skipped, and neither raises.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from .records import (
    RECORD_HEAD,
    parse_block_head,
    parse_segment_head,
    record_end,
    resync,
    segment_head_bytes,
    segment_head_valid,
)

log = logging.getLogger("shmgrid.persistence")

SEGMENT_NAME = re.compile(r"^segment-(\d{10})\.log$")
COMPACTING_SUFFIX = ".compacting"
segment_id_max = 10**10 - 1
# Smaller files are read into bytes; bigger ones are mapped so values can be handed out as
# views of the page cache instead of copies.
mmap_bytes_min = 64 << 10
prefetch_segment_count = 2
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)

DAMAGE_TORN_TAIL = "torn-tail"
DAMAGE_CORRUPT = "corrupt"
DAMAGE_UNREADABLE = "unreadable"

# sink(buf, view, start, end): records in buf[start:end] are whole and their CRCs passed.
RecordSink = Callable[[bytes, memoryview, int, int], None]


def segment_file_name(segment_id: int) -> str:
    assert 0 <= segment_id <= segment_id_max
    return f"segment-{segment_id:010d}.log"


def list_segments(path: str) -> list[tuple[int, str]]:
    """(segment id, file path) of every segment in folder path, oldest first."""
    found = []
    for name in os.listdir(path):
        match = SEGMENT_NAME.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(path, name)))
    found.sort()
    return found


def split_leftovers(entries: list[tuple[int, str]]
                    ) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(segments to read, leftovers of an interrupted compaction merge), both oldest first.

    A merge of segments N..M writes N with "replaces through M" in its head and then removes
    N+1..M; files in that range found later are copies of what N already holds.
    """
    covered_through = -1
    kept, leftovers = [], []
    for segment_id, path in entries:
        if segment_id <= covered_through:
            leftovers.append((segment_id, path))
            continue
        kept.append((segment_id, path))
        head = read_segment_head(path)
        if head is not None and head[0] == segment_id:
            covered_through = max(covered_through, head[1])
    return kept, leftovers


def read_segment_head(path: str) -> tuple[int, int] | None:
    """(segment id, last segment id it replaces) from a segment file's head, or None."""
    try:
        with open(path, "rb") as file:
            head = file.read(segment_head_bytes)
    except OSError:
        return None
    return parse_segment_head(head, len(head))


@dataclass(frozen=True, slots=True)
class Damage:
    """A stretch of a segment file that recovery could not use."""

    path: str
    offset: int
    length_bytes: int
    kind: str  # DAMAGE_TORN_TAIL, DAMAGE_CORRUPT or DAMAGE_UNREADABLE

    def __str__(self) -> str:
        if self.kind == DAMAGE_TORN_TAIL and self.offset == self.length_bytes == 0:
            return f"{self.path}: empty segment file (the process died creating it)"
        if self.kind == DAMAGE_TORN_TAIL:
            what = "dropped a torn or corrupt tail"
        elif self.kind == DAMAGE_CORRUPT:
            what = "skipped a damaged region"
        else:
            what = "could not read the file"
        return f"{self.path}: {what} of {self.length_bytes} bytes at offset {self.offset}"


@dataclass(slots=True)
class SegmentBuffer:
    """One segment file's bytes, and the blocks whose payload CRC is known to match.

    verified_blocks is shared by the reader thread, which checks blocks ahead of the scan,
    and the scan, which checks any block the reader has not reached yet itself.
    """

    segment_id: int
    path: str
    data: bytes  # or an mmap, which slices, finds and unpacks like bytes
    verified_blocks: set[int] = field(default_factory=set)
    error: OSError | None = None


def load_segment(segment_id: int, path: str, verify: bool = True) -> SegmentBuffer:
    """Read or map a segment, and (if verify) check its block CRCs before returning."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size < mmap_bytes_min:
                data: bytes = file.read()
            else:
                # MAP_POPULATE maps the whole file in one go: much cheaper than a page fault
                # per 4 KB on first touch.
                data = mmap.mmap(file.fileno(), 0, flags=mmap.MAP_SHARED | _MAP_POPULATE,
                                 prot=mmap.PROT_READ)  # type: ignore[assignment]
    except OSError as exc:
        return SegmentBuffer(segment_id, path, b"", set(), exc)
    segment = SegmentBuffer(segment_id, path, data)
    if verify:
        verify_blocks(segment, None)
    return segment


def verify_blocks(segment: SegmentBuffer, stop: threading.Event | None) -> None:
    """Check the CRCs of the leading intact blocks (zlib drops the GIL for big blocks),
    skipping those the scan did already; stops at the first damage, which the scan handles.
    """
    data = segment.data
    end = len(data)
    if not segment_head_valid(data, end):
        return
    verified = segment.verified_blocks
    view = memoryview(data)
    pos = segment_head_bytes
    try:
        while pos < end and not (stop is not None and stop.is_set()):
            head = parse_block_head(data, pos, end)
            if head is None:
                return
            payload_start = pos + 32
            payload_end = payload_start + head[1]
            if pos not in verified:
                if payload_end > end \
                        or zlib.crc32(view[payload_start:payload_end]) != head[3]:
                    return
                verified.add(pos)
            pos = payload_end
    finally:
        view.release()


def read_segments(entries: Iterable[tuple[int, str]]) -> Iterator[SegmentBuffer]:
    """Segments in order, each mapped by a helper thread ahead of use, which then checks
    block CRCs while the caller scans."""
    done = object()
    loaded: queue.Queue = queue.Queue(maxsize=prefetch_segment_count)
    stop = threading.Event()

    def run() -> None:
        try:
            for segment_id, path in entries:
                if stop.is_set():
                    return
                item = load_segment(segment_id, path, verify=False)
                while not stop.is_set():
                    try:
                        loaded.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                verify_blocks(item, stop)
        finally:
            while not stop.is_set():
                try:
                    loaded.put(done, timeout=0.1)
                    break
                except queue.Full:
                    continue

    reader = threading.Thread(target=run, name="shmgrid-log-reader", daemon=True)
    reader.start()
    try:
        while True:
            item = loaded.get()
            if item is done:
                return
            yield item
    finally:
        stop.set()
        while reader.is_alive():
            with contextlib.suppress(queue.Empty):
                loaded.get(timeout=0.05)
        reader.join()


@dataclass(frozen=True, slots=True)
class ScanCount:
    record_count: int  # records handed to the sink
    block_count: int  # intact block heads seen
    seq_last: int  # highest sequence handed over (0 if none)


def scan_segment(segment: SegmentBuffer, sink: RecordSink, damages: list[Damage]
                 ) -> ScanCount:
    """Hand every intact record of the segment to sink, in order.

    Damage is appended to damages and logged; it never raises.
    """
    if segment.error is not None:
        damages.append(Damage(segment.path, 0, 0, DAMAGE_UNREADABLE))
        log.warning("%s (%s)", damages[-1], segment.error)
        return ScanCount(0, 0, 0)
    buf = segment.data
    end = len(buf)
    view = memoryview(buf)
    record_count = 0
    block_count = 0
    seq_last = 0
    pos = segment_head_bytes
    if not segment_head_valid(buf, end):
        pos = _damage(buf, view, 0, 0, end, segment.path, damages)
    verified = segment.verified_blocks
    while 0 <= pos < end:
        damage_start = pos  # a block whose payload is lost is dropped from its head on
        head = parse_block_head(buf, pos, end)
        if head is not None:
            block_count += 1
            payload_start = pos + 32
            payload_end = payload_start + head[1]
            if payload_end <= end and (
                    pos in verified
                    or zlib.crc32(view[payload_start:payload_end]) == head[3]):
                verified.add(pos)
                sink(buf, view, payload_start, payload_end)
                record_count += head[0]
                seq_last = max(seq_last, head[2])
                pos = payload_end
                continue
            pos = payload_start  # a torn or damaged block: trust each record's own CRC
        run_start = pos
        run_end = record_end(buf, view, pos, end)
        run_count = 0
        while run_end > 0:
            seq_last = max(seq_last, RECORD_HEAD.unpack_from(buf, pos)[4])
            pos = run_end
            run_count += 1
            run_end = record_end(buf, view, pos, end)
        if run_count:
            sink(buf, view, run_start, pos)
            record_count += run_count
            continue
        pos = _damage(buf, view, damage_start, pos, end, segment.path, damages)
    return ScanCount(record_count, block_count, seq_last)


def _damage(buf: bytes, view: memoryview, start: int, pos: int, end: int, path: str,
            damages: list[Damage]) -> int:
    """Record damage from start, where nothing intact begins at pos; return where intact
    data resumes, or -1 for a tail."""
    resume = resync(buf, view, pos + 1, end) if pos + 1 < end else -1
    if resume < 0:
        damages.append(Damage(path, start, end - start, DAMAGE_TORN_TAIL))
    else:
        damages.append(Damage(path, start, resume - start, DAMAGE_CORRUPT))
    log.warning("%s", damages[-1])
    return resume
