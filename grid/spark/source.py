"""The `shmgrid` Python data source: maps as DataFrames, DataFrames into maps.

What runs where (shared/reference/pyspark-datasource.md, section 3): `schema()`, `reader()`,
`pushFilters()`, `partitions()` and `writer()` run in planner Python workers on the driver
side; `read()` and `write()` in executor Python workers; `commit()` and `abort()` in a
driver-side worker with a fresh copy of the writer. Every object here is pickled between
them, so none holds a client: `grid.spark.connection` keeps one per process.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    EqualTo,
    Filter,
    In,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from grid import errors
from grid.client.map import BATCH_BYTES, LocalFragment
from grid.spark.arrow import (
    batch_of_columns,
    batch_to_entries,
    build_batch,
    bulk_columns,
    fragment_columns,
    resolve_write_columns,
)
from grid.spark.connection import client_for, drop_client
from grid.spark.options import FORMAT_NAME, SourceOptions, default_task_count, parse_options
from grid.spark.packed_write import PackedRows, pack_rows, packable
from grid.spark.planning import KeyTask, normalize_filter_key, plan_key_tasks, plan_scan_tasks
from grid.spark.schema import ColumnLayout, infer_ddl
from grid.spark.staging import abort_overwrite, begin_overwrite, commit_overwrite
from grid.spark.worker_gc import freeze_in_pyspark_worker

__all__ = [
    "ShmgridDataSource",
    "ShmgridReader",
    "ShmgridPushdownReader",
    "ShmgridWriter",
    "GridScanPartition",
    "GridKeysPartition",
    "GridCommitMessage",
    "KeyPlanSharedError",
    "ColumnNotSerializableError",
    "KeyColumnNotSerializableError",
]

# In a PySpark worker the modules just imported live as long as it: out of the way of the
# collection PySpark runs after every task (grid/spark/worker_gc.py).
freeze_in_pyspark_worker()

# Errors after which a cached client may be stale (cluster restarted, member set changed).
_reconnect_errors = (errors.ClusterNotRunningError, errors.OperationTimeoutError)


class ColumnNotSerializableError(errors.ValueNotSerializableError):
    """A column's Spark type has no msgpack form (dates, timestamps, decimals, maps)."""

    def __init__(self, column: str, type_name: str) -> None:
        errors.GridError.__init__(
            self,
            f"shmgrid: column {column!r} has type {type_name}, which the grid cannot "
            "serialise (values are msgpack: str, bytes, numbers, bools, lists, dicts); cast "
            "it first, e.g. to string or double, or leave the column out",
        )
        self.column, self.type_name = column, type_name


class KeyColumnNotSerializableError(errors.KeyNotSerializableError):
    """The key column's Spark type cannot be a grid key."""

    def __init__(self, column: str, type_name: str) -> None:
        errors.GridError.__init__(
            self,
            f"shmgrid: the key column {column!r} has type {type_name}; grid keys are str, "
            "bytes, int, float, bool or arrays of these (stored as tuples); cast the column "
            "or choose another one with option 'key.column'",
        )
        self.column, self.type_name = column, type_name


_scalar_type_names = frozenset(
    {
        "StringType",
        "CharType",
        "VarcharType",
        "BinaryType",
        "BooleanType",
        "ByteType",
        "ShortType",
        "IntegerType",
        "LongType",
        "FloatType",
        "DoubleType",
    }
)


def _value_type_ok(data_type: Any) -> bool:
    name = type(data_type).__name__
    if name in _scalar_type_names or name == "NullType":
        return True
    if name == "ArrayType":
        return _value_type_ok(data_type.elementType)
    if name == "StructType":
        return all(_value_type_ok(f.dataType) for f in data_type.fields)
    return False


def _key_type_ok(data_type: Any) -> bool:
    name = type(data_type).__name__
    if name in _scalar_type_names:
        return True
    return name == "ArrayType" and _key_type_ok(data_type.elementType)


def check_writable(schema: StructType, key_index: int, value_columns: Sequence[int]) -> None:
    """Refuse, before any task runs, a key or value column the grid cannot serialise."""
    key_field = schema.fields[key_index]
    if not _key_type_ok(key_field.dataType):
        raise KeyColumnNotSerializableError(key_field.name, key_field.dataType.simpleString())
    for index in value_columns:
        field = schema.fields[index]
        if not _value_type_ok(field.dataType):
            raise ColumnNotSerializableError(field.name, field.dataType.simpleString())


def _arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks a reader's first batch against, exactly."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _called_from_pushdown_planner(depth_max: int = 12) -> bool:
    """True if PySpark's filter-pushdown planner worker is asking for the reader.

    PySpark refuses every read of a reader that overrides `pushFilters` while
    `spark.sql.python.filterPushdown.enabled` is off, and the reader is not told whether it is
    on. It is on exactly when the pushdown worker plans the read, so the source gives that
    worker the pushdown reader and every other caller the plain one. If a later PySpark moves
    this code, the check fails safe: reads work, without pushdown.
    """
    frame = sys._getframe(1)
    for _ in range(depth_max):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back
    return False


SAMPLE_CHUNK_BYTES_MIN = 64 * 1024


def sample_entries(client: Any, map_name: str, sample_size: int) -> tuple[list, list]:
    """Up to `sample_size` entries of the map, from its first non-empty partitions."""
    assert sample_size >= 1
    keys: list = []
    values: list = []
    # Replies of about what the sample needs, not whole partitions: a 500,000-row map's
    # first 8 partitions are 1.6 MB, which cost each DataFrame load 20-35 ms.
    batches = client.get_map(map_name).scan_partitions(
        range(client.partition_count),
        batch_size=min(sample_size, 10_000),
        chunk_bytes=max(SAMPLE_CHUNK_BYTES_MIN, sample_size * 128),
    )
    try:
        for batch_keys, batch_values in batches:
            keys.extend(batch_keys)
            values.extend(batch_values)
            if len(keys) >= sample_size:
                break
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    return keys[:sample_size], values[:sample_size]


@dataclass(repr=True)
class GridScanPartition(InputPartition):
    """A read task: stream these grid partitions (owned by `owner` when planned)."""

    index: int
    owner: str
    partition_ids: tuple[int, ...]


@dataclass(repr=True)
class GridKeysPartition(InputPartition):
    """A read task for pushed-down key filters: get these keys in one batched call.

    `plan_token`, `planned_at_s` and `task_count` let `read()` notice that Spark reuses the
    plan for another scan (see `ShmgridPushdownReader`) and scan its share of the map instead.
    """

    index: int
    owner: str
    keys: tuple[Any, ...]
    plan_token: str = ""
    planned_at_s: float = 0.0
    task_count: int = 1


class KeyPlanSharedError(RuntimeError):
    """One query scans a DataFrame twice and PySpark gave both scans the key-filter plan."""


@dataclass
class GridCommitMessage(WriterCommitMessage):
    """What one write task did; for an overwrite, which grid partitions it wrote to."""

    partition_id: int
    attempt: int
    row_count: int
    grid_partition_ids: frozenset[int] | None = None


class ShmgridDataSource(DataSource):
    """Format `shmgrid`: read a grid map as a DataFrame, write a DataFrame into a map."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        """Infer a schema from a sample of the map (only called without a user schema)."""
        options = parse_options(self.options)
        client = _client(options)
        keys, values = sample_entries(client, options.map_name, options.sample_size)
        return infer_ddl(
            keys,
            values,
            key_column=options.key_column,
            value_column=options.value_column or "value",
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        """The reader; the one with key pushdown only where Spark's pushdown is enabled."""
        options = parse_options(self.options)
        pushdown = options.filter_pushdown == "true" or (
            options.filter_pushdown == "auto" and _called_from_pushdown_planner()
        )
        reader_class = ShmgridPushdownReader if pushdown else ShmgridReader
        return reader_class(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> ShmgridWriter:
        """Check the columns, connect (a stopped cluster fails here, not in every task)."""
        options = parse_options(self.options)
        key_index, value_index, row_indexes = resolve_write_columns(
            schema.fieldNames(), options.key_column, options.value_column
        )
        value_columns = row_indexes if value_index is None else (value_index,)
        check_writable(schema, key_index, value_columns)
        client = _client(options)
        job_id = uuid.uuid4().hex
        staging_name = None
        if overwrite:
            staging_name = begin_overwrite(
                client, options.map_name, job_id, ttl_s=options.staging_ttl_s
            )
        return ShmgridWriter(options, job_id, staging_name)


def _client(options: SourceOptions) -> Any:
    """The worker's client; every task and planning step comes here first."""
    freeze_in_pyspark_worker()  # what the tasks so far imported: out of the collector's way
    try:
        return client_for(options)
    except _reconnect_errors:
        drop_client(options)
        raise


class ShmgridReader(DataSourceReader):
    """Reads a map in parallel: one task per group of grid partitions of one owner."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.layout = ColumnLayout.for_schema(
            schema.fieldNames(), key_column=options.key_column, value_column=options.value_column
        )
        self.pushed_keys: frozenset | None = None

    def partitions(self) -> list[InputPartition]:
        """Scan tasks from a fresh partition table, about 2 per core, grouped by owner."""
        client = _client(self.options)
        owners = client.partition_owners()
        task_count = self.options.num_partitions or default_task_count(len(set(owners.values())))
        tasks = plan_scan_tasks(client.partition_count, owners, task_count)
        return [GridScanPartition(i, t.owner, t.partition_ids) for i, t in enumerate(tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Stream the task's partitions (or get its keys) as Arrow record batches."""
        if not isinstance(partition, (GridScanPartition, GridKeysPartition)):
            return  # no keys matched the pushed filters: Spark's placeholder partition
        arrow_schema = _arrow_schema(self.schema)
        client = _client(self.options)
        # On the grid's host, scans and key gets read the owners' shared memory.
        grid_map = client.get_map(self.options.map_name, local_reads=self.options.local_reads)
        try:
            if isinstance(partition, GridScanPartition):
                partition_ids = list(partition.partition_ids)
            elif _key_plan_is_current(client, partition):
                found = grid_map.get_all(list(partition.keys)) if partition.keys else {}
                if found:
                    yield build_batch(list(found), list(found.values()), self.layout, arrow_schema)
                return
            else:  # a reused key plan: this task's share of a full scan (Spark filters the rows)
                count = client.partition_count
                partition_ids = [
                    p for p in range(count) if p % partition.task_count == partition.index
                ]
            yield from self._scan(grid_map, partition_ids, arrow_schema)
        except _reconnect_errors:
            drop_client(self.options)
            raise


    def _scan(self, grid_map: Any, partition_ids: list[int], arrow_schema: pa.Schema
              ) -> Iterator[pa.RecordBatch]:
        """Batches of about ``batch_size`` rows of the partitions. Those read from the
        owners' shared memory are cut out of the copied arenas in bulk where the schema
        allows (a key and a value column of strings or bytes, and records of those types);
        the rest are decoded and converted row by row."""
        batch_size = self.options.batch_size
        columns = bulk_columns(self.layout, arrow_schema)
        bulk: list[tuple[pa.Array, pa.Array]] = []
        bulk_rows = 0
        keys: list = []
        values: list = []
        for part in grid_map.scan_fragments(partition_ids):
            if part.__class__ is LocalFragment:
                arrays = fragment_columns(part, arrow_schema, columns) if columns else None
                if arrays is not None:
                    bulk.append(arrays)
                    bulk_rows += len(arrays[0])
                    if bulk_rows >= batch_size:
                        yield batch_of_columns(bulk, columns, arrow_schema)  # type: ignore[arg-type]
                        bulk, bulk_rows = [], 0
                    continue
                part = part.entries()
            keys.extend(part[0])
            values.extend(part[1])
            if len(keys) >= batch_size:
                yield build_batch(keys, values, self.layout, arrow_schema)
                keys, values = [], []
        if bulk_rows:
            yield batch_of_columns(bulk, columns, arrow_schema)  # type: ignore[arg-type]
        if keys:
            yield build_batch(keys, values, self.layout, arrow_schema)


class ShmgridPushdownReader(ShmgridReader):
    """The reader plus `EqualTo`/`In` on the key column, read as batched gets.

    PySpark 4.3 keeps the read plan made during filter pushdown on the loaded DataFrame's
    relation and reuses it for every later scan of that DataFrame that pushes no filter (a
    Spark bug; master keeps the plan per scan). A plan of key gets reused that way would
    return only those keys. So the key filters are also handed back to Spark, which
    re-applies them (cheap on a few rows), and each key task claims its plan in the grid
    (`KEY_PLANS_MAP`) with its SQL execution, stage and task: a plan first run by another
    execution, or older than `key_plan_fresh_s`, counts as reused, and its tasks scan their
    share of the map instead (correct, as Spark filters the rows). Two scans of one plan in
    the same query cannot be told apart and fail with KeyPlanSharedError rather than return
    wrong rows.
    """

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:  # noqa: N802 - PySpark's name
        """Collect key equality filters (ANDed: their key sets intersect); return them all."""
        key_path = (self.options.key_column.lower(),)
        keys: set | None = None
        for pushed in filters if self.layout.key_index is not None else ():
            path = tuple(p.lower() for p in getattr(pushed, "attribute", ()))
            if path != key_path or not isinstance(pushed, (EqualTo, In)):
                continue
            literals = [pushed.value] if isinstance(pushed, EqualTo) else list(pushed.value)
            found = set()
            for literal in literals:
                usable, key = normalize_filter_key(literal)
                if usable:
                    found.add(key)
            keys = found if keys is None else keys & found
        self.pushed_keys = None if keys is None else frozenset(keys)
        return list(filters)

    def partitions(self) -> list[InputPartition]:
        """Key-get tasks (grouped by owner) when key filters were pushed, else a scan."""
        if self.pushed_keys is None:
            return super().partitions()
        client = _client(self.options)
        _sweep_key_plans(client)
        tasks = plan_key_tasks(
            self.pushed_keys,
            client.partition_id,
            client.partition_owners(),
            self.options.batch_size,
        )
        if not tasks:  # no key can match; one task, so that a reused plan still scans
            tasks = [KeyTask("", ())]
        token, now = uuid.uuid4().hex, time.time()
        return [
            GridKeysPartition(i, t.owner, t.keys, token, now, len(tasks))
            for i, t in enumerate(tasks)
        ]


KEY_PLANS_MAP = "__shmgrid_spark_key_plans__"
key_plan_fresh_s = 5.0
key_plan_claim_ttl_s = 600.0


def _sweep_key_plans(client: Any) -> None:
    """Drop claims older than `key_plan_claim_ttl_s` (their plans are stale by age anyway)."""
    assert key_plan_claim_ttl_s > key_plan_fresh_s
    plans = client.get_map(KEY_PLANS_MAP)
    now = time.time()
    for keys, values in plans.scan_partitions(range(client.partition_count)):
        for key, claim in zip(keys, values, strict=True):
            if not isinstance(claim, dict) or now - claim.get("at_s", 0.0) > key_plan_claim_ttl_s:
                plans.remove(key)


def _key_plan_is_current(client: Any, partition: GridKeysPartition) -> bool:
    """True if this task may serve its key plan by gets (see ShmgridPushdownReader)."""
    from pyspark import TaskContext

    now = time.time()
    if now - partition.planned_at_s > key_plan_fresh_s:
        return False
    context = TaskContext.get()
    if context is None:
        return True  # called directly, outside Spark: nothing can reuse the plan
    execution = context.getLocalProperty("spark.sql.execution.id")
    if execution is None:
        return False
    claim = {
        "execution": execution,
        "stage": context.stageId(),
        "task": context.partitionId(),
        "at_s": now,
    }
    previous = client.get_map(KEY_PLANS_MAP).put((partition.plan_token, partition.index), claim)
    if not isinstance(previous, dict):
        return True
    if previous.get("execution") != execution:
        return False  # the plan of an earlier query, reused by this one
    if (previous.get("stage"), previous.get("task")) == (claim["stage"], claim["task"]):
        return True  # a retry of the same task
    raise KeyPlanSharedError(
        "shmgrid: this query scans one loaded DataFrame twice, and PySpark 4.3 gives both scans "
        "the read plan of the one with key filters, so the connector cannot tell which scan "
        "may use key lookups; load() the DataFrame once per use in the query, or set the "
        "option filter.pushdown=false"
    )


class _PendingRows:
    """A write task's rows on their way to the grid, sent about ``batch_size`` rows (or
    ``BATCH_BYTES``) at a time, in the order they came: batches of a string key and a string
    or binary value packed column-wise (grid/spark/packed_write.py), any other through
    Python objects and ``put_all_into``."""

    def __init__(self, grid_map: Any, touched: set[int] | None, batch_size: int,
                 partition_count: int, max_entry_bytes: int) -> None:
        self.grid_map, self.touched, self.batch_size = grid_map, touched, batch_size
        self.partition_count, self.max_entry_bytes = partition_count, max_entry_bytes
        self.keys: list = []
        self.values: list = []
        self.packed: list[PackedRows] = []
        self.packed_rows = self.packed_bytes = 0
        self.written = 0

    def add(self, batch: pa.RecordBatch, key_index: int, value_index: int | None,
            row_indexes: tuple[int, ...]) -> None:
        packed = None
        if batch.num_rows and packable(batch, key_index, value_index):
            packed = pack_rows(batch, key_index, value_index,  # type: ignore[arg-type]
                               self.partition_count, self.max_entry_bytes)
        if packed is not None:
            self._flush_entries()
            self.packed.append(packed)
            self.packed_rows += packed.rows
            self.packed_bytes += packed.size
            if self.packed_rows >= self.batch_size or self.packed_bytes >= BATCH_BYTES:
                self._flush_packed()
            return
        self._flush_packed()
        keys, values = batch_to_entries(batch, key_index, value_index, row_indexes)
        self.keys.extend(keys)
        self.values.extend(values)
        if len(self.keys) >= self.batch_size:
            self._flush_entries()

    def flush(self) -> None:
        self._flush_packed()
        self._flush_entries()

    def _flush_entries(self) -> None:
        if self.keys:
            self.grid_map.put_all_into(zip(self.keys, self.values, strict=True), self.touched)
            self.written += len(self.keys)
            self.keys, self.values = [], []

    def _flush_packed(self) -> None:
        if not self.packed:
            return
        counts: dict[int, int] = {}
        tables: dict[int, list] = {}
        records: dict[int, list] = {}
        for packed in self.packed:
            for pid, (count, table, data) in packed.pieces.items():
                if pid in counts:
                    counts[pid] += count
                    tables[pid].append(table)
                    records[pid].append(data)
                else:
                    counts[pid], tables[pid], records[pid] = count, [table], [data]
        self.grid_map.put_all_packed(
            {pid: (counts[pid], tables[pid], records[pid]) for pid in counts}, self.touched)
        self.written += self.packed_rows
        self.packed, self.packed_rows, self.packed_bytes = [], 0, 0


class ShmgridWriter(DataSourceArrowWriter):
    """Batched puts of Arrow batches; for an overwrite, into the job's staging map."""

    def __init__(self, options: SourceOptions, job_id: str, staging_name: str | None) -> None:
        self.options = options
        self.job_id = job_id
        self.staging_name = staging_name

    @property
    def write_map_name(self) -> str:
        return self.staging_name or self.options.map_name

    def write(self, iterator: Iterator[pa.RecordBatch]) -> GridCommitMessage:
        """Put every row; `put_all` groups each chunk by owner (one message per owner)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else -1
        attempt = context.attemptNumber() if context is not None else 0
        client = _client(self.options)
        grid_map = client.get_map(self.write_map_name)
        # An overwrite's commit must know which target partitions get new contents.
        touched: set[int] | None = set() if self.staging_name is not None else None
        rows = _PendingRows(grid_map, touched, self.options.batch_size,
                            client.partition_count, client.max_value_bytes)
        columns = None
        try:
            for batch in iterator:
                if columns is None:
                    columns = resolve_write_columns(
                        batch.schema.names, self.options.key_column, self.options.value_column
                    )
                rows.add(batch, *columns)
            rows.flush()
        except _reconnect_errors:
            drop_client(self.options)
            raise
        staged = frozenset(touched) if touched is not None else None
        return GridCommitMessage(partition_id, attempt, rows.written, staged)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """All tasks succeeded: for an overwrite, publish the staging map."""
        if self.staging_name is None:
            return
        staged: set[int] | None = set()
        for message in messages:
            if not isinstance(message, GridCommitMessage) or message.grid_partition_ids is None:
                staged = None  # unknown: commit scans the staging map instead
                break
            staged.update(message.grid_partition_ids)
        commit_overwrite(_client(self.options), self.options.map_name, self.staging_name, staged)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The job failed: for an overwrite, drop the staging map; the target is untouched.

        Appended rows stay (an append is a sequence of upserts, not a transaction).
        """
        if self.staging_name is not None:
            abort_overwrite(_client(self.options), self.staging_name)
