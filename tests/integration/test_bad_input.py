"""Garbage on a member's socket, refused states and time-outs: clear errors, nothing broken."""

import os
import signal

import msgpack
import pytest

from grid import errors
from grid import protocol as p
from grid.client.registry import pid_alive
from tests.integration.raw_client import send_raw

pytestmark = pytest.mark.timeout(120)


def _header(**fields) -> bytes:
    return msgpack.packb(fields)


GARBAGE = [
    [os.urandom(64)],
    [b"\xc1\xc1\xc1"],
    [msgpack.packb([1, 2, 3])],
    [_header(id=1)],
    [_header(op="no_such_op", id=2)],
    [_header(op=7, id=3)],
    [_header(op="put", id=4, ns="m", pid=0)],  # no key frame
    [_header(op="put", id=5, ns="m", pid=99999), b"k", b"v"],
    [_header(op="get", id=6, ns=None, pid=0), b"k"],
    [_header(op="put", id=7, ns="m", pid="x"), b"k", b"v"],
    [_header(op="put_all", id=8, ns="m", pids=[0, 1], counts=[5]), b"\x90"],
    [_header(op="put_all", id=9, ns="m", pids=[0], counts=[1]), b"not msgpack \xc1"],
    [_header(op="get_all", id=10, ns="m", pids="all"), msgpack.packb([b"k"])],
    [_header(op="backup", id=11, ns="m", kind="put", parts=[[0, "v", 1]]), b"\x91\xc4\x01k"],
    [_header(op="backup", id=12, ns="m", kind="zap", parts=None), b""],
    [_header(op="join", id=13, info=["x"])],
    [_header(op="publish", id=14, members=[1, 2], table={"nope": 1})],
    [_header(op="member_died", id=15)],
    [_header(op="entries", id=16, ns="m", pids=[-1])],
    [_header(op="set_state", id=17, state="DANCING")],
    [_header(op="replace_contents", id=18, ns="m", target=5, pids=[0])],
    [_header(op="get", id=19, c="other-cluster", ns="m", pid=0), b"k"],
    [_header(op="get_all", id=20, ns="m", pids=[-1]), msgpack.packb([b"k"])],
    [_header(op="get_all", id=21, ns="m", pids=["1"]), msgpack.packb([b"k"])],
    [_header(op="get_all", id=22, ns="m", pids=[99999]), msgpack.packb([b"k"])],
    [_header(op="get_all", id=23, ns="m", pids=[0, 0]), msgpack.packb([b"k"])],
    [_header(op="put_all", id=24, ns="m", pids=[1, 0], counts=[1, 1]),
     msgpack.packb([b"k", b"v"])],
    [_header(op="get_all", id=25, ns="m", pids=[True]), msgpack.packb([b"k"])],
    [_header(op="get_all", id=26, ns="m", pids=[1, True]), msgpack.packb([b"k", b"j"])],
    [_header(op="put_all", id=27, ns="m", pids=[2, 2], counts=[1, 1]),
     msgpack.packb([b"k", b"v", b"k2", b"v2"])],
    [_header(op="get_all", id=28, ns="m", pids=[]), msgpack.packb([b"k"])],
    [_header(op="get_all", id=29, ns="m", pids=[0, 1]), msgpack.packb([b"k", b"j", b"i"])],
    # records (workers/record_block.py): a table that says more than the frame holds, and
    # a record whose header differs from the table
    [_header(op="put_all", id=30, ns="m", pids=[0], counts=[1], laid_out=True), b"\x01\0"],
    [_header(op="put_all", id=31, ns="m", pids=[0], counts=[1], laid_out=True),
     b"\x01\0\0\0\x01\0\0\0" + b"\x02\0\0\0\0\0\0\0kv"],
]


def test_member_survives_garbage(grid_cluster):
    members = grid_cluster.registry["members"]
    for member in members:
        replies = send_raw(member["endpoint"], GARBAGE)
        assert replies, "malformed requests with an id get an error reply"
        assert all(r.get("ok") is False for r in replies), replies
        assert {r.get("code") for r in replies} <= {p.PROTOCOL, p.WRONG_CLUSTER,
                                                    p.WRONG_TARGET, p.NOT_READY, p.AUTH}
    assert all(pid_alive(m["pid"]) for m in members)
    with grid_cluster.connect() as client:
        m = client.get_map("after-garbage")
        m.put_all({i: i for i in range(500)})
        assert m.get_all(range(500)) == {i: i for i in range(500)}
        assert client.cluster.is_safe()


def test_oversized_message_drops_the_sender_not_the_member(cluster_factory, monkeypatch):
    monkeypatch.setenv("SHMGRID_MAX_MESSAGE_BYTES", str(1 << 20))
    cluster = cluster_factory(members=1, backup_count=0)
    member = cluster.registry["members"][0]
    replies = send_raw(member["endpoint"], [[_header(op="get", id=1, ns="m", pid=0),
                                         b"x" * (2 << 20)]], wait_ms=500)
    assert replies == []
    assert pid_alive(member["pid"])
    with cluster.connect() as client:
        client.get_map("m").put("k", "v")
        assert client.get_map("m").get("k") == "v"


def test_passive_cluster_refuses_writes_but_serves_reads(grid_cluster):
    master = grid_cluster.registry["members"][0]["endpoint"]
    secret = grid_cluster.registry["config"]["cluster_secret"]  # as the supervisor sends it
    with grid_cluster.connect() as client:
        m = client.get_map("passive")
        m.put("k", 1)
        try:
            [ok] = send_raw(master, [[p.request(p.SET_STATE, 1, grid_cluster.cluster_name,
                                            state="PASSIVE", k=secret)]])
            assert ok["ok"]
            client.cluster.refresh()
            for _ in range(50):  # the publish reaches the owner within a moment
                try:
                    m.put("k", 2)
                except errors.ClusterStateError as exc:
                    assert "PASSIVE" in str(exc)
                    break
            else:
                pytest.fail("writes were not refused in PASSIVE")
            assert m.get("k") in (1, 2)
        finally:
            send_raw(master, [[p.request(p.SET_STATE, 2, grid_cluster.cluster_name,
                                     state="ACTIVE", k=secret)]])
        for _ in range(50):
            try:
                m.put("k", 3)
                break
            except errors.ClusterStateError:
                continue
        assert m.get("k") == 3


def test_lite_member_refuses_data_operations(cluster_factory):
    cluster = cluster_factory(members=1, backup_count=0)
    cluster.cli("add-member", "--lite")
    lite = cluster.member("member-1")
    with cluster.connect() as client:
        reply = client._invoker.call(lite["endpoint"], p.GET, {"ns": "m", "pid": 0}, [b"k"])
        err = p.error_from_reply(reply[0])
        assert isinstance(err, errors.MemberIsLiteError)
        assert "lite member" in str(err)
        client.get_map("m").put("k", 1)  # routed to the data member
        assert client.get_map("m").get("k") == 1


def test_operation_timeout_names_the_operation_and_partition(cluster_factory):
    cluster = cluster_factory(members=2)
    owner_pid = cluster.member("member-1")["pid"]
    with cluster.connect(invocation_timeout=1.5) as client:
        owners = client.partition_owners()
        uuid = cluster.member("member-1")["uuid"]
        key = next(k for k in range(1000) if owners[client.partition_id(k)] == uuid)
        os.kill(owner_pid, signal.SIGSTOP)
        try:
            with pytest.raises(errors.OperationTimeoutError) as info:
                client.get_map("m").get(key)
            assert "get" in str(info.value)
            assert f"partition {client.partition_id(key)}" in str(info.value)
        finally:
            os.kill(owner_pid, signal.SIGCONT)


def test_put_all_with_an_oversized_entry_applies_nothing(cluster_factory, monkeypatch):
    """A refusal half way through a batch would leave the partitions before it written on the
    owner and on no backup: the whole batch is refused before anything is applied."""
    monkeypatch.setenv("SHMGRID_MAX_VALUE_BYTES", "1000")
    cluster = cluster_factory(members=1, backup_count=0)
    member = cluster.registry["members"][0]
    ok_key, big_key = msgpack.packb("fits"), msgpack.packb("too big")
    items = [ok_key, msgpack.packb("v"), big_key, msgpack.packb("x" * 2000)]
    [reply] = send_raw(member["endpoint"], [[
        p.request(p.PUT_ALL, 1, cluster.cluster_name, ns="m", pids=[3, 4], counts=[1, 1]),
        p.pack_items(items)]])
    assert reply["ok"] is False and reply["code"] == p.TOO_LARGE
    with cluster.connect() as client:
        assert client.get_map("m").size() == 0
