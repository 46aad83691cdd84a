"""How long writes stall when a member is killed: one client writes, as fast as it can, keys
owned by the victim (so every write waits for the promotion); the victim is SIGKILLed, and
the longest write after the kill is the stall. Repeated on fresh clusters.

    python tools/bench_failover.py --runs 5 --victim master
    python tools/bench_failover.py --runs 5 --victim member
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid


def cli(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "grid", *args], check=True,
                          capture_output=True, text=True).stdout


def one_run(victim_kind: str, members: int, heartbeat_timeout: float) -> float:
    import grid
    from grid.client.registry import read_registry, registry_path

    name = f"fo{uuid.uuid4().hex[:8]}"
    cli("start", "--detach", "--members", str(members), "--heartbeat-timeout",
        str(heartbeat_timeout), "--cluster-name", name)
    try:
        with grid.connect(cluster_name=name) as client:
            status = json.loads(cli("status", "--json", "--cluster-name", name))
            victim = next(m for m in status["members"]
                          if bool(m.get("master")) == (victim_kind == "master"))
            pid = next(m["pid"] for m in read_registry(registry_path(name))["members"]
                       if m["name"] == victim["name"])
            owned = {p for p, row in client.partition_replicas().items()
                     if row[0] == victim["uuid"]}
            keys = [k for k in (f"k{i}" for i in range(5000))
                    if client.partition_id(k) in owned][:20]
            m = client.get_map("failover")
            killed = []
            threading.Timer(1.0, lambda: (killed.append(time.monotonic()),
                                          os.kill(pid, signal.SIGKILL))).start()
            worst, stop = 0.0, time.monotonic() + 4.0
            n = 0
            while time.monotonic() < stop:
                started = time.monotonic()
                m.put(keys[n % len(keys)], b"x" * 100)
                n += 1
                if killed and started >= killed[0] - 0.5:
                    worst = max(worst, time.monotonic() - started)
            return worst
    finally:
        subprocess.run([sys.executable, "-m", "grid", "stop", "--cluster-name", name],
                       capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--victim", choices=["master", "member"], default="master")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--heartbeat-timeout", type=float, default=4.0)
    args = parser.parse_args()
    stalls = [one_run(args.victim, args.members, args.heartbeat_timeout)
              for _ in range(args.runs)]
    print(f"{args.victim} kill, {args.members} members: longest write after the kill, "
          f"{args.runs} runs: " + ", ".join(f"{s * 1000:.0f} ms" for s in stalls)
          + f"; median {statistics.median(stalls) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
