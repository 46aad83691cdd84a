"""The chaos run's fault schedule and option parsing (grid/chaos/faults.py)."""

from __future__ import annotations

import pytest

from grid.chaos.faults import (
    FAULT_KINDS,
    HELD_STATES,
    FaultRecord,
    parse_seconds,
    parse_weights,
    plan_faults,
)

pytestmark = pytest.mark.timeout(60)

WEIGHTS = {"kill": 1, "pause": 2, "master-kill": 1, "stop-member": 1, "add-member": 1,
           "state-change": 1}


def test_same_seed_same_schedule_and_another_seed_another():
    first = plan_faults(7, WEIGHTS, 5.0, 300.0, 4.0)
    assert first == plan_faults(7, WEIGHTS, 5.0, 300.0, 4.0)
    assert first != plan_faults(8, WEIGHTS, 5.0, 300.0, 4.0)


def test_one_fault_per_interval_none_in_the_last_and_pauses_around_the_timeout():
    faults = plan_faults(1, WEIGHTS, 5.0, 60.0, 4.0)
    assert [f.at for f in faults] == [5.0 * n for n in range(1, 11)]
    assert {f.kind for f in plan_faults(1, WEIGHTS, 1.0, 500.0, 4.0)} == set(FAULT_KINDS)
    pauses = [f.pause_s for f in plan_faults(2, {"pause": 1}, 1.0, 400.0, 4.0)]
    assert min(pauses) < 4.0 < max(pauses)  # either side of the heartbeat timeout
    assert all(0.3 * 4.0 <= p <= 1.7 * 4.0 for p in pauses)
    assert plan_faults(1, {"kill": 0, "pause": 0}, 5.0, 60.0, 4.0) == []


def test_weights_follow_the_mix():
    kinds = [f.kind for f in plan_faults(3, {"kill": 9, "pause": 1}, 1.0, 2000.0, 4.0)]
    assert kinds.count("kill") > 5 * kinds.count("pause") > 0


@pytest.mark.parametrize(("text", "why"), [
    ("kill=1,explode=2", "NAME=WEIGHT"), ("kill", "NAME=WEIGHT"), ("kill=x", "integer"),
    ("kill=-1", "negative"), ("kill=0,pause=0", "every weight is 0")])
def test_bad_weights_say_what_is_wrong(text, why):
    with pytest.raises(ValueError, match=why):
        parse_weights(text, FAULT_KINDS, "--faults")


def test_durations():
    assert parse_seconds("60") == parse_seconds("60s") == parse_seconds("1m") == 60.0
    with pytest.raises(ValueError):
        parse_seconds("0s")


def test_state_changes_hold_every_state_and_skipped_records_say_so():
    picks = [f.pick for f in plan_faults(4, {"state-change": 1}, 1.0, 200.0, 4.0)]
    assert {HELD_STATES[int(p * len(HELD_STATES))] for p in picks} == set(HELD_STATES)
    assert FaultRecord("kill", None, 1.0, 1.0, True, "skipped: no member to take").skipped
    assert not FaultRecord("pause", "member-1", 1.0, 3.0, True, "stopped 2.0 s").skipped
