"""Arrow record batches from grid entries (reads) and grid entries from batches (writes).

Reads yield `pa.RecordBatch`es rather than tuples because that path is 2 to 3 times faster
through PySpark's Python data source (shared/reference/pyspark-datasource.md, section 2).
Only pyarrow is needed here, not pyspark: the Arrow schema is given by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from grid.spark.schema import ColumnLayout, to_text

__all__ = ["build_batch", "batch_to_entries", "resolve_write_columns", "KeyColumnNullError"]


class KeyColumnNullError(ValueError):
    """A row to write has a null key."""


def _to_array(column: list, field: pa.Field) -> pa.Array:
    """One Arrow array of the field's type; text columns accept any value (as JSON)."""
    try:
        return pa.array(column, type=field.type, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            return pa.array([to_text(v) for v in column], type=field.type)
        if pa.types.is_binary(field.type) and all(
            v is None or isinstance(v, (str, bytes)) for v in column
        ):
            encoded = [v.encode() if isinstance(v, str) else v for v in column]
            return pa.array(encoded, type=field.type)
        bad = _first_unconvertible(column, field.type)
        raise ValueError(
            f"shmgrid: column {field.name!r} is declared {field.type} but the grid holds "
            f"{bad!r} ({type(bad).__name__}) there; change the schema's type for this column "
            f"({exc})"
        ) from exc


def _first_unconvertible(column: list, arrow_type: pa.DataType) -> object:
    for value in column:
        try:
            pa.array([value], type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return value
    return None


def build_batch(
    keys: Sequence[object],
    values: Sequence[object],
    layout: ColumnLayout,
    arrow_schema: pa.Schema,
) -> pa.RecordBatch:
    """A record batch with `arrow_schema` (exactly: Spark checks the first batch's schema).

    The key column gets the keys; the value column the whole values (see ColumnLayout);
    other columns the fields of dict values, or nulls.
    """
    assert len(keys) == len(values)
    assert len(layout.names) == len(arrow_schema)
    arrays = []
    has_dicts: bool | None = None
    for index, field in enumerate(arrow_schema):
        if index == layout.key_index:
            column = keys if isinstance(keys, list) else list(keys)
        elif index == layout.value_index:
            if layout.value_explicit:
                column = values if isinstance(values, list) else list(values)
            else:
                if has_dicts is None:
                    has_dicts = any(v.__class__ is dict for v in values)
                column = (
                    [v.get(field.name) if v.__class__ is dict else v for v in values]
                    if has_dicts
                    else (values if isinstance(values, list) else list(values))
                )
        else:
            name = layout.names[index]
            column = [v.get(name) if v.__class__ is dict else None for v in values]
        arrays.append(_to_array(column, field))
    batch = pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
    assert batch.num_rows == len(keys)
    return batch


def _column_index(names: Sequence[str], wanted: str) -> int | None:
    for i, name in enumerate(names):
        if name == wanted:
            return i
    lowered = wanted.lower()
    matches = [i for i, name in enumerate(names) if name.lower() == lowered]
    return matches[0] if len(matches) == 1 else None


def resolve_write_columns(
    names: Sequence[str], key_column: str, value_column: str | None
) -> tuple[int, int | None, tuple[int, ...]]:
    """(key index, whole-value index or None, indexes of the row-dict columns) for a write.

    Raises ValueError naming the option when the key or value column is not in the data.
    A DataFrame whose only other column is `value` stores that column whole, the shape a read
    of a map of scalars produces, so that a read and a write round-trip.
    """
    key_index = _column_index(names, key_column)
    if key_index is None:
        raise ValueError(
            f"shmgrid: the key column {key_column!r} (option 'key.column') is not a column of "
            f"the data to write {list(names)}"
        )
    others = tuple(i for i in range(len(names)) if i != key_index)
    if value_column is not None:
        value_index = _column_index(names, value_column)
        if value_index is None or value_index == key_index:
            raise ValueError(
                f"shmgrid: the value column {value_column!r} (option 'value.column') is not a "
                f"column of the data to write {list(names)}"
            )
        return key_index, value_index, ()
    if len(others) == 1 and names[others[0]].lower() == "value":
        return key_index, others[0], ()
    if not others:
        raise ValueError(
            f"shmgrid: the data to write has only the key column {names[key_index]!r}; "
            "add value columns"
        )
    return key_index, None, others


def _python_keys(column: pa.Array) -> list:
    keys = column.to_pylist()
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        keys = [tuple(k) for k in keys]
    return keys


def batch_to_entries(
    batch: pa.RecordBatch,
    key_index: int,
    value_index: int | None,
    row_indexes: Sequence[int],
) -> tuple[list, list]:
    """(keys, values) of one batch: values are a column's items or row dicts of the others."""
    key_array = batch.column(key_index)
    if key_array.null_count:
        raise KeyColumnNullError(
            f"shmgrid: the key column {batch.schema.names[key_index]!r} has "
            f"{key_array.null_count} null value(s) in a batch of {batch.num_rows} rows; grid keys "
            "cannot be null: filter them out (df.where(col.isNotNull())) or fill them first"
        )
    keys = _python_keys(key_array)
    if value_index is not None:
        values = batch.column(value_index).to_pylist()
    else:
        values = batch.select(list(row_indexes)).to_pylist()
    assert len(keys) == len(values) == batch.num_rows
    return keys, values
