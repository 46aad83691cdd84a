"""Replica sync on real processes (issue 12, seed 004): backups that miss operations are found
by their version gaps and by the owners' anti-entropy rounds, and repaired; the repaired
replicas then carry every acknowledged write through a kill of their owners."""

from __future__ import annotations

import time

import pytest

from grid.client.registry import pid_alive
from tests.integration.test_failover import Writers, _assert_all_readable, _status, _wait
from workers.member import DROP_BACKUP_OPS_ENV

pytestmark = pytest.mark.timeout(240)

SYNC_INTERVAL_S = 1.0


def _quiet_and_repaired(cluster, timeout: float = 60) -> dict:
    """Wait until no backup is dirty and no sync is under way, over an anti-entropy round."""
    deadline = time.monotonic() + timeout
    calm_since = None
    while True:
        status = _status(cluster)
        members = status["members"]
        calm = all(not m.get("dirty") and not m.get("syncs_in_flight")
                   and not m.get("syncs_waiting") and not m.get("backup_backlog")
                   for m in members)
        now = time.monotonic()
        if not calm:
            calm_since = None
        elif calm_since is None:
            calm_since = now
        elif now - calm_since > 3 * SYNC_INTERVAL_S:  # a round and its grace found nothing
            return status
        assert now < deadline, f"replicas still repairing: {members}"
        time.sleep(0.2)


def _kill_all(cluster, names: list[str]) -> None:
    pids = [cluster.member(name)["pid"] for name in names]
    for name in names:
        cluster.cli("kill", name)
    _wait(lambda: not any(pid_alive(pid) for pid in pids), what="the kills")


def test_backup_operations_lost_on_purpose_are_repaired(cluster_factory, monkeypatch):
    """member-1 acknowledges every 7th backup operation without applying it (a debug switch,
    off by default). Its replicas are repaired, and then carry every acknowledged write when
    the other members, owners of those partitions, are killed."""
    monkeypatch.setenv(DROP_BACKUP_OPS_ENV, "member-1=7")
    cluster = cluster_factory(members=3, backup_count=2,
                              backup_sync_interval=SYNC_INTERVAL_S)
    with Writers(cluster) as writers:
        writers.wait_for(2000)
    assert not writers.failures, writers.failures
    status = _quiet_and_repaired(cluster)
    repaired = next(m for m in status["members"] if m["name"] == "member-1")
    assert repaired["synced"] > 0 and repaired["sync_entries"] > 0, repaired
    # member-1 alone is left: it holds every partition, its replicas now complete.
    _kill_all(cluster, ["member-0", "member-2"])
    _wait(lambda: _status(cluster)["members"][0].get("owned") == 271, timeout=60,
          what="member-1 to own every partition")
    _assert_all_readable(cluster, writers.acked)


def test_without_repair_the_lost_operations_would_be_lost(cluster_factory, monkeypatch):
    """The test above can fail: without the owners' anti-entropy rounds (one an hour), an
    operation lost last in its partition is never found (no later one shows the gap), and
    the same kills lose acknowledged writes."""
    monkeypatch.setenv(DROP_BACKUP_OPS_ENV, "member-1=7")
    cluster = cluster_factory(members=3, backup_count=2, backup_sync_interval=3600)
    with Writers(cluster) as writers:
        writers.wait_for(2000)
    _kill_all(cluster, ["member-0", "member-2"])
    _wait(lambda: _status(cluster)["members"][0].get("owned") == 271, timeout=60,
          what="member-1 to own every partition")
    with cluster.connect() as client:
        got = client.get_map("acked").get_all(list(writers.acked))
    lost = [k for k in writers.acked if got.get(k) != writers.acked[k]]
    assert lost, "no write was lost although member-1 dropped backup operations"


def test_a_paused_async_backup_catches_up_and_survives_its_owners(cluster_factory):
    """An asynchronous backup paused (SIGSTOP) for less than the heartbeat timeout while its
    owners take writes: it misses none (they wait in its socket), catches up when resumed,
    and is then a complete copy: the two other members are killed at once and nothing
    acknowledged is lost."""
    cluster = cluster_factory(members=3, backup_count=1, async_backup_count=1,
                              backup_sync_interval=SYNC_INTERVAL_S)
    victim = cluster.member("member-2")["pid"]
    with Writers(cluster) as writers:
        writers.wait_for(500)
        cluster.cli("kill", "member-2", "--signal", "STOP")
        try:
            time.sleep(3.0)  # heartbeat timeout is 10 s: it stays a member
        finally:
            cluster.cli("kill", "member-2", "--signal", "CONT")
        writers.wait_for(500)
    assert not writers.failures, writers.failures
    assert pid_alive(victim)
    status = _quiet_and_repaired(cluster)
    assert len(status["members"]) == 3 and status["safe"], status
    _kill_all(cluster, ["member-0", "member-1"])
    _wait(lambda: _status(cluster)["members"][0].get("owned") == 271, timeout=60,
          what="member-2 to own every partition")
    _assert_all_readable(cluster, writers.acked)


def test_status_shows_async_backups_and_replica_sync(cluster_factory):
    cluster = cluster_factory(members=3, backup_count=1, async_backup_count=1)
    status = _status(cluster)
    assert status["safe"], status
    # Every member holds every partition: owner, synchronous and asynchronous backup.
    assert all(m["owned"] + m["backups"] == 271 for m in status["members"]), status
    assert all(m["dirty"] == 0 and m["syncs_in_flight"] == 0 for m in status["members"])


@pytest.mark.parametrize("depth", [10, 0], ids=["merkle", "whole-fragments"])
def test_a_member_rejoining_in_stable_cluster_gets_only_what_changed(cluster_factory, tmp_path,
                                                                     depth, monkeypatch):
    """Seed 003: member-3 is killed in STABLE_CLUSTER, a tenth of the keys change while it is
    away, and it is started again from its files. The migrations that give its partitions
    back compare Merkle trees and move about that tenth of its entries, not all of them
    (with merkle_tree_depth 0, whole fragments: all of them); nothing is lost."""
    monkeypatch.setenv("SHMGRID_MERKLE_TREE_DEPTH", str(depth))
    keys = 20_000
    cluster = cluster_factory(members=4, data_dir=tmp_path)
    with cluster.connect() as client:
        m = client.get_map("acked")
        for start in range(0, keys, 1000):
            m.put_all({f"k{i}": 0 for i in range(start, start + 1000)})
        client.cluster.change_state("STABLE_CLUSTER")
    held = next(m for m in _status(cluster)["members"] if m["name"] == "member-3")
    share = keys * (held["owned"] + held["backups"]) // 271  # entries member-3 holds
    _kill_all(cluster, ["member-3"])
    _wait(lambda: len(_status(cluster)["members"]) == 3, what="member-3 removed")
    with cluster.connect() as client:
        client.get_map("acked").put_all({f"k{i}": 1 for i in range(0, keys, 10)})
    sent_before = sum(m["sent_entries"] for m in _status(cluster)["members"])
    cluster.cli("restart-member", "member-3")
    cluster.cli("wait-safe", "--timeout", "60", timeout=90)
    status = _status(cluster)
    sent = sum(m["sent_entries"] for m in status["members"]) - sent_before
    assert status["safe"] and len(status["members"]) == 4, status
    back = next(m for m in status["members"] if m["name"] == "member-3")
    assert back["owned"] + back["backups"] == held["owned"] + held["backups"], back
    if depth:
        assert 0 < sent < share // 4, (sent, share)  # a tenth changed, and whole leaves move
    else:
        assert sent >= share * 9 // 10, (sent, share)
    acked = {f"k{i}": 1 if i % 10 == 0 else 0 for i in range(keys)}
    _assert_all_readable(cluster, acked)
