"""The write path against real processes: an unanswered write is reported as indeterminate, a
resend is answered with the first outcome, and `status` shows partitions without a backup."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from grid import protocol as p
from grid.errors import IndeterminateOperationStateError
from grid.serialization import serialize_key, serialize_value

pytestmark = pytest.mark.timeout(120)


def _key_owned_by(client, member_name: str) -> str:
    owners = client.partition_owners()
    uuid = next(m.uuid for m in client.cluster.members if m.name == member_name)
    return next(f"k{i}" for i in range(100_000)
                if owners[client.partition_id(f"k{i}")] == uuid)


def test_a_write_to_a_hung_owner_is_indeterminate_not_failed(cluster_factory):
    """The owner takes the write and cannot answer: the client may not say it failed (it is
    applied once the owner runs again) nor that it succeeded."""
    cluster = cluster_factory(members=3, heartbeat_timeout=60)
    owner = cluster.member("member-1")
    with cluster.connect(invocation_timeout=2.0) as client:
        m = client.get_map("m")
        key = _key_owned_by(client, "member-1")
        m.put(key, "before")
        os.kill(owner["pid"], signal.SIGSTOP)
        try:
            with pytest.raises(IndeterminateOperationStateError, match="may or may not"):
                m.put(key, "during")
        finally:
            os.kill(owner["pid"], signal.SIGCONT)
        deadline = time.monotonic() + 10
        while m.get(key) != "during":  # it was applied after all, with its backup
            assert time.monotonic() < deadline, m.get(key)
            time.sleep(0.05)


def test_a_resent_put_returns_the_first_outcome(cluster_factory):
    """The same invocation sent twice (as the client does after a lost reply) is applied
    once, and both answers say what the first one saw."""
    cluster = cluster_factory(members=3)
    with cluster.connect() as client:
        m = client.get_map("m")
        m.put("k", 1)
        pid = client.partition_id("k")
        fields = {"ns": "m", "pid": pid, "iid": m._invoker.invocation_id()}
        frames = [serialize_key("k"), serialize_value(2)]
        answers = []
        for _ in range(2):
            m._invoker.invoke_partitions(p.PUT, [pid], lambda group: (fields, frames),
                                         lambda group, header, reply: answers.append(reply))
        assert answers == [[serialize_value(1)], [serialize_value(1)]]
        assert m.get("k") == 2


def test_a_resent_put_all_is_applied_once(cluster_factory):
    """A batch resent with its invocation id (its reply was lost) writes nothing again: a
    later write to one of its keys stays."""
    cluster = cluster_factory(members=3)
    with cluster.connect() as client:
        m = client.get_map("m")
        entries = {f"k{i}": i for i in range(20)}
        by_pid: dict[int, list[bytes]] = {}
        for key, value in entries.items():
            by_pid.setdefault(client.partition_id(key), []).extend(
                [serialize_key(key), serialize_value(value)])
        iid = m._invoker.invocation_id()

        def build(group: list[int]) -> tuple[dict, list]:
            items = [item for pid in group for item in by_pid[pid]]
            return {"ns": "m", "pids": group, "counts": [len(by_pid[pid]) // 2 for pid in group],
                    "iid": iid}, [p.pack_items(items)]

        m._invoker.invoke_partitions(p.PUT_ALL, list(by_pid), build, lambda *_: None)
        m.put("k3", "later")
        m._invoker.invoke_partitions(p.PUT_ALL, list(by_pid), build, lambda *_: None)
        assert m.get("k3") == "later"
        assert m.get_all(list(entries)) == {**entries, "k3": "later"}


def test_status_shows_partitions_without_a_backup(cluster_factory):
    cluster = cluster_factory(members=2, partition_count=31)
    before = json.loads(cluster.cli("status", "--json").stdout)
    assert before["unbacked"] == 0
    os.kill(cluster.member("member-1")["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        status = json.loads(cluster.cli("status", "--json").stdout)
        if len(status["members"]) == 1:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert status["unbacked"] == 31
    assert status["members"][0]["unbacked"] == 31
    assert status["members"][0]["backup_backlog"] == 0  # nothing waits for a backup
    text = cluster.cli("status").stdout
    assert "31 partitions have no backup" in text
