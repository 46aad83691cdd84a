"""Segment life cycle: exclusive creation, mapping, idempotent close/unlink, cleanup by prefix."""

from __future__ import annotations

import errno
import mmap
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from workers import shm
from workers.record_store import ARENA_BYTES_WHOLE, RecordStore
from workers.shm import Segment, list_segments, remove_segments, validate_prefix

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shm_path(name: str) -> str:
    return os.path.join(shm.SHM_DIR, name)


def test_create_maps_a_private_segment_of_the_given_size(shm_prefix: str) -> None:
    segment = Segment(f"{shm_prefix}-0", 10_000)
    try:
        info = os.stat(shm_path(segment.name))
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_size == 10_000
        assert len(segment.mm) == 10_000
        segment.mm[0:5] = b"hello"
        # Another mapping of the same name sees the bytes: it really is shared memory.
        with open(shm_path(segment.name), "rb") as other:
            assert other.read(5) == b"hello"
    finally:
        segment.close()
        segment.unlink()
    assert segment.closed
    assert segment.unlinked
    assert not os.path.exists(shm_path(segment.name))


def test_close_and_unlink_are_idempotent_in_either_order(shm_prefix: str) -> None:
    first = Segment(f"{shm_prefix}-0", 4096)
    first.unlink()
    first.unlink()
    assert not os.path.exists(shm_path(first.name))
    first.mm[0:1] = b"x"  # unlinked but still mapped: the memory lives until close
    first.close()
    first.close()
    second = Segment(f"{shm_prefix}-1", 4096)
    second.close()
    second.close()
    assert os.path.exists(shm_path(second.name))  # closing keeps the name
    second.unlink()
    second.unlink()
    assert list_segments(shm_prefix) == []


def test_unlink_after_someone_else_removed_it_is_quiet(shm_prefix: str) -> None:
    segment = Segment(f"{shm_prefix}-0", 4096)
    assert remove_segments(shm_prefix) == [segment.name]
    segment.unlink()
    segment.close()
    assert segment.unlinked


def test_create_refuses_an_existing_name_and_leaves_it_intact(shm_prefix: str) -> None:
    segment = Segment(f"{shm_prefix}-0", 4096)
    try:
        segment.mm[0:3] = b"abc"
        with pytest.raises(FileExistsError):
            Segment(segment.name, 8192)
        assert os.stat(shm_path(segment.name)).st_size == 4096
        assert segment.mm[0:3] == b"abc"
    finally:
        segment.close()
        segment.unlink()


@pytest.mark.parametrize("size_bytes", [0, -1, 1.5])
def test_create_refuses_bad_sizes_and_leaves_nothing(shm_prefix: str, size_bytes: object) -> None:
    with pytest.raises(ValueError, match="size"):
        Segment(f"{shm_prefix}-0", size_bytes)  # type: ignore[arg-type]
    assert list_segments(shm_prefix) == []


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "shmgrid-",
        "other-c-0",
        "shmgrid-c/0",
        "shmgrid-c 0",
        "shmgrid-ü-0",
        "shmgrid-" + "x" * 180,
    ],
)
def test_bad_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ValueError):
        validate_prefix(prefix)
    with pytest.raises(ValueError):
        list_segments(prefix)
    with pytest.raises(ValueError):
        remove_segments(prefix)


def test_names_up_to_the_limit_are_accepted_and_longer_ones_refused() -> None:
    assert validate_prefix("shmgrid-a.b_c-0") == "shmgrid-a.b_c-0"
    assert shm.validate_name("x" * shm.name_length_max)
    with pytest.raises(ValueError, match="limit"):
        shm.validate_name("x" * (shm.name_length_max + 1))
    with pytest.raises(ValueError):
        shm.validate_name("a/b")


def test_retire_keeps_a_pinned_mapping_until_the_last_unpin(shm_prefix: str) -> None:
    segment = Segment(f"{shm_prefix}-0", 4096)
    segment.pin()
    segment.pin()
    segment.retire()
    assert segment.unlinked
    assert not segment.closed
    assert list_segments(shm_prefix) == []
    segment.unpin()
    assert not segment.closed
    segment.unpin()
    assert segment.closed


def test_remove_segments_takes_only_names_under_the_prefix(shm_prefix: str) -> None:
    neighbour = shm_prefix + "0"  # e.g. member 10 next to member 1: must survive
    segments = [Segment(f"{shm_prefix}-{n}", 4096) for n in range(3)]
    other = Segment(f"{neighbour}-0", 4096)
    try:
        for segment in segments:
            segment.close()
        assert list_segments(shm_prefix) == sorted(s.name for s in segments)
        assert remove_segments(shm_prefix) == sorted(s.name for s in segments)
        assert list_segments(shm_prefix) == []
        assert remove_segments(shm_prefix) == []
        assert list_segments(neighbour) == [other.name]
    finally:
        other.close()
        other.unlink()
        remove_segments(neighbour)


def test_remove_segments_cleans_up_after_a_killed_member(shm_prefix: str) -> None:
    """A member killed by SIGKILL leaves its segments; the supervisor's call removes them."""
    child = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {ROOT!r})
        from workers.record_store import RecordStore
        store = RecordStore({shm_prefix!r}, initial_segment_bytes=4096)
        for pid in range(5):
            store.put_many(pid, "m", [(b"k%d" % i, b"v" * 50) for i in range(200)])
        print(len(store.partitions()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert result.stdout.strip() == "5"
    left = list_segments(shm_prefix)
    assert len(left) == 5
    assert remove_segments(shm_prefix) == left
    assert list_segments(shm_prefix) == []


def _pages_held(name: str) -> int:
    return os.stat(shm_path(name)).st_blocks * 512


def test_a_lazy_segment_holds_only_the_pages_it_reserved(shm_prefix: str) -> None:
    """A lazy segment (a record arena) takes memory as its owner reserves it, in pages, a
    quarter more than it holds at a time (up to ``RESERVE_STEP_BYTES``), never past its size;
    a segment made whole holds all."""
    page = mmap.PAGESIZE
    whole = Segment(f"{shm_prefix}-0", 300_000)
    lazy = Segment(f"{shm_prefix}-1", 1 << 20, lazy=True)
    try:
        if not shm._populate_works:
            pytest.skip("this kernel has no MADV_POPULATE_WRITE: segments are made whole")
        assert whole.reserved == 300_000 and _pages_held(whole.name) >= 300_000
        assert lazy.reserved <= page and _pages_held(lazy.name) == lazy.held_bytes
        lazy.reserve(100_001)
        assert lazy.reserved == 100_001 + page - 100_001 % page
        assert _pages_held(lazy.name) == lazy.held_bytes == lazy.reserved
        lazy.mm[0:lazy.reserved] = b"x" * lazy.reserved
        assert _pages_held(lazy.name) == lazy.reserved  # writing there took nothing more
        before = lazy.reserved
        lazy.reserve(before + 1)  # a small step reserves a quarter of what it holds more
        assert lazy.reserved == before + before // 4 + page - (before + before // 4) % page
        lazy.reserve(600_000)
        before = lazy.reserved
        lazy.reserve(before + 1)  # ...up to a step
        assert lazy.reserved == before + shm.RESERVE_STEP_BYTES
        with pytest.raises(ValueError, match="were asked for"):
            lazy.reserve((1 << 20) + 1)
        lazy.reserve(1 << 20)
        assert lazy.reserved == 1 << 20 == _pages_held(lazy.name)
    finally:
        for segment in (whole, lazy):
            segment.close()
            segment.unlink()


def test_reserving_what_a_write_could_not_have_is_no_room_not_a_sigbus(tmp_path) -> None:
    """Where a write would kill the process with SIGBUS (a full /dev/shm; here, a mapping
    past its file's end), reserving fails with ENOSPC and the process goes on."""
    page = mmap.PAGESIZE
    path = tmp_path / "short"
    path.write_bytes(b"\0" * 2 * page)
    with open(path, "r+b") as file:
        mm = mmap.mmap(file.fileno(), 2 * page)
        file.truncate(page)  # the mapping's second page lies past the end now
    try:
        try:
            shm._populate(mm, "short", 0, page)
        except OSError as error:
            if error.errno == errno.EINVAL:
                pytest.skip("this kernel has no MADV_POPULATE_WRITE")
            raise
        with pytest.raises(OSError) as caught:
            shm._populate(mm, "short", page, page)
        assert caught.value.errno == errno.ENOSPC
        assert "segment short" in str(caught.value)
    finally:
        mm.close()


def _no_room(*args: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_segment_whose_memory_cannot_be_reserved_leaves_nothing(shm_prefix: str,
                                                                  monkeypatch) -> None:
    monkeypatch.setattr(shm, "_fallocate", _no_room)
    with pytest.raises(OSError) as caught:
        Segment(f"{shm_prefix}-0", 100_000)
    assert caught.value.errno == errno.ENOSPC
    assert list_segments(shm_prefix) == []


def test_a_lazy_segment_whose_memory_cannot_be_reserved_holds_nothing(shm_prefix: str,
                                                                     monkeypatch) -> None:
    """A lazy segment is made holding no memory; a reservation that finds no room fails
    with ENOSPC and leaves it as it was (its owner then fails the write, changing nothing)."""
    if not shm.reserves_lazily():
        pytest.skip("this kernel has no MADV_POPULATE_WRITE: segments are made whole")
    monkeypatch.setattr(shm, "_populate", _no_room)
    segment = Segment(f"{shm_prefix}-0", 1 << 30, lazy=True)
    try:
        assert segment.reserved == 0 and _pages_held(segment.name) == 0
        with pytest.raises(OSError) as caught:
            segment.reserve(100_000)
        assert caught.value.errno == errno.ENOSPC
        assert segment.reserved == 0 and _pages_held(segment.name) == 0
    finally:
        segment.close()
        segment.unlink()


def test_a_kernel_without_populate_makes_lazy_segments_whole(shm_prefix: str,
                                                             monkeypatch) -> None:
    """Before Linux 5.14 ``MADV_POPULATE_WRITE`` is EINVAL: the first lazy segment finds
    out, and it and every later one are reserved whole when made, as before; a record store
    then makes its arenas small (``ARENA_BYTES_WHOLE``), to grow as they fill."""
    def unknown_advice(*args: object) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(shm, "_populate", unknown_advice)
    monkeypatch.setattr(shm, "_populate_works", None)
    segments = [Segment(f"{shm_prefix}-{n}", 100_000, lazy=True) for n in range(2)]
    try:
        assert shm._populate_works is False
        for segment in segments:
            assert segment.reserved == 100_000 and _pages_held(segment.name) >= 100_000
            segment.reserve(100_000)  # (nothing left to reserve: no populate)
    finally:
        for segment in segments:
            segment.close()
            segment.unlink()
    store = RecordStore(f"{shm_prefix}-store")
    try:
        store.put(0, "m", b"k", b"v")
        assert store._partitions[0]["m"].capacity == ARENA_BYTES_WHOLE
        assert _pages_held(store._partitions[0]["m"].segment.name) == ARENA_BYTES_WHOLE
    finally:
        store.close()
