"""Replica sync on the member (seed 004, with seed 003's Merkle trees): a backup that missed
backup operations asks its owner for the namespaces concerned and installs the answer.

- **Anti-entropy (owner):** every ``backup_sync_interval`` the owner sends each backup member
  the replica versions of the partitions it backs up (one REPLICA_VERSIONS per member).
- **Backup:** a namespace whose version is ahead of the owner's, or still behind it a moment
  later (grid/cluster/replica_sync.py ``GRACE_S``), or dirty (a version gap in a backup
  operation, workers/map_service.py), is wanted; ``SyncRequests`` decides when a partition
  asks. The REPLICA_SYNC request carries the backup's Merkle tree of each namespace.
- **Owner, answering:** per namespace, with the backup's tree, the entries under the leaves
  where the trees differ (a differential sync: a replica that missed one write gets one leaf's
  entries); without one (``merkle_tree_depth`` 0), the whole fragment, lent through shared
  memory as migrations do (REPLICA_SYNC_DONE ends the loan). The answer carries the owner's
  versions at that moment: it is a snapshot. Lent answers count against
  ``max_parallel_replications``; past it the owner answers "busy" and the backup asks later.
- **Backup, installing:** ``plan_install`` says whether the snapshot can be installed given
  the operations applied while the request was out, and which of them to apply again on top.
  The answer carries the owner's invocation records of the partition (id and outcome of
  each write applied to it); the backup forgets its records of others made before it asked
  (writes the snapshot took away) and takes those it lacks (writes the snapshot brought):
  seed 004 sync with the invocation records of this project's resends.

A partition's request ends with its answer, with no answer within the interval, or when the
table changes the partition's owner or this member's replica index.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any

from grid import protocol as p
from grid.cluster.replica_sync import RETRY_S, SyncRequests, plan_install
from grid.errors import ProtocolError
from grid.partition.merkle import MerkleTree, leaf_shift
from grid.partition.replica_versions import REPLICA_VERSION_COUNT
from workers.map_service import sections
from workers.record_store import FragmentLoan, FragmentTransferError, key_hash

if TYPE_CHECKING:
    from workers.node import Node

log = logging.getLogger("shmgrid.replica_sync")

class ReplicaSyncService:
    def __init__(self, member: Node) -> None:
        self.member = member
        self.config = member.config
        self.requests = SyncRequests(self.config.max_parallel_replications,
                                     self.config.backup_sync_interval)
        # Owner: answers whose fragments are lent, by sync id: (backup, deadline, loans).
        self.lent: dict[int, tuple[str, float, list[FragmentLoan]]] = {}
        self._ids = itertools.count(1)
        self.next_versions = 0.0  # when the owner next sends its versions
        # What the member has done, for status and the benchmarks.
        self.synced = 0  # namespaces installed here
        self.entries_taken = 0  # entries those installs moved (whole fragments counted)

    def handlers(self) -> dict[str, Any]:
        return {p.REPLICA_VERSIONS: self._on_versions, p.REPLICA_SYNC: self._on_sync,
                p.REPLICA_SYNC_DONE: self._on_done}

    def status(self) -> dict[str, Any]:
        return {"dirty": self.member.maps.versions.dirty_count(),
                "syncs_in_flight": self.requests.in_flight + len(self.lent),
                "syncs_waiting": self.requests.waiting, "synced": self.synced,
                "sync_entries": self.entries_taken}

    def tick(self, now: float) -> None:
        if self.member.cluster.ready:
            if now >= self.next_versions:
                self.next_versions = now + self.config.backup_sync_interval
                self._send_versions()
            for pid, namespaces in self.requests.due(now, self._known):
                self._request(pid, namespaces)
        for sid, (_, deadline, _) in list(self.lent.items()):
            if now >= deadline:
                self._release(sid)

    def _known(self, pid: int, ns: str) -> int:
        """This replica's version of a namespace, at its index (0 if it holds none)."""
        index = self.member.cluster.table.replica_index(pid, self.member.info.uuid)
        return self.member.maps.versions.get(pid, ns)[index - 1] if index > 0 else 0

    def on_table_change(self, pids: list[int]) -> None:
        """A request for a partition whose owner or our index changed ends; a member that
        no longer backs a partition up forgets it."""
        table, me = self.member.cluster.table, self.member.info.uuid
        for pid in pids:
            if table.replica_index(pid, me) <= 0:
                self.requests.forget(pid)

    def on_members_change(self, left: set[str]) -> None:
        for sid in [sid for sid, (uuid, _, _) in self.lent.items() if uuid in left]:
            self._release(sid)

    def close(self) -> None:
        for sid in list(self.lent):
            self._release(sid)

    # -- anti-entropy: the owner's versions --------------------------------------------------

    def _send_versions(self) -> None:
        table, me = self.member.cluster.table, self.member.info.uuid
        versions = self.member.maps.versions
        total = self.config.total_backup_count
        per_member: dict[str, list[list[Any]]] = {}
        for pid in sorted(self.member.maps.owned):
            if table.owner(pid) != me or self.member.migrations.migrating(pid):
                continue
            vectors = {ns: list(versions.get(pid, ns)) for ns in versions.namespaces(pid)}
            for uuid in table.replicas(pid)[1:1 + total]:
                if uuid is not None:
                    per_member.setdefault(uuid, []).append([pid, vectors])
        for uuid, parts in per_member.items():
            self.member.request_peer(uuid, p.REPLICA_VERSIONS, {"parts": parts}, [],
                                     lambda h, f: None, timeout=self.config.heartbeat_timeout)

    def _on_versions(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        parts, sender = header.get("parts"), header.get("from")
        if not isinstance(parts, list):
            raise ProtocolError("replica versions come as [pid, {namespace: versions}] parts")
        table, me = self.member.cluster.table, self.member.info.uuid
        versions, now = self.member.maps.versions, self.member.now()
        for part in parts:
            if not isinstance(part, list) or len(part) != 2 or not isinstance(part[1], dict):
                raise ProtocolError("a replica versions part is [pid, {namespace: versions}]")
            pid, vectors = self.member.maps.check_pid(part[0]), part[1]
            index = table.replica_index(pid, me)
            if table.owner(pid) != sender or index <= 0:
                continue  # our table disagrees: the table's next change decides
            names = set(vectors) | set(versions.namespaces(pid)) | \
                set(self.member.store.namespaces(pid))
            for ns in names:
                vector = vectors.get(ns)
                if vector is not None and (not isinstance(vector, list) or
                                           len(vector) != REPLICA_VERSION_COUNT):
                    raise ProtocolError("a version vector has six entries")
                primary = vector[index - 1] if vector is not None else 0
                known = versions.get(pid, ns)[index - 1]
                if versions.is_dirty(pid, ns) or known > primary:
                    self.requests.want(pid, [ns])
                elif known < primary:  # lost, or still on its way: look again shortly
                    self.requests.suspect(pid, ns, primary, now)
        self.member.reply_ok(ident, header)

    # -- the backup's request and its answer -------------------------------------------------

    def _request(self, pid: int, namespaces: list[str]) -> None:
        table, me = self.member.cluster.table, self.member.info.uuid
        owner, index = table.owner(pid), table.replica_index(pid, me)
        if owner is None or index <= 0:
            self.requests.forget(pid)
            return
        trees = {}
        if self.config.merkle_tree_depth:
            for ns in namespaces:
                trees[ns] = bytes(self.member.store.tree(pid, ns).nodes)
        fields = {"pid": pid, "nss": namespaces, "depth": self.config.merkle_tree_depth,
                  "trees": trees}
        recorded = self.member.maps.records.invocations(pid)  # (see _install)

        def on_answer(header: dict[str, Any] | None, frames: list[bytes]) -> None:
            self._on_answer(pid, owner, index, namespaces, recorded, header, frames)

        self.member.request_peer(owner, p.REPLICA_SYNC, fields, [], on_answer,
                                 timeout=self.config.backup_sync_interval)

    def _on_answer(self, pid: int, owner: str, index: int, namespaces: list[str],
                   recorded: set[str], header: dict[str, Any] | None,
                   frames: list[bytes]) -> None:
        now = self.member.now()
        sid = header.get("sid") if header else None
        try:
            run = self.requests.pending.get(pid)
            table = self.member.cluster.table
            if run is None or run.namespaces != namespaces:
                return  # ended meanwhile (a table change, or no answer in time)
            if header is None or not header.get("ok") or header.get("busy") or \
                    table.owner(pid) != owner or \
                    table.replica_index(pid, self.member.info.uuid) != index:
                self.requests.failed(pid, now, RETRY_S if header
                                     else self.config.heartbeat_interval)
                return
            self._install(pid, index, namespaces, recorded, header, frames, now)
        finally:
            if sid:
                self.member.request_peer(owner, p.REPLICA_SYNC_DONE, {"sid": sid}, [],
                                         lambda h, f: None,
                                         timeout=self.config.heartbeat_timeout)

    def _install(self, pid: int, index: int, namespaces: list[str], recorded: set[str],
                 header: dict[str, Any], frames: list[bytes], now: float) -> None:
        """Install the owner's answer: its snapshot of the namespaces, the operations
        applied meanwhile on top. ``recorded``: the invocations recorded here for the
        partition when the request went out."""
        vectors, replaced_wire = header.get("vectors"), header.get("replaced")
        parts, owner_records = header.get("parts") or [], header.get("records")
        if not isinstance(vectors, dict) or not isinstance(replaced_wire, dict) or \
                set(vectors) != set(namespaces) or set(replaced_wire) != set(namespaces) or \
                len(frames) != 1 or not isinstance(owner_records, list) or \
                not all(isinstance(record, list) and len(record) == 2
                        and isinstance(record[0], str)
                        and (record[1] is None or isinstance(record[1], bytes))
                        for record in owner_records):
            raise ProtocolError("a replica sync answer carries versions and leaves per "
                                "namespace asked for, the owner's invocation records "
                                "([id, outcome] each), and one frame of entries")
        replaced = {ns: None if leaves is None else set(leaves)
                    for ns, leaves in replaced_wire.items()}
        snapshot = {ns: vectors[ns][index - 1] for ns in namespaces}
        store, maps = self.member.store, self.member.maps
        shift = leaf_shift(self.config.merkle_tree_depth or 1)
        ok, again = plan_install(self.requests.pending[pid].window, snapshot, replaced,
                                 lambda key: key_hash(key) >> shift)
        if not ok:
            self.requests.failed(pid, now)
            log.info("partition %d: a replica sync answer raced with writes; asking again", pid)
            return
        entries = sections(p.unpack_items(frames[0]))
        self.requests.installed(pid)
        for ns in namespaces:
            if replaced[ns] is None:
                own = [part for part in parts if isinstance(part, dict) and part.get("ns") == ns]
                try:
                    for part in own:
                        self.entries_taken += store.receive(pid, part)
                except (OSError, FragmentTransferError) as exc:
                    log.warning("partition %d: could not take a synced fragment: %s", pid, exc)
                    maps.versions.mark_dirty(pid, ns)
                    self.requests.want(pid, [ns])
                    continue
                if not own:
                    store.clear(pid, ns)
            else:
                pairs = entries.get(ns, [])
                store.replace_leaves(pid, ns, replaced[ns], pairs)
                self.entries_taken += len(pairs)
            maps.versions.set(pid, ns, vectors[ns], index)
            self.synced += 1
        # A record made here before the request of an invocation the owner does not know is
        # of a write the owner never had (its old owner died while sending it), which the
        # snapshot just took away: kept, it would answer a resend to this replica, once
        # owner, as done with nothing holding the write. Records made since stay: their
        # writes came from this owner and are applied again on top. And the owner's records
        # that this replica lacks are of writes the snapshot just brought (their operations
        # missed here, or judged as already applied when they come): without them, a
        # resend to this replica, once owner, would be applied again and answered with the
        # write's own value as the previous one.
        maps.records.forget_unknown(pid, recorded, {iid for iid, _ in owner_records})
        maps.records.adopt(pid, owner_records, now)
        for op in again:  # newer than the snapshot: on top of it, in order
            ns, kind, chunk, versions, target_versions = op.request
            maps._decide_and_apply(pid, index, ns, kind, chunk, versions, target_versions,
                                   replay=True)
        log.info("partition %d: synced %s from its owner (%s)", pid, ", ".join(namespaces),
                 ", ".join(f"{ns}: {'all' if replaced[ns] is None else len(replaced[ns])}"
                           f"{'' if replaced[ns] is None else ' leaves'}" for ns in namespaces))
        maps.replica_synced()  # operations held until this sync are judged now

    # -- the owner's answer ------------------------------------------------------------------

    def _on_sync(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        maps, store = self.member.maps, self.member.store
        pid, sender = maps.check_pid(header.get("pid")), header.get("from")
        namespaces, trees = header.get("nss"), header.get("trees")
        if not isinstance(namespaces, list) or not all(isinstance(n, str) and n
                                                       for n in namespaces) or \
                not isinstance(trees, dict):
            raise ProtocolError("a replica sync request names its namespaces and trees")
        table = self.member.cluster.table
        if table.owner(pid) != self.member.info.uuid or \
                table.replica_index(pid, sender) <= 0 or self.member.migrations.migrating(pid):
            self.member.reply_ok(ident, header, busy=True)  # our table disagrees, or moves
            return
        depth = self.config.merkle_tree_depth
        size = MerkleTree.nodes_bytes(depth)
        trees = {ns: t for ns, t in trees.items() if depth and header.get("depth") == depth
                 and ns in namespaces and isinstance(t, bytes) and len(t) == size}
        whole = [ns for ns in namespaces if ns not in trees]
        if whole and len(self.lent) >= self.config.max_parallel_replications:
            self.member.reply_ok(ident, header, busy=True)
            return
        # Differences where the backup sent its tree; whole fragments, lent, elsewhere.
        diffed = maps.diff_namespaces(pid, [ns for ns in namespaces if ns in trees], trees)
        vectors, replaced = diffed.vectors, dict(diffed.leaves)
        parts, loans = [], []
        for ns in whole:
            vectors[ns] = list(maps.versions.get(pid, ns))
            replaced[ns] = None
            loan = store.lend(pid, ns)
            if loan is not None:
                loans.append(loan)
                parts += loan.chunks(float("inf"))
        sid = 0
        if loans:
            sid = next(self._ids)
            self.lent[sid] = (sender, self.member.now() + self.config.backup_sync_interval,
                              loans)
        self.member.reply_ok(ident, header, [p.pack_items(diffed.items)], vectors=vectors,
                             replaced=replaced, parts=parts, sid=sid,
                             records=maps.records_of(pid))

    def _on_done(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        sid = header.get("sid")
        if isinstance(sid, int) and self.lent.get(sid, ("",))[0] == header.get("from"):
            self._release(sid)
        self.member.reply_ok(ident, header)

    def _release(self, sid: int) -> None:
        for loan in self.lent.pop(sid)[2]:
            loan.release()
