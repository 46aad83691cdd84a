"""LogStore in persistence mode: appends, durability policies, recovery, and bad input."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from persistence import (
    DurabilityTimeoutError,
    LogStore,
    PersistenceError,
    RecordTooLargeError,
    StoreClosedError,
    StoreLockedError,
    StoreOpenError,
    WriteQueueFullError,
    make_prefix,
)
from persistence.fileio import FileOps
from tests.persistence.helpers import Model, recovered, recovered_with_report, segment_files

P1 = make_prefix(1, 17)
P2 = make_prefix(2, 17)


@pytest.fixture
def store(tmp_path: Path):
    opened = LogStore(str(tmp_path / "log"), fsync="always")
    yield opened
    opened.close()


def test_put_remove_clear_then_recover(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with LogStore(path) as store:
        store.put(P1, b"a", b"1")
        store.put(P1, b"b", b"2")
        store.put(P2, b"a", b"3")
        store.put(P1, b"a", b"1'")
        store.remove(P1, b"b")
        store.put(make_prefix(3, 0), b"x", b"")
        store.clear_prefix(make_prefix(3, 0))
        store.put(P2, b"", b"empty key")
    items, recovery = recovered_with_report(path)
    assert items == {(P1, b"a"): b"1'", (P2, b"a"): b"3", (P2, b""): b"empty key"}
    assert recovery.damages == []
    assert recovery.record_count == 8
    assert recovery.seq_last == 8
    assert recovery.live_count == 3


def test_values_are_views_unless_copied(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with LogStore(path) as store:
        store.put(P1, b"k", b"v" * 100)
    [(prefix, key, value)] = list(LogStore.recover(path))
    assert (prefix, key) == (P1, b"k")
    assert isinstance(key, bytes)
    assert value == b"v" * 100
    [(_, _, copied)] = list(LogStore.recover(path, copy_values=True))
    assert type(copied) is bytes


def test_recover_of_a_missing_folder_is_empty(tmp_path: Path) -> None:
    recovery = LogStore.recover(str(tmp_path / "nothing here"))
    assert list(recovery) == []
    assert recovery.segment_count == 0


def test_reopen_continues_sequence_in_a_new_segment(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with LogStore(path) as store:
        assert store.put(P1, b"a", b"1") == 1
        assert store.put(P1, b"b", b"2") == 2
    with LogStore(path) as store:
        assert store.stats().seq_last == 2
        assert store.stats().put_count == 2
        assert store.put(P1, b"a", b"3") == 3
        store._check_index()
    assert len(segment_files(path)) == 2
    assert recovered(path) == {(P1, b"a"): b"3", (P1, b"b"): b"2"}


def test_segments_roll_at_the_configured_size(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    model = Model()
    with LogStore(path, segment_bytes=4096, background_compaction=False) as store:
        for i in range(300):
            store.put(P1, b"k%d" % (i % 40), b"%d" % i * 10)
            model.put(P1, b"k%d" % (i % 40), b"%d" % i * 10)
        store.flush()
        assert store.stats().segment_count >= 4
        assert max(store._segment_record_bytes.values()) <= 4096
        store._check_index()
    assert len(segment_files(path)) >= 4
    assert recovered(path) == model.items


@pytest.mark.parametrize("policy", ["never", "interval", "always"])
def test_wait_durable_returns_under_every_policy(tmp_path: Path, policy: str) -> None:
    with LogStore(str(tmp_path / "log"), fsync=policy, fsync_interval=0.02) as store:
        seqs = [store.put(P1, b"k%d" % i, b"v") for i in range(100)]
        store.wait_durable(seqs[-1], timeout=10)
        assert store.stats().seq_durable >= seqs[-1]
        if policy == "never":
            assert store.stats().sync_count == 0
        else:
            assert store.stats().sync_count >= 1


def test_always_shares_one_fsync_between_concurrent_writers(tmp_path: Path) -> None:
    thread_count, puts_per_thread = 8, 40
    with LogStore(str(tmp_path / "log"), fsync="always") as store:
        def writer(thread_index: int) -> None:
            for i in range(puts_per_thread):
                store.wait_durable(store.put(P1, b"%d-%d" % (thread_index, i), b"v"), 30)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(thread_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        stats = store.stats()
    assert stats.seq_durable == thread_count * puts_per_thread
    assert stats.sync_count < thread_count * puts_per_thread


def test_flush_syncs_even_with_never(tmp_path: Path) -> None:
    with LogStore(str(tmp_path / "log"), fsync="never") as store:
        store.put(P1, b"k", b"v")
        store.flush()
        assert store.stats().sync_count == 1


def test_interval_syncs_without_being_asked(tmp_path: Path) -> None:
    with LogStore(str(tmp_path / "log"), fsync="interval", fsync_interval=0.01) as store:
        store.put(P1, b"k", b"v")
        deadline = time.monotonic() + 10
        while store.stats().sync_count == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert store.stats().sync_count >= 1


def test_durable_future_completes_in_the_loop(store: LogStore) -> None:
    async def main() -> list[int]:
        seqs = [store.put(P1, b"k%d" % i, b"v") for i in range(10)]
        done = await asyncio.wait_for(
            asyncio.gather(*(store.durable_future(seq) for seq in seqs)), 10)
        # A seq already durable gives a future that is done at once.
        assert store.durable_future(seqs[0]).done()
        return list(done)

    assert asyncio.run(main()) == list(range(1, 11))


def test_close_is_idempotent_and_refuses_later_writes(tmp_path: Path) -> None:
    store = LogStore(str(tmp_path / "log"))
    seq = store.put(P1, b"k", b"v")
    store.close()
    store.close()
    store.wait_durable(seq, timeout=1)
    with pytest.raises(StoreClosedError, match="closed"):
        store.put(P1, b"k", b"v")
    with pytest.raises(StoreClosedError):
        store.compact()
    store.flush()  # nothing left to do


@pytest.mark.parametrize("key, value, error", [
    ("text", b"v", TypeError),
    (b"k", "text", TypeError),
    (bytearray(b"k"), b"v", TypeError),
    (b"k", memoryview(b"v"), TypeError),
    (None, b"v", TypeError),
])
def test_keys_and_values_must_be_bytes(store: LogStore, key: object, value: object,
                                       error: type) -> None:
    with pytest.raises(error, match="must be bytes"):
        store.put(P1, key, value)  # type: ignore[arg-type]
    assert store.stats().seq_last == 0


@pytest.mark.parametrize("prefix", [-1, 2**64, 1.5, "p", True])
def test_prefix_must_be_a_64_bit_int(store: LogStore, prefix: object) -> None:
    with pytest.raises(ValueError, match="prefix"):
        store.put(prefix, b"k", b"v")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefix"):
        store.clear_prefix(prefix)  # type: ignore[arg-type]


def test_oversized_key_is_refused(store: LogStore) -> None:
    with pytest.raises(RecordTooLargeError, match="key of"):
        store.put(P1, b"k" * ((1 << 20) + 1), b"v")
    with pytest.raises(RecordTooLargeError):
        store.remove(P1, b"k" * ((1 << 20) + 1))


def test_bad_seq_and_timeouts(tmp_path: Path) -> None:
    gate = threading.Event()

    class SlowOps(FileOps):
        def fsync(self, fd: int) -> None:
            gate.wait(30)
            super().fsync(fd)

    with LogStore(str(tmp_path / "log"), fsync="always", _file_ops=SlowOps()) as store:
        seq = store.put(P1, b"k", b"v")
        with pytest.raises(ValueError, match="never returned"):
            store.wait_durable(seq + 1)
        with pytest.raises(DurabilityTimeoutError):
            store.wait_durable(seq, timeout=0.05)
        gate.set()
        store.wait_durable(seq, timeout=30)


def test_queue_bound_refuses_work_when_the_writer_lags(tmp_path: Path) -> None:
    gate = threading.Event()
    stuck = threading.Event()

    class StuckOps(FileOps):
        def writev(self, fd: int, buffers) -> int:  # noqa: ANN001
            if stuck.is_set():
                gate.wait(30)
            return super().writev(fd, buffers)

    path = str(tmp_path / "log")
    store = LogStore(path, queue_bytes_max=10_000, _file_ops=StuckOps())
    stuck.set()
    try:
        accepted = []
        with pytest.raises(WriteQueueFullError, match="waiting for the disk"):
            for i in range(1000):
                accepted.append(store.put(P1, b"k%d" % i, b"x" * 100))
        assert 50 < len(accepted) < 1000
    finally:
        gate.set()
        store.close()
    assert len(recovered(path)) == len(accepted)


def test_second_store_on_a_folder_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with LogStore(path):
        with pytest.raises(StoreLockedError, match="in use"):
            LogStore(path)
        with pytest.raises(StoreLockedError):
            LogStore.recover(path)
    LogStore(path).close()


def test_unusable_folder_gets_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a file"
    blocker.write_bytes(b"")
    with pytest.raises(StoreOpenError, match="cannot open log store folder"):
        LogStore(str(blocker / "log"))


@pytest.mark.parametrize("option, value", [
    ("fsync", "sometimes"), ("fsync_interval", 0), ("segment_bytes", 10),
    ("compaction_garbage_ratio", 1.5)])
def test_bad_options_are_refused(tmp_path: Path, option: str, value: object) -> None:
    with pytest.raises(ValueError, match=option):
        LogStore(str(tmp_path / "log"), **{option: value})  # type: ignore[arg-type]
    assert not (tmp_path / "log").exists()


def test_stats_follow_live_and_garbage_bytes(tmp_path: Path) -> None:
    with LogStore(str(tmp_path / "log"), background_compaction=False) as store:
        store.put(P1, b"k", b"x" * 100)
        first = store.stats()
        assert first.live_bytes == first.log_bytes == 32 + 1 + 100
        store.put(P1, b"k", b"y" * 100)
        store.flush()
        second = store.stats()
        assert second.live_bytes == 133
        assert second.garbage_bytes == 133
        assert second.put_count == 1
        store.remove(P1, b"k")
        store.flush()
        third = store.stats()
        assert third.put_count == 0
        assert third.tombstone_count == 1
        assert third.live_bytes == 33  # the tombstone hides two older records
        store._check_index()


def test_backup_is_a_point_in_time_copy_while_writes_go_on(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    history: list[tuple] = []
    stop = threading.Event()
    with LogStore(path, segment_bytes=8192, compaction_interval=0.01,
                  compaction_garbage_ratio=0.2) as store:
        def writer() -> None:
            for i in range(100_000):
                if stop.is_set():
                    return
                op = ("put", P1, b"k%d" % (i % 50), b"%d" % i)
                if i % 7 == 0:
                    op = ("remove", P1, b"k%d" % (i % 50))
                seq = getattr(store, op[0])(*op[1:])
                history.append((seq, op))

        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(0.1)
        result = store.backup(str(tmp_path / "backup"))
        time.sleep(0.05)
        stop.set()
        thread.join(30)
    assert result.seq_last > 0
    model = Model()
    for seq, op in sorted(history):
        if seq <= result.seq_last:
            model.apply(op)
    assert recovered(result.path) == model.items
    with LogStore(path) as store, pytest.raises(PersistenceError, match="not empty"):
        store.backup(result.path)


def test_a_clean_close_saves_the_index_for_the_next_open(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with LogStore(path, segment_bytes=2048, background_compaction=False) as store:
        assert store.index_source == "scan"
        for i in range(200):
            store.put(P1, b"k%d" % (i % 30), b"v%d" % i)
            if i % 11 == 0:
                store.remove(P1, b"k%d" % (i % 7))
        store.clear_prefix(P2)
        before = store.stats()
    assert (tmp_path / "log" / "index.snapshot").exists()
    with LogStore(path, segment_bytes=2048, background_compaction=False) as store:
        assert store.index_source == "snapshot"
        assert not (tmp_path / "log" / "index.snapshot").exists()
        after = store.stats()
        assert (after.put_count, after.tombstone_count, after.live_bytes, after.seq_last) == \
            (before.put_count, before.tombstone_count, before.live_bytes, before.seq_last)
        store._check_index()


@pytest.mark.parametrize("change", ["append to a segment", "damage the snapshot",
                                    "remove a segment"])
def test_a_snapshot_that_no_longer_fits_is_ignored(tmp_path: Path, change: str) -> None:
    path = tmp_path / "log"
    with LogStore(str(path), segment_bytes=1024) as store:
        for i in range(50):
            store.put(P1, b"k%d" % i, b"v" * 40)
    segments = segment_files(str(path))
    if change == "append to a segment":
        with open(path / segments[0], "ab") as file:
            file.write(b"junk")
    elif change == "damage the snapshot":
        data = bytearray((path / "index.snapshot").read_bytes())
        data[-5] ^= 1
        (path / "index.snapshot").write_bytes(bytes(data))
    else:
        (path / segments[1]).unlink()
    with LogStore(str(path)) as store:
        assert store.index_source == "scan"
        store._check_index()
