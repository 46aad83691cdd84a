"""The shared-memory record store against a dict model, plus its growth, collisions and cleanup."""

from __future__ import annotations

import array
import errno
import gc
import mmap
import os
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.workers.conftest import replace_key_hash, unique_prefix
from tests.workers.test_record_block import frame_of
from workers import shm
from workers.local_reads import LocalReadDirectory
from workers.record_block import parse_records
from workers.record_store import (
    ARENA_BYTES_WHOLE,
    ARENA_SPAN_BYTES,
    COMPACT_GARBAGE_MIN,
    RecordStore,
    RecordStoreClosedError,
    ValueTooLargeError,
    header_bytes,
)
from workers.shm import SHM_DIR, Segment, list_segments, remove_segments

NS = "map"


def segment_bytes_held(prefix: str) -> int:
    """The memory the prefix's segments hold in /dev/shm (their pages, not their sizes:
    an arena reserves its pages as it fills)."""
    return sum(os.stat(os.path.join(SHM_DIR, name)).st_blocks * 512
               for name in list_segments(prefix))


def fragment_count(store: RecordStore) -> int:
    return sum(len(store.namespaces(pid)) for pid in store.partitions())


# -- basics -----------------------------------------------------------------------------------


def test_put_get_overwrite_remove(make_store) -> None:
    store = make_store()
    assert store.get(1, NS, b"k") is None
    assert store.put(1, NS, b"k", b"v1") is None
    assert store.get(1, NS, b"k") == b"v1"
    assert store.put(1, NS, b"k", b"v2") == b"v1"  # same size: written in place
    assert store.put(1, NS, b"k", b"value-3") == b"v2"  # new size: appended, old is garbage
    assert store.get(1, NS, b"k") == b"value-3"
    assert store.contains(1, NS, b"k")
    assert store.size(1, NS) == 1
    assert store.remove(1, NS, b"k") == b"value-3"
    assert store.remove(1, NS, b"k") is None
    assert not store.contains(1, NS, b"k")
    assert store.size(1, NS) == 0
    assert store.get(2, NS, b"k") is None
    assert store.get(1, "other", b"k") is None
    store._check()


def test_fragments_are_separate(make_store, shm_prefix: str) -> None:
    store = make_store()
    store.put(1, "a", b"k", b"1a")
    store.put(1, "b", b"k", b"1b")
    store.put(2, "a", b"k", b"2a")
    assert [store.get(p, n, b"k") for p, n in [(1, "a"), (1, "b"), (2, "a")]] == [
        b"1a",
        b"1b",
        b"2a",
    ]
    assert store.namespaces(1) == ["a", "b"]
    assert store.namespaces(3) == []
    assert store.partitions() == [1, 2]
    assert len(list_segments(shm_prefix)) == 3  # one segment per fragment
    # An arena with a record holds a page of it (or all of its 64 KiB, reserved whole).
    held = mmap.PAGESIZE if shm.reserves_lazily() else ARENA_BYTES_WHOLE
    assert store.shm_bytes() == segment_bytes_held(shm_prefix) == 3 * held


def test_bytes_like_keys_and_values_are_accepted_and_bytes_come_back(make_store) -> None:
    store = make_store()
    ints = array.array("i", [1, 2, 3])
    strided = memoryview(b"abcdef")[::2]
    store.put(1, NS, bytearray(b"k1"), memoryview(b"v1"))
    store.put(1, NS, memoryview(b"k2"), ints)
    store.put(1, NS, b"k3", strided)
    store.put_many(1, NS, [(bytearray(b"k4"), bytearray(b"v4")), (b"k5", memoryview(ints))])
    assert store.get(1, NS, memoryview(b"k1")) == b"v1"
    assert store.get(1, NS, b"k2") == ints.tobytes()
    assert store.get(1, NS, bytearray(b"k3")) == b"ace"
    assert store.get_many(1, NS, [b"k4", bytearray(b"k5"), b"nope"]) == [
        b"v4",
        ints.tobytes(),
        None,
    ]
    for key, value in store.items(1, NS):
        assert type(key) is bytes
        assert type(value) is bytes
    assert type(store.remove(1, NS, b"k1")) is bytes


def test_empty_keys_and_values(make_store) -> None:
    store = make_store()
    assert store.put(1, NS, b"", b"") is None
    assert store.put(1, NS, b"e", b"") is None
    assert store.get(1, NS, b"") == b""
    assert store.get(1, NS, b"e") == b""
    assert store.put(1, NS, b"", b"x") == b""
    assert sorted(store.items(1, NS)) == [(b"", b"x"), (b"e", b"")]
    store._check()


def test_non_bytes_keys_values_and_ids_are_refused_without_a_segment(
    make_store, shm_prefix: str
) -> None:
    store = make_store()
    with pytest.raises(TypeError):
        store.put(1, NS, "text", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.put(1, NS, b"k", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.put(-1, NS, b"k", b"v")
    with pytest.raises(TypeError):
        store.put(1, 7, b"k", b"v")  # type: ignore[arg-type]
    assert list_segments(shm_prefix) == []
    assert store.partitions() == []


def test_the_heap_holds_no_key_or_value_bytes(make_store, key_hash_replaced) -> None:
    """Walk everything the store references: indexes hold ints, segments hold the bytes."""
    key_hash_replaced(lambda key: len(key) % 3)  # tuple entries too
    store = make_store(initial_segment_bytes=4096)
    for pid in range(3):
        store.put_many(pid, NS, [(b"key-%d" % i, b"value-%d" % i) for i in range(300)])
        for i in range(0, 300, 2):
            store.put(pid, NS, b"key-%d" % i, b"overwritten")
    pending = store.items(0, NS)
    seen: set[int] = set()
    stack: list[object] = [store]
    found: list[object] = []
    for _ in range(1_000_000):
        if not stack:
            break
        item = stack.pop()
        if id(item) in seen or isinstance(item, type):
            continue
        seen.add(id(item))
        if isinstance(item, bytes | bytearray | memoryview):
            found.append(item)
        stack.extend(gc.get_referents(item))
    assert not stack, "walk did not finish"
    assert found == []
    del pending


def test_missing_fragments_read_as_empty(make_store) -> None:
    store = make_store()
    assert store.get_many(5, NS, [b"a", b"b"]) == [None, None]
    assert list(store.items(5, NS)) == []
    assert store.size(5, NS) == 0
    assert store.clear(5, NS) == 0
    store.drop_partition(5)
    store.put_many(5, NS, [])
    assert store.partitions() == []
    assert store.shm_bytes() == 0


def test_constructor_checks_its_arguments(shm_prefix: str) -> None:
    with pytest.raises(ValueError):
        RecordStore("not-shmgrid")
    with pytest.raises(ValueError):
        RecordStore(shm_prefix, initial_segment_bytes=0)
    with pytest.raises(ValueError):
        RecordStore(shm_prefix, max_record_bytes=1 << 32)
    assert list_segments(shm_prefix) == []


# -- memory held ------------------------------------------------------------------------------


def _written(store: RecordStore, path: str, pid: int, pairs: list[tuple[bytes, bytes]]) -> None:
    """Write ``pairs`` into ``pid`` the way ``path`` names: a put each, one put_many, a
    record block (as the Spark writer sends them), or put_runs (as a put_all does)."""
    if path == "put":
        for key, value in pairs:
            store.put(pid, NS, key, value)
    elif path == "put_many":
        store.put_many(pid, NS, pairs)
    elif path == "block":
        store.put_groups(NS, [(pid, parse_records(frame_of(pairs), len(pairs)))])
    else:
        store.put_runs(NS, *_runs([(pid, pairs)]))


@pytest.mark.parametrize("path", ["put", "put_many", "block", "put_runs"])
def test_an_arena_holds_the_memory_it_fills_not_its_size(make_store, shm_prefix: str,
                                                         path: str) -> None:
    """An arena is made large (``ARENA_SPAN_BYTES``) and its pages are reserved as it
    fills: records fill it in place, never moved to a larger one, and what the store holds
    in /dev/shm is its records and less than a reserving step more, not the arena's size."""
    store = make_store()
    if not shm.reserves_lazily():
        pytest.skip("this kernel has no MADV_POPULATE_WRITE: arenas are reserved whole")
    _written(store, path, 1, [(b"first", b"v")])
    fragment = store._partitions[1][NS]
    arena = fragment.segment
    assert fragment.capacity == ARENA_SPAN_BYTES and store.shm_bytes() == mmap.PAGESIZE
    for n in range(5):
        _written(store, path, 1, [(b"k%d-%d" % (n, i), b"v" * 100) for i in range(300)])
        store._check()  # (no record past the reserved memory, batch by batch)
    assert fragment.segment is arena and list_segments(shm_prefix) == [arena.name]
    assert fragment.capacity - fragment.top > shm.RESERVE_STEP_BYTES + 4096  # room unused
    assert fragment.top <= store.shm_bytes() <= fragment.top + shm.RESERVE_STEP_BYTES + 4096
    assert store.shm_bytes() == segment_bytes_held(shm_prefix)
    # A batch past the reserved memory that fits the arena: it reserves before it writes.
    assert fragment.top + 600 * 113 < fragment.capacity
    _written(store, path, 1, [(b"more-%d" % i, b"v" * 100) for i in range(600)])
    assert store.size(1, NS) == 2101 and fragment.segment is arena
    store._check()


@pytest.mark.parametrize("path", ["put", "put_many", "block", "put_runs", "receive"])
def test_a_full_dev_shm_fails_a_write_and_changes_nothing(make_store, monkeypatch,
                                                         path: str) -> None:
    """No room in /dev/shm for what a write needs (reserving fails with ENOSPC): the write
    raises, before it changes anything, and succeeds once there is room again; a
    migration's chunk is not taken. (A put_all's runs are puts in turn: those before the
    one that found no room stay written, as when a new arena could not be made.)"""
    store = make_store()
    for pid in (1, 3):
        store.put(pid, NS, b"old", b"o" * 50)
    # More than the arena holds: one record for a put, 80 for a batch.
    pairs = [(b"big", b"x" * 80_000)] if path == "put" else \
        [(b"a%d" % i, b"x" * 1000) for i in range(80)]
    before = {pid: (store.concatenated(pid, NS), store.size(pid, NS)) for pid in (1, 3)}
    held = store.shm_bytes()

    def no_room(segment: Segment, end: int) -> None:
        if end > segment.reserved:
            raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(Segment, "reserve", no_room)
        with pytest.raises(OSError) as caught:
            if path == "receive":
                peer = make_store()
                loan = store.lend(3, NS)
                try:
                    for chunk in loan.chunks(1 << 20):
                        peer.receive(3, chunk)
                finally:
                    loan.release()
            else:
                _written(store, path, 1, pairs)
        assert caught.value.errno == errno.ENOSPC
    store._check()
    if path == "put_runs":
        written = [key for key, _ in pairs if store.contains(1, NS, key)]
        assert 0 < len(written) < len(pairs) and written == [k for k, _ in pairs][:len(written)]
        assert store.get(1, NS, b"old") == b"o" * 50
    else:
        after = {pid: (store.concatenated(pid, NS), store.size(pid, NS)) for pid in (1, 3)}
        assert after == before and store.shm_bytes() == held
    if path == "receive":
        assert peer.partitions() == []
        return
    _written(store, path, 1, pairs)  # room again
    assert store.size(1, NS) == 1 + len(pairs) and store.get(1, NS, pairs[-1][0]) == pairs[-1][1]
    store._check()


# -- too large --------------------------------------------------------------------------------


def test_too_large_record_changes_nothing(make_store, shm_prefix: str) -> None:
    limit = 1000
    store = make_store(initial_segment_bytes=4096, max_record_bytes=limit)
    fits = b"v" * (limit - header_bytes - 1)
    assert store.put(1, NS, b"k", fits) is None  # exactly at the limit
    shm_before = store.shm_bytes()
    segments_before = list_segments(shm_prefix)
    with pytest.raises(ValueTooLargeError) as caught:
        store.put(1, NS, b"k", fits + b"x")
    assert isinstance(caught.value, ValueError)
    assert "1001 bytes" in str(caught.value)
    assert "1000" in str(caught.value)
    assert (caught.value.record_bytes, caught.value.limit_bytes) == (1001, 1000)
    with pytest.raises(ValueTooLargeError):
        store.put(2, NS, b"k", b"x" * 5000)  # would have made a new fragment
    with pytest.raises(ValueTooLargeError):
        store.put_many(1, NS, [(b"a", b"1"), (b"k", b"2"), (b"big", b"x" * limit)])
    with pytest.raises(ValueTooLargeError):  # one group too large: no group is written
        store.put_groups(NS, [(1, [b"a", b"1"]), (3, [b"b", b"2"]),
                              (4, [b"c", b"3", b"big", b"x" * limit])])
    assert store.get(1, NS, b"k") == fits
    assert store.get(1, NS, b"a") is None
    assert store.size(1, NS) == 1
    assert store.partitions() == [1]
    assert store.shm_bytes() == shm_before
    assert list_segments(shm_prefix) == segments_before
    store._check()


def test_a_group_larger_than_a_record_whose_records_fit_is_written(make_store) -> None:
    """put_groups checks a group whole where its bytes together fit in one record; a larger
    group is checked pair by pair, and its records that fit are written."""
    limit = 1000
    store = make_store(initial_segment_bytes=4096, max_record_bytes=limit)
    fits = b"v" * (limit - header_bytes - 1)  # with its 1-byte key: exactly at the limit
    store.put_groups(NS, [(1, [b"a", fits, b"b", fits, b"c", fits]), (2, [b"d", b"1"])])
    assert [store.get(1, NS, key) for key in (b"a", b"b", b"c")] == [fits] * 3
    assert store.get(2, NS, b"d") == b"1"
    store._check()


def test_a_batch_of_new_keys_is_one_block_laid_out_as_single_puts_lay_it(make_store) -> None:
    """The block append (``_Fragment.append_new``) writes the records, offsets and counts
    that a put per pair writes; a batch in which some key is present already, or a key comes
    twice, is left to the pair-by-pair path (later pairs win), and the block writes nothing."""
    block, single = make_store(merkle_depth=6), make_store(merkle_depth=6)
    for store in (block, single):
        store.put(1, NS, b"old", b"o")
        store.tree(1, NS)  # the kept tree follows both paths
    pairs = [(b"key-%d" % i, b"value" * (i % 4)) for i in range(40)]
    fragment = block._partitions[1][NS]
    assert fragment.append_new([k for k, _ in pairs], [v for _, v in pairs],
                               sum(header_bytes + len(k) + len(v) for k, v in pairs))
    for key, value in pairs:
        single.put(1, NS, key, value)
    assert block.concatenated(1, NS) == single.concatenated(1, NS)
    assert fragment.index == single._partitions[1][NS].index
    assert block.tree(1, NS).nodes == single.tree(1, NS).nodes
    top = fragment.top
    assert not fragment.append_new([b"new", b"key-3"], [b"1", b"2"], 2 * header_bytes + 10)
    assert not fragment.append_new([b"twice", b"twice"], [b"1", b"2"], 2 * header_bytes + 12)
    assert fragment.top == top
    batch = [(b"fresh-%d" % i, b"f") for i in range(10)] + [(b"key-3", b"again"),
                                                            (b"fresh-0", b"later")]
    block.put_many(1, NS, batch)
    assert block.get(1, NS, b"key-3") == b"again" and block.get(1, NS, b"fresh-0") == b"later"
    assert block.size(1, NS) == 1 + 40 + 10
    block._check()
    single._check()


def _runs(runs: list[tuple[int, list[tuple[bytes, bytes]]]]) -> tuple[list, list, list]:
    """put_runs' arguments for runs of pairs by partition."""
    return ([pid for pid, _ in runs], [len(pairs) for _, pairs in runs],
            [item for _, pairs in runs for pair in pairs for item in pair])


def test_put_runs_writes_what_a_put_per_pair_writes(make_store, key_hash_replaced) -> None:
    """New keys (appended in the loop, or once the arena is full by the pair-by-pair path),
    same-size overwrites (in place), other sizes, a key twice, a partition twice, an empty
    run, and, under a hash of few values, a new key whose hash and value size are those of a
    key present (its record must not be taken for the new key's)."""
    key_hash_replaced(lambda key: len(key) % 3)
    runs_store = make_store(initial_segment_bytes=128)
    single = make_store(initial_segment_bytes=128)
    batches = [
        [(1, [(b"a", b"1111"), (b"bb", b"22")]), (2, [(b"c", b"333")])],
        [(1, [(b"a", b"4444"), (b"d", b"5555")]),  # in place; a new key hashing as b"a"
         (2, []), (3, [(b"eee", b"6")]), (1, [(b"bb", b"a value of another size")])],
        [(2, [(b"c", b"777"), (b"c", b"888"), (b"ff", b"9" * 60)]),  # the arena fills up
         (3, [(b"eee", b"x"), (b"g", b"y" * 50)])],
    ]
    for runs in batches:
        runs_store.put_runs(NS, *_runs(runs))
        for pid, pairs in runs:
            for key, value in pairs:
                single.put(pid, NS, key, value)
        for pid in (1, 2, 3):
            assert dict(runs_store.items(pid, NS)) == dict(single.items(pid, NS)), pid
        runs_store._check()
    assert runs_store.get(1, NS, b"a") == b"4444" and runs_store.get(1, NS, b"d") == b"5555"


def test_put_runs_keeps_a_published_fragment_readable(make_store, shm_prefix: str) -> None:
    """Writes into a fragment local readers read are made inside its seqlock and keep its
    shared index exactly the dict index."""
    store = make_store()
    store.local = LocalReadDirectory(store.segment_prefix, "me", 8)
    store.put(1, NS, b"k", b"v1")
    assert store.publish(NS)
    fragment = store._partitions[1][NS]
    slots = store.local.slots_of(NS)
    seq = slots.seqs[1]
    store.put_runs(NS, *_runs([(1, [(b"k", b"v2"), (b"new", b"n")])]))
    assert slots.seqs[1] == seq + 2  # one change, begun and ended
    assert store.get(1, NS, b"k") == b"v2" and store.get(1, NS, b"new") == b"n"
    fragment.check_shared()
    store._check()


def test_put_runs_never_writes_in_place_under_a_snapshot(make_store) -> None:
    store = make_store()
    store.put_runs(NS, *_runs([(1, [(b"k", b"old"), (b"j", b"one")])]))
    snapshot = store.items(1, NS)
    store.put_runs(NS, *_runs([(1, [(b"k", b"new")])]))  # same size: would be in place
    assert dict(snapshot) == {b"k": b"old", b"j": b"one"}
    assert store.get(1, NS, b"k") == b"new"
    store._check()


def test_put_runs_tells_the_journal_every_pair_in_order(make_store) -> None:
    class Journal:
        def __init__(self) -> None:
            self.pairs: list[tuple[int, bytes, bytes]] = []

        def put(self, pid: int, namespace: str, key: bytes, value: bytes) -> None:
            self.pairs.append((pid, key, value))

        def put_many(self, pid: int, namespace: str, pairs) -> None:
            self.pairs += [(pid, key, value) for key, value in pairs]

    store = make_store(initial_segment_bytes=64)
    store.journal = Journal()
    runs = [(1, [(b"a", b"1"), (b"b", b"2" * 40), (b"c", b"3")]), (2, [(b"d", b"4")]),
            (1, [(b"a", b"5"), (b"b", b"6")])]
    store.put_runs(NS, *_runs(runs))
    assert store.journal.pairs == [(pid, k, v) for pid, pairs in runs for k, v in pairs]


def test_put_runs_refuses_a_batch_with_a_record_too_large_or_counts_that_do_not_fit(
        make_store) -> None:
    limit = 100
    store = make_store(max_record_bytes=limit)
    store.put(1, NS, b"k", b"v")
    with pytest.raises(ValueTooLargeError):
        store.put_runs(NS, *_runs([(1, [(b"k", b"w")]), (2, [(b"big", b"x" * limit)])]))
    with pytest.raises(ValueError):
        store.put_runs(NS, [1, 2], [1, 1], [b"k", b"w"])
    with pytest.raises(ValueError):
        store.put_runs(NS, [1], [1, 0], [b"k", b"w"])
    assert store.get(1, NS, b"k") == b"v" and store.partitions() == [1]
    store._check()


@pytest.mark.parametrize("path", ["put", "put_many", "block", "put_runs"])
def test_an_arena_rewritten_compacts_before_it_holds_more_than_twice_its_records(
        make_store, shm_prefix: str, path: str) -> None:
    """A large arena never fills up, so it compacts as it would need more memory once half
    of what it holds is garbage (``COMPACT_GARBAGE_MIN`` at least): keys rewritten with
    values of other sizes keep it near its records' size, not at all it was written."""
    store = make_store()
    if not shm.reserves_lazily():
        pytest.skip("this kernel has no MADV_POPULATE_WRITE: arenas are reserved whole")
    keys = [b"k%d" % i for i in range(200)]
    model: dict[bytes, bytes] = {}
    held_max = live_max = written = 0
    for n in range(100):
        pairs = [(key, b"%d" % n * (20 + n % 7 * 15)) for key in keys]
        _written(store, path, 1, pairs)
        model.update(pairs)
        fragment = store._partitions[1][NS]
        written += sum(len(k) + len(v) + header_bytes for k, v in pairs)
        held_max = max(held_max, store.shm_bytes())
        live_max = max(live_max, fragment.live_bytes)
        store._check()
    assert fragment.capacity == ARENA_SPAN_BYTES and written > 20 * live_max
    assert held_max <= 2 * max(live_max, COMPACT_GARBAGE_MIN) + 2 * shm.RESERVE_STEP_BYTES
    assert store.get_many(1, NS, keys) == [model[key] for key in keys]
    assert store.shm_bytes() == segment_bytes_held(shm_prefix)


# -- growth and compaction --------------------------------------------------------------------


def test_growth_keeps_every_record_and_one_segment_per_fragment(
    make_store, shm_prefix: str
) -> None:
    store = make_store(initial_segment_bytes=4096)
    model = {}
    for i in range(3000):
        key = b"key-%d" % i
        model[key] = os.urandom(i % 97)
        store.put(3, NS, key, model[key])
        if i % 500 == 0:
            assert len(list_segments(shm_prefix)) == 1
    assert store.size(3, NS) == len(model)
    assert dict(store.items(3, NS)) == model
    assert store.get_many(3, NS, list(model)) == list(model.values())
    assert len(list_segments(shm_prefix)) == 1
    assert store.shm_bytes() == segment_bytes_held(shm_prefix)
    store._check()


def test_a_record_larger_than_the_segment_gets_a_segment_that_fits(make_store) -> None:
    store = make_store(initial_segment_bytes=4096)
    store.put(1, NS, b"small", b"s")
    big = os.urandom(100_000)
    store.put(1, NS, b"big", big)
    store.put(2, NS, b"big", big)  # a new fragment sized for its first record
    assert store.get(1, NS, b"big") == big
    assert store.get(2, NS, b"big") == big
    assert store.get(1, NS, b"small") == b"s"
    store._check()


def test_overwrites_keep_shm_bytes_bounded(make_store, shm_prefix: str) -> None:
    initial = 4096
    store = make_store(initial_segment_bytes=initial)
    keys = [b"k%d" % i for i in range(50)]
    shm_max = 0
    for round_index in range(400):
        value = b"x" * (10 + round_index % 30)  # sizes change, so overwrites leave garbage
        for key in keys:
            store.put(1, NS, key, value)
        shm_max = max(shm_max, store.shm_bytes())
    live_max = len(keys) * (header_bytes + 3 + 39)
    # Doubling happens only while live > capacity / 2, so capacity stays under 4x live.
    assert shm_max <= max(initial, 4 * live_max + 4096)
    assert len(list_segments(shm_prefix)) == 1
    assert store.get_many(1, NS, keys) == [b"x" * (10 + 399 % 30)] * len(keys)
    store._check()


def test_removing_everything_reuses_the_arena(make_store, shm_prefix: str) -> None:
    store = make_store(initial_segment_bytes=4096)
    segments_first = list_segments(shm_prefix)
    store.put(1, NS, b"a", b"1")
    segments_first = list_segments(shm_prefix)
    for _ in range(1000):
        store.put(1, NS, b"a", b"12")
        store.remove(1, NS, b"a")
    assert list_segments(shm_prefix) == segments_first  # no compaction was needed
    store._check()


# -- collisions -------------------------------------------------------------------------------


def test_colliding_hashes_are_told_apart_by_the_key_bytes(make_store, key_hash_replaced) -> None:
    key_hash_replaced(lambda key: 42)
    store = make_store(initial_segment_bytes=4096)
    model = {b"c%d" % i: b"v%d" % i * (i % 7) for i in range(200)}
    for key, value in model.items():
        assert store.put(1, NS, key, value) is None
    assert store.get(1, NS, b"absent") is None
    assert not store.contains(1, NS, b"absent")
    assert store.remove(1, NS, b"absent") is None
    for i in range(0, 200, 3):
        key = b"c%d" % i
        assert store.remove(1, NS, key) == model.pop(key)
    for i in range(1, 200, 5):
        key = b"c%d" % i
        model[key] = b"new" * i
        store.put(1, NS, key, model[key])
    store.put_many(1, NS, [(b"c1", b"batch"), (b"fresh", b"f")])
    model[b"c1"] = b"batch"
    model[b"fresh"] = b"f"
    assert store.size(1, NS) == len(model)
    assert dict(store.items(1, NS)) == model
    assert store.get_many(1, NS, list(model)) == list(model.values())
    store._check()
    for key in list(model):
        assert store.remove(1, NS, key) == model.pop(key)
    assert store.size(1, NS) == 0
    store._check()


# -- clear, drop, close -----------------------------------------------------------------------


def test_clear_unlinks_the_fragment_segment(make_store, shm_prefix: str) -> None:
    store = make_store()
    store.put_many(1, "a", [(b"k%d" % i, b"v") for i in range(10)])
    store.put(1, "b", b"k", b"v")
    assert len(list_segments(shm_prefix)) == 2
    assert store.clear(1, "a") == 10
    assert len(list_segments(shm_prefix)) == 1
    assert store.namespaces(1) == ["b"]
    assert store.get(1, "a", b"k1") is None
    assert store.clear(1, "a") == 0
    assert store.clear(1, "b") == 1
    assert list_segments(shm_prefix) == []
    assert store.partitions() == []
    assert store.shm_bytes() == 0
    store.put(1, "a", b"again", b"v")  # a cleared fragment can be written again
    assert store.get(1, "a", b"again") == b"v"


def test_drop_partition_unlinks_every_namespace(make_store, shm_prefix: str) -> None:
    store = make_store()
    for namespace in ("a", "b", "c"):
        store.put(1, namespace, b"k", b"v")
    store.put(2, "a", b"k", b"v")
    assert len(list_segments(shm_prefix)) == 4
    store.drop_partition(1)
    store.drop_partition(1)
    assert store.partitions() == [2]
    assert store.namespaces(1) == []
    assert len(list_segments(shm_prefix)) == 1
    assert store.shm_bytes() == segment_bytes_held(shm_prefix)


def test_close_is_idempotent_and_leaves_nothing(shm_prefix: str) -> None:
    store = RecordStore(shm_prefix, initial_segment_bytes=4096)
    try:
        for pid in range(20):
            store.put_many(pid, NS, [(b"k%d" % i, b"v" * 30) for i in range(300)])
        assert len(list_segments(shm_prefix)) == 20
    finally:
        store.close()
    assert list_segments(shm_prefix) == []
    store.close()
    assert store.get(1, NS, b"k1") is None
    assert store.partitions() == []
    with pytest.raises(RecordStoreClosedError):
        store.put(1, NS, b"k", b"v")
    assert list_segments(shm_prefix) == []


def test_context_manager_closes(shm_prefix: str) -> None:
    with RecordStore(shm_prefix) as store:
        store.put(1, NS, b"k", b"v")
        assert len(list_segments(shm_prefix)) == 1
    assert list_segments(shm_prefix) == []


def test_stale_segment_names_are_skipped(make_store, shm_prefix: str) -> None:
    from workers.shm import Segment

    stale = Segment(f"{shm_prefix}-0", 4096)  # as if left by an earlier process
    stale.close()
    store = make_store()
    store.put(1, NS, b"k", b"v")
    assert list_segments(shm_prefix) == [f"{shm_prefix}-0", f"{shm_prefix}-1"]
    store.close()
    assert list_segments(shm_prefix) == [stale.name]
    assert remove_segments(shm_prefix) == [stale.name]


# -- iteration while mutating -----------------------------------------------------------------


def test_items_is_a_snapshot_across_writes_and_compaction(make_store, shm_prefix: str) -> None:
    store = make_store(initial_segment_bytes=4096)
    model = {b"k%d" % i: b"v%d" % i for i in range(100)}
    store.put_many(1, NS, model.items())
    seen = {}
    iterator = store.items(1, NS)
    for count, (key, value) in enumerate(iterator):
        seen[key] = value
        if count == 10:
            for i in range(100):
                store.put(1, NS, b"k%d" % i, b"changed")  # same and new sizes
            store.remove(1, NS, b"k99")
            for i in range(2000):  # forces compactions into bigger segments
                store.put(1, NS, b"new%d" % i, b"n" * 20)
            # The iterator's retired segment is unlinked already, only still mapped.
            assert len(list_segments(shm_prefix)) == 1
    assert seen == model
    assert store.get(1, NS, b"k5") == b"changed"
    assert store.size(1, NS) == 99 + 2000
    store._check()


def test_items_snapshot_holds_when_records_could_be_rewritten_in_place(make_store) -> None:
    """Same-size overwrites and an emptied arena reuse memory, but not under an iterator."""
    store = make_store()
    model = {b"k%d" % i: b"%03d" % i for i in range(20)}
    store.put_many(1, NS, model.items())
    same_size = store.items(1, NS)
    for key in model:
        store.put(1, NS, key, b"new")  # same size as every old value
    batched = store.items(1, NS)
    store.put_many(1, NS, dict.fromkeys(model, b"bat").items())  # the same, in a batch
    emptied = store.items(1, NS)
    for key in model:
        store.remove(1, NS, key)
    store.put_many(1, NS, [(b"x%d" % i, b"y" * 9) for i in range(20)])
    assert dict(same_size) == model
    assert dict(batched) == dict.fromkeys(model, b"new")
    assert dict(emptied) == dict.fromkeys(model, b"bat")
    store.put_many(1, NS, dict.fromkeys(model, b"abc").items())
    fragment = store._partitions[1][NS]
    garbage_bytes_before = fragment.garbage_bytes
    for key in model:  # no iterator left: now same-size overwrites are written in place
        assert store.put(1, NS, key, b"def") == b"abc"
    store.put_many(1, NS, dict.fromkeys(model, b"ghi").items())
    assert fragment.garbage_bytes == garbage_bytes_before
    assert store.get_many(1, NS, list(model)) == [b"ghi"] * len(model)
    store._check()


def test_items_survives_clear_drop_and_close(make_store, shm_prefix: str) -> None:
    store = make_store()
    model = {b"k%d" % i: b"v" * i for i in range(50)}
    store.put_many(1, NS, model.items())
    store.put_many(2, NS, model.items())
    first = store.items(1, NS)
    second = store.items(2, NS)
    assert next(first) in model.items()
    store.clear(1, NS)
    store.drop_partition(2)
    assert list_segments(shm_prefix) == []
    assert len(list(first)) == len(model) - 1
    store.close()
    assert dict(second) == model


def test_an_abandoned_iterator_releases_its_segment(make_store) -> None:
    store = make_store()
    store.put_many(1, NS, [(b"k%d" % i, b"v") for i in range(10)])
    segment = store._partitions[1][NS].segment
    started = store.items(1, NS)
    next(started)
    unstarted = store.items(1, NS)
    assert segment.pin_count == 2
    del started, unstarted
    gc.collect()
    assert segment.pin_count == 0
    store.clear(1, NS)
    assert segment.closed


# -- the model ----------------------------------------------------------------------------------

KEYS = [b"", b"a", b"b", b"ab", b"ba", b"abc", b"key-1", b"key-22", b"\x00\xff"]
keys_small = st.one_of(st.sampled_from(KEYS), st.binary(min_size=0, max_size=6))
values_any = st.binary(min_size=0, max_size=300)
pids = st.integers(min_value=0, max_value=1)
namespaces = st.sampled_from(["a", "b"])


class StoreMachine(RuleBasedStateMachine):
    """Every store operation against a dict per fragment, with pending snapshot iterators."""

    hash_override = None

    def __init__(self) -> None:
        super().__init__()
        self.prefix = unique_prefix()
        self.restore_hash = replace_key_hash(self.hash_override) \
            if self.hash_override is not None else None
        self.store = RecordStore(self.prefix, initial_segment_bytes=256, max_record_bytes=400)
        self.peer_prefix = unique_prefix()
        self.peer = RecordStore(self.peer_prefix, initial_segment_bytes=256)
        self.model: dict[tuple[int, str], dict[bytes, bytes]] = {}
        self.iterators: list[tuple[object, dict[bytes, bytes]]] = []

    def fragment(self, pid: int, namespace: str) -> dict[bytes, bytes]:
        return self.model.setdefault((pid, namespace), {})

    @initialize()
    def start(self) -> None:
        assert list_segments(self.prefix) == []

    @rule(pid=pids, namespace=namespaces, key=keys_small, value=values_any)
    def put(self, pid: int, namespace: str, key: bytes, value: bytes) -> None:
        if header_bytes + len(key) + len(value) > 400:
            with pytest.raises(ValueTooLargeError):
                self.store.put(pid, namespace, key, value)
            return
        old = self.fragment(pid, namespace).get(key)
        assert self.store.put(pid, namespace, key, value) == old
        self.fragment(pid, namespace)[key] = value

    @rule(
        pid=pids,
        namespace=namespaces,
        pairs=st.lists(st.tuples(keys_small, st.binary(max_size=60)), max_size=30),
    )
    def put_many(self, pid: int, namespace: str, pairs: list[tuple[bytes, bytes]]) -> None:
        self.store.put_many(pid, namespace, iter(pairs))
        if pairs:
            self.fragment(pid, namespace).update(pairs)

    @rule(pid=pids, namespace=namespaces, data=st.data())
    def overwrite_batch(self, pid: int, namespace: str, data: st.DataObject) -> None:
        """A batch of keys that are all present, with values of their old sizes (written in
        place), sometimes with a key twice or one pair that is not such an overwrite, and
        sometimes with the fragment's Merkle tree kept (the store's check compares it)."""
        fragment = self.fragment(pid, namespace)
        if len(fragment) < 8:  # first give it keys enough (a block append, if all are new)
            added = [(b"fill-%d" % i, data.draw(st.binary(max_size=30))) for i in range(8)]
            self.store.put_many(pid, namespace, added)
            fragment.update(added)
        keys = data.draw(st.lists(st.sampled_from(sorted(fragment)), min_size=8, max_size=20,
                                  unique=data.draw(st.integers(0, 3)) > 0))
        pairs = [(key, data.draw(st.binary(min_size=len(fragment[key]),
                                           max_size=len(fragment[key])))) for key in keys]
        if data.draw(st.booleans()):
            self.store.tree(pid, namespace)
        if data.draw(st.booleans()):
            pairs.insert(data.draw(st.integers(0, len(pairs))),
                         (data.draw(keys_small), data.draw(st.binary(max_size=60))))
        self.store.put_many(pid, namespace, pairs)
        fragment.update(pairs)

    @rule(
        namespace=namespaces,
        groups=st.dictionaries(pids, st.lists(st.tuples(keys_small, st.binary(max_size=60)),
                                              max_size=5), max_size=4),
    )
    def put_groups(self, namespace: str, groups: dict[int, list[tuple[bytes, bytes]]]) -> None:
        self.store.put_groups(namespace, [(pid, [item for pair in pairs for item in pair])
                                          for pid, pairs in groups.items()])
        for pid, pairs in groups.items():
            if pairs:
                self.fragment(pid, namespace).update(pairs)

    @rule(namespace=namespaces, data=st.data())
    def put_runs(self, namespace: str, data: st.DataObject) -> None:
        """Runs of pairs by partition, as a batch message lays them out: new keys, keys
        present with values of their old size (written in place) or of another, a key
        twice, a partition twice, an empty run."""
        runs = []
        for pid in data.draw(st.lists(pids, max_size=4)):
            fragment = self.model.get((pid, namespace), {})
            pairs = []
            for _ in range(data.draw(st.integers(0, 4))):
                if fragment and data.draw(st.booleans()):
                    key = data.draw(st.sampled_from(sorted(fragment)))
                    size = len(fragment[key]) if data.draw(st.booleans()) else \
                        data.draw(st.integers(0, 60))
                    pairs.append((key, data.draw(st.binary(min_size=size, max_size=size))))
                else:  # a new key, maybe with a value of a present one's size
                    size = data.draw(st.sampled_from(sorted({len(v) for v in fragment.values()})
                                                     or [0])) if data.draw(st.booleans()) \
                        else data.draw(st.integers(0, 60))
                    pairs.append((data.draw(keys_small),
                                  data.draw(st.binary(min_size=size, max_size=size))))
            runs.append((pid, pairs))
        self.store.put_runs(namespace, [pid for pid, _ in runs], [len(pairs) for _, pairs in runs],
                            [item for _, pairs in runs for pair in pairs for item in pair])
        for pid, pairs in runs:
            if pairs:
                self.fragment(pid, namespace).update(pairs)

    @rule(pid=pids, namespace=namespaces, value_size=st.integers(min_value=0, max_value=40))
    def rewrite_all(self, pid: int, namespace: str, value_size: int) -> None:
        """Overwrite every key of a fragment: garbage piles up and the arena compacts."""
        fragment = self.model.get((pid, namespace), {})
        for index, (key, old) in enumerate(sorted(fragment.items())):
            value = bytes([index % 256]) * value_size
            assert self.store.put(pid, namespace, key, value) == old
            fragment[key] = value

    @rule(namespace=namespaces,
          groups=st.dictionaries(pids, st.lists(keys_small, max_size=5), max_size=4))
    def found_in(self, namespace: str, groups: dict[int, list[bytes]]) -> None:
        expected = []
        for pid, keys in groups.items():
            fragment = self.model.get((pid, namespace), {})
            for key in keys:
                if key in fragment:
                    expected += [key, fragment[key]]
        assert self.store.found_in(namespace, *_laid_out(groups)) == expected

    @rule(pid=pids, namespace=namespaces, key=keys_small)
    def get(self, pid: int, namespace: str, key: bytes) -> None:
        expected = self.model.get((pid, namespace), {}).get(key)
        assert self.store.get(pid, namespace, key) == expected
        assert self.store.contains(pid, namespace, key) == (expected is not None)

    @rule(pid=pids, namespace=namespaces, keys=st.lists(keys_small, max_size=10))
    def get_many(self, pid: int, namespace: str, keys: list[bytes]) -> None:
        fragment = self.model.get((pid, namespace), {})
        assert self.store.get_many(pid, namespace, keys) == [fragment.get(k) for k in keys]

    @rule(pid=pids, namespace=namespaces, key=keys_small)
    def remove(self, pid: int, namespace: str, key: bytes) -> None:
        expected = self.model.get((pid, namespace), {}).pop(key, None)
        assert self.store.remove(pid, namespace, key) == expected

    @rule(pid=pids, namespace=namespaces, draw=st.integers(min_value=0, max_value=3))
    def clear(self, pid: int, namespace: str, draw: int) -> None:
        if draw != 0:
            return  # rarer than writes, so that arenas fill up and compact
        expected = len(self.model.pop((pid, namespace), {}))
        assert self.store.clear(pid, namespace) == expected

    @rule(pid=pids, draw=st.integers(min_value=0, max_value=3))
    def drop_partition(self, pid: int, draw: int) -> None:
        if draw != 0:
            return
        for namespace in ("a", "b"):
            self.model.pop((pid, namespace), None)
        self.store.drop_partition(pid)
        assert self.store.namespaces(pid) == []

    @rule(pid=pids, namespace=namespaces)
    def start_items(self, pid: int, namespace: str) -> None:
        snapshot = dict(self.model.get((pid, namespace), {}))
        self.iterators.append((self.store.items(pid, namespace), snapshot))

    @precondition(lambda self: self.iterators)
    @rule(which=st.integers(min_value=0, max_value=10))
    def finish_items(self, which: int) -> None:
        iterator, snapshot = self.iterators.pop(which % len(self.iterators))
        pairs = list(iterator)
        assert len(pairs) == len(snapshot)
        assert dict(pairs) == snapshot

    @rule(
        pid=pids,
        namespace=namespaces,
        chunk_bytes=st.integers(min_value=1, max_value=600),
        writes=st.lists(st.tuples(keys_small, st.binary(max_size=60)), max_size=4),
    )
    def lend_to_a_peer(self, pid: int, namespace: str, chunk_bytes: int,
                       writes: list[tuple[bytes, bytes]]) -> None:
        """A migration's transfer: the peer gets the fragment as it was when lent, though
        writes land meanwhile; or, if a write compacted the arena away, a clean failure."""
        snapshot = dict(self.model.get((pid, namespace), {}))
        loan = self.store.lend(pid, namespace)
        if loan is None:
            assert not snapshot
            return
        try:
            for key, value in writes:
                self.put(pid, namespace, key, value)
            try:
                for part in loan.chunks(chunk_bytes):
                    self.peer.receive(pid, part)
            except FileNotFoundError:
                assert loan.segment.unlinked, "only a retired arena may be gone"
                return
            assert dict(self.peer.items(pid, namespace)) == snapshot
            self.peer._check()
        finally:
            loan.release()
            assert not self.store.loans

    @invariant()
    def sizes_and_fragments_agree(self) -> None:
        for (pid, namespace), fragment in self.model.items():
            assert self.store.size(pid, namespace) == len(fragment)
        self.store._check()
        partitions = sorted({pid for pid, _ in self.model})
        assert set(self.store.partitions()) <= set(partitions)
        # One linked segment per fragment, and shm_bytes counts exactly those.
        assert len(list_segments(self.prefix)) == fragment_count(self.store)
        assert self.store.shm_bytes() == segment_bytes_held(self.prefix)

    def teardown(self) -> None:
        try:
            self.iterators.clear()
            self.store.close()
            self.peer.close()
            assert list_segments(self.prefix) == []
            assert list_segments(self.peer_prefix) == []
        finally:
            remove_segments(self.prefix)
            remove_segments(self.peer_prefix)
            if self.restore_hash is not None:
                self.restore_hash()


class CollidingStoreMachine(StoreMachine):
    """The same model with a hash of only 4 values, so most keys collide."""

    hash_override = staticmethod(lambda key: len(key) % 4)


machine_settings = settings(
    max_examples=60,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreModel = StoreMachine.TestCase
TestStoreModel.settings = machine_settings
TestCollidingStoreModel = CollidingStoreMachine.TestCase
TestCollidingStoreModel.settings = machine_settings


def test_move_fragment_replaces_the_target_and_empties_the_source(make_store) -> None:
    store = make_store()
    store.put(3, "stage", b"a", b"1")
    store.put(3, "stage", b"b", b"2")
    store.put(3, "live", b"old", b"x")
    assert store.move_fragment(3, "stage", "live") == 2
    assert dict(store.items(3, "live")) == {b"a": b"1", b"b": b"2"}
    assert store.size(3, "stage") == 0 and store.get(3, "live", b"old") is None
    assert store.move_fragment(3, "stage", "live") == 0
    assert store.size(3, "live") == 0, "moving an empty source empties the target"


def test_concatenated_is_every_live_key_and_value_end_to_end(make_store) -> None:
    store = make_store()
    for i in range(50):
        store.put(7, "m", f"k{i}".encode(), bytes([i]) * i)
    for i in range(0, 50, 3):
        store.remove(7, "m", f"k{i}".encode())
    store.put(7, "m", b"k1", b"overwritten, longer than before")
    data, count = store.concatenated(7, "m")
    items = list(store.items(7, "m"))
    assert count == len(items) == 50 - 17
    assert data == b"".join(k + v for k, v in items)
    assert store.concatenated(7, "other") == (b"", 0)


def _scan_in_chunks(stores: list[RecordStore], max_bytes: int, record_bytes: int,
                    between: Callable[[int], None] | None = None) -> list[bytes]:
    """Every key of fragment 7/"m" by ``concatenated_from`` chunks (fixed-size records),
    asking the stores in turn, as a client does when the owner changes mid-scan."""
    keys, low, chunk = [], 0, 0
    while low is not None:
        data, count, bound = stores[chunk % len(stores)].concatenated_from(7, "m", low,
                                                                            max_bytes)
        assert len(data) == count * record_bytes
        assert len(data) <= max_bytes or count == 1, "a chunk over budget holds one record"
        assert bound is None or bound > low, "every chunk moves the scan on"
        keys += [data[at:at + 6] for at in range(0, len(data), record_bytes)]
        low, chunk = bound, chunk + 1
        if between is not None:
            between(chunk)
    return keys


@pytest.mark.parametrize("max_bytes", [1, 26, 100, 2_000, 1 << 20])
def test_a_scan_in_hash_range_chunks_returns_every_record_once(make_store, max_bytes) -> None:
    store = make_store()
    keys = [f"k{i:05d}".encode() for i in range(1_500)]
    store.put_many(7, "m", [(key, key * 3 + b"vv") for key in keys])  # 26-byte records
    scanned = _scan_in_chunks([store], max_bytes, 26)
    assert sorted(scanned) == keys
    assert store.concatenated_from(8, "m", 0, max_bytes) == (b"", 0, None)
    assert store.concatenated_from(7, "other", 5, max_bytes) == (b"", 0, None)


def test_a_fragment_that_fits_comes_whole_in_one_chunk(make_store) -> None:
    store = make_store()
    store.put_many(7, "m", [(f"k{i:05d}".encode(), b"v" * 20) for i in range(100)])
    data, count, bound = store.concatenated_from(7, "m", 0, 1 << 20)
    assert (data, count, bound) == (*store.concatenated(7, "m"), None)


def test_writes_during_a_chunked_scan_never_repeat_an_entry(make_store) -> None:
    """Entries left alone come exactly once; ones rewritten (moved in the arena), removed or
    added between chunks come at most once."""
    store = make_store(initial_segment_bytes=4096)  # small: the rewrites compact it
    keys = [f"k{i:05d}".encode() for i in range(2_000)]
    store.put_many(7, "m", [(key, key * 3 + b"vv") for key in keys])
    touched = set(keys[::7])

    def rewrite(chunk: int) -> None:
        for key in keys[chunk::7]:  # same size, so the records stay 26 bytes
            store.remove(7, "m", key)
            store.put(7, "m", key, b"rw" + key * 3)
        store.put(7, "m", f"n{chunk:05d}".encode(), b"added".ljust(20, b"."))

    scanned = _scan_in_chunks([store], 1_000, 26, between=rewrite)
    assert len(scanned) == len(set(scanned)), "no entry twice"
    assert set(keys) - set(scanned) <= touched, "every entry left alone is scanned"


def test_a_chunked_scan_goes_on_at_another_replica_where_it_stopped(make_store) -> None:
    """The bound is a key hash, not a position in one store: a new owner with the same
    entries continues the scan without a gap or a repeat."""
    owner, backup = make_store(), make_store(initial_segment_bytes=1 << 20)
    keys = [f"k{i:05d}".encode() for i in range(1_000)]
    owner.put_many(7, "m", [(key, key * 3 + b"vv") for key in keys])
    backup.put_many(7, "m", [(key, key * 3 + b"vv") for key in reversed(keys)])
    assert sorted(_scan_in_chunks([owner, backup], 1_500, 26)) == keys


def test_found_in_gives_the_present_keys_of_many_partitions_with_their_values(
        make_store) -> None:
    store = make_store()
    store.put(1, "m", b"a", b"1")
    store.put(2, "m", b"b", b"2")
    store.put(2, "other", b"c", b"3")
    batch = _laid_out({1: [b"a", b"absent"], 2: [b"c", b"b"], 9: [b"a"], 3: [b"a"]})
    assert store.found_in("m", *batch) == [b"a", b"1", b"b", b"2"]
    assert store.found_in("m", *batch, skip={1, 9}) == [b"b", b"2"]  # not the ones skipped
    assert store.found_in("other", *batch) == [b"c", b"3"]
    assert store.found_in("none", *batch) == []
    assert store.found_in("m", [], []) == []
    assert store.found_in("m", [2], [b"a", b"b", b"c"]) == [b"b", b"2"]  # one for all
    pids, keys = batch  # the keys of a partition need not be together
    assert store.found_in("m", pids[::-1], keys[::-1]) == [b"b", b"2", b"a", b"1"]


def _laid_out(groups: dict[int, list[bytes]]) -> tuple[list[int], list[bytes]]:
    """``found_in``'s batch of keys: each key's partition, and the keys (in the order of
    ``groups``, and then the other way round: found_in takes keys in any order)."""
    pairs = [(pid, key) for pid, keys in groups.items() for key in keys]
    return [pid for pid, _ in pairs], [key for _, key in pairs]


def test_found_in_finds_keys_whose_hashes_collide(make_store, key_hash_replaced) -> None:
    key_hash_replaced(lambda key: 42 if key != b"alone" else 7)  # all but one collide
    store = make_store()
    store.put_many(1, "m", [(b"a", b"1"), (b"b", b"2"), (b"alone", b"3")])
    store.put(2, "m", b"c", b"4")
    groups = {1: [b"b", b"x", b"alone", b"a"], 2: [b"x", b"c"]}
    assert store.found_in("m", *_laid_out(groups)) == [b"b", b"2", b"alone", b"3", b"a", b"1",
                                                   b"c", b"4"]
