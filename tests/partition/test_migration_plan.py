"""Repartition planning and the parallel migration scheduler (seed 001 section 2.2)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.partition.assignment import assign
from grid.partition.migration_plan import (
    MigrationPlan,
    MigrationPlanError,
    plan_repartition,
    source_side,
)
from grid.partition.planner import Migration, apply_migration, fix_cycle
from grid.partition.table import PartitionTable

MEMBERS = [f"m{k}" for k in range(8)]


def table_of(rows: dict[int, list], count: int = 4) -> PartitionTable:
    table = PartitionTable(count)
    for pid, replicas in rows.items():
        table.set_replicas(pid, replicas)
    return table


# -- plan_repartition -------------------------------------------------------------------------


def test_a_first_assignment_is_lost_owners_then_copies():
    current = PartitionTable(5)
    target = assign(current, MEMBERS[:3], 1)
    plan = plan_repartition(current, target)
    assert plan.removals == ()
    assert [m.partition_id for m in plan.lost_owners] == list(range(5))
    assert all(m.kind == "COPY" and m.destination_new_replica_index == 0 for m in plan.lost_owners)
    assert [q[0].partition_id for q in plan.queues] == list(range(5))
    assert all(len(q) == 1 and q[0].kind == "COPY" for q in plan.queues)
    assert plan.migration_count == 5


def test_removals_are_split_off_and_queues_are_prioritised():
    current = table_of({0: ["a", "b", None], 1: ["a", "b", "c"], 3: ["a", "b"]})
    target = table_of({0: ["c", "b", "d"], 1: ["a", "b"], 3: ["a", "b"]})
    plan = plan_repartition(current, target)
    assert plan.removals == (Migration("c", 2, -1, None, -1, -1, 1),)
    assert plan.lost_owners == ()
    assert plan.queues == (
        (Migration(None, -1, -1, "d", -1, 2, 0), Migration("a", 0, -1, "c", -1, 0, 0)),
    )


def test_partition_counts_must_match():
    with pytest.raises(ValueError):
        plan_repartition(PartitionTable(3), PartitionTable(4))


# -- the scheduler ----------------------------------------------------------------------------


def test_one_migration_per_partition_in_queue_order():
    first = Migration(None, -1, -1, "d", -1, 2, 0)
    second = Migration("a", 0, -1, "c", -1, 0, 0)
    other = Migration("b", 1, -1, "e", -1, 1, 1)
    owners = {0: "a", 1: "x"}
    plan = MigrationPlan([[first, second], [other]], owners.get)
    assert plan.runnable() == [first, other]
    assert plan.start_runnable() == [first, other]
    assert plan.runnable() == []
    with pytest.raises(MigrationPlanError):
        plan.report_started(second)  # partition 0 is busy
    plan.report_completed(first)
    assert plan.runnable() == [second]
    plan.report_started(second)
    plan.report_completed(second)
    plan.report_completed(other)
    assert plan.is_done
    assert not plan.is_aborted


def test_members_count_as_destination_or_source_side():
    # Partition owners: "o" everywhere. A backup MOVE is sent by the owner, not the source.
    backup_moves = [[Migration(f"s{p}", 1, -1, f"d{p}", -1, 1, p)] for p in range(5)]
    plan = MigrationPlan(backup_moves, lambda pid: "o", max_parallel_migrations=3)
    started = plan.start_runnable()
    assert [m.partition_id for m in started] == [0, 1, 2]
    assert plan.load("o") == 3
    assert plan.load("s0") == 0  # the backup source sends nothing
    assert plan.load("d0") == 1
    plan.report_completed(started[1])
    assert [m.partition_id for m in plan.start_runnable()] == [3]


def test_an_owner_move_counts_its_source():
    m = Migration("a", 0, -1, "b", -1, 0, 0)
    assert source_side(m, "a") == "a"
    assert source_side(Migration("a", 1, -1, "b", -1, 1, 0), "o") == "o"
    assert source_side(Migration(None, -1, -1, "b", 2, 1, 0), "o") == "o"
    owner_moves = [[Migration("a", 0, -1, f"d{p}", -1, 0, p)] for p in range(4)]
    plan = MigrationPlan(owner_moves, lambda pid: "a", max_parallel_migrations=2)
    assert len(plan.start_runnable()) == 2
    assert plan.load("a") == 2


def test_a_destination_at_its_limit_holds_back_later_partitions_only():
    queues = [
        [Migration(None, -1, -1, "busy", -1, 1, 0)],
        [Migration(None, -1, -1, "busy", -1, 1, 1)],
        [Migration(None, -1, -1, "free", -1, 1, 2)],
    ]
    owners = {0: "o0", 1: "o1", 2: "o2"}
    plan = MigrationPlan(queues, owners.get, max_parallel_migrations=1)
    assert [m.partition_id for m in plan.runnable()] == [0, 2]


def test_a_failure_cancels_what_remains():
    queues = [
        [Migration(None, -1, -1, "d", -1, 1, 0), Migration("a", 0, -1, "e", -1, 0, 0)],
        [Migration(None, -1, -1, "f", -1, 1, 1)],
        [Migration(None, -1, -1, "g", -1, 1, 2)],
    ]
    plan = MigrationPlan(queues, lambda pid: "a", max_parallel_migrations=2)
    running = plan.start_runnable()
    assert [m.partition_id for m in running] == [0, 1]
    cancelled = plan.report_failed(running[0])
    assert cancelled == [queues[0][1], queues[2][0]]
    assert plan.is_aborted
    assert plan.runnable() == []
    assert not plan.is_done  # partition 1 is still running
    with pytest.raises(MigrationPlanError):
        plan.report_started(queues[2][0])
    plan.report_completed(running[1])
    assert plan.is_done
    assert plan.load("a") == 0


def test_misuse_is_refused():
    m = Migration(None, -1, -1, "d", -1, 1, 0)
    with pytest.raises(MigrationPlanError):
        MigrationPlan([[m, Migration(None, -1, -1, "e", -1, 2, 1)]], lambda pid: None)
    with pytest.raises(MigrationPlanError):
        MigrationPlan([[m], [m]], lambda pid: None)
    with pytest.raises(MigrationPlanError):
        MigrationPlan([[Migration("a", 1, -1, None, -1, -1, 0)]], lambda pid: None)
    with pytest.raises(MigrationPlanError):
        MigrationPlan([[m]], lambda pid: None, max_parallel_migrations=0)
    plan = MigrationPlan([[m]], lambda pid: None)
    with pytest.raises(MigrationPlanError):
        plan.report_completed(m)  # never started
    with pytest.raises(MigrationPlanError):
        plan.report_started(Migration(None, -1, -1, "x", -1, 1, 0))  # not the head


# -- a whole repartition, driven to the end ----------------------------------------------------


def execute(current: PartitionTable, target: PartitionTable, seed: int, limit: int) -> None:
    """Apply removals and lost owners, then run the plan with completions in random order,
    checking the limits at every step; the table must end at the cycle-fixed target."""
    rnd = random.Random(seed)
    start = [current.replicas(pid) for pid in range(current.partition_count)]
    plan = plan_repartition(current, target)
    table = current
    for m in plan.removals + plan.lost_owners:
        replicas = apply_migration(table.replicas(m.partition_id), m)
        table.set_replicas(m.partition_id, replicas)
    expected_order = {q[0].partition_id: list(q) for q in plan.queues}
    scheduler = MigrationPlan(plan.queues, table.owner, max_parallel_migrations=limit)
    running: list[Migration] = []
    for _ in range(10 * plan.migration_count + 10):
        running += scheduler.start_runnable()
        loads: dict = {}
        for m in running:
            for member in {m.destination, source_side(m, table.owner(m.partition_id))} - {None}:
                loads[member] = loads.get(member, 0) + 1
        assert max(loads.values(), default=0) <= limit
        assert len({m.partition_id for m in running}) == len(running)
        if not running:
            break
        m = running.pop(rnd.randrange(len(running)))
        assert expected_order[m.partition_id].pop(0) == m  # queue order per partition
        version = table.version(m.partition_id)
        table.set_replicas(m.partition_id, apply_migration(table.replicas(m.partition_id), m))
        assert table.version(m.partition_id) == version + m.partition_version_increment
        scheduler.report_completed(m)
    assert scheduler.is_done
    for pid in range(table.partition_count):
        _, fixed = fix_cycle(start[pid], target.replicas(pid))
        assert list(table.replicas(pid)) == fixed


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 60),
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(0, 3),
    st.integers(1, 4),
    st.integers(0, 2**16),
)
def test_a_repartition_runs_to_the_target(count, before, after, backup_count, limit, seed):
    current = assign(PartitionTable(count), MEMBERS[:before], backup_count)
    kept = MEMBERS[before - 1 : before - 1 + after]  # some leave, some join
    gone = current.members() - set(kept)
    for pid in range(count):
        replicas = current.replicas(pid)
        current.set_replicas(pid, [None if m in gone else m for m in replicas])
    target = assign(current, kept, backup_count)
    execute(current, target, seed, limit)


def test_an_abort_starts_nothing_more_and_keeps_tracking_what_runs():
    queues = [
        [Migration(None, -1, -1, "d", -1, 1, 0), Migration("a", 0, -1, "e", -1, 0, 0)],
        [Migration(None, -1, -1, "f", -1, 1, 1)],
    ]
    plan = MigrationPlan(queues, lambda pid: "a", max_parallel_migrations=1)
    [first] = plan.start_runnable()
    assert plan.abort() == [queues[0][1], queues[1][0]]
    assert plan.is_aborted and plan.runnable() == [] and not plan.is_done
    plan.report_completed(first)
    assert plan.is_done
