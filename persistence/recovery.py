"""Recovery mode: the newest live value of every key in a log folder (seed 003).

Segments are read in file order, and file order is write order: the writer appends in
sequence order and compaction rewrites a segment in place, keeping its records' order. So
the last record of a key wins and a clear removes everything of its prefix seen before it;
no sequence numbers need comparing. That keeps the per-record work to one unpack, two slices
and a dict store (about a microsecond of CPython per record), while a helper thread maps the
next segment and checks its block CRCs.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from itertools import chain, repeat

from .errors import LogInvariantError, StoreLockedError
from .fileio import lock_folder, unlock_folder
from .records import (
    KIND_PUT,
    KIND_TOMBSTONE,
    RECORD_KIND_LENGTHS_PREFIX,
    record_head_bytes,
)
from .segment import (
    Damage,
    RecordSink,
    list_segments,
    read_segments,
    scan_segment,
    split_leftovers,
)

Item = tuple[int, bytes, bytes | memoryview]


class Recovery:
    """What a log folder holds: iterate it once for (prefix, key, value) of each live key.

    Values are read-only memoryviews of the mapped segment files unless copy_values was set:
    copy what you keep past the loop (the member copies each into shared memory anyway).
    After construction, damages lists what recovery dropped or skipped (also logged as
    warnings), and record_count, segment_count, live_count and seq_last describe the log.
    Iterating a Recovery yields its items at C speed: iter() returns the inner iterator.
    """

    def __init__(self, path: str, *, copy_values: bool = False) -> None:
        self.path = path
        self.damages: list[Damage] = []
        self.record_count = 0
        self.segment_count = 0
        self.seq_last = 0
        live: dict[int, dict[bytes, bytes | memoryview]] = {}
        if os.path.isdir(path):
            self._read(path, live, copy_values)
        self.live_count = sum(map(len, live.values()))
        self._items: Iterator[Item] = chain.from_iterable(map(_prefix_items, live.items()))

    def _read(self, path: str, live: dict, copy_values: bool) -> None:
        try:
            lock_fd = lock_folder(path, exclusive=False)
        except BlockingIOError:
            raise StoreLockedError(path) from None
        gc_was_enabled = gc.isenabled()
        # Millions of memoryviews are GC-tracked; collections while the dict grows would
        # each walk all of them.
        gc.disable()
        try:
            sink = _value_sink(live, copy_values)
            entries, _leftovers = split_leftovers(list_segments(path))
            for segment in read_segments(entries):
                count = scan_segment(segment, sink, self.damages)
                self.segment_count += 1
                self.record_count += count.record_count
                self.seq_last = max(self.seq_last, count.seq_last)
        finally:
            if gc_was_enabled:
                gc.enable()
            unlock_folder(lock_fd)

    def __iter__(self) -> Iterator[Item]:
        return self._items

    def __next__(self) -> Item:
        return next(self._items)


def _prefix_items(item: tuple[int, dict]) -> Iterator[Item]:
    prefix, keys = item
    return zip(repeat(prefix), keys.keys(), keys.values())


def _value_sink(live: dict, copy_values: bool) -> RecordSink:
    unpack = RECORD_KIND_LENGTHS_PREFIX.unpack_from
    head_bytes = record_head_bytes
    get = live.get
    assert (KIND_PUT, KIND_TOMBSTONE) == (1, 2)  # literals below, to save global lookups

    def sink(buf: bytes, view: memoryview, start: int, end: int) -> None:
        source = buf if copy_values else view
        off = start
        while off < end:
            kind, key_bytes, value_bytes, prefix = unpack(buf, off)
            key_start = off + head_bytes
            value_start = key_start + key_bytes
            off = value_start + value_bytes
            if kind == 1:
                try:
                    get(prefix)[buf[key_start:value_start]] = source[value_start:off]
                except TypeError:  # first record of this prefix: get() returned None
                    live[prefix] = {buf[key_start:value_start]: source[value_start:off]}
            elif kind == 2:
                keys = get(prefix)
                if keys is not None:
                    keys.pop(buf[key_start:value_start], None)
            else:
                live.pop(prefix, None)
        if off != end:
            raise LogInvariantError(
                f"records of a checked block end at {off}, not at the block end {end}")

    return sink
