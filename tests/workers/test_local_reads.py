"""Local reads from shared memory: the shared index against a model, a published record store
against the dict model (read back through the client's reader), the reader's refusals, and a
writer process racing readers (no torn or invented value, ever)."""

from __future__ import annotations

import errno
import hashlib
import math
import random
import struct
import time

import msgpack
import multiprocess
import pytest
from hypothesis import settings
from hypothesis.stateful import initialize, invariant, rule

from grid.client import local_reads as client_reads
from grid.client.local_reads import MISS, UNPUBLISHED, LocalReader
from grid.client.map import LocalFragment
from grid.local_reads import RETRY, SEQ, SLOT, probe, records
from tests.workers.conftest import unique_prefix
from tests.workers.test_record_block import frame_of
from tests.workers.test_record_store import (
    KEYS,
    StoreMachine,
    fragment_count,
    machine_settings,
)
from workers import local_reads, record_store
from workers.local_reads import LocalReadDirectory, SharedIndex, fence
from workers.record_block import parse_records
from workers.record_store import ARENA_BYTES_WHOLE, BLOCK_APPEND_MIN, RecordStore
from workers.shm import list_segments, remove_segments

pytestmark = pytest.mark.timeout(120)

UUID = "00000000-0000-0000-0000-000000000001"


def reader_for(prefix: str) -> tuple[LocalReader, str]:
    """A client's reader of the store with ``prefix`` (shmgrid-{cluster}-{member})."""
    cluster, member = prefix[len("shmgrid-"):].rsplit("-", 1)
    return LocalReader(cluster), member


def serve_everything(directory: LocalReadDirectory, partition_count: int) -> None:
    """What the member does when it owns every partition and no write waits."""
    directory.renew(math.inf)
    for pid in range(partition_count):
        directory.set_served(pid, True)
        for namespace in directory.namespaces:
            directory.settle(namespace, pid)


# -- the shared index ---------------------------------------------------------------------------


@pytest.mark.parametrize("vector_build_min", [0, local_reads.VECTOR_BUILD_MIN])
@pytest.mark.parametrize("seed", range(20))
def test_the_shared_index_follows_a_model_through_inserts_moves_and_deletes(
        make_store, monkeypatch, seed, vector_build_min) -> None:
    """(Inserted one at a time and in batches; built again from the model as it fills, by
    numpy or one entry at a time.)"""
    monkeypatch.setattr(local_reads, "VECTOR_BUILD_MIN", vector_build_min)
    rng = random.Random(seed)
    store = make_store()
    hash_range = rng.choice([4, 64, 1 << 64])  # few values: long runs of colliding entries
    index = SharedIndex.build(store.new_segment, {}, 0)
    model: dict[int, set[int]] = {}
    for step in range(400):
        if index.full():
            entries = {h: tuple(sorted(offsets)) if len(offsets) > 1 else next(iter(offsets))
                       for h, offsets in model.items()}
            old, index = index, SharedIndex.build(store.new_segment, entries,
                                                  sum(map(len, model.values())))
            old.segment.retire()
        action = rng.random()
        present = [(h, o) for h, offsets in model.items() for o in offsets]
        if action < 0.4 or not present:
            h, offset = rng.randrange(hash_range), step * 16
            index.insert(h, offset)
            model.setdefault(h, set()).add(offset)
        elif action < 0.5:  # a batch of new keys, as a block append places them
            hashes = [rng.randrange(hash_range) for _ in range(rng.randrange(1, 6))]
            if index.full(len(hashes)):
                continue
            offsets = [step * 16 + 2 * k for k in range(len(hashes))]
            index.insert_many(hashes, offsets)
            for h, offset in zip(hashes, offsets, strict=True):
                model.setdefault(h, set()).add(offset)
        elif action < 0.7:
            h, offset = rng.choice(present)
            index.replace(h, offset, step * 16 + 8)
            model[h].remove(offset)
            model[h].add(step * 16 + 8)
        else:
            h, offset = rng.choice(present)
            index.delete(h, offset)
            model[h].remove(offset)
            if not model[h]:
                del model[h]
        assert {h: sorted(o) for h, o in index.entries().items()} == \
            {h: sorted(o) for h, o in model.items()}
    index.segment.retire()


@pytest.mark.parametrize("seed", range(10))
def test_an_index_built_in_bulk_reaches_every_entry_from_its_home(make_store, seed) -> None:
    """Entries whose homes crowd the table's end (runs wrap around to its start), and
    hashes shared by several records: each entry is found by probing from its home slot
    before any empty slot, as a reader probes."""
    rng = random.Random(seed)
    count = rng.randrange(local_reads.VECTOR_BUILD_MIN, 3000)
    capacity = local_reads._capacity_for(count)
    high = rng.getrandbits(40) * capacity
    entries: dict[int, int | tuple[int, ...]] = {}
    offset = 0
    while offset < count:
        h = high + capacity - 1 - int(rng.expovariate(1 / 40)) % capacity  # near the end
        together = min(count - offset, 2 if rng.random() < 0.05 else 1)
        taken = tuple(range(offset, offset + together))
        old = entries.get(h, ())
        merged = (old if isinstance(old, tuple) else (old,)) + taken
        entries[h] = merged[0] if len(merged) == 1 else merged
        offset += together
    index = SharedIndex.build(make_store().new_segment, entries, count)
    assert index.capacity == capacity
    model = {h: sorted((e,) if isinstance(e, int) else e) for h, e in entries.items()}
    assert {h: sorted(o) for h, o in index.entries().items()} == model
    table = {i: struct.unpack_from("<QQ", index.mm, 16 + 16 * i) for i in range(capacity)}
    for h, offsets in model.items():
        for offset in offsets:
            i = h & (capacity - 1)
            while table[i] != (h, offset + 1):
                assert table[i][1], f"an empty slot before hash {h:#x} at {offset}"
                i = (i + 1) & (capacity - 1)
    assert any(table[i][1] for i in range(8))  # some run wrapped around
    index.segment.retire()


# -- a published store against the dict model ---------------------------------------------------


class PublishedStoreMachine(StoreMachine):
    """The record store model with both namespaces published: after every step, every key
    read through the client's local reader gives what the model holds."""

    def __init__(self) -> None:
        super().__init__()
        self.store.local = LocalReadDirectory(self.prefix, UUID, 2)
        self.reader, self.member = reader_for(self.prefix)
        self.reader_hash = client_reads.key_hash
        if self.hash_override is not None:
            client_reads.key_hash = self.hash_override

    @initialize()
    def start(self) -> None:
        assert list_segments(self.prefix) == [f"{self.prefix}-local"]
        assert self.store.publish("a")

    @rule()
    def publish_b(self) -> None:
        assert self.store.publish("b")

    @invariant()
    def sizes_and_fragments_agree(self) -> None:
        for (pid, namespace), fragment in self.model.items():
            assert self.store.size(pid, namespace) == len(fragment)
        self.store._check()  # compares each shared index with its fragment's dict
        published = self.store.local.namespaces
        shared = sum(1 for pid in self.store.partitions()
                     for namespace in self.store.namespaces(pid) if namespace in published)
        # Arenas, the shared indexes, the directory and one slot segment per namespace.
        assert len(list_segments(self.prefix)) == \
            fragment_count(self.store) + shared + 1 + len(published)

    @invariant()
    def local_reads_give_the_model(self) -> None:
        serve_everything(self.store.local, 2)
        for namespace in ("a", "b"):
            for pid in (0, 1):
                fragment = self.model.get((pid, namespace), {})
                for key in {*KEYS, *fragment}:
                    got = self.reader.get(namespace, key, pid, UUID, self.member)
                    if namespace not in self.store.local.namespaces:
                        assert got is UNPUBLISHED
                    else:
                        assert got == fragment.get(key), (namespace, pid, key)
                scanned = self.reader.scan(namespace, pid, UUID, self.member)
                if namespace in self.store.local.namespaces:
                    # The records laid end to end, as the member's ENTRIES reply has them.
                    assert scanned == self.store.concatenated(pid, namespace)

    def teardown(self) -> None:
        try:
            self.reader.close()
        finally:
            client_reads.key_hash = self.reader_hash
            super().teardown()


class CollidingPublishedStoreMachine(PublishedStoreMachine):
    hash_override = staticmethod(lambda key: len(key) % 4)


TestPublishedStoreModel = PublishedStoreMachine.TestCase
TestPublishedStoreModel.settings = machine_settings
TestCollidingPublishedStoreModel = CollidingPublishedStoreMachine.TestCase
TestCollidingPublishedStoreModel.settings = settings(machine_settings, max_examples=30)


# -- when the reader must not answer ------------------------------------------------------------


@pytest.fixture
def published(shm_prefix):
    # Arenas as small as where memory is reserved whole, so that a test can make one grow
    # (by default an arena is large from the start, and fills in place: the members' tests
    # read those).
    store = RecordStore(shm_prefix, initial_segment_bytes=ARENA_BYTES_WHOLE)
    store.local = LocalReadDirectory(shm_prefix, UUID, 4)
    reader, member = reader_for(shm_prefix)
    try:
        store.put(1, "m", b"k", b"v")
        assert store.publish("m")
        serve_everything(store.local, 4)
        yield store, reader, member
    finally:
        reader.close()
        store.close()


def test_the_reader_answers_what_the_store_holds(published) -> None:
    store, reader, member = published
    assert reader.get("m", b"k", 1, UUID, member) == b"v"
    assert reader.get("m", b"other", 1, UUID, member) is None
    assert reader.get("m", b"k", 2, UUID, member) is None  # no fragment there: absent
    assert reader.get("other map", b"k", 1, UUID, member) is UNPUBLISHED
    assert reader.hits == 3


def test_the_reader_refuses_an_unsettled_slot_an_unserved_partition_and_an_old_lease(
        published) -> None:
    store, reader, member = published
    store.put(1, "m", b"k", b"v2")  # a write: unsettled until the member settles it
    assert reader.get("m", b"k", 1, UUID, member) is MISS
    store.settle(1, "m")
    assert reader.get("m", b"k", 1, UUID, member) == b"v2"
    store.local.set_served(1, False)  # the member's table moved the partition away
    assert reader.get("m", b"k", 1, UUID, member) is MISS
    store.local.set_served(1, True)
    store.local.renew(time.monotonic() - 0.001)  # the membership lease ran out
    assert reader.get("m", b"k", 1, UUID, member) is MISS
    store.local.renew(math.inf)
    assert reader.get("m", b"k", 1, UUID, member) == b"v2"


def test_a_scan_copies_no_more_than_its_limit(published) -> None:
    """A partition larger than a scan's chunk is left to its owner (which sends it in
    chunks): the reader gives up once the records it copied pass the limit."""
    store, reader, member = published
    for i in range(50):
        store.put(1, "m", b"key%d" % i, b"v" * 100)
    store.settle(1, "m")
    whole = reader.scan("m", 1, UUID, member)
    data, count = whole
    assert count == 51 and len(data) == 2 + sum(len(b"key%d" % i) + 100 for i in range(50))
    assert reader.scan("m", 1, UUID, member, max_bytes=10 * len(data)) == whole
    assert reader.scan("m", 1, UUID, member, max_bytes=len(data)) == whole  # exactly fits
    hits, misses, oversized = reader.hits, reader.misses, reader.oversized
    assert reader.scan("m", 1, UUID, member, max_bytes=len(data) - 1) is MISS
    assert reader.scan("m", 1, UUID, member, max_bytes=0) is MISS
    assert (reader.hits, reader.misses, reader.oversized) == (hits, misses + 2, oversized + 2)
    assert reader.scan("m", 2, UUID, member, max_bytes=0) == (b"", 0)  # nothing to copy


def test_a_fragment_copy_holds_what_a_scan_reads(published) -> None:
    """The copy a bulk reader decodes (index table and arena segment, as they are) gives the
    records a scan gives, dead records left behind; it is refused past its limit."""
    store, reader, member = published
    for i in range(50):
        store.put(1, "m", b"key%d" % i, b"v" * 100)
    store.put(1, "m", b"key3", b"new")  # the old record stays in the arena, unindexed
    store.remove(1, "m", b"key7")
    store.settle(1, "m")
    index, arena = reader.copy_fragment("m", 1, UUID, member)
    assert records(index, arena) == reader.scan("m", 1, UUID, member)
    assert records(index, arena)[1] == 50
    assert len(arena) == store._partitions[1]["m"].top  # to its last record (key3's)
    assert reader.copy_fragment("m", 1, UUID, member, max_bytes=len(arena)) == (index, arena)
    assert reader.copy_fragment("m", 1, UUID, member, max_bytes=len(arena) - 1) is MISS
    assert reader.copy_fragment("m", 2, UUID, member) is None  # no fragment: nothing to copy
    assert reader.copy_fragment("other map", 1, UUID, member) is UNPUBLISHED


def test_a_fragment_copy_of_a_large_arena_is_its_records(shm_prefix) -> None:
    """An arena as a member makes it, large and filled from its start: the copy a bulk
    reader takes ends where its last record does, and the limit applies to that."""
    store = RecordStore(shm_prefix)
    store.local = LocalReadDirectory(shm_prefix, UUID, 4)
    reader, member = reader_for(shm_prefix)
    try:
        store.put_many(1, "m", [(b"key%d" % i, b"v" * 100) for i in range(50)])
        store.remove(1, "m", b"key49")  # the last record, dead: the copy ends before it
        assert store.publish("m")
        serve_everything(store.local, 4)
        fragment = store._partitions[1]["m"]
        assert fragment.capacity > 1 << 20
        index, arena = reader.copy_fragment("m", 1, UUID, member)
        assert len(arena) == fragment.top - (8 + 5 + 100)
        assert records(index, arena) == reader.scan("m", 1, UUID, member)
        assert records(index, arena)[1] == 49
        assert reader.copy_fragment("m", 1, UUID, member, max_bytes=len(arena)) == (index,
                                                                                     arena)
        assert reader.copy_fragment("m", 1, UUID, member, max_bytes=64 * 1024) == (index,
                                                                                    arena)
        assert reader.copy_fragment("m", 1, UUID, member, max_bytes=len(arena) - 1) is MISS
        store.clear(1, "m")
        store.put(1, "m", b"k", b"v")
        store.remove(1, "m", b"k")  # a fragment with no record: nothing of its arena
        store.settle(1, "m")
        assert reader.copy_fragment("m", 1, UUID, member)[1] == b""
    finally:
        reader.close()
        store.close()


def test_a_batch_of_new_keys_reaches_the_shared_index_in_one_block(published) -> None:
    """A batch of new keys into a published fragment (the block append) builds a larger
    shared index when the table would fill, and is inserted into it in one copy while it
    has room."""
    store, reader, member = published
    fragment = store._partitions[1]["m"]
    capacity = fragment.shared.index.capacity
    first = {b"first%d" % i: b"f" * i for i in range(capacity)}
    store.put_many(1, "m", first.items())
    capacity = fragment.shared.index.capacity
    assert capacity >= 2 * (2 * fragment.count + 1)  # built again, with room for as many
    room = capacity // 2 - fragment.count  # new keys the table takes as it is
    assert room >= BLOCK_APPEND_MIN
    second = {b"second%d" % i: b"s" * i for i in range(room)}
    store.put_many(1, "m", second.items())
    assert fragment.shared.index.capacity == capacity  # inserted into the same table
    store._check()  # every shared index holds what its fragment's dict holds
    store.settle(1, "m")
    wanted = {b"k": b"v", **first, **second}
    assert [reader.get("m", key, 1, UUID, member) for key in wanted] == list(wanted.values())


def test_a_block_into_a_published_fragment_reaches_its_shared_index_once_the_load_is_over(
        published) -> None:
    """New keys appended as a block to a published fragment (a bulk load) leave its shared
    index behind, and its slot unsettled however often the member settles it, so that
    readers ask the owner; writes meanwhile change the dict alone. Once the member wanted
    the slot settled and a whole tick passed with no change (``loads_over`` twice), the
    index is built from the dict, every key of the block is in it, and the slot settles."""
    store, reader, member = published
    pairs = [(b"p%d" % i, b"v" * i) for i in range(40)]
    store.put_groups("m", [(1, parse_records(frame_of(pairs), len(pairs)))])
    shared = store._partitions[1]["m"].shared
    assert shared.deferred and not shared.settled()
    store.put(1, "m", b"p3", b"changed")  # writes while deferred: the dict only
    store.remove(1, "m", b"k")
    store.settle(1, "m")
    assert not shared.settled() and store.loading == {(1, "m"): shared}
    assert reader.get("m", b"p1", 1, UUID, member) is MISS  # the owner answers it
    store._check()  # a deferred index's slot is not settled
    assert store.loads_over() == []  # the first tick: the load may go on
    assert store.loads_over() == [(1, "m")]  # a whole tick with no change: over
    assert not shared.deferred and store.loading == {}
    store._check()  # the built index holds what the dict holds
    assert not shared.settled()  # the member settles it (it checks what it owns)
    store.settle(1, "m")
    expected = {**dict(pairs), b"p3": b"changed", b"k": None}
    assert {key: reader.get("m", key, 1, UUID, member) for key in expected} == expected


def test_a_change_after_the_settle_keeps_the_load_going(published) -> None:
    """Only a tick with no change after the member wanted the slot settled ends a load: a
    write then (which waits for its backups, so the member may not settle) drops it from
    the loads until the member settles again, and a settle starts the tick over."""
    store, reader, member = published
    pairs = [(b"p%d" % i, b"v") for i in range(20)]
    for first in (0, 10):
        block = parse_records(frame_of(pairs[first:first + 10]), 10)
        store.put_groups("m", [(1, block)])
        store.settle(1, "m")
        assert store.loads_over() == []
    store.put(1, "m", b"late", b"w")  # not yet acknowledged: no settle
    assert store.loads_over() == [] and store.loading == {}
    store.settle(1, "m")
    assert store.loads_over() == []
    store.settle(1, "m")  # another call of the load was acknowledged: a tick again
    assert store.loads_over() == []
    assert store.loads_over() == [(1, "m")]
    store.settle(1, "m")
    assert reader.get("m", b"late", 1, UUID, member) == b"w"
    assert reader.get("m", b"p19", 1, UUID, member) == b"v"


def test_loads_over_builds_about_rows_max_rows_a_call(published) -> None:
    """A tick builds the shared indexes of ended loads up to about ``rows_max`` rows (a
    fragment whole), the rest at the next; a fragment dropped meanwhile is forgotten."""
    store, _, _ = published
    for pid in (0, 1, 2, 3):
        pairs = [(b"p%d-%d" % (pid, i), b"v") for i in range(30)]
        store.put_groups("m", [(pid, parse_records(frame_of(pairs), len(pairs)))])
        store.settle(pid, "m")
    assert store.loads_over(rows_max=40) == []
    store.drop_partition(3)
    first = store.loads_over(rows_max=40)
    assert len(first) == 2  # 30 rows, then 31 more (the first passed 40 only with it)
    assert store.loads_over(rows_max=40) == [slot for slot in [(0, "m"), (1, "m"), (2, "m")]
                                             if slot not in first]
    assert store.loading == {}


def test_a_build_that_finds_no_room_leaves_the_load_for_the_next_tick(published,
                                                                      monkeypatch) -> None:
    """``/dev/shm`` full when a tick builds a load's shared index (ENOSPC): nothing raises
    into the member's loop, the slot stays unsettled (readers ask the owner) and the load
    waits for a tick that finds room."""
    store, reader, member = published
    pairs = [(b"p%d" % i, b"v") for i in range(20)]
    store.put_groups("m", [(1, parse_records(frame_of(pairs), len(pairs)))])
    store.settle(1, "m")
    assert store.loads_over() == []

    def full(cls, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SharedIndex, "build", classmethod(full))
    assert store.loads_over() == []
    shared = store._partitions[1]["m"].shared
    assert shared.deferred and not shared.settled() and (1, "m") in store.loading
    store._check()
    assert reader.get("m", b"p1", 1, UUID, member) is MISS
    monkeypatch.undo()  # room again
    assert store.loads_over() == [(1, "m")]
    store.settle(1, "m")
    assert reader.get("m", b"p1", 1, UUID, member) == b"v"


def test_a_store_keeps_shared_indexes_only_of_the_partitions_it_shares(shm_prefix) -> None:
    """A member shares (keeps shared indexes of) only the partitions it serves: the
    fragments of the others keep none, however they are written; sharing a partition builds
    its index from what it holds then, and unsharing drops the index and points its slot at
    nothing."""
    store = RecordStore(shm_prefix)
    with pytest.raises(ValueError, match="shared_partitions"):
        store.share(1, True)  # a store on its own shares every partition
    store.local = LocalReadDirectory(shm_prefix, UUID, 4)
    store.shared_partitions = set()
    reader, member = reader_for(shm_prefix)
    slots = lambda pid: SLOT.unpack_from(store.local.slots_of("m").mm, SLOT.size * pid)  # noqa: E731
    try:
        store.put(1, "m", b"k", b"v")
        assert store.publish("m")
        store.put_many(1, "m", [(b"b%d" % i, b"w") for i in range(300)])  # a block append
        store.put(2, "m", b"j", b"x")
        fragments = [store._partitions[pid]["m"] for pid in (1, 2)]
        assert [f.shared for f in fragments] == [None, None]
        assert slots(1)[2:] == (0, 0)
        store.share(1, True)
        serve_everything(store.local, 4)
        assert fragments[0].shared is not None and fragments[1].shared is None
        store._check()  # the built index holds what the dict holds
        assert reader.get("m", b"k", 1, UUID, member) == b"v"
        assert reader.get("m", b"b299", 1, UUID, member) == b"w"
        store.put(1, "m", b"new", b"n")
        store.settle(1, "m")
        assert reader.get("m", b"new", 1, UUID, member) == b"n"
        index_segment = fragments[0].shared.index.segment.name
        assert index_segment in list_segments(shm_prefix)
        store.local.set_served(1, False)
        store.share(1, False)
        assert fragments[0].shared is None and slots(1)[2:] == (0, 0)
        assert index_segment not in list_segments(shm_prefix)
        store.put(1, "m", b"later", b"l")  # no index to keep
        assert fragments[0].shared is None
        store.share(1, True)
        store.local.set_served(1, True)
        store.settle(1, "m")
        store._check()
        assert reader.get("m", b"later", 1, UUID, member) == b"l"
        assert reader.get("m", b"k", 1, UUID, member) == b"v"
    finally:
        reader.close()
        store.close()


@pytest.mark.parametrize("batched", [False, True])
def test_an_arena_that_grows_keeps_its_shared_index_and_is_read_where_it_went(
        published, batched) -> None:
    """Growth copies the records to a larger arena at the same offsets: the slot points at
    the new arena, the shared index is kept (not built again), and every key reads back."""
    store, reader, member = published
    fragment = store._partitions[1]["m"]
    wanted = {b"k": b"v"}
    store.settle(1, "m")
    assert reader.get("m", b"k", 1, UUID, member) == b"v"  # the reader maps the first arena
    index_segment = fragment.shared.index.segment
    room = fragment.shared.index.capacity // 2 - fragment.count
    arena, capacity = fragment.segment, fragment.capacity
    value = b"x" * (2 * capacity // room)  # fills the arena before the index
    batch = {b"grow%d" % i: value for i in range(room)}
    if batched:
        store.put_many(1, "m", batch.items())
    else:
        for key, item in batch.items():
            store.put(1, "m", key, item)
    wanted.update(batch)
    assert fragment.capacity > capacity and fragment.segment is not arena
    assert fragment.shared.index.segment is index_segment
    store._check()
    store.settle(1, "m")
    assert [reader.get("m", key, 1, UUID, member) for key in wanted] == list(wanted.values())


def test_a_batch_of_reads_is_refused_key_by_key_as_single_reads_are(published) -> None:
    store, reader, member = published
    store.put(2, "m", b"j", b"w")
    store.settle(2, "m")
    reads = [(1, UUID, member, b"k"), (2, UUID, member, b"j"), (1, UUID, member, b"absent"),
             (3, UUID, member, b"k")]
    assert reader.get_many("m", reads) == [b"v", b"w", None, None]
    store.put(1, "m", b"k", b"v2")  # unsettled: partition 1 is not read, 2 still is
    assert reader.get_many("m", reads[:2]) == [MISS, b"w"]
    store.settle(1, "m")
    store.local.set_served(2, False)
    assert reader.get_many("m", reads[:2]) == [b"v2", MISS]
    store.local.set_served(2, True)
    store.local.renew(time.monotonic() - 0.001)  # the lease ran out: nothing is read
    assert reader.get_many("m", reads[:2]) == [MISS, MISS]
    store.local.renew(math.inf)
    other = "00000000-0000-0000-0000-000000000002"
    assert reader.get_many("m", [(1, other, member, b"k")]) == [MISS]
    assert reader.get_many("other map", reads[:1]) == [UNPUBLISHED]
    assert reader.get_many("m", []) == []


def test_the_reader_refuses_another_member_and_a_fenced_one(published) -> None:
    store, reader, member = published
    other_uuid = "00000000-0000-0000-0000-000000000002"
    assert reader.get("m", b"k", 1, other_uuid, member) is MISS  # a new process of the name
    assert reader.get("m", b"k", 1, UUID, member) == b"v"
    assert fence(store.segment_prefix)  # what the supervisor does when the member dies
    assert reader.get("m", b"k", 1, UUID, member) is MISS


def test_a_seqlock_held_odd_is_never_read(published) -> None:
    store, reader, member = published
    slots = store.local.slots_of("m")
    slots.begin(1)  # a write that never ends (the member died half way)
    try:
        assert reader.get("m", b"k", 1, UUID, member) is MISS
    finally:
        slots.end(1)
    store.settle(1, "m")
    assert reader.get("m", b"k", 1, UUID, member) == b"v"


# -- a writer process racing readers ------------------------------------------------------------

KEY_COUNT = 40


def _value(key: int, version: int, size: int) -> bytes:
    """A value that proves itself: its key, version, size and a digest of all three."""
    body = struct.pack("<IQ", key, version) * (size // 12 + 1)
    body = body[:size]
    return hashlib.blake2b(body, digest_size=16).digest() + body


def _check_value(key: int, value: bytes, latest: int) -> None:
    """A value read for ``key``: whole (not torn), of that key, and written (version at most
    the writer's last)."""
    digest, body = value[:16], value[16:]
    assert hashlib.blake2b(body, digest_size=16).digest() == digest, "torn value"
    found_key, version = struct.unpack_from("<IQ", body)
    assert found_key == key, f"the value of key {found_key} read for key {key}"
    assert version <= latest, f"version {version} was never written (last {latest})"


def _key(key: int) -> bytes:
    return msgpack.packb(key)


def _writer(prefix: str, seconds: float, progress: object, big: bool) -> None:
    """Overwrite, grow, shrink and remove keys as fast as possible, but for a pause of 2 ms
    every 100 writes; ``progress`` is the last version started. Without the pauses a reader
    of a whole fragment of 70 KB values (2.8 MB to copy) gets through only when the writer
    happens to lose its core: the seqlock starves it, as it is meant to."""
    rng = random.Random(1)
    store = RecordStore(prefix, initial_segment_bytes=4096)
    store.local = LocalReadDirectory(prefix, UUID, 1)
    store.publish("m")
    serve_everything(store.local, 1)
    sizes = [70_000] if big else [12, 100, 100, 100, 700]
    version = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            version += 1
            progress.value = version
            key = rng.randrange(KEY_COUNT)
            if rng.random() < 0.1:
                store.remove(0, "m", _key(key))
            else:
                store.put(0, "m", _key(key),
                          msgpack.packb(_value(key, version, rng.choice(sizes))))
            store.settle(0, "m")
            if version % 100 == 0:
                time.sleep(0.002)
    finally:
        store.close()


def _race(prefix: str, seconds: float, read: object, big: bool = False) -> tuple[int, int]:
    """Run the writer in a process while ``read(reader, member, key)`` runs here; every value
    read is checked. Returns (values checked, reads that gave up)."""
    ctx = multiprocess.get_context("fork")
    progress = ctx.Value("Q", 0, lock=False)
    writer = ctx.Process(target=_writer, args=(prefix, seconds, progress, big))
    writer.start()
    reader, member = reader_for(prefix)
    checked = gave_up = 0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and writer.is_alive():
            key = random.randrange(KEY_COUNT)
            found = read(reader, member, key)
            if found is MISS or found is UNPUBLISHED:
                gave_up += 1
                continue
            latest = progress.value  # after the read: nothing newer can have been read
            for found_key, value in found:
                _check_value(found_key, msgpack.unpackb(value), latest)
                checked += 1
    finally:
        reader.close()
        writer.join(timeout=seconds + 10)
        if writer.is_alive():
            writer.kill()
        remove_segments(prefix)
    assert writer.exitcode == 0
    return checked, gave_up


def _local_get(reader: LocalReader, member: str, key: int) -> object:
    """[(key, value)] of a local get, [] when absent, or MISS / UNPUBLISHED."""
    value = reader.get("m", _key(key), 0, UUID, member)
    if value is MISS or value is UNPUBLISHED:
        return value
    return [] if value is None else [(key, value)]


def _local_scan(reader: LocalReader, member: str, key: int) -> object:
    """Every (key, value) of a local scan of the partition, or MISS / UNPUBLISHED."""
    found = reader.scan("m", 0, UUID, member)
    if found is MISS or found is UNPUBLISHED:
        return found
    data, count = found
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    items = list(unpacker)
    assert len(items) == 2 * count, "a scan's records run into each other"
    return [(items[i], msgpack.packb(items[i + 1])) for i in range(0, len(items), 2)]


def _local_copy(reader: LocalReader, member: str, key: int) -> object:
    """Every (key, value) of a copy of the partition's fragment, or MISS / UNPUBLISHED."""
    found = reader.copy_fragment("m", 0, UUID, member)
    if found is MISS or found is UNPUBLISHED or found is None:
        return MISS if found is None else found
    keys, values = LocalFragment(*found).entries()
    return [(k, msgpack.packb(v)) for k, v in zip(keys, values, strict=True)]


def _local_get_many(reader: LocalReader, member: str, key: int) -> object:
    """[(key, value)] of a batch of local gets of four keys (those answered), or MISS."""
    keys = [(key + i) % KEY_COUNT for i in range(4)]
    values = reader.get_many("m", [(0, UUID, member, _key(k)) for k in keys])
    found = [(k, v) for k, v in zip(keys, values, strict=True) if v.__class__ is bytes]
    return found if found or None in values else MISS


@pytest.mark.parametrize("big", [False, True], ids=["small-values", "70KB-values"])
@pytest.mark.parametrize("read", [_local_get, _local_get_many, _local_scan, _local_copy],
                         ids=["get", "get_many", "scan", "copy"])
def test_readers_racing_a_writer_never_see_a_torn_or_invented_value(read, big) -> None:
    checked, gave_up = _race(unique_prefix(), 2.0, read, big)
    # A whole-fragment scan under a writer this fast often gives up (a seqlock starves long
    # readers; the map then asks the owner), yet some must get through to be checked.
    assert checked > 20, f"only {checked} values read ({gave_up} gave up)"


def _unchecked_get(reader: LocalReader, member: str, key: int) -> object:
    """A broken reader: the probe without the seqlock check around it."""
    view = reader._views.get(member)
    if view is None:
        return _local_get(reader, member, key)  # opens the directory
    slots = view.slots_of("m")
    if slots is None:
        return MISS
    _, _, arena_1, index_1 = SLOT.unpack_from(slots, 0)
    if not arena_1:
        return MISS
    try:
        value = probe(view.segment(index_1 - 1), view.segment(arena_1 - 1),
                      record_store.key_hash(_key(key)), _key(key))
    except (struct.error, IndexError, ValueError, OSError):
        return MISS
    return MISS if value is RETRY else [] if value is None else [(key, value)]


def test_the_race_catches_a_reader_that_skips_the_seqlock() -> None:
    """The teeth of the test above: without the seqlock check, a reader does see torn values
    (large values overwritten in place take long enough to copy)."""
    with pytest.raises(AssertionError, match="torn value|read for key|never written"):
        for _ in range(5):
            _race(unique_prefix(), 3.0, _unchecked_get, big=True)


def test_seq_stays_even_after_every_store_operation(published) -> None:
    store, _, _ = published
    slots = store.local.slots_of("m")
    store.put_many(1, "m", [(b"%d" % i, b"x" * i) for i in range(200)])  # grows the index
    store.remove(1, "m", b"5")
    store.clear(1, "m")
    assert SEQ.unpack_from(slots.mm, SLOT.size * 1)[0] % 2 == 0


def test_the_reader_unmaps_segments_that_no_slot_points_at_any_more(published) -> None:
    """A fragment dropped (its partition moved away, say) is not read here again: its
    retired segments must not stay mapped, and so in memory, for the client's lifetime."""
    store, reader, member = published
    assert reader.get("m", b"k", 1, UUID, member) == b"v"
    view = reader._views[member]
    mapped = set(view.segments)
    assert len(mapped) == 2  # the arena and the shared index of partition 1
    store.clear(1, "m")
    store.put(2, "m", b"x", b"y")
    store.settle(2, "m")
    reader._next_sweep = 0.0  # the sweep's second has passed
    assert reader.get("m", b"x", 2, UUID, member) == b"y"
    assert not mapped & set(view.segments)
    assert 1 not in view.pointing["m"]


def test_a_fragment_moved_to_another_map_is_read_there_after_the_sweep(published) -> None:
    """A fragment moved between maps (``replace_contents``) keeps its arena: the first map's
    slot leaves it, the second's points at it. The sweep unmaps what the first map's slot
    left, the arena among it, while the second map's reads still hold that mapping: they
    must map it again, not miss for ever."""
    store, reader, member = published
    assert store.publish("n")
    assert reader.get("m", b"k", 1, UUID, member) == b"v"
    store.move_fragment(1, "m", "n")
    store.settle(1, "m")
    store.settle(1, "n")
    reads = [(1, UUID, member, b"k")]
    assert reader.get_many("n", reads) == [b"v"]
    reader._next_sweep = 0.0
    assert reader.get("m", b"k", 1, UUID, member) is None  # sweeps: "m" of 1 is empty now
    assert reader.get_many("n", reads) == [b"v"]
    assert reader.get("n", b"k", 1, UUID, member) == b"v"
