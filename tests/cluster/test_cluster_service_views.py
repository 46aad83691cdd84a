"""What a member answers every request from (``ClusterService.is_lite``, ``lease_until``) is
kept between member-list changes: these check that a kept answer never outlives what it
depends on, a promotion, a lease echo, or a master given up for dead."""

from __future__ import annotations

import math


def test_is_lite_follows_a_promotion_at_once(make_cluster):
    net = make_cluster(seed=3, backup_count=1, nodes=2)
    lite = net.add_node([net.master().info.endpoint], lite=True)
    net.run_until(net.time + 1.0)
    cluster = lite.cluster
    assert cluster.is_lite and cluster.is_lite  # (the second answer is the kept one)
    cluster.members = cluster.members.promoted(lite.info.uuid)
    assert not cluster.is_lite


def test_a_follower_has_no_lease_once_it_gives_its_master_up(make_cluster):
    net = make_cluster(seed=4, backup_count=1, nodes=3)
    net.run_until(net.time + 1.0)
    master = net.master()
    follower = next(n for n in net.alive() if n is not master).cluster
    members = follower.members
    until = follower.lease_until()
    assert until > net.time and follower.lease_until() == until
    follower.dead.add(master.info.uuid)  # given up for dead: the member list is the same
    assert follower.members is members and follower.lease_until() == -math.inf
    follower.dead.discard(master.info.uuid)
    assert follower.lease_until() == until
    follower.recovering = True
    assert follower.lease_until() == -math.inf
    follower.recovering = False
    assert follower.lease_until() == until


def test_a_lease_echo_renews_the_kept_lease(make_cluster):
    net = make_cluster(seed=5, backup_count=1, nodes=3)
    net.run_until(net.time + 1.0)
    master = net.master()
    follower = next(n for n in net.alive() if n is not master).cluster
    before = follower.lease_until()
    net.run_until(net.time + 2.5 * net.config.heartbeat_interval)  # heartbeats echoed since
    assert follower.lease_until() > before
