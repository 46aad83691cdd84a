"""The Spark writer's packed put_all without Spark: rows/s and the members' CPU per row.

    python tools/bench_packed_write.py                      # the working tree
    python tools/bench_packed_write.py --base HEAD~1        # and a revision, alternately
    python tools/bench_packed_write.py --rows 500000 --rounds 6
    python tools/bench_packed_write.py --published          # into a map published for local reads

What a Spark append costs the members, alone: ``--rows`` rows (10-character string keys,
100-character string values) are packed as the writer packs them (grid/spark/packed_write.py,
Arrow batches of 10,000 rows, as Spark hands them over) before the clock starts, then written
with ``Map.put_all_packed`` into a cleared map of a new 3-member cluster (backup 1) of that
tree's code, by that tree's client; each round prints the rows/s and the members' CPU (user and
system) per row. The calls are the ones the Spark writer makes (its ``_PendingRows``, with
``batch.size``'s default): Arrow batches merged until ``batch.size`` rows or ``BATCH_BYTES``
(4 MiB: here four batches, 40,000 rows). Calls of one batch each made little difference:
rows/s 0.94x and 0.96x, the members' CPU a row 1.02x and 1.04x, in two alternating runs.

With ``--base`` each tree takes its turn, the first alternating, so that both see the same
minutes of a machine whose speed drifts; the first round of each warms its cluster up (its
fragments are created then) and is left out of the medians. Needs the spark extra (pyarrow,
pyspark).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

from worktrees import compared_trees

ROOT = Path(__file__).resolve().parent.parent
BATCH_ROWS = 10_000

# Run by the tree measured (its client, its packing), against its cluster; a line per round.
WRITER = r"""
import json, os, sys, time
import psutil, pyarrow as pa
import grid
from grid.spark.options import batch_size_default
from grid.spark.source import _PendingRows


class Calls:  # stands in for the map: keeps each put_all_packed call the writer makes
    def __init__(self):
        self.calls = []

    def put_all_packed(self, pieces, partitions):
        self.calls.append(pieces)


client = grid.connect(cluster_name=sys.argv[1])
m = client.get_map("packed")
members = [psutil.Process(member.pid) for member in client.cluster.members]
rows, batch_rows = int(sys.argv[2]), int(sys.argv[3])
local = None
if sys.argv[4] == "1":  # a local read asks every owner to publish the map (as a Spark read does)
    local = client.get_map("packed", local_reads=True)
    local.get_all([f"k{i:09d}" for i in range(1000)])
# The Spark writer's own batching (grid/spark/source.py), its calls kept to be sent timed.
recorded = Calls()
writer = _PendingRows(recorded, None, batch_size_default, client.partition_count,
                      client.max_value_bytes)
for b in range(max(1, rows // batch_rows)):
    keys = pa.array([f"k{b * batch_rows + i:09d}" for i in range(batch_rows)])
    values = pa.array([os.urandom(50).hex() for _ in range(batch_rows)])
    writer.add(pa.RecordBatch.from_arrays([keys, values], ["key", "value"]), 0, 1, ())
writer.flush()
packed, written = recorded.calls, writer.written
print("ready", flush=True)
for _ in sys.stdin:
    m.clear()
    before = [process.cpu_times() for process in members]
    started = time.perf_counter()
    for pieces in packed:
        m.put_all_packed(pieces, None)
    elapsed = time.perf_counter() - started
    if local is not None:  # the members' CPU until local reads hit again: the loads over
        sample = [f"k{i:09d}" for i in range(0, written, max(1, written // 2000))]
        deadline = time.monotonic() + 60
        while True:
            hits = local._local.hits
            local.get_all(sample)
            if local._local.hits - hits == len(sample):
                break
            if time.monotonic() > deadline:
                raise SystemExit("local reads of the rows did not hit memory within 60 s")
            time.sleep(0.02)
    after = [process.cpu_times() for process in members]
    cpu = sum(b.user + b.system - a.user - a.system for a, b in zip(before, after))
    assert m.size() == written
    print(json.dumps({"rows_per_s": written / elapsed, "member_us_per_row": cpu / written * 1e6}),
          flush=True)
"""


def start(tree: Path, rows: int, published: bool) -> tuple[str, subprocess.Popen]:
    """A new cluster of ``tree``'s code and its writer, packed and ready."""
    name = f"packed{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-m", "grid", "start", "--detach", "--cluster-name", name],
                   cwd=tree, env=env, check=True, capture_output=True, timeout=300)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, name, str(rows), str(BATCH_ROWS),
                               "1" if published else "0"],
                              cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    if writer.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
        raise SystemExit(f"the writer of {tree} did not start")
    return name, writer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="a git revision to compare with, alternately")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows a round writes")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per tree (default 4)")
    parser.add_argument("--published", action="store_true",
                        help="publish the map for local reads first, as a Spark read on the "
                             "grid's host does: then the owners keep a shared index of what "
                             "they write (a Spark append after a read), and the members' CPU "
                             "is counted until local reads of the rows hit again")
    args = parser.parse_args()
    if args.rows < BATCH_ROWS or args.rounds < 2:
        parser.error(f"--rows is at least {BATCH_ROWS:,} and --rounds at least 2")
    with compared_trees(args.base) as trees:
        running: dict[str, tuple[str, subprocess.Popen]] = {}
        try:
            for label, tree in trees.items():
                running[label] = start(tree, args.rows, args.published)
            results: dict[str, list[dict]] = {label: [] for label in trees}
            labels = list(trees)
            for round_no in range(args.rounds):
                for label in labels if round_no % 2 == 0 else labels[::-1]:
                    writer = running[label][1]
                    writer.stdin.write("go\n")  # type: ignore[union-attr]
                    writer.stdin.flush()  # type: ignore[union-attr]
                    result = json.loads(writer.stdout.readline())  # type: ignore[union-attr]
                    results[label].append(result)
                    print(f"round {round_no + 1} {label}: {result['rows_per_s']:,.0f} rows/s, "
                          f"members {result['member_us_per_row']:.2f} µs a row", flush=True)
        finally:
            for label, (name, writer) in running.items():
                writer.stdin.close()  # type: ignore[union-attr]
                writer.wait(timeout=60)
                tree = trees[label]
                subprocess.run([sys.executable, "-m", "grid", "stop", "--cluster-name", name],
                               cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                               capture_output=True, timeout=300)
    medians = {label: {key: statistics.median(r[key] for r in runs[1:])
                       for key in ("rows_per_s", "member_us_per_row")}
               for label, runs in results.items()}
    for label, median in medians.items():
        print(f"{label}: {median['rows_per_s']:,.0f} rows/s, members "
              f"{median['member_us_per_row']:.2f} µs a row (medians of rounds 2-{args.rounds})")
    if args.base:
        base, tree = medians[args.base], medians["tree"]
        print(f"tree / {args.base}: rows/s {tree['rows_per_s'] / base['rows_per_s']:.2f}x, "
              f"members' CPU a row {tree['member_us_per_row'] / base['member_us_per_row']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
