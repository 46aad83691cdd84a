"""The migration planner: seed 002 section 3.2.2's worked examples, the reference's rules,
cycles, prioritisation, and properties over random replica arrays."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.partition.planner import (
    MAX_REPLICA_COUNT,
    Migration,
    PlanningError,
    apply_migration,
    fix_cycle,
    is_cyclic,
    plan_migrations,
    prioritize_copies_and_shift_ups,
)


def row(text: str) -> list[str | None]:
    """'A.C' -> ['A', None, 'C']: one letter per replica index, '.' for an empty slot."""
    return [None if c == "." else c for c in text]


def steps(current: str, target: str) -> list[Migration]:
    return prioritize_copies_and_shift_ups(plan_migrations(row(current), row(target)))


def run(current: list, migrations: list[Migration]) -> list[tuple]:
    """Every state from ``current`` through each migration (apply_migration checks fit)."""
    states = [tuple(current) + (None,) * (MAX_REPLICA_COUNT - len(current))]
    for m in migrations:
        states.append(apply_migration(states[-1], m))
    return states


# -- seed 002 section 3.2.2, every worked example -------------------------------------------


def test_seed_example_move_owner():
    assert steps("ABC", "DBC") == [Migration("A", 0, -1, "D", -1, 0)]
    assert steps("ABC", "DBC")[0].kind == "MOVE"


def test_seed_example_copy_into_missing_backup():
    assert steps("A.C", "ADC") == [Migration(None, -1, -1, "D", -1, 1)]
    assert steps("A.C", "ADC")[0].kind == "COPY"


def test_seed_example_shift_down():
    # "SHIFT DOWN migrate index 0 from A to D and index 1 to A"
    assert steps("A.C", "DAC") == [Migration("A", 0, 1, "D", -1, 0)]
    assert steps("A.C", "DAC")[0].kind == "SHIFT_DOWN"


def test_seed_example_shift_ups_fill_a_hole_hot_first():
    # "SHIFT UP migrate B from 2 to 1", then "SHIFT UP migrate C from 3 to 2"
    assert steps("A.BC", "ABC.") == [
        Migration(None, -1, -1, "B", 2, 1),
        Migration(None, -1, -1, "C", 3, 2),
    ]
    assert {m.kind for m in steps("A.BC", "ABC.")} == {"SHIFT_UP"}


def test_seed_example_moves_from_the_cold_end():
    # B -> C at index 1 would leave A, C, NULL, D: first D -> E, then C -> D, then B -> C.
    planned = steps("ABCD", "ACDE")
    assert planned == [
        Migration("D", 3, -1, "E", -1, 3),
        Migration("C", 2, -1, "D", -1, 2),
        Migration("B", 1, -1, "C", -1, 1),
    ]
    for state in run(row("ABCD"), planned):
        assert sum(m is not None for m in state) == 4  # availability never drops


def test_seed_example_shift_up_at_colder_index_before_owner_move():
    # "SHIFT UP migrate D from 3 to 1", then "MOVE migrate index 0 from A to B"
    planned = steps("ABCD", "BDC.")
    assert planned == [Migration("B", 1, -1, "D", 3, 1), Migration("A", 0, -1, "B", -1, 0)]
    assert [m.kind for m in planned] == ["SHIFT_UP", "MOVE"]


# -- the reference's other rules (reference/planner.md section 2) ----------------------------


def test_removal_is_a_step_of_its_own():
    assert steps("ABC", "AB.") == [Migration("C", 2, -1, None, -1, -1)]
    assert steps("ABC", "AB.")[0].kind == "REMOVE"


def test_chain_shift_up_with_shift_down_together():
    # B comes up from 1 to 0 while A goes down from 0 into the empty slot 2, in one step.
    planned = steps("AB.", "B.A")
    assert planned == [Migration("A", 0, 2, "B", 1, 0)]
    assert planned[0].kind == "SHIFT_UP"
    assert planned[0].partition_version_increment == 3


def test_chain_shift_up_replacing_a_leaving_member():
    assert steps("AB", "B") == [Migration("A", 0, -1, "B", 1, 0)]


def test_chain_shift_up_whose_displaced_member_returns_by_move():
    # A must go to slot 2, which C still holds: A drops out, then comes back through a MOVE.
    assert steps("ABC", "B.A") == [
        Migration("A", 0, -1, "B", 1, 0),
        Migration("C", 2, -1, "A", -1, 2),
    ]


def test_chain_move_2_then_move():
    assert steps("AB", "BC") == [
        Migration("B", 1, -1, "C", -1, 1),
        Migration("A", 0, -1, "B", -1, 0),
    ]


def test_move_3_when_the_colder_target_slot_is_taken():
    assert steps("ABC", "DCA") == [
        Migration("A", 0, -1, "D", -1, 0),
        Migration("C", 2, -1, "A", -1, 2),
        Migration("B", 1, -1, "C", -1, 1),
    ]


def test_copy_to_owner_without_source_is_the_lost_partition_case():
    planned = plan_migrations([None] * 7, ["X", "Y"])
    assert planned == [Migration(None, -1, -1, "X", -1, 0), Migration(None, -1, -1, "Y", -1, 1)]


def test_partition_id_is_carried():
    assert {m.partition_id for m in plan_migrations(row("ABCD"), row("ACDE"), 17)} == {17}


def test_invalid_input_is_refused():
    with pytest.raises(ValueError):
        plan_migrations(row("AA"), row("AB"))
    with pytest.raises(ValueError):
        plan_migrations(row("AB"), row("BB"))
    with pytest.raises(ValueError):
        plan_migrations(row("ABCDEFGH"), row("A"))
    with pytest.raises(ValueError):
        plan_migrations("AB", row("AB"))


# -- Migration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "before", "kind", "increment"),
    [
        (("S", 1, -1, "D", -1, 1), "ZS", "MOVE", 1),
        ((None, -1, -1, "D", -1, 2), "ZY.", "COPY", 1),
        (("S", 0, 2, "D", -1, 0), "SY.", "SHIFT_DOWN", 2),
        ((None, -1, -1, "D", 3, 1), "Z.YD", "SHIFT_UP", 2),
        (("S", 1, -1, "D", 3, 1), "ZSYD", "SHIFT_UP", 2),
        (("S", 0, 2, "D", 1, 0), "SD.", "SHIFT_UP", 3),
        (("S", 2, -1, None, -1, -1), "ZYS", "REMOVE", 1),
    ],
)
def test_kind_and_version_increment_follow_the_fields(fields, before, kind, increment):
    m = Migration(*fields)
    assert m.kind == kind
    assert m.partition_version_increment == increment
    state = tuple(row(before)) + (None,) * (7 - len(before))
    after = apply_migration(state, m)
    assert sum(a != b for a, b in zip(state, after, strict=True)) == increment
    if m.destination is not None:
        assert after[m.destination_new_replica_index] == m.destination
    if m.source_new_replica_index > -1:
        assert after[m.source_new_replica_index] == m.source
    elif m.source is not None:
        assert m.source not in after


def test_migration_is_frozen_and_compares_by_value():
    m = Migration("A", 0, -1, "B", -1, 0, partition_id=3)
    assert m == Migration("A", 0, -1, "B", -1, 0, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.source = "C"  # type: ignore[misc]


def test_apply_migration_refuses_a_step_that_does_not_fit():
    with pytest.raises(PlanningError):
        apply_migration(row("AB"), Migration("X", 0, -1, "C", -1, 0))
    with pytest.raises(PlanningError):
        apply_migration(row("AB"), Migration(None, -1, -1, "C", 1, 0))
    with pytest.raises(PlanningError):
        apply_migration(row("AB"), Migration(None, -1, -1, "C", -1, -1))
    with pytest.raises(PlanningError):
        apply_migration(row("AB"), Migration("A", 0, 7, "C", -1, 0))


# -- cycles (seed 002 section 3.2.1) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "target"),
    [("AB", "BA"), ("ABC", "CAB"), ("ABCDE", "EBADC"), ("ABCDEFG", "EBADCGF")],
)
def test_cycles_are_detected_and_fixed_back_to_current(current, target):
    old, new = row(current), row(target)
    assert is_cyclic(old, new)
    fixed, fixed_target = fix_cycle(old, new)
    assert fixed
    assert fixed_target == old + [None] * (7 - len(old))
    assert (old, new) == (row(current), row(target))  # inputs untouched
    assert plan_migrations(old, new) == []


@pytest.mark.parametrize(("current", "target"), [("AB", "BC"), ("ABCDE", "FBADC"), ("AB", "AB")])
def test_chains_ending_at_a_leaving_member_are_not_cycles(current, target):
    assert not is_cyclic(row(current), row(target))
    assert fix_cycle(row(current), row(target)) == (False, row(target) + [None] * (7 - len(target)))


def test_fix_cycle_keeps_the_non_cyclic_part_of_the_target():
    # A and B swap (a cycle); C -> D at index 2 is an ordinary MOVE and stays in the target.
    fixed, target = fix_cycle(row("ABC"), row("BAD"))
    assert fixed
    assert target[:3] == ["A", "B", "D"]
    assert plan_migrations(row("ABC"), row("BAD")) == [Migration("C", 2, -1, "D", -1, 2)]


# -- prioritisation (seed 002 section 3.2.3) --------------------------------------------------


def test_copy_jumps_ahead_of_a_non_conflicting_owner_move():
    planned = plan_migrations(row("AB."), row("CBD"))
    assert [m.kind for m in planned] == ["MOVE", "COPY"]
    prioritised = prioritize_copies_and_shift_ups(planned)
    assert [m.kind for m in prioritised] == ["COPY", "MOVE"]
    assert all(a is b for a, b in zip(prioritised, reversed(planned), strict=True))
    assert [m.kind for m in planned] == ["MOVE", "COPY"]  # the input list is unchanged


def test_prioritisation_stops_at_conflicts_and_hotter_shift_downs():
    move_x = Migration("A", 0, -1, "X", -1, 0)
    copy_x = Migration(None, -1, -1, "X", -1, 3)  # shares X with move_x
    assert prioritize_copies_and_shift_ups([move_x, copy_x]) == [move_x, copy_x]
    move_from_y = Migration("Y", 1, -1, "B", -1, 1)
    copy_y = Migration(None, -1, -1, "Y", -1, 3)  # Y is move_from_y's source
    assert prioritize_copies_and_shift_ups([move_from_y, copy_y]) == [move_from_y, copy_y]
    copy_a = Migration(None, -1, -1, "P", -1, 2)
    copy_b = Migration(None, -1, -1, "Q", -1, 1)  # never passes another COPY
    assert prioritize_copies_and_shift_ups([copy_a, copy_b]) == [copy_a, copy_b]
    down_to_1 = Migration("S", 0, 1, "T", -1, 0)
    copy_3 = Migration(None, -1, -1, "U", -1, 3)  # S goes to 1, hotter than 3: stays behind
    assert prioritize_copies_and_shift_ups([down_to_1, copy_3]) == [down_to_1, copy_3]
    down_to_4 = Migration("S", 0, 4, "T", -1, 0)
    copy_2 = Migration(None, -1, -1, "U", -1, 2)  # S goes colder than 2: the COPY goes first
    assert prioritize_copies_and_shift_ups([down_to_4, copy_2]) == [copy_2, down_to_4]


def test_shift_up_passes_several_moves_but_not_the_copy_before_them():
    copy = Migration(None, -1, -1, "C", -1, 5)
    move_1 = Migration("A", 0, -1, "B", -1, 0)
    move_2 = Migration("D", 1, -1, "E", -1, 1)
    shift_up = Migration(None, -1, -1, "F", 4, 2)
    assert prioritize_copies_and_shift_ups([copy, move_1, move_2, shift_up]) == [
        copy,
        shift_up,
        move_1,
        move_2,
    ]


# -- properties over random replica arrays ----------------------------------------------------

MEMBERS = [f"m{k}" for k in range(10)]


@st.composite
def replica_arrays(draw: st.DrawFn) -> list[str | None]:
    """Up to 7 slots, distinct members, holes anywhere."""
    members = draw(st.permutations(MEMBERS))
    size = draw(st.integers(0, MAX_REPLICA_COUNT))
    holes = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    return [None if hole else m for m, hole in zip(members[:size], holes, strict=True)]


def contiguous(replicas: list[str | None]) -> list[str | None]:
    live = [m for m in replicas if m is not None]
    return live + [None] * (MAX_REPLICA_COUNT - len(live))


def live_count(state) -> int:
    return sum(m is not None for m in state)


def check_plan(current: list, target: list, migrations: list[Migration]) -> list[tuple]:
    states = run(current, migrations)
    _, fixed = fix_cycle(current, target)
    assert list(states[-1]) == fixed
    for state in states:
        present = [m for m in state if m is not None]
        assert len(present) == len(set(present))
    return states


@settings(max_examples=400, deadline=None)
@given(replica_arrays(), replica_arrays())
def test_plan_reaches_the_cycle_fixed_target_without_repeats(current, target):
    planned = plan_migrations(current, target)
    check_plan(current, target, planned)
    check_plan(current, target, prioritize_copies_and_shift_ups(planned))


@settings(max_examples=400, deadline=None)
@given(replica_arrays(), replica_arrays())
def test_a_step_lowers_live_replicas_only_by_emptying_a_slot_the_target_leaves_empty(
    current, target
):
    _, fixed = fix_cycle(current, target)
    states = run(current, prioritize_copies_and_shift_ups(plan_migrations(current, target)))
    for before, after in zip(states, states[1:], strict=False):
        if live_count(after) < live_count(before):
            assert live_count(after) == live_count(before) - 1
            emptied = [i for i in range(7) if before[i] is not None and after[i] is None]
            assert any(fixed[i] is None for i in emptied)


@settings(max_examples=400, deadline=None)
@given(replica_arrays(), replica_arrays())
def test_live_replicas_never_drop_below_current_or_target_without_holes(current, target):
    # With no hole before the last live slot (targets from assignment, and tables whose
    # members all live), no step takes availability below min(current, target).
    current, target = contiguous(current), contiguous(target)
    floor = min(live_count(current), live_count(fix_cycle(current, target)[1]))
    planned = prioritize_copies_and_shift_ups(plan_migrations(current, target))
    for state in run(current, planned):
        assert live_count(state) >= floor


def test_with_a_hole_the_reference_chain_walk_can_drop_below_the_target():
    # Reference behaviour, kept on purpose (see reference/planner.md section 2, chain walk,
    # "slot k is taken"): m2 drops out while m5 shifts up, then m2 is copied back.
    current = ["m0", "m1", "m2", "m3", None, "m5"]
    target = ["m0", "m2", "m5", "m3", "m1"]
    planned = plan_migrations(current, target)
    assert planned == [
        Migration("m2", 2, -1, "m5", 5, 2),
        Migration("m1", 1, 4, "m2", -1, 1),
    ]
    assert [live_count(state) for state in run(current, planned)] == [5, 4, 5]


@settings(max_examples=300, deadline=None)
@given(replica_arrays(), replica_arrays())
def test_cycle_fix_leaves_no_cycle_and_is_idempotent(current, target):
    fixed, new = fix_cycle(current, target)
    assert not is_cyclic(current, new)
    assert fix_cycle(current, new) == (False, new)
    assert fixed == is_cyclic(current, target)


@settings(max_examples=200, deadline=None)
@given(replica_arrays())
def test_planning_to_the_same_replicas_plans_nothing(current):
    assert plan_migrations(current, current) == []
