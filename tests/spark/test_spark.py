"""The connector in a real local Spark (one session for the run) against a real 3-member grid.

Budget: about 30 s of Spark start-up and warm-up, then about a second per query. The first
test relies on auto-registration, so it runs before `grid.spark.register` is ever called.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark import TaskContext  # noqa: E402 - after the importorskips
from pyspark.sql import functions as F  # noqa: E402

import grid.spark  # noqa: E402
from grid.spark import staging  # noqa: E402

pytestmark = [
    pytest.mark.spark,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


@pytest.fixture(scope="module")
def client(grid_cluster):
    return grid_cluster.connect()


@pytest.fixture(scope="module")
def opts(grid_cluster) -> dict[str, str]:
    """Connection options for the executors: the address of a member."""
    return {"address": grid_cluster.address}


def _read(spark, opts: dict, map_name: str, schema: str | None = None, **more: str):
    reader = spark.read.format("shmgrid").options(**opts).option("map", map_name)
    for key, value in more.items():
        reader = reader.option(key.replace("_", "."), value)
    if schema is not None:
        reader = reader.schema(schema)
    return reader.load()


def _write(df, opts: dict, map_name: str, mode: str, **more: str) -> None:
    writer = df.write.format("shmgrid").options(**opts).option("map", map_name).mode(mode)
    for key, value in more.items():
        writer = writer.option(key.replace("_", "."), value)
    writer.save()


def test_auto_registered_format_reads_scalars(spark, client, opts, map_name) -> None:
    client.get_map(map_name).put_all({f"k{i:03d}": i for i in range(300)})
    df = _read(spark, opts, map_name)
    assert df.schema.simpleString() == "struct<key:string,value:bigint>"
    assert df.count() == 300
    assert dict(df.collect()) == {f"k{i:03d}": i for i in range(300)}
    assert df.rdd.getNumPartitions() >= 3  # grouped by owner, several per core


def test_explicit_register_and_dict_values_with_user_schema(spark, client, opts, map_name) -> None:
    grid.spark.register(spark)
    orders = {f"o{i}": {"customer": f"c{i % 3}", "qty": i, "price": i * 0.5} for i in range(60)}
    client.get_map(map_name).put_all(orders)
    inferred = _read(spark, opts, map_name)
    assert inferred.columns == ["key", "customer", "qty", "price"]
    df = _read(spark, opts, map_name, "key string, qty int, price double")
    rows = {r.key: (r.qty, r.price) for r in df.collect()}
    assert rows == {k: (v["qty"], v["price"]) for k, v in orders.items()}


def test_key_filters_become_batched_gets_and_work_with_pushdown_off(
    spark, client, opts, map_name
) -> None:
    client.get_map(map_name).put_all({f"o{i}": {"qty": i} for i in range(200)})
    df = _read(spark, opts, map_name, "key string, qty int")
    wanted = df.where("key in ('o1', 'o7', 'o999')")
    assert sorted(wanted.collect()) == [("o1", 1), ("o7", 7)]
    assert wanted.rdd.getNumPartitions() <= 2  # one get task per owner of the keys
    assert df.where("key = 'o3' and qty > 1").collect() == [("o3", 3)]
    spark.conf.set(PUSHDOWN_CONF, "false")
    try:
        assert sorted(df.where("key in ('o1', 'o7')").collect()) == [("o1", 1), ("o7", 7)]
        assert _read(spark, opts, map_name, "key string, qty int").count() == 200
    finally:
        spark.conf.set(PUSHDOWN_CONF, "true")


def test_a_dataframe_reused_after_a_key_filter_still_reads_everything(
    spark, client, opts, map_name
) -> None:
    """PySpark 4.3 hands the key-get plan to later unfiltered scans of the same DataFrame."""
    client.get_map(map_name).put_all({f"o{i}": i for i in range(150)})
    df = _read(spark, opts, map_name, "key string, value bigint")
    assert df.where("key = 'o5'").collect() == [("o5", 5)]
    assert df.count() == 150
    assert df.where("value >= 148").count() == 2
    assert df.where("key in ('o1', 'o2')").count() == 2
    assert df.agg({"value": "sum"}).collect()[0][0] == sum(range(150))


def test_append_is_an_upsert_keyed_by_key_column(spark, client, opts, map_name) -> None:
    df = spark.createDataFrame(
        [("c1", 10.0, 1), ("c2", 20.0, 2), ("c3", 30.0, 3)], "customer string, total double, n int"
    )
    _write(df, opts, map_name, "append", key_column="customer")
    _write(
        df.where("customer = 'c1'").withColumn("n", F.lit(9)),
        opts,
        map_name,
        "append",
        key_column="customer",
    )
    grid_map = client.get_map(map_name)
    assert grid_map.get_all(["c1", "c2", "c3"]) == {
        "c1": {"total": 10.0, "n": 9},
        "c2": {"total": 20.0, "n": 2},
        "c3": {"total": 30.0, "n": 3},
    }
    back = _read(spark, opts, map_name, key_column="customer")
    assert sorted(back.columns) == ["customer", "n", "total"]
    assert back.where("customer = 'c2'").select("total").collect()[0][0] == 20.0


def test_value_column_and_key_value_frames_store_plain_values(
    spark, client, opts, map_name
) -> None:
    df = spark.createDataFrame([(1, "a", 0.5), (2, "b", 1.5)], "id bigint, name string, s double")
    _write(df, opts, map_name, "append", key_column="id", value_column="name")
    assert client.get_map(map_name).get_all([1, 2]) == {1: "a", 2: "b"}
    kv = spark.createDataFrame([("x", b"\x00\x01")], "key string, value binary")
    _write(kv, opts, map_name + "b", "append")
    assert client.get_map(map_name + "b").get("x") == b"\x00\x01"


def test_overwrite_replaces_everything_including_partitions_not_written(
    spark, client, opts, map_name
) -> None:
    target = client.get_map(map_name)
    target.put_all({f"old{i}": i for i in range(500)})
    df = spark.createDataFrame([("n1", 1), ("n2", 2), ("n3", 3)], "key string, value bigint")
    _write(df, opts, map_name, "overwrite")
    assert target.size() == 3
    assert target.get_all(["n1", "n2", "n3", "old1"]) == {"n1": 1, "n2": 2, "n3": 3}
    registry = client.get_map(staging.STAGING_REGISTRY_MAP)
    assert not [k for k, v in registry.items() if v["target"] == map_name]


def _failing_udf(marker_path: str, fail_attempts: int):
    """A UDF that fails partition 1's first `fail_attempts` attempts when it reaches id 350."""

    @F.udf("bigint")
    def maybe_fail(n):  # no type hints: they would make it a pandas UDF
        context = TaskContext.get()
        if n == 350 and context.partitionId() == 1 and context.attemptNumber() < fail_attempts:
            with open(marker_path, "a") as marker:
                marker.write(f"attempt {context.attemptNumber()} failed\n")
            raise RuntimeError("injected task failure")
        return n

    return maybe_fail


def _frame_with_failure(spark, marker_path: str, fail_attempts: int):
    ids = spark.range(0, 400, numPartitions=2)
    fail = _failing_udf(marker_path, fail_attempts)
    return ids.select(F.format_string("k%04d", "id").alias("key"), fail("id").alias("value"))


def test_retried_task_write_gives_exact_contents(spark, client, opts, map_name, tmp_path) -> None:
    marker = tmp_path / "failures"
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "25")
    try:
        df = _frame_with_failure(spark, str(marker), fail_attempts=1)
        _write(df, opts, map_name, "append", batch_size="10")
        _write(df, opts, map_name + "o", "overwrite", batch_size="10")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert marker.read_text().count("attempt 0 failed") == 2
    expected = {f"k{i:04d}": i for i in range(400)}
    for name in (map_name, map_name + "o"):
        grid_map = client.get_map(name)
        assert grid_map.size() == 400
        assert grid_map.get_all(list(expected)) == expected


def test_failed_overwrite_leaves_old_contents_intact(
    spark, client, opts, map_name, tmp_path
) -> None:
    target = client.get_map(map_name)
    old = {f"k{i:04d}": -i for i in range(0, 400, 3)}
    target.put_all(old)
    marker = tmp_path / "failures"
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "25")
    try:
        df = _frame_with_failure(spark, str(marker), fail_attempts=2)
        with pytest.raises(Exception, match="injected task failure"):
            _write(df, opts, map_name, "overwrite", batch_size="10")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert marker.read_text().count("failed") == 2
    assert target.size() == len(old)
    assert target.get_all(list(old)) == old
    registry = client.get_map(staging.STAGING_REGISTRY_MAP)
    assert not [k for k, v in registry.items() if v["target"] == map_name]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "'map' option is missing"),
        ({"map": "m", "cluster.name": "no_such_cluster"}, "no shmgrid cluster is running"),
    ],
)
def test_read_errors_are_clear(spark, options: dict, message: str) -> None:
    with pytest.raises(Exception, match=message):
        spark.read.format("shmgrid").options(**options).load().collect()


def test_write_errors_are_clear(spark, opts, map_name) -> None:
    df = spark.createDataFrame([("a", 1), (None, 2)], "id string, v int")
    with pytest.raises(Exception, match="key column 'customer'"):
        _write(df, opts, map_name, "append", key_column="customer")
    with pytest.raises(Exception, match="key column 'id' has 1 null"):
        _write(df, opts, map_name, "append", key_column="id")
    dated = spark.sql("select 'a' as key, current_timestamp() as ts")
    with pytest.raises(Exception, match="column 'ts' has type timestamp"):
        _write(dated, opts, map_name, "append")


def test_pipeline_tool_totals_match_plain_python(spark, client, opts, map_name) -> None:
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "spark_pipeline.py"
    spec = importlib.util.spec_from_file_location("spark_pipeline", path)
    pipeline = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = pipeline  # its dataclass looks its module up there
    spec.loader.exec_module(pipeline)
    problems = pipeline.run(
        spark,
        client,
        opts,
        orders=3_000,
        customers=40,
        source=map_name + "_orders",
        target=map_name + "_totals",
    )
    assert problems == []
    assert client.get_map(map_name + "_totals").size() == 40
