"""What a chaos run's history says besides the checker's verdict: how long each fault kept
writes from succeeding, which anomalies the promise covers, and latency percentiles.

Pure: operations (grid/chaos/history.py ``Op``) and fault records in, numbers out. Operation
times are time.monotonic values; fault times count in seconds from the run's start ``t0``.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from grid.chaos.checker import Verdict
from grid.chaos.faults import FaultRecord
from grid.chaos.history import Op

LATENCY_MAX_US = 600_000_000  # ten minutes: far past any invocation timeout
LATENCY_DIGITS = 2  # significant digits the histograms keep


def write_stalls(ops: Iterable[Op], records: Sequence[FaultRecord], t0: float,
                 interval: float, partition_id: Callable[[str], int]) -> list[float]:
    """For each fault record (0.0 for a skipped one), the longest time writes to a partition
    it hit could not succeed. A stall on a partition runs from the invoke of a write that
    did not succeed (refused or indeterminate: the client already retried what it could), or
    that succeeded late, to the completion of the next write to it that succeeded. It counts
    for the last fault that started before it ended, if it began before that fault ended plus
    ``interval`` (later, the fault has nothing to do with it) and the fault hit its
    partition (a record without ``affected`` hit every partition)."""
    by_pid: dict[int, list[Op]] = defaultdict(list)
    for op in ops:
        if op.f != "get" and op.process >= 0:  # the workload's writes, not the final reads
            by_pid[partition_id(op.key)].append(op)
    live = [(n, r) for n, r in enumerate(records) if not r.skipped]
    starts = [r.start for _, r in live]
    hits = [set(r.affected) for _, r in live]
    worst = [0.0] * len(records)

    def count(pid: int, begin: float, end: float) -> None:
        k = bisect.bisect_right(starts, end) - 1
        if k < 0:
            return
        n, record = live[k]
        if begin < record.end + interval and (not hits[k] or pid in hits[k]):
            worst[n] = max(worst[n], end - begin)

    for pid, writes in by_pid.items():
        writes.sort(key=lambda op: op.invoke)
        run_start: float | None = None  # invoke of the first write of a run that failed
        last_end = 0.0
        for op in writes:
            invoke, complete = op.invoke - t0, op.complete - t0
            if op.status == "ok":
                count(pid, invoke if run_start is None else run_start, complete)
                run_start = None
            else:
                run_start = invoke if run_start is None else run_start
                last_end = max(last_end, complete)
        if run_start is not None:  # the run ended without a write succeeding
            count(pid, run_start, last_end)
    return worst


@dataclass(frozen=True)
class Anomaly:
    """A lost write or a key that is not linearizable, and when the evidence was complete."""

    what: str  # "lost write" | "not linearizable"
    key: str
    seen: float  # monotonic: the completion of the read or of the culprit
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "key": self.key, "detail": self.detail}


def anomalies(verdict: Verdict) -> list[Anomaly]:
    found = [Anomaly("lost write", write.key, read.complete, f"{write}, then read {read}")
             for write, read in verdict.lost_writes]
    found += [Anomaly("not linearizable", key, math.inf if result.culprit is None
                      else result.culprit.complete, f"at {result.culprit}")
              for key, result in verdict.failures.items()]
    return found


def split_by_promise(found: Iterable[Anomaly], records: Sequence[FaultRecord], t0: float,
                     partition_id: Callable[[str], int]
                     ) -> tuple[list[Anomaly], list[Anomaly]]:
    """(violations, expected). The grid promises to survive at most ``backup_count`` members
    down at once. A fault the runner could not hold to that (``within_promise`` False) may
    lose what the partitions it hit held, so an anomaly on such a partition, seen after that
    fault started, is expected; every other anomaly is a violation."""
    beyond = [(t0 + r.start, set(r.affected)) for r in records
              if not r.within_promise and not r.skipped]
    violations, expected = [], []
    for anomaly in found:
        pid = partition_id(anomaly.key)
        covered = any(start <= anomaly.seen and (not hit or pid in hit)
                      for start, hit in beyond)
        (expected if covered else violations).append(anomaly)
    return violations, expected


def _histogram() -> Any:
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(1, LATENCY_MAX_US, LATENCY_DIGITS)


def latency_percentiles(ops: Iterable[Op]) -> dict[str, dict[str, float]]:
    """Per function, the latencies of the workload's successful operations in ms (count,
    p50, p99, p99.9, max), from HdrHistograms (``pip install shmgrid[chaos]``)."""
    histograms: dict[str, Any] = {}
    for op in ops:
        if op.status == "ok" and op.process >= 0:
            h = histograms.get(op.f) or histograms.setdefault(op.f, _histogram())
            h.record_value(max(1, round((op.complete - op.invoke) * 1e6)))
    return {f: {"count": h.get_total_count(),
                "p50_ms": h.get_value_at_percentile(50) / 1000,
                "p99_ms": h.get_value_at_percentile(99) / 1000,
                "p999_ms": h.get_value_at_percentile(99.9) / 1000,
                "max_ms": h.get_max_value() / 1000}
            for f, h in sorted(histograms.items())}


def per_second(ops: Sequence[Op], t0: float, seconds: int
               ) -> tuple[list[int], list[float], list[float]]:
    """For each second of the run: successful operations, and their p50 and p99 latency in
    ms. ``ops`` in invoke order."""
    rate = [0] * seconds
    p50, p99 = [0.0] * seconds, [0.0] * seconds
    h, current = _histogram(), -1

    def close(second: int) -> None:
        if second >= 0 and h.get_total_count():
            p50[second] = h.get_value_at_percentile(50) / 1000
            p99[second] = h.get_value_at_percentile(99) / 1000
        h.reset()

    for op in ops:
        second = int(op.invoke - t0)
        if op.status != "ok" or op.process < 0 or not 0 <= second < seconds:
            continue
        if second != current:
            close(current)
            current = second
        rate[second] += 1
        h.record_value(max(1, round((op.complete - op.invoke) * 1e6)))
    close(current)
    return rate, p50, p99
