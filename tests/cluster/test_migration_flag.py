"""A partition its owner is sending (seed 000's migration flag): writes wait with the retryable
"migrating" error, reads are served unless migration_stale_read_disabled."""

from __future__ import annotations

from grid import protocol as p
from grid.partition.assignment import is_balanced
from grid.serialization import partition_id_of, serialize_key, serialize_value
from tests.cluster.test_write_path import Probe, key_where, owner_of
from workers.migration_service import Outgoing


def _flagged(make_cluster, stale_reads_disabled: bool):
    net = make_cluster(seed=21, backup_count=1, nodes=3)
    key, pid = key_where(net, lambda r: True)
    owner, probe = owner_of(net, pid), Probe(net)
    probe.send(owner, p.PUT, [serialize_key(key), serialize_value(1)], ns="m", pid=pid,
               iid="w1")
    net.run_until(net.time + 0.2)
    owner.maps.config = owner.maps.config.replace(
        migration_stale_read_disabled=stale_reads_disabled)
    owner.migrations.outgoing[pid] = Outgoing(1, None, owner.cluster.table.version(pid),
                                              (b"", {}), [])
    return net, owner, probe, key, pid


def _answers(net, probe, owner, key, pid):
    write = probe.send(owner, p.PUT, [serialize_key(key), serialize_value(2)], ns="m", pid=pid,
                       iid="w2")
    read = probe.send(owner, p.GET, [serialize_key(key)], ns="m", pid=pid)
    batch = probe.send(owner, p.GET_ALL, [p.pack_items([serialize_key(key)])], ns="m",
                       pids=[pid], counts=[1])
    net.run_until(net.time + 0.2)
    return probe.answer(write)[0], probe.answer(read), probe.answer(batch)[0]


def test_writes_wait_and_reads_are_served_while_a_partition_migrates(make_cluster):
    net, owner, probe, key, pid = _flagged(make_cluster, stale_reads_disabled=False)
    write, read, batch = _answers(net, probe, owner, key, pid)
    assert not write["ok"] and write["code"] == p.MIGRATING
    assert read[0]["ok"] and read[1] == [serialize_value(1)]
    assert batch["ok"] and batch["wrong"] == []


def test_reads_wait_too_when_stale_reads_are_disabled(make_cluster):
    net, owner, probe, key, pid = _flagged(make_cluster, stale_reads_disabled=True)
    write, read, batch = _answers(net, probe, owner, key, pid)
    assert not write["ok"] and write["code"] == p.MIGRATING
    assert not read[0]["ok"] and read[0]["code"] == p.MIGRATING
    assert batch["ok"] and batch["wrong"] == [pid]


def test_a_sender_keeps_its_fragments_in_flight_within_the_byte_cap(make_cluster):
    """With a cap below one fragment, a member sends one fragment at a time; the join still
    ends balanced and safe."""
    net = make_cluster(seed=22, backup_count=1, nodes=3)
    probe = Probe(net)
    nodes = list(net.alive())
    for node in nodes:
        node.config = node.config.replace(migration_max_bytes_in_flight=1)
    for i in range(200):
        key = serialize_key(f"k{i}")
        pid = partition_id_of(key, net.config.partition_count)
        probe.send(owner_of(net, pid), p.PUT, [key, serialize_value(i)], ns="m", pid=pid,
                   iid=f"w{i}")
    net.run_until(net.time + 0.5)
    joined = net.add_node([n.info.endpoint for n in nodes])
    # The member that joins may be a migration source too (a partition it took over whose
    # backup moves to its owner's partner), under the same cap.
    joined.config = joined.config.replace(migration_max_bytes_in_flight=1)
    peak = 0
    for _ in range(400):
        net.run_until(net.time + 0.01)
        peak = max([peak, *(len(n.migrations.in_flight) for n in net.alive())])
    master = net.master()
    assert peak == 1
    assert master.cluster.is_safe()
    assert is_balanced(master.cluster.table, master.cluster.members.data_members, 1)


def test_a_large_fragment_travels_in_chunks_and_arrives_whole(make_cluster):
    net = make_cluster(seed=23, backup_count=1, nodes=3)
    probe = Probe(net)
    nodes = list(net.alive())
    for node in nodes:
        node.config = node.config.replace(migration_chunk_bytes=64)
    values = {f"k{i}": i for i in range(300)}
    for key, value in values.items():
        key_bytes = serialize_key(key)
        pid = partition_id_of(key_bytes, net.config.partition_count)
        probe.send(owner_of(net, pid), p.PUT, [key_bytes, serialize_value(value)], ns="m",
                   pid=pid, iid=f"w{key}")
    net.run_until(net.time + 0.5)
    sent_before = sum(n.migrations.sent_bytes for n in nodes)
    new = net.add_node([n.info.endpoint for n in nodes])
    net.run_until(net.time + 4.0)
    master = net.master()
    assert master.cluster.is_safe()
    assert is_balanced(master.cluster.table, master.cluster.members.data_members, 1)
    assert sum(n.migrations.sent_bytes for n in nodes) > sent_before
    table = master.cluster.table
    for key, value in values.items():
        key_bytes = serialize_key(key)
        pid = partition_id_of(key_bytes, net.config.partition_count)
        for uuid in table.replicas(pid)[:2]:
            assert net.by_uuid(uuid).store.get(pid, "m", key_bytes) == serialize_value(value)
    assert new.store.partitions(), "the new member received partitions"


def test_lent_fragment_is_cut_by_size_and_arrives_whole(make_cluster):
    net = make_cluster(seed=24, backup_count=1, nodes=3)
    sender, receiver = list(net.alive())[:2]
    store, maps = sender.store, sender.maps
    for i in range(10):
        store.put(0, "a", serialize_key(i), b"x" * 20)
    store.put(0, "b", serialize_key("only"), b"y")
    chunks, loans = maps.lend_namespaces(0, ["a", "b", "empty"], max_bytes=50)
    assert len(chunks) > 3 and len(loans) == 2
    assert all(chunk.size <= 50 for chunk in chunks)
    assert sum(chunk.entries for chunk in chunks) == 11
    assert {ns for chunk in chunks for ns in chunk.vectors} == {"a", "b", "empty"}
    receiver.store.drop_partition(0)
    for chunk in chunks[:-1]:
        receiver.maps.take_chunk(0, chunk.parts, chunk.vectors, 1)
        assert "b" not in receiver.store.namespaces(0), "a namespace is visible only whole"
    receiver.maps.take_chunk(0, chunks[-1].parts, chunks[-1].vectors, 1)
    assert receiver.store.namespaces(0) == ["a", "b"]
    assert dict(receiver.store.items(0, "a")) == dict(store.items(0, "a"))
    assert dict(receiver.store.items(0, "b")) == {serialize_key("only"): b"y"}
    assert receiver.maps.versions.get(0, "empty") == maps.versions.get(0, "empty")
    receiver.store._check()
    for loan in loans:
        loan.release()
    assert not store.loans
    chunks, loans = maps.lend_namespaces(0, [], max_bytes=50)
    assert [(c.parts, c.vectors) for c in chunks] == [([], {})] and loans == []
