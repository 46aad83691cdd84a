"""Segment life cycle: exclusive creation, mapping, idempotent close/unlink, cleanup by prefix."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from workers import shm
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
