"""The master's sans-IO migration driver (grid/cluster/migrations.py).

Unit tests of every entry point (``start``, ``transferred``, ``committed``,
``members_changed``, ``tick``, the wire form of a migration), then whole plans driven to the
end by a small shell that answers the driver's requests the way workers/cluster_service.py
does: it adopts every ``NewTable`` through ``PartitionTable.apply`` (newer versions win),
commits locally when the master itself is the destination, and checks on the way that
versions only rise, that no partition loses live replicas below what the planner promises,
and that no member takes part in more than ``max_parallel`` running migrations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.cluster.migrations import (
    Commit,
    MigrationDriver,
    NewTable,
    Transfer,
    migration_from_wire,
    migration_to_wire,
)
from grid.cluster.repair import initial_assignment, remove_members
from grid.cluster.state import ClusterState
from grid.partition.assignment import assign, is_balanced, replica_count_for
from grid.partition.migration_plan import plan_repartition, source_side
from grid.partition.planner import Migration, apply_migration, is_cyclic
from grid.partition.table import PartitionTable

MEMBERS = [f"m{k}" for k in range(8)]
TIMEOUT = 100.0

ACTIVE = ClusterState.ACTIVE


# -- helpers ------------------------------------------------------------------------------------


def live(row: Sequence[str | None]) -> int:
    return sum(member is not None for member in row)


def assigned(members: int, partitions: int, backups: int) -> PartitionTable:
    """A balanced table over the first ``members`` members, as a forming cluster has it."""
    return initial_assignment(PartitionTable(partitions), MEMBERS[:members], backups)


def scenario(kind: str, members: int, partitions: int, backups: int,
             ) -> tuple[PartitionTable, list[str]]:
    """The master's table and the data members after a change of an assigned cluster:
    ``remove`` (m1 died, remove_members ran), ``join`` (a new member holds nothing yet),
    ``leave`` (m1 leaves gracefully: still in the table, no longer a data member)."""
    table = assigned(members, partitions, backups)
    staying = [m for m in MEMBERS[:members] if m != "m1"]
    if kind == "remove":
        return remove_members(table, {"m1"}, staying), staying
    if kind == "join":
        return table, MEMBERS[: members + 1]
    assert kind == "leave"
    return table, staying


def loads(migrations: Sequence[tuple[Migration, str | None]]) -> Counter:
    """Running migrations per member, counting the data sender and the destination."""
    count: Counter = Counter()
    for m, sender in migrations:
        count.update({x for x in (sender, m.destination) if x is not None})
    return count


def transfers(commands: Sequence[object]) -> list[Transfer]:
    return [c for c in commands if isinstance(c, Transfer)]


def tables(commands: Sequence[object]) -> list[PartitionTable]:
    return [c.table for c in commands if isinstance(c, NewTable)]


def started(kind: str = "join", members: int = 3, partitions: int = 13, backups: int = 1,
            max_parallel: int = 2, now: float = 0.0,
            ) -> tuple[MigrationDriver, PartitionTable, list[Transfer]]:
    """A driver that started a plan; returns it, the master's table and the Transfers."""
    table, data = scenario(kind, members, partitions, backups)
    driver = MigrationDriver(backups, max_parallel, TIMEOUT)
    commands = driver.start(table, data, now, ACTIVE)
    for new in tables(commands):
        table = new
    sent = transfers(commands)
    assert sent, "the scenario needs migrations"
    return driver, table, sent


# -- start ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backups", [0, 1, 2])
def test_start_with_the_target_table_returns_nothing_and_stays_inactive(backups):
    table = assigned(4, 31, backups)
    driver = MigrationDriver(backups, 2, TIMEOUT)
    assert driver.start(table, MEMBERS[:4], 0.0, ACTIVE) == []
    assert not driver.active
    assert driver.running == {}
    assert not driver.take_ended()


def test_start_without_data_members_returns_nothing():
    driver = MigrationDriver(1, 2, TIMEOUT)
    assert driver.start(assigned(3, 7, 1), [], 0.0, ACTIVE) == []
    assert not driver.active


def test_start_while_a_plan_runs_returns_nothing():
    driver, table, _ = started()
    assert driver.start(table, MEMBERS[:4], 1.0, ACTIVE) == []
    assert driver.active


def test_start_after_a_removal_assigns_lost_owners_at_once_then_transfers():
    # Every replica of m1's partitions died with it (no backups), and no data member was
    # known to take them: the partitions have no owner until the driver plans.
    table = assigned(3, 13, 0)
    lost = [pid for pid in range(13) if table.owner(pid) == "m1"]
    assert lost
    table = remove_members(table, {"m1"}, [])
    assert all(table.owner(pid) is None for pid in lost)
    data = ["m0", "m2"]
    driver = MigrationDriver(0, 2, TIMEOUT)
    commands = driver.start(table, data, 0.0, ACTIVE)
    assert isinstance(commands[0], NewTable)
    new = commands[0].table
    target = assign(table, data, 0)
    for pid in range(13):
        if pid in lost:
            assert new.replicas(pid) == target.replicas(pid)
            assert new.version(pid) == table.version(pid) + 1
        else:
            assert new.replicas(pid) == table.replicas(pid)
            assert new.version(pid) == table.version(pid)
    assert all(isinstance(c, Transfer) for c in commands[1:])
    for t in transfers(commands):
        assert t.initial_version == new.version(t.migration.partition_id)


def test_start_after_a_leave_that_lowers_the_replica_count_removes_slots_at_once():
    # Three members, two backups; m1 leaves: two replicas per partition remain wanted.
    table, data = scenario("leave", 3, 13, 2)
    driver = MigrationDriver(2, 1, TIMEOUT)
    commands = driver.start(table, data, 0.0, ACTIVE)
    plan = plan_repartition(table, assign(table, data, 2))
    assert plan.removals
    expected = table.copy()
    for step in (*plan.removals, *plan.lost_owners):
        pid = step.partition_id
        expected.set_replicas(pid, apply_migration(expected.replicas(pid), step))
    assert commands[0] == NewTable(expected)
    assert all(isinstance(c, Transfer) for c in commands[1:])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(kind=st.sampled_from(["remove", "join", "leave"]), members=st.integers(3, 6),
       partitions=st.integers(7, 61), backups=st.integers(0, 2),
       max_parallel=st.integers(1, 3))
def test_start_applies_removals_and_lost_owners_only_and_launches_bounded_transfers(
        kind, members, partitions, backups, max_parallel):
    table, data = scenario(kind, members, partitions, backups)
    driver = MigrationDriver(backups, max_parallel, TIMEOUT)
    commands = driver.start(table, data, 5.0, ACTIVE)
    target = assign(table, data, backups)
    if all(target.replicas(p) == table.replicas(p) for p in range(partitions)):
        assert commands == [] and not driver.active
        return
    plan = plan_repartition(table, target)
    expected = table.copy()
    for step in (*plan.removals, *plan.lost_owners):
        pid = step.partition_id
        expected.set_replicas(pid, apply_migration(expected.replicas(pid), step))
    if expected != table:
        assert commands[0] == NewTable(expected)
        commands = commands[1:]
    assert all(isinstance(c, Transfer) for c in commands)
    # One per partition, the head of its queue, bounded per member, from the right sender.
    heads = {queue[0].partition_id: queue[0] for queue in plan.queues}
    pids = [t.migration.partition_id for t in commands]
    assert len(pids) == len(set(pids))
    for t in commands:
        pid = t.migration.partition_id
        assert t.migration == heads[pid]
        assert t.sender == source_side(t.migration, expected.owner(pid))
        assert t.initial_version == expected.version(pid)
    assert max(loads([(t.migration, t.sender) for t in commands]).values(), default=0) \
        <= max_parallel
    assert len({t.mid for t in commands}) == len(commands)
    assert driver.active == bool(plan.queues)
    assert driver.stats.planned == plan.migration_count


def test_start_launches_as_many_as_the_member_limit_allows():
    # A new member is the destination of many copies: with max_parallel 2 it gets two.
    driver, _, sent = started(kind="join", members=3, partitions=31, backups=1, max_parallel=2)
    assert loads([(t.migration, t.sender) for t in sent])["m3"] == 2


# -- transferred ---------------------------------------------------------------------------------


def test_transferred_ok_asks_the_destination_to_commit():
    driver, table, sent = started()
    t = sent[0]
    assert driver.transferred(t.mid, True, table, 1.0) == [
        Commit(t.mid, t.migration, t.initial_version)]
    # A repeated or late answer of the same transfer is ignored, so is an unknown id.
    assert driver.transferred(t.mid, True, table, 2.0) == []
    assert driver.transferred(10_000, True, table, 2.0) == []


def test_a_failed_transfer_raises_the_version_past_the_step_and_keeps_the_replicas():
    driver, table, sent = started()
    t = sent[0]
    pid, inc = t.migration.partition_id, t.migration.partition_version_increment
    commands = driver.transferred(t.mid, False, table, 1.0)
    assert len(commands) == 1 and isinstance(commands[0], NewTable)
    new = commands[0].table
    assert new.replicas(pid) == table.replicas(pid)
    assert new.version(pid) == t.initial_version + inc + 1
    assert all(new.version(p) == table.version(p) for p in range(table.partition_count)
               if p != pid)
    assert driver.stats.failed == 1
    assert t.mid not in driver.running


def test_a_transfer_whose_partition_version_moved_fails_even_if_ok():
    driver, table, sent = started()
    t = sent[0]
    pid, inc = t.migration.partition_id, t.migration.partition_version_increment
    moved = table.copy()
    moved.raise_version(pid, 1)
    commands = driver.transferred(t.mid, True, moved, 1.0)
    assert [type(c) for c in commands] == [NewTable]
    new = commands[0].table
    assert new.replicas(pid) == table.replicas(pid)
    assert new.version(pid) == moved.version(pid) + inc + 1


def test_a_failure_aborts_the_plan_and_the_driver_ends_when_nothing_runs():
    driver, table, sent = started(kind="leave", members=5, partitions=31, max_parallel=2)
    assert len(sent) > 1
    assert driver.plan.pending_count > 0, "more migrations are queued behind these"
    first, rest = sent[0], sent[1:]
    for c in driver.transferred(first.mid, False, table, 1.0):
        table = c.table
    assert driver.active and driver.plan.is_aborted and driver.plan.pending_count == 0
    assert not driver.take_ended()
    now = 2.0
    for t in rest:
        assert driver.transferred(t.mid, True, table, now) != []
        commands = driver.committed(t.mid, True, table, now)
        assert transfers(commands) == [], "nothing more of an aborted plan starts"
        table = tables(commands)[-1]
        now += 1
    assert not driver.active
    assert driver.running == {}
    assert driver.take_ended()
    assert not driver.take_ended()
    assert driver.stats.failed == 1 and driver.stats.completed == len(rest)


def test_the_only_running_migration_failing_ends_the_plan_at_once():
    driver, table, sent = started(kind="join", members=3, partitions=7, backups=0,
                                  max_parallel=1)
    assert len(sent) == 1
    driver.transferred(sent[0].mid, False, table, 1.0)
    assert not driver.active
    assert driver.take_ended() and not driver.take_ended()


# -- committed -----------------------------------------------------------------------------------


def test_a_commit_applies_the_step_once_and_launches_the_next_transfers():
    driver, table, sent = started(kind="join", members=3, partitions=31, max_parallel=1)
    t = sent[0]
    m, pid = t.migration, t.migration.partition_id
    driver.transferred(t.mid, True, table, 1.0)
    commands = driver.committed(t.mid, True, table, 2.0)
    assert isinstance(commands[0], NewTable)
    new = commands[0].table
    assert new.replicas(pid) == apply_migration(table.replicas(pid), m)
    assert new.version(pid) == t.initial_version + m.partition_version_increment
    assert all(new.replicas(p) == table.replicas(p) and new.version(p) == table.version(p)
               for p in range(table.partition_count) if p != pid)
    following = transfers(commands[1:])
    assert following, "the freed member takes the next migration"
    assert all(isinstance(c, Transfer) for c in commands[1:])
    running = [(r.migration, r.sender) for r in driver.running.values()]
    assert max(loads(running).values()) <= 1
    for f in following:
        assert f.initial_version == new.version(f.migration.partition_id)
        assert f.migration != m
    assert driver.stats.completed == 1
    # The same answer again does nothing.
    assert driver.committed(t.mid, True, new, 3.0) == []


def test_a_commit_the_master_already_holds_is_not_applied_twice():
    # The master was the destination: it committed into its own table before answering.
    driver, table, sent = started(kind="join", members=3, partitions=31, max_parallel=1)
    t = sent[0]
    m, pid = t.migration, t.migration.partition_id
    expected_row = apply_migration(table.replicas(pid), m)
    driver.transferred(t.mid, True, table, 1.0)
    local = table.copy()
    local.set_replicas(pid, expected_row)
    assert local.version(pid) == t.initial_version + m.partition_version_increment
    commands = driver.committed(t.mid, True, local, 2.0)
    new = commands[0].table
    assert new.replicas(pid) == expected_row
    assert new.version(pid) == t.initial_version + m.partition_version_increment
    assert new == local


def test_a_failed_commit_raises_the_version_past_the_step_and_keeps_the_replicas():
    driver, table, sent = started()
    t = sent[0]
    pid, inc = t.migration.partition_id, t.migration.partition_version_increment
    driver.transferred(t.mid, True, table, 1.0)
    commands = driver.committed(t.mid, False, table, 2.0)
    assert [type(c) for c in commands] == [NewTable]
    new = commands[0].table
    assert new.replicas(pid) == table.replicas(pid)
    assert new.version(pid) == t.initial_version + inc + 1
    assert driver.plan.is_aborted


def test_a_commit_on_a_partition_whose_version_moved_elsewhere_fails():
    driver, table, sent = started()
    t = sent[0]
    pid, inc = t.migration.partition_id, t.migration.partition_version_increment
    driver.transferred(t.mid, True, table, 1.0)
    moved = table.copy()
    moved.raise_version(pid, inc + 5)
    commands = driver.committed(t.mid, True, moved, 2.0)
    assert [type(c) for c in commands] == [NewTable]
    assert commands[0].table.replicas(pid) == table.replicas(pid)
    assert commands[0].table.version(pid) == moved.version(pid) + inc + 1


def test_a_commit_answer_before_the_transfer_answer_is_ignored():
    driver, table, sent = started()
    assert driver.committed(sent[0].mid, True, table, 1.0) == []
    assert sent[0].mid in driver.running


# -- members_changed and tick --------------------------------------------------------------------


def test_members_changed_fails_migrations_of_gone_members_and_aborts_the_rest():
    driver, table, sent = started(kind="leave", members=5, partitions=31, backups=1,
                                  max_parallel=2)
    victim = sent[0]
    gone = {victim.migration.destination}
    hit = [t for t in sent
           if gone & {t.migration.source, t.migration.destination, t.sender}]
    spared = [t for t in sent if t not in hit]
    assert spared, "the scenario needs a migration the gone member takes no part in"
    commands = driver.members_changed(table, gone, 1.0)
    assert all(isinstance(c, NewTable) for c in commands)
    final = commands[-1].table
    for t in hit:
        pid, inc = t.migration.partition_id, t.migration.partition_version_increment
        assert final.replicas(pid) == table.replicas(pid)
        assert final.version(pid) == t.initial_version + inc + 1
        assert t.mid not in driver.running
    assert sorted(driver.running) == sorted(t.mid for t in spared)
    assert driver.plan.is_aborted and driver.plan.pending_count == 0
    # The others still complete, but nothing new starts.
    table, now = final, 2.0
    for t in spared:
        driver.transferred(t.mid, True, table, now)
        commands = driver.committed(t.mid, True, table, now)
        assert transfers(commands) == []
        new = commands[0].table
        pid = t.migration.partition_id
        assert new.replicas(pid) == apply_migration(table.replicas(pid), t.migration)
        table, now = new, now + 1
    assert not driver.active
    assert driver.take_ended() and not driver.take_ended()


def test_members_changed_fails_a_migration_whose_partition_version_moved():
    driver, table, sent = started(kind="join", members=4, partitions=31, backups=1)
    moved_t, others = sent[0], sent[1:]
    pid, inc = moved_t.migration.partition_id, moved_t.migration.partition_version_increment
    moved = table.copy()
    moved.raise_version(pid, inc + 3)  # neither the initial nor the committed version
    commands = driver.members_changed(moved, set(), 1.0)
    assert [type(c) for c in commands] == [NewTable]
    assert commands[0].table.version(pid) == moved.version(pid) + inc + 1
    assert commands[0].table.replicas(pid) == table.replicas(pid)
    assert sorted(driver.running) == sorted(t.mid for t in others)


def test_members_changed_with_nothing_gone_only_stops_new_starts():
    driver, table, sent = started(kind="join", members=3, partitions=31, max_parallel=1)
    assert driver.members_changed(table, set(), 1.0) == []
    assert sorted(driver.running) == sorted(t.mid for t in sent)
    assert driver.plan.is_aborted


def test_members_changed_without_a_plan_does_nothing():
    driver = MigrationDriver(1, 2, TIMEOUT)
    assert driver.members_changed(assigned(3, 7, 1), {"m1"}, 0.0) == []
    assert not driver.active and not driver.take_ended()


def test_tick_fails_only_migrations_past_their_deadline():
    driver, table, sent = started(kind="join", members=3, partitions=31, max_parallel=2,
                                  now=0.0)
    assert len(sent) >= 2
    assert driver.tick(table, TIMEOUT - 1) == []
    # The commit phase gets a fresh deadline.
    committing = sent[0]
    driver.transferred(committing.mid, True, table, 50.0)
    commands = driver.tick(table, TIMEOUT)
    assert all(isinstance(c, NewTable) for c in commands)
    assert sorted(driver.running) == [committing.mid]
    final = commands[-1].table
    for t in sent[1:]:
        pid, inc = t.migration.partition_id, t.migration.partition_version_increment
        assert final.version(pid) == t.initial_version + inc + 1
        assert final.replicas(pid) == table.replicas(pid)
    assert driver.tick(final, 50.0 + TIMEOUT - 1) == []
    commands = driver.tick(final, 50.0 + TIMEOUT)
    pid = committing.migration.partition_id
    assert commands[-1].table.version(pid) == \
        committing.initial_version + committing.migration.partition_version_increment + 1
    assert not driver.active
    assert driver.take_ended()
    # The late answers are ignored.
    assert driver.transferred(sent[1].mid, True, final, 200.0) == []
    assert driver.committed(committing.mid, True, final, 200.0) == []


def test_a_removal_during_the_commit_phase_does_not_lose_the_committed_step():
    # [a, b, c], c leaves gracefully: MOVE c -> d at index 2 (increment 1), sent by a.
    table = PartitionTable(1)
    table.set_replicas(0, ["a", "b", "c"])
    driver = MigrationDriver(2, 2, TIMEOUT)
    [t] = driver.start(table, ["a", "b", "d"], 0.0, ACTIVE)
    assert t.migration == Migration("c", 2, -1, "d", -1, 2, 0)
    assert driver.transferred(t.mid, True, table, 1.0) == [Commit(t.mid, t.migration, 3)]
    # The destination commits: [a, b, d] at version 4.
    destination = table.copy()
    destination.set_replicas(0, apply_migration(destination.replicas(0), t.migration))
    # Meanwhile b dies: the master's row becomes [a, None, c], also at version 4.
    master = remove_members(table, {"b"}, ["a", "d"])
    master_commands = driver.members_changed(master, {"b"}, 2.0)
    for c in master_commands:
        master = c.table
    for c in driver.committed(t.mid, True, master, 3.0):
        if isinstance(c, NewTable):
            master = c.table
    destination.apply(master)
    assert destination.replicas(0) == master.replicas(0), (
        f"the destination keeps {destination.replicas(0)} v{destination.version(0)}, the "
        f"master publishes {master.replicas(0)} v{master.version(0)}")


# -- whole plans ---------------------------------------------------------------------------------


class Shell:
    """The master around the driver, as workers/cluster_service.py runs it, checking the
    driver's promises on every command."""

    def __init__(self, table: PartitionTable, data: Sequence[str], backups: int,
                 max_parallel: int) -> None:
        self.driver = MigrationDriver(backups, max_parallel, TIMEOUT)
        self.table = table.copy()
        self.first = table.copy()
        self.data = list(data)
        self.backups = backups
        self.max_parallel = max_parallel
        self.master = self.data[0]  # commits locally when it is the destination
        self.now = 0.0
        self.requests: list[Transfer | Commit] = []
        self.in_flight: dict[int, tuple[Migration, str | None, tuple, int]] = {}
        self.target = table
        self.rounds = 0
        self.local_commits = 0

    # what the shell does with commands

    def run(self, commands: Sequence[object]) -> None:
        for c in commands:
            if isinstance(c, NewTable):
                self.adopt(c.table)
            elif isinstance(c, Transfer):
                m, pid = c.migration, c.migration.partition_id
                assert pid not in {x[0].partition_id for x in self.in_flight.values()}, \
                    "two migrations of one partition run together"
                assert c.initial_version == self.table.version(pid)
                assert c.sender == source_side(m, self.table.owner(pid))
                apply_migration(self.table.replicas(pid), m)  # the step fits the table
                self.in_flight[c.mid] = (m, c.sender, self.table.replicas(pid),
                                         c.initial_version)
                running = [(x[0], x[1]) for x in self.in_flight.values()]
                assert max(loads(running).values()) <= self.max_parallel
                self.requests.append(c)
            else:
                assert isinstance(c, Commit) and c.mid in self.in_flight
                self.requests.append(c)

    def adopt(self, new: PartitionTable) -> None:
        old = self.table
        for pid in range(old.partition_count):
            assert new.version(pid) >= old.version(pid), f"partition {pid} version went down"
            if new.replicas(pid) != old.replicas(pid):
                assert new.version(pid) > old.version(pid), f"partition {pid} changed silently"
            # The planner's promise: a step lowers the live replicas only by emptying a slot
            # the target leaves empty (never below the current count otherwise).
            floor = min(live(old.replicas(pid)), live(self.target.replicas(pid)))
            assert live(new.replicas(pid)) >= floor, (
                f"partition {pid}: {old.replicas(pid)} -> {new.replicas(pid)}, target "
                f"{self.target.replicas(pid)}")
        adopted = old.copy()
        adopted.apply(new)  # the shell's _adopt: newer versions win
        assert adopted == new, "a published table that the members would not fully take"
        self.table = adopted

    # answering the driver's requests

    def answer(self, request: Transfer | Commit, ok: bool) -> None:
        self.now += 1
        mid, m = request.mid, request.migration
        pid, inc = m.partition_id, m.partition_version_increment
        if mid not in self.in_flight:  # failed meanwhile: a late answer
            then = self.driver.transferred if isinstance(request, Transfer) \
                else self.driver.committed
            assert then(mid, ok, self.table, self.now) == []
            return
        _, _, row, initial = self.in_flight[mid]
        if isinstance(request, Transfer):
            commands = self.driver.transferred(mid, ok, self.table, self.now)
            if ok:
                assert commands == [Commit(mid, m, initial)]
            else:
                self.expect_failure(commands, pid, row, initial + inc + 1)
                del self.in_flight[mid]
            self.run(commands)
            return
        if ok and m.destination == self.master:
            local = self.table.copy()  # cluster_service.commit_locally
            local.set_replicas(pid, apply_migration(local.replicas(pid), m))
            self.table = local
            self.local_commits += 1
        commands = self.driver.committed(mid, ok, self.table, self.now)
        del self.in_flight[mid]
        if ok:
            assert isinstance(commands[0], NewTable)
            assert commands[0].table.replicas(pid) == apply_migration(row, m)
            assert commands[0].table.version(pid) == initial + inc
            assert all(isinstance(c, Transfer) for c in commands[1:])
        else:
            self.expect_failure(commands, pid, row, initial + inc + 1)
        self.run(commands)

    @staticmethod
    def expect_failure(commands: Sequence[object], pid: int, row: tuple, version: int) -> None:
        assert [type(c) for c in commands] == [NewTable]
        assert commands[0].table.replicas(pid) == row
        assert commands[0].table.version(pid) == version

    def expire(self) -> None:
        """Time runs out for every running migration."""
        before = self.table
        self.now += TIMEOUT
        commands = self.driver.tick(self.table, self.now)
        assert len(commands) == len(self.in_flight)
        self.run(commands)
        for m, _, row, initial in self.in_flight.values():
            pid = m.partition_id
            assert self.table.replicas(pid) == row == before.replicas(pid)
            assert self.table.version(pid) == initial + m.partition_version_increment + 1
        self.in_flight.clear()

    def interrupt(self) -> None:
        """A member joins or asks to leave: nothing gone, nothing more starts."""
        assert self.driver.members_changed(self.table, set(), self.now) == []
        assert not self.driver.active or self.driver.plan.is_aborted

    # whole plans

    def drive(self, events: Iterator[tuple[int, str]], rounds_max: int) -> None:
        """Plan, answer every request (in the order and with the outcome ``events`` say,
        then in order and ok), and plan again while the driver ends short of the target."""
        while True:
            self.target = assign(self.table, self.data, self.backups)
            self.run(self.driver.start(self.table, self.data, self.now, ACTIVE))
            self.rounds += 1
            if not self.driver.active and not self.requests:
                # Nothing planned (the table is the target), or a plan that ended at once:
                # removals only, or cycles the planner cancels.
                if not self.driver.take_ended() or self.stable():
                    return
                assert self.rounds <= rounds_max, "the driver does not converge"
                continue
            assert self.rounds <= rounds_max, "the driver does not converge"
            while self.requests:
                pick, outcome = next(events, (0, "ok"))
                request = self.requests.pop(pick % len(self.requests))
                if outcome == "timeout":
                    self.expire()
                elif outcome == "interrupt":
                    self.interrupt()
                self.answer(request, outcome != "fail")
            assert not self.in_flight
            assert not self.driver.active, "the driver waits for nothing yet stays active"
            assert self.driver.take_ended() and not self.driver.take_ended()

    def stable(self) -> bool:
        """What assign wants differs from the table only by cycles the planner cancels."""
        target = assign(self.table, self.data, self.backups)
        return all(target.replicas(p) == self.table.replicas(p)
                   or is_cyclic(self.table.replicas(p), target.replicas(p))
                   for p in range(self.table.partition_count))

    def check_final(self) -> None:
        table, target = self.table, assign(self.table, self.data, self.backups)
        cyclic = [p for p in range(table.partition_count)
                  if target.replicas(p) != table.replicas(p)]
        for p in cyclic:
            assert is_cyclic(table.replicas(p), target.replicas(p)), p
        if cyclic:
            # Only when every data member holds every partition (assignment.py says so).
            assert replica_count_for(len(self.data), self.backups) == len(self.data)
        else:
            assert is_balanced(table, self.data, self.backups)
        for p in range(table.partition_count):
            assert table.version(p) >= self.first.version(p)
        assert not self.driver.active


@pytest.mark.parametrize("kind", ["remove", "join", "leave"])
@pytest.mark.parametrize("members", [3, 4, 5, 6])
def test_a_plan_answered_ok_reaches_the_balanced_target_in_one_round(kind, members):
    for partitions in (7, 23, 61):
        for backups in (0, 1, 2):
            for max_parallel in (1, 3):
                table, data = scenario(kind, members, partitions, backups)
                case = (kind, members, partitions, backups, max_parallel)
                shell = Shell(table, data, backups, max_parallel)
                shell.drive(iter(()), rounds_max=1)
                shell.check_final()
                target = assign(table, data, backups)
                for p in range(partitions):
                    assert shell.table.replicas(p) == target.replicas(p) or is_cyclic(
                        table.replicas(p), target.replicas(p)), (case, p)
                changed = any(target.replicas(p) != table.replicas(p)
                              for p in range(partitions))
                assert shell.driver.stats.failed == 0, case
                if changed and shell.driver.stats.planned:
                    assert shell.driver.stats.completed == shell.driver.stats.planned, case


def test_a_join_moves_data_to_the_new_member():
    table, data = scenario("join", 3, 31, 1)
    shell = Shell(table, data, 1, 2)
    shell.drive(iter(()), rounds_max=1)
    shell.check_final()
    assert all(table.replica_index(p, "m3") == -1 for p in range(31))
    assert all(31 // 4 <= n <= 31 // 4 + 1 for n in shell.table.replica_counts("m3")[:2])


def test_a_leave_empties_the_member_and_the_master_commits_locally():
    table, data = scenario("leave", 4, 31, 1)
    shell = Shell(table, data, 1, 2)
    shell.drive(iter(()), rounds_max=1)
    shell.check_final()
    assert not any(shell.table.replica_counts("m1"))
    assert shell.local_commits > 0, "the master (m0) was a destination at least once"


@settings(max_examples=80, deadline=None, derandomize=True)
@given(kind=st.sampled_from(["remove", "join", "leave"]), members=st.integers(3, 6),
       partitions=st.integers(7, 61), backups=st.integers(0, 2),
       max_parallel=st.integers(1, 3),
       events=st.lists(st.tuples(st.integers(0, 50),
                                 st.sampled_from(["ok", "ok", "fail", "timeout", "interrupt"])),
                       max_size=40))
def test_a_plan_with_random_failures_ends_balanced_after_replanning(
        kind, members, partitions, backups, max_parallel, events):
    table, data = scenario(kind, members, partitions, backups)
    shell = Shell(table, data, backups, max_parallel)
    # Every round short of the target used up a failure, a timeout or an interruption.
    shell.drive(iter(events), rounds_max=len(events) + 2)
    shell.check_final()


# -- wire form -----------------------------------------------------------------------------------

members_or_none = st.none() | st.text(min_size=1, max_size=12)
indexes = st.integers(-1, 6)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.builds(Migration, members_or_none, indexes, indexes, members_or_none, indexes,
                 indexes, st.integers(0, 2**20)))
def test_a_migration_survives_the_wire(m):
    wire = migration_to_wire(m)
    assert isinstance(wire, list) and len(wire) == 7
    assert migration_from_wire(wire) == m
    assert migration_from_wire(tuple(wire)) == m


def test_a_real_migration_survives_the_wire():
    m = Migration("m1", 0, 2, "m4", 1, 0, 17)
    assert migration_to_wire(m) == ["m1", 0, 2, "m4", 1, 0, 17]
    assert migration_from_wire(["m1", 0, 2, "m4", 1, 0, 17]) == m


@pytest.mark.parametrize("obj", [
    None,
    "m1",
    {"source": "m1"},
    [],
    ["m1", 0, -1, "m2", -1, 0],
    ["m1", 0, -1, "m2", -1, 0, 3, 4],
    ["m1", "0", -1, "m2", -1, 0, 3],
    ["m1", 0, -1, "m2", -1, 0, 3.0],
    ["m1", True, -1, "m2", -1, 0, 3],
    ["m1", 0, -1, "m2", -1, 0, False],
    ["m1", 0, None, "m2", -1, 0, 3],
    [7, 0, -1, "m2", -1, 0, 3],
    ["m1", 0, -1, b"m2", -1, 0, 3],
    ["m1", 0, -1, ["m2"], -1, 0, 3],
])
def test_a_malformed_wire_migration_is_a_value_error(obj):
    with pytest.raises(ValueError):
        migration_from_wire(obj)
