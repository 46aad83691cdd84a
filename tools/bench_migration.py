"""How fast partitions move: after a kill, on a join, at two parallelism settings.

    python tools/bench_migration.py --keys 200000 --value-size 100

For each case a fresh local cluster (3 members, backup 1) is started with `shmgrid start`,
loaded with put_all, disturbed, and watched through the members' status:

- kill: SIGKILL one member; the time until every partition it owned takes a write again, and
  until the cluster is safe (its lost backups re-created);
- join: `shmgrid add-member`; the time until safe and balanced (from the command, the new
  process's start-up included), and the entries and bytes the members sent in migration
  fragments per second of that time; a reader's get p99 from the join until safe, against
  its p99 before;
- the join again with max_parallel_migrations 1 against 10 (same data, same run): the ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import grid

ROOT = Path(__file__).resolve().parent.parent


def shmgrid(*args: str, env: dict | None = None) -> None:
    subprocess.run([sys.executable, "-m", "grid", *args], check=True, capture_output=True,
                   env={**os.environ, **(env or {})}, cwd=ROOT, timeout=600)


class Cluster:
    def __init__(self, keys: int, value_size: int, parallel: int = 10) -> None:
        self.name = f"bm{uuid.uuid4().hex[:8]}"
        shmgrid("start", "--detach", "--cluster-name", self.name,
                env={"SHMGRID_MAX_PARALLEL_MIGRATIONS": str(parallel)})
        self.client = grid.connect(cluster_name=self.name)
        self.map = self.client.get_map("bench")
        value = os.urandom(value_size)
        batch = max(1, min(1000, 4_000_000 // (value_size + 16)))
        for start in range(0, keys, batch):
            self.map.put_all({k: value for k in range(start, min(keys, start + batch))})
        self.keys = keys

    def statuses(self) -> list[dict]:
        out = []
        for member in self.client.cluster.members:
            status = self.client.cluster.member_status(member)
            if status:
                out.append(status)
        return out

    def safe_and_balanced(self) -> bool:
        rows = self.statuses()
        owned = [r["owned"] for r in rows]
        return any(r.get("master") and r.get("safe") for r in rows) and \
            max(owned) - min(owned) <= 1

    def sent(self) -> tuple[int, int]:
        rows = self.statuses()
        return sum(r["sent_entries"] for r in rows), sum(r["sent_bytes"] for r in rows)

    def wait(self, predicate, timeout: float = 600, give_up: bool = False) -> float:
        start = time.monotonic()
        while not predicate():
            if time.monotonic() - start > timeout:
                if give_up:
                    break
                raise SystemExit(f"timed out after {timeout} s")
            self.statuses()
            time.sleep(0.02)
        return time.monotonic() - start

    def close(self) -> None:
        self.client.close()
        shmgrid("stop", "--cluster-name", self.name)


def kill_case(keys: int, value_size: int) -> dict:
    cluster = Cluster(keys, value_size)
    try:
        victim = next(r for r in cluster.statuses() if not r.get("master"))
        owners = cluster.client.partition_owners()
        theirs = sorted(pid for pid, owner in owners.items() if owner == victim["uuid"])
        probe = {pid: next(k for k in range(10 * keys) if cluster.client.partition_id(k) == pid)
                 for pid in theirs}
        start = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        for key in probe.values():
            cluster.map.set(key, b"after the kill")
        writes_s = time.monotonic() - start
        safe_s = writes_s + cluster.wait(cluster.safe_and_balanced)
        return {"writes_s": writes_s, "safe_s": safe_s, "partitions": len(theirs)}
    finally:
        cluster.close()


def join_case(keys: int, value_size: int, parallel: int, reads: bool) -> dict:
    cluster = Cluster(keys, value_size, parallel)
    latencies: dict[str, list[float]] = {"idle": [], "moving": []}
    phase = ["idle"]
    stop = threading.Event()

    def reader() -> None:
        with grid.connect(cluster_name=cluster.name) as client:
            m = client.get_map("bench")
            rng = random.Random(1)
            while not stop.is_set():
                t = time.perf_counter()
                m.get(rng.randrange(keys))
                latencies[phase[0]].append(time.perf_counter() - t)

    thread = threading.Thread(target=reader, daemon=True)
    try:
        if reads:
            thread.start()
            # The idle phase watches the members' status as often as the moving phase does,
            # so that both percentiles carry the same polling load.
            cluster.wait(lambda: False, timeout=2.0, give_up=True)
        before = cluster.sent()
        start = time.monotonic()
        shmgrid("add-member", "--cluster-name", cluster.name)
        cluster.wait(lambda: len(cluster.statuses()) == 4)
        phase[0] = "moving"  # from the join on: the new process's start-up is not counted
        moving = cluster.wait(cluster.safe_and_balanced)
        seconds = time.monotonic() - start
        after = cluster.sent()
        stop.set()
        if reads:
            thread.join(timeout=10)
        result = {"seconds": seconds, "moving_s": moving, "entries": after[0] - before[0],
                  "bytes": after[1] - before[1]}
        if reads and latencies["idle"] and latencies["moving"]:
            result["p99_idle_ms"] = p99(latencies["idle"]) * 1000
            result["p99_moving_ms"] = p99(latencies["moving"]) * 1000
        return result
    finally:
        stop.set()
        cluster.close()


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 100 else max(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="entries (default 200000)")
    parser.add_argument("--value-size", type=int, default=100, help="bytes (default 100)")
    parser.add_argument("--skip-kill", action="store_true", help="skip the kill case")
    parser.add_argument("--skip-parallel", action="store_true",
                        help="skip the max_parallel_migrations 1 against 10 comparison")
    args = parser.parse_args()
    print(f"{args.keys:,} keys of {args.value_size} bytes, 3 members, backup 1")
    if not args.skip_kill:
        kill = kill_case(args.keys, args.value_size)
        print(f"kill one member: its {kill['partitions']} partitions take writes after "
              f"{kill['writes_s']:.2f} s; safe again after {kill['safe_s']:.2f} s")
    join = join_case(args.keys, args.value_size, 10, reads=True)
    print(f"add a 4th member: safe and balanced after {join['seconds']:.2f} s "
          f"({join['moving_s']:.2f} s of them after it joined); "
          f"{join['entries']:,} entries ({join['bytes'] / 1e6:.1f} MB) moved: "
          f"{join['entries'] / join['seconds']:,.0f} entries/s, "
          f"{join['bytes'] / join['seconds'] / 1e6:.1f} MB/s over the whole time; "
          f"{join['entries'] / join['moving_s']:,.0f} entries/s, "
          f"{join['bytes'] / join['moving_s'] / 1e6:.1f} MB/s after the join")
    if "p99_idle_ms" in join:
        print(f"get p99 while rebalancing {join['p99_moving_ms']:.3f} ms, idle "
              f"{join['p99_idle_ms']:.3f} ms: {join['p99_moving_ms'] / join['p99_idle_ms']:.2f}x")
    if not args.skip_parallel:
        one = join_case(args.keys, args.value_size, 1, reads=False)
        ten = join_case(args.keys, args.value_size, 10, reads=False)
        print(f"max_parallel_migrations 1: {one['seconds']:.2f} s, 10: {ten['seconds']:.2f} s "
              f"(10 is {one['seconds'] / ten['seconds']:.2f}x as fast)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
