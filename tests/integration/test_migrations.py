"""Partitions move in a running cluster (issue 9): lost backups are re-created after a kill, an
added member takes its share, a member leaves gracefully; under writes, with every
acknowledged write checked afterwards."""

from __future__ import annotations

import json

import pytest

from grid.client.registry import pid_alive
from tests.integration.test_failover import Writers, _assert_all_readable, _wait

pytestmark = pytest.mark.timeout(300)


def _status(cluster) -> dict:
    return json.loads(cluster.cli("status", "--json").stdout)


def _wait_safe(cluster, timeout: float = 60) -> dict:
    cluster.cli("wait-safe", "--timeout", str(timeout), timeout=timeout + 30)
    return _status(cluster)


def _balanced(status: dict) -> bool:
    data = [m for m in status["members"] if not m.get("lite")]
    owned = [m["owned"] for m in data]
    backups = [m["backups"] for m in data]
    return max(owned) - min(owned) <= 1 and max(backups) - min(backups) <= 1


def _kill(cluster, name: str) -> None:
    pid = cluster.member(name)["pid"]
    cluster.cli("kill", name)
    _wait(lambda: not pid_alive(pid), what=f"{name} to be gone")


@pytest.mark.parametrize("rounds", [3])
def test_kill_then_safe_then_kill_again_loses_nothing(cluster_factory, rounds):
    """Each kill's lost backups are re-created before the next kill, so a second (and
    third) kill of the member that held the only copy loses nothing acknowledged."""
    cluster = cluster_factory(members=3 + rounds)
    with Writers(cluster) as writers:
        writers.wait_for(300)
        for n in range(rounds):
            victim = sorted(m["name"] for m in cluster.registry["members"])[-1 - n % 2]
            _kill(cluster, victim)
            writers.wait_for(200)
            status = _wait_safe(cluster)
            assert status["safe"] and status["unbacked"] == 0, status
    assert not writers.failures, writers.failures
    _assert_all_readable(cluster, writers.acked)
    assert _balanced(_status(cluster))


def test_an_added_member_takes_its_share_under_writes(cluster_factory):
    cluster = cluster_factory(members=3)
    with Writers(cluster) as writers:
        writers.wait_for(500)
        cluster.cli("add-member")
        status = _wait_safe(cluster)
        writers.wait_for(300)
    assert not writers.failures, writers.failures
    assert len(status["members"]) == 4 and _balanced(status), status
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
    assert len(status["members"]) == 4 and status["safe"], status
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
    assert len(status["members"]) == 3 and status["safe"] and _balanced(status), status
    _assert_all_readable(cluster, writers.acked)


def test_a_graceful_leave_under_writes_moves_everything_first(cluster_factory):
    cluster = cluster_factory(members=4)
    pid = cluster.member("member-2")["pid"]
    with Writers(cluster) as writers:
        writers.wait_for(300)
        cluster.cli("stop-member", "member-2", "--timeout", "120", timeout=150)
        assert not pid_alive(pid)
        writers.wait_for(300)
    assert not writers.failures, writers.failures
    status = _status(cluster)
    assert {m["name"] for m in status["members"]} == {"member-0", "member-1", "member-3"}
    assert status["safe"] and _balanced(status), status
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
