"""Arrow record batches from grid entries (reads) and grid entries from batches (writes).

Reads yield `pa.RecordBatch`es rather than tuples because that path is 2 to 3 times faster
through PySpark's Python data source (shared/reference/pyspark-datasource.md, section 2).
Only pyarrow is needed here, not pyspark: the Arrow schema is given by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from grid.client.map import LocalFragment
from grid.local_reads import INDEX_HEADER, RECORD_HEADER
from grid.spark.schema import ColumnLayout, to_text

__all__ = ["build_batch", "batch_to_entries", "bulk_columns", "fragment_columns",
           "batch_of_columns", "resolve_write_columns", "KeyColumnNullError"]

# The length of a msgpack header by the first byte of an item, 0 where the item is not of
# the type: str (fixstr, str8, str16, str32) and bin (bin8, bin16, bin32).
_STR_HEADER = np.zeros(256, np.int64)
_STR_HEADER[0xA0:0xC0] = 1
_STR_HEADER[[0xD9, 0xDA, 0xDB]] = [2, 3, 5]
_BIN_HEADER = np.zeros(256, np.int64)
_BIN_HEADER[[0xC4, 0xC5, 0xC6]] = [2, 3, 5]
_HEADER_OF_TYPE = {pa.string(): _STR_HEADER, pa.binary(): _BIN_HEADER}


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


def bulk_columns(layout: ColumnLayout, arrow_schema: pa.Schema) -> tuple[int, int] | None:
    """(key index, value index) when local fragments can be decoded in bulk for this schema:
    a key column and a whole-value column, each string or binary, and nothing else."""
    if len(arrow_schema) != 2 or layout.key_index is None or layout.value_index is None:
        return None
    if any(field.type not in _HEADER_OF_TYPE for field in arrow_schema):
        return None
    return layout.key_index, layout.value_index


def fragment_columns(fragment: LocalFragment, arrow_schema: pa.Schema,
                     columns: tuple[int, int]) -> tuple[pa.Array, pa.Array] | None:
    """The keys and values of a local fragment as Arrow arrays of the schema's types, cut out
    of its arena by numpy and Arrow with no Python per record; None when a key or a value
    is not of its column's msgpack type (str for string, bin for binary), so the caller
    decodes the records one by one (``fragment.entries()``) as any other scan's.

    A record is ``[u32 key_len][u32 value_len][key][value]`` (grid/local_reads.py), key and
    value in msgpack: the payloads are the bytes after each item's msgpack header.
    """
    arena = np.frombuffer(fragment.arena, dtype=np.uint8)
    if len(arena) >= 2**31:  # int32 Arrow offsets
        return None
    slots = np.frombuffer(fragment.index, dtype="<u8", offset=INDEX_HEADER.size)[1::2]
    offsets = np.sort(slots[slots != 0].astype(np.int64)) - 1
    if len(offsets) == 0:
        return pa.array([], arrow_schema.field(columns[0]).type), \
            pa.array([], arrow_schema.field(columns[1]).type)
    header = RECORD_HEADER.size
    sizes = arena[offsets[:, None] + np.arange(header)].view("<u4").astype(np.int64)
    key_starts = offsets + header
    value_starts = key_starts + sizes[:, 0]
    value_ends = value_starts + sizes[:, 1]
    if value_ends[-1] > len(arena):
        raise ValueError("a fragment copy whose records do not fit its arena")
    key_type, value_type = (arrow_schema.field(i).type for i in columns)
    key_headers = _HEADER_OF_TYPE[key_type][arena[key_starts]]
    value_headers = _HEADER_OF_TYPE[value_type][arena[value_starts]]
    if not (key_headers.all() and value_headers.all()):
        return None
    if (key_headers > sizes[:, 0]).any() or (value_headers > sizes[:, 1]).any():
        raise ValueError("a fragment copy whose records do not fit its arena")
    keys = _payloads(fragment.arena, key_starts + key_headers, value_starts, key_type)
    values = _payloads(fragment.arena, value_starts + value_headers, value_ends, value_type)
    return None if keys is None or values is None else (keys, values)


def _payloads(data: bytes, starts: np.ndarray, ends: np.ndarray, arrow_type: pa.DataType
              ) -> pa.Array | None:
    """The byte ranges [start, end) of ``data`` as one contiguous Arrow array: an array whose
    items are the ranges and the gaps between them (offsets start0 end0 start1 end1 ...,
    increasing as records do), of which Arrow takes every other item. None when a string
    column's bytes are not UTF-8."""
    bounds = np.empty(2 * len(starts), dtype=np.int32)
    bounds[0::2] = starts
    bounds[1::2] = ends
    spans = pa.Array.from_buffers(pa.binary(), len(bounds) - 1,
                                  [None, pa.py_buffer(bounds), pa.py_buffer(data)])
    items = spans.take(pa.array(np.arange(0, len(bounds), 2, dtype=np.int32)))
    if arrow_type == pa.binary():
        return items
    try:
        return items.cast(arrow_type)
    except pa.ArrowInvalid:
        return None


def batch_of_columns(parts: list[tuple[pa.Array, pa.Array]], columns: tuple[int, int],
                     arrow_schema: pa.Schema) -> pa.RecordBatch:
    """One record batch of the (keys, values) arrays of several fragments."""
    arrays: list[pa.Array] = [pa.array([])] * 2
    for which, index in enumerate(columns):
        arrays[index] = pa.concat_arrays([part[which] for part in parts])
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
