"""Partitions move in a running cluster (issue 9): lost backups are re-created after a kill, an
added member takes its share, a member leaves gracefully; under writes, with every
acknowledged write checked afterwards."""

from __future__ import annotations

import pytest

from grid.client.registry import pid_alive
from tests.integration.test_failover import Writers, _assert_all_readable, _status, _wait
from workers.member import DIE_ON_COMMIT_ENV

pytestmark = pytest.mark.timeout(300)


def _wait_safe(cluster, timeout: float = 60) -> dict:
    cluster.cli("wait-safe", "--timeout", str(timeout), timeout=timeout + 30)
    return _status(cluster)


def _balanced(status: dict) -> bool:
    data = [m for m in status["members"] if not m.get("lite")]
    owned = [m["owned"] for m in data]
    backups = [m["backups"] for m in data]
    return max(owned) - min(owned) <= 1 and max(backups) - min(backups) <= 1


def _brief(status: dict) -> dict:
    """What a failed assertion on safety and balance needs to show, short enough that a
    test report does not cut it."""
    return {"safe": status["safe"], "unbacked": status["unbacked"],
            "short_of_backups": status["short_of_backups"],
            "migrations": status["migrations"],
            "members": [(m["name"], m.get("owned"), m.get("backups"))
                        for m in status["members"]]}


def _kill(cluster, name: str) -> None:
    pid = cluster.member(name)["pid"]
    cluster.cli("kill", name)
    _wait(lambda: not pid_alive(pid), what=f"{name} to be gone")


def _kill_rounds(cluster, rounds: int) -> None:
    """Each round kills a member, waits until its lost backups are re-created, and adds a
    member back: a later kill of the member that held the only copy loses nothing."""
    with Writers(cluster) as writers:
        writers.wait_for(300)
        for n in range(rounds):
            names = sorted(m["name"] for m in cluster.registry["members"])
            _kill(cluster, names[n % len(names)])
            writers.wait_for(100)
            status = _wait_safe(cluster)
            assert status["safe"] and status["unbacked"] == 0, _brief(status)
            cluster.cli("add-member")
            _wait_safe(cluster)
    assert not writers.failures, writers.failures
    _assert_all_readable(cluster, writers.acked)
    assert _balanced(_status(cluster))


def test_kill_then_safe_then_kill_again_loses_nothing(cluster_factory):
    _kill_rounds(cluster_factory(members=3), rounds=3)


def _backups_of(cluster) -> dict[str, set[str]]:
    """Each owner's backup members, from a client's table."""
    backups_of: dict[str, set[str]] = {}
    with cluster.connect() as client:
        for row in client.partition_replicas().values():
            backups_of.setdefault(row[0], set()).add(row[1])
    return backups_of


def test_paired_backups_follow_their_owners_and_lose_nothing_through_kills(cluster_factory):
    """With the default ``backup_placement = "paired"`` each owner's partitions are backed up
    on one member (the next in a ring of the members): a batch's part goes to one backup. Kills,
    safety and added members go as with spread backups, lose nothing, and leave the
    backups paired again."""
    cluster = cluster_factory(members=3)
    backups_of = _backups_of(cluster)
    assert len(backups_of) == 3 and all(len(b) == 1 for b in backups_of.values()), backups_of
    _kill_rounds(cluster, rounds=2)
    backups_of = _backups_of(cluster)
    assert len(backups_of) == 3 and all(len(b) == 1 for b in backups_of.values()), backups_of


@pytest.mark.soak
@pytest.mark.timeout(1200)
def test_twenty_rounds_of_kill_safe_add_lose_nothing(cluster_factory):
    _kill_rounds(cluster_factory(members=3), rounds=20)


def test_an_added_member_takes_its_share_under_writes(cluster_factory):
    cluster = cluster_factory(members=3)
    with Writers(cluster) as writers:
        writers.wait_for(500)
        cluster.cli("add-member")
        status = _wait_safe(cluster)
        writers.wait_for(300)
    assert not writers.failures, writers.failures
    assert len(status["members"]) == 4 and _balanced(status), _brief(status)
    assert min(m["owned"] for m in status["members"]) >= 271 // 4
    _assert_all_readable(cluster, writers.acked)


def test_members_added_and_one_killed_while_migrations_run(cluster_factory):
    """The reference's issue 5444 scenario: two members join, and while their migrations run
    a member is killed, all under writes; nothing acknowledged is lost."""
    cluster = cluster_factory(members=3)
    with Writers(cluster) as writers:
        writers.wait_for(300)
        cluster.cli("add-member")
        cluster.cli("add-member")
        _kill(cluster, "member-1")
        status = _wait_safe(cluster)
        writers.wait_for(300)
    assert not writers.failures, writers.failures
    assert len(status["members"]) == 4 and status["safe"], _brief(status)
    _assert_all_readable(cluster, writers.acked)


def test_the_master_killed_while_migrations_run(cluster_factory):
    cluster = cluster_factory(members=3)
    with Writers(cluster) as writers:
        writers.wait_for(300)
        cluster.cli("add-member")
        _kill(cluster, "member-0")
        status = _wait_safe(cluster)
        writers.wait_for(300)
    assert not writers.failures, writers.failures
    assert len(status["members"]) == 3 and status["safe"] and _balanced(status), _brief(status)
    _assert_all_readable(cluster, writers.acked)


def test_the_destination_killed_during_a_commit(cluster_factory, monkeypatch):
    """The added member dies on its first commit, after taking the step and before its
    answer leaves: the master fails the migration with the version raised past it, and
    nothing acknowledged is lost."""
    monkeypatch.setenv(DIE_ON_COMMIT_ENV, "member-3")
    cluster = cluster_factory(members=3)
    with Writers(cluster) as writers:
        writers.wait_for(300)
        cluster.cli("add-member")

        def died() -> bool:
            listed = [m for m in cluster.registry["members"] if m["name"] == "member-3"]
            return not listed or not pid_alive(listed[0]["pid"])

        _wait(died, what="member-3 to die on a commit")
        status = _wait_safe(cluster)
        writers.wait_for(300)
    assert not writers.failures, writers.failures
    assert {m["name"] for m in status["members"]} == {"member-0", "member-1", "member-2"}
    assert status["safe"] and _balanced(status), _brief(status)
    _assert_all_readable(cluster, writers.acked)


def test_a_graceful_leave_under_writes_moves_everything_first(cluster_factory):
    """The leaving member goes once it holds nothing: no partition is short of a backup when
    it has gone. The rest of the plan (evening out the staying members) may still run then:
    the removal makes the master plan it again, so safety and balance are waited for."""
    cluster = cluster_factory(members=4)
    pid = cluster.member("member-2")["pid"]
    with Writers(cluster) as writers:
        writers.wait_for(300)
        cluster.cli("stop-member", "member-2", "--timeout", "120", timeout=150)
        assert not pid_alive(pid)
        status = _status(cluster)
        assert status["unbacked"] == 0 and status["short_of_backups"] == 0, _brief(status)
        writers.wait_for(300)
    assert not writers.failures, writers.failures
    status = _wait_safe(cluster)
    assert {m["name"] for m in status["members"]} == {"member-0", "member-1", "member-3"}
    assert status["safe"] and _balanced(status), _brief(status)
    _assert_all_readable(cluster, writers.acked)


def test_the_master_leaves_gracefully(cluster_factory):
    cluster = cluster_factory(members=3)
    with Writers(cluster) as writers:
        writers.wait_for(300)
        cluster.cli("stop-member", "member-0", "--timeout", "120", timeout=150)
        status = _wait_safe(cluster)
        writers.wait_for(200)
    assert not writers.failures, writers.failures
    assert {m["name"] for m in status["members"]} == {"member-1", "member-2"}, status
    assert sum(bool(m["master"]) for m in status["members"]) == 1
    _assert_all_readable(cluster, writers.acked)


def test_listeners_hear_migrations_and_lost_partitions(cluster_factory):
    cluster = cluster_factory(members=3, backup_count=0, partition_count=31)
    migration_events: list[dict] = []
    lost: list[dict] = []
    with cluster.connect() as client:
        client.cluster.add_migration_listener(migration_events.append)
        client.cluster.add_partition_lost_listener(lost.append)
        client.get_map("m").put_all({i: i for i in range(300)})
        cluster.cli("add-member")
        _wait(lambda: any(e["type"] == "migration_finished" for e in migration_events),
              what="a migration plan to finish")
        started = next(e for e in migration_events if e["type"] == "migration_started")
        moves = [e for e in migration_events if e["type"] == "replica_migration"]
        assert started["planned"] == len(moves) > 0
        assert all(e["success"] and e["destination"] for e in moves)
        victim = next(m for m in _status(cluster)["members"] if m["name"] == "member-1")
        _kill(cluster, "member-1")
        _wait(lambda: len(lost) == victim["owned"], what="partition-lost events")
    assert all(e["lost_replicas"] == 1 for e in lost)
    assert _status(cluster)["migrations"]["lost_partitions"] == victim["owned"]
