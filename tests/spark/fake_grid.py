"""An in-process stand-in for the grid client, with the client contract's semantics.

It lets the connector's reader, writer and staging protocol run without a cluster: entries
are stored in per-(map, partition) dicts, partition ids come from the real key → partition
function, and values go through msgpack the way the real client does (so tuples come back
as lists and unserialisable values raise the real errors).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from grid.client.map import LocalFragment
from grid.config import GridConfig
from grid.local_reads import INDEX_ENTRY, INDEX_HEADER, RECORD_HEADER
from grid.serialization import (
    deserialize_key,
    deserialize_value,
    partition_id_of,
    serialize_key,
    serialize_value,
)
from workers.record_block import parse_records

MEMBERS = ("member-a", "member-b", "member-c")


def local_fragment(records: Sequence[tuple[bytes, bytes]], dead: int = 1,
                   spare: int = 64) -> LocalFragment:
    """A copy of a fragment as a member lays it out in shared memory (grid/local_reads.py),
    holding ``records`` (serialized key, value): each after ``dead`` records the index no
    longer points at (overwritten), in index slots out of offset order, with ``spare`` bytes
    of unused segment after the last record."""
    arena = bytearray()
    offsets = []
    for key, value in records:
        for _ in range(dead):
            arena += RECORD_HEADER.pack(len(key), 3) + key + b"old"
        offsets.append(len(arena))
        arena += RECORD_HEADER.pack(len(key), len(value)) + key + value
    capacity = 8
    while capacity < 2 * len(records):
        capacity *= 2
    slots = [(0, 0)] * capacity
    for i, offset in enumerate(offsets):
        slot = (i * 5 + 3) % capacity
        while slots[slot][1]:
            slot = (slot + 1) % capacity
        slots[slot] = (i, offset + 1)
    index = INDEX_HEADER.pack(capacity, len(records)) + b"".join(
        INDEX_ENTRY.pack(*entry) for entry in slots)
    return LocalFragment(index, bytes(arena) + bytes(spare))


class FakeGrid:
    """The shared state of a fake cluster: {map name: {partition id: {key bytes: value bytes}}}."""

    def __init__(self, partition_count: int = 271, members: Sequence[str] = MEMBERS) -> None:
        self.partition_count = partition_count
        self.owners = {p: members[p % len(members)] for p in range(partition_count)}
        self.maps: dict[str, dict[int, dict[bytes, bytes]]] = {}
        self.calls: list[tuple[str, str]] = []  # (operation, map name), for assertions
        self.closed = 0

    def client(self) -> FakeClient:
        return FakeClient(self)


class FakeMap:
    def __init__(self, grid: FakeGrid, name: str) -> None:
        self._grid = grid
        self.name = name

    def _fragments(self) -> dict[int, dict[bytes, bytes]]:
        return self._grid.maps.setdefault(self.name, {})

    def _locate(self, key: object) -> tuple[dict[bytes, bytes], bytes]:
        key_bytes = serialize_key(key)
        partition = partition_id_of(key_bytes, self._grid.partition_count)
        return self._fragments().setdefault(partition, {}), key_bytes

    def put(self, key: object, value: object) -> Any:
        self._grid.calls.append(("put", self.name))
        fragment, key_bytes = self._locate(key)
        old = fragment.get(key_bytes)
        fragment[key_bytes] = serialize_value(value)
        return None if old is None else deserialize_value(old)

    def set(self, key: object, value: object) -> None:
        self.put(key, value)

    def get(self, key: object) -> Any:
        self._grid.calls.append(("get", self.name))
        fragment, key_bytes = self._locate(key)
        raw = fragment.get(key_bytes)
        return None if raw is None else deserialize_value(raw)

    def remove(self, key: object) -> Any:
        self._grid.calls.append(("remove", self.name))
        fragment, key_bytes = self._locate(key)
        raw = fragment.pop(key_bytes, None)
        return None if raw is None else deserialize_value(raw)

    def size(self) -> int:
        return sum(len(f) for f in self._fragments().values())

    def clear(self) -> None:
        self._grid.calls.append(("clear", self.name))
        for fragment in self._fragments().values():
            fragment.clear()

    def put_all(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        self.put_all_into(entries, None)

    def put_all_into(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]],
                     partitions: set[int] | None) -> None:
        self._grid.calls.append(("put_all", self.name))
        pairs = list(entries.items() if isinstance(entries, Mapping) else entries)
        encoded = [(self._locate(k), serialize_value(v)) for k, v in pairs]
        if partitions is not None:
            partitions.update(partition_id_of(serialize_key(k), self._grid.partition_count)
                              for k, _ in pairs)
        for (fragment, key_bytes), value_bytes in encoded:
            fragment[key_bytes] = value_bytes

    def put_all_packed(self, pieces: Mapping[int, tuple[int, list, list]],
                       partitions: set[int] | None) -> None:
        """Like the client's, read back as a member reads a records frame; a key placed in
        a partition other than its own fails."""
        self._grid.calls.append(("put_all", self.name))
        for pid, (count, tables, records) in pieces.items():
            items = parse_records(b"".join([*tables, *records]), count).items()
            assert len(items) == 2 * count
            for key_bytes, value_bytes in zip(items[0::2], items[1::2], strict=True):
                assert partition_id_of(key_bytes, self._grid.partition_count) == pid
                self._fragments().setdefault(pid, {})[key_bytes] = value_bytes
        if partitions is not None:
            partitions.update(pieces)

    def get_all(self, keys: Iterable[object]) -> dict:
        self._grid.calls.append(("get_all", self.name))
        found = {}
        for key in keys:
            fragment, key_bytes = self._locate(key)
            if key_bytes in fragment:
                found[deserialize_key(key_bytes)] = deserialize_value(fragment[key_bytes])
        return found

    def scan_partitions(
        self, partition_ids: Iterable[int], batch_size: int = 10_000,
        chunk_bytes: int = 4 * 1024 * 1024
    ) -> Iterator[tuple[list, list]]:
        self._grid.calls.append(("scan_partitions", self.name))
        keys: list = []
        values: list = []
        for partition in list(partition_ids):
            for key_bytes, value_bytes in list(self._fragments().get(partition, {}).items()):
                keys.append(deserialize_key(key_bytes))
                values.append(deserialize_value(value_bytes))
            if len(keys) >= batch_size:
                yield keys, values
                keys, values = [], []
        if keys:
            yield keys, values

    def scan_fragments(self, partition_ids: Iterable[int]) -> Iterator[Any]:
        """Like the client with local reads: the even partitions as copies of their
        fragments (as if read from shared memory), the odd ones as (keys, values)."""
        self._grid.calls.append(("scan_fragments", self.name))
        for partition in list(partition_ids):
            records = list(self._fragments().get(partition, {}).items())
            if partition % 2 == 0:
                yield local_fragment(records)
            elif records:
                yield [deserialize_key(k) for k, _ in records], \
                    [deserialize_value(v) for _, v in records]

    def move_to(self, target: str) -> None:
        """Like the member (REPLACE_CONTENTS, `RecordStore.move_fragment`): in every partition
        the target's fragment is replaced by ours, so the target ends up with exactly our
        entries (empty where we have none) and we end up empty."""
        if not isinstance(target, str) or not target or target == self.name:
            raise ValueError("move_to needs the name of another map")
        self._grid.calls.append(("move_to", self.name))
        mine = self._grid.maps.pop(self.name, {})
        self._grid.maps[target] = {p: fragment for p, fragment in mine.items() if fragment}

    def items(self) -> dict:
        return {
            deserialize_key(k): deserialize_value(v)
            for fragment in self._fragments().values()
            for k, v in fragment.items()
        }


class FakeClient:
    max_value_bytes = GridConfig().max_value_bytes

    def __init__(self, grid: FakeGrid) -> None:
        self._grid = grid

    @property
    def partition_count(self) -> int:
        return self._grid.partition_count

    def partition_id(self, key: object) -> int:
        return partition_id_of(serialize_key(key), self._grid.partition_count)

    def partition_owners(self) -> dict[int, str]:
        return dict(self._grid.owners)

    def get_map(self, name: str, local_reads: bool | None = None) -> FakeMap:
        return FakeMap(self._grid, name)

    def close(self) -> None:
        self._grid.closed += 1

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The grid behind `connect`, set by the `fake_grid` fixture (factory hook of the connector).
current: FakeGrid | None = None


def connect(options: object) -> FakeClient:
    assert current is not None, "the fake_grid fixture is not active"
    return current.client()
