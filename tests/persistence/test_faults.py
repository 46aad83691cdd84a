"""Injected I/O faults: a full disk or a failed fsync stops the store with a clear error and
loses nothing that was acknowledged durable."""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from persistence import DiskFullError, LogStore, StoreFailedError, make_prefix
from persistence.fileio import FileOps
from tests.persistence.helpers import recovered

P = make_prefix(3, 3)


class FaultyOps(FileOps):
    """Writes fail with ENOSPC once budget bytes are spent (after a short write), or fsync
    fails with EIO once armed."""

    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.fsync_fails = threading.Event()

    def writev(self, fd: int, buffers: Sequence[bytes]) -> int:
        if self.budget_bytes is None:
            return super().writev(fd, buffers)
        if self.budget_bytes <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        first = bytes(buffers[0])[:self.budget_bytes]
        written = super().writev(fd, [first])
        self.budget_bytes -= written
        return written

    def fsync(self, fd: int) -> None:
        if self.fsync_fails.is_set():
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)


def test_full_disk_keeps_everything_acknowledged(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    ops = FaultyOps(budget_bytes=None)
    store = LogStore(path, fsync="always", _file_ops=ops)
    try:
        acknowledged = {}
        for i in range(20):
            seq = store.put(P, b"k%d" % i, b"v" * 50)
            store.wait_durable(seq, timeout=10)
            acknowledged[(P, b"k%d" % i)] = b"v" * 50
        ops.budget_bytes = 150  # the next batch is torn part way, then the disk is full
        seq = store.put(P, b"late", b"x" * 400)
        with pytest.raises(DiskFullError, match="disk full") as info:
            store.wait_durable(seq, timeout=10)
        assert isinstance(info.value.__cause__, OSError)
        with pytest.raises(DiskFullError):
            store.put(P, b"later", b"y")
    finally:
        store.close()
    store.close()
    items = recovered(path)
    assert items.items() >= acknowledged.items()
    assert (P, b"later") not in items


def test_failed_fsync_stops_the_store(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    ops = FaultyOps()
    with LogStore(path, fsync="always", _file_ops=ops) as store:
        store.wait_durable(store.put(P, b"safe", b"1"), timeout=10)
        ops.fsync_fails.set()
        seq = store.put(P, b"unsafe", b"2")
        with pytest.raises(StoreFailedError, match="I/O error") as info:
            store.wait_durable(seq, timeout=10)
        assert not isinstance(info.value, DiskFullError)
        with pytest.raises(StoreFailedError):
            store.put(P, b"more", b"3")
        assert store.stats().seq_durable == 1
    assert recovered(path)[(P, b"safe")] == b"1"


def test_failure_reaches_asyncio_futures(tmp_path: Path) -> None:
    ops = FaultyOps()
    with LogStore(str(tmp_path / "log"), fsync="always", _file_ops=ops) as store:
        async def main() -> None:
            ops.fsync_fails.set()
            future = store.durable_future(store.put(P, b"k", b"v"))
            with pytest.raises(StoreFailedError):
                await asyncio.wait_for(future, 10)

        asyncio.run(main())
