"""The partition table: 7 replica slots and a version per partition, plus the table stamp.

Seed 001 replaces the global partition table version with one version per partition: the
master raises a partition's version by one for every replica slot it changes, members apply a
published table partition by partition (newer version wins), and a 64-bit MurmurHash3 over all
versions (the *stamp*) answers "is this the same table?" in one comparison.

Two serialised forms live here:

- ``to_wire`` / ``from_wire``: plain lists, ints, strs and None, for msgpack messages.
- ``encode`` / ``decode``: the persisted layout of seed 001 section 3.2 (table length, the
  replicas as address + uuid, then per partition its version and replica indexes), framed by a
  magic, a format number and a CRC32 so that a truncated or corrupt file is detected.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import mmh3

MAX_REPLICA_COUNT = 7
"""Replica slots per partition: index 0 is the owner, 1..6 are backups (seed 002)."""

MAX_BACKUP_COUNT = MAX_REPLICA_COUNT - 1
DEFAULT_PARTITION_COUNT = 271
PARTITION_COUNT_MAX = 1 << 20
"""A sanity bound for decoding: the seeds benchmark 20,000 partitions; 2**20 is far above."""

VERSION_MAX = 2**31 - 1
"""Versions are written as big-endian int32 in the stamp and on disk."""

STAMP_SEED = 0x01000193
"""Murmur seed of the reference implementation (reference/planner.md, section 8)."""

ENCODING_MAGIC = b"SGPT"
ENCODING_FORMAT = 1
MEMBER_FIELD_BYTES_MAX = 0xFFFF

assert MAX_REPLICA_COUNT == MAX_BACKUP_COUNT + 1 == 7
assert 0 < DEFAULT_PARTITION_COUNT <= PARTITION_COUNT_MAX
assert len(ENCODING_MAGIC) == 4

_EMPTY_ROW: tuple[str | None, ...] = (None,) * MAX_REPLICA_COUNT
_INT32 = struct.Struct(">i")
_HEADER = struct.Struct(">4sHi")  # magic, format, partition count (the seed's "table length")
_ROW = struct.Struct(">i7i")  # version, then 7 replica indexes into the replica list (-1: none)
_U16 = struct.Struct(">H")
_CRC = struct.Struct(">I")
_WIRE_KEYS = frozenset({"partition_count", "members", "versions", "replicas"})


class PartitionTableError(ValueError):
    """A partition table operation got invalid input, or a serialised table is malformed."""


def _check_member(member: object) -> None:
    if member is not None and (not isinstance(member, str) or not member):
        raise PartitionTableError(
            f"a replica must be a member id (non-empty str) or None, got {member!r}"
        )


def _normalise_row(replicas: Sequence[str | None]) -> tuple[str | None, ...]:
    """Pad to 7 slots and check types and that no member appears twice."""
    if isinstance(replicas, (str, bytes)):
        raise PartitionTableError("replicas must be a sequence of member ids, not a string")
    row = tuple(replicas)
    if len(row) > MAX_REPLICA_COUNT:
        raise PartitionTableError(
            f"a partition has at most {MAX_REPLICA_COUNT} replicas, got {len(row)}"
        )
    for member in row:
        _check_member(member)
    present = [m for m in row if m is not None]
    if len(present) != len(set(present)):
        raise PartitionTableError(f"a member appears twice in one partition: {row!r}")
    return row + (None,) * (MAX_REPLICA_COUNT - len(row))


def _changed_slot_count(old: tuple[str | None, ...], new: tuple[str | None, ...]) -> int:
    return sum(1 for a, b in zip(old, new, strict=True) if a != b)


class PartitionTable:
    """Replica slots and per-partition versions of ``partition_count`` partitions.

    Mutations go through ``set_replicas`` / ``set_replica`` (the master) or ``apply`` (a member
    applying a published table); each raises the partition version by the number of slots that
    changed, as the reference's ``setReplicas`` does, and keeps the stamp current.
    """

    __slots__ = ("_partition_count", "_rows", "_versions", "_version_bytes", "_stamp",
                 "_owned")

    def __init__(self, partition_count: int = DEFAULT_PARTITION_COUNT) -> None:
        if (
            not isinstance(partition_count, int)
            or isinstance(partition_count, bool)
            or not 0 < partition_count <= PARTITION_COUNT_MAX
        ):
            raise PartitionTableError(
                f"partition_count must be an int in 1..{PARTITION_COUNT_MAX}, "
                f"got {partition_count!r}"
            )
        self._partition_count = partition_count
        self._rows: list[tuple[str | None, ...]] = [_EMPTY_ROW] * partition_count
        self._versions: list[int] = [0] * partition_count
        self._version_bytes = bytearray(4 * partition_count)
        self._stamp: int | None = None
        self._owned: tuple[str, frozenset[int]] | None = None  # (member, its partitions)

    # -- reading -------------------------------------------------------------------------

    @property
    def partition_count(self) -> int:
        """Number of partitions; fixed for the life of the table."""
        return self._partition_count

    def _check_pid(self, pid: int) -> None:
        # The class test (not isinstance) rejects bool too. The lookups that every request
        # makes, several times a partition, make this test inline and call here to raise.
        if pid.__class__ is not int or not 0 <= pid < self._partition_count:
            raise PartitionTableError(
                f"partition id must be in 0..{len(self._rows) - 1}, got {pid!r}"
            )

    def replicas(self, pid: int) -> tuple[str | None, ...]:
        """The 7 replica slots of a partition (member id or None), owner first."""
        if pid.__class__ is not int or not 0 <= pid < self._partition_count:
            self._check_pid(pid)  # raises
        return self._rows[pid]

    def owner(self, pid: int) -> str | None:
        """The owner (replica index 0) of a partition, or None if it has none."""
        if pid.__class__ is not int or not 0 <= pid < self._partition_count:
            self._check_pid(pid)  # raises
        return self._rows[pid][0]

    def owners(self, pids: Iterable[int]) -> list[str | None]:
        """The owner of each partition of ``pids``, in order: one call for many (a client's
        scan asks it of every partition)."""
        rows, count = self._rows, self._partition_count
        owners = []
        for pid in pids:
            if pid.__class__ is not int or not 0 <= pid < count:
                self._check_pid(pid)  # raises
            owners.append(rows[pid][0])
        return owners

    def owned_by(self, member: str) -> frozenset[int]:
        """The partitions ``member`` owns. Kept until a row changes: a member's batch paths
        ask it of every batch, to see in one set operation that it owns all of a batch's
        partitions (the common case) instead of reading each one's row."""
        owned = self._owned
        if owned is None or owned[0] != member:
            owned = self._owned = (member, frozenset(
                pid for pid, row in enumerate(self._rows) if row[0] == member))
        return owned[1]

    def live_rows(self) -> tuple[Sequence[tuple[str | None, ...]], Sequence[int]]:
        """The table's own lists of rows and partition versions, not copies: they change as
        the table does. For a member's batch paths, which read them by partition id (checked
        already) for each of a batch's 80 partitions without a call each. Read only."""
        return self._rows, self._versions

    def version(self, pid: int) -> int:
        """The partition version: raised by one for every replica slot change."""
        if pid.__class__ is not int or not 0 <= pid < self._partition_count:
            self._check_pid(pid)  # raises
        return self._versions[pid]

    def versions(self) -> tuple[int, ...]:
        """All partition versions, in partition id order."""
        return tuple(self._versions)

    def version_sum(self) -> int:
        """Sum of all versions; seed 001 section 3.2 orders restarted tables by it."""
        return sum(self._versions)

    def replica_index(self, pid: int, member: str | None) -> int:
        """The replica index ``member`` holds in partition ``pid``, or -1 if none."""
        if pid.__class__ is not int or not 0 <= pid < self._partition_count:
            self._check_pid(pid)  # raises
        if member is None:
            return -1
        row = self._rows[pid]
        return row.index(member) if member in row else -1

    def members(self) -> set[str]:
        """Every member id that holds at least one replica."""
        found: set[str] = set()
        for row in self._rows:
            found.update(row)
        found.discard(None)  # type: ignore[arg-type]
        return found

    def replica_counts(self, member: str) -> list[int]:
        """How many partitions ``member`` holds at each replica index 0..6."""
        counts = [0] * MAX_REPLICA_COUNT
        for row in self._rows:
            if member in row:
                counts[row.index(member)] += 1
        return counts

    def is_assigned(self) -> bool:
        """True when every partition has an owner."""
        return all(row[0] is not None for row in self._rows)

    def stamp(self) -> int:
        """64-bit MurmurHash3 of the versions as big-endian int32s (seed 001 section 1.3).

        The first half of MurmurHash3_x64_128 with the reference's murmur seed, as a signed
        64-bit int (the range of a Java long, which also fits msgpack's int64). Cached; every
        change of a version invalidates the cache.
        """
        if self._stamp is None:
            self._stamp = mmh3.hash64(bytes(self._version_bytes), STAMP_SEED, True, True)[0]
        return self._stamp

    # -- changing ------------------------------------------------------------------------

    def _store(self, pid: int, row: tuple[str | None, ...], version: int) -> None:
        if version > VERSION_MAX:
            raise PartitionTableError(
                f"partition {pid} version would pass the int32 limit ({version})"
            )
        if row[0] != self._rows[pid][0]:
            self._owned = None
        self._rows[pid] = row
        if version != self._versions[pid]:
            self._versions[pid] = version
            _INT32.pack_into(self._version_bytes, 4 * pid, version)
            self._stamp = None

    def set_replicas(self, pid: int, replicas: Sequence[str | None]) -> int:
        """Replace a partition's replicas (padded with None to 7 slots).

        The version rises by the number of slots that changed; returns that number.
        """
        self._check_pid(pid)
        row = _normalise_row(replicas)
        changed = _changed_slot_count(self._rows[pid], row)
        if changed:
            self._store(pid, row, self._versions[pid] + changed)
        return changed

    def take_row(self, pid: int, version: int, replicas: Sequence[str | None]) -> bool:
        """Take one partition's row at ``version`` if that is newer than ours (a member's
        hint that the partition moved); return whether it was."""
        self._check_pid(pid)
        if not _is_int(version) or version <= self._versions[pid]:
            return False
        self._store(pid, _normalise_row(replicas), version)
        return True

    def set_replica(self, pid: int, index: int, member: str | None) -> int:
        """Set one replica slot; the version rises by one if the slot changed."""
        self._check_pid(pid)
        if not isinstance(index, int) or isinstance(index, bool):
            raise PartitionTableError(f"replica index must be an int, got {index!r}")
        if not 0 <= index < MAX_REPLICA_COUNT:
            raise PartitionTableError(
                f"replica index must be in 0..{MAX_REPLICA_COUNT - 1}, got {index}"
            )
        row = list(self._rows[pid])
        row[index] = member
        return self.set_replicas(pid, row)

    def raise_version(self, pid: int, increment: int) -> int:
        """Raise a partition's version without changing its replicas (a failed migration:
        seed 002 section 2.1 makes every member that may have taken the step take the
        master's row again); returns the new version."""
        self._check_pid(pid)
        if not isinstance(increment, int) or isinstance(increment, bool) or increment < 1:
            raise PartitionTableError(f"a version rises by an int >= 1, not {increment!r}")
        self._store(pid, self._rows[pid], self._versions[pid] + increment)
        return self._versions[pid]

    def apply(self, other: PartitionTable) -> list[int]:
        """Take every partition whose version in ``other`` is higher; return their ids.

        This is how a member applies a table published by the master: per partition, the
        newer version wins and older ones are ignored (seed 001 section 1.2).
        """
        if not isinstance(other, PartitionTable):
            raise PartitionTableError(f"can only apply a PartitionTable, got {type(other)}")
        if other._partition_count != self._partition_count:
            raise PartitionTableError(
                f"partition counts differ: {self._partition_count} here, "
                f"{other._partition_count} in the applied table"
            )
        changed = [
            pid
            for pid, (mine, theirs) in enumerate(zip(self._versions, other._versions, strict=True))
            if theirs > mine
        ]
        for pid in changed:
            self._store(pid, other._rows[pid], other._versions[pid])
        return changed

    def copy(self) -> PartitionTable:
        """An independent copy with the same replicas, versions and stamp."""
        twin = PartitionTable.__new__(PartitionTable)
        twin._partition_count = self._partition_count
        twin._rows = list(self._rows)
        twin._versions = list(self._versions)
        twin._version_bytes = bytearray(self._version_bytes)
        twin._stamp = self._stamp
        twin._owned = self._owned
        return twin

    # -- comparison ----------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionTable):
            return NotImplemented
        return self._rows == other._rows and self._versions == other._versions

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        owned = sum(1 for row in self._rows if row[0] is not None)
        return (
            f"PartitionTable(partition_count={self._partition_count}, owned={owned}, "
            f"members={len(self.members())}, stamp={self.stamp():#x})"
        )

    # -- wire form (msgpack-able) ------------------------------------------------------------

    def _member_order(self) -> list[str]:
        """Members in order of first appearance: deterministic for a given table."""
        seen: dict[str, None] = {}
        for row in self._rows:
            for member in row:
                if member is not None and member not in seen:
                    seen[member] = None
        return list(seen)

    def to_wire(self) -> dict[str, Any]:
        """Plain ints, strs and lists: ``replicas`` is 7 member-list indexes per partition."""
        members = self._member_order()
        position = {member: k for k, member in enumerate(members)}
        flat = [-1 if m is None else position[m] for row in self._rows for m in row]
        return {
            "partition_count": self._partition_count,
            "members": members,
            "versions": list(self._versions),
            "replicas": flat,
        }

    @classmethod
    def from_wire(cls, obj: object) -> PartitionTable:
        """Rebuild a table from ``to_wire`` output; anything malformed is a PartitionTableError."""
        if not isinstance(obj, Mapping) or set(obj.keys()) != _WIRE_KEYS:
            raise PartitionTableError(
                f"a wire partition table is a mapping with keys {sorted(_WIRE_KEYS)}"
            )
        count = obj["partition_count"]
        members = obj["members"]
        versions = obj["versions"]
        flat = obj["replicas"]
        if not _is_int(count) or not 0 < count <= PARTITION_COUNT_MAX:
            raise PartitionTableError(f"wire partition count {count!r} is out of range")
        if not isinstance(members, list) or not isinstance(versions, list):
            raise PartitionTableError("wire members and versions must be lists")
        if not isinstance(flat, list) or len(flat) != MAX_REPLICA_COUNT * count:
            raise PartitionTableError(
                f"wire replicas must be a list of {MAX_REPLICA_COUNT} x {count} indexes"
            )
        if len(versions) != count:
            raise PartitionTableError(f"expected {count} versions, got {len(versions)}")
        for member in members:
            if member is None:
                raise PartitionTableError("wire member list holds None")
            _check_member(member)
        if len(set(members)) != len(members):
            raise PartitionTableError("wire member list holds a member twice")
        rows = [_rows_from_indexes(flat[7 * p : 7 * p + 7], members) for p in range(count)]
        table = cls(count)
        table._load(rows, versions)
        return table

    def _load(self, rows: list[tuple[str | None, ...]], versions: Iterable[object]) -> None:
        """Install decoded rows and versions (both already length-checked)."""
        for pid, (row, version) in enumerate(zip(rows, versions, strict=True)):
            if not _is_int(version) or not 0 <= version <= VERSION_MAX:
                raise PartitionTableError(
                    f"partition {pid}: version must be an int in 0..{VERSION_MAX}, got {version!r}"
                )
            self._store(pid, _normalise_row(row), version)

    # -- persisted form (seed 001 section 3.2) -----------------------------------------------

    def encode(self, addresses: Mapping[str, str]) -> bytes:
        """The persisted layout: length, replicas (address + uuid), then version + indexes.

        ``addresses`` maps every member id in the table to its address. Framed as
        ``magic(4) format(u16) | seed-001 body | crc32(u32)``; all ints big-endian.
        """
        members = self._member_order()
        position = {member: k for k, member in enumerate(members)}
        parts = [_HEADER.pack(ENCODING_MAGIC, ENCODING_FORMAT, self._partition_count)]
        parts.append(_INT32.pack(len(members)))
        for member in members:
            address = addresses.get(member)
            if not isinstance(address, str):
                raise PartitionTableError(f"no address (str) given for member {member!r}")
            parts.append(_pack_text(address, "address"))
            parts.append(_pack_text(member, "uuid"))
        for row, version in zip(self._rows, self._versions, strict=True):
            indexes = [-1 if m is None else position[m] for m in row]
            parts.append(_ROW.pack(version, *indexes))
        body = b"".join(parts)
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> tuple[PartitionTable, dict[str, str]]:
        """Read ``encode`` output; returns the table and the member id -> address map."""
        if not isinstance(buf, (bytes, bytearray, memoryview)):
            raise PartitionTableError(f"can only decode bytes, got {type(buf).__name__}")
        data = bytes(buf)
        reader = _Reader(data)
        magic, fmt, count = reader.unpack(_HEADER, "header")
        if magic != ENCODING_MAGIC:
            raise PartitionTableError(f"not a persisted partition table (magic {magic!r})")
        if fmt != ENCODING_FORMAT:
            raise PartitionTableError(f"unknown partition table format {fmt}")
        if len(data) < _HEADER.size + _CRC.size:
            raise PartitionTableError("persisted partition table is truncated (no checksum)")
        (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
        if zlib.crc32(data[: -_CRC.size]) != crc:
            raise PartitionTableError(
                "persisted partition table is corrupt or truncated (checksum mismatch)"
            )
        reader.end = len(data) - _CRC.size
        if not 0 < count <= PARTITION_COUNT_MAX:
            raise PartitionTableError(f"persisted partition count {count} is out of range")
        (member_count,) = reader.unpack(_INT32, "replica count")
        if not 0 <= member_count <= count * MAX_REPLICA_COUNT:
            raise PartitionTableError(f"persisted replica count {member_count} is out of range")
        addresses: dict[str, str] = {}
        members: list[str] = []
        for _ in range(member_count):
            address = reader.text("address")
            member = reader.text("uuid")
            if not member or member in addresses:
                raise PartitionTableError(f"persisted replica uuid {member!r} is empty or repeated")
            addresses[member] = address
            members.append(member)
        rows: list[tuple[str | None, ...]] = []
        versions: list[int] = []
        for _ in range(count):
            version, *indexes = reader.unpack(_ROW, "partition row")
            versions.append(version)
            rows.append(_rows_from_indexes(indexes, members))
        if reader.offset != reader.end:
            raise PartitionTableError(
                f"persisted partition table has {reader.end - reader.offset} unexpected bytes"
            )
        table = cls(count)
        table._load(rows, versions)
        return table, addresses


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rows_from_indexes(indexes: Sequence[object], members: Sequence[str]) -> tuple[str | None, ...]:
    row: list[str | None] = []
    for index in indexes:
        if not _is_int(index) or not -1 <= index < len(members):  # type: ignore[operator]
            raise PartitionTableError(f"replica index {index!r} does not name a known member")
        row.append(None if index == -1 else members[index])  # type: ignore[index]
    return _normalise_row(row)


def _pack_text(text: str, what: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > MEMBER_FIELD_BYTES_MAX:
        raise PartitionTableError(f"{what} is longer than {MEMBER_FIELD_BYTES_MAX} bytes")
    return _U16.pack(len(raw)) + raw


class _Reader:
    """Bounds-checked reads from a persisted table; every shortfall says what was cut."""

    __slots__ = ("data", "offset", "end")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0
        self.end = len(data)

    def unpack(self, layout: struct.Struct, what: str) -> tuple[Any, ...]:
        if self.offset + layout.size > self.end:
            raise PartitionTableError(
                f"persisted partition table is truncated: {what} at byte {self.offset} needs "
                f"{layout.size} bytes, {max(0, self.end - self.offset)} left"
            )
        values = layout.unpack_from(self.data, self.offset)
        self.offset += layout.size
        return values

    def text(self, what: str) -> str:
        (length,) = self.unpack(_U16, f"{what} length")
        if self.offset + length > self.end:
            raise PartitionTableError(
                f"persisted partition table is truncated inside a {what} at byte {self.offset}"
            )
        raw = self.data[self.offset : self.offset + length]
        self.offset += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PartitionTableError(f"persisted {what} is not valid UTF-8") from exc
