"""A cluster state change raced by a join, a leave, a kill, a hang or the master's death, in
the simulation: whatever happens, it is all or nothing. Once quiet, every member is in one
state; a change the master answered ok is in force everywhere, one it refused nowhere. The
simulation checks after every step that a state version means one state."""

from __future__ import annotations

import random

import pytest

from grid import protocol as p
from grid.cluster.state import ClusterState
from grid.partition.assignment import is_balanced
from tests.cluster.test_simulation import form_cluster
from tests.cluster.test_write_path import Probe

RACES = ["none", "join", "leave", "kill", "kill-master", "hang", "lost-lock"]
TARGETS = [ClusterState.NO_MIGRATION, ClusterState.FROZEN, ClusterState.PASSIVE]


def run_race(seed: int, race: str) -> None:
    net = form_cluster(seed, backup_count=1, nodes=3)
    try:
        rng = random.Random(seed)
        probe = Probe(net, "admin")
        secret = net.config.cluster_secret
        master = net.master()
        others = [n for n in net.alive() if n is not master]
        target = rng.choice(TARGETS)
        if race == "lost-lock":
            # A member that takes no lock: the master must call the change off.
            victim = rng.choice(others)
            victim.handlers[p.STATE_LOCK] = lambda ident, header, frames: None
        rid = probe.send(master, p.CHANGE_STATE, [], state=target.value, timeout=3.0, k=secret)
        net.run_until(net.time + rng.uniform(0.0, 0.03))
        if race == "join":
            net.add_node([master.info.endpoint])
        elif race == "leave":
            # As SIGTERM does: the member asks to leave (it stops vouching for local reads
            # first, since the master may then remove it at once).
            rng.choice(others).cluster.request_leave()
        elif race == "kill":
            net.kill(rng.choice(others), "race")
        elif race == "kill-master":
            net.kill(master, "race")
        elif race == "hang":
            net.hang(rng.choice(others), 4.0)
        net.run_until(net.time + 12.0)
        assert net.violations == [], net.log
        alive = [n for n in net.alive() if not n.paused and n.cluster.joined]
        states = {(n.cluster.state, n.cluster.state_version) for n in alive}
        assert len(states) == 1, (states, net.log)
        [(state, _)] = states
        answer = probe.answer(rid)
        if answer is not None and answer[0]["ok"]:
            assert state is target, answer
        elif answer is not None:
            assert answer[0]["code"] == p.STATE_CHANGE, answer
            assert state is ClusterState.ACTIVE, (answer, net.log)
        else:
            assert race == "kill-master", "only a dead master leaves the change unanswered"
        if race in ("none",):
            assert answer is not None and answer[0]["ok"], answer
        if race == "lost-lock":
            assert answer is not None and not answer[0]["ok"], answer
        # No member keeps a lock once quiet (or only one whose lease will run out).
        assert all(n.states.lock.txn is None or n.states.lock.expires <= net.time
                   for n in alive), [n.states.lock for n in alive]
    finally:
        net.close()


@pytest.mark.parametrize("race", RACES)
@pytest.mark.parametrize("seed", range(4))
def test_a_state_change_is_all_or_nothing(seed, race):
    run_race(seed, race)


# A run takes about 25 ms: the soak takes many seeds (a master killed between its decision
# and its commit showed in 11 of 1,000 seeds of kill-master).
@pytest.mark.soak
@pytest.mark.parametrize("race", RACES)
@pytest.mark.parametrize("seed", range(4, 600))
def test_a_state_change_is_all_or_nothing_soak(seed, race):
    run_race(seed, race)


# Seeds that once failed, kept in the default run: (seed, race, what was wrong).
REGRESSIONS = [
    (63, "kill-master", "the master answered ok at its decision and died before its commit "
     "or its view reached anyone: the others kept ACTIVE, the client was told FROZEN"),
]


@pytest.mark.parametrize(("seed", "race", "bug"), REGRESSIONS)
def test_seeds_that_once_failed(seed, race, bug):
    run_race(seed, race)


def test_the_master_answers_each_promotion_case_as_the_seed_says(make_cluster):
    net = make_cluster(seed=3, backup_count=1, nodes=3)
    secret = net.config.cluster_secret
    probe = Probe(net, "admin")
    master = net.master()
    follower = next(n for n in net.alive() if n is not master)
    lite = net.add_node([master.info.endpoint], lite=True)
    net.run_until(net.time + 2.0)
    assert not any(lite.cluster.table.replica_counts(lite.info.uuid)), "lite: it holds nothing"
    asks = {
        "unknown": probe.send(master, p.PROMOTE, [], uuid="no-such-member", k=secret),
        "not master": probe.send(follower, p.PROMOTE, [], uuid=lite.info.uuid, k=secret),
        "data already": probe.send(follower, p.PROMOTE_LOCAL, [], k=secret),
        "no secret": probe.send(master, p.PROMOTE, [], uuid=lite.info.uuid),
    }
    net.run_until(net.time + 0.5)
    codes = {what: probe.answer(rid)[0].get("code") for what, rid in asks.items()}
    assert codes == {"unknown": p.UNKNOWN_MEMBER, "not master": p.NOT_READY,
                     "data already": p.ILLEGAL_STATE, "no secret": p.AUTH}, codes

    # The promotion itself: the lite member asks the master, takes the list it returns, and
    # the rebalance gives it its share.
    rid = probe.send(lite, p.PROMOTE_LOCAL, [], k=secret)
    net.run_until(net.time + 3.0)
    header = probe.answer(rid)[0]
    assert header["ok"], header
    assert not lite.cluster.is_lite
    assert lite.cluster.members.version == master.cluster.members.version
    table = master.cluster.table
    assert table.replica_counts(lite.info.uuid)[0] > 0
    assert master.cluster.is_safe()
    assert is_balanced(table, master.cluster.members.data_members, 1)
    again = probe.send(lite, p.PROMOTE_LOCAL, [], k=secret)
    net.run_until(net.time + 0.5)
    assert probe.answer(again)[0]["code"] == p.ILLEGAL_STATE


@pytest.mark.parametrize("lite", [True, False], ids=["lite", "data"])
def test_a_lite_join_and_death_leave_the_cluster_safe_and_a_data_join_does_not(make_cluster,
                                                                                lite):
    """A lite member holds nothing, so its join gives the master nothing to plan: the cluster
    is safe from the moment the master takes it in (a wait-safe, or a status, right after
    `add-member --lite` says so), and nothing moves; the same when it dies. A data member's
    join is not safe until the master has planned its share."""
    net = make_cluster(seed=5, backup_count=1, nodes=3)
    master = net.master()
    net.run_until(net.time + 1.0)
    assert master.cluster.is_safe()
    table = master.cluster.table.copy()
    joiner = net.add_node([master.info.endpoint], lite=lite)
    while joiner.info.uuid not in master.cluster.members:  # step until the master takes it in
        net.run_until(net.events[0][0])
    assert master.cluster.is_safe() is lite
    net.run_until(net.time + 3.0)
    assert master.cluster.is_safe()
    counts = master.cluster.table.replica_counts(joiner.info.uuid)
    if not lite:
        assert counts[0] > 0, "a data member takes its share"
        return
    assert master.cluster.table == table and not any(counts), "a lite join moves nothing"
    net.kill(joiner, "a lite member dies")
    while joiner.info.uuid in master.cluster.members:  # step until the master removes it
        net.run_until(net.events[0][0])
    assert master.cluster.is_safe() and master.cluster.table.live_rows() == table.live_rows()
