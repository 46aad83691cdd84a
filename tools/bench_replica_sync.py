"""What differential sync (seed 003's Merkle trees) saves when a member rejoins, and what the
trees cost a write.

    python tools/bench_replica_sync.py --keys 1000000 --value-size 1024

For merkle_tree_depth 0 (whole fragments) and 10 (differences), one after the other in one
run: a 4-member cluster (backup 1) with --data-dir is loaded with put_all and put in
STABLE_CLUSTER. Then, for each fraction of changed keys (0 % and 10 %): member-3 is killed
(the state moves no partition meanwhile: its backups wait for it), that fraction of the keys
is overwritten,
member-3 is started again from its files (`restart-member`) and the time until the cluster is
safe again is taken, with the entries the migrations moved (members' sent_entries) and
member-3's own load time from disk. Last, in the differential cluster, one client's puts
alternate between partitions whose replicas keep Merkle trees (compared at the rejoin) and
partitions without: the trees' cost on the put path, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grid

ROOT = Path(__file__).resolve().parent.parent


def shmgrid(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run([sys.executable, "-m", "grid", *args], check=True,
                          capture_output=True, text=True, cwd=ROOT, timeout=1800,
                          env=env).stdout


def status(name: str) -> dict:
    return json.loads(shmgrid("status", "--json", "--cluster-name", name))


def wait(predicate, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def put_all(m, keys: range, value: bytes) -> None:
    batch = max(1, min(1000, 4_000_000 // (len(value) + 16)))
    for start in range(keys.start, keys.stop, batch * keys.step):
        m.put_all({k: value for k in range(start, min(keys.stop, start + batch * keys.step),
                                           keys.step)})


def put_rates(name: str, seconds: float) -> tuple[float, float]:
    """One client's puts, alternating between keys of partitions whose owner and backup keep
    Merkle trees (member-3 owns them: compared at its rejoin) and keys of partitions nobody
    compared (member-3 holds no replica of them): puts per second of each kind."""
    with grid.connect(cluster_name=name) as client:
        client.partition_owners()  # a fresh table
        table = client._invoker.table
        me = next(x.uuid for x in client.cluster.members if x.name == "member-3")
        kinds: tuple[list[int], list[int]] = ([], [])
        for k in range(10**9, 10**9 + 100_000):
            replicas = table.replicas(client.partition_id(k))
            if replicas[0] == me:
                kinds[0].append(k)
            elif me not in replicas:
                kinds[1].append(k)
        m, value = client.get_map("bench"), b"x" * 100
        spent, done = [0.0, 0.0], [0, 0]
        deadline = time.monotonic() + 2 * seconds
        while time.monotonic() < deadline:
            for kind in (0, 1):
                started = time.perf_counter()
                m.set(kinds[kind][done[kind] % len(kinds[kind])], value)
                spent[kind] += time.perf_counter() - started
                done[kind] += 1
        return done[0] / spent[0], done[1] / spent[1]


def run_depth(depth: int, keys: int, value_size: int, fractions: list[float],
              put_seconds: float) -> dict:
    name = f"bs{uuid.uuid4().hex[:8]}"
    folder = tempfile.mkdtemp(prefix="shmgrid-bench-sync-")
    env = {**os.environ, "SHMGRID_MERKLE_TREE_DEPTH": str(depth)}
    out: dict = {"depth": depth, "rejoins": []}
    try:
        shmgrid("start", "--detach", "--cluster-name", name, "--members", "4",
                "--data-dir", folder, env=env)
        with grid.connect(cluster_name=name, invocation_timeout=120) as client:
            m = client.get_map("bench")
            started = time.monotonic()
            put_all(m, range(keys), os.urandom(value_size))
            out["load_s"] = time.monotonic() - started
            client.cluster.change_state("STABLE_CLUSTER")
        for fraction in fractions:
            shmgrid("kill", "member-3", "--cluster-name", name)
            wait(lambda: len(status(name)["members"]) == 3, "member-3 to be removed")
            if fraction:
                with grid.connect(cluster_name=name, invocation_timeout=120) as client:
                    put_all(client.get_map("bench"), range(0, keys, round(1 / fraction)),
                            os.urandom(value_size))
            before = status(name)
            sent = sum(r["sent_entries"] for r in before["members"])
            sent_bytes = sum(r["sent_bytes"] for r in before["members"])
            started = time.monotonic()
            shmgrid("restart-member", "member-3", "--cluster-name", name)
            shmgrid("wait-safe", "--timeout", "600", "--cluster-name", name)
            seconds = time.monotonic() - started
            after = status(name)
            back = next(r for r in after["members"] if r["name"] == "member-3")
            out["rejoins"].append({
                "changed": fraction, "seconds": seconds,
                "load_s": back["persistence"]["load_seconds"],
                "held": back["owned"] + back["backups"],
                "loaded": back["persistence"]["loaded_records"],
                "sent_entries": sum(r["sent_entries"] for r in after["members"]) - sent,
                "sent_bytes": sum(r["sent_bytes"] for r in after["members"]) - sent_bytes})
        if depth:
            out["put_rates"] = put_rates(name, put_seconds)
        return out
    finally:
        subprocess.run([sys.executable, "-m", "grid", "stop", "--cluster-name", name],
                       capture_output=True, cwd=ROOT)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--changed", default="0,0.1",
                        help="fractions of keys changed while member-3 is away (0,0.1)")
    parser.add_argument("--put-seconds", type=float, default=5.0)
    parser.add_argument("--depth", type=int, default=10,
                        help="merkle_tree_depth of the differential run (default 10)")
    args = parser.parse_args()
    fractions = [float(x) for x in args.changed.split(",")]
    runs = [run_depth(depth, args.keys, args.value_size, fractions, args.put_seconds)
            for depth in (0, args.depth)]
    print(f"{args.keys:,} entries x {args.value_size} B, 4 members, backup 1, "
          f"STABLE_CLUSTER; member-3 killed and restarted from its files")
    print(f"{'changed':>8} {'mode':>16} {'to safe':>9} {'its load':>9} "
          f"{'entries moved':>14} {'MB moved':>9} {'of held':>8}")
    for i, fraction in enumerate(fractions):
        for run in runs:
            r = run["rejoins"][i]
            mode = f"depth {run['depth']}" if run["depth"] else "whole fragments"
            print(f"{fraction:>8.0%} {mode:>16} {r['seconds']:>8.2f}s {r['load_s']:>8.2f}s "
                  f"{r['sent_entries']:>14,} {r['sent_bytes'] / 1e6:>9.1f} "
                  f"{r['sent_entries'] / max(1, r['loaded']):>8.1%}")
        full, diff = runs[0]["rejoins"][i], runs[1]["rejoins"][i]
        print(f"{'':>8} differential / whole: time {diff['seconds'] / full['seconds']:.2f}x, "
              f"entries {diff['sent_entries'] / max(1, full['sent_entries']):.3f}x")
    with_trees, without = runs[1]["put_rates"]
    print(f"puts, one client, interleaved: {with_trees:,.0f}/s to partitions whose replicas "
          f"keep trees, {without:,.0f}/s to partitions without ({with_trees / without:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
