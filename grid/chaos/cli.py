"""The ``shmgrid chaos`` command: its options, and the verdict as a table."""

from __future__ import annotations

import argparse
import json
import sys

from grid.chaos.faults import FAULT_KINDS, HELD_STATES, parse_seconds, parse_weights
from grid.chaos.runner import ChaosOptions, Runner
from grid.chaos.workload import OPS
from grid.errors import GridError

DEFAULTS = ChaosOptions()


def add_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--cluster-name", help="attach to this running cluster (its faults are "
                    "real: members are killed) instead of starting one")
    sp.add_argument("--duration", default=f"{DEFAULTS.duration:g}s",
                    help="how long the workload runs: 60, 60s or 2m (default 60s)")
    sp.add_argument("--seed", type=int, default=DEFAULTS.seed,
                    help="the seed of the workload and the fault schedule (default 1)")
    sp.add_argument("--clients", type=int, default=DEFAULTS.clients,
                    help="client processes (default 4)")
    sp.add_argument("--keys", type=int, default=DEFAULTS.keys, help="keys (default 10000)")
    sp.add_argument("--value-size", type=int, default=DEFAULTS.value_size,
                    help="bytes per value, at least 8 (default 100)")
    sp.add_argument("--mix", default=",".join(f"{k}={v}" for k, v in DEFAULTS.mix.items()),
                    help=f"operation weights, of {', '.join(OPS)} (default %(default)s)")
    sp.add_argument("--faults",
                    default=",".join(f"{k}={v}" for k, v in DEFAULTS.faults.items()),
                    help=f"fault weights, of {', '.join(FAULT_KINDS)}; kill and master-kill "
                    "are SIGKILL, pause is SIGSTOP for a random time on either side of the "
                    "heartbeat timeout, stop-member a graceful leave, state-change holds "
                    f"one of {', '.join(HELD_STATES)} as long and goes back "
                    "(default %(default)s)")
    sp.add_argument("--fault-interval", default=f"{DEFAULTS.fault_interval:g}s",
                    help="seconds between faults (default 5s)")
    sp.add_argument("--members", type=int, default=DEFAULTS.members,
                    help="data members of the cluster it starts, kept at this count after "
                    "faults (default 4; attached: the cluster's)")
    sp.add_argument("--backup-count", type=int, default=DEFAULTS.backup_count,
                    help="synchronous backups (default 1; attached: the cluster's)")
    sp.add_argument("--heartbeat-timeout", type=float, default=DEFAULTS.heartbeat_timeout,
                    help="of the cluster it starts (default 4; attached: the cluster's)")
    sp.add_argument("--out", default=DEFAULTS.out,
                    help="folder for history.jsonl, faults.json, report.json and "
                    "timeline.png (default %(default)s)")
    sp.add_argument("--json", action="store_true", help="print the report as JSON")
    sp.add_argument("--local-reads", action="store_true",
                    help="the clients' gets read the owners' shared memory where they can "
                         "(the checker judges them as any get; history lines say local)")


def options_from(args: argparse.Namespace) -> ChaosOptions:
    if args.value_size < 8 or args.keys < 1 or args.clients < 1 or args.members < 1:
        raise ValueError("--value-size must be at least 8, --keys, --clients and --members "
                         "at least 1")
    return ChaosOptions(
        duration=parse_seconds(args.duration), seed=args.seed, clients=args.clients,
        keys=args.keys, value_size=args.value_size,
        mix=parse_weights(args.mix, OPS, "--mix"),
        faults=parse_weights(args.faults, FAULT_KINDS, "--faults"),
        fault_interval=parse_seconds(args.fault_interval), members=args.members,
        backup_count=args.backup_count, heartbeat_timeout=args.heartbeat_timeout,
        cluster_name=args.cluster_name, out=args.out, live=not args.json,
        local_reads=args.local_reads)


def cmd_chaos(args: argparse.Namespace) -> int:
    try:
        report = Runner(options_from(args)).run()
    except GridError as exc:  # no such cluster, say
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "summary"}, indent=1,
                         default=str))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"chaos seed {report['seed']}: {report['operations']:,} "
                            f"operations, {len(report['faults'])} faults")
        for col in ("fault", "count", "worst write stall"):
            table.add_column(col, justify="left" if col == "fault" else "right")
        for kind, count in sorted(report["faults_by_kind"].items()):
            table.add_row(kind, str(count),
                          f"{report['worst_unavailability'].get(kind, 0.0):.2f} s")
        console = Console()
        console.print(table)
        latency = report["latency"]
        if "missing" in latency:
            print(latency["missing"])
        else:
            lat = Table(title="latency of successful operations, ms")
            for col in ("operation", "count", "p50", "p99", "p99.9", "max"):
                lat.add_column(col, justify="left" if col == "operation" else "right")
            for f, row in latency.items():
                lat.add_row(f, f"{row['count']:,}", *(f"{row[k]:.2f}" for k in (
                    "p50_ms", "p99_ms", "p999_ms", "max_ms")))
            console.print(lat)
        print(report["summary"])
        print(f"checked in {report['check_seconds']:.1f} s; history and report in "
              f"{args.out}")
        if report["expected_anomalies"]:
            print(f"{report['expected_anomalies']} anomalies are on partitions that "
                  f"{report['beyond_promise']} faults beyond the promise (more members down "
                  f"than backups) hit: expected; {report['violations']} are violations")
    if report["valid"]:
        print("verdict: VALID")
        return 0
    print("verdict: INVALID (a violation within the faults the grid promises to survive)",
          file=sys.stderr)
    return 1
