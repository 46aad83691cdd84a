"""How fast a cluster restarts from its files, and what persistence costs a write.

    python tools/bench_restart.py --keys 1000000 --value-size 100

1. Restart: a 3-member cluster (backup 1) started with --data-dir is loaded with put_all and
   stopped; then `shmgrid start --data-dir` is timed until every partition answers a get.
   Each member's own load time and records come from `status --json`.
2. Writes: the same single-client put loop (`--seconds` each) on a cluster without
   persistence and with persistence_fsync always, interval and never, one after the other;
   puts per second and the ratio to no persistence.
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
import grid.config

ROOT = Path(__file__).resolve().parent.parent


def shmgrid(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "grid", *args], check=True,
                          capture_output=True, text=True, cwd=ROOT, timeout=900).stdout


def restart_case(keys: int, value_size: int) -> dict:
    name = f"br{uuid.uuid4().hex[:8]}"
    folder = tempfile.mkdtemp(prefix="shmgrid-bench-restart-")
    try:
        shmgrid("start", "--detach", "--cluster-name", name, "--data-dir", folder)
        with grid.connect(cluster_name=name) as client:
            m = client.get_map("bench")
            value = os.urandom(value_size)
            batch = max(1, min(1000, 4_000_000 // (value_size + 16)))
            for start in range(0, keys, batch):
                m.put_all({k: value for k in range(start, min(keys, start + batch))})
            probes = {client.partition_id(k): k for k in range(keys)}
        shmgrid("stop", "--cluster-name", name)
        started = time.monotonic()
        shmgrid("start", "--detach", "--cluster-name", name, "--data-dir", folder)
        with grid.connect(cluster_name=name) as client:
            m = client.get_map("bench")
            for key in probes.values():
                assert m.get(key) is not None
        seconds = time.monotonic() - started
        status = json.loads(shmgrid("status", "--json", "--cluster-name", name))
        loads = [(r["name"], r["persistence"]["loaded_records"],
                  r["persistence"]["load_seconds"]) for r in status["members"]]
        shmgrid("stop", "--cluster-name", name)
        return {"seconds": seconds, "loads": loads}
    finally:
        subprocess.run([sys.executable, "-m", "grid", "stop", "--cluster-name", name],
                       capture_output=True, cwd=ROOT)
        shutil.rmtree(folder, ignore_errors=True)


def put_rate(fsync: str | None, seconds: float) -> float:
    name = f"bw{uuid.uuid4().hex[:8]}"
    folder = tempfile.mkdtemp(prefix="shmgrid-bench-restart-")
    args = ["start", "--detach", "--cluster-name", name]
    if fsync:
        args += ["--data-dir", folder, "--fsync", fsync]
    try:
        shmgrid(*args)
        with grid.connect(cluster_name=name) as client:
            m = client.get_map("bench")
            value = b"x" * 100
            count, deadline = 0, time.monotonic() + seconds
            while time.monotonic() < deadline:
                m.set(count, value)
                count += 1
        return count / seconds
    finally:
        subprocess.run([sys.executable, "-m", "grid", "stop", "--cluster-name", name],
                       capture_output=True, cwd=ROOT)
        shutil.rmtree(folder, ignore_errors=True)


def window_case(fsync: str, seconds: float) -> tuple[int, int]:
    """Writes from two client threads for ``seconds``, then kill -9 of the supervisor and
    every member at once, then a restart: (acknowledged writes, those missing after it)."""
    import signal
    import threading

    name = f"bk{uuid.uuid4().hex[:8]}"
    folder = tempfile.mkdtemp(prefix="shmgrid-bench-restart-")
    acked: dict[int, int] = {}
    lock, stop = threading.Lock(), threading.Event()

    def writer(offset: int) -> None:
        try:
            with grid.connect(cluster_name=name, invocation_timeout=2) as client:
                m, i = client.get_map("w"), offset
                while not stop.is_set():
                    m.set(i, i)
                    with lock:
                        acked[i] = i
                    i += 2
        except Exception:
            pass  # the kill: the last call fails, and it was never acknowledged

    try:
        shmgrid("start", "--detach", "--cluster-name", name, "--data-dir", folder,
                "--fsync", fsync)
        registry = json.loads(Path(grid.config.GridConfig(cluster_name=name)
                                   .registry_path()).read_text())
        threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        for pid in [registry["supervisor"]["pid"], *(m["pid"] for m in registry["members"])]:
            os.kill(pid, signal.SIGKILL)
        stop.set()
        for t in threads:
            t.join()
        time.sleep(0.5)
        shmgrid("start", "--detach", "--cluster-name", name, "--data-dir", folder,
                "--fsync", fsync)
        with grid.connect(cluster_name=name) as client:
            got = client.get_map("w").get_all(list(acked))
        return len(acked), sum(1 for k, v in acked.items() if got.get(k) != v)
    finally:
        subprocess.run([sys.executable, "-m", "grid", "stop", "--cluster-name", name],
                       capture_output=True, cwd=ROOT)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=3.0, help="per put-rate case")
    args = parser.parse_args()
    result = restart_case(args.keys, args.value_size)
    records = sum(n for _, n, _ in result["loads"])
    slowest = max(s for _, _, s in result["loads"])
    print(f"restart of {args.keys:,} keys x {args.value_size} B (3 members, backup 1): every "
          f"partition serves {result['seconds']:.2f} s after `shmgrid start`")
    print("  loads: " + ", ".join(f"{n} {r:,} records in {s:.2f} s" for n, r, s in
                                  result["loads"]))
    print(f"  {records:,} records, slowest member {slowest:.2f} s: "
          f"{records / slowest:,.0f} records/s for the cluster as a whole")
    base = put_rate(None, args.seconds)
    print(f"put, one client, no persistence: {base:,.0f}/s")
    for fsync in ("always", "interval", "never"):
        rate = put_rate(fsync, args.seconds)
        print(f"put, persistence fsync {fsync}: {rate:,.0f}/s ({rate / base:.2f}x)")
    for fsync in ("always", "interval", "never"):
        acked, lost = window_case(fsync, args.seconds)
        print(f"kill -9 of everything under writes, fsync {fsync}: {acked:,} writes "
              f"acknowledged, {lost:,} missing after the restart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
