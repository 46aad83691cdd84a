"""Python bytecodes per operation, in the client and in all members together, by function.

    python tools/count_bytecodes.py put                 # the functions that run most
    python tools/count_bytecodes.py put_all --top 40
    python tools/count_bytecodes.py get --base HEAD~2   # the same counted in a revision, and ratios
    python tools/count_bytecodes.py put --compiled      # what still runs as Python, compiled

Starts a 3-member cluster (backup 1) whose members count on signals (grid/bytecode_count.py),
fills 20,000 keys with 100-byte values, makes some warm-up operations, then counts the
bytecodes the client and every member run over ``--ops`` operations of one synchronous client,
and prints them per operation. Nobody busy-polls while counting (a spin's bytecodes would
depend on timing), so repeated counts agree within a percent or two: the timer ticks and how
many messages one wake-up finds still vary a little.

A rate on a small shared machine drifts 20–40% from one minute to the next; these counts do
not, so they say where the work is and whether a change removed some. They are not a time: a
bytecode that calls or allocates costs more than one that adds, and a check moved into C
calls (``set(map(type, v))``, ``min(v)``) can run fewer bytecodes and still take longer than
the loop it replaced. Time a changed function against its old self in one process (timeit,
alternating) before taking fewer bytecodes for a gain. ``tools/bench_ab.py --instructions``
counts the client's machine instructions instead. ``--base`` needs a revision that has this
tool's member hook.

Every module runs from source while counting (compiled code, grid/compiled.py, runs no
bytecode), unless ``--compiled``: then the working tree's compiled build runs as installed, and
what is counted is the Python left around it, which is where compiling more could still gain.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from grid.compiled import PURE_ENV
from grid.compiled import status as compiled_status
from grid.compiled import summary as compiled_summary

ROOT = Path(__file__).resolve().parent.parent
OPS = ("get", "put", "get_all", "put_all", "remove")
# Run by the tree being counted (its own code, its own cluster); prints a JSON result.
COUNTER = r"""
import collections, json, os, signal, subprocess, sys, time, uuid
from pathlib import Path
import grid
from grid.bytecode_count import COUNT_BYTECODES_ENV, BytecodeCounter, read_counts
from grid.client import invocation

# Counted members run many times slower: a batch can outlast the client's wait between two
# looks for a dead member (psutil, thousands of bytecodes), which an uncounted run never makes.
invocation.LIVENESS_CHECK_S = 60.0

op, ops, folder = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
name = f"bytecodes{uuid.uuid4().hex[:8]}"
env = {**os.environ, COUNT_BYTECODES_ENV: str(folder), "SHMGRID_MEMBER_BUSY_POLL_US": "0",
       "SHMGRID_CLIENT_BUSY_POLL_US": "0"}
os.environ["SHMGRID_CLIENT_BUSY_POLL_US"] = "0"


def shmgrid(*args):
    return subprocess.run([sys.executable, "-m", "grid", *args, "--cluster-name", name],
                          env=env, check=True, capture_output=True, text=True,
                          timeout=120).stdout


shmgrid("start", "--detach", "--members", "3", "--backup-count", "1")
try:
    pids = [m["pid"] for m in json.loads(shmgrid("status", "--json"))["members"]]
    keys = [f"key-{i}" for i in range(20_000)]
    value = b"v" * 100
    batches = [keys[i:i + 100] for i in range(0, len(keys), 100)]
    with grid.connect(cluster_name=name) as client:
        m = client.get_map("bytecodes")
        for batch in batches:
            m.put_all(dict.fromkeys(batch, value))
        run = {"get": lambda i: m.get(keys[i % len(keys)]),
               "put": lambda i: m.put(keys[i % len(keys)], value),
               "remove": lambda i: m.remove(keys[i % len(keys)]),
               "get_all": lambda i: m.get_all(batches[i % len(batches)]),
               "put_all": lambda i: m.put_all(dict.fromkeys(batches[i % len(batches)], value)),
               }[op]
        for i in range(50):
            run(i)
        time.sleep(0.3)  # what the warm-up left to do (acks, ticks) is done
        for pid in pids:
            os.kill(pid, signal.SIGUSR2)
        time.sleep(0.3)
        counter = BytecodeCounter()
        counter.start()
        for i in range(50, 50 + ops):
            run(i)
        counter.stop()
        time.sleep(0.3)  # the last acknowledgements are counted too
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        files = [folder / f"bytecodes-{pid}.txt" for pid in pids]
        deadline = time.monotonic() + 30
        while not all(f.exists() for f in files) and time.monotonic() < deadline:
            time.sleep(0.1)
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise SystemExit(f"members wrote no counts: {missing}")
        members = collections.Counter()
        for f in files:
            members.update(read_counts(f))
    print(json.dumps({"client": dict(counter.counts), "members": dict(members)}))
finally:
    shmgrid("stop")
"""


def count(tree: Path, op: str, ops: int, compiled: bool = False
          ) -> dict[str, collections.Counter[str]]:
    """Bytecodes per ``op`` of the client and of all members, by function, counted by
    ``tree``'s code: all of it run from source, or (``compiled``) with its compiled build."""
    with tempfile.TemporaryDirectory(prefix="shmgrid-bytecodes-") as folder:
        # A compiled module (grid/compiled.py) runs no bytecode: every one runs from source,
        # unless what is asked is the Python left around the compiled ones.
        env = {**os.environ, "PYTHONPATH": str(tree), PURE_ENV: "0" if compiled else "1"}
        done = subprocess.run([sys.executable, "-c", COUNTER, op, str(ops), folder],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"counting in {tree} failed:\n{done.stderr[-3000:]}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    return {side: collections.Counter({name: n / ops for name, n in counts.items()})
            for side, counts in raw.items()}


def _unlined(name: str) -> str:
    """"f (file.py:12)" as "f (file.py)": a function keeps its name when lines move."""
    return re.sub(r":\d+\)$", ")", name)


def _unlined_counts(counts: collections.Counter[str]) -> collections.Counter[str]:
    merged: collections.Counter[str] = collections.Counter()
    for name, n in counts.items():
        merged[_unlined(name)] += n
    return merged


def show(label: str, counts: collections.Counter[str], top: int,
         base: collections.Counter[str] | None) -> None:
    total = sum(counts.values())
    if base is not None:  # functions by name and file (two of one name in a file: summed)
        counts, base = _unlined_counts(counts), _unlined_counts(base)
    line = f"{label}: {total:,.0f} bytecodes an operation"
    if base is not None:
        base_total = sum(base.values())
        line += f" (base {base_total:,.0f}, ratio {total / base_total:.3f})"
    print(line)
    for name, n in counts.most_common(top):
        was = "" if base is None else f"{base.get(name, 0):>10,.1f}"
        print(f"{n:>10,.1f}{was}  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("op", choices=OPS, help="the operation counted")
    parser.add_argument("--ops", type=int, default=None,
                        help="operations counted (default 500, 50 for batches)")
    parser.add_argument("--top", type=int, default=20,
                        help="functions listed per side (default 20)")
    parser.add_argument("--base", metavar="REV",
                        help="count a git revision too (in a temporary worktree) and compare")
    parser.add_argument("--compiled", action="store_true",
                        help="run the working tree's compiled build (grid/compiled.py) and count "
                             "the Python still run around it")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    ops = args.ops or (50 if args.op.endswith("_all") else 500)
    if ops < 1:
        parser.error("--ops must be at least 1")
    if args.compiled:
        if args.base:
            parser.error("--compiled counts the working tree's build only (a revision's "
                         "worktree has none): leave out --base")
        states = compiled_status()
        if not all(state == "compiled" for state in states.values()):
            parser.error(f"--compiled needs the compiled build: {compiled_summary()}")
    base = None
    if args.base:
        with tempfile.TemporaryDirectory(prefix="shmgrid-bytecodes-base-") as tmp:
            tree = Path(tmp) / "base"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.base],
                           cwd=ROOT, check=True, capture_output=True)
            try:
                if not (tree / "grid" / "bytecode_count.py").exists():
                    raise SystemExit(f"{args.base} has no member hook to count with")
                print(f"counting {args.op} in {args.base}", file=sys.stderr, flush=True)
                base = count(tree, args.op, ops)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                               capture_output=True)
    print(f"counting {args.op} in the working tree", file=sys.stderr, flush=True)
    counts = count(ROOT, args.op, ops, args.compiled)
    if args.json:
        result = {side: {"total": sum(c.values()), "functions": dict(c)}
                  for side, c in counts.items()}
        if base is not None:
            for side, c in base.items():
                result[side]["base_total"] = sum(c.values())
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.op}, {ops} counted" + (f"; second column: {args.base}" if base else "")
          + ("; compiled modules run no bytecode (not listed)" if args.compiled else ""))
    for side in ("client", "members"):
        show(side, counts[side], args.top, None if base is None else base[side])
    return 0


if __name__ == "__main__":
    sys.exit(main())
