"""The data source's own methods called directly against a fake grid: no Spark session.

This covers what Spark would do in its planner and executor workers: schema(), reader(),
pushFilters(), partitions(), read(), writer(), write(), commit() and abort().
"""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from pyspark.sql.datasource import (  # noqa: E402 - after the importorskips
    EqualTo,
    GreaterThan,
    In,
    InputPartition,
    IsNotNull,
    Not,
)
from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from grid import errors  # noqa: E402
from grid.spark import staging  # noqa: E402
from grid.spark.source import (  # noqa: E402
    ColumnNotSerializableError,
    GridKeysPartition,
    GridScanPartition,
    KeyColumnNotSerializableError,
    ShmgridDataSource,
    ShmgridPushdownReader,
    ShmgridReader,
    _called_from_pushdown_planner,
)
from tests.spark.fake_grid import FakeGrid  # noqa: E402

_simple_types = {
    "string": StringType(),
    "binary": BinaryType(),
    "int": IntegerType(),
    "bigint": LongType(),
    "double": DoubleType(),
    "timestamp": TimestampType(),
    "date": DateType(),
}


def _ddl(text: str) -> StructType:
    """A StructType from 'name type, ...' without a JVM (StructType.fromDDL needs one)."""
    fields = []
    for part in text.split(","):
        name, type_name = part.split()
        fields.append(StructField(name, _simple_types[type_name]))
    return StructType(fields)


def _read_all(reader: ShmgridReader) -> list[dict]:
    """What Spark would do: plan on the driver, pickle the reader, read every partition."""
    partitions = reader.partitions() or [InputPartition(None)]
    shipped = pickle.loads(pickle.dumps(reader))
    rows = []
    for partition in pickle.loads(pickle.dumps(partitions)):
        for batch in shipped.read(partition):
            assert isinstance(batch, pa.RecordBatch)
            rows.extend(batch.to_pylist())
    return sorted(rows, key=lambda r: repr(sorted(r.items())))


def _write(source: ShmgridDataSource, schema: StructType, tasks: list[dict], overwrite: bool):
    """writer() on the driver, write() per task on a pickled copy, commit() on another copy."""
    writer = source.writer(schema, overwrite)
    messages = []
    for columns in tasks:
        shipped = pickle.loads(pickle.dumps(writer))
        batch = pa.RecordBatch.from_pydict(columns)
        messages.append(pickle.loads(pickle.dumps(shipped.write(iter([batch])))))
    return writer, messages


def _fill(grid: FakeGrid, name: str, entries: dict) -> None:
    grid.client().get_map(name).put_all(entries)


def test_format_name_and_auto_registration_module() -> None:
    import pyspark_shmgrid

    assert ShmgridDataSource.name() == "shmgrid"
    assert pyspark_shmgrid.DefaultSource is ShmgridDataSource


def test_import_grid_spark_does_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = "import grid, grid.spark, sys; print('pyspark' in sys.modules, 'pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_schema_inferred_from_scalars_and_from_dicts(fake_grid: FakeGrid) -> None:
    _fill(fake_grid, "scalars", {f"k{i}": i for i in range(50)})
    _fill(fake_grid, "rows", {i: {"qty": i, "price": i / 2} for i in range(50)})
    assert ShmgridDataSource({"map": "scalars"}).schema() == "`key` string, `value` bigint"
    assert ShmgridDataSource({"map": "rows", "key.column": "id"}).schema() == (
        "`id` bigint, `qty` bigint, `price` double"
    )
    assert ShmgridDataSource({"map": "empty"}).schema() == "`key` string, `value` string"


def test_read_scalars_in_parallel_partitions(fake_grid: FakeGrid) -> None:
    entries = {f"k{i:03d}": f"v{i}".encode() for i in range(500)}
    _fill(fake_grid, "m", entries)
    source = ShmgridDataSource({"map": "m", "batch.size": "64"})
    reader = source.reader(_ddl("key string, value binary"))
    partitions = reader.partitions()
    assert len(partitions) >= 3
    assert all(isinstance(p, GridScanPartition) for p in partitions)
    covered = sorted(pid for p in partitions for pid in p.partition_ids)
    assert covered == list(range(271))
    rows = _read_all(reader)
    assert {r["key"]: r["value"] for r in rows} == entries


def test_read_dicts_with_a_user_schema(fake_grid: FakeGrid) -> None:
    _fill(fake_grid, "orders", {"o1": {"qty": 2, "price": 1.5, "extra": "x"}, "o2": {"qty": 1}})
    reader = ShmgridDataSource({"map": "orders"}).reader(_ddl("key string, qty int, price double"))
    assert _read_all(reader) == [
        {"key": "o1", "qty": 2, "price": 1.5},
        {"key": "o2", "qty": 1, "price": None},
    ]


def test_num_partitions_option(fake_grid: FakeGrid) -> None:
    reader = ShmgridDataSource({"map": "m", "num.partitions": "3"}).reader(
        _ddl("key string, value string")
    )
    assert len(reader.partitions()) == 3


def test_plain_reader_does_not_override_push_filters(fake_grid: FakeGrid) -> None:
    """PySpark refuses a reader overriding pushFilters when pushdown is off (the default)."""
    from pyspark.sql.datasource import DataSourceReader

    reader = ShmgridDataSource({"map": "m"}).reader(_ddl("key string, value int"))
    assert type(reader) is ShmgridReader
    assert reader.pushFilters.__func__ is DataSourceReader.pushFilters


def test_pushdown_reader_only_for_the_pushdown_planner(fake_grid: FakeGrid) -> None:
    source = ShmgridDataSource({"map": "m"})
    schema = _ddl("key string, value int")
    namespace = {"source": source, "schema": schema}
    fake_planner = compile(
        "def _main():\n    return source.reader(schema)\n",
        "/x/pyspark/sql/worker/data_source_pushdown_filters.py",
        "exec",
    )
    exec(fake_planner, namespace)
    assert type(namespace["_main"]()) is ShmgridPushdownReader
    assert _called_from_pushdown_planner() is False
    forced = ShmgridDataSource({"map": "m", "filter.pushdown": "true"}).reader(schema)
    assert type(forced) is ShmgridPushdownReader
    namespace["source"] = ShmgridDataSource({"map": "m", "filter.pushdown": "false"})
    assert type(namespace["_main"]()) is ShmgridReader


def test_key_filters_become_batched_gets(fake_grid: FakeGrid) -> None:
    _fill(fake_grid, "m", {f"o{i}": {"qty": i} for i in range(100)})
    reader = ShmgridDataSource({"map": "m", "filter.pushdown": "true"}).reader(
        _ddl("key string, qty bigint")
    )
    not_null = IsNotNull(("key",))
    key_in = In(("key",), ("o1", "o7", "o404"))
    qty_gt = GreaterThan(("qty",), 3)
    negated = Not(EqualTo(("key",), "o1"))
    filters = [not_null, key_in, qty_gt, negated]
    # All are handed back: Spark re-applies them, which keeps a reused plan correct.
    assert reader.pushFilters(filters) == filters
    assert reader.pushed_keys == frozenset({"o1", "o7", "o404"})
    partitions = reader.partitions()
    assert partitions and all(isinstance(p, GridKeysPartition) for p in partitions)
    assert len({p.plan_token for p in partitions}) == 1
    fake_grid.calls.clear()
    assert _read_all(reader) == [{"key": "o1", "qty": 1}, {"key": "o7", "qty": 7}]
    assert {op for op, name in fake_grid.calls if name == "m"} == {"get_all"}


def test_anded_key_filters_intersect(fake_grid: FakeGrid) -> None:
    _fill(fake_grid, "m", {"a": 1, "b": 2})
    reader = ShmgridDataSource({"map": "m", "filter.pushdown": "true"}).reader(
        _ddl("key string, value bigint")
    )
    reader.pushFilters([In(("KEY",), ["a", "b"]), EqualTo(("key",), "b")])
    assert reader.pushed_keys == {"b"}
    assert _read_all(reader) == [{"key": "b", "value": 2}]
    reader.pushFilters([EqualTo(("key",), "a"), EqualTo(("key",), "b")])
    assert reader.pushed_keys == frozenset()
    (only,) = reader.partitions()  # one task, so that a reused plan still scans everything
    assert only.keys == ()
    assert _read_all(reader) == []


def test_filters_on_other_columns_or_without_key_column_push_no_keys(
    fake_grid: FakeGrid,
) -> None:
    reader = ShmgridDataSource({"map": "m", "filter.pushdown": "true"}).reader(_ddl("qty bigint"))
    pushed = [EqualTo(("key",), "a"), EqualTo(("qty",), 1)]
    assert reader.pushFilters(pushed) == pushed
    assert reader.pushed_keys is None
    assert all(isinstance(p, GridScanPartition) for p in reader.partitions())


class _Context:
    """Stands in for pyspark.TaskContext in a task of SQL execution `execution`."""

    def __init__(self, execution: str | None, stage: int = 0, task: int = 0) -> None:
        self.execution, self.stage, self.task = execution, stage, task

    def getLocalProperty(self, name: str) -> str | None:  # noqa: N802 - PySpark's name
        assert name == "spark.sql.execution.id"
        return self.execution

    def stageId(self) -> int:  # noqa: N802
        return self.stage

    def partitionId(self) -> int:  # noqa: N802
        return self.task


def _key_plan(fake_grid: FakeGrid, count: int):
    _fill(fake_grid, "m", {f"o{i}": i for i in range(count)})
    reader = ShmgridDataSource({"map": "m", "filter.pushdown": "true"}).reader(
        _ddl("key string, value bigint")
    )
    reader.pushFilters([In(("key",), ["o1", "o2", "o3"])])
    return reader, reader.partitions()


def _rows(reader, partition) -> dict:
    return {r["key"]: r["value"] for b in reader.read(partition) for r in b.to_pylist()}


def test_a_key_plan_reused_by_a_later_query_scans_instead(fake_grid, monkeypatch) -> None:
    """PySpark 4.3 reuses a pushdown plan for later unfiltered scans of the same DataFrame."""
    from pyspark import TaskContext

    reader, partitions = _key_plan(fake_grid, 300)
    context = _Context("7")
    monkeypatch.setattr(TaskContext, "get", classmethod(lambda cls: context))
    first = {}
    for partition in partitions:
        first.update(_rows(reader, partition))
    assert first == {"o1": 1, "o2": 2, "o3": 3}
    retry = {}  # the same tasks again (a retry) still use gets
    for partition in partitions:
        retry.update(_rows(reader, partition))
    assert retry == first
    context.execution = "8"  # a later query that pushed no filter got the cached plan
    reused = {}
    for partition in partitions:
        reused.update(_rows(reader, partition))
    assert reused == {f"o{i}": i for i in range(300)}  # Spark applies that query's filters


def test_an_old_key_plan_scans_and_a_shared_one_fails(fake_grid, monkeypatch) -> None:
    from pyspark import TaskContext

    from grid.spark.source import KeyPlanSharedError

    reader, partitions = _key_plan(fake_grid, 50)
    context = _Context("1", stage=0, task=0)
    monkeypatch.setattr(TaskContext, "get", classmethod(lambda cls: context))
    assert _rows(reader, partitions[0]) != {}
    context.stage, context.task = 3, 1  # another scan of the same plan in the same query
    with pytest.raises(KeyPlanSharedError, match="filter.pushdown=false"):
        _rows(reader, partitions[0])
    context.execution = None  # not in a SQL execution: cannot claim, so scan
    old = [p for p in partitions]
    for partition in old:
        partition.planned_at_s -= 3600
    assert len(_rows(reader, old[0])) >= 50 // len(old) - 10


def test_append_writes_row_dicts_keyed_by_key_column(fake_grid: FakeGrid) -> None:
    source = ShmgridDataSource({"map": "totals", "key.column": "customer", "batch.size": "2"})
    schema = _ddl("customer string, total double, n int")
    tasks = [
        {"customer": ["c1", "c2", "c3"], "total": [1.0, 2.0, 3.0], "n": [1, 2, 3]},
        {"customer": ["c4"], "total": [4.0], "n": [None]},
    ]
    writer, messages = _write(source, schema, tasks, overwrite=False)
    assert [m.row_count for m in messages] == [3, 1]
    writer.commit(messages)
    assert fake_grid.client().get_map("totals").items() == {
        "c1": {"total": 1.0, "n": 1},
        "c2": {"total": 2.0, "n": 2},
        "c3": {"total": 3.0, "n": 3},
        "c4": {"total": 4.0, "n": None},
    }
    # A retried task puts the same rows again: an upsert, no harm.
    _write(source, schema, tasks[:1], overwrite=False)
    assert fake_grid.client().get_map("totals").size() == 4


def test_key_value_frames_store_scalars_and_value_column_picks_one(fake_grid: FakeGrid) -> None:
    schema = _ddl("key string, value binary")
    _write(ShmgridDataSource({"map": "a"}), schema, [{"key": ["x"], "value": [b"1"]}], False)
    assert fake_grid.client().get_map("a").items() == {"x": b"1"}
    schema = _ddl("id bigint, name string, score double")
    source = ShmgridDataSource({"map": "b", "key.column": "id", "value.column": "score"})
    _write(source, schema, [{"id": [7], "name": ["n"], "score": [0.5]}], False)
    assert fake_grid.client().get_map("b").items() == {7: 0.5}


def test_overwrite_publishes_on_commit_and_clears_partitions_not_written(
    fake_grid: FakeGrid,
) -> None:
    client = fake_grid.client()
    old = {f"old{i}": i for i in range(300)}
    _fill(fake_grid, "m", old | {"kept-key": -1})
    source = ShmgridDataSource({"map": "m"})
    schema = _ddl("key string, value bigint")
    new = {"kept-key": 1, "n1": 2}
    writer, messages = _write(
        source, schema, [{"key": list(new), "value": list(new.values())}], True
    )
    # Nothing visible before commit; the job is in the staging registry.
    assert client.get_map("m").items() == old | {"kept-key": -1}
    registry = client.get_map(staging.STAGING_REGISTRY_MAP).items()
    assert list(registry) == [writer.staging_name]
    assert messages[0].grid_partition_ids == {client.partition_id(k) for k in new}
    pickle.loads(pickle.dumps(writer)).commit(messages)
    assert client.get_map("m").items() == new
    assert client.get_map(writer.staging_name).size() == 0
    assert client.get_map(staging.STAGING_REGISTRY_MAP).size() == 0


def test_overwrite_with_an_empty_frame_empties_the_map(fake_grid: FakeGrid) -> None:
    _fill(fake_grid, "m", {"a": 1, "b": 2})
    writer, messages = _write(
        ShmgridDataSource({"map": "m"}), _ddl("key string, value bigint"), [], True
    )
    writer.commit(messages)
    assert fake_grid.client().get_map("m").size() == 0


def test_failed_overwrite_leaves_the_target_intact(fake_grid: FakeGrid) -> None:
    _fill(fake_grid, "m", {"a": 1, "b": 2})
    source = ShmgridDataSource({"map": "m", "batch.size": "1"})
    writer = source.writer(_ddl("key string, value bigint"), True)

    def failing_batches():
        yield pa.RecordBatch.from_pydict({"key": ["a", "z"], "value": [10, 26]})
        raise RuntimeError("task failed half-way")

    with pytest.raises(RuntimeError):
        pickle.loads(pickle.dumps(writer)).write(failing_batches())
    assert fake_grid.client().get_map(writer.staging_name).size() == 2
    pickle.loads(pickle.dumps(writer)).abort([None])
    assert fake_grid.client().get_map("m").items() == {"a": 1, "b": 2}
    assert fake_grid.client().get_map(writer.staging_name).size() == 0
    assert fake_grid.client().get_map(staging.STAGING_REGISTRY_MAP).size() == 0


def test_commit_without_messages_scans_staging_for_its_partitions(fake_grid: FakeGrid) -> None:
    _fill(fake_grid, "m", {f"old{i}": i for i in range(100)})
    writer, _messages = _write(
        ShmgridDataSource({"map": "m"}),
        _ddl("key string, value bigint"),
        [{"key": ["n1", "n2"], "value": [1, 2]}],
        True,
    )
    writer.commit([None])
    assert fake_grid.client().get_map("m").items() == {"n1": 1, "n2": 2}


def test_rows_of_a_failed_attempt_in_partitions_no_task_wrote_are_removed(
    fake_grid: FakeGrid,
) -> None:
    source = ShmgridDataSource({"map": "m"})
    writer = source.writer(_ddl("key string, value bigint"), True)
    client = fake_grid.client()
    junk = next(f"junk{i}" for i in range(100) if client.partition_id(f"junk{i}") != 0)
    key = next(f"k{i}" for i in range(1000) if client.partition_id(f"k{i}") == 0)
    client.get_map(writer.staging_name).put(junk, 0)  # what a failed attempt left
    shipped = pickle.loads(pickle.dumps(writer))
    message = shipped.write(iter([pa.RecordBatch.from_pydict({"key": [key], "value": [1]})]))
    writer.commit([message])
    assert client.get_map("m").items() == {key: 1}


def test_stale_jobs_are_swept_and_a_swept_job_cannot_commit(fake_grid: FakeGrid) -> None:
    client = fake_grid.client()
    _fill(fake_grid, "m", {"a": 1})
    stale = staging.begin_overwrite(client, "m", "job1", ttl_s=60, now_s=1000.0)
    client.get_map(stale).put("b", 2)
    fresh = staging.begin_overwrite(client, "m", "job2", ttl_s=60, now_s=1030.0)
    assert set(client.get_map(staging.STAGING_REGISTRY_MAP).items()) == {stale, fresh}
    swept = staging.sweep_stale_jobs(client, now_s=1070.0, ttl_s=60)
    assert swept == [stale]
    assert client.get_map(stale).size() == 0
    with pytest.raises(staging.StagingLostError, match="was left as it was"):
        staging.commit_overwrite(client, "m", stale, [client.partition_id("b")])
    assert client.get_map("m").items() == {"a": 1}


def test_writer_refuses_missing_key_column_and_unserialisable_types(fake_grid: FakeGrid) -> None:
    source = ShmgridDataSource({"map": "m", "key.column": "id"})
    with pytest.raises(ValueError, match="key column 'id'"):
        source.writer(_ddl("key string, value int"), False)
    with pytest.raises(ColumnNotSerializableError, match="column 'ts' has type timestamp"):
        source.writer(_ddl("id string, ts timestamp"), False)
    with pytest.raises(ColumnNotSerializableError, match="decimal"):
        nested = StructType([StructField("d", DecimalType(10, 2))])
        source.writer(
            StructType([StructField("id", StringType()), StructField("s", nested)]), False
        )
    with pytest.raises(KeyColumnNotSerializableError, match="key column 'id' has type date"):
        source.writer(_ddl("id date, v int"), False)
    assert issubclass(ColumnNotSerializableError, errors.ValueNotSerializableError)
    assert issubclass(KeyColumnNotSerializableError, errors.KeyNotSerializableError)
    assert fake_grid.calls == []  # refused before connecting or staging anything


def test_null_keys_fail_the_task_with_a_clear_error(fake_grid: FakeGrid) -> None:
    source = ShmgridDataSource({"map": "m"})
    with pytest.raises(ValueError, match="key column 'key' has 1 null"):
        _write(
            source,
            _ddl("key string, value int"),
            [{"key": ["a", None], "value": [1, 2]}],
            False,
        )


def test_unserialisable_value_raises_the_grid_error(fake_grid: FakeGrid) -> None:
    writer = ShmgridDataSource({"map": "m", "value.column": "v"}).writer(
        _ddl("key string, v string"), False
    )
    import datetime

    batch = pa.RecordBatch.from_pydict({"key": ["a"], "v": [datetime.date(2024, 1, 1)]})
    with pytest.raises(errors.ValueNotSerializableError):
        writer.write(iter([batch]))
