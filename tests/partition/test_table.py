"""The partition table: versions, stamp, applying published tables, wire and persisted forms."""

from __future__ import annotations

import contextlib
import struct
import zlib

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.partition.table import (
    MAX_REPLICA_COUNT,
    STAMP_SEED,
    PartitionTable,
    PartitionTableError,
)

MEMBERS = [f"member-{k}" for k in range(9)]
ADDRESSES = {m: f"tcp://127.0.0.1:{5700 + k}" for k, m in enumerate(MEMBERS)}


def expected_stamp(table: PartitionTable) -> int:
    """Seed 001 section 1.3, recomputed here: versions as big-endian int32, MurmurHash3 x64."""
    data = struct.pack(f">{table.partition_count}i", *table.versions())
    return mmh3.hash64(data, STAMP_SEED, True, True)[0]


@st.composite
def tables(draw: st.DrawFn, max_partitions: int = 12) -> PartitionTable:
    count = draw(st.integers(1, max_partitions))
    table = PartitionTable(count)
    for pid in range(count):
        for _ in range(draw(st.integers(0, 3))):
            size = draw(st.integers(0, MAX_REPLICA_COUNT))
            members = draw(st.permutations(MEMBERS))[:size]
            holes = draw(st.lists(st.booleans(), min_size=size, max_size=size))
            table.set_replicas(pid, [None if h else m for m, h in zip(members, holes, strict=True)])
    return table


# -- basics -----------------------------------------------------------------------------------


def test_a_new_table_is_empty_at_version_zero():
    table = PartitionTable()
    assert table.partition_count == 271
    assert all(table.replicas(p) == (None,) * 7 for p in range(271))
    assert all(table.version(p) == 0 for p in range(271))
    assert table.owner(0) is None
    assert not table.is_assigned()
    assert table.members() == set()
    assert table.stamp() == expected_stamp(table)


def test_version_rises_by_the_number_of_changed_slots():
    table = PartitionTable(3)
    assert table.set_replicas(1, ["a", "b", "c"]) == 3
    assert table.version(1) == 3
    assert table.set_replicas(1, ["a", "c", "b"]) == 2
    assert table.version(1) == 5
    assert table.set_replicas(1, ("a", "c", "b", None)) == 0  # padded: no change
    assert table.version(1) == 5
    assert table.set_replica(1, 6, "d") == 1
    assert table.replicas(1) == ("a", "c", "b", None, None, None, "d")
    assert table.version(1) == 6
    assert table.set_replica(1, 6, "d") == 0
    assert (table.version(0), table.version(2)) == (0, 0)


def test_reading_helpers():
    table = PartitionTable(4)
    table.set_replicas(0, ["a", "b"])
    table.set_replicas(1, ["b", None, "a"])
    table.set_replicas(2, ["c"])
    assert table.owner(1) == "b"
    assert table.owners([2, 0, 1, 3, 1]) == ["c", "a", "b", None, "b"]
    assert table.owners([]) == []
    assert table.replica_index(1, "a") == 2
    assert table.replica_index(1, "c") == -1
    assert table.replica_index(1, None) == -1
    assert table.members() == {"a", "b", "c"}
    assert table.replica_counts("a") == [1, 0, 1, 0, 0, 0, 0]
    assert table.replica_counts("b") == [1, 1, 0, 0, 0, 0, 0]
    assert not table.is_assigned()
    table.set_replicas(3, ["c", "a"])
    assert table.is_assigned()
    assert table.version_sum() == sum(table.version(p) for p in range(4))


@pytest.mark.parametrize(
    "replicas",
    [["a", "a"], ["a", None, "a"], list("abcdefgh"), [1], [""], "ab", [b"a"]],
)
def test_invalid_replicas_are_refused_and_change_nothing(replicas):
    table = PartitionTable(2)
    table.set_replicas(0, ["x", "y"])
    with pytest.raises(PartitionTableError):
        table.set_replicas(0, replicas)
    assert table.replicas(0)[:2] == ("x", "y")
    assert table.version(0) == 2


def test_invalid_ids_and_indexes_are_refused():
    table = PartitionTable(2)
    table.set_replicas(0, ["x", "y"])
    for bad_pid in (-1, 2, "0", True, 1.0):
        with pytest.raises(PartitionTableError):
            table.replicas(bad_pid)  # type: ignore[arg-type]
        with pytest.raises(PartitionTableError):
            table.owners([0, bad_pid])  # type: ignore[list-item]
    for bad_index in (-1, 7, True):
        with pytest.raises(PartitionTableError):
            table.set_replica(0, bad_index, "z")  # type: ignore[arg-type]
    with pytest.raises(PartitionTableError):
        table.set_replica(0, 1, "x")  # x would be there twice
    for bad_count in (0, -3, True, 2.0, 1 << 21):
        with pytest.raises(PartitionTableError):
            PartitionTable(bad_count)  # type: ignore[arg-type]


# -- stamp ------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(tables())
def test_stamp_is_murmur3_of_the_versions_and_kept_current(table):
    assert table.stamp() == expected_stamp(table)
    assert -(2**63) <= table.stamp() < 2**63
    before = table.stamp()
    table.set_replica(0, 0, None if table.owner(0) else "outsider")
    assert table.stamp() == expected_stamp(table)
    assert table.stamp() != before


@settings(max_examples=60, deadline=None)
@given(tables(max_partitions=6), st.data())
def test_owned_by_follows_every_change_of_an_owner(table, data):
    """The set a member's batch paths test their partitions against is kept, and must never
    outlive a change of owner, whichever way the table changed."""
    def owned(t: PartitionTable, member: str) -> frozenset[int]:
        return frozenset(pid for pid in range(t.partition_count) if t.owner(pid) == member)

    watched = MEMBERS[0]  # (asked of one member only: the kept set is one member's)
    assert table.owned_by(watched) == owned(table, watched)
    twin = table.copy()
    for _ in range(data.draw(st.integers(1, 6))):
        pid = data.draw(st.integers(0, table.partition_count - 1))
        member = data.draw(st.sampled_from([*MEMBERS[:3], None]))
        way = data.draw(st.sampled_from(["set_replica", "take_row", "apply"]))
        with contextlib.suppress(PartitionTableError):  # (a member twice in a row)
            if way == "set_replica":
                table.set_replica(pid, 0, member)
            elif way == "take_row":
                table.take_row(pid, table.version(pid) + 1, [member, *table.replicas(pid)[1:]])
            else:
                newer = table.copy()
                newer.set_replica(pid, 0, member)
                table.apply(newer)
        assert table.owned_by(watched) == owned(table, watched)
    for asked in MEMBERS[:3]:  # another member's, and the copy taken before: their own
        assert table.owned_by(asked) == owned(table, asked)
        assert twin.owned_by(asked) == owned(twin, asked)


def test_stamp_depends_on_versions_only_and_on_their_position():
    one, two = PartitionTable(5), PartitionTable(5)
    one.set_replicas(2, ["a", "b"])
    two.set_replicas(2, ["c", "d"])  # other members, same versions
    assert one.stamp() == two.stamp()
    three = PartitionTable(5)
    three.set_replicas(3, ["a", "b"])  # same versions, another partition
    assert three.stamp() != one.stamp()


# -- applying a published table ---------------------------------------------------------------


def test_apply_keeps_the_newer_version_of_each_partition():
    local, published = PartitionTable(4), PartitionTable(4)
    local.set_replicas(0, ["a", "b"])  # version 2 here
    published.set_replicas(0, ["c"])  # version 1 there: older, ignored
    published.set_replicas(1, ["c", "d"])  # newer
    local.set_replicas(2, ["a"])
    published.set_replicas(2, ["b"])  # same version 1: ignored
    published.set_replicas(3, ["d"])
    published.set_replicas(3, ["d", "a"])  # version 2
    assert local.apply(published) == [1, 3]
    assert local.replicas(0)[:2] == ("a", "b")
    assert local.replicas(1)[:2] == ("c", "d")
    assert local.replicas(2)[0] == "a"
    assert local.replicas(3)[:2] == ("d", "a")
    assert [local.version(p) for p in range(4)] == [2, 2, 1, 2]
    assert local.stamp() == expected_stamp(local)
    assert local.apply(published) == []


@settings(max_examples=60, deadline=None)
@given(tables(max_partitions=6), st.data())
def test_apply_then_compare(table, data):
    other = table.copy()
    touched = data.draw(st.lists(st.integers(0, table.partition_count - 1), max_size=4))
    for pid in touched:
        other.set_replica(pid, 6, None if other.replicas(pid)[6] else "outsider")
    assert table.apply(other) == sorted(set(touched))
    assert table == other
    assert table.stamp() == other.stamp()


def test_apply_refuses_another_partition_count():
    with pytest.raises(PartitionTableError):
        PartitionTable(3).apply(PartitionTable(4))


def test_copy_is_independent_and_equal():
    table = PartitionTable(3)
    table.set_replicas(1, ["a", "b"])
    twin = table.copy()
    assert twin == table
    assert twin.stamp() == table.stamp()
    twin.set_replicas(1, ["b", "a"])
    assert twin != table
    assert table.replicas(1)[:2] == ("a", "b")
    assert table.stamp() == expected_stamp(table)


def test_equality_needs_same_replicas_and_versions():
    one, two = PartitionTable(2), PartitionTable(2)
    one.set_replicas(0, ["a"])
    two.set_replicas(0, ["b"])
    two.set_replicas(0, ["a"])  # same replicas, version 2
    assert one != two
    assert one != "not a table"


# -- wire form --------------------------------------------------------------------------------


def plain(obj) -> bool:
    """Only the types msgpack encodes natively."""
    if obj is None or isinstance(obj, (int, str)):
        return True
    if isinstance(obj, list):
        return all(plain(x) for x in obj)
    if isinstance(obj, dict):
        return all(isinstance(k, str) and plain(v) for k, v in obj.items())
    return False


@settings(max_examples=80, deadline=None)
@given(tables())
def test_wire_round_trip(table):
    wire = table.to_wire()
    assert plain(wire)
    back = PartitionTable.from_wire(wire)
    assert back == table
    assert back.stamp() == table.stamp()


def mutations():
    base = PartitionTable(2)
    base.set_replicas(0, ["a", "b"])
    base.set_replicas(1, ["b"])
    good = base.to_wire()
    yield {**good, "extra": 1}
    yield {k: v for k, v in good.items() if k != "members"}
    yield {**good, "partition_count": 3}
    yield {**good, "partition_count": True}
    yield {**good, "members": ["a", "a"]}
    yield {**good, "members": ["a", None]}
    yield {**good, "members": "ab"}
    yield {**good, "versions": [2]}
    yield {**good, "versions": [2, -1]}
    yield {**good, "versions": [2, 2**31]}
    yield {**good, "versions": [2, "1"]}
    yield {**good, "replicas": good["replicas"][:-1]}
    yield {**good, "replicas": [0, 0] + good["replicas"][2:]}  # member twice
    yield {**good, "replicas": [5] + good["replicas"][1:]}
    yield {**good, "replicas": [False] + good["replicas"][1:]}
    yield ["not", "a", "mapping"]
    yield None


@pytest.mark.parametrize("wire", list(mutations()))
def test_malformed_wire_tables_raise_partition_table_error(wire):
    with pytest.raises(PartitionTableError):
        PartitionTable.from_wire(wire)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "partition_count": json_like,
            "members": json_like,
            "versions": json_like,
            "replicas": json_like,
        }
    )
    | json_like
)
def test_from_wire_raises_only_partition_table_error(obj):
    with contextlib.suppress(PartitionTableError):
        PartitionTable.from_wire(obj)


# -- persisted form (seed 001 section 3.2) ----------------------------------------------------


def small_table() -> PartitionTable:
    table = PartitionTable(3)
    table.set_replicas(0, ["member-1", "member-2"])
    table.set_replicas(1, ["member-2", None, "member-1"])
    table.set_replicas(1, ["member-2", "member-3", "member-1"])
    return table


def test_persisted_layout_follows_seed_001():
    table = small_table()
    buf = table.encode(ADDRESSES)
    magic, fmt, length = struct.unpack_from(">4sHi", buf, 0)
    assert (magic, fmt, length) == (b"SGPT", 1, 3)
    offset = 10
    (replica_count,) = struct.unpack_from(">i", buf, offset)
    offset += 4
    replicas = []
    for _ in range(replica_count):
        fields = []
        for _ in range(2):  # address, then uuid
            (size,) = struct.unpack_from(">H", buf, offset)
            fields.append(buf[offset + 2 : offset + 2 + size].decode())
            offset += 2 + size
        replicas.append(tuple(fields))
    assert replicas == [(ADDRESSES[m], m) for m in ("member-1", "member-2", "member-3")]
    for pid in range(3):
        version, *indexes = struct.unpack_from(">i7i", buf, offset)
        offset += 32
        assert version == table.version(pid)
        assert tuple(None if i < 0 else replicas[i][1] for i in indexes) == table.replicas(pid)
    assert struct.unpack_from(">I", buf, offset)[0] == zlib.crc32(buf[:offset])
    assert offset + 4 == len(buf)


@settings(max_examples=60, deadline=None)
@given(tables())
def test_persisted_round_trip(table):
    back, addresses = PartitionTable.decode(table.encode(ADDRESSES))
    assert back == table
    assert back.stamp() == table.stamp()
    assert addresses == {m: ADDRESSES[m] for m in table.members()}


def test_every_truncation_is_detected():
    buf = small_table().encode(ADDRESSES)
    for cut in range(len(buf)):
        with pytest.raises(PartitionTableError, match="truncated|checksum"):
            PartitionTable.decode(buf[:cut])


def test_every_flipped_bit_is_detected():
    buf = small_table().encode(ADDRESSES)
    for offset in range(len(buf)):
        for bit in (0, 7):
            corrupt = bytearray(buf)
            corrupt[offset] ^= 1 << bit
            with pytest.raises(PartitionTableError):
                PartitionTable.decode(bytes(corrupt))


def test_trailing_bytes_and_wrong_input_are_refused():
    buf = small_table().encode(ADDRESSES)
    body = buf[:-4] + b"\x00"
    with pytest.raises(PartitionTableError, match="unexpected bytes"):
        PartitionTable.decode(body + struct.pack(">I", zlib.crc32(body)))
    with pytest.raises(PartitionTableError):
        PartitionTable.decode("not bytes")  # type: ignore[arg-type]
    with pytest.raises(PartitionTableError, match="magic"):
        PartitionTable.decode(b"XXXX" + buf[4:])


def test_a_consistent_but_invalid_body_is_refused():
    # A correct checksum over a body whose partition names a replica twice.
    good = small_table().encode(ADDRESSES)
    body = bytearray(good[:-4])
    rows_at = len(body) - 3 * 32
    struct.pack_into(">i7i", body, rows_at, 2, 0, 0, -1, -1, -1, -1, -1)
    with pytest.raises(PartitionTableError, match="twice"):
        PartitionTable.decode(bytes(body) + struct.pack(">I", zlib.crc32(body)))


def test_encode_needs_an_address_for_every_member():
    with pytest.raises(PartitionTableError, match="member-3"):
        small_table().encode({m: a for m, a in ADDRESSES.items() if m != "member-3"})


def test_raise_version_moves_only_the_version():
    table = PartitionTable(3)
    table.set_replicas(1, ["a", "b"])
    stamp = table.stamp()
    assert table.raise_version(1, 3) == 5
    assert table.replicas(1)[:2] == ("a", "b") and table.version(1) == 5
    assert table.stamp() != stamp
    with pytest.raises(PartitionTableError):
        table.raise_version(1, 0)
    with pytest.raises(PartitionTableError):
        table.raise_version(1, True)


def test_take_row_takes_only_a_newer_version():
    table = PartitionTable(4)
    table.set_replicas(1, ["a", "b"])
    version = table.version(1)
    assert not table.take_row(1, version, ["c"]), "the same version is not newer"
    assert table.replicas(1)[:2] == ("a", "b")
    assert table.take_row(1, version + 3, ["c", "a"])
    assert table.replicas(1)[:3] == ("c", "a", None) and table.version(1) == version + 3
    assert not table.take_row(1, True, ["d"])
