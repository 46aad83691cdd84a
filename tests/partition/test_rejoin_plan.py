"""Demotions in place before planning a STABLE_CLUSTER reclaim (seed 003, "Migration planning").

A member that rejoins takes back its partitions: ``[A, B, None] -> [C, A, B]``. The reference
planner (kept as is) drops A's replica and copies it back; demoting B to index 2 first (no data
moves) leaves one SHIFT DOWN {src=A, 0->1, dst=C, -1->0}, and A keeps its data as a backup.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from grid.partition.migration_plan import demote_in_place, demote_table, plan_repartition
from grid.partition.planner import MAX_REPLICA_COUNT, Migration, apply_migration, plan_migrations
from grid.partition.table import PartitionTable, PartitionTableError

N = [None] * 4
CURRENT = ["A", "B", None, *N]
TARGET = ["C", "A", "B", *N]
MEMBERS = list("ABCDEFG")


def row(*members: str | None) -> list[str | None]:
    return list(members) + [None] * (MAX_REPLICA_COUNT - len(members))


def drops(migrations: Sequence[Migration]) -> set[object]:
    """Members a step removes from the partition (their replica is deleted)."""
    return {m.source for m in migrations
            if m.source is not None and m.source_new_replica_index == -1}


def colder_drops(current: Sequence, target: Sequence) -> int:
    """Planned steps whose source is dropped although the target keeps it at a colder index:
    its data are deleted, then copied back to it by a later step."""
    count = 0
    for m in plan_migrations(current, target):
        if m.source is None or m.source_new_replica_index != -1 or m.destination is None:
            continue
        if m.source in target and target.index(m.source) > m.source_current_replica_index:
            count += 1
    return count


# -- the seed's example ------------------------------------------------------------------------


def test_the_reference_plan_deletes_a_good_replica_and_copies_it_back():
    naive = plan_migrations(CURRENT, TARGET)
    assert naive == [Migration("A", 0, -1, "C", -1, 0), Migration("B", 1, 2, "A", -1, 1)]
    assert drops(naive) == {"A"}
    assert colder_drops(CURRENT, TARGET) == 1


def test_the_seeds_example_is_a_demotion_then_one_shift_down():
    current = list(CURRENT)
    demoted = demote_in_place(current, TARGET)
    assert demoted == row("A", None, "B")  # (1) B shifts from index 1 to 2: no data moves
    assert current == CURRENT, "the input is not changed"
    steps = plan_migrations(demoted, TARGET)
    assert steps == [Migration("A", 0, 1, "C", -1, 0)]  # (2) the shift down
    assert steps[0].kind == "SHIFT_DOWN"
    assert drops(steps) == set(), "no step deletes A's or B's replica"
    assert apply_migration(demoted, steps[0]) == tuple(TARGET)


def test_the_seeds_example_over_a_table():
    table, target = PartitionTable(3), PartitionTable(3)
    for pid in range(3):
        table.set_replicas(pid, CURRENT)
        target.set_replicas(pid, TARGET if pid != 1 else CURRENT)
    demoted = demote_table(table, target)
    assert demoted is not table and table.replicas(0) == tuple(row(*CURRENT))
    for pid in (0, 2):
        assert demoted.replicas(pid) == tuple(row("A", None, "B"))
        assert demoted.version(pid) == table.version(pid) + 2  # two slots changed
    assert demoted.replicas(1) == table.replicas(1) and demoted.version(1) == table.version(1)
    plan = plan_repartition(demoted, target)
    assert plan.removals == plan.lost_owners == ()
    assert plan.queues == ((Migration("A", 0, 1, "C", -1, 0, 0),),
                           (Migration("A", 0, 1, "C", -1, 0, 2),))


def test_demote_table_needs_the_same_partition_count():
    with pytest.raises(PartitionTableError):
        demote_table(PartitionTable(2), PartitionTable(3))


# -- single rows ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("current", "target", "expected"), [
    # A chain: C goes first (colder first), then B takes C's old slot, in one pass.
    (row("A", "B", "C"), row("D", "A", "B", "C"), row("A", None, "B", "C")),
    # The owner never moves, even when the target puts it colder into an empty slot.
    (row("A", None, None), row("C", None, "A"), row("A")),
    # A hotter target index is a promotion: data may be needed, the planner does it.
    (row("A", None, "B"), row("A", "B"), row("A", None, "B")),
    # The target slot is held by someone else: nothing moves.
    (row("A", "B", "D"), row("C", "A", "B"), row("A", "B", "D")),
    # A member not in the target stays where it is (its removal is the planner's).
    (row("A", "B"), row("C", "A"), row("A", "B")),
    # Shorter rows are padded.
    (["A", "B"], ["C", "A", "B"], row("A", None, "B")),
])
def test_demotion_of_single_rows(current, target, expected):
    assert demote_in_place(current, target) == expected


def test_a_row_longer_than_seven_slots_is_refused():
    with pytest.raises(PartitionTableError):
        demote_in_place(["A"] * 8, ["A"])


# -- properties over random rows -----------------------------------------------------------------


def random_row(rng: random.Random) -> list[str | None]:
    """An owner and backups with holes (members that left)."""
    slots = row(*rng.sample(MEMBERS, rng.randint(1, MAX_REPLICA_COUNT)))
    for i in range(1, MAX_REPLICA_COUNT):
        if rng.random() < 0.3:
            slots[i] = None
    return slots


def random_target(rng: random.Random, current: list[str | None]) -> list[str | None]:
    """A permutation of the current members, or a subset, or a mix with other members."""
    present = [m for m in current if m is not None]
    kind = rng.choice(["permutation", "subset", "any"])
    if kind == "permutation":
        members = rng.sample(present, len(present))
    elif kind == "subset":
        members = rng.sample(present, rng.randint(1, len(present)))
    else:
        members = rng.sample(MEMBERS, rng.randint(1, MAX_REPLICA_COUNT))
    slots = row(*members)
    rng.shuffle(slots)
    if slots[0] is None:  # a target always has an owner
        k = next(i for i, m in enumerate(slots) if m is not None)
        slots[0], slots[k] = slots[k], None
    return slots


def cases(seed: int, count: int) -> list[tuple[list, list]]:
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        current = random_row(rng)
        found.append((current, random_target(rng, current)))
    return found


def test_a_demoted_row_keeps_its_members_and_owner_and_moves_only_to_target_indexes():
    moved_any = 0
    for current, target in cases(2003, 4000):
        demoted = demote_in_place(current, target)
        assert len(demoted) == MAX_REPLICA_COUNT
        present = [m for m in demoted if m is not None]
        assert len(present) == len(set(present)), (current, target, demoted)
        assert set(present) == {m for m in current if m is not None}
        assert demoted[0] == current[0], "the owner never changes"
        for i, member in enumerate(demoted):
            if member is not None and current.index(member) != i:
                moved_any += 1
                assert i == target.index(member) > current.index(member) >= 1
        # A fixed point: no backup is left that could still be demoted.
        assert demote_in_place(demoted, target) == demoted
    assert moved_any > 100, "the random cases hardly exercise a demotion"


def test_demoting_first_never_drops_more_replicas_the_target_keeps_colder():
    naive = ours = 0
    for current, target in cases(3003, 4000):
        before = colder_drops(current, target)
        after = colder_drops(demote_in_place(current, target), target)
        assert after <= before, (current, target)
        naive += before
        ours += after
    assert ours < naive, (ours, naive)


def test_a_reclaim_never_drops_a_replica_the_target_keeps_colder():
    # The shape of a STABLE_CLUSTER reclaim: some members of the stable row left, the others
    # were promoted (shifted up); the leavers come back and the stable row is the target.
    rng = random.Random(4003)
    naive = 0
    for _ in range(3000):
        stable = rng.sample(MEMBERS, rng.randint(2, MAX_REPLICA_COUNT))
        gone = set(rng.sample(stable, rng.randint(1, len(stable) - 1)))
        current = row(*[m for m in stable if m not in gone])
        target = row(*stable)
        naive += colder_drops(current, target)
        demoted = demote_in_place(current, target)
        assert colder_drops(demoted, target) == 0, (current, demoted, target)
        keep = {m for m in current if m is not None}
        assert not drops(plan_migrations(demoted, target)) & keep, (current, target)
    assert naive > 0, "the naive plan drops good replicas in some reclaims"
