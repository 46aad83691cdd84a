"""The record store's per-fragment Merkle trees (differential replica sync): lazy, kept exact
by every write, dropped with the fragment; leaf_entries and replace_leaves sync two stores."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from grid.partition.merkle import MerkleTree, diff_leaves, entry_hash
from tests.workers.conftest import unique_prefix
from workers import record_store
from workers.record_store import (
    RecordStore,
    RecordStoreInvariantError,
    ValueTooLargeError,
)
from workers.shm import list_segments, remove_segments

Model = dict[tuple[int, str], dict[bytes, bytes]]


def tree_of(depth: int, fragment: dict[bytes, bytes]) -> MerkleTree:
    """The reference: a tree rebuilt from scratch (the store's index hash, looked up now so
    that a test's colliding hash applies)."""
    hashes = ((record_store.key_hash(k), v) for k, v in fragment.items())
    return MerkleTree.of(depth, ((h, entry_hash(h, v)) for h, v in hashes))


def leaf_of(depth: int, key: bytes) -> int:
    return MerkleTree(depth).leaf_of(record_store.key_hash(key))


def kept_tree(store: RecordStore, pid: int, namespace: str) -> MerkleTree | None:
    """The tree the fragment holds now, without building one."""
    return store._partitions[pid][namespace].tree


class Journal:
    """Records the hooks the store calls on every mutation."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def put(self, pid: int, namespace: str, key: bytes, value: bytes) -> None:
        self.calls.append(("put", pid, namespace, key, bytes(value)))

    def put_many(self, pid: int, namespace: str, pairs) -> None:
        self.calls.append(("put_many", pid, namespace, [(k, bytes(v)) for k, v in pairs]))

    def remove(self, pid: int, namespace: str, key: bytes) -> None:
        self.calls.append(("remove", pid, namespace, key))

    def clear(self, pid: int, namespace: str) -> None:
        self.calls.append(("clear", pid, namespace))


@pytest.fixture
def peer_prefix() -> Iterator[str]:
    """A second store's prefix, checked clean after the test like ``shm_prefix``."""
    prefix = unique_prefix()
    yield prefix
    leaked = remove_segments(prefix)
    assert leaked == [], f"test left segments in /dev/shm: {leaked}"


@pytest.fixture
def colliding_hash(key_hash_replaced) -> None:
    """An index hash with 16 values, one per leaf at depth 5: most keys collide."""
    real = record_store.key_hash
    key_hash_replaced(lambda key: real(key) & (0xF << 60))


def random_fragment(rng: random.Random, size: int, key_space: int = 400) -> dict[bytes, bytes]:
    return {b"k%d" % rng.randrange(key_space): rng.randbytes(rng.randrange(0, 40))
            for _ in range(size)}


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [-1, 21, 2.0, True, "3", None])
def test_a_bad_depth_is_refused(shm_prefix: str, depth) -> None:
    with pytest.raises(ValueError, match="merkle_depth"):
        RecordStore(shm_prefix, merkle_depth=depth)
    assert list_segments(shm_prefix) == []


def test_depth_zero_has_no_trees_and_no_leaves(make_store) -> None:
    store = make_store(merkle_depth=0)
    store.put(1, "m", b"k", b"v")
    assert store.tree(1, "m") is None
    assert store.tree(1, "absent") is None
    assert kept_tree(store, 1, "m") is None
    with pytest.raises(ValueError, match="merkle_depth=0"):
        store.leaf_entries(1, "m", [0])
    with pytest.raises(ValueError, match="merkle_depth=0"):
        store.replace_leaves(1, "m", [0], [])
    assert store.get(1, "m", b"k") == b"v"


def test_trees_are_built_on_the_first_call_only(make_store) -> None:
    store = make_store(merkle_depth=6)
    model = {b"k%d" % i: b"v%d" % i for i in range(100)}
    store.put_many(1, "m", model.items())
    store.put(1, "m", b"k1", b"longer value")
    store.remove(1, "m", b"k2")
    model[b"k1"] = b"longer value"
    del model[b"k2"]
    assert kept_tree(store, 1, "m") is None, "no write builds a tree"
    tree = store.tree(1, "m")
    assert tree.depth == 6
    assert tree.nodes == tree_of(6, model).nodes
    assert tree.root != 0
    assert store.tree(1, "m") is tree is kept_tree(store, 1, "m")


def test_the_default_depth_is_ten(make_store) -> None:
    store = make_store()
    store.put(1, "m", b"k", b"v")
    assert store.tree(1, "m").depth == 10


def test_a_missing_fragment_has_an_all_zero_tree_that_is_not_kept(make_store) -> None:
    store = make_store(merkle_depth=4)
    tree = store.tree(3, "none")
    assert tree.depth == 4 and not any(tree.nodes)
    assert store.partitions() == [] and store.tree(3, "none") is not tree
    store.put(3, "none", b"k", b"v")
    assert store.tree(3, "none").nodes == tree_of(4, {b"k": b"v"}).nodes


# -- every mutation keeps the tree exact --------------------------------------------------------


def segment_of(store: RecordStore, pid: int, namespace: str) -> object:
    fragment = store._partitions.get(pid, {}).get(namespace)
    return None if fragment is None else fragment.segment


def run_random_mutations(store: RecordStore, rng: random.Random, depth: int, steps: int
                         ) -> Model:
    """Random writes on fragments whose trees were built (and on some never built); after
    each, every kept tree is the same object as before and equals a rebuilt one."""
    model: Model = {}
    kept: dict[tuple[int, str], MerkleTree] = {}
    fragments = [(pid, ns) for pid in (0, 5) for ns in ("a", "b", "c")]
    untracked = {(5, "c")}  # never asked for a tree until the end (unless one moves there)
    keys = [b"k%d" % i for i in range(60)]
    compactions = 0

    def value() -> bytes | bytearray | memoryview:
        raw = rng.randbytes(rng.choice([0, 3, 3, 10, 50, 100]))
        return rng.choice([raw, raw, bytearray(raw), memoryview(raw)])

    for _ in range(steps):
        pid, ns = rng.choice(fragments)
        fragment = model.setdefault((pid, ns), {})
        op = rng.random()
        segment_before = segment_of(store, pid, ns)
        if op < 0.40:
            key, v = rng.choice(keys), value()
            assert store.put(pid, ns, key, v) == fragment.get(key)
            fragment[key] = bytes(v)
        elif op < 0.55:
            pairs = [(rng.choice(keys), value()) for _ in range(rng.randrange(0, 12))]
            store.put_many(pid, ns, pairs)
            fragment.update((k, bytes(v)) for k, v in pairs)
        elif op < 0.78:
            key = rng.choice(keys)
            assert store.remove(pid, ns, key) == fragment.pop(key, None)
        elif op < 0.86:
            # Overwrites with growing values: garbage piles up and the arena compacts.
            for key in rng.sample(keys, 8):
                fragment[key] = rng.randbytes(rng.randrange(60, 200))
                store.put(pid, ns, key, fragment[key])
        elif op < 0.92:
            assert store.clear(pid, ns) == len(fragment)
            model.pop((pid, ns))
            kept.pop((pid, ns), None)
        else:
            target = rng.choice([t for t in fragments if t[0] == pid and t != (pid, ns)])
            store.move_fragment(pid, ns, target[1])
            model[(pid, target[1])] = model.pop((pid, ns))
            kept.pop(target, None)
            if (pid, ns) in kept:
                kept[target] = kept.pop((pid, ns))
        segment_after = segment_of(store, pid, ns)
        if segment_before is not None and segment_after not in (None, segment_before):
            compactions += 1
        for (fpid, fns), tree in kept.items():
            assert store.tree(fpid, fns) is tree, "the kept tree, not a rebuilt one"
            assert tree.nodes == tree_of(depth, model.get((fpid, fns), {})).nodes
        for fpid, fns in fragments:
            if (fpid, fns) not in kept and (fpid, fns) not in untracked and \
                    fns in store._partitions.get(fpid, {}):
                kept[(fpid, fns)] = store.tree(fpid, fns)
        store._check()
    assert compactions > 0, "the sequence must exercise compaction"
    for fpid, fns in fragments:
        fragment = model.get((fpid, fns), {})
        assert dict(store.items(fpid, fns)) == fragment
        assert store.tree(fpid, fns).nodes == tree_of(depth, fragment).nodes
    return model


@pytest.mark.parametrize("seed", range(6))
def test_random_mutations_keep_every_built_tree_exact(make_store, seed: int) -> None:
    depth = [1, 3, 10, 7, 12, 5][seed]
    store = make_store(merkle_depth=depth, initial_segment_bytes=512)
    run_random_mutations(store, random.Random(seed), depth, 400)


@pytest.mark.parametrize("seed", range(3))
def test_random_mutations_with_colliding_hashes(make_store, colliding_hash, seed: int) -> None:
    store = make_store(merkle_depth=5, initial_segment_bytes=512)
    run_random_mutations(store, random.Random(100 + seed), 5, 300)
    assert any(fragment.tuple_entry_count for namespaces in store._partitions.values()
               for fragment in namespaces.values()), "the hash must make collisions"


def test_the_self_check_catches_a_wrong_tree(make_store) -> None:
    store = make_store(merkle_depth=5)
    store.put_many(1, "m", [(b"k%d" % i, b"v") for i in range(20)])
    tree = store.tree(1, "m")
    store._check()
    tree.update(123, None, 1)
    with pytest.raises(RecordStoreInvariantError, match="Merkle"):
        store._check()


def test_move_fragment_carries_the_source_tree_and_drops_the_target_one(make_store) -> None:
    store = make_store(merkle_depth=6)
    store.put_many(2, "stage", [(b"a", b"1"), (b"b", b"2")])
    store.put(2, "live", b"old", b"x")
    source_tree = store.tree(2, "stage")
    store.tree(2, "live")
    live_before = store._partitions[2]["live"]
    assert store.move_fragment(2, "stage", "live") == 2
    assert kept_tree(store, 2, "live") is source_tree and live_before.tree is None
    assert source_tree.nodes == tree_of(6, {b"a": b"1", b"b": b"2"}).nodes
    assert not any(store.tree(2, "stage").nodes) and store.namespaces(2) == ["live"]
    store.put(2, "live", b"c", b"3")
    assert source_tree.nodes == tree_of(6, {b"a": b"1", b"b": b"2", b"c": b"3"}).nodes


def test_clear_drop_and_close_drop_the_trees(make_store) -> None:
    store = make_store(merkle_depth=4)
    for ns in ("a", "b"):
        store.put(1, ns, b"k", b"v")
        store.tree(1, ns)
    fragment_a = store._partitions[1]["a"]
    store.clear(1, "a")
    assert fragment_a.tree is None and not any(store.tree(1, "a").nodes)
    fragment_b = store._partitions[1]["b"]
    store.drop_partition(1)
    assert fragment_b.tree is None and not any(store.tree(1, "b").nodes)
    store.put(2, "c", b"k", b"v")
    store.tree(2, "c")
    fragment_c = store._partitions[2]["c"]
    store.close()
    assert fragment_c.tree is None and not any(store.tree(2, "c").nodes)


# -- a received fragment ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_a_received_fragment_drops_the_tree_and_the_next_is_right(
        make_store, peer_prefix: str, seed: int) -> None:
    rng = random.Random(seed)
    lender = make_store(merkle_depth=8, initial_segment_bytes=1024)
    receiver = RecordStore(peer_prefix, merkle_depth=8, initial_segment_bytes=1024)
    try:
        lent = random_fragment(rng, 300)
        lender.put_many(4, "m", lent.items())
        for key in rng.sample(sorted(lent), 150):  # garbage > live: lend compacts first
            lent[key] = rng.randbytes(rng.randrange(60, 120))
            lender.put(4, "m", key, lent[key])
        lender_tree = lender.tree(4, "m")
        receiver.put_many(4, "m", random_fragment(rng, 50).items())
        old_tree = receiver.tree(4, "m")
        loan = lender.lend(4, "m")
        try:
            for chunk in loan.chunks(rng.choice([512, 4096, 1 << 20])):
                receiver.receive(4, chunk)
        finally:
            loan.release()
        assert kept_tree(receiver, 4, "m") is None, "a received fragment has no tree yet"
        assert lender.tree(4, "m") is lender_tree  # lending (and its compaction) keeps it
        assert lender_tree.nodes == tree_of(8, lent).nodes
        tree = receiver.tree(4, "m")
        assert tree is not old_tree
        assert tree.nodes == lender_tree.nodes == tree_of(8, lent).nodes
        receiver.put(4, "m", b"after", b"x")
        lent[b"after"] = b"x"
        assert receiver.tree(4, "m").nodes == tree_of(8, lent).nodes
        receiver._check()
        lender._check()
    finally:
        receiver.close()


# -- leaf_entries and replace_leaves ------------------------------------------------------------


@pytest.mark.parametrize(("depth", "collide"), [(1, False), (6, False), (12, False), (5, True)])
def test_leaf_entries_are_exactly_the_entries_under_the_leaves(
        make_store, monkeypatch, key_hash_replaced, depth: int, collide: bool) -> None:
    if collide:
        real = record_store.key_hash
        key_hash_replaced(lambda key: real(key) & (0xF << 60))
    rng = random.Random(depth)
    store = make_store(merkle_depth=depth)
    fragment = random_fragment(rng, 500, key_space=2000)
    store.put_many(3, "m", fragment.items())
    if collide:
        assert store._partitions[3]["m"].tuple_entry_count > 0
    reads = []
    unpack = record_store._unpack_header
    monkeypatch.setattr(record_store, "_unpack_header",
                        lambda mm, offset: reads.append(offset) or unpack(mm, offset))
    leaf_count = 1 << (depth - 1)
    for _ in range(10):
        leaves = set(rng.sample(range(leaf_count), rng.randrange(0, min(leaf_count, 8) + 1)))
        reads.clear()
        got = store.leaf_entries(3, "m", leaves)
        expected = {k: v for k, v in fragment.items() if leaf_of(depth, k) in leaves}
        assert dict(got) == expected and len(got) == len(expected)
        assert len(reads) == len(expected), "only the selected records are read"
    assert store.leaf_entries(3, "absent", [0]) == []
    for bad in (-1, leaf_count, "0", 1.0):
        with pytest.raises(ValueError, match="leaf"):
            store.leaf_entries(3, "m", [bad])


@pytest.mark.parametrize("seed", range(5))
def test_replace_leaves_with_the_peer_entries_makes_the_trees_equal(
        make_store, peer_prefix: str, seed: int) -> None:
    rng = random.Random(seed)
    depth = [4, 8, 10, 1, 12][seed]
    source = make_store(merkle_depth=depth)
    replica = RecordStore(peer_prefix, merkle_depth=depth, initial_segment_bytes=1024)
    try:
        truth = random_fragment(rng, 400, key_space=800)
        stale = dict(truth)
        for key in rng.sample(sorted(stale), 30):
            del stale[key]
        for key in rng.sample(sorted(stale), 30):
            stale[key] = b"stale" + stale[key]
        stale.update(random_fragment(rng, 20, key_space=800))
        source.put_many(9, "m", truth.items())
        replica.put_many(9, "m", stale.items())
        replica_tree = replica.tree(9, "m")
        leaves, _ = diff_leaves(replica_tree, source.tree(9, "m"))
        assert leaves
        differing = {k for k in truth.keys() | stale.keys() if truth.get(k) != stale.get(k)}
        assert {leaf_of(depth, k) for k in differing} == set(leaves)
        replica.journal = journal = Journal()
        changed = replica.replace_leaves(9, "m", leaves, source.leaf_entries(9, "m", leaves))
        assert changed == len(differing)
        assert replica.tree(9, "m") is replica_tree
        assert replica_tree.nodes == source.tree(9, "m").nodes == tree_of(depth, truth).nodes
        assert dict(replica.items(9, "m")) == truth
        # Through the normal paths: the journal saw exactly the changes.
        written = {k: v for call in journal.calls if call[0] == "put_many" for k, v in call[3]}
        removed = {call[3] for call in journal.calls if call[0] == "remove"}
        assert written == {k: truth[k] for k in differing if k in truth}
        assert removed == {k for k in differing if k not in truth}
        assert replica.replace_leaves(9, "m", leaves, source.leaf_entries(9, "m", leaves)) == 0
        replica._check()
    finally:
        replica.close()


def test_replace_leaves_refuses_a_bad_pair_and_changes_nothing(make_store) -> None:
    store = make_store(merkle_depth=3, max_record_bytes=100)
    fragment = {b"k%d" % i: b"v%d" % i for i in range(40)}
    store.put_many(1, "m", fragment.items())
    tree = store.tree(1, "m")
    nodes = tree.nodes.tolist()
    store.journal = journal = Journal()
    leaf = leaf_of(3, b"k0")
    other = next(k for k in fragment if leaf_of(3, k) != leaf)
    with pytest.raises(ValueError, match="not under the leaves"):
        store.replace_leaves(1, "m", [leaf], [(b"k0", b"new"), (other, b"x")])
    with pytest.raises(ValueTooLargeError):
        store.replace_leaves(1, "m", [leaf], [(b"k0", b"x" * 200)])
    assert journal.calls == [] and tree.nodes.tolist() == nodes
    assert dict(store.items(1, "m")) == fragment
    # Empty pairs empty the leaf; a missing fragment with no pairs stays missing.
    in_leaf = {k for k in fragment if leaf_of(3, k) == leaf}
    assert store.replace_leaves(1, "m", [leaf], []) == len(in_leaf)
    assert dict(store.items(1, "m")) == {k: v for k, v in fragment.items() if k not in in_leaf}
    assert store.replace_leaves(2, "none", [0, 1], []) == 0 and store.partitions() == [1]
    store._check()


def test_replace_leaves_creates_a_missing_fragment(make_store) -> None:
    store: RecordStore = make_store(merkle_depth=2)
    pairs = [(b"a", b"1"), (bytearray(b"b"), memoryview(b"2"))]
    leaves = {leaf_of(2, bytes(k)) for k, _ in pairs}
    assert store.replace_leaves(4, "m", leaves, pairs) == 2
    assert dict(store.items(4, "m")) == {b"a": b"1", b"b": b"2"}
    assert store.tree(4, "m").nodes == tree_of(2, {b"a": b"1", b"b": b"2"}).nodes

