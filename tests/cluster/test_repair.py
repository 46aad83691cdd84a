"""The master's table repair on member removal (seed 002, section 1.1), and cluster safety."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from grid.cluster.repair import initial_assignment, is_cluster_safe, remove_members
from grid.partition.assignment import assign
from grid.partition.migration_plan import plan_repartition
from grid.partition.table import PartitionTable

MEMBERS = ["a", "b", "c", "d"]


def test_owner_left_promotes_the_hottest_backup():
    table = PartitionTable(partition_count=3)
    table.set_replicas(0, ["a", "b", "c"])
    table.set_replicas(1, ["b", "a", "c"])
    table.set_replicas(2, ["c", None, "a"])
    out = remove_members(table, {"a"}, ["b", "c"])
    assert out.replicas(0)[:3] == ("b", None, "c")
    assert out.replicas(1)[:3] == ("b", None, "c")
    assert out.replicas(2)[:3] == ("c", None, None)
    assert table.replicas(0)[:3] == ("a", "b", "c"), "the input is untouched"
    assert out.version(0) > table.version(0)


def test_partition_whose_replicas_all_left_gets_an_owner_among_the_least_loaded():
    table = PartitionTable(partition_count=5)
    table.set_replicas(0, ["a", "b"])
    table.set_replicas(1, ["c", "b"])
    table.set_replicas(2, ["d", "c"])
    table.set_replicas(3, ["c"])
    table.set_replicas(4, ["b", "a"])
    out = remove_members(table, {"a", "b"}, ["c", "d"])
    assert out.owner(0) == "d"  # c owns two partitions, d one
    counts = [sum(out.owner(p) == m for p in range(5)) for m in ("c", "d")]
    assert max(counts) - min(counts) <= 1


def test_ties_go_to_the_oldest_member():
    table = PartitionTable(partition_count=3)
    table.set_replicas(0, ["a"])
    table.set_replicas(1, ["c"])
    table.set_replicas(2, ["d"])
    assert remove_members(table, {"a"}, ["c", "d"]).owner(0) == "c"


def test_removing_nobody_changes_nothing():
    table = initial_assignment(PartitionTable(partition_count=31), MEMBERS[:3], 1)
    assert remove_members(table, set(), MEMBERS[:3]) == table


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), st.integers(1, 60), st.data())
def test_removal_keeps_every_surviving_replica_and_an_owner(members, backups, count, data):
    names = MEMBERS[:members]
    table = initial_assignment(PartitionTable(partition_count=count), names, backups)
    gone = set(data.draw(st.lists(st.sampled_from(names), max_size=members - 1)))
    rest = [m for m in names if m not in gone]
    out = remove_members(table, gone, rest)
    for pid in range(count):
        before = {r for r in table.replicas(pid) if r and r not in gone}
        after = [r for r in out.replicas(pid) if r]
        assert set(after) >= before, "no surviving replica is dropped"
        assert len(after) == len(set(after)), "no member twice"
        assert out.owner(pid) in rest
        assert not (set(after) & gone)


def test_initial_assignment_is_safe_and_removal_is_not():
    table = initial_assignment(PartitionTable(partition_count=271), MEMBERS[:3], 1)
    assert is_cluster_safe(table, MEMBERS[:3], 1)
    assert not is_cluster_safe(table, MEMBERS[:3], 1, migrating=True)
    out = remove_members(table, {"b"}, ["a", "c"])
    assert not is_cluster_safe(out, ["a", "c"], 1)
    # One member left with backup_count 1 needs only owners: safe again.
    single = remove_members(out, {"c"}, ["a"])
    assert is_cluster_safe(single, ["a"], 1)


def test_unassigned_table_is_not_safe():
    assert not is_cluster_safe(PartitionTable(partition_count=5), ["a"], 0)


def test_synchronous_backups_close_up_behind_a_gone_replica():
    table = PartitionTable(2)
    table.set_replicas(0, ["a", "b", "c", "d"])
    table.set_replicas(1, ["b", "a", "c", "d"])
    out = remove_members(table, {"a"}, ["b", "c", "d"], backup_count=2)
    assert out.replicas(0)[:4] == ("b", "c", None, "d")  # d is asynchronous: it stays
    assert out.replicas(1)[:4] == ("b", "c", None, "d")


def test_closing_up_spares_the_planner_its_shift_ups():
    members = [f"m{i}" for i in range(5)]
    table = initial_assignment(PartitionTable(271), members, 2)
    staying = [m for m in members if m != "m1"]
    kinds = {}
    for backup_count in (0, 2):
        repaired = remove_members(table, {"m1"}, staying, backup_count)
        plan = plan_repartition(repaired, assign(repaired, staying, 2))
        kinds[backup_count] = Counter(m.kind for queue in plan.queues for m in queue)
    assert kinds[0]["SHIFT_UP"] > 50
    assert kinds[2]["SHIFT_UP"] == 0 and kinds[2]["COPY"] == kinds[0]["COPY"]
