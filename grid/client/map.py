"""A distributed map: a thin proxy that serializes, routes by partition and decodes.

Every method builds its request and hands it to the invoker, which finds the owners and
retries; batch methods send one message per owning member (in chunks of about
``BATCH_BYTES``), never one per key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import msgpack

from grid import protocol as p
from grid.client.invocation import Invoker
from grid.client.local_reads import MISS, UNPUBLISHED, LocalReader
from grid.errors import ValueTooLargeError
from grid.local_reads import RETRY, records
from grid.serialization import (
    decode_concatenated,
    deserialize_value,
    partition_id_of,
    place_keys,
    serialize_key,
    serialize_value,
)

BATCH_BYTES = 4 * 1024 * 1024
PLACE_SLICE = 1024  # pairs of a put_all serialized and placed together
SCAN_PARTITIONS_PER_REQUEST = 8
SCAN_CHUNK_BYTES = 4 * 1024 * 1024  # about the most a scan's reply holds
_MISSING = object()


def _as_key(obj: Any) -> Any:
    """Tuples in keys come back from msgpack as lists; make them tuples again."""
    if type(obj) is list:
        return tuple(_as_key(x) for x in obj)
    return obj


def _split(flat: list) -> tuple[list, list]:
    """Keys and values of a flat k1 v1 k2 v2 ... list of decoded records."""
    keys = flat[0::2]
    if list in set(map(type, keys)):  # tuple keys came back as lists
        keys = [_as_key(k) for k in keys]
    return keys, flat[1::2]


@dataclass(frozen=True, slots=True)
class LocalFragment:
    """A partition's records copied from its owner's shared memory: the fragment's index
    table and its arena (to its last record), laid out as grid/local_reads.py says, for a
    reader that decodes them in bulk; ``entries`` decodes them one by one."""

    index: bytes
    arena: bytes

    def entries(self) -> tuple[list, list]:
        """(keys, values), as ``Map.scan_partitions`` gives them."""
        found = records(self.index, self.arena)
        if found is RETRY:  # the copy was taken within the fragment's seqlock
            raise ValueError("a fragment copy whose records do not fit its arena")
        data, count = found  # type: ignore[misc]
        return _split(decode_concatenated(data, 2 * count) if count else [])


class Map:
    def __init__(self, name: str, invoker: Invoker, max_value_bytes: int,
                 local: LocalReader | None = None) -> None:
        self.name = name
        self._invoker = invoker
        self._max_value_bytes = max_value_bytes
        # Gets from the owners' shared memory (grid/client/local_reads.py), or None.
        self._local = local
        # (table, member list, each partition's (owner uuid, owner name) or None): a local
        # read finds its owner (whose shared memory is named for it) in one list, made again
        # when the table or the member list changes
        self._routes: tuple[Any, Any, list[tuple[str, str] | None]] = (None, None, [])

    @property
    def local_reads(self) -> bool:
        """Whether gets read the owner's shared memory when they can (see ``get``)."""
        return self._local is not None

    def __repr__(self) -> str:
        return f"Map({self.name!r})"

    # -- helpers ---------------------------------------------------------------------------

    @property
    def _partition_count(self) -> int:
        if self._invoker.table is None:
            self._invoker.refresh()
        return self._invoker.table.partition_count

    def _check_size(self, key_bytes: bytes, value_bytes: bytes) -> None:
        size = len(key_bytes) + len(value_bytes)
        if size > self._max_value_bytes:
            raise ValueTooLargeError(size, self._max_value_bytes)

    def _key_op(self, op: str, key: object, value: object = _MISSING,
                key_bytes: bytes | None = None, **extra: Any) -> tuple[dict, list]:
        if key_bytes is None:
            key_bytes = serialize_key(key)
        frames = [key_bytes]
        if value is not _MISSING:
            value_bytes = serialize_value(value)
            self._check_size(key_bytes, value_bytes)
            frames.append(value_bytes)
        pid = partition_id_of(key_bytes, self._partition_count)
        fields = {"ns": self.name, "pid": pid, **extra}
        if op in p.WRITE_KEY_OPS:
            fields["iid"] = self._invoker.invocation_id()
            fields["cid"] = self._invoker.client_id  # its backup may answer (cluster/chain.py)
        return self._invoker.invoke_key(op, pid, fields, frames)

    def _value_of(self, reply: tuple[dict, list]) -> Any:
        frames = reply[1]
        return deserialize_value(frames[0]) if frames else None

    def _all_partitions(self, op: str, extra: dict[str, Any] | None = None) -> list[dict]:
        headers: list[dict] = []
        fields = {"ns": self.name, **(extra or {})}
        if op in p.WRITE_OPS:
            fields["iid"] = self._invoker.invocation_id()
        self._invoker.invoke_partitions(
            op, range(self._partition_count), lambda group: ({**fields, "pids": group}, []),
            lambda group, header, reply: headers.append(header))
        return headers

    # -- one key ---------------------------------------------------------------------------

    def get(self, key: object) -> Any:
        """The value of ``key``, or None.

        With local reads on, read from the owner's shared memory when this client is on its
        host and the owner publishes the map; otherwise (and whenever a local read cannot be
        sure of its answer) ask the owner. See grid/client/local_reads.py for what a local
        read can miss."""
        if self._local is None:
            return self._value_of(self._key_op(p.GET, key))
        key_bytes = serialize_key(key)
        if self._invoker.table is None:
            self._invoker.refresh()
        value, publish = self._local_read(
            partition_id_of(key_bytes, self._invoker.table.partition_count), key_bytes)
        if value.__class__ is bytes:
            return deserialize_value(value)
        if value is None:
            return None
        extra = {"publish": True} if publish else {}
        return self._value_of(self._key_op(p.GET, key, key_bytes=key_bytes, **extra))

    def _local_read(self, pid: int, key_bytes: bytes | None,
                    max_bytes: int | None = None, copy: bool = False) -> tuple[Any, bool]:
        """A local get of ``key_bytes``, or with None a local scan of the partition of at
        most ``max_bytes`` (see LocalReader; with ``copy`` its ``copy_fragment``), and
        whether to ask the owner to publish the map."""
        route = self._owner_routes()[pid]
        if route is None:
            return MISS, False
        owner, name = route
        local = self._local
        if key_bytes is not None:  # a get: the hot path, tested first
            value = local.get(self.name, key_bytes, pid, owner, name)  # type: ignore[union-attr]
        elif copy:
            value = local.copy_fragment(self.name, pid, owner, name, max_bytes)  # type: ignore[union-attr]
        else:
            value = local.scan(self.name, pid, owner, name, max_bytes)  # type: ignore[union-attr]
        return value, value is UNPUBLISHED and local.should_ask_to_publish(  # type: ignore[union-attr]
            name, self.name, time.monotonic())

    def put(self, key: object, value: object) -> Any:
        """Store ``value`` under ``key``; returns the previous value or None."""
        return self._value_of(self._key_op(p.PUT, key, value))

    def set(self, key: object, value: object) -> None:
        """Store ``value`` under ``key`` without returning the old value."""
        self._key_op(p.SET, key, value)

    def remove(self, key: object) -> Any:
        """Remove ``key``; returns the removed value or None."""
        return self._value_of(self._key_op(p.REMOVE, key))

    def delete(self, key: object) -> None:
        self._key_op(p.DELETE, key)

    def put_if_absent(self, key: object, value: object) -> Any:
        """Store only if ``key`` is absent; returns the existing value, or None if stored."""
        return self._value_of(self._key_op(p.PUT_IF_ABSENT, key, value))

    def replace(self, key: object, value: object) -> Any:
        """Store only if ``key`` is present; returns the previous value, or None if absent."""
        return self._value_of(self._key_op(p.REPLACE, key, value))

    def contains_key(self, key: object) -> bool:
        return bool(self._key_op(p.CONTAINS, key)[0].get("found"))

    def __getitem__(self, key: object) -> Any:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: object, value: object) -> None:
        self.set(key, value)

    def __contains__(self, key: object) -> bool:
        return self.contains_key(key)

    def __len__(self) -> int:
        return self.size()

    # -- batches ---------------------------------------------------------------------------

    def put_all(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        """Store many entries: one message per owning member and chunk."""
        self.put_all_into(entries, None)

    def put_all_into(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]],
                     partitions: set[int] | None) -> None:
        """``put_all``, adding to ``partitions`` the id of every partition it writes (a
        Spark overwrite's commit needs them: hashing every key again for them cost its
        writer 1.5 to 2 µs a row)."""
        pairs = iter(entries.items() if isinstance(entries, Mapping) else entries)
        count = self._partition_count
        limit = self._max_value_bytes
        pack = msgpack.Packer(use_bin_type=True).pack  # (a Packer per call: thread-safe)
        chunk: dict[int, list[bytes]] = {}
        chunk_bytes = 0
        # Keys are placed a slice at a time (``place_keys``: one hash for a slice of one hash
        # tag), values packed in one pass; a slice bounds what is held twice.
        while batch := list(islice(pairs, PLACE_SLICE)):
            keys, values = zip(*batch, strict=True)
            keys_bytes, pids = place_keys(keys, count)
            try:
                values_bytes = list(map(pack, values))
            except (TypeError, ValueError, OverflowError):
                values_bytes = [serialize_value(value) for value in values]  # raises
            for key_bytes, value_bytes, pid in zip(keys_bytes, values_bytes, pids,
                                                   strict=True):
                size = len(key_bytes) + len(value_bytes)
                if size > limit:
                    raise ValueTooLargeError(size, limit)
                items = chunk.get(pid)
                if items is None:
                    items = chunk[pid] = []
                items.append(key_bytes)
                items.append(value_bytes)
                chunk_bytes += size
                if chunk_bytes >= BATCH_BYTES:
                    self._send_items(chunk, partitions)
                    chunk, chunk_bytes = {}, 0
        if chunk:
            self._send_items(chunk, partitions)

    def _send_items(self, items_by_pid: dict[int, list[bytes]],
                    partitions: set[int] | None) -> None:
        def frame(group: list[int]) -> bytes:
            items: list[bytes] = []
            for pid in group:
                items.extend(items_by_pid[pid])
            return p.pack_items(items)

        counts = [len(items) // 2 for items in items_by_pid.values()]
        self._send_put_all(items_by_pid, counts, frame, partitions)

    def put_all_packed(self, pieces: Mapping[int, tuple[int, list, list]],
                       partitions: set[int] | None) -> None:
        """``put_all_into`` of entries already serialized and grouped: ``pieces`` maps a
        partition id to (entry count, buffers of its part of a table of sizes, buffers of its
        records), laid out as workers/record_block.py says: the members copy and index them
        without a Python object per entry. The Spark writer builds them from Arrow batches
        (grid/spark/packed_write.py); the caller placed each key and checked each entry's
        size."""

        def frame(group: list[int]) -> bytes:
            return b"".join([*(part for pid in group for part in pieces[pid][1]),
                             *(part for pid in group for part in pieces[pid][2])])

        self._send_put_all(pieces, [pieces[pid][0] for pid in pieces], frame, partitions,
                           records=True)

    def _send_put_all(self, by_pid: Mapping[int, Any], counts: list[int],
                      frame: Callable[[list[int]], bytes], partitions: set[int] | None,
                      records: bool = False) -> None:
        """One PUT_ALL per owner of the partitions in ``by_pid``, ``counts`` entries each
        (in its order), ``frame(group)`` the items of a group of partitions (or its records,
        with ``records``)."""
        if partitions is not None:
            partitions.update(by_pid)
        iid = self._invoker.invocation_id()
        client_id = self._invoker.client_id
        count_of = dict(zip(by_pid, counts, strict=True))
        form = {"laid_out": True} if records else {}

        def build(group: list[int]) -> tuple[dict, list]:
            # cid: the backup may answer in the owner's place (grid/cluster/chain.py)
            return {"ns": self.name, "pids": group, "counts": [count_of[pid] for pid in group],
                    "iid": iid, "cid": client_id, **form}, [frame(group)]

        self._invoker.invoke_partitions(p.PUT_ALL, list(by_pid), build,
                                        lambda group, header, reply: None)

    def get_all(self, keys: Iterable[object]) -> dict[Any, Any]:
        """The present entries among ``keys``: one message per owning member (with local
        reads on, only for the keys that could not be read from shared memory)."""
        keys = keys if isinstance(keys, list | tuple) else list(keys)
        keys_bytes, pids = place_keys(keys, self._partition_count)
        result: dict[Any, Any] = {}
        publish = False  # ask the owners to publish the map (a local read found it not)
        if self._local is not None:
            wanted, publish = self._get_locally(
                list(zip(pids, keys_bytes, keys, strict=True)), result)
            pids, keys_bytes = [item[0] for item in wanted], [item[1] for item in wanted]
        if not pids:
            return result
        extra = {"publish": True} if publish else {}

        def handle(group: list[int], header: dict, frames: list[bytes]) -> None:
            flat = decode_concatenated(frames[0], header.get("n", 0)) if frames else []
            found_keys = flat[0::2]
            if list in set(map(type, found_keys)):  # tuple keys came back as lists
                found_keys = [_as_key(k) for k in found_keys]
            result.update(zip(found_keys, flat[1::2], strict=True))

        self._invoker.invoke_keys(p.GET_ALL, pids, keys_bytes, {"ns": self.name, **extra},
                                  handle)
        return result

    def _get_locally(self, wanted: list[tuple[int, bytes, Any]], result: dict[Any, Any]
                     ) -> tuple[list[tuple[int, bytes, Any]], bool]:
        """Put in ``result`` the (pid, key bytes, key) read from shared memory (one
        LocalReader call for all); return the ones to ask their owners for, and whether to
        ask them to publish the map."""
        routes = self._owner_routes()
        reads, readable, remote = [], [], []
        for item in wanted:
            route = routes[item[0]]
            if route is None:
                remote.append(item)
            else:
                reads.append((item[0], route[0], route[1], item[1]))
                readable.append(item)
        local = self._local
        values = local.get_many(self.name, reads)  # type: ignore[union-attr]
        publish = False
        for item, value in zip(readable, values, strict=True):
            if value.__class__ is bytes:
                result[item[2]] = deserialize_value(value)
            elif value is not None:
                remote.append(item)
                if value is UNPUBLISHED and not publish:
                    publish = local.should_ask_to_publish(  # type: ignore[union-attr]
                        routes[item[0]][1], self.name, time.monotonic())  # type: ignore[index]
        return remote, publish

    def _owner_routes(self) -> list[tuple[str, str] | None]:
        """Each partition's owner (uuid, name) by the client's table and member list, None
        where it has none or the member is not listed."""
        invoker = self._invoker
        table, members, routes = self._routes
        if table is not invoker.table or members is not invoker.members:
            table, members = invoker.table, invoker.members
            names = {m.uuid: m.name for m in members.members}
            routes = []
            for owner in table.owners(range(table.partition_count)):  # type: ignore[union-attr]
                name = names.get(owner) if owner is not None else None
                routes.append(None if name is None else (owner, name))
            self._routes = (table, members, routes)
        return routes

    def scan_partitions(self, partition_ids: Sequence[int], batch_size: int = 10_000,
                        chunk_bytes: int = SCAN_CHUNK_BYTES) -> Iterator[tuple[list, list]]:
        """(keys, values) batches of the given partitions, read from their owners in replies
        of about ``chunk_bytes`` each (one record may be larger).

        A partition that fits (what is left of it) comes in one reply: a consistent snapshot
        of it. A larger one comes in chunks, ranges of key hashes, each a snapshot of its
        range: an entry present for the whole scan is returned exactly once, one written or
        removed meanwhile may or may not be, and none is returned twice. A partition that
        moves mid-scan goes on at its new owner from the range where it stopped.
        """
        keys: list = []
        values: list = []
        for flat in self._scan(partition_ids, chunk_bytes, copies=False):
            batch_keys, batch_values = _split(flat)
            keys.extend(batch_keys)
            values.extend(batch_values)
            if len(keys) >= batch_size:
                yield keys, values
                keys, values = [], []
        if keys:
            yield keys, values

    def scan_fragments(self, partition_ids: Sequence[int],
                       chunk_bytes: int = SCAN_CHUNK_BYTES
                       ) -> Iterator[LocalFragment | tuple[list, list]]:
        """``scan_partitions`` for a reader that decodes records in bulk (the Spark reader):
        a partition read from its owner's shared memory comes as a LocalFragment, a copy of
        its records as the owner lays them out; the others as (keys, values) of a reply.
        Same guarantees as ``scan_partitions``."""
        for part in self._scan(partition_ids, chunk_bytes, copies=True):
            yield part if part.__class__ is LocalFragment else _split(part)

    def _scan(self, partition_ids: Sequence[int], chunk_bytes: int, copies: bool
              ) -> Iterator[Any]:
        """The partitions' records: each reply's keys and values as one flat list (k1 v1 k2
        v2 ...), and each partition read locally either so or, with ``copies``, as a
        LocalFragment."""
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
        pids = list(partition_ids)
        if self._local is not None and self._invoker.table is None:
            self._invoker.refresh()
        for at in range(0, len(pids), SCAN_PARTITIONS_PER_REQUEST):
            decoded: list = []
            remote = pids[at:at + SCAN_PARTITIONS_PER_REQUEST]
            fields: dict[str, Any] = {"ns": self.name, "max_bytes": chunk_bytes}
            if self._local is not None:  # read what can be read from shared memory
                remote, publish = self._scan_locally(remote, decoded, chunk_bytes, copies)
                if publish:
                    fields["publish"] = True
            lows = dict.fromkeys(remote, 0)  # partition -> the key hash its next chunk is from

            def build(group: list[int], fields: dict[str, Any] = fields,
                      lows: dict[int, int] = lows) -> tuple[dict, list]:
                return {**fields, "pids": group, "from": [lows[pid] for pid in group]}, []

            def handle(group: list[int], header: dict, frames: list[bytes],
                       decoded: list = decoded, lows: dict[int, int] = lows) -> None:
                bounds = header.get("next") or [None] * len(frames)
                for pid, frame, n, bound in zip(header.get("pids", group), frames,
                                                header.get("counts", []), bounds, strict=False):
                    if n:
                        decoded.append(decode_concatenated(frame, n))
                    if bound is None:
                        lows.pop(pid, None)
                    else:
                        lows[pid] = bound

            while True:
                yield from decoded
                decoded.clear()
                if not lows:
                    break
                self._invoker.invoke_partitions(p.ENTRIES, list(lows), build, handle)

    def _scan_locally(self, pids: list[int], decoded: list, max_bytes: int, copies: bool
                      ) -> tuple[list[int], bool]:
        """Put into ``decoded`` the partitions read from shared memory (flat lists, or with
        ``copies`` LocalFragments); return the ones to ask their owners for (a partition
        larger than ``max_bytes`` too: its owner sends it in chunks), and whether to ask
        them to publish the map."""
        remote, publish = [], False
        for pid in pids:
            found, ask = self._local_read(pid, None, max_bytes, copies)
            if found.__class__ is tuple:
                if copies:
                    decoded.append(LocalFragment(*found))
                elif found[1]:
                    decoded.append(decode_concatenated(found[0], 2 * found[1]))
            elif found is not None:  # (None: a copy of no fragment, an empty partition)
                remote.append(pid)
                publish = publish or ask
        return remote, publish

    def items(self) -> list[tuple[Any, Any]]:
        out = []
        for keys, values in self.scan_partitions(range(self._partition_count)):
            out.extend(zip(keys, values, strict=True))
        return out

    def keys(self) -> list[Any]:
        return [k for keys, _ in self.scan_partitions(range(self._partition_count)) for k in keys]

    def values(self) -> list[Any]:
        return [v for _, vals in self.scan_partitions(range(self._partition_count)) for v in vals]

    def size(self) -> int:
        return sum(h.get("size", 0) for h in self._all_partitions(p.SIZE))

    def clear(self) -> None:
        """Remove every entry (on owners and their backups)."""
        self._all_partitions(p.CLEAR)

    def move_to(self, target: str) -> None:
        """Per partition, atomically replace ``target``'s entries with this map's (which
        becomes empty), on owners and backups: the publish step of a staged overwrite."""
        if not isinstance(target, str) or not target or target == self.name:
            raise ValueError("move_to needs the name of another map")
        self._all_partitions(p.REPLACE_CONTENTS, {"target": target})
