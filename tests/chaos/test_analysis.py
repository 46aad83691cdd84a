"""What the chaos report derives from a history besides the verdict (grid/chaos/analysis.py):
write stalls per fault, anomalies the promise covers, latency percentiles."""

from __future__ import annotations

import itertools

import pytest

from grid.chaos.analysis import (
    Anomaly,
    anomalies,
    latency_percentiles,
    per_second,
    split_by_promise,
    write_stalls,
)
from grid.chaos.checker import check
from grid.chaos.faults import FaultRecord
from grid.chaos.history import Op

pytestmark = pytest.mark.timeout(60)

T0 = 1000.0
_index = itertools.count()


def pid_of(key: str) -> int:
    return int(key[1:]) % 10


def op(f: str, key: str, invoke: float, complete: float, status: str = "ok",
       value: int | None = 1, result: int | None = None, process: int = 0) -> Op:
    """Times in seconds after T0."""
    return Op(next(_index), process, f, key, None if f in ("get", "remove") else value,
              result, status, T0 + invoke, T0 + complete)


def steady(key: str, start: float, end: float, step: float = 0.1) -> list[Op]:
    """Quick successful writes to ``key`` every ``step`` seconds."""
    count = round((end - start) / step)
    return [op("put", key, start + n * step, start + n * step + 0.001) for n in range(count)]


def test_a_blocked_write_counts_for_the_fault_that_hit_its_partition():
    pause = FaultRecord("pause", "member-1", 10.0, 13.0, True, affected=[1])
    ops = steady("k1", 0, 10) + [op("put", "k1", 10.0, 13.0)] + steady("k1", 13.1, 20)
    ops += [op("put", "k2", 10.0, 12.0)]  # slow, but on a partition the pause did not hit
    assert write_stalls(ops, [pause], T0, 5.0, pid_of) == [pytest.approx(3.0)]


def test_refused_writes_stall_until_a_write_succeeds():
    state = FaultRecord("state-change", None, 10.0, 12.0, True, "PASSIVE for 2.0 s")
    ops = steady("k3", 0, 10)
    ops += [op("put", "k3", 10.0 + n * 0.1, 10.0 + n * 0.1 + 0.001, "fail") for n in range(20)]
    ops += [op("put", "k3", 12.05, 12.06)] + steady("k3", 12.2, 15)
    assert write_stalls(ops, [state], T0, 5.0, pid_of) == [pytest.approx(2.06)]


def test_a_run_that_never_succeeds_counts_to_its_last_attempt():
    kill = FaultRecord("kill", "member-1", 10.0, 10.0, True, affected=[4])
    ops = [op("put", "k4", 10.0, 11.0, "info"), op("put", "k4", 11.0, 12.5, "info")]
    assert write_stalls(ops, [kill], T0, 5.0, pid_of) == [pytest.approx(2.5)]


def test_a_write_in_flight_when_the_next_fault_starts_counts_for_that_fault():
    add = FaultRecord("add-member", None, 0.0, 2.0, True)
    pause = FaultRecord("pause", "member-2", 5.0, 9.0, True, affected=[5])
    ops = steady("k5", 0, 4.99) + [op("put", "k5", 4.995, 9.0)] + steady("k5", 9.1, 12)
    assert write_stalls(ops, [add, pause], T0, 5.0, pid_of) == [
        pytest.approx(0.001), pytest.approx(4.005)]


def test_stalls_long_after_a_fault_and_skipped_faults_count_nothing():
    kill = FaultRecord("kill", "member-1", 10.0, 10.0, True, affected=[6])
    skipped = FaultRecord("kill", None, 11.0, 11.0, True, "skipped: no member to take")
    ops = steady("k6", 9, 20) + [op("put", "k6", 16.0, 19.0)]  # after end + interval
    assert write_stalls(ops, [kill, skipped], T0, 5.0, pid_of) == [pytest.approx(0.001), 0.0]


def test_reads_and_the_final_reads_are_not_writes():
    kill = FaultRecord("kill", "member-1", 10.0, 10.0, True)
    ops = [op("get", "k7", 10.0, 14.0), op("put", "k7", 10.0, 14.0, process=-1)]
    assert write_stalls(ops, [kill], T0, 5.0, pid_of) == [0.0]


def lost(key: str, seen: float) -> Anomaly:
    return Anomaly("lost write", key, T0 + seen, "")


def test_anomalies_are_expected_only_where_a_fault_beyond_the_promise_hit_before():
    within = FaultRecord("kill", "member-1", 5.0, 5.0, True, affected=[1, 2])
    beyond = FaultRecord("kill", "member-2", 20.0, 20.0, False, affected=[2, 3])
    found = [lost("k1", 30.0),  # hit only by the fault within the promise: a violation
             lost("k2", 30.0),  # hit by the fault beyond it, seen after: expected
             lost("k3", 19.0),  # seen before that fault: a violation
             lost("k4", 30.0)]  # never hit: a violation
    violations, expected = split_by_promise(found, [within, beyond], T0, pid_of)
    assert [a.key for a in violations] == ["k1", "k3", "k4"]
    assert [a.key for a in expected] == ["k2"]


def test_a_fault_beyond_the_promise_that_hit_every_partition_covers_every_key():
    beyond = FaultRecord("add-member", None, 1.0, 2.0, False)
    skipped = FaultRecord("kill", None, 0.0, 0.0, False, "skipped: no member to take")
    assert split_by_promise([lost("k8", 3.0)], [beyond], T0, pid_of)[0] == []
    assert len(split_by_promise([lost("k8", 3.0)], [skipped], T0, pid_of)[0]) == 1


def test_anomalies_come_from_the_verdict_with_the_time_they_were_seen():
    history = [op("put", "k9", 0.0, 1.0, value=7), op("get", "k9", 2.0, 3.0, result=None),
               op("put", "k1", 0.0, 1.0, value=8), op("get", "k1", 2.0, 3.0, result=9)]
    found = {(a.what, a.key): a.seen for a in anomalies(check(history))}
    assert found[("lost write", "k9")] == T0 + 3.0
    assert found[("not linearizable", "k1")] == T0 + 3.0


def test_latency_percentiles_per_function():
    ops = [op("put", "k1", 0.0, ms / 1000) for ms in range(1, 101)]
    ops += [op("get", "k1", 0.0, 0.5), op("put", "k1", 0.0, 9.0, "fail")]
    latency = latency_percentiles(ops)
    assert latency["put"]["count"] == 100
    assert latency["put"]["p50_ms"] == pytest.approx(50, rel=0.02)
    assert latency["put"]["p99_ms"] == pytest.approx(99, rel=0.02)
    assert latency["put"]["max_ms"] == pytest.approx(100, rel=0.02)
    assert latency["get"]["p50_ms"] == pytest.approx(500, rel=0.02)


def test_per_second_counts_successes_and_their_percentiles():
    ops = sorted([op("put", "k1", 0.1 * n, 0.1 * n + 0.002) for n in range(10)]
                 + [op("put", "k1", 2.5, 2.51), op("put", "k1", 2.6, 2.7, "info")],
                 key=lambda o: o.invoke)
    rate, p50, p99 = per_second(ops, T0, 4)
    assert rate == [10, 0, 1, 0]
    assert p50[0] == pytest.approx(2, rel=0.02) and p50[1] == 0.0
    assert p99[2] == pytest.approx(10, rel=0.02)
