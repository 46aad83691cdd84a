"""Whole-cluster runs on a simulated network: seeded kills and hangs of members (the master
among them) while clients write; afterwards every member agrees on the view and every
acknowledged write is on its partition's replicas. A failing seed replays exactly."""

from __future__ import annotations

import pytest

from grid import protocol as p
from grid.config import GridConfig
from tests.cluster.sim import SimClient, SimNetwork, check_converged, lost_writes
from tests.conftest import test_cluster_name

FAULTS = ["kill", "kill-master", "hang", "hang-master", "kill-two", "hang-resume",
          "hang-resume-master"]


def run_scenario(seed: int, fault: str) -> SimNetwork:
    backup_count = 2 if fault == "kill-two" or fault.startswith("hang-resume") else 1
    config = GridConfig(cluster_name=test_cluster_name(f"sim{seed}x"), partition_count=31,
                        backup_count=backup_count, heartbeat_interval=0.2,
                        heartbeat_timeout=2.0, invocation_timeout=5.0)
    net = SimNetwork(seed, config)
    first = net.add_node([])
    for _ in range(3):
        net.add_node([first.info.endpoint])
    net.run_until(1.0)
    net.send(b"supervisor", first.info.endpoint, lambda: first.deliver(
        b"supervisor", p.request(p.FORM, 0, config.cluster_name), []))
    net.run_until(1.5)
    assert first.cluster.table.is_assigned(), "the cluster formed"
    if fault.startswith("hang-resume"):  # lost updates are what a returning member risks
        clients = [SimClient(net, f"c{i}", key_count=3) for i in range(4)]
    else:
        clients = [SimClient(net, "c0"), SimClient(net, "c1"), SimClient(net, "c2", key_count=5)]
    for client in clients:
        client.start()
    net.run_until(net.time + net.rng.uniform(0.5, 2.0))
    net.acked_before_fault = {c.ident: c.counter for c in clients}  # counter: writes started
    alive = net.alive()
    master = next(n for n in alive if n.cluster.is_master)
    others = [n for n in alive if n is not master]
    if fault == "kill":
        net.rng.choice(others).kill_after_reply = True
    elif fault == "kill-master":
        master.kill_after_reply = True
    elif fault == "hang":
        net.hang(net.rng.choice(others))
    elif fault == "hang-master":
        net.hang(master)
    elif fault.startswith("hang-resume"):
        # The supervisor is down: the removed member is not fenced and comes back. Clients
        # stop just after, so that a stale write it let through would be the last one seen.
        net.fencing = False
        victim = master if fault.endswith("master") else net.rng.choice(others)
        net.hang(victim)
        net.run_until(net.time + 5.0)
        for client in clients:
            client.stopped = True
        net.resume(victim)
    else:
        # One member dies; the master dies in the middle of publishing its removal.
        victim = net.rng.choice(others)
        master.kill_after_publish = True
        net.kill(victim, "chaos")
    net.run_until(net.time + 6.0)  # clients keep writing through the failover
    for client in clients:
        client.stopped = True
    net.run_until(net.time + 10.0)
    return net


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("seed", range(6))
def test_failover_keeps_every_acknowledged_write(seed, fault):
    net = run_scenario(seed, fault)
    try:
        clients = list(net.clients.values())
        assert sum(len(c.acked) for c in clients) > 0
        assert check_converged(net) == [], net.log
        assert lost_writes(net, clients) == [], net.log
        expected_members = 2 if fault == "kill-two" else 3
        assert len(net.alive()) == expected_members, net.log
        # A member that came back after its removal learned of it and stopped.
        # Writes went on through the failover: every client had writes acknowledged after it.
        progress = [c.counter - net.acked_before_fault[c.ident] for c in clients]
        assert all(n > 1 for n in progress), progress
    finally:
        net.close()


@pytest.mark.soak
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("seed", range(6, 206))
def test_failover_soak(seed, fault):
    test_failover_keeps_every_acknowledged_write(seed, fault)


def test_same_seed_same_run():
    logs = []
    for _ in range(2):
        net = run_scenario(3, "kill-master")
        logs.append((net.log, {k: dict(c.acked) for k, c in net.clients.items()}))
        net.close()
    assert logs[0] == logs[1]
