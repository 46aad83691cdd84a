"""The source's methods called directly (no Spark session) against a real 3-member cluster.

The fake grid covers the logic; these check it against the real client: partition owners,
scans, batched gets, put_all, and move_to as the publish step of an overwrite.
"""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from pyspark.sql.datasource import In  # noqa: E402 - after the importorskips
from pyspark.sql.types import LongType, StringType, StructField, StructType  # noqa: E402

from grid.spark import staging  # noqa: E402
from grid.spark.source import GridKeysPartition, ShmgridDataSource  # noqa: E402

KV_SCHEMA = StructType([StructField("key", StringType()), StructField("value", LongType())])


@pytest.fixture(scope="module")
def client(grid_cluster):
    return grid_cluster.connect()


def _options(grid_cluster, map_name: str, **more: str) -> dict[str, str]:
    return {"address": grid_cluster.address, "map": map_name, **more}


def _read_all(reader) -> dict:
    rows = {}
    for partition in pickle.loads(pickle.dumps(reader.partitions())):
        for batch in pickle.loads(pickle.dumps(reader)).read(partition):
            rows.update(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True))
    return rows


def test_scan_tasks_follow_the_real_partition_table(grid_cluster, client, map_name) -> None:
    entries = {f"k{i}": i for i in range(2_000)}
    client.get_map(map_name).put_all(entries)
    source = ShmgridDataSource(_options(grid_cluster, map_name, **{"batch.size": "300"}))
    assert source.schema() == "`key` string, `value` bigint"
    reader = source.reader(KV_SCHEMA)
    partitions = reader.partitions()
    owners = client.partition_owners()
    assert len({p.owner for p in partitions}) == 3
    for partition in partitions:
        assert {owners[i] for i in partition.partition_ids} == {partition.owner}
    assert _read_all(reader) == entries


def test_key_plan_reads_by_batched_gets(grid_cluster, client, map_name) -> None:
    client.get_map(map_name).put_all({f"k{i}": i for i in range(500)})
    source = ShmgridDataSource(_options(grid_cluster, map_name, **{"filter.pushdown": "true"}))
    reader = source.reader(KV_SCHEMA)
    reader.pushFilters([In(("key",), ("k1", "k2", "k499", "nope"))])
    assert all(isinstance(p, GridKeysPartition) for p in reader.partitions())
    assert _read_all(reader) == {"k1": 1, "k2": 2, "k499": 499}


def test_overwrite_commit_and_abort_on_the_real_grid(grid_cluster, client, map_name) -> None:
    target = client.get_map(map_name)
    old = {f"old{i}": i for i in range(1_000)}
    target.put_all(old)
    source = ShmgridDataSource(_options(grid_cluster, map_name, **{"batch.size": "7"}))
    new = pa.RecordBatch.from_pydict({"key": ["a", "b", "c"], "value": [1, 2, 3]})

    aborted = source.writer(KV_SCHEMA, True)
    pickle.loads(pickle.dumps(aborted)).write(iter([new]))
    pickle.loads(pickle.dumps(aborted)).abort([None])
    assert target.size() == len(old)
    assert client.get_map(aborted.staging_name).size() == 0

    committed = source.writer(KV_SCHEMA, True)
    message = pickle.loads(pickle.dumps(committed)).write(iter([new]))
    assert target.size() == len(old)  # nothing visible before commit
    pickle.loads(pickle.dumps(committed)).commit([message])
    assert target.size() == 3
    assert target.get_all(["a", "b", "c", "old1"]) == {"a": 1, "b": 2, "c": 3}
    registry = client.get_map(staging.STAGING_REGISTRY_MAP).get_all(
        [aborted.staging_name, committed.staging_name]
    )
    assert registry == {}


@pytest.mark.parametrize("grid", ["member", "fake"])
def test_move_to_empties_the_target_where_the_source_has_nothing(request, grid, map_name) -> None:
    """The fake grid's move_to behaves like the member's: every partition of the target is
    replaced, including those the source holds nothing in (they become empty)."""
    if grid == "member":
        client = request.getfixturevalue("client")
    else:
        client = request.getfixturevalue("fake_grid").client()
    target, stage = client.get_map(map_name), client.get_map(map_name + "-stage")
    old = {f"old{i}": i for i in range(300)}
    target.put_all(old)
    new = {"a": 1, "b": 2}
    stage.put_all(new)
    staged = {client.partition_id(key) for key in new}
    assert any(client.partition_id(key) not in staged for key in old)
    stage.move_to(map_name)
    assert stage.size() == 0
    rows = {}
    for keys, values in target.scan_partitions(range(client.partition_count)):
        rows.update(zip(keys, values, strict=True))
    assert rows == new
