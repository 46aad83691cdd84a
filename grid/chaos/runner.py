"""``shmgrid chaos``: a workload from several client processes, seeded faults, a recorded
history, and a verdict from the checker (grid/chaos/checker.py).

The runner starts its own cluster (or attaches to a running one), starts ``clients`` worker
processes (grid/chaos/workload.py), and every ``fault_interval`` injects the next fault of the
seeded schedule (grid/chaos/faults.py). A destructive fault waits until the cluster is safe
again (every partition has its backups): then at most ``backup_count`` members are ever down
at once, the failures the grid promises to survive. A fault that could not wait (the cluster
stayed unsafe) is injected anyway and marked beyond the promise; losses in such a run are
reported as expected and counted apart. After the last fault the cluster settles, every key
is read once more, and the history is checked.

Writes ``history.jsonl``, ``faults.json``, ``report.json`` (and ``timeline.png`` when
matplotlib is installed: ``pip install shmgrid[chaos]``) to ``out``; the exit status is 1 on a
violation within the promise.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grid.chaos.faults import DESTRUCTIVE, PlannedFault, plan_faults
from grid.chaos.workload import MAP_NAME, decode, run_worker

SETTLE_S = 5.0  # after the last fault: time for migrations before the final reads


@dataclass
class ChaosOptions:
    duration: float = 60.0
    seed: int = 1
    clients: int = 4
    keys: int = 10_000
    value_size: int = 100
    mix: dict[str, int] = field(default_factory=lambda: {
        "get": 50, "put": 30, "put_if_absent": 5, "replace": 5, "remove": 5, "put_all": 5})
    faults: dict[str, int] = field(default_factory=lambda: {
        "kill": 1, "pause": 1, "master-kill": 1, "stop-member": 1, "add-member": 1})
    fault_interval: float = 5.0
    members: int = 4
    backup_count: int = 1
    heartbeat_timeout: float = 4.0
    invocation_timeout: float = 30.0
    cluster_name: str | None = None  # attach to this running cluster
    out: str = "chaos-out"
    live: bool = True


@dataclass
class FaultRecord:
    kind: str
    member: str | None
    start: float  # seconds after the run started
    end: float
    within_promise: bool
    note: str = ""
    # Partitions the member held a replica of when it was hit: writes to them wait for
    # the promotion (owner) or the removal (backup). Empty: every partition (an added member).
    affected: list[int] = field(default_factory=list)


class ClusterControl:
    """The cluster, through the CLI and the registry (the same paths a user takes)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def cli(self, *args: str, check: bool = True, timeout: float = 180) -> str:
        result = subprocess.run([sys.executable, "-m", "grid", *args, "--cluster-name",
                                 self.name], capture_output=True, text=True, timeout=timeout)
        if check and result.returncode:
            raise RuntimeError(f"shmgrid {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def status(self) -> dict[str, Any]:
        return json.loads(self.cli("status", "--json", timeout=30))

    def members(self) -> list[dict[str, Any]]:
        from grid.client.registry import read_registry, registry_path

        return list(read_registry(registry_path(self.name))["members"])

    def signal(self, member: dict[str, Any], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member["pid"], sig)

    def wait_safe(self, timeout: float) -> bool:
        return subprocess.run([sys.executable, "-m", "grid", "wait-safe", "--timeout",
                               str(timeout), "--cluster-name", self.name],
                              capture_output=True, timeout=timeout + 60).returncode == 0


class Runner:
    def __init__(self, options: ChaosOptions) -> None:
        self.o = options
        self.out = Path(options.out)
        self.started_cluster = options.cluster_name is None
        self.cluster = ClusterControl(options.cluster_name or f"chaos{uuid.uuid4().hex[:8]}")
        self.records: list[FaultRecord] = []
        self.t0 = 0.0
        self.client: Any = None  # the runner's own: the table, the final reads

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        import multiprocess

        self.out.mkdir(parents=True, exist_ok=True)
        for old in self.out.glob("worker-*.jsonl"):
            old.unlink()
        if self.started_cluster:
            self.cluster.cli("start", "--detach", "--members", str(self.o.members),
                             "--backup-count", str(self.o.backup_count),
                             "--heartbeat-timeout", str(self.o.heartbeat_timeout))
        try:
            import grid

            self.client = grid.connect(cluster_name=self.cluster.name,
                                       invocation_timeout=self.o.invocation_timeout)
            schedule = plan_faults(self.o.seed, self.o.faults, self.o.fault_interval,
                                   self.o.duration, self.o.heartbeat_timeout)
            counters = multiprocess.Array("q", 3 * self.o.clients, lock=False)
            self.t0 = time.monotonic()
            stop_at = self.t0 + self.o.duration
            workers = [multiprocess.Process(target=run_worker, daemon=True, args=(
                self.cluster.name, w, self.o.seed, self.o.keys, self.o.value_size, self.o.mix,
                stop_at, str(self.out / f"worker-{w}.jsonl"), self.o.invocation_timeout,
                counters)) for w in range(self.o.clients)]
            for w in workers:
                w.start()
            self._inject(schedule, stop_at, counters)
            for w in workers:
                w.join(timeout=self.o.invocation_timeout + 30)
                if w.is_alive():
                    w.kill()
            self._heal()
            self.cluster.wait_safe(120)
            return self._finish()
        finally:
            if self.client is not None:
                self.client.close()
            if self.started_cluster:
                self._resume_all()
                self.cluster.cli("stop", check=False)

    def _inject(self, schedule: list[PlannedFault], stop_at: float, counters: Any) -> None:
        from rich.live import Live

        shown = self.o.live and sys.stdout.isatty()
        live = Live(self._view(counters), refresh_per_second=4) if shown else None
        with live or contextlib.nullcontext():
            pending = list(schedule)
            while time.monotonic() < stop_at:
                now = time.monotonic() - self.t0
                if pending and now >= pending[0].at:
                    self._fault(pending.pop(0))
                if live is not None:
                    live.update(self._view(counters))
                time.sleep(0.2)

    def _view(self, counters: Any) -> Any:
        from rich.table import Table

        ok = sum(counters[i] for i in range(0, len(counters), 3))
        fail = sum(counters[i] for i in range(1, len(counters), 3))
        info = sum(counters[i] for i in range(2, len(counters), 3))
        elapsed = max(1e-9, time.monotonic() - self.t0)
        table = Table(title=f"shmgrid chaos, seed {self.o.seed}: {elapsed:.0f} of "
                            f"{self.o.duration:.0f} s")
        for col in ("ops ok", "ops/s", "refused", "indeterminate", "faults", "last fault"):
            table.add_column(col, justify="right")
        last = self.records[-1] if self.records else None
        table.add_row(f"{ok:,}", f"{ok / elapsed:,.0f}", f"{fail:,}", f"{info:,}",
                      str(len(self.records)),
                      f"{last.kind} {last.member or ''} at {last.start:.0f}s" if last else "-")
        return table

    # -- faults ----------------------------------------------------------------------------

    def _fault(self, planned: PlannedFault) -> None:
        kind = planned.kind
        if kind in DESTRUCTIVE:
            self._heal()
        within = True
        if kind in DESTRUCTIVE and not self.cluster.wait_safe(self.o.fault_interval * 2):
            within = False  # another member may still be short of its backups
        members = self.cluster.members()
        replicas = self.client.partition_replicas()
        status = self.cluster.status()
        master = next((m["name"] for m in status["members"] if m.get("master")), None)
        data = [m for m in members if not m.get("lite")]
        start = time.monotonic() - self.t0
        victim: dict[str, Any] | None = None
        note = ""
        if kind == "master-kill":
            victim = next((m for m in members if m["name"] == master), None)
        elif kind in ("kill", "pause", "stop-member"):
            others = sorted((m for m in data if m["name"] != master), key=lambda m: m["name"])
            victim = others[int(planned.pick * len(others))] if others else None
        if kind != "add-member" and (victim is None or len(data) < 2):
            note = "skipped: no member to take"
        elif kind in ("kill", "master-kill"):
            self.cluster.signal(victim, signal.SIGKILL)
        elif kind == "pause":
            self.cluster.signal(victim, signal.SIGSTOP)
            time.sleep(planned.pause_s)
            self.cluster.signal(victim, signal.SIGCONT)
            note = f"stopped {planned.pause_s:.1f} s (heartbeat timeout " \
                   f"{self.o.heartbeat_timeout:g} s)"
        elif kind == "stop-member":
            self.cluster.cli("stop-member", victim["name"], "--timeout", "120", check=False)
        else:
            self.cluster.cli("add-member", check=False)
        affected = sorted(pid for pid, row in replicas.items()
                          if victim is not None and victim["uuid"] in row)
        self.records.append(FaultRecord(kind, victim["name"] if victim else None, start,
                                        time.monotonic() - self.t0, within, note, affected))

    def _heal(self) -> None:
        """Bring the data members back to ``members`` (faults take them away)."""
        with contextlib.suppress(Exception):
            missing = self.o.members - sum(1 for m in self.cluster.members()
                                           if not m.get("lite"))
            for _ in range(max(0, missing)):
                self.cluster.cli("add-member", check=False)

    def _resume_all(self) -> None:
        with contextlib.suppress(Exception):
            for member in self.cluster.members():
                self.cluster.signal(member, signal.SIGCONT)

    # -- the end ---------------------------------------------------------------------------

    def _final_reads(self, index: int) -> list[dict[str, Any]]:
        """Every key read once more, after the cluster settled: what survived."""
        ops = []
        m = self.client.get_map(MAP_NAME)
        keys = [f"k{k}" for k in range(self.o.keys)]
        for at in range(0, len(keys), 500):
            batch = keys[at:at + 500]
            invoke = time.monotonic()
            got = m.get_all(batch)
            complete = time.monotonic()
            for key in batch:
                index += 1
                ops.append({"index": index, "process": -1, "f": "get", "key": key,
                            "value": None, "result": decode(got.get(key)), "status": "ok",
                            "invoke": invoke, "complete": complete, "observed": True})
        return ops

    def _finish(self) -> dict[str, Any]:
        from grid.chaos.checker import check
        from grid.chaos.history import Op, write_jsonl

        rows = []
        for path in sorted(self.out.glob("worker-*.jsonl")):
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip()]
            path.unlink()
        rows += self._final_reads(max((r["index"] for r in rows), default=0))
        rows.sort(key=lambda r: (r["invoke"], r["index"]))
        ops = [Op(**{**r, "index": i}) for i, r in enumerate(rows)]
        write_jsonl(self.out / "history.jsonl", ops)
        started = time.monotonic()
        verdict = check(ops)
        check_s = time.monotonic() - started
        beyond = [r for r in self.records if not r.within_promise]
        stalls = self._unavailability(ops)
        report = {
            "seed": self.o.seed, "duration": self.o.duration, "options": asdict(self.o),
            "operations": len(ops), "ok": sum(op.status == "ok" for op in ops),
            "refused": sum(op.status == "fail" for op in ops),
            "indeterminate": sum(op.status == "info" for op in ops),
            "faults": [asdict(r) for r in self.records],
            "faults_by_kind": dict(Counter(r.kind for r in self.records
                                           if "skipped" not in r.note)),
            "beyond_promise": len(beyond), "verdict": verdict.to_json(),
            "violations": 0 if verdict.valid else
            len(verdict.failures) + len(verdict.lost_writes),
            "expected_losses": bool(beyond) and not verdict.valid,
            "valid": verdict.valid or bool(beyond), "check_seconds": check_s,
            "t0": self.t0,  # the monotonic time the fault times count from
            "worst_unavailability": stalls}
        (self.out / "faults.json").write_text(json.dumps(report["faults"], indent=1))
        (self.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
        self._plot(ops)
        report["summary"] = verdict.summary()
        return report

    def _unavailability(self, ops: list[Any]) -> dict[str, float]:
        return worst_unavailability(ops, self.records, self.t0, self.o.fault_interval,
                                    self.client.partition_id)

    def _plot(self, ops: list[Any]) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        seconds = int(self.o.duration) + 1
        rate = [0] * seconds
        latency: list[list[float]] = [[] for _ in range(seconds)]
        for op in ops:
            second = int(op.invoke - self.t0)
            if op.status == "ok" and 0 <= second < seconds and op.process >= 0:
                rate[second] += 1
                latency[second].append((op.complete - op.invoke) * 1000)
        p99 = [sorted(ls)[int(0.99 * (len(ls) - 1))] if ls else 0 for ls in latency]
        fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
        top.plot(rate)
        top.set_ylabel("ops/s ok")
        bottom.plot(p99)
        bottom.set_ylabel("p99 latency, ms")
        bottom.set_xlabel("seconds")
        for record in self.records:
            for axis in (top, bottom):
                axis.axvline(record.start, color="red", alpha=0.4)
            top.annotate(record.kind, (record.start, max(rate) or 1), fontsize=7, rotation=90)
        fig.savefig(self.out / "timeline.png", dpi=100)
        plt.close(fig)


def worst_unavailability(ops: list[Any], records: list[FaultRecord], t0: float,
                         interval: float, partition_id: Any) -> dict[str, float]:
    """Per fault kind, the longest a write to a partition the fault hit was blocked or
    refused: the longest write (ok or indeterminate; the client retries retryable refusals
    within its invocation timeout) to an affected partition invoked from the fault's start
    until one interval after its end, or until the next fault if that comes first."""
    writes = [(op.invoke - t0, op.complete - op.invoke, partition_id(op.key))
              for op in ops if op.f != "get" and op.process >= 0 and op.status != "fail"]
    faults = [r for r in records if "skipped" not in r.note]
    worst: dict[str, float] = {}
    for n, record in enumerate(faults):
        hit = set(record.affected)
        until = record.end + interval
        if n + 1 < len(faults):
            until = min(until, faults[n + 1].start)
        stall = max((took for at, took, pid in writes
                     if record.start <= at < until and (not hit or pid in hit)), default=0.0)
        worst[record.kind] = max(worst.get(record.kind, 0.0), stall)
    return worst
