"""A backup operation's parts, one per partition, packed as columns of integers.

A backup operation carries, for each partition it writes, the partition id, how many items
(keys and values) of the payload are the partition's, the owner's table version of the
partition, the replica version vector that the write gave it (seed 004) and, for a
``replace_contents``, the target map's vector. A batch of 100 keys has about 80
partitions: as a msgpack list per partition, checking each list's fields cost a backup about
120 bytecodes a partition and building them cost the owner about 40. Packed, they are one bin
field of little-endian u64s, column after column::

    pids[n] counts[n] table_versions[n] vectors[6n] (targets[6n], for a replace_contents)

so that decoding is one array call, every value is an int >= 0 by construction, and the
remaining checks (partition ids in range, none twice) are a few C calls over a column. What
is the same for every part of an operation (its invocation id, whether the caller wants the
previous value) is a field of the operation's header instead.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from itertools import chain

from grid.errors import ProtocolError
from grid.partition.replica_versions import REPLICA_VERSION_COUNT

__all__ = ["BackupParts", "pack_parts"]

_V = REPLICA_VERSION_COUNT
_BIG_ENDIAN = sys.byteorder == "big"


def pack_parts(pids: Sequence[int], counts: Sequence[int], table_versions: Sequence[int],
               vectors: Sequence[Sequence[int]],
               targets: Sequence[Sequence[int]] | None = None) -> bytes:
    """The parts' columns as they go on the wire (``vectors[i]``, and ``targets[i]``, six
    versions each)."""
    values = array("Q", pids)
    values.extend(counts)
    values.extend(table_versions)
    values.extend(chain.from_iterable(vectors))
    if targets is not None:
        values.extend(chain.from_iterable(targets))
    if len(values) != (3 + _V * (1 if targets is None else 2)) * len(pids):
        raise ValueError("every part has a count, a table version and six versions")
    if _BIG_ENDIAN:
        values.byteswap()
    return values.tobytes()


class BackupParts:
    """The parts of one received backup operation, as columns."""

    __slots__ = ("pids", "counts", "table_versions", "versions", "target_versions")

    def __init__(self, pids: list[int], counts: list[int], table_versions: list[int],
                 versions: list[int], target_versions: list[int] | None) -> None:
        self.pids = pids
        self.counts = counts  # items (a key and a value are two)
        self.table_versions = table_versions
        self.versions = versions  # the vectors end to end: part i's is [6i, 6i + 6)
        self.target_versions = target_versions  # likewise, or None

    @classmethod
    def unpack(cls, packed: object, with_targets: bool, partition_count: int) -> BackupParts:
        """Decode ``pack_parts``'s bytes, or raise ProtocolError: a length that is not whole
        parts, no part, a partition id out of range or named twice."""
        if packed.__class__ is not bytes or len(packed) % 8:  # type: ignore[arg-type]
            raise ProtocolError("a backup's parts are packed u64s")
        values = array("Q")
        values.frombytes(packed)  # type: ignore[arg-type]
        if _BIG_ENDIAN:
            values.byteswap()
        width = 3 + _V * (2 if with_targets else 1)
        n, rest = divmod(len(values), width)
        if rest or not n:
            raise ProtocolError(f"a backup's parts are {width} u64s each, one part at least")
        columns = values.tolist()
        pids = columns[:n]
        if max(pids) >= partition_count:
            raise ProtocolError(f"partition id {max(pids)} is out of range")
        if len(set(pids)) != n:
            raise ProtocolError("a backup names a partition twice")
        return cls(pids, columns[n:2 * n], columns[2 * n:3 * n],
                   columns[3 * n:(3 + _V) * n], columns[(3 + _V) * n:] if with_targets else None)

    def vector(self, i: int) -> list[int]:
        """Part ``i``'s replica version vector."""
        return self.versions[_V * i:_V * i + _V]

    def target_vector(self, i: int) -> list[int] | None:
        """Part ``i``'s target map vector (a replace_contents), else None."""
        targets = self.target_versions
        return None if targets is None else targets[_V * i:_V * i + _V]

    def __len__(self) -> int:
        return len(self.pids)
