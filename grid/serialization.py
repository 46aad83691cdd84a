"""Canonical key bytes, value bytes and the key → partition function.

The same key gives the same bytes in every process (msgpack with bin types, no maps in keys),
so every process computes the same partition: MurmurHash3 x86 32-bit of those bytes, made
non-negative as the reference client does, modulo the partition count.
"""

from __future__ import annotations

import mmh3
import msgpack

from grid.errors import KeyNotSerializableError, ValueNotSerializableError

_KEY_SCALARS = (str, bytes, int, float, bool)
INT32_MIN = -(2**31)


def _check_key(key: object) -> None:
    if isinstance(key, _KEY_SCALARS):
        if isinstance(key, int) and not -(2**63) <= key < 2**64:
            raise KeyNotSerializableError(key)
        return
    if isinstance(key, tuple):
        for part in key:
            _check_key(part)
        return
    raise KeyNotSerializableError(key)


def serialize_key(key: object) -> bytes:
    """The canonical bytes of a key; raises KeyNotSerializableError for other types."""
    if type(key) is str:  # the common case, without the recursive check
        return msgpack.packb(key)
    _check_key(key)
    return msgpack.packb(key, use_bin_type=True)


def deserialize_key(data: bytes) -> object:
    return msgpack.unpackb(data, use_list=False, raw=False)


def serialize_value(value: object) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueNotSerializableError(value, exc) from exc


def deserialize_value(data: bytes) -> object:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def partition_id_of(key_bytes: bytes, partition_count: int) -> int:
    """Partition of serialized key bytes (abs of the signed 32-bit hash, INT_MIN → 0)."""
    h = mmh3.hash(key_bytes, 0, True)
    h = 0 if h == INT32_MIN else abs(h)
    return h % partition_count


def decode_concatenated(payload: bytes, count: int) -> list:
    """Decode `count` msgpack objects laid end to end (a member's concatenated records).

    One C call: prefix an array header so msgpack parses the whole run at once.
    """
    if count < 16:
        header = bytes([0x90 | count])
    elif count < 65536:
        header = b"\xdc" + count.to_bytes(2, "big")
    else:
        header = b"\xdd" + count.to_bytes(4, "big")
    return msgpack.unpackb(header + payload, raw=False, strict_map_key=False, use_list=True)
