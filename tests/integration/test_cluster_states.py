"""Cluster states and lite member promotion on real processes (issue 10, seed 000): each
state's join, migration and operation rules; NO_MIGRATION through a kill; promotions under
writes, one member's share at a time; every promotion error."""

from __future__ import annotations

import json

import pytest

import grid
from grid.config import GridConfig
from grid.errors import (
    ClusterStateError,
    IllegalMemberStateError,
    StateChangeError,
    UnknownMemberError,
)
from tests.integration.test_failover import Writers, _assert_all_readable, _status, _wait
from tests.integration.test_migrations import _balanced, _kill, _wait_safe

pytestmark = pytest.mark.timeout(300)


def _state(cluster) -> str:
    return cluster.cli("state").stdout.strip()


def _holding(status: dict, name: str) -> tuple[int, int]:
    m = next(m for m in status["members"] if m["name"] == name)
    return m["owned"], m["backups"]


def test_the_state_command_and_the_client_api(cluster_factory):
    cluster = cluster_factory(members=3)
    assert _state(cluster) == "ACTIVE"
    out = cluster.cli("state", "frozen").stdout
    assert "from ACTIVE to FROZEN" in out
    with cluster.connect() as client:
        assert client.cluster.state == "FROZEN"
        assert client.cluster.change_state("FROZEN") == "FROZEN"  # already: nothing to do
        assert client.cluster.change_state("active") == "ACTIVE"
        with pytest.raises(ValueError, match="one of"):
            client.cluster.change_state("SLEEPY")
    assert json.loads(cluster.cli("state", "--json").stdout)["state"] == "ACTIVE"
    bad = cluster.cli("state", "SLEEPY", check=False)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_no_migration_holds_back_backups_and_rebalance_until_active(cluster_factory):
    cluster = cluster_factory(members=3)
    with Writers(cluster) as writers:
        writers.wait_for(200)
        cluster.cli("state", "NO_MIGRATION")
        cluster.cli("add-member")  # joins, but takes nothing
        _kill(cluster, "member-1")  # its backups are not re-created; promotions go on
        writers.wait_for(200)  # writes to the dead owner's partitions resume
        status = _status(cluster)
        assert status["state"] == "NO_MIGRATION" and not status["safe"], status
        assert status["short_of_backups"] > 0
        assert _holding(status, "member-3") == (0, 0)
        assert not status["migrations"].get("active")
        text = cluster.cli("status").stdout
        assert "Held back" in text and "member-3" in text
        cluster.cli("state", "ACTIVE")
        status = _wait_safe(cluster)
        writers.wait_for(200)
    assert not writers.failures, writers.failures
    assert status["safe"] and _balanced(status), status
    assert _holding(status, "member-3")[0] > 0
    _assert_all_readable(cluster, writers.acked)


def test_frozen_takes_no_member_and_serves_everything(cluster_factory):
    cluster = cluster_factory(members=3)
    cluster.cli("state", "FROZEN")
    refused = cluster.cli("add-member", check=False)
    assert refused.returncode == 1 and "FROZEN" in refused.stderr, refused.stderr
    assert len(cluster.registry["members"]) == 3
    with cluster.connect() as client:
        m = client.get_map("frozen")
        m.set("k", 1)
        m.put_all({"a": 1, "b": 2})
        assert m.get("k") == 1 and m.get_all(["a", "b"]) == {"a": 1, "b": 2}
    cluster.cli("state", "ACTIVE")
    cluster.cli("add-member")
    assert _wait_safe(cluster)["safe"]


def test_passive_serves_reads_and_refuses_every_mutation(cluster_factory):
    cluster = cluster_factory(members=3)
    with cluster.connect() as client:
        m = client.get_map("passive")
        m.set("k", 1)
        client.cluster.change_state("PASSIVE")
        assert m.get("k") == 1 and m.get_all(["k"]) == {"k": 1} and m.size() == 1
        for mutate in (lambda: m.set("k", 2), lambda: m.put_all({"x": 1}),
                       lambda: m.remove("k"), lambda: m.clear()):
            with pytest.raises(ClusterStateError, match="PASSIVE"):
                mutate()
        assert m.get("k") == 1
        client.cluster.change_state("ACTIVE")
        m.set("k", 2)
        assert m.get("k") == 2


def test_a_change_other_than_to_passive_is_refused_while_migrations_run(cluster_factory,
                                                                        monkeypatch):
    # Slow migrations (1 KiB chunks, one at a time) so that the change meets them.
    monkeypatch.setenv("SHMGRID_MIGRATION_CHUNK_BYTES", "1024")
    monkeypatch.setenv("SHMGRID_MAX_PARALLEL_MIGRATIONS", "1")
    cluster = cluster_factory(members=3)
    with cluster.connect() as client:
        client.get_map("load").put_all({i: b"x" * 1000 for i in range(5000)})
        cluster.cli("add-member")
        _wait(lambda: _status(cluster)["migrations"].get("active"), what="migrations")
        with pytest.raises(StateChangeError, match="migrations are in flight"):
            client.cluster.change_state("FROZEN")
        assert client.cluster.state == "ACTIVE"
        # To PASSIVE it waits for them instead, then holds.
        assert client.cluster.change_state("PASSIVE", timeout=120) == "PASSIVE"
        assert client.cluster.change_state("ACTIVE") == "ACTIVE"


def test_lite_members_take_nothing_until_promoted_one_by_one(cluster_factory):
    """The seed's scenario: under load, three lite members join (no data moves); promoted
    one by one, each promotion moves only that member's share."""
    cluster = cluster_factory(members=3)
    with Writers(cluster) as writers:
        writers.wait_for(300)
        before = _status(cluster)
        for _ in range(3):
            assert "lite member" in cluster.cli("add-member", "--lite").stdout
        status = _status(cluster)
        for name in ("member-3", "member-4", "member-5"):
            assert _holding(status, name) == (0, 0)
        assert status["safe"]
        for data in ("member-0", "member-1", "member-2"):
            assert _holding(status, data) == _holding(before, data), "no data moved"
        for n, name in enumerate(("member-3", "member-4", "member-5")):
            out = cluster.cli("promote", name).stdout
            assert "data member now" in out
            status = _wait_safe(cluster)
            writers.wait_for(100)
            assert _holding(status, name)[0] > 0, status
            for later in ("member-3", "member-4", "member-5")[n + 1:]:
                assert _holding(status, later) == (0, 0), "only the promoted one moved"
            data = [m for m in status["members"] if not m["lite"]]
            assert len(data) == 4 + n
            owned = [m["owned"] for m in data]
            assert max(owned) - min(owned) <= 1, status
    assert not writers.failures, writers.failures
    _assert_all_readable(cluster, writers.acked)


def test_every_promotion_error_is_explicit(cluster_factory):
    cluster = cluster_factory(members=3)
    cluster.cli("add-member", "--lite")
    lite = cluster.member("member-3")
    with cluster.connect() as client:
        with pytest.raises(IllegalMemberStateError, match="data member already"):
            client.cluster.promote_member("member-1")
        with pytest.raises(UnknownMemberError):
            client.cluster.promote_member("member-9")
        with pytest.raises(ValueError, match="by address"):
            client.cluster.promote_local_member()
        client.cluster.change_state("FROZEN")
        with pytest.raises(ClusterStateError, match="FROZEN"):
            client.cluster.promote_member("member-3")
        client.cluster.change_state("ACTIVE")
    failed = cluster.cli("promote", "member-1", check=False)
    assert failed.returncode == 1 and "data member already" in failed.stderr
    # promote_local_member: a client attached to the lite member itself.
    config = GridConfig(cluster_name=cluster.cluster_name,
                        cluster_secret=cluster.registry["config"]["cluster_secret"])
    with grid.connect(lite["endpoint"], config=config) as local:
        members = local.cluster.promote_local_member()
    assert not next(m for m in members if m.name == "member-3").lite
    _wait(lambda: _holding(_status(cluster), "member-3")[0] > 0, what="member-3's share")
    with cluster.connect() as client, pytest.raises(IllegalMemberStateError):
        client.cluster.promote_member("member-3")  # a second time: already data
