"""Options parsing, schema inference and read column layout: plain Python, no Spark."""

from __future__ import annotations

import pytest

from grid.spark.options import default_task_count, parse_options
from grid.spark.schema import ColumnLayout, infer_ddl, infer_type, merge_types, to_text


def test_map_option_is_required_and_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="'map' option is missing"):
        parse_options({"address": "tcp://127.0.0.1:1"})


def test_path_stands_in_for_map_and_defaults_apply() -> None:
    options = parse_options({"path": "orders"})
    assert options.map_name == "orders"
    assert options.key_column == "key"
    assert options.value_column is None
    assert options.batch_size == 50_000
    assert options.filter_pushdown == "auto"
    assert options.local_reads is True
    assert options.connect_args() == (None, None, None, 60.0)


def test_options_are_case_insensitive_and_typed() -> None:
    options = parse_options(
        {
            "MAP": "m",
            "Key.Column": "customer",
            "value.column": "total",
            "batch.size": "500",
            "cluster.name": "dev2",
            "num.partitions": "7",
            "invocation.timeout": "2.5",
            "Local.Reads": "FALSE",
        }
    )
    assert (options.map_name, options.key_column, options.value_column) == (
        "m",
        "customer",
        "total",
    )
    assert options.batch_size == 500
    assert options.cluster_name == "dev2"
    assert options.num_partitions == 7
    assert options.invocation_timeout_s == 2.5
    assert options.local_reads is False


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"map": "m", "batch.size": "many"}, "'batch.size' must be an integer"),
        ({"map": "m", "batch.size": "0"}, "'batch.size' must be between"),
        ({"map": "m", "key.colum": "k"}, "unknown shmgrid option"),
        ({"map": "m", "key.column": "a", "value.column": "A"}, "name the same column"),
        ({"map": "m", "filter.pushdown": "maybe"}, "'filter.pushdown' must be"),
        ({"map": "m", "local.reads": "sometimes"}, "'local.reads' must be true or false"),
        ({"map": "m", "invocation.timeout": "-1"}, "'invocation.timeout' must be positive"),
    ],
)
def test_bad_options_name_the_option(raw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_options(raw)


def test_default_task_count_is_two_per_core_and_one_per_owner_at_least() -> None:
    assert default_task_count(3, cpu_count=2) == 4
    assert default_task_count(10, cpu_count=2) == 10


def test_infer_type_and_merge() -> None:
    assert infer_type(True) == "boolean"
    assert infer_type(3) == "bigint"
    assert infer_type(2**70) == "string"
    assert infer_type(1.5) == "double"
    assert infer_type("x") == "string"
    assert infer_type(b"x") == "binary"
    assert infer_type([1]) == "string"
    assert infer_type(None) is None
    assert merge_types("bigint", "double") == "double"
    assert merge_types(None, "binary") == "binary"
    assert merge_types("bigint", "string") == "string"
    assert merge_types("boolean", "bigint") == "string"


def test_infer_scalars_gives_key_and_value_columns() -> None:
    ddl = infer_ddl(["a", "b"], [1, 2.5], key_column="key", value_column="value")
    assert ddl == "`key` string, `value` double"


def test_infer_dicts_gives_the_union_of_fields_in_first_seen_order() -> None:
    ddl = infer_ddl(
        [1, 2, 3],
        [{"qty": 1, "price": 2.0}, {"qty": 2, "note": "x", "key": "ignored"}, None],
        key_column="key",
        value_column="value",
    )
    assert ddl == "`key` bigint, `qty` bigint, `price` double, `note` string"


def test_infer_empty_map_and_odd_names() -> None:
    assert infer_ddl([], [], key_column="key", value_column="value") == (
        "`key` string, `value` string"
    )
    ddl = infer_ddl(["k"], [{"a`b": 1}], key_column="id", value_column="value")
    assert ddl == "`id` string, `a``b` bigint"


def test_to_text() -> None:
    assert to_text("x") == "x"
    assert to_text(None) is None
    assert to_text([1, "a"]) == '[1,"a"]'
    assert to_text(("a", 1)) == '["a",1]'
    assert to_text(b"\x01") == "01"
    assert to_text({"a": b"\x02"}) == '{"a":"02"}'


def test_layout_of_key_value_schema() -> None:
    layout = ColumnLayout.for_schema(["key", "value"], key_column="key", value_column=None)
    assert (layout.key_index, layout.value_index, layout.value_explicit) == (0, 1, False)


def test_layout_of_row_schema_and_explicit_value_column() -> None:
    layout = ColumnLayout.for_schema(["Qty", "KEY"], key_column="key", value_column=None)
    assert (layout.key_index, layout.value_index) == (1, None)
    layout = ColumnLayout.for_schema(["k", "whole"], key_column="k", value_column="WHOLE")
    assert (layout.key_index, layout.value_index, layout.value_explicit) == (0, 1, True)
    with pytest.raises(ValueError, match="'value.column' names 'nope'"):
        ColumnLayout.for_schema(["k", "v"], key_column="k", value_column="nope")
