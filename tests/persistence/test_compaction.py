"""Compaction on real files: garbage goes, recovery is unchanged, tombstones and clears stay
exactly as long as something older needs hiding, crashes mid-way leave a readable log."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persistence import LogStore, make_prefix
from persistence.compactor import SegmentUsage, choose_run
from persistence.rebuild import rebuild
from persistence.segment import COMPACTING_SUFFIX, segment_file_name
from tests.persistence.helpers import Model, apply_op, recovered, segment_files

P = make_prefix(9, 1)
Q = make_prefix(9, 2)


def quiet_store(path: str, **options: object) -> LogStore:
    """A store that compacts only when told to."""
    return LogStore(path, background_compaction=False, **options)  # type: ignore[arg-type]


def records_on_disk(path: str) -> int:
    """Records in the segment files (rebuild takes no lock, so the store may be open)."""
    return rebuild(path).record_count


def test_choose_run_prefers_the_most_garbage_and_merges_small_neighbours() -> None:
    usages = [SegmentUsage(1, 1000, 900), SegmentUsage(2, 1000, 100), SegmentUsage(3, 1000, 400),
              SegmentUsage(4, 100, 100), SegmentUsage(6, 1000, 1000)]
    assert choose_run(usages, 0.5, 1000) == [2, 3, 4]
    assert choose_run(usages, 0.95, 1000) == []
    assert choose_run(usages, 0.5, 1000, exclude=frozenset({2})) == [3, 4]
    small = [SegmentUsage(1, 10, 10), SegmentUsage(2, 10, 10), SegmentUsage(3, 900, 900)]
    assert choose_run(small, 0.5, 1000) == [1, 2]
    assert choose_run([SegmentUsage(5, 0, 0)], 0.5, 1000) == [5]  # an empty file goes


def test_compaction_reclaims_overwritten_data(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    model = Model()
    with quiet_store(path, segment_bytes=4096) as store:
        for i in range(2000):
            op = ("put", P, b"k%d" % (i % 20), b"v%d" % i * 5)
            apply_op(store, op)
            model.apply(op)
        store.flush()
        before = store.stats()
        results = store.compact()
        after = store.stats()
        store._check_index()
    assert results
    assert sum(r.bytes_reclaimed for r in results) > 0
    assert after.garbage_bytes < before.garbage_bytes / 10
    assert after.live_bytes == before.live_bytes
    assert after.compaction_count == len(results)
    assert after.segment_count < before.segment_count
    assert recovered(path) == model.items


def test_tombstone_outlives_the_record_it_hides(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with quiet_store(path, segment_bytes=1024) as store:
        store.put(P, b"gone", b"x" * 900)
        store.put(Q, b"filler", b"f" * 900)  # segment 0 is full: the rest goes to segment 1
        store.remove(P, b"gone")
        for i in range(30):
            store.put(Q, b"churn", b"%d" % i * 30)  # makes segment 1 mostly garbage
        store.put(Q, b"roll", b"r" * 900)
        store.flush()
        store.compact(0.5)  # segment 1 only: segment 0 is mostly live
        store.flush()
        assert records_on_disk(path) >= 4  # gone, filler, the tombstone, churn, roll
        store.put(Q, b"filler", b"changed")  # now segment 0 is mostly garbage
        store.flush()
        store.compact(0.5)  # segment 0 goes, and with it the record the tombstone hid
        store.compact(0.0)  # so the tombstone goes too
        store._check_index()
        assert store.stats().tombstone_count == 0
    assert recovered(path) == {(Q, b"churn"): b"29" * 30, (Q, b"roll"): b"r" * 900,
                               (Q, b"filler"): b"changed"}


def test_clear_prefix_removes_a_fragment_and_its_garbage(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with quiet_store(path, segment_bytes=2048) as store:
        for i in range(100):
            store.put(P, b"p%d" % i, b"x" * 50)
            store.put(Q, b"q%d" % i, b"y" * 50)
        store.clear_prefix(P)
        store.put(P, b"back", b"again")
        stats = store.stats()
        assert stats.put_count == 101
        assert stats.clear_count == 1
        store.put(Q, b"roll", b"z" * 2000)
        store.flush()
        store.compact(0.3)
        store.compact(0.0)
        store._check_index()
        assert store.stats().clear_count == 0
    expected = {(Q, b"q%d" % i): b"y" * 50 for i in range(100)}
    expected[(P, b"back")] = b"again"
    expected[(Q, b"roll")] = b"z" * 2000
    assert recovered(path) == expected
    assert records_on_disk(path) == len(expected)


def test_interrupted_merge_leftovers_are_ignored_and_removed(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    model = Model()
    with quiet_store(path, segment_bytes=1024) as store:
        for i in range(60):
            # Every third record is never overwritten, so merged runs keep something.
            key = b"stable%d" % i if i % 3 == 0 else b"k%d" % (i % 5)
            op = ("put", P, key, b"%d" % i * 40)
            apply_op(store, op)
            model.apply(op)
        store.flush()
        saved = tmp_path / "before"
        shutil.copytree(path, saved)
        results = store.compact(0.0)
    merged = [r for r in results if len(r.segment_ids) > 1 and r.records_kept]
    assert merged
    # A crash after the merge's rename but before its inputs were removed: put them back.
    for segment_id in merged[0].segment_ids[1:]:
        name = segment_file_name(segment_id)
        shutil.copy(saved / name, Path(path) / name)
    # And an unfinished compaction output.
    (Path(path) / (segment_file_name(1) + COMPACTING_SUFFIX)).write_bytes(b"half written")
    assert recovered(path) == model.items
    with quiet_store(path) as store:
        store._check_index()
    assert not any(name.endswith(COMPACTING_SUFFIX) for name in os.listdir(path))
    assert not any(segment_file_name(s) in os.listdir(path) for s in merged[0].segment_ids[1:])
    assert recovered(path) == model.items


def test_background_compaction_with_concurrent_writers(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    models = [Model() for _ in range(3)]
    with LogStore(path, segment_bytes=4096, compaction_interval=0.005,
                  compaction_garbage_ratio=0.3) as store:
        def writer(index: int) -> None:
            rng = random.Random(index)
            prefix = make_prefix(index, 0)
            for i in range(1500):
                roll = rng.random()
                if roll < 0.75:
                    op: tuple = ("put", prefix, b"k%d" % rng.randrange(25), b"%d" % i * 8)
                elif roll < 0.98:
                    op = ("remove", prefix, b"k%d" % rng.randrange(25))
                else:
                    op = ("clear_prefix", prefix)
                apply_op(store, op)
                models[index].apply(op)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        deadline = time.monotonic() + 30
        while store.stats().compaction_count == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.stats().compaction_count > 0
        store._check_index()
    expected = {k: v for model in models for k, v in model.items.items()}
    assert recovered(path) == expected


operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from([P, Q]), st.integers(0, 8),
                  st.integers(0, 300)),
        st.tuples(st.just("remove"), st.sampled_from([P, Q]), st.integers(0, 8)),
        st.tuples(st.just("clear_prefix"), st.sampled_from([P, Q])),
        st.tuples(st.just("compact"), st.sampled_from([0.0, 0.3, 0.7])),
        st.tuples(st.just("reopen")),
        st.tuples(st.just("backup")),
    ),
    max_size=60,
)


@settings(database=None, max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(operations)
def test_any_history_of_writes_compactions_and_reopens_recovers_exactly(
        tmp_path: Path, steps: list[tuple]) -> None:
    path = str(tmp_path / "log")
    shutil.rmtree(path, ignore_errors=True)
    backups = tmp_path / "backups"
    shutil.rmtree(backups, ignore_errors=True)
    model = Model()
    store = quiet_store(path, segment_bytes=1024)
    try:
        for number, step in enumerate(steps):
            if step[0] == "put":
                op: tuple = ("put", step[1], b"k%d" % step[2], bytes([step[2]]) * step[3])
            elif step[0] == "remove":
                op = ("remove", step[1], b"k%d" % step[2])
            elif step[0] == "clear_prefix":
                op = ("clear_prefix", step[1])
            elif step[0] == "compact":
                store.flush()
                store.compact(step[1])
                store._check_index()
                continue
            elif step[0] == "reopen":
                store.close()
                store = quiet_store(path, segment_bytes=1024)
                continue
            else:
                result = store.backup(str(backups / str(number)))
                assert recovered(result.path) == model.items
                continue
            apply_op(store, op)
            model.apply(op)
        store._check_index()
    finally:
        store.close()
    assert recovered(path) == model.items


@pytest.mark.parametrize("garbage_ratio", [0.0, 0.5])
def test_compacting_twice_changes_nothing_more(tmp_path: Path, garbage_ratio: float) -> None:
    path = str(tmp_path / "log")
    with quiet_store(path, segment_bytes=2048) as store:
        for i in range(500):
            store.put(P, b"k%d" % (i % 50), b"v" * (i % 40))
            if i % 9 == 0:
                store.remove(P, b"k%d" % (i % 13))
        store.put(Q, b"roll", b"r" * 3000)
        store.flush()
        store.compact(garbage_ratio)
        first = store.stats()
        assert store.compact(garbage_ratio) == [] or garbage_ratio == 0.0
        assert store.stats().live_bytes == first.live_bytes
        store._check_index()
    assert len(segment_files(path)) >= 1
