"""Cluster states (seed 000) and the all-or-nothing state change (grid/cluster/state_change.py),
plus the gate in the master's planner: no migration is planned where the state forbids it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.cluster.migrations import MigrationDriver, Transfer
from grid.cluster.repair import initial_assignment, remove_members
from grid.cluster.state import ClusterState
from grid.cluster.state_change import (
    CommitAll,
    Finished,
    LockAll,
    Phase,
    StateChange,
    StateChangeRefused,
    StateLock,
    UnlockAll,
)
from grid.partition.table import PartitionTable

ACTIVE, NO_MIGRATION, FROZEN, PASSIVE = (ClusterState.ACTIVE, ClusterState.NO_MIGRATION,
                                         ClusterState.FROZEN, ClusterState.PASSIVE)
MEMBERS = ["m0", "m1", "m2"]


def test_the_seed_table_of_states():
    assert [(s.join_allowed, s.migration_allowed) for s in ClusterState] == [
        (True, True), (True, False), (False, False), (False, False), (False, False)]
    assert [s.writes_allowed for s in ClusterState] == [True, True, True, False, True]
    assert [s.rejoin_allowed for s in ClusterState] == [False, False, False, False, True]


def begin(new=NO_MIGRATION, old=ACTIVE, migrating=False, now=0.0, timeout=10.0):
    return StateChange.begin(7, old, new, 3, MEMBERS, 5, migrating, now, timeout)


def test_a_change_locks_every_member_then_commits_at_the_next_state_version():
    change, commands = begin()
    assert commands == [LockAll(7, NO_MIGRATION, tuple(MEMBERS))]
    assert change.holds_migrations
    assert change.lock_answered("m0", True) == []
    assert change.lock_answered("m1", True) == []
    assert change.lock_answered("stranger", True) == []
    assert change.lock_answered("m2", True) == [CommitAll(7, NO_MIGRATION, 4, tuple(MEMBERS))]
    assert change.holds_migrations, "decided, and not yet confirmed by every member"
    assert change.commit_answered("m0", True) == []
    assert change.commit_answered("m1", False) == [], "a refusal waits for the resend"
    assert change.commit_answered("stranger", True) == []
    assert change.commit_answered("m1", True) == []
    [finished] = change.commit_answered("m2", True)
    assert finished.ok and finished.state is NO_MIGRATION
    assert not change.holds_migrations
    assert change.lock_answered("m2", True) == [] and change.commit_answered("m2", True) == []
    assert change.tick(99.0, False) == []


def test_a_decided_change_tells_the_unconfirmed_again_and_answers_at_its_deadline():
    change, _ = begin(now=0.0, timeout=10.0)
    for m in MEMBERS:
        change.lock_answered(m, True)
    change.commit_answered("m0", True)
    assert change.tick(1.0, False) == [], "the first tick starts the resend clock"
    assert change.tick(1.5, False) == []
    assert change.tick(2.0, False) == [CommitAll(7, NO_MIGRATION, 4, ("m1", "m2"))]
    assert change.tick(2.5, False) == []
    change.commit_answered("m1", True)
    assert change.tick(3.0, False) == [CommitAll(7, NO_MIGRATION, 4, ("m2",))]
    [finished] = change.tick(10.0, False)
    assert finished.ok and finished.state is NO_MIGRATION and "m2" in finished.message
    assert not change.holds_migrations and change.commit_answered("m2", True) == []


def test_a_refusal_unlocks_those_that_locked_and_keeps_the_old_state():
    change, _ = begin()
    change.lock_answered("m0", True)
    unlock, finished = change.lock_answered("m1", False, "busy")
    assert unlock == UnlockAll(7, ("m0",))
    assert not finished.ok and finished.state is ACTIVE
    assert "m1" in finished.message and "busy" in finished.message
    assert change.lock_answered("m2", True) == [], "nothing commits after an abort"


def test_a_member_change_or_time_up_aborts_before_the_decision_only():
    change, _ = begin()
    assert change.members_changed(5, MEMBERS) == []
    [finished] = change.members_changed(6, MEMBERS)
    assert not finished.ok and "members changed" in finished.message
    change, _ = begin()
    change.lock_answered("m0", True)
    unlock, finished = change.tick(10.0, False)
    assert unlock == UnlockAll(7, ("m0",)) and not finished.ok
    change, _ = begin()
    for m in MEMBERS:
        change.lock_answered(m, True)
    assert change.members_changed(9, MEMBERS) == [] and change.tick(5.0, False) == [], \
        "a decided change is not called off"
    change.commit_answered("m0", True)
    assert change.members_changed(10, ["m0", "m2", "m3"]) == [], "m2 has yet to confirm"
    [finished] = change.members_changed(11, ["m0", "m3"])
    assert finished.ok, "members that left confirm nothing: the answer waits no more for them"


def test_migrations_in_flight_refuse_a_change_except_to_passive_which_waits():
    with pytest.raises(StateChangeRefused, match="migrations are in flight"):
        begin(FROZEN, migrating=True)
    change, commands = begin(PASSIVE, migrating=True)
    assert commands == [] and change.phase is Phase.WAITING and change.holds_migrations
    assert change.tick(1.0, True) == []
    assert change.tick(2.0, False) == [LockAll(7, PASSIVE, tuple(MEMBERS))]
    change, _ = begin(PASSIVE, migrating=True)
    [finished] = change.tick(10.0, True)
    assert not finished.ok and "migrations in flight did not end" in finished.message


def test_a_change_to_the_state_in_force_is_done_at_once():
    change, commands = begin(ACTIVE, ACTIVE)
    assert commands == [Finished(True, ACTIVE, "the cluster is ACTIVE already")]
    assert not change.holds_migrations


def test_a_member_locks_one_change_at_a_time_until_it_ends_or_its_lease_runs_out():
    lock = StateLock()
    assert lock.lock(1, "master", now=0.0, lease=5.0) == ""
    assert lock.lock(1, "master", now=1.0, lease=5.0) == "", "a resent lock is fine"
    assert "holds the lock" in lock.lock(2, "master", now=2.0, lease=5.0)
    assert "holds the lock" in lock.lock(1, "other master", now=2.0, lease=5.0)
    assert lock.lock(2, "new master", now=6.5, lease=5.0) == "", "the lease ran out"
    lock.release(1, "master")
    assert lock.holds(2, "new master")
    lock.release(2, "new master")
    assert lock.lock(3, "master", now=7.0, lease=5.0) == ""


# -- the planner consults migration_allowed --------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["kill", "join", "plan"]),
                                 st.sampled_from(list(ClusterState))), min_size=1,
                       max_size=12),
       backups=st.integers(min_value=0, max_value=2))
def test_no_migration_is_ever_planned_where_the_state_forbids_it(events, backups):
    """Random kills and joins, and plans asked for in random states: a plan (a Transfer or
    a table change) comes only where migration_allowed; promotions by repair go on."""
    members = [f"m{k}" for k in range(4)]
    table = initial_assignment(PartitionTable(31), members, backups)
    driver = MigrationDriver(backups, 4, 100.0)
    joined = 4
    for kind, state in events:
        if kind == "kill" and len(members) > 1:
            gone = members.pop(0)
            table = remove_members(table, {gone}, members, backups)
            driver.members_changed(table, {gone}, 0.0)
            assert table.is_assigned(), "repair keeps every partition owned in any state"
        elif kind == "join":
            members.append(f"m{joined}")
            joined += 1
        commands = driver.start(table, members, 0.0, state)
        if not state.migration_allowed:
            assert commands == [] and not driver.active
        else:
            assert all(isinstance(c, Transfer) for c in commands if not hasattr(c, "table"))
            # Call the plan off at once, so that the next event meets an idle driver.
            driver.members_changed(table, set(), 0.0)
            for mid in list(driver.running):
                driver.transferred(mid, False, table, 0.0)
            assert not driver.active
