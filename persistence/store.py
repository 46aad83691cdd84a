"""LogStore: the log-structured hot restart store of one member (seed 003, persistence mode).

Every mutation becomes a record appended to the head segment by the writer thread; the
caller only encodes it and queues it. A background thread compacts sealed segments whose
garbage ratio passes a threshold. LogStore.recover reads a folder back (recovery mode).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from zlib import crc32

from .compactor import (
    CompactionAborted,
    CompactionIncomplete,
    CompactionResult,
    SegmentUsage,
    choose_run,
    compact_run,
)
from .errors import (
    LogInvariantError,
    PersistenceError,
    RecordTooLargeError,
    StoreClosedError,
    StoreLockedError,
    StoreOpenError,
)
from .fileio import FileOps, fsync_dir, lock_folder, unlock_folder, write_all
from .index import LogIndex
from .prefix import prefix_max
from .rebuild import rebuild, remove_leftovers
from .records import (
    KIND_CLEAR,
    KIND_PUT,
    KIND_TOMBSTONE,
    key_bytes_max,
    key_value_crc,
    pack_record_head,
    pack_segment_head,
    record_head_bytes,
    seq_max,
    value_bytes_max,
)
from .recovery import Recovery
from .segment import Damage, list_segments, read_segment_head, segment_file_name, segment_id_max
from .snapshot import save_snapshot, take_snapshot
from .writer import FSYNC_POLICIES, GroupCommitWriter

log = logging.getLogger("shmgrid.persistence")

_EMPTY_KV_CRC = key_value_crc(b"", b"")


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A snapshot of a store's size and activity. Bytes count records, not file heads."""

    segment_count: int
    log_bytes: int  # records (and any damaged bytes) in all segment files
    live_bytes: int  # live records, and tombstones or clears that still hide older records
    garbage_bytes: int
    put_count: int  # live keys
    tombstone_count: int  # removed keys whose tombstone is still on disk
    clear_count: int  # prefix clears still on disk
    seq_last: int
    seq_durable: int
    sync_count: int
    compaction_count: int
    compaction_bytes_read: int
    compaction_bytes_written: int
    damage_count: int  # damaged stretches found when the store opened


@dataclass(frozen=True, slots=True)
class BackupResult:
    """A finished backup: its folder holds every record up to seq_last."""

    path: str
    seq_last: int
    segment_count: int
    bytes_copied: int  # 0 for segments hard-linked rather than copied


class LogStore:
    """One member's persistence log in folder path (created if missing, locked while open).

    fsync: "never" leaves flushing to the OS, "interval" syncs at most fsync_interval
    seconds apart (bounding loss to that), "always" syncs every batch before reporting it
    durable. put/remove/clear_prefix return a sequence number at once; wait_durable or
    durable_future wait for it to be on disk as the policy defines.

    segment_bytes: records per segment file before the next one starts.
    compaction_garbage_ratio, compaction_interval: the background compactor rewrites sealed
    segments whose garbage ratio is at least the first, every compaction_interval seconds
    (background_compaction=False leaves it to compact()).
    queue_bytes_max: bound on bytes waiting for the writer; beyond it puts raise
    WriteQueueFullError rather than grow memory without limit.
    _file_ops: fault injection for tests.
    """

    def __init__(self, path: str, fsync: str = "never", fsync_interval: float = 0.05, *,
                 segment_bytes: int = 64 << 20, compaction_garbage_ratio: float = 0.5,
                 compaction_interval: float = 1.0, background_compaction: bool = True,
                 queue_bytes_max: int = 256 << 20, _file_ops: FileOps | None = None) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, not {fsync!r}")
        if not fsync_interval > 0:
            raise ValueError(f"fsync_interval must be > 0 seconds, not {fsync_interval}")
        if not segment_bytes >= 1024:
            raise ValueError(f"segment_bytes must be at least 1024, not {segment_bytes}")
        if not 0 <= compaction_garbage_ratio <= 1:
            raise ValueError(f"compaction_garbage_ratio must be in 0..1, "
                             f"not {compaction_garbage_ratio}")
        if not compaction_interval > 0:
            raise ValueError(f"compaction_interval must be > 0, not {compaction_interval}")
        self.path = os.path.abspath(path)
        self.fsync = fsync
        self._segment_bytes_max = segment_bytes
        self._garbage_ratio_min = compaction_garbage_ratio
        self._compaction_interval_s = compaction_interval
        self._ops = _file_ops or FileOps()
        self._lock = threading.Lock()
        self._compaction_lock = threading.Lock()
        self._compaction_stop = threading.Event()
        self._compaction_thread: threading.Thread | None = None
        self._compaction_failure: PersistenceError | None = None
        self._compaction_totals = [0, 0, 0]  # runs, bytes read, bytes written
        self._closed = False
        self._lock_fd = self._open_folder()
        try:
            self._load(fsync, fsync_interval, queue_bytes_max)
        except BaseException:
            unlock_folder(self._lock_fd)
            raise
        if background_compaction:
            self._compaction_thread = threading.Thread(
                target=self._compaction_loop, name="shmgrid-log-compactor", daemon=True)
            self._compaction_thread.start()

    def _open_folder(self) -> int:
        try:
            os.makedirs(self.path, exist_ok=True)
            return lock_folder(self.path, exclusive=True)  # type: ignore[return-value]
        except BlockingIOError:
            raise StoreLockedError(self.path) from None
        except OSError as exc:
            raise StoreOpenError(self.path, str(exc)) from exc

    def _load(self, fsync: str, fsync_interval: float, queue_bytes_max: int) -> None:
        try:
            remove_leftovers(self.path)
        except OSError as exc:
            raise StoreOpenError(self.path, f"removing compaction leftovers: {exc}") from exc
        try:
            rebuilt = take_snapshot(self.path)
            self.index_source = "snapshot"
            if rebuilt is None:
                rebuilt = rebuild(self.path)
                self.index_source = "scan"
        except OSError as exc:
            raise StoreOpenError(self.path, f"reading the log: {exc}") from exc
        self._index: LogIndex = rebuilt.index
        self._segment_record_bytes = rebuilt.segment_bytes
        self.damages: list[Damage] = rebuilt.damages
        self._seq_last = rebuilt.index.seq_last
        head_id = 1 + max([rebuilt.segment_id_last] + [
            (read_segment_head(path) or (0, segment_id))[1]
            for segment_id, path in list_segments(self.path)])
        if head_id > segment_id_max:
            raise StoreOpenError(self.path, "segment ids are exhausted")
        self._head_id = head_id
        self._head_bytes = 0
        self._writer = GroupCommitWriter(self.path, self._lock, fsync, fsync_interval,
                                         queue_bytes_max, self._ops)
        head_path = os.path.join(self.path, segment_file_name(head_id))
        try:
            fd = self._ops.open_new(head_path)
        except OSError as exc:
            raise StoreOpenError(self.path, f"creating {head_path}: {exc}") from exc
        try:
            write_all(self._ops, fd, [pack_segment_head(head_id)])
        except OSError as exc:
            self._ops.close(fd)
            os.unlink(head_path)
            raise StoreOpenError(self.path, f"writing {head_path}: {exc}") from exc
        self._index.live_bytes.setdefault(head_id, 0)
        self._segment_record_bytes[head_id] = 0
        self._writer.start(head_id, fd, self._seq_last)

    # -- recovery mode ------------------------------------------------------------------

    @staticmethod
    def recover(path: str, *, copy_values: bool = False) -> Recovery:
        """The newest live (prefix, key, value) of every key in folder path, as an iterable.

        Never raises on damage to the log: torn tails and damaged regions are skipped,
        logged, and listed in the result's damages. Values are memoryviews of the mapped
        files unless copy_values. Raises StoreLockedError if a LogStore has the folder open.
        """
        return Recovery(path, copy_values=copy_values)

    # -- persistence mode ---------------------------------------------------------------

    def put(self, prefix: int, key: bytes, value: bytes) -> int:
        """Queue key = value under prefix; returns its sequence. Never waits for the disk."""
        if (type(key) is not bytes or type(value) is not bytes or type(prefix) is not int
                or len(key) > key_bytes_max or len(value) > value_bytes_max
                or not 0 <= prefix <= prefix_max):
            _check_input(prefix, key, value)
        return self._append(KIND_PUT, prefix, key, value, crc32(value, crc32(key)))

    def remove(self, prefix: int, key: bytes) -> int:
        """Queue the removal of key under prefix; returns its sequence."""
        _check_input(prefix, key, b"")
        return self._append(KIND_TOMBSTONE, prefix, key, b"", key_value_crc(key, b""))

    def clear_prefix(self, prefix: int) -> int:
        """Queue the removal of every key under prefix (a fragment left this member)."""
        _check_input(prefix, b"", b"")
        return self._append(KIND_CLEAR, prefix, b"", b"", _EMPTY_KV_CRC)

    def _append(self, kind: int, prefix: int, key: bytes, value: bytes, kv_crc: int) -> int:
        # The CRC of key and value (the costly part) was computed before taking the lock.
        size = record_head_bytes + len(key) + len(value)
        with self._lock:
            if self._closed:
                raise StoreClosedError(self.path)
            writer = self._writer
            if writer.failure is not None:
                raise writer.failure
            writer.check_room_locked(size)
            seq = self._seq_last + 1
            if seq > seq_max:
                raise LogInvariantError("sequence numbers are exhausted")
            if self._head_bytes and self._head_bytes + size > self._segment_bytes_max:
                self._roll_locked()
            head = pack_record_head(seq, kind, prefix, len(key), len(value), kv_crc)
            writer.enqueue_locked(self._head_id, seq, size, head, key, value)
            if kind == KIND_CLEAR:
                self._index.add(kind, seq, prefix, key, self._head_id, size)
            else:
                self._index.add_key_record(seq, prefix, key, self._head_id, size,
                                           kind == KIND_TOMBSTONE)
            self._seq_last = seq
            self._head_bytes += size
            record_bytes = self._segment_record_bytes
            record_bytes[self._head_id] = record_bytes.get(self._head_id, 0) + size
        return seq

    def _roll_locked(self) -> None:
        if self._head_id >= segment_id_max:
            raise LogInvariantError("segment ids are exhausted")
        self._head_id += 1
        self._head_bytes = 0

    def wait_durable(self, seq: int, timeout: float | None = None) -> None:
        """Block until seq is on disk as the fsync policy defines ("never": written to the OS).

        Raises DurabilityTimeoutError after timeout seconds, or the writer's failure.
        """
        self._check_seq(seq)
        self._writer.wait_durable(seq, timeout)

    def durable_future(self, seq: int) -> asyncio.Future:
        """A future of the running event loop that completes (with seq) once seq is durable."""
        self._check_seq(seq)
        return self._writer.durable_future(seq)

    def _check_seq(self, seq: int) -> None:
        if not isinstance(seq, int) or not 0 <= seq <= self._seq_last:
            raise ValueError(f"seq {seq} was never returned by this store "
                             f"(last is {self._seq_last})")

    def set_durable_listener(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener()`` from the writer thread each time more records became durable,
        or the writer failed: a single-threaded owner wakes its loop with it (a byte on a
        pipe, say) and then reads ``durable_seq``. It must be quick and never raise."""
        self._writer.on_durable = listener

    @property
    def durable_seq(self) -> int:
        """Every record up to this sequence is durable as the fsync policy defines."""
        return self._writer.durable_seq

    @property
    def failure(self) -> PersistenceError | None:
        """Why the writer stopped (disk full, I/O error), or None."""
        return self._writer.failure

    def flush(self, timeout: float | None = None) -> None:
        """Write and fsync everything queued so far, whatever the policy, and wait for it."""
        with self._lock:
            if self._closed:
                return
            seq = self._writer.request_sync_locked()
        self._writer.wait_synced(seq, timeout)

    def close(self) -> None:
        """Stop compacting, write and fsync everything queued, release the folder. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._compaction_stop.set()
        if self._compaction_thread is not None:
            self._compaction_thread.join()
        with self._compaction_lock:
            self._writer.close()
            if self._writer.failure is None and self._compaction_failure is None:
                self._save_snapshot()
            unlock_folder(self._lock_fd)
            self._lock_fd = None
        if self._writer.failure is not None:
            log.warning("closed %s after a write failure: %s", self.path, self._writer.failure)

    def _save_snapshot(self) -> None:
        try:
            with self._lock:
                self._index.seq_last = self._seq_last
                save_snapshot(self.path, self._index, self._segment_record_bytes, self.damages)
        except (OSError, ValueError) as exc:
            log.warning("could not save the index of %s (the next open reads the log): %s",
                        self.path, exc)

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- compaction ---------------------------------------------------------------------

    def compact(self, garbage_ratio_min: float | None = None) -> list[CompactionResult]:
        """Compact every sealed segment whose garbage ratio is at least the threshold now.

        Background compaction does the same every compaction_interval seconds; this runs it
        in the caller's thread (tests, tools). Defaults to the store's threshold.
        """
        ratio_min = self._garbage_ratio_min if garbage_ratio_min is None else garbage_ratio_min
        if self._closed:
            raise StoreClosedError(self.path)
        if self._compaction_failure is not None:
            raise self._compaction_failure
        return self._compact_all(ratio_min)

    def _compact_all(self, ratio_min: float) -> list[CompactionResult]:
        results: list[CompactionResult] = []
        with self._compaction_lock:
            if self._closed:
                return results
            compacted: set[int] = set()
            durable_seq = -1
            for _run in range(1 + len(self._segment_record_bytes)):
                run = self._choose_run(ratio_min, frozenset(compacted))
                if not run:
                    break
                if durable_seq < 0:
                    # Sync what is written, so that every record superseding one we drop is
                    # on disk first, whatever the fsync policy.
                    with self._lock:
                        durable_seq = self._writer.request_sync_locked()
                    self._writer.wait_synced(durable_seq, None)
                try:
                    result = compact_run(self.path, self._lock, self._index,
                                         self._segment_record_bytes, run, durable_seq,
                                         self._compaction_stop)
                except (CompactionIncomplete, LogInvariantError) as exc:
                    failure = exc if isinstance(exc, CompactionIncomplete) else \
                        CompactionIncomplete(f"compaction stopped: {exc}")
                    self._compaction_failure = failure
                    log.error("%s", failure)
                    raise failure from exc
                compacted.update(run[:1])
                results.append(result)
                self._compaction_totals[0] += 1
                self._compaction_totals[1] += result.bytes_read
                self._compaction_totals[2] += result.bytes_written
        return results

    def _choose_run(self, ratio_min: float, exclude: frozenset[int]) -> list[int]:
        with self._lock:
            sealed_below = min(self._writer.open_segment_id, self._head_id)
            live_bytes = self._index.live_bytes
            usages = [SegmentUsage(segment_id, record_bytes, live_bytes.get(segment_id, 0))
                      for segment_id, record_bytes in sorted(self._segment_record_bytes.items())
                      if segment_id < sealed_below]
        return choose_run(usages, ratio_min, self._segment_bytes_max, exclude)

    def _compaction_loop(self) -> None:
        while not self._compaction_stop.wait(self._compaction_interval_s):
            try:
                self._compact_all(self._garbage_ratio_min)
            except CompactionAborted:
                return
            except CompactionIncomplete:
                return  # logged; the index may be off, so no more compaction
            except Exception as exc:  # e.g. a full disk: try again later
                log.warning("compaction of %s failed, will retry: %s", self.path, exc)

    # -- backup and stats ---------------------------------------------------------------

    def backup(self, dest_dir: str) -> BackupResult:
        """Copy a consistent point-in-time image of the log into dest_dir while writes go on.

        The head segment is sealed, everything up to then is synced, and the sealed segments
        are hard-linked (copied where links are impossible); compaction waits meanwhile.
        dest_dir must not exist or be empty. LogStore.recover(dest_dir) reads it back.
        """
        dest = os.path.abspath(dest_dir)
        os.makedirs(dest, exist_ok=True)
        if os.listdir(dest):
            raise PersistenceError(f"backup folder {dest} is not empty")
        with self._compaction_lock:
            with self._lock:
                if self._closed:
                    raise StoreClosedError(self.path)
                sealed_id = self._head_id
                self._roll_locked()
                seq_last = self._seq_last
                sync_seq = self._writer.request_sync_locked()
            self._writer.wait_synced(sync_seq, None)
            with self._lock:
                segment_ids = sorted(s for s in self._segment_record_bytes if s <= sealed_id)
            bytes_copied = 0
            for segment_id in segment_ids:
                name = segment_file_name(segment_id)
                bytes_copied += _link_or_copy(os.path.join(self.path, name),
                                              os.path.join(dest, name))
        fsync_dir(dest)
        return BackupResult(dest, seq_last, len(segment_ids), bytes_copied)

    def stats(self) -> StoreStats:
        with self._lock:
            index = self._index
            log_bytes = sum(self._segment_record_bytes.values())
            live_bytes = sum(index.live_bytes.values())
            return StoreStats(
                segment_count=len(self._segment_record_bytes),
                log_bytes=log_bytes,
                live_bytes=live_bytes,
                garbage_bytes=log_bytes - live_bytes,
                put_count=index.put_count,
                tombstone_count=index.tombstone_count,
                clear_count=len(index.clears),
                seq_last=self._seq_last,
                seq_durable=self._writer.durable_seq,
                sync_count=self._writer.syncs,
                compaction_count=self._compaction_totals[0],
                compaction_bytes_read=self._compaction_totals[1],
                compaction_bytes_written=self._compaction_totals[2],
                damage_count=len(self.damages),
            )

    def _check_index(self) -> None:
        """Test aid: the index kept up to date must equal one rebuilt from the files.

        Callers make sure nothing writes meanwhile.
        """
        self.flush()
        with self._compaction_lock, self._lock:
            rebuilt = rebuild(self.path)
            mine = self._index
            if rebuilt.index.keys != mine.keys:
                raise LogInvariantError("key entries differ from the rebuilt index")
            if rebuilt.index.clears != mine.clears:
                raise LogInvariantError("clear entries differ from the rebuilt index")
            theirs_live = {s: b for s, b in rebuilt.index.live_bytes.items() if b}
            mine_live = {s: b for s, b in mine.live_bytes.items() if b}
            if theirs_live != mine_live:
                raise LogInvariantError(f"live bytes {mine_live} != rebuilt {theirs_live}")
            if rebuilt.segment_bytes != self._segment_record_bytes:
                raise LogInvariantError(f"segment bytes {self._segment_record_bytes} != "
                                        f"rebuilt {rebuilt.segment_bytes}")
            if (rebuilt.index.put_count, rebuilt.index.tombstone_count) != \
                    (mine.put_count, mine.tombstone_count):
                raise LogInvariantError("put or tombstone counts differ from the rebuild")


def _check_input(prefix: int, key: bytes, value: bytes) -> None:
    """Raise the error a bad prefix, key or value deserves (put checks the common case inline).
    """
    if not isinstance(prefix, int) or isinstance(prefix, bool) or not 0 <= prefix <= prefix_max:
        raise ValueError(f"prefix must be an int in 0..2**64-1 (see make_prefix), "
                         f"not {prefix!r}")
    for what, data, bytes_max in (("key", key, key_bytes_max), ("value", value, value_bytes_max)):
        if not isinstance(data, bytes):
            raise TypeError(f"{what} must be bytes, not {type(data).__name__}")
        if len(data) > bytes_max:
            raise RecordTooLargeError(f"{what} of {len(data)} bytes is larger than the "
                                      f"{bytes_max} bytes a record allows")


def _link_or_copy(source: str, target: str) -> int:
    """Hard-link source as target, or copy it (and fsync) where links fail; bytes copied."""
    try:
        os.link(source, target)
        return 0
    except OSError:
        pass
    shutil.copyfile(source, target)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return os.path.getsize(target)
