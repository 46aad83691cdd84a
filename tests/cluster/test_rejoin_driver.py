"""The migration driver's STABLE_CLUSTER reclaim with demotions in place (seed 003).

``MigrationDriver.start(..., target=...)`` first demotes backups that the target only puts
colder (no data moves) and publishes them in its first ``NewTable``; the plan then starts from
the demoted table. Without a target (the balanced target of ACTIVE) nothing changes.
"""

from __future__ import annotations

from grid.cluster.migrations import Commit, MigrationDriver, NewTable, Transfer
from grid.cluster.state import ClusterState
from grid.partition.migration_plan import plan_repartition
from grid.partition.planner import Migration
from grid.partition.table import PartitionTable

TIMEOUT = 100.0
STABLE = ClusterState.STABLE_CLUSTER
ACTIVE = ClusterState.ACTIVE
DATA = ["a", "b", "c"]
SHIFT_DOWN = Migration("a", 0, 1, "c", -1, 0, 0)


def pad(*members: str | None) -> tuple[str | None, ...]:
    return tuple(members) + (None,) * (7 - len(members))


def tables(current: list, target: list, others: int = 1) -> tuple[PartitionTable, PartitionTable]:
    """Partition 0 goes from ``current`` to ``target``; the ``others`` stay [a, b, c]."""
    table, goal = PartitionTable(1 + others), PartitionTable(1 + others)
    table.set_replicas(0, current)
    goal.set_replicas(0, target)
    for pid in range(1, 1 + others):
        table.set_replicas(pid, ["a", "b", "c"])
        goal.set_replicas(pid, ["a", "b", "c"])
    return table, goal


def test_a_reclaim_publishes_the_demotion_then_transfers_the_shift_down():
    # c left and came back: [a, b, None] -> [c, a, b], the seed's example.
    table, target = tables(["a", "b", None], ["c", "a", "b"])
    driver = MigrationDriver(2, 2, TIMEOUT)
    commands = driver.start(table, DATA, 0.0, STABLE, target)
    assert [type(c) for c in commands] == [NewTable, Transfer]
    demoted = commands[0].table
    assert demoted.replicas(0) == pad("a", None, "b")  # b: index 1 -> 2, no data moves
    assert demoted.version(0) == table.version(0) + 2
    assert demoted.replicas(1) == table.replicas(1) and demoted.version(1) == table.version(1)
    transfer = commands[1]
    assert transfer.migration == SHIFT_DOWN and transfer.migration.kind == "SHIFT_DOWN"
    assert transfer.sender == "a"
    assert transfer.initial_version == demoted.version(0)
    assert driver.active and driver.stats.planned == 1
    assert driver.events == [{"type": "migration_started", "planned": 1}]

    # The plan runs to the end: a keeps its data as a backup, c becomes the owner.
    assert driver.transferred(transfer.mid, True, demoted, 1.0) == \
        [Commit(transfer.mid, SHIFT_DOWN, demoted.version(0))]
    [published] = driver.committed(transfer.mid, True, demoted, 2.0)
    assert isinstance(published, NewTable)
    assert published.table.replicas(0) == pad("c", "a", "b")
    assert published.table.version(0) == demoted.version(0) + SHIFT_DOWN.partition_version_increment
    assert not driver.active and driver.take_ended()
    assert driver.stats.completed == 1 and driver.stats.failed == 0


def test_no_step_of_the_reclaim_drops_a_replica():
    table, target = tables(["a", "b", None], ["c", "a", "b"], others=3)
    for pid in range(1, 4):  # every partition is the seed's example
        table.set_replicas(pid, ["a", "b", None])
        target.set_replicas(pid, ["c", "a", "b"])
    driver = MigrationDriver(2, 10, TIMEOUT)
    commands = driver.start(table, DATA, 0.0, STABLE, target)
    assert isinstance(commands[0], NewTable)
    assert all(isinstance(c, Transfer) for c in commands[1:])
    migrations = [c.migration for c in commands[1:]]
    assert migrations == [Migration("a", 0, 1, "c", -1, 0, pid) for pid in range(4)]
    assert all(m.source_new_replica_index != -1 for m in migrations)


def test_the_demotion_comes_before_the_removals_in_one_new_table():
    # d is not in the target: removed at once, in the same NewTable as b's demotion.
    table, target = tables(["a", "b", None, "d"], ["c", "a", "b"])
    driver = MigrationDriver(2, 2, TIMEOUT)
    commands = driver.start(table, DATA, 0.0, STABLE, target)
    assert [type(c) for c in commands] == [NewTable, Transfer]
    assert commands[0].table.replicas(0) == pad("a", None, "b")
    assert commands[0].table.version(0) == table.version(0) + 3
    assert commands[1].migration == SHIFT_DOWN
    assert commands[1].initial_version == commands[0].table.version(0)


def test_a_reclaim_of_demotions_only_publishes_and_starts_no_plan():
    # The planner alone would REMOVE b at once and COPY it back to index 2.
    table, target = tables(["a", "b", None], ["a", None, "b"])
    [queue] = plan_repartition(table, target).queues
    assert queue == (Migration(None, -1, -1, "b", -1, 2, 0),)

    table, target = tables(["a", "b", None], ["a", None, "b"])
    driver = MigrationDriver(2, 2, TIMEOUT)
    commands = driver.start(table, DATA, 0.0, STABLE, target)
    assert [type(c) for c in commands] == [NewTable]
    assert commands[0].table.replicas(0) == pad("a", None, "b")
    assert commands[0].table.replicas(0) == target.replicas(0)
    assert not driver.active and driver.running == {}
    assert driver.events == [] and not driver.take_ended()
    # Once published, nothing differs any more.
    assert driver.start(commands[0].table, DATA, 1.0, STABLE, target) == []


def test_a_reclaim_without_a_demotion_is_planned_as_before():
    # The owner never moves: [a, None, None] -> [c, a] needs no demotion.
    table, target = tables(["a", None, None], ["c", "a"])
    driver = MigrationDriver(1, 2, TIMEOUT)
    commands = driver.start(table, DATA, 0.0, STABLE, target)
    [queue] = plan_repartition(table, target).queues
    assert [type(c) for c in commands] == [Transfer]
    assert commands[0].migration == queue[0] == SHIFT_DOWN


def test_without_a_target_nothing_changes():
    # The balanced target of assign is stood in for by the seed's target: the driver plans it
    # as the reference does (no demotion): MOVE a 0 -> -1 / c -1 -> 0 first.
    table, target = tables(["a", "b", None], ["c", "a", "b"])
    driver = MigrationDriver(2, 2, TIMEOUT)
    driver.target = lambda table, data_members: target  # type: ignore[method-assign]
    commands = driver.start(table, DATA, 0.0, ACTIVE)
    plan = plan_repartition(table, target)
    assert plan.removals == plan.lost_owners == ()
    assert [type(c) for c in commands] == [Transfer]
    assert commands[0].migration == plan.queues[0][0] == Migration("a", 0, -1, "c", -1, 0, 0)
    assert commands[0].initial_version == table.version(0)
    assert driver.stats.planned == 2
    # STABLE_CLUSTER forbids the balanced target's migrations.
    assert MigrationDriver(2, 2, TIMEOUT).start(table, DATA, 0.0, STABLE) == []
