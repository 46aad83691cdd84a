"""The member's part in a migration (seed 002 section 2, seed 000 "Fragmented Migration").

- **Data sender** (the partition owner, or the source leaving index 0), on MIGRATE from the
  master: check the request against its table, set the partition's migration flag (writes to
  it are refused with the retryable "migrating" error, reads are served), then send one
  FRAGMENT per namespace (map) to the destination, the next only after the last was
  acknowledged, each with the namespace's replica versions (seed 004). The records do not
  travel over ZeroMQ: the sender lends the namespace's shared-memory arena and an index
  segment (workers/record_store.py ``FragmentLoan``), and the destination copies them with
  bulk reads, in chunks of ``migration_chunk_bytes`` so that heartbeats, backups and other
  partitions go on meanwhile. When the destination
  has them all it answers the master. The flag is cleared when a table raises the partition's
  version past the migration's start: committed (a MOVE's source then drops its data) or
  rolled back. The loans end when the destination has everything, when the migration fails,
  or when the member closes; a killed member's segments are unlinked by the supervisor.
- **Destination**: takes the fragments (replacing whatever it held of the partition), and on
  COMMIT from the master takes the step into its own table; the master applies it only after.
  A rollback (a higher version without it) makes the destination drop what it received.

Every member reports its unresolved migrations to a new master, which rolls back the ones no
member committed (seed 002 section 2.2).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grid import protocol as p
from grid.cluster.migrations import migration_from_wire, migration_to_wire
from grid.errors import ProtocolError
from grid.partition.merkle import MerkleTree
from grid.partition.migration_plan import source_side
from grid.partition.planner import Migration, PlanningError, apply_migration
from workers.map_service import FragmentChunk
from workers.record_store import FragmentLoan, FragmentTransferError, RecordStoreClosedError

if TYPE_CHECKING:
    from workers.node import Node

log = logging.getLogger("shmgrid.migrations")

RETRY_S = 0.1  # a fragment that did not leave, or met a destination whose table is behind
DRAIN_POLL_S = 0.01  # how often a data sender looks whether the partition's writes are done


@dataclass
class Outgoing:
    mid: int
    migration: Migration
    initial_version: int
    reply_to: tuple[bytes, dict[str, Any]]  # the master's MIGRATE request
    fragments: list[list[str]]  # the namespaces of each fragment still to send
    chunks: list[FragmentChunk] = field(default_factory=list)  # the fragment's rest
    current: FragmentChunk | None = None  # the chunk sent, not yet acknowledged
    loans: list[FragmentLoan] = field(default_factory=list)  # what the destination reads
    answered: bool = False  # the master has our answer
    first: bool = True
    retry_at: float | None = None  # a send that did not leave, or a destination behind
    # The destination's Merkle trees of namespaces it already holds (None: not asked yet):
    # those travel as differences (seed 003).
    trees: dict[str, bytes] | None = None


@dataclass
class Incoming:
    mid: int
    migration: Migration
    initial_version: int
    complete: bool = False


class MigrationService:
    def __init__(self, member: Node) -> None:
        self.member = member
        self.outgoing: dict[int, Outgoing] = {}  # pid -> the migration we send
        self.incoming: dict[int, Incoming] = {}  # pid -> the migration we receive
        self.sent_entries = 0  # entries and bytes this member sent in fragments, ever
        self.sent_bytes = 0
        self.in_flight: dict[int, int] = {}  # pid -> bytes of its fragment not yet taken

    def handlers(self) -> dict[str, Any]:
        return {p.MIGRATE: self._on_migrate, p.FRAGMENT: self._on_fragment,
                p.COMMIT: self._on_commit, p.MIGRATION_TREES: self._on_trees}

    def migrating(self, pid: int) -> bool:
        """Whether writes to ``pid`` wait: this member is sending it."""
        return pid in self.outgoing

    def active(self) -> list[list[int]]:
        """[pid, initial version, increment] of every migration not resolved here."""
        runs = [*self.outgoing.values(), *self.incoming.values()]
        return [[r.migration.partition_id, r.initial_version,
                 r.migration.partition_version_increment] for r in runs]

    def on_table_change(self, pids: list[int]) -> None:
        """A table whose version for a partition passed the migration's start resolves it:
        committed or rolled back, the flag goes and the record with it."""
        table = self.member.cluster.table
        for pid in pids:
            run = self.outgoing.get(pid)
            if run is not None and table.version(pid) > run.initial_version:
                del self.outgoing[pid]
                self._release(run)
                if not run.answered:  # the partition changed under the transfer
                    self._answer(run, False, "the partition changed during the transfer")
            arrival = self.incoming.get(pid)
            if arrival is not None and table.version(pid) > arrival.initial_version:
                del self.incoming[pid]

    def _from_master(self, header: dict[str, Any]) -> bool:
        """From the master we follow: not one we hold for gone (its last messages may still
        arrive while a new master collects our state), and not while we claim mastership."""
        cluster = self.member.cluster
        master = cluster.members.master
        return master is not None and header.get("from") == master.uuid and \
            master.uuid not in cluster.dead and not cluster.recovering

    @staticmethod
    def _request(header: dict[str, Any]) -> tuple[int, Migration, int]:
        mid, initial = header.get("mid"), header.get("initial")
        if not isinstance(mid, int) or not isinstance(initial, int):
            raise ProtocolError("a migration message carries mid and initial (ints)")
        try:
            return mid, migration_from_wire(header.get("m")), initial
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None

    # -- the data sender -----------------------------------------------------------------------

    def _on_migrate(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        mid, m, initial = self._request(header)
        pid, me = m.partition_id, self.member.info.uuid
        table = self.member.cluster.table
        refusal = None
        if not self._from_master(header):
            refusal = "not from our master"
        elif table.version(pid) != initial:
            refusal = f"partition {pid} is at version {table.version(pid)}, not {initial}"
        elif source_side(m, table.owner(pid)) != me:
            refusal = f"this member does not send partition {pid}"
        elif pid in self.outgoing or pid in self.incoming:
            refusal = f"partition {pid} has a migration that is not resolved"
        elif m.destination not in self.member.cluster.members:
            refusal = "the destination is not a member"
        if refusal:
            self.member.reply_error(ident, header, p.MIGRATING, refusal)
            return
        namespaces = self.member.store.namespaces(pid)
        # One fragment per namespace, or (fragments disabled) all of them in one.
        fragments = [[ns] for ns in namespaces] \
            if self.member.config.migration_fragments_enabled else [namespaces]
        self.outgoing[pid] = run = Outgoing(mid, m, initial, (ident, header), fragments)
        self._send_when_drained(run)

    def _send_when_drained(self, run: Outgoing) -> None:
        """Writes answered before the flag are all durable (and recorded) before the
        partition leaves: then the snapshot and its invocation records are complete."""
        if self.member.maps.order.busy_partition(run.migration.partition_id):
            run.retry_at = self.member.now() + DRAIN_POLL_S
        else:
            self._send(run)

    def tick(self, now: float) -> None:
        for run in list(self.outgoing.values()):
            if run.retry_at is not None and now >= run.retry_at:
                run.retry_at = None
                if run.first and run.current is None:
                    self._send_when_drained(run)
                else:
                    self._send(run)

    def _ask_trees(self, run: Outgoing) -> None:
        """Before the first fragment: which namespaces the destination holds already (a
        member that rejoined with its files), as Merkle trees; then send."""
        run.trees = {}
        namespaces = sorted(ns for names in run.fragments for ns in names)
        if not self.member.config.merkle_tree_depth or not namespaces:
            self._send(run)
            return
        pid = run.migration.partition_id

        def on_reply(reply: dict[str, Any] | None, _: list[bytes]) -> None:
            if self.outgoing.get(pid) is not run or run.current is not None:
                return
            if reply and reply.get("behind"):  # its table is behind: ask again, shortly
                run.trees, run.retry_at = None, self.member.now() + RETRY_S
                return
            trees = reply.get("trees") if reply and reply.get("ok") else None
            size = MerkleTree.nodes_bytes(self.member.config.merkle_tree_depth)
            if isinstance(trees, dict):
                run.trees = {ns: t for ns, t in trees.items() if ns in namespaces
                             and isinstance(t, bytes) and len(t) == size}
            self._send(run)

        self.member.request_peer(run.migration.destination, p.MIGRATION_TREES,
                                 {"mid": run.mid, "m": migration_to_wire(run.migration),
                                  "initial": run.initial_version, "nss": namespaces},
                                 [], on_reply, timeout=self.member.config.heartbeat_timeout)

    def _send(self, run: Outgoing) -> None:
        """Send the fragment not yet acknowledged, or the next one."""
        pid = run.migration.partition_id
        if run.trees is None:
            self._ask_trees(run)
            return
        if run.current is None:
            if not run.chunks:
                self._release(run)  # the destination has the fragment before
                names = run.fragments.pop(0) if run.fragments else []
                full = [ns for ns in names if ns not in run.trees]
                if full or not names:  # there is always a chunk
                    run.chunks, run.loans = self.member.maps.lend_namespaces(
                        pid, full, self.member.config.migration_chunk_bytes)
                diffed = [ns for ns in names if ns in run.trees]
                if diffed:
                    run.chunks.insert(0, self.member.maps.diff_namespaces(pid, diffed,
                                                                          run.trees))
            run.current = run.chunks.pop(0)
        chunk = run.current
        in_flight = sum(self.in_flight.values())
        if in_flight and \
                in_flight + chunk.size > self.member.config.migration_max_bytes_in_flight:
            run.retry_at = self.member.now() + RETRY_S  # bounded memory: after some are taken
            return
        self.in_flight[pid] = chunk.size
        fields = {"mid": run.mid, "m": migration_to_wire(run.migration),
                  "initial": run.initial_version, "first": run.first,
                  "last": not run.chunks and not run.fragments, "parts": chunk.parts,
                  "vectors": chunk.vectors, "leaves": chunk.leaves, "roots": chunk.roots}
        if run.first:
            fields["records"] = self.member.maps.records_of(pid)
            # What the destination keeps of what it holds: these namespaces, as the
            # differences say (no trees: nothing, every fragment comes whole).
            fields["basis"] = bool(run.trees)
            fields["nss"] = self.member.store.namespaces(pid)
        sent_at = self.member.now()

        def on_ack(reply: dict[str, Any] | None, _: list[bytes]) -> None:
            self.in_flight.pop(pid, None)
            if self.outgoing.get(pid) is not run:
                return
            now = self.member.now()
            if (reply is None and now - sent_at < RETRY_S) or (reply and reply.get("behind")):
                # It did not leave, or the destination's table is behind: again, shortly.
                run.retry_at = now + RETRY_S
            elif reply is None or not reply.get("ok"):
                why = "no answer" if reply is None else reply.get("msg")
                self._answer(run, False, f"the destination did not take a fragment: {why}")
            elif fields["last"]:
                self._taken(chunk)
                self._answer(run, True, "")
            else:
                self._taken(chunk)
                run.current, run.first = None, False
                self._send(run)

        frames = [p.pack_items(chunk.items)] if chunk.leaves else []
        self.member.request_peer(run.migration.destination, p.FRAGMENT, fields, frames, on_ack,
                                 timeout=self.member.config.migration_timeout)

    def _taken(self, chunk: FragmentChunk) -> None:
        self.sent_entries += chunk.entries
        self.sent_bytes += chunk.size

    @staticmethod
    def _release(run: Outgoing) -> None:
        for loan in run.loans:
            loan.release()
        run.loans = []

    def _answer(self, run: Outgoing, ok: bool, why: str) -> None:
        run.answered = True
        self._release(run)
        ident, header = run.reply_to
        if ok:
            self.member.reply_ok(ident, header)
        else:
            log.warning("migration of partition %d failed: %s", run.migration.partition_id, why)
            self.member.reply_error(ident, header, p.MIGRATING, why)
        # The flag stays until a table resolves the migration (the master's commit or its
        # rollback): until then nobody may write here.

    # -- the destination -----------------------------------------------------------------------

    def _on_fragment(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        mid, m, initial = self._request(header)
        pid = m.partition_id
        table = self.member.cluster.table
        vectors, parts = header.get("vectors"), header.get("parts")
        if m.destination != self.member.info.uuid or not isinstance(vectors, dict) or \
                not isinstance(parts, list) or not all(isinstance(x, dict) for x in parts):
            raise ProtocolError("a fragment for another member, or without its parts")
        if table.version(pid) < initial:  # the master's publish has not come yet
            self.member.cluster.ask_for_table()
            self.member.reply_error(ident, header, p.MIGRATING, "behind", behind=True)
            return
        sender = source_side(m, table.owner(pid))
        if header.get("from") != sender or table.version(pid) != initial:
            self.member.reply_error(ident, header, p.MIGRATING,
                                    f"partition {pid} is not at version {initial} here, or "
                                    f"{header.get('from')} does not send it")
            return
        arrival = self.incoming.get(pid)
        leaves = header.get("leaves") or {}
        if not isinstance(leaves, dict) or (leaves and len(frames) != 1):
            raise ProtocolError("a differential fragment has its leaves and one frame")
        if header.get("first"):
            arrival = self.incoming[pid] = Incoming(mid, m, initial)
            store = self.member.store
            if header.get("basis"):  # we keep what we hold, the differences come
                keep = set(header.get("nss") or ())
                for ns in store.namespaces(pid):
                    if ns not in keep:
                        store.clear(pid, ns)
            else:
                store.drop_partition(pid)
            self.member.maps.versions.clear(pid)
            self.member.syncs.requests.forget(pid)  # the fragments bring the owner's state
            self.member.maps.take_records(pid, header.get("records"))
        elif arrival is None or arrival.mid != mid:
            self.member.reply_error(ident, header, p.MIGRATING, "fragment of an unknown migration")
            return
        index = max(m.destination_new_replica_index, 1)
        try:
            self.member.maps.take_chunk(pid, parts, vectors, index, leaves,
                                        p.unpack_items(frames[0]) if leaves else [],
                                        header.get("roots"))
        except (OSError, ValueError, FragmentTransferError, RecordStoreClosedError) as exc:
            # The sender's segments are gone (it died), do not fit, or ours cannot grow.
            self.member.reply_error(ident, header, p.MIGRATING,
                                    f"could not take the fragment of partition {pid}: {exc}")
            return
        arrival.complete = bool(header.get("last"))
        self.member.reply_ok(ident, header)

    def _on_trees(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        """The destination: Merkle trees of the asked namespaces it holds."""
        _, m, initial = self._request(header)
        namespaces = header.get("nss")
        if m.destination != self.member.info.uuid or not isinstance(namespaces, list):
            raise ProtocolError("migration trees are asked of the destination, by namespace")
        store, pid = self.member.store, m.partition_id
        if self.member.cluster.table.version(pid) < initial:
            # The publish of the partition's step before has not come: what we hold may be
            # a replica it took from us, dropped once it comes, and differences taken
            # against it would not fit (the sender asks again shortly).
            self.member.cluster.ask_for_table()
            self.member.reply_error(ident, header, p.MIGRATING, "behind", behind=True)
            return
        held = set(store.namespaces(pid))
        self.member.reply_ok(ident, header, trees={
            ns: bytes(store.tree(pid, ns).nodes) for ns in namespaces if ns in held})

    def _on_commit(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        mid, m, initial = self._request(header)
        pid = m.partition_id
        cluster = self.member.cluster
        version = cluster.table.version(pid)
        arrival = self.incoming.get(pid)
        if version == initial + m.partition_version_increment and arrival is None:
            self.member.reply_ok(ident, header)  # committed before: the answer was lost
            return
        if not self._from_master(header) or arrival is None or arrival.mid != mid or \
                not arrival.complete or version != initial:
            self.member.reply_error(ident, header, p.MIGRATING,
                                    f"cannot commit the migration of partition {pid} here")
            return
        try:
            row = apply_migration(cluster.table.replicas(pid), m)
        except PlanningError as exc:
            self.member.reply_error(ident, header, p.MIGRATING, str(exc))
            return
        cluster.commit_locally(pid, row)
        self.member.reply_ok(ident, header)
