"""Spark ↔ grid throughput, next to the same reads and writes against Parquet on local disk.

    shmgrid start --detach
    python tools/bench_spark.py --rows 1000000

Rows are a 10-character string key and a `--value-bytes` binary value. In one Spark session
(local[2] by default) it times, best of `--repeat` runs after a warm-up:

- write: the cached DataFrame into the grid (append, and overwrite with staging) and to Parquet;
- read into count(): the grid map and the Parquet files (Parquet answers count() from its
  footers without reading any rows, so its count is not a like-for-like read);
- read every row: the same two reads into Spark's `noop` sink, which materialises all columns.

Each grid read runs twice: with local reads (the default on the grid's host: the owners'
shared memory) and with the option local.reads=false (every partition asked of its owner).

It prints rows/s and the ratio grid / Parquet, and where each operation's CPU went (median
CPU seconds of a run): the grid's members (found in the local registry; none with --address),
Spark's JVM, Spark's Python workers, and this process. Those say what a faster grid could win:
the JVM's and the Python workers' seconds of a grid write are spent before any member sees a
row, and on two cores they bound the write from below. It needs a running cluster: `shmgrid
start --detach` (the local registry), or --address of a member.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

import grid  # noqa: E402 - after the path set-up, so the script runs from a checkout
from grid import errors  # noqa: E402
from grid.bench import member_processes  # noqa: E402

warmup_rows = 200_000
CPU_KINDS = ("members", "Spark JVM", "Spark Python", "this process")


def cpu_by_kind(members: Sequence[psutil.Process]) -> dict[str, float]:
    """User and system CPU seconds so far of each kind of process (``CPU_KINDS``): the grid's
    ``members``, and under this process Spark's JVM and its Python processes. A Python process
    counts with its exited children (a Spark Python worker that exits is reaped by its
    parent, the PySpark daemon, into the daemon's children times), so the difference of two
    calls is what the kinds spent between them, exited workers included. A process gone
    meanwhile is skipped."""
    spent = dict.fromkeys(CPU_KINDS, 0.0)
    me = psutil.Process()
    times = me.cpu_times()
    spent["this process"] = times.user + times.system
    for process in members:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        spent["members"] += times.user + times.system
    for process in me.children(recursive=True):
        try:
            name = process.name().lower()
            times = process.cpu_times()
        except psutil.Error:
            continue
        if name.startswith("java"):
            spent["Spark JVM"] += times.user + times.system
        elif "python" in name:
            spent["Spark Python"] += times.user + times.system + times.children_user \
                + times.children_system
    return spent


def _time_s(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _frame(spark, rows: int, value_bytes: int, partitions: int):
    """key `k000000001`…, value: `value_bytes` bytes of hex text derived from the id."""
    from pyspark.sql import functions as F

    repeats = value_bytes // 64 + 1
    value = F.substring(F.repeat(F.sha2(F.col("id").cast("string"), 256), repeats), 1, value_bytes)
    return spark.range(rows, numPartitions=partitions).select(
        F.format_string("k%09d", "id").alias("key"), value.cast("binary").alias("value")
    )


class Bench:
    """The operations being timed, on one session, one map and one Parquet directory."""

    def __init__(self, spark, client, options: dict[str, str], map_name: str, parquet: Path):
        self.spark, self.client, self.options = spark, client, options
        self.map_name, self.parquet = map_name, parquet

    def grid_write(self, df, mode: str) -> None:
        if mode == "append":
            self.client.get_map(self.map_name).clear()
        (
            df.write.format("shmgrid")
            .options(**self.options)
            .option("map", self.map_name)
            .mode(mode)
            .save()
        )

    def parquet_write(self, df) -> None:
        df.write.mode("overwrite").parquet(str(self.parquet))

    def grid_frame(self, local_reads: bool = True):
        return (
            self.spark.read.format("shmgrid")
            .options(**self.options)
            .option("map", self.map_name)
            .option("local.reads", str(local_reads).lower())
            .schema("key string, value binary")
            .load()
        )

    def parquet_frame(self):
        return self.spark.read.parquet(str(self.parquet))


def _noop(df) -> None:
    df.write.format("noop").mode("overwrite").save()


def run(bench: Bench, df, rows: int, repeat: int, members: Sequence[psutil.Process] = (),
        cpu: dict[str, list[dict[str, float]]] | None = None) -> dict[str, list[float]]:
    """Seconds per run for each timed operation; with ``cpu``, each run's CPU seconds by kind
    of process are appended to ``cpu[operation]``."""
    timings: dict[str, list[float]] = {}

    def timed(name: str, action: Callable[[], object]) -> None:
        before = None if cpu is None else cpu_by_kind(members)
        timings.setdefault(name, []).append(_time_s(action))
        if cpu is not None and before is not None:
            after = cpu_by_kind(members)
            cpu.setdefault(name, []).append({k: after[k] - before[k] for k in CPU_KINDS})

    for _ in range(repeat):
        timed("write parquet", lambda: bench.parquet_write(df))
        timed("write grid append", lambda: bench.grid_write(df, "append"))
        size = bench.client.get_map(bench.map_name).size()
        if size != rows:
            raise RuntimeError(f"the grid map holds {size} rows after the write, not {rows}")
        timed("write grid overwrite", lambda: bench.grid_write(df, "overwrite"))
        timed("count parquet", lambda: bench.parquet_frame().count())
        timed("count grid", lambda: bench.grid_frame().count())
        timed("count grid, no local", lambda: bench.grid_frame(local_reads=False).count())
        timed("read all parquet", lambda: _noop(bench.parquet_frame()))
        timed("read all grid", lambda: _noop(bench.grid_frame()))
        timed("read all grid, no local", lambda: _noop(bench.grid_frame(local_reads=False)))
    counted = bench.grid_frame().count()
    if counted != rows:
        raise RuntimeError(f"count() of the grid map gave {counted}, not {rows}")
    return timings


def report(timings: dict[str, list[float]], rows: int,
           cpu: dict[str, list[dict[str, float]]] | None = None) -> str:
    """A table of rows/s (best run) and grid / Parquet ratios, and with ``cpu`` one of the
    median CPU seconds of a run by kind of process."""

    def rate(name: str) -> float:
        return rows / min(timings[name])

    lines = [f"{'operation':<24}{'rows/s (best)':>16}{'median s':>11}   runs s"]
    for name, seconds in timings.items():
        runs = " ".join(f"{s:.2f}" for s in seconds)
        median = statistics.median(seconds)
        lines.append(f"{name:<24}{rate(name):>16,.0f}{median:>11.2f}   {runs}")
    lines.append("")
    pairs = [
        ("write (append) grid / parquet", "write grid append", "write parquet"),
        ("write (overwrite) grid / parquet", "write grid overwrite", "write parquet"),
        ("count() grid / parquet", "count grid", "count parquet"),
        ("read all rows grid / parquet", "read all grid", "read all parquet"),
        ("read all rows, local / not", "read all grid", "read all grid, no local"),
        ("count(), local / not", "count grid", "count grid, no local"),
    ]
    for label, grid_name, parquet_name in pairs:
        lines.append(f"{label:<34} {rate(grid_name) / rate(parquet_name):6.2f}x")
    if cpu:  # (indented: tools/bench_ab.py reads the rows that begin with an operation)
        lines += ["", f"{'CPU s of a run (median)':<26}{'wall':>8}"
                  + "".join(f"{kind:>14}" for kind in CPU_KINDS)]
        for name, runs in cpu.items():
            wall = statistics.median(timings[name])
            lines.append(f"  {name:<24}{wall:>8.2f}" + "".join(
                f"{statistics.median(run[kind] for run in runs):>14.2f}" for kind in CPU_KINDS))
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows (default 1,000,000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size (default 100)")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per operation")
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions to write")
    parser.add_argument("--address", help="tcp://127.0.0.1:PORT of a member (default: registry)")
    parser.add_argument("--cluster-name", help="cluster to find in the local registry")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--map", default="bench_spark", help="grid map to use (cleared)")
    parser.add_argument("--parquet-dir", help="where to write Parquet (default: a temp dir)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        client = grid.connect(args.address, cluster_name=args.cluster_name)
    except (errors.ClusterNotRunningError, errors.WrongClusterNameError) as exc:
        print(
            f"bench_spark: {exc}\nbench_spark: needs a running cluster: `shmgrid start --detach`,"
            " or --address tcp://127.0.0.1:PORT of a member",
            file=sys.stderr,
        )
        return 2
    options = {
        k: v for k, v in {"address": args.address, "cluster.name": args.cluster_name}.items() if v
    }
    members = [] if args.address else member_processes(args.cluster_name)
    from grid.spark.local import local_session, stop_local_session

    parquet_root = Path(args.parquet_dir or tempfile.mkdtemp(prefix="shmgrid-bench-parquet-"))
    spark = local_session("shmgrid-bench", args.master)
    try:
        bench = Bench(spark, client, options, args.map, parquet_root / "data")
        warmup = _frame(spark, warmup_rows, args.value_bytes, args.partitions).cache()
        warmup.count()
        run(bench, warmup, warmup_rows, 1)
        warmup.unpersist()
        df = _frame(spark, args.rows, args.value_bytes, args.partitions).cache()
        df.count()
        cpu: dict[str, list[dict[str, float]]] = {}
        timings = run(bench, df, args.rows, args.repeat, members, cpu)
        print(
            f"bench_spark: {args.rows:,} rows, key 10 chars + value {args.value_bytes} bytes, "
            f"{args.master}, {args.partitions} write tasks, best of {args.repeat}\n"
        )
        print(report(timings, args.rows, cpu))
        if not members:
            print("(no member processes found: the members' CPU is not counted)")
        client.get_map(args.map).clear()
    finally:
        stop_local_session(spark)
        client.close()
        if args.parquet_dir is None:
            shutil.rmtree(parquet_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
