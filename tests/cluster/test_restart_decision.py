"""Which members a cluster restarts on (grid/cluster/restart.py), per policy."""

from __future__ import annotations

import pytest

from grid.cluster.repair import initial_assignment, remove_members
from grid.cluster.restart import decide_restart, reclaim_target
from grid.partition.table import PartitionTable

NAMES = {u: f"member-{u}" for u in "abcd"}


def saved(members: str = "abc") -> PartitionTable:
    return initial_assignment(PartitionTable(13), list(members), 1)


def newer(table: PartitionTable) -> PartitionTable:
    """The table after one more migration: partition 0's backup moved to a member not in
    its row."""
    table = table.copy()
    owner, backup = table.replicas(0)[:2]
    spare = next(u for u in "abcd" if u not in (owner, backup))
    table.set_replicas(0, [owner, spare])
    return table


def test_one_table_and_everyone_here_restarts_on_it_under_every_policy():
    table = saved()
    for policy in ("full_recovery_only", "partial_recovery_most_recent",
                   "partial_recovery_most_complete"):
        decision = decide_restart({u: table for u in "abc"}, NAMES, policy)
        assert decision.table == table and not decision.stale and not decision.missing
        assert not decision.refusal


def test_nobody_with_data_is_a_new_cluster():
    decision = decide_restart({u: None for u in "abc"}, NAMES, "full_recovery_only")
    assert decision.table is None and not decision.refusal


def test_full_recovery_refuses_a_missing_member_or_tables_that_differ():
    table = saved()
    missing = decide_restart({"a": table, "b": table}, NAMES, "full_recovery_only")
    assert "missing" in missing.refusal and "c" in missing.refusal
    differ = decide_restart({"a": table, "b": table, "c": newer(table)}, NAMES,
                            "full_recovery_only")
    assert "member-a, member-b restored another table" in differ.refusal
    fresh = decide_restart({"a": table, "b": table, "c": None}, NAMES, "full_recovery_only")
    assert "member-c hold no data" in fresh.refusal
    with pytest.raises(ValueError):
        decide_restart({}, NAMES, "best_effort")


def test_partial_policies_pick_the_newest_or_the_largest_group():
    old = saved("abcd")
    new = newer(old)
    restored = {"a": old, "b": old, "c": old, "d": new}
    recent = decide_restart(restored, NAMES, "partial_recovery_most_recent")
    assert recent.table == new and recent.stale == {"a", "b", "c"}
    complete = decide_restart(restored, NAMES, "partial_recovery_most_complete")
    assert complete.table == old and complete.stale == {"d"}
    missing = decide_restart({"a": old, "b": old}, NAMES, "partial_recovery_most_recent")
    assert missing.table == old and missing.missing == {"c", "d"} and not missing.refusal


def test_a_member_that_came_back_gets_exactly_its_stable_rows_back():
    stable = saved("abc")
    after_c_left = remove_members(stable, {"c"}, ["a", "b"], 1)
    assert reclaim_target(after_c_left, stable, ["a", "b"]) is None, "c is still away"
    target = reclaim_target(after_c_left, stable, ["a", "b", "c"])
    assert target is not None
    for pid in range(stable.partition_count):
        assert target.replicas(pid) == stable.replicas(pid)
    assert reclaim_target(stable, stable, ["a", "b", "c"]) is None, "nothing differs"
