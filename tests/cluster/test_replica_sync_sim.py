"""Replica sync in the simulation (seed 004): asynchronous backups lose operations on the way,
members die, hang or join while clients write; once the clients stop, within one anti-entropy
interval (and the grace a backup gives operations still on their way) every replica, the
asynchronous ones included, equals its owner, and no acknowledged write is lost."""

from __future__ import annotations

import pytest

from tests.cluster.sim import (
    SimClient,
    SimNetwork,
    check_converged,
    lost_writes,
    replicas_differing,
)
from tests.cluster.test_simulation import TIMEOUT_S, form_cluster

CASES = ["loss", "loss-kill", "loss-kill-master", "loss-hang-near-timeout", "loss-join",
         "loss-no-merkle", "slow-answers-kill", "two-sync-slow-answers-kill"]
SYNC_INTERVAL_S = 1.0


def run_case(seed: int, case: str) -> SimNetwork:
    changes = {"merkle_tree_depth": 0} if case == "loss-no-merkle" else {}
    # With two synchronous backups a kill moves the second up to index 1 with no data
    # moving: its versions there are unknown, so it syncs while it acknowledges writes.
    net = form_cluster(seed, backup_count=2 if case.startswith("two-sync") else 1,
                       async_backup_count=1,
                       backup_sync_interval=SYNC_INTERVAL_S, max_parallel_replications=2,
                       send_failure_rate=0.002, duplicate_rate=0.02, **changes)
    net.async_loss_rate = 0.1
    # Overwrites (a stale replica shows an older value) and fresh keys (a hole).
    clients = [SimClient(net, "c0"), SimClient(net, "c1", key_count=7),
               SimClient(net, "c2", key_count=3)]
    for client in clients:
        client.start()
    if "slow-answers" in case:
        # Sync answers come late: a request stays out while the owner takes more writes,
        # which the backup applies meanwhile (its request's window).
        net.sync_answer_delay = 0.5
    net.run_until(net.time + net.rng.uniform(1.0, 2.5))
    master = net.master()
    others = [n for n in net.alive() if n is not master]
    if case.endswith("-kill"):
        net.kill(net.rng.choice(others), "chaos")
    elif case == "loss-kill-master":
        net.kill(master, "chaos")
    elif case == "loss-hang-near-timeout":
        net.hang(net.rng.choice(others), net.rng.uniform(0.8, 1.2) * TIMEOUT_S)
    elif case == "loss-join":
        net.add_node([n.info.endpoint for n in net.alive()])
    net.run_until(net.time + 6.0)
    for client in clients:
        client.stopped = True
    # Quiet: migrations end, then one anti-entropy round and the grace it gives.
    net.run_until(net.time + 8.0 + 2 * SYNC_INTERVAL_S)
    return net


def check_case(seed: int, case: str) -> None:
    net = run_case(seed, case)
    try:
        assert net.violations == [], net.log
        assert check_converged(net) == [], net.log
        assert lost_writes(net, list(net.clients.values())) == [], net.log
        assert replicas_differing(net) == [], net.log
        synced = sum(n.syncs.synced for n in net.alive())
        assert synced > 0, "lost operations were repaired by replica syncs"
        assert all(not n.syncs.requests.pending and not n.syncs.lent
                   for n in net.alive()), "no sync is left in flight once quiet"
    finally:
        net.close()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(3))
def test_every_replica_equals_its_owner_after_one_interval(seed, case):
    check_case(seed, case)


# Seeds that once failed, kept in the default run: (seed, case, what was wrong).
REGRESSIONS = [
    (92, "loss-join", "the invariant took a member for a synchronous backup by its own table, "
     "which had not yet heard that a migration moved the backup to the joined member: a "
     "false alarm for a write acknowledged after the move (sim.check_synced_backup)"),
    (20, "loss-kill-master", "a replica sync took away a write a dead owner had sent to this "
     "backup alone and left its invocation record (sim.check_records; "
     "InvocationRecords.forget_unknown)"),
    (38, "loss-kill", "as seed 20 loss-kill-master"),
]


@pytest.mark.parametrize(("seed", "case", "bug"), REGRESSIONS)
def test_seeds_that_once_failed(seed, case, bug):
    check_case(seed, case)


@pytest.mark.soak
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(3, 60))
def test_replica_sync_soak(seed, case):
    check_case(seed, case)
