"""Compare `shmgrid bench` between a git revision and the working tree, in one go.

    python tools/bench_ab.py HEAD~1 --rounds 2 --seconds 3

Checks the revision out into a temporary worktree, then runs the bench alternately against
each tree (a fresh 3-member cluster for every run, started and stopped with that tree's own
code), and prints the mean of each operation's entries/s per tree and their ratio. Alternating
spreads drift in the machine's speed over both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"│\s*([^│\s][^│]*?)\s*│\s*([\d,]+)\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│")


def run_once(tree: Path, seconds: float, clients: int) -> dict[str, tuple[float, float]]:
    """One bench against a new cluster run by ``tree``'s code: op -> (entries/s, p50 ms)."""
    name = f"ab{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(tree)}

    def shmgrid(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "grid", *args, "--cluster-name", name],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"shmgrid {args[0]} failed in {tree}:\n{done.stderr}")
        return done.stdout

    shmgrid("start", "--detach")
    try:
        out = shmgrid("bench", "--seconds", str(seconds), "--clients", str(clients))
    finally:
        shmgrid("stop")
    return {m[1]: (float(m[2].replace(",", "")), float(m[3])) for m in ROW.finditer(out)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the git revision to compare with (e.g. HEAD~1)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per tree (default 2)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per op (default 3)")
    parser.add_argument("--clients", type=int, default=1, help="client processes (default 1)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shmgrid-ab-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.revision],
                       cwd=ROOT, check=True, capture_output=True)
        try:
            runs: dict[str, list[dict]] = {"base": [], "tree": []}
            for round_no in range(args.rounds):
                for label, tree in (("base", base), ("tree", ROOT)):
                    print(f"round {round_no + 1}: {label}", file=sys.stderr, flush=True)
                    runs[label].append(run_once(tree, args.seconds, args.clients))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           capture_output=True)
    result = {}
    for op in runs["tree"][0]:
        base_rate = statistics.mean(r[op][0] for r in runs["base"] if op in r)
        tree_rate = statistics.mean(r[op][0] for r in runs["tree"])
        result[op] = {"base": base_rate, "tree": tree_rate, "ratio": tree_rate / base_rate}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{'operation':<16}{args.revision + ' /s':>16}{'tree /s':>14}{'ratio':>8}")
    for op, r in result.items():
        print(f"{op:<16}{r['base']:>16,.0f}{r['tree']:>14,.0f}{r['ratio']:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
