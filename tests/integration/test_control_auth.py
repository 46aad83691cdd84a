"""Only the supervisor and the members may send control messages (issue 8, hole 5).

Any process on the host can connect to a member's or the supervisor's socket. Without the
cluster secret (kept in the registry file, mode 0600) it can still use the map API, but it
cannot remove a member, change the cluster state, form, stop or grow the cluster.
"""

import stat

import msgpack
import psutil
import pytest

from grid import errors
from grid import protocol as p
from grid.client.registry import pid_alive
from grid.config import GridConfig
from tests.integration.raw_client import send_raw

pytestmark = pytest.mark.timeout(120)


def _raw(endpoint: str, headers: list[bytes], wait_ms: int = 500) -> list[dict]:
    """Send request headers from a fresh DEALER (a stray client); return the replies."""
    return send_raw(endpoint, [[header] for header in headers], wait_ms)


def _view(endpoint: str, cluster_name: str) -> dict:
    """The member's TABLE reply: anyone may ask for it (clients route with it)."""
    [view] = _raw(endpoint, [p.request(p.TABLE, 1, cluster_name)])
    assert view["ok"]
    return view


def _assert_auth_refusals(replies: list[dict], ops: list[str]) -> None:
    assert sorted(r["id"] for r in replies) == list(range(1, len(ops) + 1)), replies
    for reply in replies:
        op = ops[reply["id"] - 1]
        assert reply["ok"] is False and reply["code"] == p.AUTH, (op, reply)
        err = p.error_from_reply(reply)
        assert isinstance(err, errors.NotAuthorizedError) and not err.retryable
        assert op in str(err) and "map API" in str(err)


def test_a_stray_client_cannot_remove_a_member_or_change_the_cluster(cluster_factory):
    cluster = cluster_factory(members=3)
    name = cluster.cluster_name
    registry = cluster.registry
    members = registry["members"]
    master, follower = members[0]["endpoint"], members[2]["endpoint"]
    victim = members[1]["uuid"]
    before = _view(master, name)
    assert {m[0] for m in before["members"][1]} == {m["uuid"] for m in members}

    # A forged view without the victim, newer than the real one: a follower would adopt it.
    forged = dict(members=[before["members"][0] + 10,
                           [m for m in before["members"][1] if m[0] != victim]],
                  table=before["table"], state="ACTIVE")
    attempts = [
        (p.MEMBER_DIED, dict(uuid=victim)),
        (p.SET_STATE, dict(state="PASSIVE")),
        (p.FORM, {}),
        (p.PUBLISH, forged),
        (p.JOIN, dict(info=["u-stray", "member-9", "tcp://127.0.0.1:1", 1, False])),
        (p.HEARTBEAT, {"from": victim, "mv": 0, "stamp": 0, "endpoint": "tcp://127.0.0.1:1"}),
        (p.BACKUP, dict(ns="m", kind="put", parts=[[0, 1, 1]])),
        (p.FETCH_STATE, {}),
        (p.MEMBER_DIED, dict(uuid=victim, k="a guess")),  # a wrong secret is no secret
        (p.MEMBER_DIED, dict(uuid=victim, k="")),
        (p.SHUTDOWN, {}),
    ]
    ops = [op for op, _ in attempts]
    for endpoint in (master, follower):
        replies = _raw(endpoint, [p.request(op, i, name, **fields)
                                  for i, (op, fields) in enumerate(attempts, 1)])
        _assert_auth_refusals(replies, ops)

    # Nothing changed: every member runs, the member list and state are the same everywhere,
    # and the cluster serves writes.
    assert all(pid_alive(m["pid"]) for m in members)
    for m in members:
        view = _view(m["endpoint"], name)
        assert view["members"] == before["members"] and view["state"] == "ACTIVE"
    assert [m["uuid"] for m in cluster.registry["members"]] == [m["uuid"] for m in members]
    with cluster.connect() as client:
        m = client.get_map("after-stray")
        m.put_all({i: i for i in range(300)})
        assert m.get_all(range(300)) == {i: i for i in range(300)}
        assert client.cluster.is_safe()


def test_a_stray_client_cannot_fence_stop_or_grow_the_cluster(cluster_factory):
    cluster = cluster_factory(members=2)
    name = cluster.cluster_name
    registry = cluster.registry
    supervisor = registry["supervisor"]["endpoint"]
    master, victim = registry["members"]
    replies = _raw(supervisor, [
        p.request(p.STOP, 1, name),
        p.request(p.ADD_MEMBER, 2, name, k="a guess"),
        # FENCE names the master as its sender, as a member would (uuids are public): ignored.
        p.request(p.FENCE, 3, name, uuid=victim["uuid"], reason="stray", **{"from":
                                                                          master["uuid"]}),
    ], wait_ms=1500)
    _assert_auth_refusals(replies, [p.STOP, p.ADD_MEMBER])

    assert pid_alive(registry["supervisor"]["pid"])
    assert all(pid_alive(m["pid"]) for m in registry["members"])
    assert cluster.registry["state"] == "ready"
    assert [m["name"] for m in cluster.registry["members"]] == ["member-0", "member-1"]
    # The shmgrid command reads the secret from the registry: its commands still work, and
    # the member it adds is the first one added (the stray ADD_MEMBER started none).
    assert "added member-2" in cluster.cli("add-member").stdout
    with cluster.connect() as client:
        client.get_map("m").put("k", 1)
        assert client.get_map("m").get("k") == 1


def test_the_registry_file_keeps_the_secret_readable_by_its_owner_only(cluster_factory):
    cluster = cluster_factory(members=1, backup_count=0)
    mode = stat.S_IMODE(cluster.registry_path.stat().st_mode)
    assert mode == 0o600, oct(mode)
    secret = cluster.registry["config"]["cluster_secret"]
    assert len(secret) == 32 and int(secret, 16) >= 0
    # A command line is readable by every user: the secret is on none of ours.
    pids = [cluster.registry["supervisor"]["pid"]] + [m["pid"] for m in
                                                     cluster.registry["members"]]
    for pid in pids:
        assert secret not in " ".join(psutil.Process(pid).cmdline())


def test_a_configured_secret_is_used_and_kept_off_command_lines(cluster_factory,
                                                                 monkeypatch):
    secret = "configured-" + "5" * 21
    monkeypatch.setenv("SHMGRID_CLUSTER_SECRET", secret)
    cluster = cluster_factory(members=1, backup_count=0)
    assert cluster.registry["config"]["cluster_secret"] == secret
    supervisor = psutil.Process(cluster.registry["supervisor"]["pid"])
    assert secret not in " ".join(supervisor.cmdline())
    assert secret not in repr(GridConfig(cluster_secret=secret))
    [reply] = _raw(cluster.registry["members"][0]["endpoint"],
                   [p.request(p.SET_STATE, 1, cluster.cluster_name, state="ACTIVE", k=secret)])
    assert reply["ok"], reply


def test_a_second_cluster_gets_its_own_secret(cluster_factory):
    a = cluster_factory(members=1, backup_count=0)
    b = cluster_factory(members=1, backup_count=0)
    secret_a = a.registry["config"]["cluster_secret"]
    assert secret_a != b.registry["config"]["cluster_secret"]
    # One cluster's secret does not open another (same cluster name check passes: we use b's).
    [reply] = _raw(b.registry["members"][0]["endpoint"],
                   [p.request(p.SET_STATE, 1, b.cluster_name, state="PASSIVE", k=secret_a)])
    assert reply["code"] == p.AUTH


def test_an_auth_error_reply_raises_not_authorized_error():
    reply = msgpack.unpackb(p.reply_error(7, p.AUTH, "refused", op=p.MEMBER_DIED))
    err = p.error_from_reply(reply)
    assert isinstance(err, errors.NotAuthorizedError)
    assert isinstance(err, errors.GridError) and not err.retryable
    assert "member_died" in str(err) and "supervisor" in str(err) and "map API" in str(err)


def test_the_secret_check_accepts_only_the_configured_secret():
    assert p.has_secret({p.SECRET_FIELD: "s3cret"}, "s3cret")
    assert not p.has_secret({p.SECRET_FIELD: "s3cre"}, "s3cret")
    assert not p.has_secret({}, "s3cret")
    assert not p.has_secret({p.SECRET_FIELD: b"s3cret"}, "s3cret")
    assert not p.has_secret({p.SECRET_FIELD: "sécret"}, "s3cret")  # no TypeError
    # With no secret configured nothing passes, not even an empty secret.
    assert not p.has_secret({p.SECRET_FIELD: ""}, "")
    assert not p.has_secret({}, "")
