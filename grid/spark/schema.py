"""Schema inference from sampled grid values, and the column layout of a read.

A map holds msgpack values: scalars, or dicts of scalars for rows. Without a user schema the
source samples some entries and picks Spark types here. Everything in this module is plain
Python over plain values (type names are Spark DDL strings), so it is tested without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "ColumnLayout",
    "infer_ddl",
    "infer_type",
    "merge_types",
    "to_text",
    "quote_name",
]

# Spark DDL type names we infer. Anything that is not one of the scalars below (lists, dicts
# nested in values, tuple keys, values of conflicting types) becomes a JSON string, which a
# user schema can re-type (for example `tags array<string>`).
BOOLEAN = "boolean"
BIGINT = "bigint"
DOUBLE = "double"
STRING = "string"
BINARY = "binary"

int64_min = -(2**63)
int64_max = 2**63 - 1


def infer_type(value: object) -> str | None:
    """The Spark type name for one value; None for a null, which says nothing."""
    if value is None:
        return None
    cls = value.__class__
    if cls is bool:
        return BOOLEAN
    if cls is int:
        return BIGINT if int64_min <= value <= int64_max else STRING  # type: ignore[operator]
    if cls is float:
        return DOUBLE
    if cls is str:
        return STRING
    if cls in (bytes, bytearray, memoryview):
        return BINARY
    return STRING  # lists, tuples, dicts, anything else: JSON text


def merge_types(left: str | None, right: str | None) -> str | None:
    """The narrowest type that holds values of both types (bigint and double give double)."""
    if left is None:
        return right
    if right is None or left == right:
        return left
    if {left, right} == {BIGINT, DOUBLE}:
        return DOUBLE
    return STRING


def _merge_all(types: Iterable[str | None]) -> str | None:
    merged: str | None = None
    for t in types:
        merged = merge_types(merged, t)
    return merged


def quote_name(name: str) -> str:
    """Backquote a column name for a DDL string."""
    return "`" + name.replace("`", "``") + "`"


def infer_ddl(
    keys: Sequence[object], values: Sequence[object], *, key_column: str, value_column: str
) -> str:
    """A DDL schema for sampled entries.

    If every non-null sampled value is a dict, the columns are the key plus the union of the
    dict fields in first-seen order (a field named like the key column is dropped: the grid
    key wins). Otherwise the columns are the key and one value column. An empty sample gives
    `key string, value string`.
    """
    assert len(keys) == len(values)
    key_type = _merge_all(infer_type(k) for k in keys) or STRING
    present = [v for v in values if v is not None]
    columns: list[tuple[str, str]] = [(key_column, key_type)]
    if present and all(v.__class__ is dict for v in present):
        field_types: dict[str, str | None] = {}
        for row in present:
            for name, field in row.items():  # type: ignore[attr-defined]
                if not isinstance(name, str) or name.lower() == key_column.lower():
                    continue
                field_types[name] = merge_types(field_types.get(name), infer_type(field))
        columns.extend((name, t or STRING) for name, t in field_types.items())
    else:
        columns.append((value_column, _merge_all(infer_type(v) for v in present) or STRING))
    assert len(columns) >= 1
    return ", ".join(f"{quote_name(name)} {t}" for name, t in columns)


def _json_default(value: object) -> object:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return repr(value)


def to_text(value: object) -> str | None:
    """Text for a value stored in a string column: str as is, others as compact JSON."""
    if value is None or value.__class__ is str:
        return value  # type: ignore[return-value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return json.dumps(value, separators=(",", ":"), default=_json_default)


@dataclass(frozen=True, slots=True)
class ColumnLayout:
    """Where each output column of a read comes from.

    `key_index` is the position of the key column (None if the schema has none).
    `value_index` is the column that receives a whole value: always if the user named it with
    `value.column` (`value_explicit`), otherwise (the column called `value`) only for values
    that are not dicts. Every other column is filled from the dict value's field of the same
    name, or null.
    """

    names: tuple[str, ...]
    key_index: int | None
    value_index: int | None
    value_explicit: bool

    @classmethod
    def for_schema(
        cls, names: Sequence[str], *, key_column: str, value_column: str | None
    ) -> ColumnLayout:
        """Lay out a read schema; column names match options case-insensitively, as Spark does."""
        lowered = [n.lower() for n in names]
        key_index = _find(lowered, key_column.lower())
        if value_column is not None:
            value_index = _find(lowered, value_column.lower())
            if value_index is None:
                raise ValueError(
                    f"shmgrid option 'value.column' names {value_column!r}, which is not a "
                    f"column of the read schema {list(names)}"
                )
        else:
            value_index = _find(lowered, "value")
            if value_index == key_index:
                value_index = None
        assert key_index is None or key_index != value_index
        return cls(
            names=tuple(names),
            key_index=key_index,
            value_index=value_index,
            value_explicit=value_column is not None,
        )


def _find(lowered: Sequence[str], name: str) -> int | None:
    for i, candidate in enumerate(lowered):
        if candidate == name:
            return i
    return None
