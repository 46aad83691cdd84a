"""A differential migration (the destination holds the partition already, as Merkle trees
tell) asks the destination for its trees: a destination whose table is behind the
migration's answers "behind" and is asked again, rather than offer a replica that the step
before took from it (and that it drops once that step's publish comes)."""

from __future__ import annotations

import pytest

from grid import protocol as p
from grid.serialization import partition_id_of, serialize_key, serialize_value
from tests.cluster.test_write_path import Probe, owner_of


@pytest.mark.parametrize("seed", range(6))
def test_a_join_after_a_kill_fails_no_migration(make_cluster, seed):
    """Paired backups after a kill and a join: a partition's owner moves to the joined member
    and its backup to the old owner, one step after the other; the old owner is asked for its
    trees before it heard the first step (seed 4 failed a migration so, and the plan ended
    and started again a second later)."""
    net = make_cluster(seed=seed, backup_count=1, nodes=3, backup_placement="paired")
    probe = Probe(net)
    for i in range(300):
        key = serialize_key(f"k{i}")
        pid = partition_id_of(key, net.config.partition_count)
        probe.send(owner_of(net, pid), p.PUT, [key, serialize_value(i)], ns="m", pid=pid,
                   iid=f"w{i}")
    net.run_until(net.time + 1.0)
    net.kill(list(net.alive())[1], "the test")
    net.run_until(net.time + 6.0)
    master = net.master()
    seen = master.cluster.events.next_seq
    net.add_node([n.info.endpoint for n in net.alive()])
    net.run_until(net.time + 5.0)
    assert net.master() is master and master.cluster.is_safe()
    ended = [e for _, e in master.cluster.events.since(seen)[0]
             if e["type"] == "migration_finished"]
    assert ended and all(e["failed"] == 0 for e in ended), ended
    assert net.violations == [], net.violations
