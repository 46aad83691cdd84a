"""The write path's guarantees, each driven to its edge on the simulated network (issue 8):
a failed backup send is sent again, never taken for an acknowledgement; a follower that stops
hearing the master follows it again; a write a backup cannot take yet waits, and nobody reads
it before it is durable; a resent write returns its first outcome; a removed owner with no
backup acknowledges nothing, and a removed owner answers no read; replacing a map's contents
moves both maps' replica versions; a replica sync that takes a write away takes its invocation
record too, and one that brings a write brings its record."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from grid import protocol as p
from grid.cluster.state import ClusterState
from grid.serialization import partition_id_of, serialize_key, serialize_value
from tests.cluster.sim import SimNetwork, SimNode, check_converged, replicas_differing
from tests.cluster.test_simulation import TIMEOUT_S
from tests.workers.test_record_block import frame_of
from workers.backup_parts import pack_parts

pytestmark = pytest.mark.timeout(60)


class Probe:
    """A client that sends one request at a time by hand and keeps every reply."""

    def __init__(self, net: SimNetwork, name: str = "probe") -> None:
        self.net = net
        self.ident = name.encode()
        self.ids = itertools.count(1)
        self.replies: dict[int, list[tuple[dict[str, Any], list[bytes]]]] = {}
        net.clients[self.ident] = self

    def send(self, node: SimNode, op: str, frames: list[bytes], **fields: Any) -> int:
        rid = next(self.ids)
        self.replies[rid] = []
        head = p.request(op, rid, self.net.config.cluster_name, **fields)
        self.net.send(self.ident, node.info.endpoint,
                      lambda: node.deliver(self.ident, head, list(frames)))
        return rid

    def on_reply(self, frames: list[bytes]) -> None:
        header = p.unpack_header(frames[0])
        self.replies.setdefault(header["id"], []).append((header, frames[1:]))

    def answer(self, rid: int) -> tuple[dict[str, Any], list[bytes]] | None:
        replies = self.replies.get(rid)
        return replies[0] if replies else None

    def value(self, rid: int) -> bytes | None:
        header, frames = self.answer(rid)
        assert header["ok"], header
        return frames[0] if frames else None


def key_where(net: SimNetwork, accept) -> tuple[str, int]:
    """A key whose partition's replicas (in the master's table) satisfy ``accept``."""
    table = net.master().cluster.table
    for i in range(10_000):
        key = f"k{i}"
        pid = partition_id_of(serialize_key(key), table.partition_count)
        if accept(table.replicas(pid)):
            return key, pid
    raise AssertionError("no such key")


def node_of(net: SimNetwork, uuid: str) -> SimNode:
    node = net.by_uuid(uuid)
    assert node is not None
    return node


def owner_of(net: SimNetwork, pid: int) -> SimNode:
    return node_of(net, net.master().cluster.table.owner(pid))


def test_a_backup_send_that_fails_is_sent_again_never_taken_for_an_ack(make_cluster):
    net = make_cluster(seed=11, backup_count=1, nodes=3)
    key, pid = key_where(net, lambda r: r[1] is not None)
    owner, backup = owner_of(net, pid), node_of(net, net.master().cluster.table.replicas(pid)[1])
    probe = Probe(net)
    net.failing_links.add((owner.info.uuid.encode(), backup.info.endpoint))
    rid = probe.send(owner, p.PUT, [serialize_key(key), serialize_value(1)], ns="m", pid=pid,
                     iid="w1")
    net.run_until(net.time + 0.5)
    assert probe.answer(rid) is None, "acknowledged while the backup never got the write"
    net.failing_links.clear()
    net.run_until(net.time + 2.0)  # the owner sends it again
    assert probe.answer(rid) is not None and probe.answer(rid)[0]["ok"]
    assert backup.store.get(pid, "m", serialize_key(key)) == serialize_value(1)
    net.kill(owner, "test")
    net.run_until(net.time + 3 * TIMEOUT_S)
    assert owner_of(net, pid) is backup
    assert backup.store.get(pid, "m", serialize_key(key)) == serialize_value(1)


def test_a_follower_that_stopped_hearing_the_master_follows_its_next_change(make_cluster):
    net = make_cluster(seed=12, backup_count=1, nodes=4)
    master = net.master()
    follower = node_of(net, master.cluster.members.uuids[2])  # not next in line
    net.slow_link(master.info.uuid.encode(), follower.info.endpoint, seconds=3.0,
                  extra=1.5 * TIMEOUT_S)
    net.run_until(net.time + 3.0 + 3 * TIMEOUT_S)
    other = node_of(net, master.cluster.members.uuids[3])
    net.kill(other, "test: the master's next change")
    net.run_until(net.time + 4 * TIMEOUT_S)
    assert follower.alive, net.log
    assert check_converged(net) == [], net.log
    assert follower.info.uuid in master.cluster.members
    assert net.violations == []


def test_a_write_the_backup_cannot_take_yet_waits_and_nobody_reads_it_before(make_cluster):
    """A promotion: the new owner writes to a backup that has not heard of it yet. The
    backup must hold the write until its table catches up (not refuse it while the owner
    keeps and serves it); a read meanwhile waits, and the value survives the new owner."""
    net = make_cluster(seed=13, backup_count=2, nodes=4)
    master = net.master()
    # The master is no replica: its publish to the late backup and the new owner's backup
    # operations travel on different links.
    key, pid = key_where(net, lambda r: master.info.uuid not in r and r[2])
    table = master.cluster.table
    first_owner = owner_of(net, pid)
    new_owner, late = node_of(net, table.replicas(pid)[1]), node_of(net, table.replicas(pid)[2])
    net.slow_link(master.info.uuid.encode(), late.info.endpoint, seconds=1.0, extra=0.8)
    net.kill(first_owner, "test")
    while master.cluster.table.owner(pid) != new_owner.info.uuid:
        net.run_until(net.time + 0.01)
    net.run_until(net.time + 0.05)  # the new owner has its table; the late backup has not
    assert late.cluster.table.owner(pid) == first_owner.info.uuid
    probe = Probe(net)
    write = probe.send(new_owner, p.PUT, [serialize_key(key), serialize_value(7)], ns="m",
                       pid=pid, iid="w7")
    net.run_until(net.time + 0.1)
    read = probe.send(new_owner, p.GET, [serialize_key(key)], ns="m", pid=pid)
    net.run_until(net.time + 0.1)
    assert probe.answer(write) is None, "answered before the late backup applied it"
    assert probe.answer(read) is None, "a read saw a write that is not durable yet"
    net.run_until(net.time + 2.0)
    answer = probe.answer(write)
    assert answer is not None and answer[0]["ok"], answer
    assert probe.value(read) == serialize_value(7)
    assert late.store.get(pid, "m", serialize_key(key)) == serialize_value(7)
    net.kill(new_owner, "test")
    net.run_until(net.time + 3 * TIMEOUT_S)
    again = probe.send(owner_of(net, pid), p.GET, [serialize_key(key)], ns="m", pid=pid)
    net.run_until(net.time + 0.5)
    assert probe.value(again) == serialize_value(7)
    assert net.violations == []


def test_a_resent_write_returns_its_first_outcome_also_from_a_new_owner(make_cluster):
    net = make_cluster(seed=14, backup_count=1, nodes=3)
    key, pid = key_where(net, lambda r: r[1] is not None)
    owner, probe = owner_of(net, pid), Probe(net)
    k = serialize_key(key)

    def call(node: SimNode, op: str, iid: str, *value: int) -> bytes | None:
        rid = probe.send(node, op, [k, *map(serialize_value, value)], ns="m", pid=pid, iid=iid)
        net.run_until(net.time + 0.2)
        return probe.value(rid)

    assert call(owner, p.PUT, "a", 1) is None
    assert call(owner, p.PUT, "b", 2) == serialize_value(1)
    assert call(owner, p.PUT, "b", 2) == serialize_value(1), "a resent put returned itself"
    assert call(owner, p.REMOVE, "c") == serialize_value(2)
    assert call(owner, p.REMOVE, "c") == serialize_value(2), "a resent remove found nothing"
    assert call(owner, p.PUT_IF_ABSENT, "d", 3) is None
    assert call(owner, p.PUT_IF_ABSENT, "d", 3) is None, "a resent put_if_absent: not stored"
    net.kill(owner, "test")
    net.run_until(net.time + 0.5)  # the supervisor tells at once; records last 5 s here
    new_owner = owner_of(net, pid)
    assert new_owner is not owner
    assert call(new_owner, p.PUT, "b", 2) == serialize_value(1)
    assert call(new_owner, p.PUT_IF_ABSENT, "d", 3) is None
    assert new_owner.store.get(pid, "m", k) == serialize_value(3)


def test_a_removed_owner_without_backups_acknowledges_nothing(make_cluster):
    net = make_cluster(seed=15, backup_count=0, nodes=3)
    net.fencing = False  # the supervisor is down: the removed owner comes back
    master = net.master()
    key, pid = key_where(net, lambda r: r[0] != master.info.uuid)
    owner, probe = owner_of(net, pid), Probe(net)
    alive = probe.send(owner, p.PUT, [serialize_key(key), serialize_value(1)], ns="m",
                       pid=pid, iid="before")
    net.run_until(net.time + 0.2)
    assert probe.answer(alive)[0]["ok"], "a member within its lease writes without backups"
    net.hang(owner)
    net.run_until(net.time + 2 * TIMEOUT_S)
    assert owner.info.uuid not in master.cluster.members
    net.resume(owner)
    zombie = probe.send(owner, p.PUT, [serialize_key(key), serialize_value(2)], ns="m",
                        pid=pid, iid="after")
    net.run_until(net.time + 2 * TIMEOUT_S)
    answer = probe.answer(zombie)
    assert answer is None or not answer[0]["ok"], "a removed owner acknowledged a write"
    assert not owner.alive, "the removed owner learned of its removal and stopped"


def test_a_removed_owner_answers_no_read_of_what_its_successor_took(make_cluster):
    """An owner hangs, is removed and is not fenced (the supervisor is down); its backup takes
    its partition and a newer write. Reads sent to the old owner, while it hung or after it
    came back, must not answer the value it still holds: its lease lapsed and never returns."""
    net = make_cluster(seed=18, backup_count=1, nodes=3)
    net.fencing = False
    master = net.master()
    key, pid = key_where(net, lambda r: r[0] != master.info.uuid)
    owner, probe = owner_of(net, pid), Probe(net)
    first = probe.send(owner, p.PUT, [serialize_key(key), serialize_value(1)], ns="m", pid=pid,
                       iid="w1")
    net.run_until(net.time + 0.2)
    assert probe.answer(first)[0]["ok"]
    fresh = probe.send(owner, p.GET, [serialize_key(key)], ns="m", pid=pid)
    net.run_until(net.time + 0.2)
    assert probe.value(fresh) == serialize_value(1), "an owner within its lease answers reads"
    net.hang(owner)
    net.run_until(net.time + 2 * TIMEOUT_S)
    assert owner.info.uuid not in master.cluster.members
    successor = owner_of(net, pid)
    second = probe.send(successor, p.PUT, [serialize_key(key), serialize_value(2)], ns="m",
                        pid=pid, iid="w2")
    net.run_until(net.time + 0.2)
    assert probe.answer(second)[0]["ok"]
    while_hung = probe.send(owner, p.GET, [serialize_key(key)], ns="m", pid=pid)
    net.resume(owner)
    after = probe.send(owner, p.GET, [serialize_key(key)], ns="m", pid=pid)
    net.run_until(net.time + 2 * TIMEOUT_S)
    for rid in (while_hung, after):
        answer = probe.answer(rid)
        assert answer is None or not answer[0]["ok"], f"a removed owner answered {answer}"
    assert not owner.alive, "the removed owner learned of its removal and stopped"


def test_replace_contents_moves_the_replica_versions_of_both_maps(make_cluster):
    net = make_cluster(seed=16, backup_count=1, nodes=3)
    key, pid = key_where(net, lambda r: r[1] is not None)
    table = net.master().cluster.table
    owner, backup = owner_of(net, pid), node_of(net, table.replicas(pid)[1])
    probe = Probe(net)
    probe.send(owner, p.PUT, [serialize_key(key), serialize_value(1)], ns="stage", pid=pid,
               iid="s1")
    net.run_until(net.time + 0.2)
    rid = probe.send(owner, p.REPLACE_CONTENTS, [], ns="stage", target="live", pids=[pid],
                     iid="r1")
    net.run_until(net.time + 0.2)
    assert probe.answer(rid)[0]["ok"]
    for node in (owner, backup):
        assert node.store.get(pid, "live", serialize_key(key)) == serialize_value(1)
    assert owner.maps.versions.get(pid, "live")[0] == 1
    assert backup.maps.versions.get(pid, "live")[0] == 1
    assert backup.maps.versions.get(pid, "stage")[0] == 2


def test_a_batch_write_naming_no_partition_of_the_member_is_answered_at_once(make_cluster):
    """A client with an old table sends a clear to a member that owns none of its
    partitions: it is told at once which partitions to send elsewhere."""
    net = make_cluster(seed=17, backup_count=1, nodes=3)
    _, pid = key_where(net, lambda r: True)
    other = next(n for n in net.alive() if n is not owner_of(net, pid))
    probe = Probe(net)
    rid = probe.send(other, p.CLEAR, [], ns="m", pids=[pid], iid="c1")
    empty = probe.send(owner_of(net, pid), p.CLEAR, [], ns="m", pids=[], iid="c2")
    net.run_until(net.time + 0.1)
    assert probe.answer(rid)[0]["wrong"] == [pid]
    assert probe.answer(empty)[0]["ok"]


def test_a_promoted_backup_brings_the_other_backups_up_to_date_before_it_answers(make_cluster):
    """The dead owner's write reached one backup and not the other; the one promoted answers
    the client's resend from its record only once the other backup holds the write too."""
    net = make_cluster(seed=18, backup_count=2, nodes=4)
    master = net.master()
    key, pid = key_where(net, lambda r: master.info.uuid not in r[:1] and r[2])
    table = master.cluster.table
    owner = owner_of(net, pid)
    first, second = node_of(net, table.replicas(pid)[1]), node_of(net, table.replicas(pid)[2])
    probe = Probe(net)
    net.failing_links.add((owner.info.uuid.encode(), second.info.endpoint))
    put = [serialize_key(key), serialize_value(5)]
    probe.send(owner, p.PUT, put, ns="m", pid=pid, iid="w5")
    net.run_until(net.time + 0.2)
    assert first.store.get(pid, "m", serialize_key(key)) == serialize_value(5)
    assert second.store.get(pid, "m", serialize_key(key)) is None
    net.kill(owner, "test")
    net.failing_links.clear()
    while first.cluster.table.owner(pid) != first.info.uuid:  # promoted; resend at once
        net.run_until(net.time + 0.001)
    resend = probe.send(first, p.PUT, put, ns="m", pid=pid, iid="w5")
    deadline = net.time + 1.0
    while probe.answer(resend) is None and net.time < deadline:
        net.run_until(net.time + 0.001)
    assert probe.answer(resend)[0]["ok"]
    # At the moment the answer leaves, the other backup holds the write.
    assert second.store.get(pid, "m", serialize_key(key)) == serialize_value(5)


def resend_to_an_async_backup_a_replica_sync_repaired(net: SimNetwork
                                                       ) -> tuple[dict[str, Any], bytes | None]:
    """A dead owner's write reached only its last asynchronous backup (index 3). The cluster
    is NO_MIGRATION, so that backup keeps its index (no migration replaces its copy) and its
    replica sync, ahead of the new owner, takes the write away. Then the two replicas before
    it die, it becomes owner, and the client resends the write within its invocation
    timeout. The resend's answer, and what the new owner holds of the key."""
    master = net.master()
    key, pid = key_where(net, lambda r: master.info.uuid not in r[:4])
    owner, first, second, last = (node_of(net, u)
                                  for u in master.cluster.table.replicas(pid)[:4])
    probe = Probe(net)
    rid = probe.send(master, p.CHANGE_STATE, [], state=ClusterState.NO_MIGRATION.value,
                     timeout=3.0, k=net.config.cluster_secret)
    net.run_until(net.time + 1.0)
    assert probe.answer(rid)[0]["ok"]
    key_bytes = serialize_key(key)
    put = [key_bytes, serialize_value(7)]
    net.invocation_writes["w7"] = ("m", 7, {pid: [key_bytes]})  # (for sim.check_records)
    for backup in (first, second):
        net.failing_links.add((owner.info.uuid.encode(), backup.info.endpoint))
    probe.send(owner, p.PUT, put, ns="m", pid=pid, iid="w7")
    sent = net.time
    net.run_until(net.time + 0.2)
    assert last.store.get(pid, "m", key_bytes) == put[1] and \
        first.store.get(pid, "m", key_bytes) is None
    net.kill(owner, "test")
    net.failing_links.clear()
    deadline = net.time + 3 * TIMEOUT_S
    while not last.syncs.synced and net.time < deadline:
        net.run_until(net.time + 0.01)
    assert last.syncs.synced and last.cluster.table.replica_index(pid, last.info.uuid) == 3
    assert last.store.get(pid, "m", key_bytes) is None, "the sync took the write away"
    header, _ = resend_once_owner(net, probe, last, pid, put, sent, deadline, first, second)
    return header, last.store.get(pid, "m", key_bytes)


def resend_once_owner(net: SimNetwork, probe: Probe, last: SimNode, pid: int,
                      put: list[bytes], sent: float, deadline: float, *dying: SimNode
                      ) -> tuple[dict[str, Any], list[bytes]]:
    """Kill the replicas before ``last``; once it owns ``pid``, resend the PUT ``put`` of
    invocation w7 (first sent at ``sent``) to it, within the client's invocation timeout.
    The resend's answer."""
    for node in dying:
        net.kill(node, "test")
    while last.cluster.table.owner(pid) != last.info.uuid and net.time < deadline:
        net.run_until(net.time + 0.01)
    assert net.time < sent + net.config.invocation_timeout, "a resend the client may make"
    resend = probe.send(last, p.PUT, put, ns="m", pid=pid, iid="w7")
    net.run_until(net.time + 1.0)
    return probe.answer(resend)


def test_a_replica_sync_that_takes_a_write_away_takes_its_invocation_record_too(make_cluster):
    """Kept, the record would answer the resend as done while nothing holds the write: an
    acknowledged write lost."""
    net = make_cluster(seed=21, backup_count=1, async_backup_count=2, nodes=5,
                       backup_sync_interval=0.5)
    answer, held = resend_to_an_async_backup_a_replica_sync_repaired(net)
    assert answer["ok"] and held == serialize_value(7)
    assert net.violations == [], net.violations


# Malformed variants of a good backup operation of two parts (the owner's partition ``pid``,
# then ``other``, two entries each), as the header fields that replace the good ones: the
# parts' packed columns (workers/backup_parts.py) and the fields every part shares.
BAD_BACKUPS = [
    lambda pid, other, v, tv: {"pp": "not bytes"},
    lambda pid, other, v, tv: {"pp": [pid, other]},
    lambda pid, other, v, tv: {"pp": pack_parts([pid, other], [4, 4], [tv, tv], [v, v])[:-1]},
    lambda pid, other, v, tv: {"pp": pack_parts([pid, other], [4, 4], [tv, tv], [v, v])[:-8]},
    lambda pid, other, v, tv: {"pp": pack_parts([pid, other], [4, 4], [tv, tv], [v, v])
                               + bytes(8)},
    lambda pid, other, v, tv: {"pp": b""},
    lambda pid, other, v, tv: {"pp": None},
    # the simulated clusters have 31 partitions
    lambda pid, other, v, tv: {"pp": pack_parts([pid, 31], [4, 4], [tv, tv], [v, v])},
    lambda pid, other, v, tv: {"pp": pack_parts([pid, pid], [4, 4], [tv, tv], [v, v])},
    lambda pid, other, v, tv: {"pp": pack_parts([pid, other], [4, 6], [tv, tv], [v, v])},
    lambda pid, other, v, tv: {"pp": pack_parts([pid, other], [4, 2], [tv, tv], [v, v])},
    lambda pid, other, v, tv: {"pp": pack_parts([pid, other], [4, 4], [tv, tv], [v, v]),
                               "laid_out": True},  # (the payload is items, not records)
    lambda pid, other, v, tv: {"kind": "replace_contents"},  # (no target versions)
    lambda pid, other, v, tv: {"kind": "zap"},
    lambda pid, other, v, tv: {"iid": 7},
    lambda pid, other, v, tv: {"old": 1},
    lambda pid, other, v, tv: {"answer": "the client"},
    lambda pid, other, v, tv: {"answer": [pid, 5, 1]},
]


@pytest.mark.parametrize("bad", BAD_BACKUPS, ids=range(len(BAD_BACKUPS)))
def test_a_malformed_backup_is_refused_whole(make_cluster, bad):
    """Every part of a backup operation is checked before any is applied: each malformed
    variant is refused, and its first part, a good one, was not applied."""
    net = make_cluster(seed=7, nodes=2)
    owner, backup = net.alive()
    table = backup.cluster.table
    pid, other = [pid for pid in range(table.partition_count)
                  if table.owner(pid) == owner.info.uuid][:2]
    versions = list(backup.maps.versions.get(pid, "m"))
    versions[0] += 1
    assert list(backup.maps.versions.get(other, "m")) == [0] * 6
    tv = table.version(pid)
    probe = Probe(net)
    fields = {"ns": "m", "kind": "put", "from": owner.info.uuid, "seq": None,
              p.SECRET_FIELD: net.config.cluster_secret}
    both = [p.pack_items([b"k", b"v", b"k2", b"v2", b"k3", b"v3", b"k4", b"v4"])]
    good_both = pack_parts([pid, other], [4, 4], [tv, table.version(other)],
                           [versions, [1, 0, 0, 0, 0, 0]])
    bad_rid = probe.send(backup, p.BACKUP, both,
                         **{**fields, "pp": good_both, **bad(pid, other, versions, tv)})
    net.run_until(net.time + 0.5)
    header, _ = probe.answer(bad_rid)
    assert header["ok"] is False and header["code"] == p.PROTOCOL, header
    assert backup.store.get(pid, "m", b"k") is None
    assert list(backup.maps.versions.get(pid, "m")) == [versions[0] - 1, *versions[1:]]
    good_rid = probe.send(backup, p.BACKUP, both, **{**fields, "pp": good_both})
    net.run_until(net.time + 0.5)
    assert probe.answer(good_rid) is None  # (asynchronous: applied, and not answered)
    assert backup.store.get(pid, "m", b"k") == b"v"
    assert backup.store.get(other, "m", b"k4") == b"v4"


@pytest.mark.parametrize("op", [p.PUT, p.PUT_ALL])
def test_a_backup_that_fails_to_apply_a_write_is_synced_not_left_without_it(make_cluster, op):
    """The backup takes an operation's versions, then its store fails to write it (it could
    not grow, say). The owner sends the operation again; judged by its versions it was
    applied already, so the backup must have marked the replica for a replica sync, or it
    would lack the write for good (and its versions would say it has it). Nor may it
    acknowledge the resend before that sync brought the write: the owner would answer."""
    net = make_cluster(seed=17, backup_count=1, nodes=3)
    table = net.master().cluster.table
    first, pid = key_where(net, lambda r: r[1] is not None)
    row = table.replicas(pid)[:2]
    second = next(key for key in (f"k{i}" for i in range(10_000))
                  if (found := partition_id_of(serialize_key(key), table.partition_count))
                  != pid and table.replicas(found)[:2] == row)
    owner, backup = node_of(net, row[0]), node_of(net, row[1])
    keys = [serialize_key(first), serialize_key(second)]
    failures = []

    def failing(method):
        def fail_once(*args: Any) -> Any:
            if not failures:
                failures.append(args)
                raise OSError("no room to grow (test)")
            return method(*args)
        return fail_once

    probe = Probe(net)
    if op == p.PUT:
        backup.store.put = failing(backup.store.put)
        rid = probe.send(owner, p.PUT, [keys[0], serialize_value(1)], ns="m", pid=pid,
                         iid="w1")
        written = {keys[0]: (pid, serialize_value(1))}
    else:
        backup.store.put_runs = failing(backup.store.put_runs)  # (a batch's write)
        pids = [pid, partition_id_of(keys[1], table.partition_count)]
        assert pids[0] != pids[1]
        rid = probe.send(owner, p.PUT_ALL, [p.pack_items([keys[0], serialize_value(1),
                                                          keys[1], serialize_value(2)])],
                         ns="m", pids=pids, counts=[1, 1], iid="b1")
        written = {keys[0]: (pids[0], serialize_value(1)), keys[1]: (pids[1], serialize_value(2))}
    while probe.answer(rid) is None and net.time < 30:
        net.run_until(net.time + 0.005)
    assert failures, "the backup's store was asked to write"
    answer = probe.answer(rid)
    assert answer is not None and answer[0]["ok"], answer
    for key, (key_pid, value) in written.items():  # when the answer came
        assert backup.store.get(key_pid, "m", key) == value, "answered; the backup lacks it"
    net.run_until(net.time + 2.0)
    assert not any(backup.maps.versions.is_dirty(key_pid, "m") for key_pid, _ in written.values())
    assert replicas_differing(net) == [], net.log


def test_a_backup_waiting_for_a_sync_takes_the_sync_of_a_new_owner(make_cluster):
    """A backup's store fails to apply a write and its owner dies before answering the sync
    it asked for: the partition's next owner syncs its backups through the same stream of
    operations, and that sync (and the writes after it) must not wait behind the replica's
    own wait for a sync."""
    net = make_cluster(seed=18, backup_count=2, nodes=4)
    key, pid = key_where(net, lambda r: r[2] is not None)
    first_owner, heir, backup = (node_of(net, uuid) for uuid in
                                 net.master().cluster.table.replicas(pid)[:3])
    k = serialize_key(key)
    put = backup.store.put

    def fail_and_kill_the_owner(*args: Any) -> Any:
        backup.store.put = put
        net.kill(first_owner, "test: dies before it can answer the sync asked of it")
        raise OSError("no room to grow (test)")

    backup.store.put = fail_and_kill_the_owner
    probe = Probe(net)
    probe.send(first_owner, p.PUT, [k, serialize_value(1)], ns="m", pid=pid, iid="w1")
    net.run_until(net.time + 3 * TIMEOUT_S)
    assert owner_of(net, pid) is heir
    rid = probe.send(heir, p.PUT, [k, serialize_value(2)], ns="m", pid=pid, iid="w2")
    net.run_until(net.time + 2.0)
    answer = probe.answer(rid)
    assert answer is not None and answer[0]["ok"], answer
    assert backup.store.get(pid, "m", k) == serialize_value(2)
    assert replicas_differing(net) == [], net.log


def test_a_backup_waiting_for_a_sync_is_not_stuck_when_its_owner_leaves(make_cluster):
    """A backup's store fails to apply a write, and the owner leaves gracefully before the
    sync the backup asked for: the partition moves to that backup. The write must be on
    every replica when it is answered, on the new owner after the move, and the
    partition's next write must be answered and on every replica (no wait left behind)."""
    net = make_cluster(seed=19, backup_count=1, nodes=3)
    key, pid = key_where(net, lambda r: r[1] is not None)
    owner, backup = (node_of(net, uuid) for uuid in net.master().cluster.table.replicas(pid)[:2])
    k = serialize_key(key)
    put = backup.store.put

    def fail_and_leave(*args: Any) -> Any:
        backup.store.put = put
        owner.cluster.request_leave()
        raise OSError("no room to grow (test)")

    backup.store.put = fail_and_leave
    probe = Probe(net)
    first = probe.send(owner, p.PUT, [k, serialize_value(1)], ns="m", pid=pid, iid="w1")
    while probe.answer(first) is None and net.time < 30:
        net.run_until(net.time + 0.005)
    answer = probe.answer(first)
    assert answer is not None and answer[0]["ok"], answer
    for node in net.alive():  # when the answer came
        if node.info.uuid in net.master().cluster.table.replicas(pid):
            assert node.store.get(pid, "m", k) == serialize_value(1), "answered; it lacks it"
    net.run_until(net.time + 3 * TIMEOUT_S)
    assert owner not in net.alive(), "the owner left"
    heir = owner_of(net, pid)
    assert heir is backup, "the partition moved to the backup that waited for a sync"
    assert heir.store.get(pid, "m", k) == serialize_value(1), "the answered write was lost"
    rid = probe.send(heir, p.PUT, [k, serialize_value(2)], ns="m", pid=pid, iid="w2")
    net.run_until(net.time + 2.0)
    answer = probe.answer(rid)
    assert answer is not None and answer[0]["ok"], answer
    for node in net.alive():
        if node.info.uuid in net.master().cluster.table.replicas(pid):
            assert node.store.get(pid, "m", k) == serialize_value(2)
    assert replicas_differing(net) == [], net.log


def resend_to_a_backup_a_replica_sync_brought_the_write_to(net: SimNetwork
                                                           ) -> tuple[list[bytes], Any]:
    """An owner's write reached its synchronous backup, not its asynchronous one (index 2),
    and was answered (the client takes the answer as lost). A replica sync brought the write to
    the asynchronous backup (its copy fell behind); then the two replicas before it die, it
    becomes owner, and the client resends the write within its invocation timeout. What
    the resend is answered (the previous value, as frames) and the outcome the backup
    recorded for the write after the sync."""
    master = net.master()
    key, pid = key_where(net, lambda r: master.info.uuid not in r[:3])
    owner, first, last = (node_of(net, u) for u in master.cluster.table.replicas(pid)[:3])
    probe = Probe(net)
    key_bytes = serialize_key(key)
    put = [key_bytes, serialize_value(7)]
    net.invocation_writes["w7"] = ("m", 7, {pid: [key_bytes]})  # (for sim.check_records)
    net.failing_links.add((owner.info.uuid.encode(), last.info.endpoint))
    rid = probe.send(owner, p.PUT, put, ns="m", pid=pid, iid="w7")
    sent = net.time
    net.resendable["w7"] = sent + net.config.invocation_timeout  # (for sim.check_records)
    net.run_until(net.time + 0.2)
    assert probe.answer(rid)[0]["ok"] and first.store.get(pid, "m", key_bytes) == put[1]
    assert last.store.get(pid, "m", key_bytes) is None
    net.failing_links.clear()
    deadline = net.time + 3 * TIMEOUT_S
    while last.store.get(pid, "m", key_bytes) is None and net.time < deadline:
        net.run_until(net.time + 0.01)
    assert last.syncs.synced and last.store.get(pid, "m", key_bytes) == put[1]
    recorded = last.maps.records.get(pid, "w7")
    header, frames = resend_once_owner(net, probe, last, pid, put, sent, deadline, owner, first)
    assert header["ok"], header
    return frames, recorded


def test_a_replica_sync_that_brings_a_write_brings_its_invocation_record_too(make_cluster):
    """Without the record, the new owner applies the resend again and answers it with the
    write's own value as the previous one (a put_if_absent would say "present" to the caller
    that stored it)."""
    net = make_cluster(seed=21, backup_count=1, async_backup_count=1, nodes=5,
                       backup_sync_interval=0.5)
    frames, recorded = resend_to_a_backup_a_replica_sync_brought_the_write_to(net)
    assert recorded is None, "the sync brought the record of the write, and its outcome"
    assert frames == [], f"the resend answered {frames!r} as the previous value, not None"
    assert net.violations == [], net.violations


@pytest.mark.parametrize("rows", [1, 5])
def test_records_a_dirty_backup_takes_one_at_a_time_are_applied_as_items(make_cluster, rows,
                                                                          caplog):
    """A put_all of records laid out as the store keeps them (a Spark write's,
    workers/record_block.py) to a partition whose backup replica waits for a replica sync:
    the backup takes that part by the per-operation rules (apply, ask for the sync, note the
    keys in the sync's window), as items, and the replicas converge."""
    net = make_cluster(seed=23, backup_count=1, nodes=3)
    _, pid = key_where(net, lambda r: r[1] is not None)
    owner = owner_of(net, pid)
    backup = node_of(net, net.master().cluster.table.replicas(pid)[1])
    keys = [key for key in (serialize_key(f"r{i}") for i in range(20_000))
            if partition_id_of(key, net.config.partition_count) == pid][:rows]
    pairs = [(key, serialize_value(i)) for i, key in enumerate(keys)]
    backup.maps.versions.mark_dirty(pid, "m")
    probe = Probe(net)
    rid = probe.send(owner, p.PUT_ALL, [frame_of(pairs)], ns="m", pids=[pid],
                     counts=[len(pairs)], iid="r1", laid_out=True)
    net.run_until(net.time + 3.0)
    assert probe.answer(rid) is not None and probe.answer(rid)[0]["ok"]
    for node in (owner, backup):
        assert [node.store.get(pid, "m", key) for key, _ in pairs] == \
            [value for _, value in pairs]
    assert not backup.maps.versions.is_dirty(pid, "m")  # synced since
    assert check_converged(net) == []
    # (a backup operation it failed to apply would be repaired by the sync: not enough)
    assert "malformed" not in caplog.text and "failed to serve" not in caplog.text


def test_a_batch_larger_than_an_entry_may_be_is_written_whole(make_cluster):
    """A put_all whose payload is over ``max_value_bytes`` (each entry under it) is looked at
    entry by entry, and then written as it came: every entry of every partition, on the owner
    and its backup. (The look went through the batch's groups with the payload's own name, and
    the store was then handed the last group for the whole batch.)"""
    net = make_cluster(seed=24, backup_count=1, nodes=3, max_value_bytes=600)
    table = net.master().cluster.table
    owner_uuid = table.owner(0)
    pids = [pid for pid in range(table.partition_count) if table.owner(pid) == owner_uuid
            and table.replicas(pid)[1] is not None][:3]
    assert len(pids) == 3
    by_pid: dict[int, list[tuple[bytes, bytes]]] = {pid: [] for pid in pids}
    for i in range(20_000):
        key = serialize_key(f"big{i}")
        pid = partition_id_of(key, table.partition_count)
        if pid in by_pid and len(by_pid[pid]) < 2:
            by_pid[pid].append((key, serialize_value(b"v" * 200)))
        if all(len(pairs) == 2 for pairs in by_pid.values()):
            break
    items = [item for pid in pids for pair in by_pid[pid] for item in pair]
    payload = p.pack_items(items)
    assert len(payload) > 600  # the look entry by entry is taken
    probe = Probe(net)
    rid = probe.send(owner_of(net, pids[0]), p.PUT_ALL, [payload], ns="m", pids=pids,
                     counts=[2, 2, 2], iid="big1")
    net.run_until(net.time + 3.0)
    header, _ = probe.answer(rid)
    assert header["ok"], header
    for node in (owner_of(net, pids[0]), *(node_of(net, table.replicas(pid)[1])
                                           for pid in pids)):
        for pid in pids:
            if node.info.uuid in table.replicas(pid):
                assert [node.store.get(pid, "m", key) for key, _ in by_pid[pid]] == \
                    [value for _, value in by_pid[pid]], (node.info.uuid, pid)
    assert check_converged(net) == []


@pytest.mark.parametrize("op", [p.PUT, p.PUT_ALL])
def test_an_asynchronous_backup_applies_the_write_and_answers_nobody(make_cluster, op):
    """Nobody waits for an asynchronous backup operation (what gets lost is for replica sync
    to repair): its backup applies it and sends nothing back. (An answer cost the backup a
    message and the owner a round for a callback that did nothing.)"""
    net = make_cluster(seed=25, backup_count=0, async_backup_count=1, nodes=3)
    key, pid = key_where(net, lambda r: len(r) > 1 and r[1] is not None)
    owner = owner_of(net, pid)
    backup = node_of(net, net.master().cluster.table.replicas(pid)[1])
    to_owner = []
    reply = backup.reply

    def watched(ident: bytes, frames: list) -> None:
        if ident == owner.info.uuid.encode():
            to_owner.append(p.unpack_header(bytes(frames[0])))
        reply(ident, frames)

    backup.reply = watched
    probe = Probe(net)
    key_bytes, value = serialize_key(key), serialize_value("async")
    if op == p.PUT:
        rid = probe.send(owner, p.PUT, [key_bytes, value], ns="m", pid=pid, iid="a1")
    else:
        rid = probe.send(owner, p.PUT_ALL, [p.pack_items([key_bytes, value])], ns="m",
                         pids=[pid], counts=[1], iid="a1")
    net.run_until(net.time + 1.0)
    assert probe.answer(rid)[0]["ok"]
    assert backup.store.get(pid, "m", key_bytes) == value
    assert to_owner == [], to_owner
