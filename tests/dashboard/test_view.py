"""The dashboard's pure parts (grid/dashboard/view.py, the action check of server.py)."""

from __future__ import annotations

import pytest

from grid.dashboard.server import action_command
from grid.dashboard.view import Rates, SafeClock, member_view, table_view

pytestmark = pytest.mark.timeout(30)


def test_the_table_view_marks_migrating_short_and_lost_partitions():
    replicas = {0: ["a", "b"], 1: ["b", None], 2: [None, None], 3: ["c", "a"]}
    view = table_view(replicas, backup_count=1, data_members=3, in_flight=[3], lost={2})
    assert view["owners"] == ["a", "b", None, "c"]
    assert view["backups"] == [["b"], [], [], ["a"]]
    assert view["short"] == [1, 2] and view["migrating"] == [3] and view["lost"] == [2]
    # One data member cannot hold a backup: nothing is short for want of one.
    assert table_view({0: ["a", None]}, 1, 1, [], [])["short"] == []


def test_member_rows_say_how_each_process_is_and_whether_the_cluster_counts_it():
    registry = [{"name": "member-0", "uuid": "u0", "pid": 10},
                {"name": "member-1", "uuid": "u1", "pid": 11},
                {"name": "member-2", "uuid": "u2", "pid": 12, "lite": True}]
    rows = {"u0": {"master": True, "owned": 5, "backups": 4, "rss": 1},
            "u2": {"lite": True}, "u3": {"name": "member-3", "pid": 13, "owned": 1}}
    promoted = member_view([{"name": "member-2", "uuid": "u2", "pid": 12, "lite": True}],
                           {"u2"}, {"u2": {"lite": False}}, {12: "running"}, {})
    assert promoted[0]["role"] == "member"  # its own report wins over the registry's
    view = member_view(registry, {"u0", "u2", "u3"}, rows,
                       {10: "running", 11: "dead", 12: "paused", 13: "running"}, {"u0": 7.5})
    by_name = {m["name"]: m for m in view}
    assert [m["name"] for m in view] == ["member-0", "member-1", "member-2", "member-3"]
    assert by_name["member-0"]["role"] == "master" and by_name["member-0"]["ops"] == 7.5
    assert by_name["member-1"]["process"] == "dead" and not by_name["member-1"]["in_cluster"]
    assert by_name["member-2"]["role"] == "lite" and by_name["member-2"]["process"] == "paused"
    assert by_name["member-3"]["owned"] == 1 and by_name["member-3"]["answered"]


def test_rates_come_from_two_polls_of_a_counter():
    rates = Rates()
    assert rates.update(10.0, {"a": 100}) == {}
    assert rates.update(10.5, {"a": 150, "b": 3}) == {"a": 100.0}
    assert rates.update(11.0, {"b": 8}) == {"b": 10.0}  # a is gone, and forgotten
    assert rates.update(11.5, {"a": 0}) == {}


def test_time_to_safe_runs_from_the_first_change_to_the_first_safe_poll():
    clock = SafeClock()
    assert clock.poll(True, 1.0) is None  # no change yet
    clock.event({"type": "migration_started"}, 2.0)  # not a change of membership or state
    assert clock.poll(True, 2.5) is None
    clock.event({"type": "member_removed"}, 3.0)
    clock.event({"type": "member_joined"}, 4.0)
    assert clock.poll(False, 5.0) is None
    assert clock.poll(True, 6.5) == {"type": "cluster_safe", "after_s": 3.5,
                                     "changes": ["member_removed", "member_joined"]}
    assert clock.poll(True, 7.0) is None
    clock.event({"type": "state_changed", "at": 7.25}, 7.5)  # it happened before it was seen
    assert clock.poll(True, 7.75)["after_s"] == 0.5


@pytest.mark.parametrize(("body", "command"), [
    ({"action": "kill", "member": "member-1"}, ["kill", "member-1"]),
    ({"action": "pause", "member": "member-1"}, ["kill", "member-1", "--signal", "STOP"]),
    ({"action": "resume", "member": "member-1"}, ["kill", "member-1", "--signal", "CONT"]),
    ({"action": "stop-member", "member": "member-1"}, ["stop-member", "member-1"]),
    ({"action": "promote", "member": "member-1"}, ["promote", "member-1"]),
    ({"action": "add-member", "lite": True}, ["add-member", "--lite"]),
    ({"action": "state", "state": "FROZEN"}, ["state", "FROZEN"])])
def test_actions_are_the_cli_commands(body, command):
    assert action_command(body, ["member-0", "member-1"]) == command


@pytest.mark.parametrize("body", [
    [], {"action": "rm -rf"}, {"action": "kill", "member": "member-9"},
    {"action": "kill", "member": "--cluster-name=x"}, {"action": "state", "state": "DOWN"}])
def test_anything_else_is_refused(body):
    with pytest.raises(ValueError):
        action_command(body, ["member-0", "member-1"])
