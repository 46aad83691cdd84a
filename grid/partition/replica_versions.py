"""Replica version vectors per partition and namespace (seed 004, fine-grained anti-entropy).

Each member keeps, per partition and per namespace (a map, i.e. one fragment), a vector of six
versions: entry ``k - 1`` is the version of replica index ``k`` (1..6). A replica at index
``k`` knows only entries ``k - 1`` and up; the hotter entries stay zero, because a replica holds
a superset of what colder replicas hold.

API (one ``ReplicaVersions`` per member; all methods are pure state changes, no I/O):

- ``increment(pid, namespace, backup_count) -> tuple[int, ...]`` on the primary, for one
  operation with ``backup_count`` sync + async backups: raises the first ``backup_count``
  entries and returns the vector the backup operations carry; ``increment_many`` does so for
  each partition of a batch.
- ``apply_backup(pid, namespace, replica_index, versions) -> BackupDecision`` on a backup, for a
  received backup operation; the decision says whether to apply the operation
  (``decision.apply``) and whether to send a replica sync request (``decision.request_sync``);
  ``apply_backups`` decides for each part of a batch:

  ==============  =====================================================  =====  ====
  decision        when (v: carried version, known: ours, at our index)   apply  sync
  ==============  =====================================================  =====  ====
  ``APPLY``       v == known + 1; versions are set                       yes    no
  ``STALE``       v <= known (already applied, or older); ignored        no     no
  ``APPLY_DIRTY`` v > known + 1 (something was missed); versions are     yes    yes
                  set and the replica is marked dirty
  ``SYNC_AGAIN``  the replica is already dirty and v > known: applied    yes    yes
                  and versions set as above; the sync is asked for again
  ``STALE_DIRTY`` the replica is already dirty and v <= known: ignored,   no     yes
                  the sync is asked for again
  ==============  =====================================================  =====  ====

  The seed's fourth rule ("a dirty replica sends a new sync request whatever the version")
  only adds the request; the first three still decide whether the operation is applied. So a
  dirty synchronous backup still holds every acknowledged write that reached it: dropping
  them until the sync came would let a write be acknowledged that no backup holds.

- ``needs_sync(pid, namespace, replica_index, primary_versions) -> bool``: the check of the
  periodic anti-entropy task, on a backup, against the primary's vector.
- ``set(pid, namespace, versions, replica_index=1)``: install versions after a replica sync
  (entries from ``replica_index - 1`` on; hotter ones zero) and clear the dirty flag.
- ``get``, ``is_dirty``, ``mark_dirty``, ``namespaces``, ``dirty_namespaces`` (to ask for the
  sync of all inconsistent namespaces of a partition in one request), ``clear(pid, namespace=None)``
  (forget one namespace, or the whole partition when this member no longer holds a replica).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Sequence

from grid.partition.table import MAX_BACKUP_COUNT

__all__ = ["REPLICA_VERSION_COUNT", "BackupDecision", "ReplicaVersions", "ReplicaVersionsError"]

REPLICA_VERSION_COUNT = MAX_BACKUP_COUNT
"""Length of a version vector: one entry per backup replica index 1..6."""

assert REPLICA_VERSION_COUNT == 6

Versions = tuple[int, ...]
_ZERO: Versions = (0,) * REPLICA_VERSION_COUNT


class ReplicaVersionsError(ValueError):
    """A version vector, replica index or backup count is out of range."""


class BackupDecision(enum.Enum):
    """What a backup does with a received backup operation (see the module table)."""

    APPLY = "APPLY"
    STALE = "STALE"
    APPLY_DIRTY = "APPLY_DIRTY"
    SYNC_AGAIN = "SYNC_AGAIN"
    STALE_DIRTY = "STALE_DIRTY"

    @property
    def apply(self) -> bool:
        """Run the backup operation on the local replica."""
        return self in (BackupDecision.APPLY, BackupDecision.APPLY_DIRTY,
                        BackupDecision.SYNC_AGAIN)

    @property
    def request_sync(self) -> bool:
        """Send a replica sync request for this partition and namespace to the primary."""
        return self in (BackupDecision.APPLY_DIRTY, BackupDecision.SYNC_AGAIN,
                        BackupDecision.STALE_DIRTY)


class _Entry:
    __slots__ = ("versions", "dirty")

    def __init__(self) -> None:
        self.versions: list[int] = [0] * REPLICA_VERSION_COUNT
        self.dirty = False


def _check_vector(versions: Sequence[int]) -> Versions:
    vector = tuple(versions)
    if len(vector) != REPLICA_VERSION_COUNT:
        raise ReplicaVersionsError(
            f"a version vector has {REPLICA_VERSION_COUNT} entries, got {len(vector)}"
        )
    for version in vector:  # every backup operation passes here: the class test is
        if version.__class__ is not int or version < 0:  # cheaper, and refuses bool too
            raise ReplicaVersionsError(f"versions are ints >= 0, got {vector!r}")
    return vector


def _check_replica_index(replica_index: int) -> None:
    if replica_index.__class__ is not int or not 1 <= replica_index <= REPLICA_VERSION_COUNT:
        raise ReplicaVersionsError(
            f"a backup replica index is in 1..{REPLICA_VERSION_COUNT}, got {replica_index!r}"
        )


class ReplicaVersions:
    """The replica version vectors a member knows, per partition and namespace."""

    def __init__(self) -> None:
        self._partitions: dict[int, dict[Hashable, _Entry]] = {}

    def _entry(self, pid: int, namespace: Hashable) -> _Entry:
        namespaces = self._partitions.get(pid)
        if namespaces is None:
            namespaces = self._partitions[pid] = {}
        entry = namespaces.get(namespace)
        if entry is None:
            entry = namespaces[namespace] = _Entry()
        return entry

    def _find(self, pid: int, namespace: Hashable) -> _Entry | None:
        return self._partitions.get(pid, {}).get(namespace)

    def get(self, pid: int, namespace: Hashable) -> Versions:
        """The known vector; all zeros for a partition or namespace never seen."""
        entry = self._find(pid, namespace)
        return _ZERO if entry is None else tuple(entry.versions)

    def is_dirty(self, pid: int, namespace: Hashable) -> bool:
        """Whether this replica missed a backup and waits for a replica sync."""
        entry = self._find(pid, namespace)
        return entry is not None and entry.dirty

    def namespaces(self, pid: int) -> list[Hashable]:
        """Namespaces with versions in this partition, in the order first seen."""
        return list(self._partitions.get(pid, {}))

    def dirty_namespaces(self, pid: int) -> list[Hashable]:
        """The namespaces of a partition that need a replica sync."""
        return [ns for ns, entry in self._partitions.get(pid, {}).items() if entry.dirty]

    def dirty_count(self) -> int:
        """Namespaces, over all partitions, that wait for a replica sync."""
        return sum(entry.dirty for namespaces in self._partitions.values()
                   for entry in namespaces.values())

    def increment(self, pid: int, namespace: Hashable, backup_count: int) -> Versions:
        """On the primary: one operation with ``backup_count`` (sync + async) backups."""
        return self.increment_many((pid,), namespace, backup_count)[0]

    def increment_many(self, pids: Iterable[int], namespace: Hashable,
                       backup_count: int) -> list[Versions]:
        """``increment`` for each partition of a batch write, in order (one call for the 80
        partitions of a batch of 100 keys)."""
        if backup_count.__class__ is not int or not 0 <= backup_count <= REPLICA_VERSION_COUNT:
            raise ReplicaVersionsError(
                f"backup_count is in 0..{REPLICA_VERSION_COUNT}, got {backup_count!r}"
            )
        partitions = self._partitions
        raised = range(backup_count)
        vectors = []
        for pid in pids:
            namespaces = partitions.get(pid)
            entry = None if namespaces is None else namespaces.get(namespace)
            if entry is None:
                entry = self._entry(pid, namespace)
            versions = entry.versions
            if backup_count == 1:  # (the default: no loop)
                versions[0] += 1
            else:
                for k in raised:
                    versions[k] += 1
            vectors.append(tuple(versions))
        return vectors

    def _install(self, entry: _Entry, vector: Versions, replica_index: int) -> None:
        start = replica_index - 1
        if start:
            entry.versions[:start] = [0] * start
            entry.versions[start:] = vector[start:]
        else:  # the first backup, the one nearly every write has: the whole vector
            entry.versions[:] = vector

    def apply_backup(
        self, pid: int, namespace: Hashable, replica_index: int, versions: Sequence[int]
    ) -> BackupDecision:
        """On a backup at ``replica_index``: decide on a backup operation carrying ``versions``."""
        return self.apply_backups(namespace, (pid,), (replica_index,), (versions,))[0]

    def apply_backups(
        self, namespace: Hashable, pids: Sequence[int], replica_indexes: Sequence[int],
        vectors: Sequence[Sequence[int]],
    ) -> list[BackupDecision]:
        """``apply_backup`` for each part of a batch backup operation (one partition each), in
        order. Every replica index and vector is checked before any is taken: a malformed
        one raises with nothing changed."""
        for replica_index in replica_indexes:
            if replica_index.__class__ is not int \
                    or not 1 <= replica_index <= REPLICA_VERSION_COUNT:
                _check_replica_index(replica_index)  # raises
        for versions in vectors:
            if len(versions) != REPLICA_VERSION_COUNT:
                _check_vector(versions)  # raises
            for version in versions:  # (the class test is cheaper, and refuses bool too)
                if version.__class__ is not int or version < 0:
                    _check_vector(versions)  # raises
        partitions = self._partitions
        decisions = []
        decide = decisions.append
        apply = BackupDecision.APPLY
        for pid, replica_index, vector in zip(pids, replica_indexes, vectors, strict=True):
            namespaces = partitions.get(pid)
            entry = None if namespaces is None else namespaces.get(namespace)
            if entry is None:
                entry = self._entry(pid, namespace)
            known = entry.versions[replica_index - 1]
            carried = vector[replica_index - 1]
            if carried <= known:
                decide(BackupDecision.STALE_DIRTY if entry.dirty else BackupDecision.STALE)
                continue
            self._install(entry, vector, replica_index)
            if entry.dirty:
                decide(BackupDecision.SYNC_AGAIN)
            elif carried == known + 1:
                decide(apply)
            else:
                entry.dirty = True
                decide(BackupDecision.APPLY_DIRTY)
        return decisions

    def apply_in_sequence(self, namespace: Hashable, pids: Sequence[int],
                          replica_indexes: Sequence[int], versions: Sequence[int]) -> bool:
        """``apply_backups`` of a batch whose every part is what its replica expects next
        (``APPLY``: one past the known version, the replica not dirty): the versions are
        installed and True. Otherwise nothing changes and False, and ``apply_backups``
        decides part by part. ``versions`` are the parts' vectors end to end (six ints >= 0
        each, as workers/backup_parts.py decodes them); the replica indexes are the
        member's own (its table's), in 1..6. The common case of a steady stream of backup
        operations, in two short loops instead of the checks and decisions of each part."""
        partitions = self._partitions
        entries = []
        at = -1
        for pid, replica_index in zip(pids, replica_indexes, strict=True):
            namespaces = partitions.get(pid)
            entry = None if namespaces is None else namespaces.get(namespace)
            if entry is None:  # (never seen: version 0, clean)
                if versions[at + replica_index] != 1:
                    return False
            elif entry.dirty \
                    or versions[at + replica_index] != entry.versions[replica_index - 1] + 1:
                return False
            entries.append(entry)
            at += REPLICA_VERSION_COUNT
        at = 0
        for pid, entry, replica_index in zip(pids, entries, replica_indexes, strict=True):
            if entry is None:
                entry = self._entry(pid, namespace)
            end = at + REPLICA_VERSION_COUNT
            if replica_index == 1:
                entry.versions[:] = versions[at:end]
            else:
                self._install(entry, tuple(versions[at:end]), replica_index)
            at = end
        return True

    def needs_sync(
        self, pid: int, namespace: Hashable, replica_index: int, primary_versions: Sequence[int]
    ) -> bool:
        """The periodic anti-entropy check: dirty, or our version differs from the primary's."""
        _check_replica_index(replica_index)
        vector = _check_vector(primary_versions)
        entry = self._find(pid, namespace)
        known = 0 if entry is None else entry.versions[replica_index - 1]
        dirty = entry is not None and entry.dirty
        return dirty or known != vector[replica_index - 1]

    def set(
        self, pid: int, namespace: Hashable, versions: Sequence[int], replica_index: int = 1
    ) -> None:
        """After a replica sync: take the primary's versions and clear the dirty flag."""
        _check_replica_index(replica_index)
        vector = _check_vector(versions)
        entry = self._entry(pid, namespace)
        self._install(entry, vector, replica_index)
        entry.dirty = False

    def mark_dirty(self, pid: int, namespace: Hashable) -> None:
        """Flag a replica for sync (e.g. when anti-entropy found it behind)."""
        self._entry(pid, namespace).dirty = True

    def clear(self, pid: int, namespace: Hashable | None = None) -> None:
        """Forget one namespace of a partition, or all of them (``namespace=None``)."""
        if namespace is None:
            self._partitions.pop(pid, None)
            return
        namespaces = self._partitions.get(pid)
        if namespaces is not None:
            namespaces.pop(namespace, None)
            if not namespaces:
                del self._partitions[pid]
