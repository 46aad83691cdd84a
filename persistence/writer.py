"""The writer thread: group commit of queued records to the head segment.

Callers enqueue encoded records under the store's lock and go on; they never touch the
disk. The thread takes whatever is queued, writes it with one writev per segment (one block
per run of records), and syncs as the policy says: "always" after every batch, so that all
writers waiting in that batch share one fsync; "interval" at most fsync_interval apart;
"never" only when asked (flush, close). Durability is then published to waiting threads
and to asyncio futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import heapq
import itertools
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import (
    DiskFullError,
    DurabilityTimeoutError,
    PersistenceError,
    StoreFailedError,
    WriteQueueFullError,
)
from .fileio import FileOps, write_all
from .records import block_payload_bytes_target, pack_block_head, pack_segment_head
from .segment import segment_file_name

log = logging.getLogger("shmgrid.persistence")

FSYNC_POLICIES = ("never", "interval", "always")


@dataclass(slots=True)
class WriterRun:
    """Consecutive records of one segment that will become one block."""

    segment_id: int
    pieces: list[bytes] = field(default_factory=list)
    payload_bytes: int = 0
    record_count: int = 0
    seq_last: int = 0


class GroupCommitWriter:
    """Owns the head segment's file descriptors and the thread that writes them."""

    def __init__(self, folder: str, lock: threading.Lock, fsync: str, fsync_interval_s: float,
                 queue_bytes_max: int, file_ops: FileOps) -> None:
        assert fsync in FSYNC_POLICIES
        assert fsync_interval_s > 0
        self._folder = folder
        self._policy = fsync
        self._interval_s = fsync_interval_s
        self._queue_bytes_max = queue_bytes_max
        self._ops = file_ops
        # Guarded by the store's lock: the queue, and what the store reads back.
        self._work = threading.Condition(lock)
        self._runs: list[WriterRun] = []
        self._run: WriterRun | None = None
        self._queued_bytes = 0
        self._seq_enqueued = 0
        self._sync_target_seq = 0
        self._stopping = False
        self._idle = False
        self.open_segment_id = -1  # the segment the thread appends to; older ones are sealed
        # Owned by the writer thread.
        self._fd: int | None = None
        self._unsynced_paths: list[str] = []  # retired head segments not yet synced
        self._folder_dirty = False
        self._written_seq = 0
        self._synced_seq = 0
        self._sync_last_at = time.monotonic()
        # Guarded by _durable: what waiters see.
        self._durable = threading.Condition(threading.Lock())
        self._durable_seq = 0
        self._futures: list[tuple[int, int, asyncio.Future, asyncio.AbstractEventLoop]] = []
        self._future_ids = itertools.count()
        self.failure: PersistenceError | None = None
        self.syncs = 0
        # Called from the writer thread after the durable sequence rose (or the writer
        # failed): a poll-loop owner wakes itself with it (LogStore.set_durable_listener).
        self.on_durable: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run_thread, name="shmgrid-log-writer",
                                        daemon=True)

    def start(self, segment_id: int, fd: int, seq_last: int) -> None:
        """Begin appending to an already created (empty, headed) segment file."""
        self._fd = fd
        self.open_segment_id = segment_id
        self._folder_dirty = True
        self._written_seq = self._synced_seq = self._durable_seq = seq_last
        self._seq_enqueued = self._sync_target_seq = seq_last
        self._thread.start()

    # -- called by the store, holding its lock ------------------------------------------

    def check_room_locked(self, size: int) -> None:
        if self._queued_bytes + size > self._queue_bytes_max and self._queued_bytes:
            raise WriteQueueFullError(
                f"{self._queued_bytes} bytes are waiting for the disk (bound "
                f"{self._queue_bytes_max}); slow down or raise queue_bytes_max")

    def enqueue_locked(self, segment_id: int, seq: int, size: int, head: bytes, key: bytes,
                       value: bytes) -> None:
        run = self._run
        if (run is None or run.segment_id != segment_id
                or run.payload_bytes >= block_payload_bytes_target):
            run = self._run = WriterRun(segment_id)
            self._runs.append(run)
        run.pieces += (head, key, value)
        run.payload_bytes += size
        run.record_count += 1
        run.seq_last = seq
        self._queued_bytes += size
        self._seq_enqueued = seq
        if self._idle:
            self._work.notify()

    def request_sync_locked(self) -> int:
        """Ask for an fsync of everything enqueued so far; returns the seq to wait for."""
        self._sync_target_seq = self._seq_enqueued
        if self._idle:
            self._work.notify()
        return self._seq_enqueued

    # -- waiting ------------------------------------------------------------------------

    def wait_durable(self, seq: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._durable:
            while self._durable_seq < seq:
                if self.failure is not None:
                    raise self.failure
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise DurabilityTimeoutError(
                        f"seq {seq} not durable after {timeout} s (durable up to "
                        f"{self._durable_seq}, fsync policy {self._policy!r})")
                self._durable.wait(remaining)

    def wait_synced(self, seq: int, timeout: float | None) -> None:
        """Like wait_durable, but for an fsync whatever the policy (flush, close)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._durable:
            while self._synced_seq < seq:
                if self.failure is not None:
                    raise self.failure
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise DurabilityTimeoutError(f"seq {seq} not synced after {timeout} s")
                self._durable.wait(remaining)

    def durable_future(self, seq: int) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._durable:
            if self._durable_seq >= seq:
                future.set_result(seq)
            elif self.failure is not None:
                future.set_exception(self.failure)
            else:
                heapq.heappush(self._futures, (seq, next(self._future_ids), future, loop))
        return future

    @property
    def durable_seq(self) -> int:
        return self._durable_seq

    # -- the thread ---------------------------------------------------------------------

    def close(self) -> None:
        """Write and sync everything queued, then stop the thread. Idempotent."""
        with self._work:
            self._stopping = True
            self._work.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run_thread(self) -> None:
        try:
            for _batch in itertools.count():
                runs, sync_target, stopping = self._take_batch()
                if runs:
                    self._write(runs)
                if self._sync_due(sync_target, stopping):
                    self._sync()
                self._publish()
                if stopping and not runs:
                    break
        except BaseException as exc:  # every failure must reach the waiters
            self._fail(exc)
        finally:
            self._close_fds()

    def _take_batch(self) -> tuple[list[WriterRun], int, bool]:
        with self._work:
            while not self._runs and not self._stopping:
                if self._sync_target_seq > self._synced_seq < self._written_seq:
                    break  # a flush wants what is written synced
                timeout = None
                if self._policy == "interval" and self._written_seq > self._synced_seq:
                    timeout = self._sync_last_at + self._interval_s - time.monotonic()
                    if timeout <= 0:
                        break
                self._idle = True
                self._work.wait(timeout)
                self._idle = False
            runs, self._runs, self._run = self._runs, [], None
            self._queued_bytes = 0
            return runs, self._sync_target_seq, self._stopping

    def _write(self, runs: list[WriterRun]) -> None:
        start = 0
        for index in range(1, len(runs) + 1):
            if index == len(runs) or runs[index].segment_id != runs[start].segment_id:
                self._write_segment(runs[start].segment_id, runs[start:index])
                start = index
        self._written_seq = runs[-1].seq_last

    def _write_segment(self, segment_id: int, runs: list[WriterRun]) -> None:
        if segment_id != self.open_segment_id:
            self._open_segment(segment_id)
        buffers = []
        for run in runs:
            payload = b"".join(run.pieces)
            assert len(payload) == run.payload_bytes
            head = pack_block_head(run.record_count, run.payload_bytes, run.seq_last,
                                   zlib.crc32(payload))
            buffers += (head, payload)
        assert self._fd is not None
        write_all(self._ops, self._fd, buffers)

    def _open_segment(self, segment_id: int) -> None:
        assert segment_id > self.open_segment_id
        if self._fd is not None:
            self._ops.close(self._fd)
            self._fd = None
            self._unsynced_paths.append(
                os.path.join(self._folder, segment_file_name(self.open_segment_id)))
        path = os.path.join(self._folder, segment_file_name(segment_id))
        fd = self._ops.open_new(path)
        self._fd = fd
        self._folder_dirty = True
        write_all(self._ops, fd, [pack_segment_head(segment_id)])
        with self._work:
            self.open_segment_id = segment_id

    def _sync_due(self, sync_target: int, stopping: bool) -> bool:
        if self._written_seq <= self._synced_seq and not self._unsynced_paths \
                and not self._folder_dirty:
            return False
        if stopping or sync_target > self._synced_seq or self._policy == "always":
            return True
        if self._policy == "interval":
            return time.monotonic() - self._sync_last_at >= self._interval_s
        return False

    def _sync(self) -> None:
        seq = self._written_seq
        for path in self._unsynced_paths:
            self._ops.fsync_path(path)
        self._unsynced_paths = []
        if self._fd is not None:
            self._ops.fsync(self._fd)
        if self._folder_dirty:
            self._ops.fsync_dir(self._folder)
            self._folder_dirty = False
        self._sync_last_at = time.monotonic()
        self.syncs += 1
        with self._durable:
            self._synced_seq = seq

    def _publish(self) -> None:
        durable = self._written_seq if self._policy == "never" else self._synced_seq
        ready: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, int]]] = {}
        with self._durable:
            if durable > self._durable_seq:
                self._durable_seq = durable
            self._durable.notify_all()
            while self._futures and self._futures[0][0] <= self._durable_seq:
                seq, _id, future, loop = heapq.heappop(self._futures)
                ready.setdefault(loop, []).append((future, seq))
        for loop, futures in ready.items():
            _call_in_loop(loop, _resolve_futures, futures, None)
        if self.on_durable is not None:
            self.on_durable()

    def _fail(self, exc: BaseException) -> None:
        failure = _failure_from(exc, self._folder)
        log.error("log writer for %s stopped: %s", self._folder, failure)
        ready: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, int]]] = {}
        with self._durable:
            self.failure = failure
            self._durable.notify_all()
            for seq, _id, future, loop in self._futures:
                ready.setdefault(loop, []).append((future, seq))
            self._futures.clear()
        with self._work:
            self._runs, self._run, self._queued_bytes = [], None, 0
        for loop, futures in ready.items():
            _call_in_loop(loop, _resolve_futures, futures, failure)
        if self.on_durable is not None:
            self.on_durable()

    def _close_fds(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                self._ops.close(fd)
            except OSError as exc:
                log.warning("closing a segment of %s: %s", self._folder, exc)


def _failure_from(exc: BaseException, folder: str) -> PersistenceError:
    if isinstance(exc, PersistenceError):
        return exc
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        failure: PersistenceError = DiskFullError(
            f"disk full under {folder}: {exc}; records acknowledged durable before this are "
            "safe, the store takes no more writes until reopened", folder)
    elif isinstance(exc, OSError):
        failure = StoreFailedError(
            f"I/O error writing {folder}: {exc}; records acknowledged durable before this are "
            "safe, the store takes no more writes until reopened", folder)
    else:
        failure = StoreFailedError(f"log writer for {folder} crashed: {exc!r}", folder)
    failure.__cause__ = exc
    return failure


def _resolve_futures(futures: list[tuple[asyncio.Future, int]],
                     failure: BaseException | None) -> None:
    for future, seq in futures:
        if future.done():
            continue
        if failure is None:
            future.set_result(seq)
        else:
            future.set_exception(failure)


def _call_in_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., None],
                  *args: object) -> None:
    # A closed loop raises RuntimeError; nobody is waiting on its futures any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)
