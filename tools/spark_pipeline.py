"""A small real pipeline: orders in the grid → Spark aggregates per customer → totals in the grid.

    shmgrid start --detach
    python tools/spark_pipeline.py --orders 100000 --customers 1000

1. generates an orders data set (seeded) and loads it into the map `orders` with put_all;
2. a Spark job reads the map as a DataFrame, sums quantity and amount per customer, and
   overwrites the map `customer_totals` with the result (key column `customer`);
3. the script reads `customer_totals` back with the plain client and checks every total
   against the same aggregation done in plain Python. Exit status 0 if all match.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grid  # noqa: E402 - after the path set-up, so the script runs from a checkout
from grid import errors  # noqa: E402

load_chunk_rows = 10_000
relative_tolerance = 1e-9


@dataclass(frozen=True, slots=True)
class Totals:
    """One customer's aggregate."""

    orders: int
    quantity: int
    amount: float


def generate_orders(count: int, customers: int, seed: int) -> Iterator[tuple[str, dict]]:
    """(order id, order row) pairs; the same seed gives the same orders."""
    rng = random.Random(seed)
    for index in range(count):
        yield (
            f"o{index:08d}",
            {
                "customer": f"c{rng.randrange(customers):06d}",
                "qty": rng.randint(1, 9),
                "price": round(rng.uniform(0.5, 200.0), 2),
            },
        )


def expected_totals(orders: Iterator[tuple[str, dict]]) -> dict[str, Totals]:
    """The aggregation in plain Python, to check Spark's against."""
    sums: dict[str, list] = {}
    for _order_id, row in orders:
        entry = sums.setdefault(row["customer"], [0, 0, 0.0])
        entry[0] += 1
        entry[1] += row["qty"]
        entry[2] += row["qty"] * row["price"]
    return {c: Totals(n, q, a) for c, (n, q, a) in sums.items()}


def load_orders(client: grid.Client, map_name: str, orders: Iterator[tuple[str, dict]]) -> int:
    """Replace the map's contents with the orders; return how many were loaded."""
    grid_map = client.get_map(map_name)
    grid_map.clear()
    chunk: list[tuple[str, dict]] = []
    loaded = 0
    for entry in orders:
        chunk.append(entry)
        if len(chunk) >= load_chunk_rows:
            grid_map.put_all(chunk)
            loaded += len(chunk)
            chunk = []
    if chunk:
        grid_map.put_all(chunk)
        loaded += len(chunk)
    return loaded


def aggregate_with_spark(spark, options: dict[str, str], source: str, target: str) -> None:
    """The Spark job: read orders, total them per customer, overwrite the totals map."""
    from pyspark.sql import functions as F

    orders = (
        spark.read.format("shmgrid")
        .options(**options)
        .option("map", source)
        .schema("key string, customer string, qty int, price double")
        .load()
    )
    totals = orders.groupBy("customer").agg(
        F.count("*").alias("orders"),
        F.sum("qty").alias("quantity"),
        F.sum(F.col("qty") * F.col("price")).alias("amount"),
    )
    (
        totals.write.format("shmgrid")
        .options(**options)
        .option("map", target)
        .option("key.column", "customer")
        .mode("overwrite")
        .save()
    )


def check_totals(client: grid.Client, target: str, expected: dict[str, Totals]) -> list[str]:
    """Differences between the totals map and the expected totals (empty: all match)."""
    grid_map = client.get_map(target)
    got: dict = {}
    for keys, values in grid_map.scan_partitions(range(client.partition_count)):
        got.update(zip(keys, values, strict=True))
    problems = []
    for customer in sorted(set(expected) | set(got)):
        want, have = expected.get(customer), got.get(customer)
        if want is None or have is None:
            problems.append(f"{customer}: expected {want}, got {have}")
            continue
        if (
            have.get("orders") != want.orders
            or have.get("quantity") != want.quantity
            or not math.isclose(
                have.get("amount", math.nan), want.amount, rel_tol=relative_tolerance
            )
        ):
            problems.append(f"{customer}: expected {want}, got {have}")
    return problems


def run(
    spark,
    client: grid.Client,
    options: dict[str, str],
    *,
    orders: int,
    customers: int,
    seed: int = 7,
    source: str = "orders",
    target: str = "customer_totals",
) -> list[str]:
    """The whole pipeline; returns the problems found (empty when every total matches)."""
    loaded = load_orders(client, source, generate_orders(orders, customers, seed))
    assert loaded == orders
    aggregate_with_spark(spark, options, source, target)
    return check_totals(client, target, expected_totals(generate_orders(orders, customers, seed)))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=100_000, help="orders to generate")
    parser.add_argument("--customers", type=int, default=1_000, help="distinct customers")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--address", help="tcp://127.0.0.1:PORT of a member (default: registry)")
    parser.add_argument("--cluster-name", help="cluster to find in the local registry")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--source-map", default="orders")
    parser.add_argument("--target-map", default="customer_totals")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        client = grid.connect(args.address, cluster_name=args.cluster_name)
    except (errors.ClusterNotRunningError, errors.WrongClusterNameError) as exc:
        print(f"spark_pipeline: {exc}", file=sys.stderr)
        return 2
    options = {
        k: v for k, v in {"address": args.address, "cluster.name": args.cluster_name}.items() if v
    }
    from grid.spark.local import local_session, stop_local_session

    spark = local_session("shmgrid-pipeline", args.master)
    started = time.perf_counter()
    try:
        problems = run(
            spark,
            client,
            options,
            orders=args.orders,
            customers=args.customers,
            seed=args.seed,
            source=args.source_map,
            target=args.target_map,
        )
    finally:
        stop_local_session(spark)
        client.close()
    elapsed_s = time.perf_counter() - started
    if problems:
        print(f"spark_pipeline: {len(problems)} customer total(s) differ:", file=sys.stderr)
        for line in problems[:20]:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(
        f"spark_pipeline: {args.orders} orders of {args.customers} customers aggregated by "
        f"Spark into map {args.target_map!r}; every total matches plain Python "
        f"({elapsed_s:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
