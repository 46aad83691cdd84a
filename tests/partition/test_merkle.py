"""The Merkle tree of a fragment (grid/partition/merkle.py): random fragments with random
edits; the diff finds exactly the changed keys, in few rounds, moving few entries."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.partition.merkle import DiffRound, MerkleTree, diff_leaves, entry_hash
from workers.record_store import key_hash


def tree_of(depth: int, fragment: dict[bytes, bytes]) -> MerkleTree:
    hashes = ((key_hash(k), v) for k, v in fragment.items())
    return MerkleTree.of(depth, ((h, entry_hash(h, v)) for h, v in hashes))


def changed_keys(depth: int, a: dict[bytes, bytes], b: dict[bytes, bytes],
                 levels: int) -> tuple[set[bytes], int, int]:
    """What a sync would find: the keys under differing leaves whose entries differ, how
    many entries it looked at, and the rounds."""
    ta, tb = tree_of(depth, a), tree_of(depth, b)
    leaves, rounds = diff_leaves(ta, tb, levels)
    wanted = set(leaves)
    candidates = {k for k in (*a, *b) if ta.leaf_of(key_hash(k)) in wanted}
    return {k for k in candidates if a.get(k) != b.get(k)}, len(candidates), rounds


keys = st.binary(min_size=1, max_size=12)
fragments = st.dictionaries(keys, st.binary(max_size=20), max_size=300)
edits = st.lists(st.tuples(st.sampled_from(["put", "remove"]), keys, st.binary(max_size=20)),
                 max_size=30)


@settings(max_examples=200, deadline=None)
@given(fragment=fragments, edits=edits, depth=st.integers(min_value=1, max_value=12),
       levels=st.integers(min_value=1, max_value=6))
def test_the_diff_finds_exactly_the_changed_keys(fragment, edits, depth, levels):
    edited = dict(fragment)
    for kind, key, value in edits:
        if kind == "put":
            edited[key] = value
        else:
            edited.pop(key, None)
    truth = {k for k in (*fragment, *edited) if fragment.get(k) != edited.get(k)}
    found, _, rounds = changed_keys(depth, fragment, edited, levels)
    assert found == truth
    assert rounds <= -(-depth // levels)


@settings(max_examples=100, deadline=None)
@given(fragment=fragments, edits=edits)
def test_updates_in_any_order_give_the_tree_built_from_scratch(fragment, edits):
    tree = tree_of(8, fragment)
    edited = dict(fragment)
    for kind, key, value in edits:
        old = edited.get(key)
        new = value if kind == "put" else None
        if kind == "put":
            edited[key] = value
        else:
            edited.pop(key, None)
        tree.update(key_hash(key), None if old is None else entry_hash(key_hash(key), old),
                    None if new is None else entry_hash(key_hash(key), new))
    assert list(tree.nodes) == list(tree_of(8, edited).nodes)


def test_equal_fragments_take_one_round_and_a_few_edits_move_a_few_entries():
    rng = random.Random(5)
    fragment = {rng.randbytes(8): rng.randbytes(100) for _ in range(20_000)}
    assert diff_leaves(tree_of(12, fragment), tree_of(12, fragment), 4) == ([], 1)
    edited = dict(fragment)
    for key in rng.sample(sorted(fragment), 20):
        edited[key] = b"changed"
    found, looked_at, rounds = changed_keys(12, fragment, edited, 4)
    assert len(found) == 20 and rounds == 3
    assert looked_at < 20 * 20, f"{looked_at} entries looked at for 20 changed of 20,000"


def test_a_round_sends_the_subtrees_and_answers_the_differing_nodes():
    a, b = MerkleTree(4), MerkleTree(4)
    b.update(0, None, 7)  # leaf 0
    sent = DiffRound.ask(a, 0, [0], 2)
    assert set(sent) == {(0, 0), (1, 0), (1, 1)}
    assert DiffRound.answer(b, sent) == [0]
    with pytest.raises(ValueError):
        MerkleTree(0)
    with pytest.raises(ValueError):
        diff_leaves(MerkleTree(3), MerkleTree(4))


def _eager_nodes(depth: int, pairs: list[tuple[int, int]]) -> list[int]:
    """Every node summed from scratch: a leaf the sum of its entries, a node of its two
    children (the tree's definition, without its lazy bookkeeping)."""
    mask = (1 << 64) - 1
    nodes = [0] * ((1 << depth) - 1)
    first = (1 << (depth - 1)) - 1
    for key_hash_, hashed in pairs:
        leaf = first + ((key_hash_ & mask) >> (65 - depth))
        nodes[leaf] = (nodes[leaf] + hashed) & mask
    for i in range(first - 1, -1, -1):
        nodes[i] = (nodes[2 * i + 1] + nodes[2 * i + 2]) & mask
    return nodes


@settings(max_examples=100, deadline=None)
@given(depth=st.integers(min_value=1, max_value=12),
       batches=st.lists(st.lists(st.tuples(st.integers(0, (1 << 64) - 1),
                                           st.integers(0, (1 << 64) - 1)), max_size=40),
                        max_size=6),
       read_between=st.lists(st.booleans(), min_size=6, max_size=6))
def test_leaf_updates_and_batches_read_back_as_a_tree_summed_from_scratch(depth, batches,
                                                                         read_between):
    """Writes touch leaves only and reads sum the inner nodes: reads between writes, single
    updates and batches of new entries all give the tree's definition."""
    tree = MerkleTree(depth)
    done: list[tuple[int, int]] = []
    for n, batch in enumerate(batches):
        if n % 2:
            tree.add_many([h for h, _ in batch], [e for _, e in batch])
        else:
            for h, e in batch:
                tree.update(h, None, e)
        done += batch
        if read_between[n]:
            assert list(tree.nodes) == _eager_nodes(depth, done)
    assert list(tree.nodes) == _eager_nodes(depth, done)
    assert tree.root == _eager_nodes(depth, done)[0]
    copy = MerkleTree.from_nodes(depth, bytes(tree.nodes))
    assert list(copy.nodes) == list(tree.nodes)
