"""Compare `shmgrid bench` between a git revision and the working tree, in one go.

    python tools/bench_ab.py HEAD~1 --rounds 2 --seconds 3
    python tools/bench_ab.py HEAD~1 --instructions get      # the client's instructions per get
    python tools/bench_ab.py HEAD~1 --spark 500000 --rounds 2   # tools/bench_spark.py instead
    python tools/bench_ab.py HEAD~1 --local-reads --rounds 4    # clients reading shared memory
    python tools/bench_ab.py HEAD --pure-base --rounds 4        # what compiling the hot path gives

Checks the revision out into a temporary worktree, then runs the bench alternately against
each tree (a fresh 3-member cluster for every run, started and stopped with that tree's own
code; the bench's client is that tree's too, or with ``--same-client`` the working tree's),
and prints the mean of each operation's entries/s per tree and their ratio, and the members'
CPU per entry and its ratio where both trees' bench gives it. Alternating spreads drift in
the machine's speed over both sides, and each round the other tree goes first. The
revision's hot path is compiled in its worktree as the working tree's is (grid/compiled.py),
so that the code is compared, not the build; ``--pure-base`` runs it from source instead.
With ``--spark ROWS`` each run is instead that tree's ``tools/bench_spark.py`` (its
connector, with one timed run of each operation) against that tree's cluster; its Parquet
rows show the drift between runs.

With ``--local-reads`` each run is that tree's client reading from shared memory (a local
get, a local get_all of 100 keys spread over partitions and of 100 keys of one hash tag; p50
per call in ms), both trees' clients against one cluster run by the working tree: a local
read sends no message, so only the client's code differs.

On a small shared virtual machine that drift can still be 20% from one minute to the next.
``--instructions OP`` counts instead what does not drift: the instructions the client process
executes per operation (get, put, get_all, put_all), under valgrind's cachegrind (Debian's
valgrind package), as the difference between a client that makes ``--ops`` operations and one
that makes none. Repeated counts agree within about 0.2%. Both trees' clients talk to one
cluster run by the working tree; members' and kernel work and waiting are not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from worktrees import build

from grid.compiled import PURE_ENV

ROOT = Path(__file__).resolve().parent.parent
# operation, entries/s, p50 ms, p99 ms, calls, and the members' CPU µs per entry (newer trees)
ROW = re.compile(r"│\s*([^│\s][^│]*?)\s*│\s*([\d,]+)\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│"
                 r"\s*\d+\s*│(?:\s*([\d,.]+)\s*│)?")
# tools/bench_spark.py: operation, rows/s (best), median s
SPARK_ROW = re.compile(r"^((?:write|count|read)[^\n]*?)\s{2,}([\d,]+)\s+[\d.]+\s", re.M)
INSTRUCTION_OPS = ("get", "put", "get_all", "put_all")
# A client doing $AB_OPS operations of $AB_OP on cluster $AB_CLUSTER's map "ab" (20,000 keys,
# 100-byte values, batches of 100; with $AB_TAGS set, one hash tag a batch, as the working
# tree's tools/bench_ops.py tags them), after 20 that open its links.
CLIENT = """
import os, sys
sys.path.insert(0, os.environ["AB_TOOLS"])
import grid
from bench_ops import BATCH, tagged
keys = [f"key-{i}" for i in range(20_000)]
value = b"v" * 100
batches = [keys[i:i + BATCH] for i in range(0, len(keys), BATCH)]
if os.environ.get("AB_TAGS"):
    batches = tagged(batches)
    keys = [k for batch in batches for k in batch]
with grid.connect(cluster_name=os.environ["AB_CLUSTER"]) as client:
    m = client.get_map("ab")
    if os.environ["AB_OP"] == "fill":
        for batch in batches:
            m.put_all(dict.fromkeys(batch, value))
    run = {"get": lambda i: m.get(keys[i % len(keys)]),
           "put": lambda i: m.put(keys[i % len(keys)], value),
           "get_all": lambda i: m.get_all(batches[i % len(batches)]),
           "put_all": lambda i: m.put_all(dict.fromkeys(batches[i % len(batches)], value)),
           "fill": lambda i: None}[os.environ["AB_OP"]]
    for i in range(20 + int(os.environ["AB_OPS"])):
        run(i)
"""

# A client reading map "ab" of cluster $AB_CLUSTER from shared memory for $AB_SECONDS per
# operation (with AB_OP=fill: writing its keys first, and nothing else), timed by the working
# tree's tools/bench_ops.py; prints {op: [entries/s, p50 µs]} and the share of reads answered
# from shared memory.
LOCAL_CLIENT = """
import json, os, sys, time
sys.path.insert(0, os.environ["AB_TOOLS"])
import grid
from bench_ops import BATCH, measure, tagged
seconds = float(os.environ["AB_SECONDS"])
keys = [f"key-{i}" for i in range(20_000)]
value = b"v" * 100
batches = [keys[i:i + BATCH] for i in range(0, len(keys), BATCH)]
tags = tagged(batches)
with grid.connect(cluster_name=os.environ["AB_CLUSTER"]) as client:
    if os.environ["AB_OP"] == "fill":
        m = client.get_map("ab")
        for batch in batches + tags:
            m.put_all(dict.fromkeys(batch, value))
        raise SystemExit(0)
    local = client.get_map("ab", local_reads=True)
    for _ in range(3):  # the first reads ask the owners to publish the map
        for batch in batches:
            local.get_all(batch)
        time.sleep(0.3)
    reader = local._local
    hits, misses = reader.hits, reader.misses
    out = {"local get": measure(lambda i: local.get(keys[i % len(keys)]), seconds, 1),
           "local get_all": measure(lambda i: local.get_all(batches[i % len(batches)]),
                                    seconds, BATCH),
           "local get_all, one hash tag": measure(lambda i: local.get_all(tags[i % len(tags)]),
                                                  seconds, BATCH)}
    hits, misses = reader.hits - hits, reader.misses - misses
    print(json.dumps({"ops": out, "hit_share": hits / max(1, hits + misses)}))
"""


PURE_TREES: set[Path] = set()  # trees run from source (--pure-base)


def in_turn(base: Path, round_no: int) -> tuple[tuple[str, Path], ...]:
    """The two trees in the order round ``round_no`` runs them: each round the other goes
    first (the second of two runs finds the machine warmed, or tired, by the first)."""
    pair = (("base", base), ("tree", ROOT))
    return pair if round_no % 2 == 0 else pair[::-1]


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs ``tree``'s code: its own modules first, and with
    ``--pure-base`` for the base, every compiled module from source (grid/compiled.py)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if tree in PURE_TREES:
        env[PURE_ENV] = "1"
    else:
        env.pop(PURE_ENV, None)
    return env


def shmgrid(tree: Path, name: str, *args: str) -> str:
    """``shmgrid ARGS --cluster-name NAME`` run by ``tree``'s code; its output."""
    done = subprocess.run([sys.executable, "-m", "grid", *args, "--cluster-name", name],
                          cwd=tree, env=tree_env(tree),
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"shmgrid {args[0]} failed in {tree}:\n{done.stderr}")
    return done.stdout


def run_once(tree: Path, seconds: float, clients: int, bench_args: list[str],
             bench_tree: Path | None = None) -> dict[str, tuple[float, float, float | None]]:
    """One bench against a new cluster run by ``tree``'s code (the bench itself by
    ``bench_tree``'s, if given): op -> (entries/s, p50 ms, members' CPU µs per entry or
    None)."""
    name = f"ab{uuid.uuid4().hex[:8]}"
    shmgrid(tree, name, "start", "--detach")
    try:
        out = shmgrid(bench_tree or tree, name, "bench", "--seconds", str(seconds),
                      "--clients", str(clients), *bench_args)
    finally:
        shmgrid(tree, name, "stop")
    return {m[1]: (float(m[2].replace(",", "")), float(m[3]),
                   float(m[5].replace(",", "")) if m[5] else None) for m in ROW.finditer(out)}


def run_spark_once(tree: Path, rows: int) -> dict[str, tuple[float, float, None]]:
    """``tools/bench_spark.py`` of ``tree`` (its connector, its client) against a new
    cluster run by ``tree``'s code: operation -> (rows/s, best run's seconds, None)."""
    name = f"ab{uuid.uuid4().hex[:8]}"
    shmgrid(tree, name, "start", "--detach")
    try:
        done = subprocess.run([sys.executable, str(tree / "tools" / "bench_spark.py"),
                               "--rows", str(rows), "--repeat", "1", "--cluster-name", name],
                              cwd=tree, env=tree_env(tree),
                              capture_output=True, text=True, timeout=3600)
    finally:
        shmgrid(tree, name, "stop")
    if done.returncode != 0:
        raise SystemExit(f"bench_spark failed in {tree}:\n{done.stderr[-3000:]}")
    return {m[1]: (float(m[2].replace(",", "")), rows / float(m[2].replace(",", "")), None)
            for m in SPARK_ROW.finditer(done.stdout)}


def client_instructions(tree: Path, cluster: str, op: str, ops: int,
                        hash_tags: bool = False) -> int:
    """Instructions a client of ``tree`` executes to make ``ops`` operations ``op`` (plus
    its start and 20 operations; None of them spin while they wait for a reply)."""
    env = {**tree_env(tree), "AB_CLUSTER": cluster, "AB_OP": op,
           "AB_OPS": str(ops), "SHMGRID_CLIENT_BUSY_POLL_US": "0",
           "AB_TAGS": "1" if hash_tags else "", "AB_TOOLS": str(ROOT / "tools")}
    done = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                           "--cachegrind-out-file=/dev/null", sys.executable, "-c", CLIENT],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"the client under valgrind failed in {tree}:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def local_client(tree: Path, cluster: str, op: str, seconds: float) -> dict:
    """``LOCAL_CLIENT`` run by ``tree``'s code: what it printed."""
    env = {**tree_env(tree), "AB_CLUSTER": cluster, "AB_OP": op,
           "AB_SECONDS": str(seconds), "AB_TOOLS": str(ROOT / "tools")}
    done = subprocess.run([sys.executable, "-c", LOCAL_CLIENT], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the local reads client failed in {tree}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1]) if op != "fill" else {}


def compare_local_reads(base: Path, rounds: int, seconds: float
                        ) -> dict[str, list[dict[str, tuple[float, float, None]]]]:
    """Each tree's local reads, alternately, against one cluster of the working tree."""
    name = f"ab{uuid.uuid4().hex[:8]}"
    shmgrid(ROOT, name, "start", "--detach")
    runs: dict[str, list[dict]] = {"base": [], "tree": []}
    try:
        local_client(ROOT, name, "fill", 0)
        for round_no in range(rounds):
            for label, tree in in_turn(base, round_no):
                found = local_client(tree, name, "read", seconds)
                print(f"round {round_no + 1}: {label}, {found['hit_share']:.2%} of reads "
                      "answered from shared memory", file=sys.stderr, flush=True)
                runs[label].append({op: (rate, p50_us / 1e3, None)
                                    for op, (rate, p50_us) in found["ops"].items()})
    finally:
        shmgrid(ROOT, name, "stop")
    return runs


def compare_instructions(base: Path, op: str, ops: int, hash_tags: bool = False
                         ) -> dict[str, float]:
    """The client's instructions per ``op`` for each tree, against one cluster."""
    name = f"ab{uuid.uuid4().hex[:8]}"
    shmgrid(ROOT, name, "start", "--detach")
    try:
        client_instructions(ROOT, name, "fill", 0, hash_tags)
        per_op = {}
        for label, tree in (("base", base), ("tree", ROOT)):
            print(f"counting {op} in {label}", file=sys.stderr, flush=True)
            per_op[label] = (client_instructions(tree, name, op, ops, hash_tags)
                             - client_instructions(tree, name, op, 0, hash_tags)) / ops
    finally:
        shmgrid(ROOT, name, "stop")
    return per_op


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the git revision to compare with (e.g. HEAD~1)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per tree (default 2)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per op (default 3)")
    parser.add_argument("--clients", type=int, default=1, help="client processes (default 1)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--hash-tags", action="store_true",
                        help="bench batches of keys of one hash tag (shmgrid bench --hash-tags;"
                             " with --instructions, the client's batches too)")
    parser.add_argument("--same-client", action="store_true",
                        help="run the working tree's client (and bench) against both trees' "
                             "clusters: compares the members only, and lets the bench use "
                             "options the revision's bench lacks")
    parser.add_argument("--spark", type=int, metavar="ROWS",
                        help="run tools/bench_spark.py --rows ROWS instead (each tree's "
                             "script, connector and cluster; needs the spark extra)")
    parser.add_argument("--instructions", choices=INSTRUCTION_OPS, metavar="OP",
                        help="count the client's instructions per OP instead "
                             f"({', '.join(INSTRUCTION_OPS)}; needs valgrind)")
    parser.add_argument("--local-reads", action="store_true",
                        help="compare the clients' reads from shared memory instead (both "
                             "trees' clients against one cluster of the working tree)")
    parser.add_argument("--pure-base", action="store_true",
                        help="run the revision from source (SHMGRID_PURE_PYTHON=1) instead "
                             "of compiling it: with HEAD, what the compiled hot path gives")
    parser.add_argument("--ops", type=int, default=None,
                        help="operations counted with --instructions (default 1000, "
                             "100 for batches)")
    args = parser.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="shmgrid-ab-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.revision],
                       cwd=ROOT, check=True, capture_output=True)
        try:
            if args.pure_base:
                PURE_TREES.add(base)
            else:
                build(base)
            if args.instructions:
                ops = args.ops or (100 if args.instructions.endswith("_all") else 1000)
                counted = compare_instructions(base, args.instructions, ops, args.hash_tags)
            elif args.local_reads:
                runs = compare_local_reads(base, args.rounds, args.seconds)
            else:
                runs: dict[str, list[dict]] = {"base": [], "tree": []}
                for round_no in range(args.rounds):
                    for label, tree in in_turn(base, round_no):
                        print(f"round {round_no + 1}: {label}", file=sys.stderr, flush=True)
                        runs[label].append(run_spark_once(tree, args.spark) if args.spark
                                           else run_once(
                            tree, args.seconds, args.clients,
                            ["--hash-tags"] if args.hash_tags else [],
                            ROOT if args.same_client else None))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           capture_output=True)
    if args.instructions:
        ratio = counted["tree"] / counted["base"]
        if args.json:
            print(json.dumps({args.instructions: {**counted, "ratio": ratio}}, indent=1))
        else:
            print(f"client instructions per {args.instructions} ({ops} counted): "
                  f"{args.revision} {counted['base']:,.0f}, tree {counted['tree']:,.0f}, "
                  f"ratio {ratio:.2f}")
        return 0
    result = {}
    for op in runs["tree"][0]:
        base_rate = statistics.mean(r[op][0] for r in runs["base"] if op in r)
        tree_rate = statistics.mean(r[op][0] for r in runs["tree"])
        result[op] = {"base": base_rate, "tree": tree_rate, "ratio": tree_rate / base_rate}
        cpu = {label: [r[op][2] for r in runs[label] if op in r] for label in runs}
        if all(cpu.values()) and None not in cpu["base"] + cpu["tree"]:
            base_cpu, tree_cpu = statistics.mean(cpu["base"]), statistics.mean(cpu["tree"])
            result[op]["member_cpu_us"] = {"base": base_cpu, "tree": tree_cpu,
                                           "ratio": tree_cpu / base_cpu}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    width = max(16, *(len(op) + 2 for op in result))
    print(f"{'operation':<{width}}{args.revision + ' /s':>16}{'tree /s':>14}{'ratio':>8}"
          f"{'member CPU µs/entry':>28}{'ratio':>8}")
    for op, r in result.items():
        cpu = r.get("member_cpu_us")
        print(f"{op:<{width}}{r['base']:>16,.0f}{r['tree']:>14,.0f}{r['ratio']:>7.2f}x"
              + (f"{cpu['base']:>15,.1f} -> {cpu['tree']:>9,.1f}{cpu['ratio']:>7.2f}x"
                 if cpu else f"{'-':>28}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
