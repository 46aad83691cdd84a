"""Damage to the log: recovery returns everything intact, reports what it dropped, and never
raises; a store opened on a damaged log keeps working."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persistence import LogStore, make_prefix
from persistence.segment import (
    DAMAGE_CORRUPT,
    DAMAGE_TORN_TAIL,
    DAMAGE_UNREADABLE,
    load_segment,
    scan_segment,
)
from tests.persistence.helpers import recovered, recovered_with_report, segment_files

P = make_prefix(4, 2)
VALUE_BYTES = 60


def value_of(index: int) -> bytes:
    return (b"%04d-" % index) * (VALUE_BYTES // 5)


def write_log(path: str, record_count: int, segment_bytes: int = 64 << 20,
              flush_each: bool = False) -> dict[tuple[int, bytes], bytes]:
    """Distinct keys, so any damage can only remove records, never revive old values."""
    written = {}
    with LogStore(path, segment_bytes=segment_bytes, background_compaction=False) as store:
        for index in range(record_count):
            store.put(P, b"key%04d" % index, value_of(index))
            written[(P, b"key%04d" % index)] = value_of(index)
            if flush_each:
                store.flush()
    return written


def last_segment(path: str) -> str:
    return os.path.join(path, segment_files(path)[-1])


def record_spans(segment_path: str) -> list[tuple[int, int, bytes]]:
    """(start, end, key) of every record in an intact segment file, in order."""
    spans: list[tuple[int, int, bytes]] = []

    def sink(buf: bytes, view: memoryview, start: int, end: int) -> None:
        off = start
        while off < end:
            key_bytes, value_bytes = struct.unpack_from("<II", buf, off + 16)
            stop = off + 32 + key_bytes + value_bytes
            spans.append((off, stop, bytes(buf[off + 32:off + 32 + key_bytes])))
            off = stop

    damages: list = []
    scan_segment(load_segment(0, segment_path), sink, damages)
    assert damages == []
    return spans


def test_truncating_the_last_record_at_every_offset(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    written = write_log(path, 20, flush_each=True)  # the last record is a block of its own
    last_key = (P, b"key0019")
    before = {k: v for k, v in written.items() if k != last_key}
    segment = last_segment(path)
    size = os.path.getsize(segment)
    record_bytes = 32 + len(b"key0019") + VALUE_BYTES
    block_start = size - record_bytes - 32
    assert recovered(path) == written
    for cut in range(size - 1, block_start - 1, -1):
        os.truncate(segment, cut)
        items, recovery = recovered_with_report(path)
        assert items == before, cut
        if cut == block_start:
            assert recovery.damages == []
        else:
            [damage] = recovery.damages
            assert damage.kind == DAMAGE_TORN_TAIL
            assert damage.path == segment
            assert damage.length_bytes == cut - damage.offset
            assert damage.offset == block_start  # the block head goes with its lost payload


def test_truncating_a_batch_keeps_every_whole_record_before_the_cut(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    written = write_log(path, 30)
    segment = last_segment(path)
    spans = record_spans(segment)
    assert len(spans) == 30
    for cut in range(os.path.getsize(segment) - 1, spans[0][0] - 1, -7):
        os.truncate(segment, cut)
        expected = {(P, key): written[(P, key)] for _start, end, key in spans if end <= cut}
        assert recovered(path) == expected, cut


def test_flipping_any_byte_of_a_middle_record_loses_only_that_record(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    written = write_log(path, 120, segment_bytes=2048)
    segments = segment_files(path)
    assert len(segments) >= 5
    middle = os.path.join(path, segments[len(segments) // 2])
    data = Path(middle).read_bytes()
    start, end, key = record_spans(middle)[1]
    expected = {k: v for k, v in written.items() if k != (P, key)}
    for index in range(start, end):
        damaged = bytearray(data)
        damaged[index] ^= 0x5A
        Path(middle).write_bytes(bytes(damaged))
        items, recovery = recovered_with_report(path)
        assert items == expected, index
        assert [d.kind for d in recovery.damages] == [DAMAGE_CORRUPT]
        assert recovery.damages[0].path == middle
    Path(middle).write_bytes(data)
    assert recovered(path) == written


@pytest.mark.parametrize("where", ["segment head", "block head"])
def test_damaged_heads_lose_no_records(tmp_path: Path, where: str) -> None:
    path = str(tmp_path / "log")
    written = write_log(path, 50, segment_bytes=2048)
    middle = os.path.join(path, segment_files(path)[2])
    data = bytearray(Path(middle).read_bytes())
    data[3 if where == "segment head" else 32 + 5] ^= 0xFF
    Path(middle).write_bytes(bytes(data))
    items, recovery = recovered_with_report(path)
    assert items == written
    assert [d.kind for d in recovery.damages] == [DAMAGE_CORRUPT]


def test_an_unreadable_segment_is_reported_and_skipped(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    written = write_log(path, 10)
    os.mkdir(os.path.join(path, "segment-0000000099.log"))
    items, recovery = recovered_with_report(path)
    assert items == written
    assert [d.kind for d in recovery.damages] == [DAMAGE_UNREADABLE]


def test_a_store_opened_on_a_torn_log_keeps_working(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    written = write_log(path, 40, segment_bytes=1024)
    segment = last_segment(path)
    os.truncate(segment, os.path.getsize(segment) - 10)
    lost = (P, b"key0039")
    del written[lost]
    with LogStore(path, segment_bytes=1024, background_compaction=False) as store:
        assert store.stats().damage_count == 1
        store.put(P, b"after", b"crash")
        store._check_index()
        store.compact(0.0)
        store._check_index()
    written[(P, b"after")] = b"crash"
    items, recovery = recovered_with_report(path)
    assert items == written
    assert recovery.damages == []  # compaction rewrote the torn segment


damage_steps = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
        st.tuples(st.just("zero"), st.floats(0, 1, exclude_max=True), st.integers(1, 300)),
        st.tuples(st.just("cut"), st.floats(0, 1, exclude_max=True)),
        st.tuples(st.just("insert"), st.floats(0, 1, exclude_max=True), st.binary(max_size=90)),
    ),
    min_size=1, max_size=4)


@settings(database=None, max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(damage_steps, st.integers(0, 3))
def test_random_damage_never_raises_and_never_invents(tmp_path: Path, steps: list[tuple],
                                                      segment_index: int) -> None:
    template = tmp_path / "template"
    if not template.exists():
        write_log(str(template), 80, segment_bytes=2048)
    path = tmp_path / "damaged"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(template, path)
    written = recovered(str(template))
    segment = path / segment_files(str(path))[segment_index]
    data = bytearray(segment.read_bytes())
    for step in steps:
        at = int(step[1] * max(1, len(data)))
        if step[0] == "flip" and data:
            data[at] ^= step[2]
        elif step[0] == "zero":
            data[at:at + step[2]] = bytes(len(data[at:at + step[2]]))
        elif step[0] == "cut":
            del data[at:]
        elif step[0] == "insert":
            data[at:at] = step[2]
    segment.write_bytes(bytes(data))
    items, recovery = recovered_with_report(str(path))
    assert items.items() <= written.items()
    other_segments = [s for s in segment_files(str(path)) if s != segment.name]
    assert all(d.path == str(segment) for d in recovery.damages), other_segments
    with LogStore(str(path), segment_bytes=2048, background_compaction=False) as store:
        store.put(P, b"new", b"value")
        store._check_index()
        store.compact(0.0)
        store._check_index()
    after = recovered(str(path))
    assert after == {**items, (P, b"new"): b"value"}
