"""Arrow batches from entries and back, and the pure read/overwrite planning. No Spark."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from grid.serialization import serialize_key, serialize_value  # noqa: E402
from grid.spark.arrow import (  # noqa: E402 - after the importorskip
    KeyColumnNullError,
    batch_of_columns,
    batch_to_entries,
    build_batch,
    bulk_columns,
    fragment_columns,
    resolve_write_columns,
)
from grid.spark.planning import (  # noqa: E402
    normalize_filter_key,
    partitions_to_clear,
    plan_key_tasks,
    plan_scan_tasks,
)
from grid.spark.schema import ColumnLayout  # noqa: E402
from tests.spark.fake_grid import local_fragment  # noqa: E402


def _schema(*fields: tuple[str, object]) -> pa.Schema:
    return pa.schema([pa.field(name, t) for name, t in fields])


def test_scalar_values_fill_key_and_value_columns() -> None:
    schema = _schema(("key", pa.string()), ("value", pa.binary()))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    batch = build_batch(["a", "b"], [b"x", b"yy"], layout, schema)
    assert batch.schema.equals(schema)
    assert batch.to_pydict() == {"key": ["a", "b"], "value": [b"x", b"yy"]}


def test_dict_values_fill_named_columns_and_missing_fields_are_null() -> None:
    schema = _schema(("key", pa.string()), ("qty", pa.int32()), ("price", pa.float64()))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    values = [{"qty": 3, "price": 1.5}, {"qty": 1}, "not a dict"]
    batch = build_batch(["o1", "o2", "o3"], values, layout, schema)
    assert batch.to_pydict() == {
        "key": ["o1", "o2", "o3"],
        "qty": [3, 1, None],
        "price": [1.5, None, None],
    }


def test_value_column_takes_scalars_and_dict_fields_named_value() -> None:
    schema = _schema(("key", pa.int64()), ("value", pa.int64()))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    batch = build_batch([1, 2, 3], [10, {"value": 20}, {"other": 1}], layout, schema)
    assert batch.column(1).to_pylist() == [10, 20, None]


def test_explicit_value_column_gets_whole_values_as_json_text() -> None:
    schema = _schema(("key", pa.string()), ("v", pa.string()))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column="v")
    batch = build_batch(["a", "b"], [{"q": 1}, [1, 2]], layout, schema)
    assert batch.column(1).to_pylist() == ['{"q":1}', "[1,2]"]


def test_tuple_keys_in_a_string_column_become_json_text() -> None:
    schema = _schema(("key", pa.string()), ("value", pa.int64()))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    batch = build_batch([("c1", 2)], [5], layout, schema)
    assert batch.column(0).to_pylist() == ['["c1",2]']


def test_nested_values_convert_to_declared_nested_types() -> None:
    schema = _schema(("key", pa.string()), ("tags", pa.list_(pa.string())))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    batch = build_batch(["a"], [{"tags": ["x", "y"]}], layout, schema)
    assert batch.column(1).to_pylist() == [["x", "y"]]


def test_a_value_the_schema_cannot_hold_names_column_and_value() -> None:
    schema = _schema(("key", pa.string()), ("qty", pa.int32()))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    with pytest.raises(ValueError, match=r"column 'qty' is declared int32 .* 'lots'"):
        build_batch(["a", "b"], [{"qty": 1}, {"qty": "lots"}], layout, schema)


def test_schema_without_key_column() -> None:
    schema = _schema(("qty", pa.int64()))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    assert build_batch(["a"], [{"qty": 4}], layout, schema).to_pydict() == {"qty": [4]}


def test_resolve_write_columns() -> None:
    assert resolve_write_columns(["key", "value"], "key", None) == (0, 1, ())
    assert resolve_write_columns(["a", "customer", "b"], "Customer", None) == (1, None, (0, 2))
    assert resolve_write_columns(["k", "x", "y"], "k", "y") == (0, 2, ())
    with pytest.raises(ValueError, match="key column 'id' \\(option 'key.column'\\)"):
        resolve_write_columns(["key", "value"], "id", None)
    with pytest.raises(ValueError, match="value column 'z' \\(option 'value.column'\\)"):
        resolve_write_columns(["key", "value"], "key", "z")
    with pytest.raises(ValueError, match="only the key column"):
        resolve_write_columns(["key"], "key", None)


def test_batch_to_entries_rows_and_whole_values() -> None:
    batch = pa.RecordBatch.from_pydict(
        {"customer": ["c1", "c2"], "total": [1.5, 2.0], "n": [1, None]}
    )
    keys, values = batch_to_entries(batch, 0, None, (1, 2))
    assert keys == ["c1", "c2"]
    assert values == [{"total": 1.5, "n": 1}, {"total": 2.0, "n": None}]
    keys, values = batch_to_entries(batch, 0, 1, ())
    assert values == [1.5, 2.0]


def test_array_keys_become_tuples() -> None:
    batch = pa.RecordBatch.from_pydict({"k": [["a", "b"]], "v": [1]})
    assert batch_to_entries(batch, 0, 1, ()) == ([("a", "b")], [1])


def test_null_keys_are_refused_naming_the_column() -> None:
    batch = pa.RecordBatch.from_pydict({"customer": ["c1", None], "v": [1, 2]})
    with pytest.raises(KeyColumnNullError, match="key column 'customer' has 1 null"):
        batch_to_entries(batch, 0, 1, ())


def test_scan_tasks_cover_every_partition_once_grouped_by_owner() -> None:
    owners = {p: f"m{p % 3}" for p in range(271)}
    tasks = plan_scan_tasks(271, owners, 6)
    assert len(tasks) == 6
    for task in tasks:
        assert {owners[p] for p in task.partition_ids} == {task.owner}
    assert [t.owner for t in tasks[:3]] == ["m0", "m1", "m2"]  # interleaved across members
    sizes = [len(t.partition_ids) for t in tasks]
    assert max(sizes) - min(sizes) <= 1


def test_scan_tasks_with_uneven_owners_and_unassigned_partitions() -> None:
    owners = {p: "big" for p in range(200)} | {p: "small" for p in range(200, 260)}
    tasks = plan_scan_tasks(271, owners, 4)
    by_owner: dict[str, int] = {}
    for task in tasks:
        by_owner[task.owner] = by_owner.get(task.owner, 0) + 1
    assert by_owner == {"big": 3, "small": 1, "": 1}
    assert plan_scan_tasks(5, {}, 100) == plan_scan_tasks(5, {}, 5)
    assert len(plan_scan_tasks(5, {}, 100)) == 5


def test_key_tasks_group_by_owner_and_chunk() -> None:
    owners = {0: "a", 1: "b"}
    tasks = plan_key_tasks(["k1", "k2", "k3", "k1"], lambda k: int(k[1]) % 2, owners, 1)
    assert sorted((t.owner, t.keys) for t in tasks) == [
        ("a", ("k2",)),
        ("b", ("k1",)),
        ("b", ("k3",)),
    ]


def test_partitions_to_clear() -> None:
    assert partitions_to_clear(5, [1, 3]) == [0, 2, 4]
    assert partitions_to_clear(3, []) == [0, 1, 2]


def test_normalize_filter_key() -> None:
    assert normalize_filter_key("a") == (True, "a")
    assert normalize_filter_key(bytearray(b"x")) == (True, b"x")
    assert normalize_filter_key(["a", 1]) == (True, ("a", 1))
    assert normalize_filter_key(None) == (False, None)
    assert normalize_filter_key(["a", None]) == (False, None)


# -- local fragments decoded in bulk -----------------------------------------------------


def _records(pairs: list[tuple[object, object]]) -> list[tuple[bytes, bytes]]:
    return [(serialize_key(k), serialize_value(v)) for k, v in pairs]


def _bulk(pairs: list[tuple[object, object]], schema: pa.Schema, **kwargs: int):
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    columns = bulk_columns(layout, schema)
    assert columns is not None
    return fragment_columns(local_fragment(_records(pairs), **kwargs), schema, columns), columns


@pytest.mark.parametrize("dead", [0, 2])
def test_a_fragment_is_cut_into_the_arrays_a_row_by_row_decode_gives(dead: int) -> None:
    """Every msgpack header length (fixstr, str8, str16; bin8, bin16, bin32), non-ASCII
    text, empty values, records the index no longer points at between the live ones."""
    pairs = [("k1", b"v"), ("ключ", b""), ("x" * 40, b"y" * 300), ("z" * 70_000, b"w" * 70_000),
             ("", b"\x00\xff")]
    schema = _schema(("key", pa.string()), ("value", pa.binary()))
    (keys, values), columns = _bulk(pairs, schema, dead=dead)
    assert keys.to_pylist() == [k for k, _ in pairs]
    assert values.to_pylist() == [v for _, v in pairs]
    fragment = local_fragment(_records(pairs), dead=dead)
    assert fragment.entries() == ([k for k, _ in pairs], [v for _, v in pairs])
    batch = batch_of_columns([(keys, values), (keys, values)], columns, schema)
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    expected = build_batch([k for k, _ in pairs] * 2, [v for _, v in pairs] * 2, layout, schema)
    assert batch.equals(expected)


def test_string_values_binary_keys_and_columns_in_either_order() -> None:
    pairs = [(b"k1", "one"), (b"k\xff", "два")]
    schema = _schema(("value", pa.string()), ("key", pa.binary()))
    (keys, values), columns = _bulk(pairs, schema)
    assert columns == (1, 0)
    batch = batch_of_columns([(keys, values)], columns, schema)
    assert batch.to_pydict() == {"value": ["one", "два"], "key": [b"k1", b"k\xff"]}


@pytest.mark.parametrize("pairs", [
    [("k1", b"v"), (7, b"v")],  # an int key in a string column
    [("k1", b"v"), ("k2", "text")],  # a str value in a binary column
    [("k1", b"v"), ("k2", {"a": 1})],  # a dict value
    [("k1", b"v"), ("k2", None)],  # a null
], ids=["int-key", "str-value", "dict-value", "null-value"])
def test_a_record_of_another_type_leaves_the_fragment_to_the_row_by_row_decode(pairs) -> None:
    schema = _schema(("key", pa.string()), ("value", pa.binary()))
    assert _bulk(pairs, schema)[0] is None


def test_a_str_that_is_not_utf8_leaves_the_fragment_to_the_row_by_row_decode() -> None:
    schema = _schema(("key", pa.string()), ("value", pa.binary()))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    fragment = local_fragment([(b"\xa2\xff\xfe", serialize_value(b"v"))])
    assert fragment_columns(fragment, schema, bulk_columns(layout, schema)) is None


def test_an_empty_fragment_gives_empty_arrays() -> None:
    schema = _schema(("key", pa.string()), ("value", pa.binary()))
    (keys, values), _ = _bulk([], schema)
    assert len(keys) == len(values) == 0 and keys.type == pa.string()


def test_only_a_key_and_a_whole_value_of_strings_or_bytes_are_decoded_in_bulk() -> None:
    def columns(schema: pa.Schema, value_column: str | None = None):
        layout = ColumnLayout.for_schema(schema.names, key_column="key",
                                         value_column=value_column)
        return bulk_columns(layout, schema)

    assert columns(_schema(("key", pa.string()), ("value", pa.binary()))) == (0, 1)
    assert columns(_schema(("key", pa.string()), ("body", pa.string())), "body") == (0, 1)
    assert columns(_schema(("key", pa.string()), ("value", pa.int64()))) is None
    assert columns(_schema(("key", pa.int64()), ("value", pa.binary()))) is None
    assert columns(_schema(("key", pa.string()), ("a", pa.string()), ("b", pa.string()))) \
        is None


def test_a_fragment_whose_records_run_past_its_arena_is_an_error() -> None:
    schema = _schema(("key", pa.string()), ("value", pa.binary()))
    layout = ColumnLayout.for_schema(schema.names, key_column="key", value_column=None)
    fragment = local_fragment(_records([("k1", b"v" * 100)]), spare=0)
    cut = type(fragment)(fragment.index, fragment.arena[:-10])
    with pytest.raises(ValueError, match="do not fit"):
        fragment_columns(cut, schema, bulk_columns(layout, schema))
