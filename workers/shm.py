"""POSIX shared-memory segments whose life cycle this process owns.

Python 3.11's ``multiprocessing.shared_memory.SharedMemory`` registers every segment with the
multiprocessing resource tracker, which unlinks segments and warns on its own schedule (and
unlinks segments another process still uses). shmgrid instead opens segments with
``shm_open(O_CREAT | O_EXCL)`` itself, maps them with ``mmap``, and unlinks them explicitly:
the member unlinks its own segments, and the supervisor unlinks a killed member's segments
with :func:`remove_segments`.

Segment names are ``{prefix}-{n}`` where the prefix is ``shmgrid-{cluster}-{member}``, so
that whoever cleans up can find every segment of a member (or of a whole cluster) in
``/dev/shm``.
"""

from __future__ import annotations

import _posixshmem
import contextlib
import errno
import mmap
import os
import re

SHM_DIR = "/dev/shm"
# A segment created ``lazy`` reserves its memory as it fills: what a write needs, and once
# it holds some, a quarter of that more, up to this much (a page fault costs more than a
# page reserved ahead, but a fragment of a few keys should hold one page, not sixteen).
RESERVE_STEP_BYTES = 64 * 1024
# madvise(MADV_POPULATE_WRITE) (Linux 5.14): fault pages in writable, or fail with EFAULT
# where a write would raise SIGBUS (a full /dev/shm). Python 3.11's mmap does not name it.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_populate_works: bool | None = None  # probed once, by ``reserves_lazily``
NAME_PREFIX = "shmgrid-"
name_length_max = 200  # well under NAME_MAX (255), leaving room for tools that add suffixes
_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]+")
_SHM_MODE = 0o600  # only the member's own user may map its data

assert 0 < name_length_max <= 255
assert len(NAME_PREFIX) < name_length_max


def validate_prefix(prefix: str) -> str:
    """Check a segment prefix (``shmgrid-{cluster}-{member}``) and return it.

    Raises ValueError when the prefix has characters other than [A-Za-z0-9_.-], does not
    start with ``shmgrid-`` (cleanup finds segments by that), or leaves no room for a
    ``-{n}`` suffix within the name length limit.
    """
    if not isinstance(prefix, str):
        raise TypeError(f"segment prefix must be a str, not {type(prefix).__name__}")
    if not prefix.startswith(NAME_PREFIX) or len(prefix) == len(NAME_PREFIX):
        raise ValueError(
            f"segment prefix {prefix!r} must start with {NAME_PREFIX!r} followed by the"
            " cluster name and member id"
        )
    if _NAME_PATTERN.fullmatch(prefix) is None:
        raise ValueError(f"segment prefix {prefix!r} may contain only [A-Za-z0-9_.-]")
    # Leave room for "-" and a segment number of up to 20 digits.
    if len(prefix) > name_length_max - 21:
        raise ValueError(
            f"segment prefix {prefix!r} is {len(prefix)} characters; the limit is"
            f" {name_length_max - 21} so that segment names stay within {name_length_max}"
        )
    return prefix


def validate_name(name: str) -> str:
    """Check a full segment name and return it (same rules as a prefix, plus the length)."""
    if not isinstance(name, str):
        raise TypeError(f"segment name must be a str, not {type(name).__name__}")
    if _NAME_PATTERN.fullmatch(name) is None:
        raise ValueError(f"segment name {name!r} may contain only [A-Za-z0-9_.-]")
    if len(name) > name_length_max:
        raise ValueError(
            f"segment name {name!r} is {len(name)} characters; the limit is {name_length_max}"
        )
    return name


class Segment:
    """One shared-memory segment: created exclusively, mapped read-write, closed, unlinked.

    ``close`` unmaps (the segment keeps existing in /dev/shm); ``unlink`` removes the name
    (the memory is freed once no process maps it). Both are idempotent. ``pin_count`` lets
    readers (record iterators) keep the mapping alive after the owner retired the segment:
    ``retire`` unlinks at once and closes when the last pin is released.

    Its first ``reserved`` bytes have memory behind them: a write there cannot fail. A
    segment is reserved whole when it is created, unless it is ``lazy`` (a record arena,
    made far larger than its records, workers/record_store.py): then ``reserve`` reserves up
    to where its owner is about to write, so that the pages it never fills are never taken
    and their faults are taken in bulk.
    """

    __slots__ = ("name", "size_bytes", "mm", "pin_count", "reserved", "_closed", "_unlinked")

    def __init__(self, name: str, size_bytes: int, lazy: bool = False) -> None:
        """Create the segment ``name`` of ``size_bytes`` and map it; fail if it exists.

        The memory is reserved (posix_fallocate, or ``reserve`` as it fills when ``lazy``
        and the kernel can) so that a full /dev/shm fails with an OSError (ENOSPC) instead of
        killing the process with SIGBUS on a later write.
        """
        validate_name(name)
        if not isinstance(size_bytes, int) or size_bytes <= 0:
            raise ValueError(f"segment size must be a positive int, got {size_bytes!r}")
        self.name = name
        self.size_bytes = size_bytes
        self.pin_count = 0
        self._closed = False
        self._unlinked = False
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR
        fd = _posixshmem.shm_open("/" + name, flags, mode=_SHM_MODE)
        try:
            os.ftruncate(fd, size_bytes)
            # mmap keeps its own duplicate of fd, so ours can be closed right away.
            self.mm = mmap.mmap(
                fd, size_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
            self.reserved = 0
            if not (lazy and reserves_lazily()):
                _fallocate(fd, size_bytes)
                self.reserved = size_bytes
        except BaseException:
            mm = getattr(self, "mm", None)
            if mm is not None:  # mapped, then its memory could not be reserved
                mm.close()
            _posixshmem.shm_unlink("/" + name)
            self._closed = True
            self._unlinked = True
            raise
        finally:
            os.close(fd)
        assert len(self.mm) == size_bytes

    def reserve(self, end: int) -> None:
        """Make the first ``end`` bytes writable without fault: reserve their memory, in
        whole pages, and a quarter of what is reserved more (``RESERVE_STEP_BYTES`` at
        most; the segment's end at most). OSError (ENOSPC) when /dev/shm has no room for
        them; nothing is written then."""
        start = self.reserved
        if end <= start:
            return
        if end > self.size_bytes:
            raise ValueError(f"{self.name} has {self.size_bytes} bytes; {end} were asked for")
        page = mmap.PAGESIZE
        ahead = max(end, start + min(RESERVE_STEP_BYTES, start // 4))
        stop = min(self.size_bytes, (ahead + page - 1) // page * page)
        _populate(self.mm, self.name, start, stop - start)
        self.reserved = stop

    @property
    def held_bytes(self) -> int:
        """The memory the segment holds in /dev/shm: its reserved bytes in whole pages."""
        return -(-self.reserved // mmap.PAGESIZE) * mmap.PAGESIZE

    @property
    def closed(self) -> bool:
        """True once the mapping is gone."""
        return self._closed

    @property
    def unlinked(self) -> bool:
        """True once the name is gone from /dev/shm (by us or by someone else's cleanup)."""
        return self._unlinked

    def close(self) -> None:
        """Unmap the segment. Idempotent. The name stays until ``unlink``."""
        if self._closed:
            return
        self.mm.close()  # BufferError if a view into it is alive: then close stays retryable
        self._closed = True

    def unlink(self) -> None:
        """Remove the segment's name. Idempotent; a name already removed is not an error."""
        if self._unlinked:
            return
        self._unlinked = True
        # FileNotFoundError: the supervisor (or a test) removed it first.
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink("/" + self.name)

    def retire(self) -> None:
        """Unlink now; unmap now unless pinned, else when the last pin is released."""
        self.unlink()
        if self.pin_count == 0:
            self.close()

    def pin(self) -> None:
        """Keep the mapping alive until ``unpin`` (used by iterators over its records)."""
        assert not self._closed, self.name
        self.pin_count += 1

    def unpin(self) -> None:
        """Release one pin; unmap if the segment was retired and this was the last pin."""
        assert self.pin_count > 0, self.name
        self.pin_count -= 1
        if self.pin_count == 0 and self._unlinked:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "mapped"
        return f"Segment({self.name!r}, {self.size_bytes}, {state}, pins={self.pin_count})"


def reserves_lazily() -> bool:
    """Whether a ``lazy`` segment reserves its memory as it fills (``MADV_POPULATE_WRITE``,
    Linux 5.14) or is reserved whole when made. Probed once, on a page of anonymous shared
    memory (the kind /dev/shm holds)."""
    global _populate_works
    if _populate_works is None:
        with mmap.mmap(-1, mmap.PAGESIZE) as probe:
            try:
                _populate(probe, "probe", 0, mmap.PAGESIZE)
                _populate_works = True
            except OSError as error:
                if error.errno != errno.EINVAL:  # (EINVAL: a kernel before 5.14)
                    raise
                _populate_works = False
    return _populate_works


def _populate(mm: mmap.mmap, name: str, start: int, length: int) -> None:
    try:
        mm.madvise(_MADV_POPULATE_WRITE, start, length)
    except OSError as error:
        if error.errno != errno.EFAULT:  # a write would have raised SIGBUS: no memory
            raise
        raise OSError(errno.ENOSPC, f"no room in {SHM_DIR} for {length} more bytes of "
                                    f"segment {name}") from None


def _fallocate(fd: int, size_bytes: int) -> None:
    """Reserve the segment's memory where the platform can."""
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError as error:
        # tmpfs supports fallocate since Linux 3.5; elsewhere keep the sparse segment.
        if error.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise


class SegmentReader:
    """Another process's segment, opened read-only by name, read with ``pread`` into a
    buffer: the kernel copies straight from the segment's pages, with no mapping of ours to
    fault in. A context manager; the segment's size is fixed when it opens."""

    __slots__ = ("name", "fd", "size_bytes")

    def __init__(self, name: str) -> None:
        """Open ``name``; FileNotFoundError when it is gone (its owner died or retired it)."""
        self.name = validate_name(name)
        self.fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0)
        self.size_bytes = os.fstat(self.fd).st_size

    def read_into(self, target: memoryview, offset: int) -> None:
        """Fill ``target`` (writable bytes) from the segment at ``offset``."""
        if offset < 0 or offset + len(target) > self.size_bytes:
            raise ValueError(f"bytes {offset}..{offset + len(target)} lie outside segment"
                             f" {self.name!r} of {self.size_bytes} bytes")
        done = 0
        while done < len(target):  # Linux reads at most 2 GiB - 4 KiB in one call
            count = os.preadv(self.fd, [target[done:]], offset + done)
            if count <= 0:
                raise OSError(errno.EIO, f"segment {self.name!r} ended at {offset + done}")
            done += count

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def unlink_segment(name: str) -> bool:
    """Remove the name ``name`` from /dev/shm; False when there was none."""
    try:
        _posixshmem.shm_unlink("/" + validate_name(name))
    except FileNotFoundError:
        return False
    return True


def list_segments(prefix: str) -> list[str]:
    """Names in /dev/shm that start with ``prefix + "-"``, sorted."""
    validate_prefix(prefix)
    start = prefix + "-"
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(name for name in names if name.startswith(start))


def remove_segments(prefix: str) -> list[str]:
    """Unlink every /dev/shm segment whose name starts with ``prefix + "-"``.

    For the supervisor, after a member was killed (its segments outlive it), and for tests.
    Returns the names this call unlinked; names that vanish meanwhile are skipped.
    """
    return [name for name in list_segments(prefix) if unlink_segment(name)]
