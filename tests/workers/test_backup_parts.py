"""A backup operation's packed parts: what is packed comes back, column by column; anything
else is a ProtocolError (tests/cluster/test_write_path.py sends malformed ones to a member)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grid.errors import ProtocolError
from workers.backup_parts import BackupParts, pack_parts

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
VECTOR = st.lists(U64, min_size=6, max_size=6)


@given(data=st.data(), n=st.integers(min_value=1, max_value=40), with_targets=st.booleans())
def test_packed_parts_come_back_as_they_went(data, n: int, with_targets: bool) -> None:
    pids = data.draw(st.lists(st.integers(0, 270), min_size=n, max_size=n, unique=True))
    counts = data.draw(st.lists(U64, min_size=n, max_size=n))
    tables = data.draw(st.lists(U64, min_size=n, max_size=n))
    vectors = data.draw(st.lists(VECTOR, min_size=n, max_size=n))
    targets = data.draw(st.lists(VECTOR, min_size=n, max_size=n)) if with_targets else None
    parts = BackupParts.unpack(pack_parts(pids, counts, tables, vectors, targets),
                               with_targets, 271)
    assert (parts.pids, parts.counts, parts.table_versions) == (pids, counts, tables)
    assert [parts.vector(i) for i in range(n)] == vectors and len(parts) == n
    assert [parts.target_vector(i) for i in range(n)] == (targets or [None] * n)


def test_a_part_without_its_six_versions_is_not_packed() -> None:
    with pytest.raises(ValueError):
        pack_parts([1], [2], [3], [[0] * 5])
    with pytest.raises(ValueError):
        pack_parts([1, 2], [2, 2], [3, 3], [[0] * 6] * 2, [[0] * 6])


@pytest.mark.parametrize("packed", [
    b"", "parts", None, [1, 2], bytes(7), bytes(8 * 10),  # 9 u64s a part: not whole parts
    pack_parts([271], [2], [1], [[1, 0, 0, 0, 0, 0]]),  # a partition out of range
    pack_parts([5, 5], [2, 2], [1, 1], [[1, 0, 0, 0, 0, 0]] * 2),  # one named twice
])
def test_malformed_parts_are_refused(packed) -> None:
    with pytest.raises(ProtocolError):
        BackupParts.unpack(packed, False, 271)


def test_parts_packed_without_targets_are_not_taken_for_parts_with_them() -> None:
    packed = pack_parts([1, 2], [2] * 2, [1] * 2, [[1, 0, 0, 0, 0, 0]] * 2)
    with pytest.raises(ProtocolError):  # 18 u64s: not whole parts of 15
        BackupParts.unpack(packed, True, 271)
