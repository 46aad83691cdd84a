"""Where the members' time goes under one synchronous client: py-spy samples of every member,
summed by function.

    python tools/profile_members.py put          # or get, put_all, put_all_tag, get_all
    python tools/profile_members.py put --seconds 8 --rate 200

Starts a 3-member cluster (backup 1), fills 20,000 keys with 100-byte values, runs the
operation in a loop from one client thread (put_all_tag: batches of 100 keys with one hash
tag a batch, so one owner and one backup) while `py-spy record` samples each member process
(`pip install shmgrid[bench]`; attaching needs ptrace rights: root, or
kernel.yama.ptrace_scope 0), then prints the share of samples spent in each function (inclusive,
and as the innermost frame). Time in `Poller.poll` is a member waiting for work.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import grid

KEYS = 20_000
BATCH = 100


def sample(pids: list[int], seconds: float, rate: int, directory: Path) -> list[Path]:
    """py-spy raw (collapsed) stacks of each process, sampled at the same time."""
    outputs = [directory / f"member-{pid}.txt" for pid in pids]
    spies = [subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--duration",
                               str(int(seconds)), "--rate", str(rate), "--format", "raw",
                               "--nonblocking", "--output", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for pid, out in zip(pids, outputs, strict=True)]
    for spy in spies:
        spy.wait()
    return [out for out in outputs if out.exists()]


def summarize(outputs: list[Path], top: int) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    innermost: collections.Counter[str] = collections.Counter()
    total = malformed = 0
    for out in outputs:
        for line in out.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():  # py-spy garbles a frame now and then
                malformed += 1
                continue
            n = int(count)
            functions = [frame.split(" (")[0] for frame in stack.split(";")]
            total += n
            for function in set(functions):
                inclusive[function] += n
            innermost[functions[-1]] += n
    if not total:
        return "no samples (does py-spy have ptrace rights?)"
    lines = [f"{total:,} samples over {len(outputs)} members"
             + (f" ({malformed} unreadable stacks left out)" if malformed else ""),
             "", "inclusive:"]
    lines += [f"{n / total:6.1%}  {f}" for f, n in inclusive.most_common(top)]
    lines += ["", "innermost frame:"]
    lines += [f"{n / total:6.1%}  {f}" for f, n in innermost.most_common(top // 2)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("operation", choices=["get", "put", "put_all", "put_all_tag", "get_all"])
    parser.add_argument("--seconds", type=float, default=8.0, help="sampling time (default 8)")
    parser.add_argument("--rate", type=int, default=200, help="samples per second (default 200)")
    parser.add_argument("--top", type=int, default=40, help="functions to list (default 40)")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        print("py-spy is not installed: pip install 'shmgrid[bench]'", file=sys.stderr)
        return 2
    name = f"profile{uuid.uuid4().hex[:8]}"
    subprocess.run([sys.executable, "-m", "grid", "start", "--detach", "--cluster-name", name,
                    "--members", "3"], check=True, capture_output=True)
    try:
        with grid.connect(cluster_name=name) as client:
            pids = [m.pid for m in client.cluster.members]
            m = client.get_map("profile")
            keys = [f"key-{i}" for i in range(KEYS)]
            value = os.urandom(100)
            m.put_all(dict.fromkeys(keys, value))
            batches = [keys[i:i + BATCH] for i in range(0, KEYS, BATCH)]
            tagged = [[f"{{t{n}}}{key}" for key in batch] for n, batch in enumerate(batches)]
            calls = {"get": lambda i: m.get(keys[i % KEYS]),
                     "put": lambda i: m.put(keys[i % KEYS], value),
                     "put_all": lambda i: m.put_all(dict.fromkeys(batches[i % len(batches)],
                                                                  value)),
                     "put_all_tag": lambda i: m.put_all(dict.fromkeys(tagged[i % len(tagged)],
                                                                      value)),
                     "get_all": lambda i: m.get_all(batches[i % len(batches)])}
            call = calls[args.operation]
            stop = threading.Event()
            done = [0]

            def loop() -> None:
                while not stop.is_set():
                    call(done[0])
                    done[0] += 1

            worker = threading.Thread(target=loop)
            started = time.monotonic()
            worker.start()
            with tempfile.TemporaryDirectory() as directory:
                outputs = sample(pids, args.seconds, args.rate, Path(directory))
                stop.set()
                worker.join()
                elapsed = time.monotonic() - started
                print(f"{args.operation}: {done[0] / elapsed:,.0f} calls/s while sampled")
                print(summarize(outputs, args.top))
    finally:
        subprocess.run([sys.executable, "-m", "grid", "stop", "--cluster-name", name],
                       capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
