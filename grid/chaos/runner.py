"""``shmgrid chaos``: a workload from several client processes, seeded faults, a recorded
history, and a verdict from the checker (grid/chaos/checker.py).

The runner starts its own cluster (or attaches to a running one), starts ``clients`` worker
processes (grid/chaos/workload.py), and every ``fault_interval`` injects the next fault of the
seeded schedule (grid/chaos/faults.py). A destructive fault waits until the cluster is safe
again (every partition has its backups): then at most ``backup_count`` members are ever down
at once, the failures the grid promises to survive. A fault that could not wait (the cluster
stayed unsafe) is injected anyway and marked beyond the promise; anomalies on the partitions
it hit are reported as expected and counted apart (grid/chaos/analysis.py). A state change
holds a cluster state for a while, then goes back. After the last fault the cluster settles,
every key is read once more, and the history is checked.

Attached to a running cluster (``cluster_name``), the runner takes the member count, backup
count and heartbeat timeout from it, and leaves it running. The cluster must be ACTIVE: in any
other state lost backups are not made again, so after the first kill no fault would be within
the promise.

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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from grid.chaos.faults import DESTRUCTIVE, HELD_STATES, FaultRecord, PlannedFault, plan_faults
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
        "get": 45, "put": 30, "put_if_absent": 5, "replace": 5, "remove": 5, "put_all": 5,
        "get_all": 5})
    faults: dict[str, int] = field(default_factory=lambda: {
        "kill": 1, "pause": 1, "master-kill": 1, "stop-member": 1, "add-member": 1,
        "state-change": 1})
    fault_interval: float = 5.0
    members: int = 4
    backup_count: int = 1
    heartbeat_timeout: float = 4.0
    invocation_timeout: float = 30.0
    cluster_name: str | None = None  # attach to this running cluster
    out: str = "chaos-out"
    live: bool = True
    local_reads: bool = False  # gets read the owners' shared memory where they can


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

    def registry(self) -> dict[str, Any]:
        from grid.client.registry import read_registry, registry_path

        return read_registry(registry_path(self.name))

    def members(self) -> list[dict[str, Any]]:
        return list(self.registry()["members"])

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
        else:
            self._adopt()
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
                counters, self.o.local_reads)) for w in range(self.o.clients)]
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

    def _adopt(self) -> None:
        """Attached: the options that describe the cluster are the cluster's own."""
        registry = self.cluster.registry()  # ClusterNotRunningError if there is none
        state = self.cluster.status()["state"]
        if state != "ACTIVE":
            raise ValueError(f"cluster {self.cluster.name} is {state}: a chaos run needs "
                             f"ACTIVE, where lost backups are made again (`shmgrid state "
                             f"ACTIVE --cluster-name {self.cluster.name}`)")
        config = registry.get("config") or {}
        self.o = replace(
            self.o, members=sum(1 for m in registry["members"] if not m.get("lite")),
            backup_count=int(config.get("backup_count", self.o.backup_count)),
            heartbeat_timeout=float(config.get("heartbeat_timeout", self.o.heartbeat_timeout)))

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
        elif kind == "state-change":
            self.cluster.wait_safe(self.o.fault_interval * 2)  # refused while migrations run
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
        if kind not in ("add-member", "state-change") and (victim is None or len(data) < 2):
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
        elif kind == "state-change":
            note = self._hold_state(HELD_STATES[int(planned.pick * len(HELD_STATES))],
                                    planned.pause_s)
        else:
            self.cluster.cli("add-member", check=False)
        affected = sorted(pid for pid, row in replicas.items()
                          if victim is not None and victim["uuid"] in row)
        self.records.append(FaultRecord(kind, victim["name"] if victim else None, start,
                                        time.monotonic() - self.t0, within, note, affected))

    def _hold_state(self, state: str, seconds: float) -> str:
        """Change the cluster to ``state``, hold it ``seconds``, change it back."""
        try:
            self.cluster.cli("state", state)
        except RuntimeError as exc:
            return f"skipped: {exc}"
        time.sleep(seconds)
        for _ in range(10):  # the way back must succeed, or the rest of the run is not chaos
            try:
                self.cluster.cli("state", "ACTIVE")
                break
            except RuntimeError:
                self.cluster.wait_safe(self.o.fault_interval)
        else:
            raise RuntimeError(f"the cluster did not go back to ACTIVE from {state}")
        return f"{state} for {seconds:.1f} s"

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
        from grid.chaos import analysis
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
        pid_of = self.client.partition_id
        violations, expected = analysis.split_by_promise(
            analysis.anomalies(verdict), self.records, self.t0, pid_of)
        for record, stall in zip(self.records, analysis.write_stalls(
                ops, self.records, self.t0, self.o.fault_interval, pid_of), strict=True):
            record.write_stall = stall
        done = [r for r in self.records if not r.skipped]
        worst: dict[str, float] = {}
        for record in done:
            worst[record.kind] = max(worst.get(record.kind, 0.0), record.write_stall)
        report = {
            "seed": self.o.seed, "duration": self.o.duration, "options": asdict(self.o),
            "operations": len(ops), "ok": sum(op.status == "ok" for op in ops),
            "refused": sum(op.status == "fail" for op in ops),
            "indeterminate": sum(op.status == "info" for op in ops),
            "local_gets": sum(op.local for op in ops),  # read from shared memory
            "faults": [asdict(r) for r in self.records],
            "faults_by_kind": dict(Counter(r.kind for r in done)),
            "beyond_promise": sum(not r.within_promise for r in done),
            "verdict": verdict.to_json(),
            "violations": len(violations),
            "expected_anomalies": len(expected),
            "anomalies": {"violations": [a.to_json() for a in violations],
                          "expected": [a.to_json() for a in expected]},
            "valid": not violations, "check_seconds": check_s,
            "t0": self.t0,  # the monotonic time the fault times count from
            "worst_unavailability": worst,
            "latency": self._latency(ops)}
        (self.out / "faults.json").write_text(json.dumps(report["faults"], indent=1))
        (self.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
        self._plot(ops)
        report["summary"] = verdict.summary()
        return report

    @staticmethod
    def _latency(ops: list[Any]) -> dict[str, Any]:
        try:
            from grid.chaos.analysis import latency_percentiles

            return latency_percentiles(ops)
        except ImportError:
            return {"missing": "latencies need hdrhistogram: pip install shmgrid[chaos]"}

    def _plot(self, ops: list[Any]) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            from grid.chaos.analysis import per_second
        except ImportError:
            return
        rate, p50, p99 = per_second(ops, self.t0, int(self.o.duration) + 1)
        fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
        top.plot(rate)
        top.set_ylabel("ops/s ok")
        bottom.plot(p50, label="p50")
        bottom.plot(p99, label="p99")
        bottom.set_yscale("log")
        bottom.set_ylabel("latency, ms")
        bottom.set_xlabel("seconds")
        bottom.legend(loc="upper right")
        for record in self.records:
            for axis in (top, bottom):
                axis.axvline(record.start, color="red", alpha=0.4)
            top.annotate(record.kind, (record.start, max(rate) or 1), fontsize=7, rotation=90)
        fig.savefig(self.out / "timeline.png", dpi=100)
        plt.close(fig)
