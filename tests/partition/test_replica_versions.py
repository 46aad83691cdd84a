"""Replica version vectors per partition and namespace (seed 004)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.partition.replica_versions import (
    REPLICA_VERSION_COUNT,
    BackupDecision,
    ReplicaVersions,
    ReplicaVersionsError,
)

MAP = "map:orders"
OTHER = "map:users"


def test_unknown_versions_are_zero_and_clean():
    rv = ReplicaVersions()
    assert rv.get(3, MAP) == (0,) * REPLICA_VERSION_COUNT
    assert not rv.is_dirty(3, MAP)
    assert rv.namespaces(3) == []


@pytest.mark.parametrize("backup_count", range(0, 7))
def test_primary_increments_the_first_n_entries(backup_count):
    rv = ReplicaVersions()
    rv.increment(0, MAP, 6)
    after = rv.increment(0, MAP, backup_count)
    assert after == tuple(2 if k < backup_count else 1 for k in range(6))
    assert rv.get(0, MAP) == after


def test_three_backups_example_from_the_seed():
    # [A+1, B+1, C+1, D, E, F] after an operation with 3 backups.
    primary = ReplicaVersions()
    for backup_count in (6, 5, 4, 3, 2, 1):
        primary.increment(0, MAP, backup_count)  # A..F = 6, 5, 4, 3, 2, 1
    before = primary.get(0, MAP)
    carried = primary.increment(0, MAP, 3)
    assert carried == (before[0] + 1, before[1] + 1, before[2] + 1, *before[3:])
    replicas = {index: ReplicaVersions() for index in (1, 2, 3)}
    for index, rv in replicas.items():
        rv.set(0, MAP, before, replica_index=index)
        assert rv.apply_backup(0, MAP, index, carried) is BackupDecision.APPLY
    assert replicas[1].get(0, MAP) == carried
    assert replicas[2].get(0, MAP) == (0, *carried[1:])
    assert replicas[3].get(0, MAP) == (0, 0, *carried[2:])


def test_backup_one_ahead_is_applied_and_set():
    rv = ReplicaVersions()
    decision = rv.apply_backup(0, MAP, 1, (1, 1, 0, 0, 0, 0))
    assert decision is BackupDecision.APPLY
    assert decision.apply
    assert not decision.request_sync
    assert rv.get(0, MAP) == (1, 1, 0, 0, 0, 0)
    assert rv.apply_backup(0, MAP, 1, (2, 2, 0, 0, 0, 0)) is BackupDecision.APPLY
    assert not rv.is_dirty(0, MAP)


@pytest.mark.parametrize("carried", [3, 4])
def test_stale_backup_is_ignored(carried):
    rv = ReplicaVersions()
    rv.set(0, MAP, (4, 4, 0, 0, 0, 0))
    decision = rv.apply_backup(0, MAP, 1, (carried, carried, 0, 0, 0, 0))
    assert decision is BackupDecision.STALE
    assert not decision.apply
    assert not decision.request_sync
    assert rv.get(0, MAP) == (4, 4, 0, 0, 0, 0)


def test_backup_skipping_ahead_is_applied_and_marks_dirty():
    rv = ReplicaVersions()
    rv.set(0, MAP, (4, 4, 0, 0, 0, 0))
    decision = rv.apply_backup(0, MAP, 1, (6, 6, 0, 0, 0, 0))
    assert decision is BackupDecision.APPLY_DIRTY
    assert decision.apply
    assert decision.request_sync
    assert rv.get(0, MAP) == (6, 6, 0, 0, 0, 0)
    assert rv.is_dirty(0, MAP)
    assert rv.dirty_namespaces(0) == [MAP]


@pytest.mark.parametrize("carried", [1, 6, 7, 8, 20])
def test_dirty_replica_asks_for_sync_again_whatever_the_version(carried):
    """Seed 004's fourth rule adds a sync request to every operation a dirty replica gets;
    whether it is applied is still decided by the version (a newer one is, a stale one not)."""
    rv = ReplicaVersions()
    rv.set(0, MAP, (6, 0, 0, 0, 0, 0))
    rv.mark_dirty(0, MAP)
    decision = rv.apply_backup(0, MAP, 1, (carried, 0, 0, 0, 0, 0))
    assert decision.request_sync
    assert rv.is_dirty(0, MAP)
    if carried > 6:
        assert decision is BackupDecision.SYNC_AGAIN
        assert decision.apply
        assert rv.get(0, MAP) == (carried, 0, 0, 0, 0, 0)
    else:
        assert decision is BackupDecision.STALE_DIRTY
        assert not decision.apply
        assert rv.get(0, MAP) == (6, 0, 0, 0, 0, 0)


def test_sync_clears_dirty_and_backups_resume():
    rv = ReplicaVersions()
    rv.apply_backup(0, MAP, 2, (9, 3, 0, 0, 0, 0))  # skips ahead at index 2
    assert rv.is_dirty(0, MAP)
    assert rv.get(0, MAP) == (0, 3, 0, 0, 0, 0)  # hotter entries stay zero
    rv.set(0, MAP, (10, 4, 0, 0, 0, 0), replica_index=2)
    assert not rv.is_dirty(0, MAP)
    assert rv.get(0, MAP) == (0, 4, 0, 0, 0, 0)
    assert rv.apply_backup(0, MAP, 2, (11, 5, 0, 0, 0, 0)) is BackupDecision.APPLY


def test_namespaces_of_one_partition_are_independent():
    rv = ReplicaVersions()
    assert rv.apply_backup(7, MAP, 1, (1, 0, 0, 0, 0, 0)) is BackupDecision.APPLY
    assert rv.apply_backup(7, OTHER, 1, (3, 0, 0, 0, 0, 0)) is BackupDecision.APPLY_DIRTY
    assert rv.apply_backup(7, MAP, 1, (2, 0, 0, 0, 0, 0)) is BackupDecision.APPLY
    assert rv.apply_backup(7, OTHER, 1, (4, 0, 0, 0, 0, 0)) is BackupDecision.SYNC_AGAIN
    assert rv.get(7, MAP) == (2, 0, 0, 0, 0, 0)
    assert rv.get(7, OTHER) == (4, 0, 0, 0, 0, 0)
    assert rv.namespaces(7) == [MAP, OTHER]
    assert rv.dirty_namespaces(7) == [OTHER]
    assert rv.get(8, MAP) == (0,) * 6  # other partitions are untouched
    primary = ReplicaVersions()
    primary.increment(7, MAP, 2)
    assert primary.get(7, OTHER) == (0,) * 6


def test_needs_sync_compares_at_the_replica_index():
    rv = ReplicaVersions()
    rv.set(0, MAP, (0, 5, 2, 0, 0, 0), replica_index=2)
    assert not rv.needs_sync(0, MAP, 2, (9, 5, 2, 0, 0, 0))
    assert rv.needs_sync(0, MAP, 2, (9, 6, 2, 0, 0, 0))  # behind the primary
    assert rv.needs_sync(0, MAP, 2, (9, 4, 2, 0, 0, 0))  # ahead: also inconsistent
    rv.mark_dirty(0, MAP)
    assert rv.needs_sync(0, MAP, 2, (9, 5, 2, 0, 0, 0))
    assert rv.needs_sync(1, MAP, 1, (1, 0, 0, 0, 0, 0))  # never seen


def test_clear_one_namespace_or_the_partition():
    rv = ReplicaVersions()
    rv.increment(0, MAP, 1)
    rv.increment(0, OTHER, 1)
    rv.clear(0, MAP)
    assert rv.namespaces(0) == [OTHER]
    rv.clear(0, OTHER)
    assert rv.namespaces(0) == []
    rv.increment(0, MAP, 1)
    rv.clear(0)
    assert rv.get(0, MAP) == (0,) * 6
    rv.clear(5)  # nothing there: no error
    rv.clear(5, MAP)


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("increment", (0, MAP, 7)),
        ("increment", (0, MAP, -1)),
        ("apply_backup", (0, MAP, 0, (1,) * 6)),
        ("apply_backup", (0, MAP, 7, (1,) * 6)),
        ("apply_backup", (0, MAP, 1, (1,) * 5)),
        ("apply_backup", (0, MAP, 1, (-1,) * 6)),
        ("apply_backup", (0, MAP, 1, (True,) * 6)),
        ("set", (0, MAP, (1,) * 7)),
        ("needs_sync", (0, MAP, 0, (1,) * 6)),
    ],
)
def test_out_of_range_input_is_refused(call, args):
    with pytest.raises(ReplicaVersionsError):
        getattr(ReplicaVersions(), call)(*args)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=30),
    st.integers(1, 6),
    st.data(),
)
def test_a_backup_that_sees_every_operation_in_order_stays_clean(backup_counts, index, data):
    """Primary and backup replay; the backup receives only operations that reach its index,
    possibly duplicated. In order it never goes dirty and ends equal from its index on;
    once one operation is lost, the next one that reaches it marks it dirty."""
    primary, backup = ReplicaVersions(), ReplicaVersions()
    lose = data.draw(st.integers(-1, len(backup_counts) - 1))
    lost_seen = False
    for k, backup_count in enumerate(backup_counts):
        carried = primary.increment(0, MAP, backup_count)
        if backup_count < index:
            continue  # this operation has no backup at our index
        if k == lose:
            lost_seen = True
            continue
        decision = backup.apply_backup(0, MAP, index, carried)
        if lost_seen:
            assert decision is BackupDecision.APPLY_DIRTY
            break
        assert decision is BackupDecision.APPLY
        assert backup.apply_backup(0, MAP, index, carried) is BackupDecision.STALE  # duplicate
    if not lost_seen:
        assert not backup.is_dirty(0, MAP)
        assert backup.get(0, MAP)[index - 1 :] == primary.get(0, MAP)[index - 1 :]
        assert not backup.needs_sync(0, MAP, index, primary.get(0, MAP))


def decide_by_the_table(versions: list[int], dirty: bool, index: int, vector: list[int]
                        ) -> tuple[BackupDecision, list[int], bool]:
    """The module docstring's decision table, written out on its own: the decision, the
    replica's versions and its dirty flag after one backup operation."""
    known, carried = versions[index - 1], vector[index - 1]
    if carried <= known:
        return (BackupDecision.STALE_DIRTY if dirty else BackupDecision.STALE), versions, dirty
    installed = [0] * (index - 1) + list(vector[index - 1:])  # a replica knows k - 1 and up
    if dirty:
        return BackupDecision.SYNC_AGAIN, installed, True
    if carried == known + 1:
        return BackupDecision.APPLY, installed, False
    return BackupDecision.APPLY_DIRTY, installed, True


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6),
                          st.lists(st.integers(0, 5), min_size=6, max_size=6)),
                min_size=1, max_size=12),
       st.lists(st.integers(0, 4), max_size=3))
def test_a_batch_decides_each_part_as_the_table_says(parts, dirty):
    """``apply_backups`` gives each part of a batch (one part a partition) the decision,
    versions and dirty flag of the decision table, and ``increment_many`` raises the first
    entries of each partition's vector as ``increment`` does."""
    parts = list({pid: (pid, index, vector) for pid, index, vector in parts}.values())
    rv = ReplicaVersions()
    assert rv.increment_many(range(5), MAP, 2) == [(1, 1, 0, 0, 0, 0)] * 5
    for pid in dirty:
        rv.mark_dirty(pid, MAP)
    state = {pid: ([1, 1, 0, 0, 0, 0], pid in dirty) for pid in range(5)}
    expected = []
    for pid, index, vector in parts:
        decision, versions, is_dirty = decide_by_the_table(*state[pid], index, vector)
        state[pid] = (versions, is_dirty)
        expected.append(decision)
    assert rv.apply_backups(MAP, *zip(*parts, strict=True)) == expected
    assert [list(rv.get(pid, MAP)) for pid in range(5)] == [state[pid][0] for pid in range(5)]
    assert [rv.is_dirty(pid, MAP) for pid in range(5)] == [state[pid][1] for pid in range(5)]
    assert rv.increment_many([3, 1, 4], OTHER, 3) == [(1, 1, 1, 0, 0, 0)] * 3
    assert rv.increment_many([3], OTHER, 3) == [rv.increment(1, OTHER, 3)] == [(2, 2, 2, 0, 0, 0)]


@pytest.mark.parametrize("bad", [(1, 0, 0, 0, 0), (1, -1, 0, 0, 0, 0), (1, True, 0, 0, 0, 0),
                                 (1, 0.5, 0, 0, 0, 0)])
def test_a_batch_with_one_malformed_vector_changes_nothing(bad):
    rv = ReplicaVersions()
    with pytest.raises(ReplicaVersionsError):
        rv.apply_backups(MAP, [0, 1, 2], [1, 1, 1], [(1, 0, 0, 0, 0, 0), bad, (1,) * 6])
    with pytest.raises(ReplicaVersionsError):
        rv.apply_backups(MAP, [0, 1], [1, 0], [(1, 0, 0, 0, 0, 0)] * 2)
    assert [rv.get(pid, MAP) for pid in range(3)] == [(0,) * 6] * 3


@pytest.mark.parametrize("bad", [0, 7, -1, True, 1.0, None])
def test_a_batch_with_one_malformed_replica_index_changes_nothing(bad):
    rv = ReplicaVersions()
    with pytest.raises(ReplicaVersionsError):
        rv.apply_backups(MAP, range(40), [1] * 23 + [bad] + [2] * 16, [(1,) * 6] * 40)
    assert [rv.get(pid, MAP) for pid in range(40)] == [(0,) * 6] * 40
    assert rv.apply_backups(MAP, [], [], []) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6),
                          st.lists(st.integers(0, 4), min_size=6, max_size=6)),
                min_size=1, max_size=8),
       st.lists(st.integers(0, 4), max_size=2), st.booleans())
def test_a_batch_in_sequence_is_taken_whole_as_apply_backups_takes_it(parts, dirty, known):
    """``apply_in_sequence`` installs a batch exactly when ``apply_backups`` would decide
    APPLY for every part, with the versions it would install; otherwise it changes nothing.
    The vectors come end to end, as a backup operation's packed parts carry them."""
    parts = list({pid: (pid, index, vector) for pid, index, vector in parts}.values())
    fast, slow = ReplicaVersions(), ReplicaVersions()
    for rv in (fast, slow):
        if known:  # partitions seen before (never seen, each is a first write to them)
            rv.increment_many(range(5), MAP, 3)
        for pid in dirty:
            rv.mark_dirty(pid, MAP)
    before = {pid: fast.get(pid, MAP) for pid in range(5)}
    pids, indexes, vectors = (list(column) for column in zip(*parts, strict=True))
    decisions = slow.apply_backups(MAP, pids, indexes, vectors)
    taken = fast.apply_in_sequence(MAP, pids, indexes, [v for vector in vectors for v in vector])
    assert taken == all(decision is BackupDecision.APPLY for decision in decisions)
    if taken:
        assert all(fast.get(pid, MAP) == slow.get(pid, MAP) for pid in range(5))
    else:
        assert all(fast.get(pid, MAP) == before[pid] for pid in range(5))
    assert all(fast.is_dirty(pid, MAP) == (pid in dirty) for pid in range(5))
