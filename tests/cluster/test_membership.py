import pytest

from grid.cluster.membership import MemberInfo, MemberList
from grid.cluster.state import ClusterState


def info(n: int, lite: bool = False) -> MemberInfo:
    return MemberInfo(f"u{n}", f"member-{n}", f"tcp://127.0.0.1:{5000 + n}", 100 + n, lite)


def test_master_is_the_oldest_and_versions_rise():
    ml = MemberList().with_member(info(0)).with_member(info(1)).with_member(info(2, lite=True))
    assert ml.version == 3
    assert ml.master.uuid == "u0"
    assert ml.data_members == ["u0", "u1"]
    smaller = ml.without({"u0"})
    assert smaller.version == 4 and smaller.master.uuid == "u1"
    assert ml.without({"nobody"}) is ml


def test_first_alive_skips_dead_members():
    ml = MemberList().with_member(info(0)).with_member(info(1)).with_member(info(2))
    assert ml.first_alive({"u0"}).uuid == "u1"
    assert ml.first_alive({"u0", "u1", "u2"}) is None


def test_wire_round_trip_and_rejects_garbage():
    ml = MemberList().with_member(info(0)).with_member(info(1, lite=True))
    assert MemberList.from_wire(ml.to_wire()) == ml
    for bad in (None, [1], ["x", []], [1, [["u", "n", "e", "pid", False]]], [1, [[1, 2]]]):
        with pytest.raises(ValueError):
            MemberList.from_wire(bad)


def test_member_info_carries_its_link_and_reads_views_saved_before_links():
    info = MemberInfo("u1", "member-1", "tcp://127.0.0.1:5000", 42, False, "127.0.0.1:5001")
    assert MemberInfo.from_wire(info.to_wire()) == info
    old = MemberInfo.from_wire(["u1", "member-1", "tcp://127.0.0.1:5000", 42, False])
    assert old.link == ""  # a view from before links: the member is reached by ZeroMQ
    with pytest.raises(ValueError):
        MemberInfo.from_wire(["u1", "member-1", "tcp://127.0.0.1:5000", 42, False, 5001])


def test_duplicate_join_is_refused():
    ml = MemberList().with_member(info(0))
    with pytest.raises(ValueError):
        ml.with_member(info(0))


@pytest.mark.parametrize("state, join, migrate, write", [
    (ClusterState.ACTIVE, True, True, True),
    (ClusterState.NO_MIGRATION, True, False, True),
    (ClusterState.FROZEN, False, False, True),
    (ClusterState.PASSIVE, False, False, False),
])
def test_cluster_states(state, join, migrate, write):
    assert (state.join_allowed, state.migration_allowed, state.writes_allowed) == (
        join, migrate, write)
