"""Chained answers (grid/cluster/chain.py): a synchronous backup answers a single-key write in
its owner's place, with the previous value the owner would have given, and only when it can
be sure of it; otherwise the owner answers, as before."""

from __future__ import annotations

import pytest

from grid import protocol as p
from grid.cluster.chain import ClientConnections, owner_may_chain
from grid.serialization import partition_id_of, serialize_key, serialize_value
from tests.cluster.sim import SimNetwork
from tests.cluster.test_write_path import Probe, key_where, node_of, owner_of

pytestmark = pytest.mark.timeout(60)


def greet(net: SimNetwork, probe: Probe) -> None:
    """HELLO to every member, as the real client does on each link it opens."""
    for node in net.alive():
        probe.send(node, p.HELLO, [], cid=probe.ident.decode())
    net.run_until(net.time + 0.1)


def put(net: SimNetwork, probe: Probe, key: str, value: int, chained: bool = True
        ) -> tuple[list, bytes | None]:
    """Put through the key's owner; (every reply to it, the previous value it answered)."""
    pid = partition_id_of(serialize_key(key), net.master().cluster.table.partition_count)
    fields = {"ns": "m", "pid": pid, "iid": f"{probe.ident.decode()}:{key}:{value}"}
    if chained:
        fields["cid"] = probe.ident.decode()
    rid = probe.send(owner_of(net, pid), p.PUT, [serialize_key(key), serialize_value(value)],
                     **fields)
    net.run_until(net.time + 0.5)
    replies = probe.replies[rid]
    assert replies and replies[0][0]["ok"], replies
    return replies, probe.value(rid)


def chained(net: SimNetwork) -> int:
    return sum(node.maps.chained_answers for node in net.alive())


def test_the_backup_answers_in_its_owners_place_with_the_previous_value(make_cluster):
    net = make_cluster(seed=31, backup_count=1, nodes=3)
    probe = Probe(net)
    greet(net, probe)
    key, pid = key_where(net, lambda r: r[1] is not None)
    backup = node_of(net, net.master().cluster.table.replicas(pid)[1])
    replies, old = put(net, probe, key, 1)
    assert old is None and len(replies) == 1
    assert backup.maps.chained_answers == 1
    replies, old = put(net, probe, key, 2)
    assert old == serialize_value(1) and len(replies) == 1, "one answer, from the backup"
    assert backup.maps.chained_answers == 2 and net.violations == []


def test_a_caller_the_backup_does_not_know_is_answered_by_the_owner(make_cluster):
    net = make_cluster(seed=32, backup_count=1, nodes=3)
    probe = Probe(net)  # no HELLO
    key, _ = key_where(net, lambda r: r[1] is not None)
    put(net, probe, key, 1)
    replies, old = put(net, probe, key, 2)
    assert old == serialize_value(1) and len(replies) == 1
    assert chained(net) == 0


def test_a_call_that_does_not_ask_for_it_is_answered_by_the_owner(make_cluster):
    net = make_cluster(seed=33, backup_count=1, nodes=3)
    probe = Probe(net)
    greet(net, probe)
    key, _ = key_where(net, lambda r: r[1] is not None)
    put(net, probe, key, 1, chained=False)
    assert chained(net) == 0


def test_with_two_synchronous_backups_the_owner_answers(make_cluster):
    net = make_cluster(seed=34, backup_count=2, nodes=3)
    probe = Probe(net)
    greet(net, probe)
    key, pid = key_where(net, lambda r: r[1] is not None and r[2] is not None)
    put(net, probe, key, 1)
    replies, old = put(net, probe, key, 2)
    assert old == serialize_value(1) and len(replies) == 1
    assert chained(net) == 0
    for uuid in net.master().cluster.table.replicas(pid)[:3]:
        assert node_of(net, uuid).store.get(pid, "m", serialize_key(key)) == serialize_value(2)


def test_a_backup_out_of_step_leaves_the_answer_to_its_owner(make_cluster):
    """The backup loses the second write (acknowledged, not applied: the test hook), so it
    holds 1 where the owner holds 2. The third write shows it the gap: it applies it and
    marks the namespace dirty, but its previous value (1) is not the owner's (2), so the owner
    answers."""
    net = make_cluster(seed=35, backup_count=1, nodes=3)
    probe = Probe(net)
    greet(net, probe)
    key, pid = key_where(net, lambda r: r[1] is not None)
    backup = node_of(net, net.master().cluster.table.replicas(pid)[1])
    backup.maps.drop_backup_every = 2
    put(net, probe, key, 1)
    assert backup.maps.chained_answers == 1
    put(net, probe, key, 2)  # lost on the backup: the owner answers
    assert backup.store.get(pid, "m", serialize_key(key)) == serialize_value(1)
    replies, old = put(net, probe, key, 3)
    assert old == serialize_value(2), "the owner's previous value, not the stale backup's"
    assert backup.maps.chained_answers == 1
    net.run_until(net.time + 3.0)  # the replica sync repairs the backup
    backup.maps.drop_backup_every = 0
    assert not backup.maps.versions.is_dirty(pid, "m")
    replies, old = put(net, probe, key, 4)
    assert old == serialize_value(3) and backup.maps.chained_answers == 2


def put_all(net: SimNetwork, probe: Probe, keys: list[str], value: int,
            iid: str | None = None) -> list:
    """PUT_ALL of ``keys`` (of partitions one member owns) through that owner; every reply
    to it."""
    table = net.master().cluster.table
    by_pid: dict[int, list[bytes]] = {}
    for key in keys:
        pid = partition_id_of(serialize_key(key), table.partition_count)
        by_pid.setdefault(pid, []).extend((serialize_key(key), serialize_value(value)))
    assert len({table.owner(pid) for pid in by_pid}) == 1
    rid = probe.send(owner_of(net, next(iter(by_pid))), p.PUT_ALL,
                     [p.pack_items([item for items in by_pid.values() for item in items])],
                     ns="m", pids=list(by_pid), counts=[len(v) // 2 for v in by_pid.values()],
                     iid=iid or f"{keys[0]}:{value}", cid=probe.ident.decode())
    net.run_until(net.time + 0.5)
    return probe.replies[rid]


def batch_setup(make_cluster, seed: int):
    """A greeted probe on a 3-member cluster with one backup, and three keys of one hash
    tag: (net, probe, keys, their partition, its backup)."""
    net = make_cluster(seed=seed, backup_count=1, nodes=3)
    probe = Probe(net)
    greet(net, probe)
    tag, pid = key_where(net, lambda r: r[1] is not None)
    backup = node_of(net, net.master().cluster.table.replicas(pid)[1])
    return net, probe, [f"{{{tag}}}{j}" for j in range(3)], pid, backup


def test_the_backup_answers_a_batch_of_one_partition_in_its_owners_place(make_cluster):
    net, probe, keys, pid, backup = batch_setup(make_cluster, 36)
    replies = put_all(net, probe, keys, 1)
    assert len(replies) == 1 and replies[0][0]["ok"] and not replies[0][0].get("wrong")
    assert backup.maps.chained_answers == 1 and net.violations == []
    for uuid in net.master().cluster.table.replicas(pid)[:2]:
        assert all(node_of(net, uuid).store.get(pid, "m", serialize_key(key))
                   == serialize_value(1) for key in keys)


def test_a_batch_its_backup_did_not_apply_in_full_is_answered_by_the_owner(make_cluster):
    """The backup drops the batch's part (the test hook: acknowledged, not applied); it must
    not answer for what it does not hold."""
    net, probe, keys, pid, backup = batch_setup(make_cluster, 37)
    backup.maps.drop_backup_every = 1
    replies = put_all(net, probe, keys, 1)
    assert len(replies) == 1 and replies[0][0]["ok"]
    assert backup.maps.chained_answers == 0
    assert backup.store.get(pid, "m", serialize_key(keys[0])) is None


def test_a_batch_that_names_partitions_elsewhere_is_answered_by_the_owner(make_cluster):
    """Its answer says which partitions to send elsewhere: only the owner can say it."""
    net, probe, keys, pid, backup = batch_setup(make_cluster, 38)
    table = net.master().cluster.table
    other = next(q for q in range(table.partition_count) if table.owner(q) != table.owner(pid))
    items = [item for key in keys for item in (serialize_key(key), serialize_value(1))]
    items += [serialize_key("elsewhere"), serialize_value(1)]
    rid = probe.send(owner_of(net, pid), p.PUT_ALL, [p.pack_items(items)], ns="m",
                     pids=[pid, other], counts=[3, 1], iid="i-wrong", cid=probe.ident.decode())
    net.run_until(net.time + 0.5)
    (header, _), = probe.replies[rid]
    assert header["ok"] and header["wrong"] == [other]
    assert chained(net) == 0


def test_a_batch_resent_with_more_partitions_is_answered_by_the_owner(make_cluster):
    """The resend of an invocation that adds a partition: the ticket also covers the one the
    first attempt wrote, so the backup, which applies only the new part, does not answer."""
    net, probe, keys, pid, backup = batch_setup(make_cluster, 39)
    table = net.master().cluster.table
    more, other = next((key, q) for key in (f"more{i}" for i in range(10_000))
                       if (q := partition_id_of(serialize_key(key), table.partition_count))
                       != pid and table.replicas(q)[:2] == table.replicas(pid)[:2])
    assert len(put_all(net, probe, keys, 1, iid="same")) == 1
    assert chained(net) == 1
    replies = put_all(net, probe, [*keys, more], 1, iid="same")
    assert len(replies) == 1 and replies[0][0]["ok"] and chained(net) == 1
    assert backup.store.get(other, "m", serialize_key(more)) == serialize_value(1)


def test_owners_chain_only_with_one_synchronous_backup_one_waiter_and_no_log_wait():
    assert owner_may_chain(1, 1, False)
    assert not owner_may_chain(0, 1, False)
    assert not owner_may_chain(2, 1, False)
    assert not owner_may_chain(1, 2, False)
    assert not owner_may_chain(1, 1, True)


def test_client_connections_follow_hellos_and_closed_links():
    connections = ClientConnections(max_clients=2)
    connections.greeted("a", b"link-1")
    connections.greeted("b", b"link-2")
    assert connections.ident("a") == b"link-1" and len(connections) == 2
    connections.greeted("a", b"link-3")  # a new link of the same client wins
    assert connections.ident("a") == b"link-3"
    connections.closed(b"link-1")  # its old link closing changes nothing
    assert connections.ident("a") == b"link-3"
    connections.greeted("c", b"link-2")  # a link speaks for one client: b is gone
    assert connections.ident("b") is None and connections.ident("c") == b"link-2"
    connections.greeted("d", b"link-4")  # over the bound: the oldest greeting goes
    assert len(connections) == 2 and connections.ident("a") is None
    connections.closed(b"link-4")
    assert connections.ident("d") is None and len(connections) == 1
    with pytest.raises(ValueError):
        ClientConnections(max_clients=0)
