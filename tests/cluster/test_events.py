"""The master's event log (grid/cluster/events.py)."""

import pytest

from grid.cluster.events import EventLog


def test_events_are_numbered_and_read_after_a_number():
    log = EventLog()
    assert [log.add({"n": i}) for i in range(3)] == [1, 2, 3]
    assert log.since(2) == ([(2, {"n": 1}), (3, {"n": 2})], False)
    assert log.since(4) == ([], False)
    assert log.next_seq == 4


def test_a_reader_that_fell_behind_is_told_it_missed_events():
    log = EventLog(capacity=2)
    for i in range(5):
        log.add({"n": i})
    events, missed = log.since(1)
    assert [n for n, _ in events] == [4, 5] and missed
    assert log.since(4) == ([(4, {"n": 3}), (5, {"n": 4})], False)


def test_an_empty_log_has_missed_nothing():
    assert EventLog().since(1) == ([], False)
    with pytest.raises(ValueError):
        EventLog(capacity=0)
