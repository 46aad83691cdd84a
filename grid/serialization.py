"""Canonical key bytes, value bytes and the key → partition function.

The same key gives the same bytes in every process (msgpack with bin types, no maps in keys),
so every process computes the same partition: MurmurHash3 x86 32-bit of those bytes, made
non-negative as the reference client does, modulo the partition count.

Hash tags (Redis Cluster's rule): a str or bytes key with a ``{`` followed later by a ``}``,
with at least one character between them, is placed by that tag alone, the text between the
first ``{`` and the first ``}`` after it. The tag is hashed as a key of the key's own type,
so ``"{user42}:cart"`` and ``"{user42}:orders"`` share ``"user42"``'s partition: a batch of
such keys is one partition, one owner and one backup operation, and keys read together can
be written together.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import repeat

import mmh3
import msgpack

from grid.errors import KeyNotSerializableError, ValueNotSerializableError

_KEY_SCALARS = (str, bytes, int, float, bool)
_STR_ONLY = {str}
INT32_MIN = -(2**31)
_hash32 = mmh3.hash  # MurmurHash3 x86 32, seed 0, signed (its defaults)
# A str key's hash tag: the leftmost match is at the first "{" (if no "}" follows that one,
# none follows a later one either), and it ends at the first "}" after it.
_TAG_SEARCH = re.compile(r"\{([^}]*)\}").search


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


# The msgpack type byte of a str (fixstr, str 8/16/32) or bin (8/16/32) key -> the length of
# its header; the header of a short str of each length (most tags are short).
_HEADER_BYTES = {**dict.fromkeys(range(0xA0, 0xC0), 1), 0xD9: 2, 0xDA: 3, 0xDB: 5,
                 0xC4: 2, 0xC5: 3, 0xC6: 5}
_FIXSTR = [bytes((0xA0 | n,)) for n in range(32)]


def _header(n: int, text: bool) -> bytes:
    """The header msgpack gives a str of n >= 32 bytes (shorter ones: ``_FIXSTR``), or a
    bin of n bytes."""
    if text:
        if n < 256:
            return bytes((0xD9, n))
        return b"\xda" + n.to_bytes(2, "big") if n < 65536 else b"\xdb" + n.to_bytes(4, "big")
    if n < 256:
        return bytes((0xC4, n))
    return b"\xc5" + n.to_bytes(2, "big") if n < 65536 else b"\xc6" + n.to_bytes(4, "big")


def placement_bytes(key_bytes: bytes) -> bytes:
    """The bytes that place a serialized key: its hash tag as a key of its type (see the
    module's docstring), or the key itself. Callers test ``b"{" in key_bytes`` first, the
    common case being no brace at all."""
    first = key_bytes[0] if key_bytes else 0
    header = _HEADER_BYTES.get(first)
    if header is None:  # an int, a float, a tuple...: no tag (123 packs as b"{")
        return key_bytes
    start = key_bytes.find(b"{", header)
    end = key_bytes.find(b"}", start + 1) if start >= 0 else -1
    if end <= start + 1:  # no "{", no "}", or "{}": the whole key places it, as in Redis
        return key_bytes
    n = end - start - 1
    text = not 0xC4 <= first <= 0xC6
    return (_FIXSTR[n] if n < 32 and text else _header(n, text)) + key_bytes[start + 1 : end]


def partition_id_of(key_bytes: bytes, partition_count: int) -> int:
    """Partition of serialized key bytes (abs of the signed 32-bit hash, INT_MIN → 0), placed
    by its hash tag if it has one."""
    if b"{" in key_bytes:
        key_bytes = placement_bytes(key_bytes)
    h = _hash32(key_bytes)
    h = 0 if h == INT32_MIN else abs(h)
    return h % partition_count


def partition_ids_of(keys_bytes: Sequence[bytes], partition_count: int) -> list[int]:
    """``partition_id_of`` of each serialized key, hashed in one C-level pass over the bytes
    that place each key (its hash tag where it has one: only keys with a ``{`` are looked
    at one by one)."""
    if b"{" in b"".join(keys_bytes):
        keys_bytes = [placement_bytes(kb) if b"{" in kb else kb for kb in keys_bytes]
    return _non_negative_modulo(list(map(_hash32, keys_bytes)), partition_count)


def place_keys(keys: Sequence[object], partition_count: int) -> tuple[list[bytes], list[int]]:
    """``serialize_key`` and ``partition_id_of`` of each key of a batch. In a batch of str
    keys the hash tags are found in the str by a regular expression, not by a Python call
    per key, and a batch whose keys all begin with the same tag (``{user42}:cart``...: the
    reason to tag keys that are read and written together) is placed by one hash
    (``tools/bench_placement.py`` compares it with ``partition_ids_of``)."""
    if not set(map(type, keys)) <= _STR_ONLY:
        keys_bytes = [serialize_key(key) for key in keys]
        return keys_bytes, partition_ids_of(keys_bytes, partition_count)
    pack = msgpack.Packer().pack  # (a Packer per call: thread-safe)
    keys_bytes = placing = list(map(pack, keys))
    if "{" in "".join(keys):
        first = _TAG_SEARCH(keys[0])
        if first is not None and first.start() == 0 and first.end() > 2 \
                and all(map(str.startswith, keys, repeat(first[0]))):
            return keys_bytes, [partition_id_of(pack(first[1]), partition_count)] * len(keys)
        placing = list(map(pack, [key if tag is None else (tag[1] or key) for key, tag
                                  in zip(keys, map(_TAG_SEARCH, keys), strict=True)]))
    return keys_bytes, _non_negative_modulo(list(map(_hash32, placing)), partition_count)


def _non_negative_modulo(hashes: list[int], partition_count: int) -> list[int]:
    """The partitions of signed 32-bit hashes (abs, INT32_MIN -> 0, as ``partition_id_of``).
    (A ``map`` of ``int.__rmod__`` costs more than the comprehension.)"""
    if INT32_MIN in hashes:
        hashes = [0 if h == INT32_MIN else h for h in hashes]
    return [abs(h) % partition_count for h in hashes]


def decode_concatenated(payload: bytes, count: int) -> list:
    """Decode `count` msgpack objects laid end to end (a member's concatenated records).

    One C call: prefix an array header so msgpack parses the whole run at once.
    """
    return msgpack.unpackb(array_header(count) + payload, raw=False, strict_map_key=False,
                           use_list=True)


def array_header(count: int) -> bytes:
    """The msgpack header of an array of ``count`` items (which follow it, laid end to end)."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 65536:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")
