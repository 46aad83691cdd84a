"""Fixtures that give each test its own segment prefix and prove it left /dev/shm clean."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.conftest import test_cluster_name
from workers import record_store
from workers.record_store import RecordStore
from workers.shm import list_segments, remove_segments


def unique_prefix() -> str:
    """A prefix no other test (or concurrent run) uses: shmgrid-{cluster}-{member}."""
    return f"shmgrid-{test_cluster_name()}-0"


@pytest.fixture
def shm_prefix() -> Iterator[str]:
    """A unique prefix; after the test, no segment with it may remain (removed either way)."""
    prefix = unique_prefix()
    yield prefix
    leaked = remove_segments(prefix)
    assert leaked == [], f"test left segments in /dev/shm: {leaked}"
    assert list_segments(prefix) == []


@pytest.fixture
def make_store(shm_prefix: str) -> Iterator[Callable[..., RecordStore]]:
    """Build stores on the test's prefix; every one is closed after the test, even on failure."""
    stores: list[RecordStore] = []

    def make(**options: int) -> RecordStore:
        store = RecordStore(shm_prefix, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def replace_key_hash(hash_of: Callable[[bytes], int]) -> Callable[[], None]:
    """Give the record store another index hash (a narrow one makes keys collide), in both
    the forms it calls: one key, and a batch (``key_hashes``). Returns what undoes it."""
    originals = record_store.key_hash, record_store.key_hashes
    record_store.key_hash = hash_of
    record_store.key_hashes = lambda keys: [hash_of(key) for key in keys]

    def restore() -> None:
        record_store.key_hash, record_store.key_hashes = originals

    return restore


@pytest.fixture
def key_hash_replaced() -> Iterator[Callable[[Callable[[bytes], int]], None]]:
    """``replace_key_hash`` for a test; the real hash is back after it."""
    undo: list[Callable[[], None]] = []
    yield lambda hash_of: undo.append(replace_key_hash(hash_of))
    for restore in reversed(undo):
        restore()
