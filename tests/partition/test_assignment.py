"""Deterministic target assignment (issue section 3, seed 003)."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.partition.assignment import BACKUP_PLACEMENTS, assign, is_balanced, replica_count_for
from grid.partition.planner import apply_migration, is_cyclic, plan_migrations
from grid.partition.table import MAX_REPLICA_COUNT, PartitionTable, PartitionTableError

ROOT = Path(__file__).resolve().parents[2]
POOL = [f"9f3c{k:02d}aa-uuid" for k in range(14)]


def counts_at(table: PartitionTable, index: int, members: list[str]) -> list[int]:
    found = Counter(table.replicas(pid)[index] for pid in range(table.partition_count))
    return [found.get(m, 0) for m in members]


def spread(values: list[int]) -> int:
    return max(values) - min(values)


def check_target(table: PartitionTable, members: list[str], backup_count: int) -> None:
    """Invariants every target meets, whatever the input."""
    replica_count = replica_count_for(len(members), backup_count)
    for pid in range(table.partition_count):
        replicas = table.replicas(pid)
        assert all(m in members for m in replicas[:replica_count]), (pid, replicas)
        assert all(m is None for m in replicas[replica_count:]), (pid, replicas)
        assert len(set(replicas[:replica_count])) == replica_count, (pid, replicas)


def owner_safety_holds(before: PartitionTable, after: PartitionTable, members: list[str]) -> None:
    """A partition whose owner is gone but which has live replicas gets one of them as owner."""
    for pid in range(before.partition_count):
        replicas = before.replicas(pid)
        live = [m for m in replicas if m in members]
        if live and replicas[0] not in members:
            assert after.owner(pid) in live, (pid, replicas, after.replicas(pid))


def owner_balance_possible(before: PartitionTable, members: list[str]) -> bool:
    """Brute force: can owners be balanced while each ownerless partition with live replicas
    gets one of them? (Capacitated matching by augmenting paths, for every choice of which
    members get the extra partition.)"""
    count = before.partition_count
    base, extra = divmod(count, len(members))
    allowed = []
    for pid in range(count):
        replicas = before.replicas(pid)
        live = [m for m in replicas if m in members]
        allowed.append(live if live and replicas[0] not in members else members)
    for plus in itertools.combinations(members, extra):
        capacity = {m: base + (m in plus) for m in members}
        held: dict[str, list[int]] = {m: [] for m in members}
        if all(_place(pid, set(), allowed, capacity, held) for pid in range(count)):
            return True
    return False


def _place(pid: int, seen: set, allowed: list, capacity: dict, held: dict) -> bool:
    """Kuhn's augmenting path: give ``pid`` an owner, moving others if they can move."""
    for m in allowed[pid]:
        if m in seen:
            continue
        seen.add(m)
        if len(held[m]) < capacity[m]:
            held[m].append(pid)
            return True
        for other in list(held[m]):
            if _place(other, seen, allowed, capacity, held):
                held[m].remove(other)
                held[m].append(pid)
                return True
    return False


def fresh(members: list[str], backup_count: int, count: int = 271) -> PartitionTable:
    return assign(PartitionTable(count), members, backup_count)


def without(table: PartitionTable, gone: set[str]) -> PartitionTable:
    """The master's repair step: slots of members that left become empty (seed 002 1.1)."""
    repaired = table.copy()
    for pid in range(table.partition_count):
        replicas = table.replicas(pid)
        if gone & set(replicas):
            repaired.set_replicas(pid, [None if m in gone else m for m in replicas])
    return repaired


# -- initial assignment -----------------------------------------------------------------------


@pytest.mark.parametrize("backup_count", [0, 1, 2, 6])
def test_initial_assignment_of_three_members_is_balanced(backup_count):
    members = POOL[:3]
    target = fresh(members, backup_count)
    check_target(target, members, backup_count)
    replica_count = replica_count_for(3, backup_count)
    assert replica_count == min(3, backup_count + 1)
    for index in range(replica_count):
        assert spread(counts_at(target, index, members)) <= 1
    assert target.is_assigned()
    assert is_balanced(target, members, backup_count)


@pytest.mark.parametrize(("count", "member_count"), [(1, 3), (5, 7), (13, 10), (20000, 10)])
def test_initial_assignment_for_odd_sizes(count, member_count):
    members = POOL[:member_count]
    target = fresh(members, 2, count)
    check_target(target, members, 2)
    for index in range(3):
        assert spread(counts_at(target, index, members)) <= 1


def test_backups_of_one_owner_are_spread_over_the_other_members():
    members = POOL[:4]
    target = fresh(members, 1)
    for owner in members:
        backups = Counter(
            target.replicas(pid)[1] for pid in range(271) if target.owner(pid) == owner
        )
        assert spread([backups[m] for m in members if m != owner]) <= 2


@pytest.mark.parametrize("backup_count", [1, 2])
@pytest.mark.parametrize("member_count", [2, 3, 4, 5, 7])
def test_paired_backups_follow_their_owner_in_the_ring(member_count, backup_count):
    """With the "paired" placement a new cluster's backups form a ring: the backup at index
    k of a partition is the member k places after its owner in the members sorted, for
    every partition, so that a batch write sends each owner's part to one member per backup
    index; the target is as balanced as the spread one."""
    members = POOL[:member_count]
    target = assign(PartitionTable(271), members, backup_count, "paired")
    check_target(target, members, backup_count)
    replica_count = replica_count_for(member_count, backup_count)
    for index in range(replica_count):
        assert spread(counts_at(target, index, members)) <= 1
    if replica_count == member_count:
        # Every member holds every partition: pairing would save no message, and a loss
        # would leave owners unbalanced for good; the spread target is kept.
        assert [target.replicas(p) for p in range(271)] == \
            [fresh(members, backup_count).replicas(p) for p in range(271)]
        return
    assert partners_everywhere(target, members)
    spread_target = fresh(members, backup_count)
    owner = members[0]
    assert len({spread_target.replicas(pid)[1] for pid in range(271)
                if spread_target.owner(pid) == owner}) == member_count - 1


def test_paired_backups_of_a_member_that_left_are_taken_over_by_one_member():
    """The price of pairing: the partitions of a member that leaves are all promoted on its
    one backup, which owns twice its share until the target evens the owners out again."""
    members = POOL[:3]
    table = assign(PartitionTable(271), members, 1, "paired")
    repaired = without(table, {members[0]})
    takers = Counter(repaired.replicas(pid)[1] for pid in range(271)
                     if table.owner(pid) == members[0])
    assert set(takers) == {members[1]}
    target = assign(repaired, members[1:], 1, "paired")
    assert spread(counts_at(target, 0, members[1:])) <= 1
    owner_safety_holds(repaired, target, members[1:])


def partners_everywhere(table: PartitionTable, members: list[str]) -> bool:
    """Whether every backup of every partition is on its owner's partner (the member as
    many places after the owner in the ring, ``members`` sorted, as the backup's index)."""
    ring = sorted(members)
    return all(row[index] == ring[(ring.index(row[0]) + index) % len(ring)]
               for row in map(table.replicas, range(table.partition_count))
               for index in range(1, len(row)) if row[index] is not None)


@pytest.mark.parametrize(("member_count", "backup_count"), [(3, 1), (4, 1), (4, 2), (6, 2)])
def test_paired_backups_are_paired_again_after_members_leave_and_join(member_count,
                                                                     backup_count):
    """Membership changes fill free backup slots with whoever has room; the paired target
    puts every backup back on its owner's partner once the owners are balanced (a backup
    copy per partition moved), so that batch writes keep their one backup per owner."""
    members = POOL[:member_count]
    table = assign(PartitionTable(271), members, backup_count, "paired")
    assert partners_everywhere(table, members)
    staying = members[1:]
    table = assign(without(table, {members[0]}), staying, backup_count, "paired")
    check_target(table, staying, backup_count)
    if replica_count_for(len(staying), backup_count) < len(staying):
        assert partners_everywhere(table, staying)
    grown = [*staying, POOL[member_count]]
    table = assign(table, grown, backup_count, "paired")
    check_target(table, grown, backup_count)
    assert partners_everywhere(table, grown)
    for index in range(replica_count_for(len(grown), backup_count)):
        assert spread(counts_at(table, index, grown)) <= 1


@pytest.mark.parametrize("backup_count", [1, 2])
def test_paired_backups_stay_where_they_are_whatever_order_the_members_join_in(backup_count):
    """A cluster restarted from its files (hot restart) lists its members in the order they
    join again, which may differ: the ring is of the members sorted, so nothing moves."""
    members = POOL[:5]
    table = assign(PartitionTable(271), members, backup_count, "paired")
    for order in (members[::-1], members[2:] + members[:2]):
        again = assign(table, order, backup_count, "paired")
        assert [again.replicas(p) for p in range(271)] == [table.replicas(p) for p in range(271)]


def test_an_unknown_placement_is_refused():
    with pytest.raises(PartitionTableError, match="placement"):
        assign(PartitionTable(5), ["a"], 1, "clustered")


def test_no_members_gives_an_empty_target():
    table = fresh(POOL[:2], 1)
    target = assign(table, [], 1)
    assert all(target.replicas(pid) == (None,) * 7 for pid in range(271))


def test_invalid_arguments_are_refused():
    table = PartitionTable(5)
    for members, backup_count in [
        (["a", "a"], 1),
        (["a", ""], 1),
        ([1], 1),
        ("ab", 1),
        (["a"], -1),
        (["a"], True),
    ]:
        with pytest.raises(PartitionTableError):
            assign(table, members, backup_count)  # type: ignore[arg-type]


def test_input_table_is_not_changed_and_versions_count_the_changes():
    table = fresh(POOL[:3], 1)
    before = table.copy()
    target = assign(table, POOL[:4], 1)
    assert table == before
    for pid in range(271):
        changed = sum(
            a != b for a, b in zip(table.replicas(pid), target.replicas(pid), strict=True)
        )
        assert target.version(pid) == table.version(pid) + changed


# -- determinism ------------------------------------------------------------------------------

DIGEST_SCRIPT = """
import json, sys
from grid.partition.table import PartitionTable
from grid.partition.assignment import assign
members = json.loads(sys.argv[1])
table = assign(PartitionTable(271), members[:3], 1)
table = assign(table, members, 2)
print(json.dumps(table.to_wire()))
"""


def test_assignment_is_the_same_in_every_process():
    members = POOL[:5]
    results = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", DIGEST_SCRIPT, json.dumps(members)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        results.append(json.loads(out.stdout))
    here = assign(assign(PartitionTable(271), members[:3], 1), members, 2).to_wire()
    assert results[0] == results[1] == here


def test_assignment_is_a_pure_function_of_its_inputs():
    table = without(fresh(POOL[:6], 2), {POOL[2]})
    members = [m for m in POOL[:7] if m != POOL[2]]
    assert assign(table, members, 2) == assign(table.copy(), list(members), 2)


# -- membership changes -----------------------------------------------------------------------


def test_adding_a_fourth_member_moves_few_owners():
    members = POOL[:3]
    table = fresh(members, 1)
    target = assign(table, POOL[:4], 1)
    check_target(target, POOL[:4], 1)
    moved = [pid for pid in range(271) if table.owner(pid) != target.owner(pid)]
    minimum = math.ceil(271 / 4)  # 68: what the new member may need at most
    assert len(moved) <= math.floor(minimum * 1.1)
    assert len(moved) >= 271 // 4  # the newcomer got its share
    assert all(target.owner(pid) == POOL[3] for pid in moved)  # only the newcomer gained
    for index in range(2):
        assert spread(counts_at(target, index, POOL[:4])) <= 1
    assert not any(is_cyclic(table.replicas(p), target.replicas(p)) for p in range(271))


@pytest.mark.parametrize("backup_count", [1, 2])
def test_removing_a_member_moves_what_it_held_plus_what_balance_needs(backup_count):
    members = POOL[:4]
    gone = POOL[3]
    table = fresh(members, backup_count)
    survivors = members[:3]
    target = assign(without(table, {gone}), survivors, backup_count)
    check_target(target, survivors, backup_count)
    for index in range(backup_count + 1):
        assert spread(counts_at(target, index, survivors)) <= 1
    owned = [pid for pid in range(271) if table.owner(pid) == gone]
    # Seed 002 1.1: the first backup takes over; balance may then need some owners elsewhere.
    promoted = Counter(table.replicas(pid)[1] for pid in owned)
    quota = math.ceil(271 / 3)
    balance_needs = sum(max(0, table.replica_counts(m)[0] + promoted[m] - quota) for m in survivors)
    other_owner_changes = sum(
        table.owner(pid) != target.owner(pid) for pid in range(271) if pid not in owned
    )
    assert other_owner_changes <= balance_needs
    takeovers = sum(target.owner(pid) == table.replicas(pid)[1] for pid in owned)
    assert takeovers >= len(owned) - balance_needs
    untouched = [pid for pid in range(271) if gone not in table.replicas(pid)]
    backup_changes = sum(
        table.replicas(pid)[i] != target.replicas(pid)[i]
        for pid in untouched
        for i in range(1, MAX_REPLICA_COUNT)
    )
    assert backup_changes <= balance_needs


def test_lite_members_get_nothing():
    data_members = POOL[:3]
    lite = POOL[3]
    table = fresh(POOL[:4], 1)  # the lite member was a data member before: it must go
    target = assign(table, data_members, 1)
    assert lite not in target.members()
    assert target.members() == set(data_members)
    assert assign(PartitionTable(271), data_members, 1).members() == set(data_members)


def test_a_first_backup_takes_over_a_lost_owner():
    table = PartitionTable(3)
    table.set_replicas(0, [None, POOL[1], POOL[2]])
    table.set_replicas(1, [POOL[5], POOL[2], POOL[0]])  # POOL[5] left
    table.set_replicas(2, [POOL[0], POOL[1], POOL[2]])
    target = assign(table, POOL[:3], 2)
    assert target.owner(0) in {POOL[1], POOL[2]}
    assert target.owner(1) in {POOL[2], POOL[0]}
    owner_safety_holds(table, target, POOL[:3])


def test_owner_safety_wins_over_balance_when_they_conflict():
    # a, b, c die together; d is the only live replica of every partition they owned.
    members = POOL[:5]
    table = PartitionTable(10)
    for pid in range(10):
        owner = members[pid % 5]
        replicas = [owner, members[3]] if owner != members[3] else [owner, members[4]]
        table.set_replicas(pid, replicas)
    repaired = without(table, set(members[:3]))
    survivors = members[3:]
    target = assign(repaired, survivors, 1)
    owner_safety_holds(repaired, target, survivors)
    assert not owner_balance_possible(repaired, survivors)
    assert spread(counts_at(target, 0, survivors)) > 1
    assert not is_balanced(target, survivors, 1)


def test_backups_fall_back_to_a_rotation_when_the_greedy_pass_cannot_balance(monkeypatch):
    # Fewer partitions than members, and every member in every partition: the incremental
    # pass paints itself into a corner here, and the rotation fallback must take over.
    from grid.partition import assignment

    calls = []
    rotate = assignment._Assigner.rotate_backups
    monkeypatch.setattr(
        assignment._Assigner, "rotate_backups", lambda self: calls.append(1) or rotate(self)
    )
    table = PartitionTable(3)
    table.set_replicas(2, [None, None, "f", None, None, "c"])
    members = ["a", "d", "h", "f", "c"]
    target = assign(table, members, 6)
    assert calls == [1]
    check_target(target, members, 6)
    owner_safety_holds(table, target, members)
    for index in range(5):
        assert spread(counts_at(target, index, members)) <= 1


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 9),
    st.integers(0, 7),
    st.sampled_from(BACKUP_PLACEMENTS),
)
def test_a_balanced_target_is_a_fixed_point(count, member_count, backup_count, placement):
    members = POOL[:member_count]
    target = assign(PartitionTable(count), members, backup_count, placement)
    again = assign(target, members, backup_count, placement)
    assert [again.replicas(p) for p in range(count)] == [target.replicas(p) for p in range(count)]


# -- random histories: membership changes and interrupted migrations ---------------------------


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, int, list[tuple[list[str], float]]]:
    """A partition count, a backup count and a list of (member list, migrated fraction)."""
    count = draw(st.sampled_from([3, 7, 13, 40, 271]))
    backup_count = draw(st.integers(0, 6))
    steps = []
    members: list[str] = []
    unused = list(POOL)
    for _ in range(draw(st.integers(1, 5))):
        leave = draw(st.lists(st.sampled_from(members), unique=True)) if members else []
        members = [m for m in members if m not in leave]
        join = draw(st.integers(0 if members else 1, 3))
        members += unused[:join]
        unused = unused[join:]
        if not members:
            members, unused = unused[:1], unused[1:]
        fraction = draw(st.sampled_from([1.0, 1.0, 0.0, 0.5]))
        steps.append((list(members), fraction))
    return count, backup_count, steps


def migrate(table: PartitionTable, target: PartitionTable, fraction: float) -> None:
    """Run each partition's planned steps, all of them or the first part (an interruption)."""
    for pid in range(table.partition_count):
        planned = plan_migrations(table.replicas(pid), target.replicas(pid), pid)
        replicas = table.replicas(pid)
        for m in planned[: math.ceil(len(planned) * fraction)]:
            replicas = apply_migration(replicas, m)
        table.set_replicas(pid, replicas)


@settings(max_examples=60, deadline=None)
@given(histories(), st.sampled_from(BACKUP_PLACEMENTS))
def test_targets_along_random_histories(history, placement):
    count, backup_count, steps = history
    table = PartitionTable(count)
    for members, fraction in steps:
        repaired = without(table, table.members() - set(members))
        target = assign(repaired, members, backup_count, placement)
        check_target(target, members, backup_count)
        owner_safety_holds(repaired, target, members)
        replica_count = replica_count_for(len(members), backup_count)
        owners_balanced = spread(counts_at(target, 0, members)) <= 1
        if owners_balanced:
            for index in range(1, replica_count):
                assert spread(counts_at(target, index, members)) <= 1
        elif count <= 40:
            assert not owner_balance_possible(repaired, members)
        table = repaired
        migrate(table, target, fraction)


@st.composite
def any_tables(draw: st.DrawFn) -> PartitionTable:
    """Any valid table: members of the pool, holes anywhere, no member twice in a partition."""
    count = draw(st.integers(1, 14))
    table = PartitionTable(count)
    pool = POOL[: draw(st.integers(1, 10))]
    for pid in range(count):
        size = draw(st.integers(0, MAX_REPLICA_COUNT))
        replicas = draw(st.permutations(pool))[:size]
        holes = draw(st.lists(st.booleans(), min_size=len(replicas), max_size=len(replicas)))
        table.set_replicas(pid, [None if h else m for m, h in zip(replicas, holes, strict=True)])
    return table


@settings(max_examples=150, deadline=None)
@given(
    any_tables(),
    st.lists(st.sampled_from(POOL), min_size=1, max_size=9, unique=True),
    st.integers(0, 8),
    st.sampled_from(BACKUP_PLACEMENTS),
)
def test_targets_for_any_table(table, members, backup_count, placement):
    target = assign(table, members, backup_count, placement)
    check_target(target, members, backup_count)
    owner_safety_holds(table, target, members)
    if spread(counts_at(target, 0, members)) <= 1:
        for index in range(1, replica_count_for(len(members), backup_count)):
            assert spread(counts_at(target, index, members)) <= 1
    else:
        assert not owner_balance_possible(table, members)
