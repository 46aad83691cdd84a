"""The few system calls the store makes, behind one class so tests can inject faults."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
from collections.abc import Sequence

# Linux accepts up to 1024 buffers per writev call.
iov_count_max = 1024


class FileOps:
    """Opening, writing and syncing files. Tests subclass it to fail a write or an fsync."""

    def open_new(self, path: str) -> int:
        """Create path (which must not exist) for appending and return its descriptor."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)

    def writev(self, fd: int, buffers: Sequence[bytes]) -> int:
        """One writev call; may write less than everything, as the system call may."""
        return os.writev(fd, buffers)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def fsync_dir(self, path: str) -> None:
        fsync_dir(path)

    def fsync_path(self, path: str) -> None:
        """Sync a file already closed; one replaced or removed since needs nothing."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            self.fsync(fd)
        finally:
            os.close(fd)


def write_all(ops: FileOps, fd: int, buffers: Sequence[bytes]) -> int:
    """Write every byte of buffers in order, looping over short writes; returns the total."""
    pending = [memoryview(b) for b in buffers if len(b)]
    total = 0
    attempts_max = 1 + sum(len(b) for b in pending)
    for _attempt in range(attempts_max):
        if not pending:
            return total
        written = ops.writev(fd, pending[:iov_count_max])
        if written <= 0:
            raise OSError(errno.EIO, "writev wrote nothing")
        total += written
        while written:
            head = pending[0]
            if written >= len(head):
                written -= len(head)
                pending.pop(0)
            else:
                pending[0] = head[written:]
                written = 0
    raise AssertionError("write_all made no progress")


def fsync_dir(path: str) -> None:
    """Make file creations, renames and removals in folder path durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Replace path with data so that a crash leaves either the old or the new file whole.

    Temp file (unique, so concurrent writers never share one), fsync, rename, fsync of the
    folder.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp_path = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.", dir=folder)
    try:
        try:
            write_all(FileOps(), fd, [data])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_path)
        raise
    fsync_dir(folder)


LOCK_FILE_NAME = "LOCK"


def lock_folder(path: str, exclusive: bool) -> int | None:
    """Take the folder's advisory lock without waiting; return its descriptor.

    Exclusive for a LogStore (creating the lock file), shared for a reader, which gets None
    when no store ever opened the folder. Raises BlockingIOError if someone holds it.
    """
    lock_path = os.path.join(path, LOCK_FILE_NAME)
    if exclusive:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    else:
        try:
            fd = os.open(lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock_folder(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the flock
