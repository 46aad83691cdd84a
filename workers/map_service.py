"""Map operations on the member: the owner's side (apply, send backups, answer once the
synchronous backups have applied) and the backup's side (check, apply in stream order).

The guarantees, and where each is kept:
- An owner answers a write only after every synchronous backup that its table names applied
  it, or left the partition's replicas in a newer table. Backup operations travel as ordered,
  retransmitted streams (grid/cluster/replication.py): a failed send is sent again, never
  taken for an acknowledgement.
- A write whose backup refuses or does not answer is not answered either: the owner's state is
  the truth and the operation is sent again until the backup applies it or leaves the table.
  If the owner loses the partition meanwhile (it was removed), the write fails with a
  retryable error and the client resends it, with the same invocation id, to the new owner.
- Nobody reads what may yet be lost: an answer about a partition and namespace waits behind
  the writes to it that are not durable yet (grid/cluster/reply_order.py).
- An owner with no synchronous backup for a partition acts alone; it answers only within its
  membership lease (grid/cluster/lease.py), so a removed owner that resumed acks nothing.
- A resent mutating call gets the first outcome: owner and backups remember, per partition,
  what each invocation id returned (grid/cluster/invocations.py).
- A backup applies operations only from the member its own table names as owner; one whose
  table is older than the owner's holds them, in order, until its table catches up.
- A backup promoted to owner may hold writes of the dead owner that another backup missed (or
  lack some that it has): none of them was acknowledged, but readers must not see one replica
  and then another. So before it answers anything about the partition, the new owner sends
  its whole partition to the remaining synchronous backups (a SYNC on each stream).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import and_, lt, rshift
from typing import TYPE_CHECKING, Any, ClassVar

from mypy_extensions import mypyc_attr

from grid import protocol as p
from grid.cluster.chain import ClientConnections, backup_may_answer_batch, owner_may_chain
from grid.cluster.invocations import NOT_RECORDED, InvocationRecords
from grid.cluster.replica_sync import WindowOp
from grid.cluster.replication import Arrival, BackupInbox, BackupStreams, OutgoingOp
from grid.cluster.reply_order import ReplyOrder, Slot, Ticket
from grid.errors import ProtocolError
from grid.partition.merkle import MerkleTree, diff_leaves
from grid.partition.replica_versions import (
    REPLICA_VERSION_COUNT,
    BackupDecision,
    ReplicaVersions,
)
from workers.backup_parts import BackupParts, pack_parts
from workers.record_block import RecordBlock, parse_records, records_frame
from workers.record_store import HASH_SPACE, FragmentLoan, ValueTooLargeError

if TYPE_CHECKING:
    from workers.node import Node

log = logging.getLogger("shmgrid.maps")

PUT_KIND, REMOVE_KIND, CLEAR_KIND, REPLACE_CONTENTS_KIND, SYNC_KIND = (
    "put", "remove", "clear", "replace_contents", "sync")
BACKUP_KINDS = frozenset({PUT_KIND, REMOVE_KIND, CLEAR_KIND, REPLACE_CONTENTS_KIND, SYNC_KIND})
# Calls whose answer is the previous value: a resend must be answered with the first one.
RETURNS_OLD_VALUE = frozenset({p.PUT, p.REMOVE, p.PUT_IF_ABSENT, p.REPLACE})
VALUE_OPS = frozenset({p.PUT, p.SET, p.PUT_IF_ABSENT, p.REPLACE})  # a key and a value
READ_KEY_OPS = p.KEY_OPS - p.WRITE_KEY_OPS  # get, contains
# Beyond this many remembered invocations (over all partitions) the oldest are forgotten
# early: a resend of one of those would be applied again.
MAX_INVOCATION_RECORDS = 250_000


def section(ns: str, pairs: Any) -> list[bytes]:
    """A namespace's entries as items: its name, their count, then keys and values."""
    flat = [part for pair in pairs for part in pair]
    return [ns.encode(), (len(flat) // 2).to_bytes(8, "big"), *flat]


def sections(items: list[bytes]) -> dict[str, list[tuple[bytes, bytes]]]:
    """The entries per namespace of items made by ``section``."""
    out: dict[str, list[tuple[bytes, bytes]]] = {}
    at = 0
    while at < len(items):
        ns, count = items[at].decode(), int.from_bytes(items[at + 1], "big")
        pairs = items[at + 2:at + 2 + 2 * count]
        if len(pairs) != 2 * count:
            raise ProtocolError("a namespace's section is shorter than its count")
        out[ns] = list(zip(pairs[0::2], pairs[1::2], strict=True))
        at += 2 + 2 * count
    return out


@dataclass
class FragmentChunk:
    """One message of a migration fragment: lent record ranges, and versions."""

    parts: list[dict[str, Any]]  # FragmentLoan.chunks descriptions
    vectors: dict[str, list[int]]  # replica versions of the namespaces whose first part is here
    entries: int  # records it completes
    size: int  # arena bytes it covers
    # A differential fragment (seed 003): per namespace the Merkle leaves the destination
    # replaces, and their entries as [name, count, key, value, ...] sections.
    leaves: dict[str, list[int]] = field(default_factory=dict)
    items: list[bytes] = field(default_factory=list)
    # The root of the destination's tree each difference was taken against: it applies them
    # only to that very copy (its table may have dropped it meanwhile).
    roots: dict[str, int] = field(default_factory=dict)


NOT_APPLIED = object()  # a backup operation older than the replica: ignored
OWNERSHIP_CHANGED = "ownership of the partition changed during the write; resend it"


def _cut(items: Any, counts: list[int]) -> list[Any]:
    """``items`` cut into runs of ``counts`` items each."""
    runs, at = [], 0
    for count in counts:
        runs.append(items[at:at + count])
        at += count
    return runs


def _items_frame(parts: list[list[bytes]]) -> bytes:
    """One frame of the items of a backup operation's parts, in order."""
    return p.pack_items(parts[0] if len(parts) == 1 else list(itertools.chain.from_iterable(parts)))


# The simulation watches it, and its broken-protocol tests break it, through subclasses
# (tests/cluster/sim.py): compiled (grid/compiled.py), it must let Python subclass it.
@mypyc_attr(allow_interpreted_subclasses=True)
class MapService:
    records_class: ClassVar[type[InvocationRecords]] = InvocationRecords

    def __init__(self, member: Node) -> None:
        self.member = member
        self.store = member.store
        self.config = member.config
        self.versions = ReplicaVersions()
        self.streams = BackupStreams()
        self.inbox = BackupInbox()
        # A client resends within its invocation timeout of its first attempt, and a record
        # is made after that attempt arrived: keep records that long.
        self.records = self.records_class(keep_s=self.config.invocation_timeout,
                                          max_records=MAX_INVOCATION_RECORDS)
        self.order = ReplyOrder(on_idle=self._on_slots_idle)
        self.in_flight: dict[str, list[Ticket]] = {}  # invocation id -> its writes under way
        self.op_tickets: dict[tuple[str, int], Ticket] = {}  # (backup, stream seq) -> ticket
        # Answers that wait for this member's lease, by id (a ticket is settled again often).
        self.lease_waiting: dict[int, Ticket] = {}
        self.requests = 0  # client map operations served (status: the dashboard's ops/s)
        self.chained_answers = 0  # writes this backup answered in their owner's place
        self.durable_waiting: deque[Ticket] = deque()  # persistence_fsync = always
        self.owned: set[int] = set()  # partitions this member owns in its table
        # Partitions this member loaded from its files and holds no replica of (yet): in a
        # state that lets members rejoin (STABLE_CLUSTER) they are kept, so that the
        # migrations giving them back move only what changed meanwhile (seed 003).
        self.basis: set[int] = set()
        # Tests only (SHMGRID_TEST_DROP_BACKUP_OPS=N in the member): every Nth backup
        # operation is acknowledged but not applied, as if it had been lost.
        self.drop_backup_every = 0
        self._backup_parts_seen = 0
        # Replicas (pid, namespace) whose backup operation failed to apply after its versions
        # were taken: their next operations wait (unacknowledged) until a replica sync.
        self.missing: set[Slot] = set()
        # Tests only (SHMGRID_TEST_ACK_EARLY=1): a broken owner that answers a write before
        # its backups have it, and sends them the operation only on the next retransmit.
        self.ack_early = False
        # Which client greeted us on which connection: a backup answers a chained write
        # there (grid/cluster/chain.py).
        self.clients = ClientConnections()

    def handlers(self) -> dict[str, Any]:
        table = {op: self._on_key_op for op in p.KEY_OPS}
        table.update({
            p.PUT_ALL: self._on_put_all, p.GET_ALL: self._on_get_all, p.SIZE: self._on_size,
            p.CLEAR: self._on_clear, p.ENTRIES: self._on_entries,
            p.REPLACE_CONTENTS: self._on_replace_contents,
        })
        guarded = {op: self._guarded(op, handler) for op, handler in table.items()}
        guarded[p.BACKUP] = self._on_backup  # a backup follows its owner, whatever the state
        guarded[p.HELLO] = self._on_hello
        return guarded

    def _on_hello(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        client_id = header.get("cid")
        if not isinstance(client_id, str) or not 0 < len(client_id) <= 64:
            raise ProtocolError("a hello carries the client id (cid), a str of 1..64")
        self.clients.greeted(client_id, ident)
        self.member.reply_ok(ident, header)

    def _guarded(self, op: str, handler: Any) -> Any:
        """The handler, behind the checks every client map operation passes first."""
        write = op in p.WRITE_OPS

        def checked(ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
            self.requests += 1
            refusal = self._refusal(op, write)
            if refusal:
                self.member.reply_error(ident, header, refusal[0], refusal[1], **refusal[2])
                return
            if header.get("publish"):  # a client on this host reads the map locally
                self.publish(self._ns(header))
            handler(ident, header, frames)
        return checked

    # -- checks ----------------------------------------------------------------------------

    def _refusal(self, op: str, write: bool) -> tuple[str, str, dict[str, Any]] | None:
        cluster = self.member.cluster
        if cluster.is_lite:
            return p.LITE, "lite member", {"member": self.member.name, "op": op}
        if not cluster.ready:
            return p.NOT_READY, "partitions are not assigned yet", {}
        if write and not cluster.state.writes_allowed:
            return p.STATE, "refused in this cluster state", {"op": op,
                                                             "state": cluster.state.value}
        return None

    def check_pid(self, value: Any) -> int:
        """A partition id from a message, or ProtocolError (a bool is not one)."""
        if value.__class__ is not int or not 0 <= value < self.config.partition_count:
            raise ProtocolError(f"partition id {value!r} is out of range")
        return value

    def _owns(self, pid: int) -> bool:
        return self.member.cluster.table.owner(pid) == self.member.info.uuid

    @staticmethod
    def _ns(header: dict[str, Any]) -> str:
        ns = header.get("ns")
        if not isinstance(ns, str) or not ns:
            raise ProtocolError("a map operation needs a namespace (map name)")
        return ns

    @staticmethod
    def _iid(header: dict[str, Any]) -> str | None:
        iid = header.get("iid")
        if iid is not None and (not isinstance(iid, str) or not 0 < len(iid) <= 64):
            raise ProtocolError("an invocation id is a str of 1..64 characters")
        return iid

    # -- answering -------------------------------------------------------------------------

    def _answer_after(self, ident: bytes, header: dict[str, Any], slots: list[Slot],
                      frames: list[bytes], **fields: Any) -> None:
        """Answer now, or once a write to one of ``slots`` that is not durable yet is, and
        only while this member holds its membership lease. A member removed without knowing
        it (it hung, and nobody fenced it) must not answer from its memory: its partitions
        have new owners that take writes. What was read now is current if the lease holds
        at any time from now to the answer (nobody can have removed us before then)."""
        if not self.order.busy(slots) and self.member.cluster.lease_valid():
            self.member.reply(ident, [p.reply_ok(header.get("id"), **fields), *frames])
            return
        ticket = Ticket(slots, [(ident, header.get("id"))], fields, frames)
        ticket.needs_lease = True
        self.order.enqueue(ticket)
        self._settle(ticket)

    def _release(self, slots: tuple[Slot, ...]) -> None:
        for ticket in self.order.release(slots):
            self._answer(ticket)

    def _answer(self, ticket: Ticket) -> None:
        now = self.member.now()
        if ticket.iid is not None:
            under_way = self.in_flight.get(ticket.iid)
            if under_way is not None and ticket in under_way:
                under_way.remove(ticket)
                if not under_way:
                    del self.in_flight[ticket.iid]
            if ticket.failed is None:
                self.records.record(ticket.iid, ticket.written, ticket.outcome, now)
        if ticket.failed is not None:
            code, msg = ticket.failed
            for ident, rid in ticket.waiters:  # applied here, maybe on a backup: resend it
                self.member.reply(ident, [p.reply_error(rid, code, msg, indeterminate=True)])
            return
        for ident, rid in ticket.waiters:
            self.member.reply(ident, [p.reply_ok(rid, **ticket.fields), *ticket.frames])

    def on_durable(self) -> None:
        """The log's writer made more records durable: answer the writes waiting for them
        (in log order, which is the order they were applied)."""
        journal = self.member.journal
        if journal is None:
            return
        failure = None if journal.log is None else journal.log.failure
        if failure is not None:
            for ticket in self.durable_waiting:
                ticket.fail(p.SERVER, f"the member's log failed: {failure}")
        durable = journal.durable_seq
        waiting = self.durable_waiting
        while waiting and (waiting[0].log_seq <= durable or waiting[0].failed):
            ticket = waiting.popleft()
            ticket.log_seq = 0
            self._settle(ticket)

    def _settle(self, ticket: Ticket) -> None:
        """Re-check a ticket whose conditions changed; answer what became answerable."""
        if ticket.failed is None and ticket.needs_lease and not ticket.waiting:
            if self.member.cluster.lease_valid():
                ticket.needs_lease = False
            elif id(ticket) not in self.lease_waiting:
                self.lease_waiting[id(ticket)] = ticket
                self.member.cluster.ask_for_lease()
        if ticket.ready:
            self._release(ticket.slots)

    def _resent(self, ident: bytes, header: dict[str, Any], slot: Slot, iid: str | None) -> bool:
        """A resend of a call seen before: answer it as the first was (or will be)."""
        if iid is None:
            return False
        pid = slot[0]
        outcome = self.records.get(pid, iid)
        if outcome is not NOT_RECORDED:
            # Recorded here as a backup, perhaps: answer once the partition is durable.
            self._answer_after(ident, header, [slot], [] if outcome is None else [outcome])
            return True
        ticket = self._under_way(pid, iid)
        if ticket is not None:
            ticket.waiters.append((ident, header.get("id")))
            return True
        return False

    def _under_way(self, pid: int, iid: str) -> Ticket | None:
        """The write of invocation ``iid`` to partition ``pid`` that is not durable yet."""
        for ticket in self.in_flight.get(iid, ()):
            if pid in ticket.written:
                return ticket
        return None

    # -- one key ---------------------------------------------------------------------------

    def _on_key_op(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        op = header["op"]
        pid, ns = self.check_pid(header.get("pid")), self._ns(header)
        if not self._owns(pid):
            self.member.reply_error(ident, header, p.WRONG_TARGET, f"not the owner of {pid}",
                                    rows=self._moved([pid]))
            return
        frames_wanted = 2 if op in VALUE_OPS else 1
        if len(frames) != frames_wanted:
            raise ProtocolError(f"{op} takes {frames_wanted} frames")
        key = frames[0]
        store = self.store
        slots = [(pid, ns)]
        if op in READ_KEY_OPS:
            if self.config.migration_stale_read_disabled and \
                    self.member.migrations.migrating(pid):  # (we own it: checked above)
                self.member.reply_error(ident, header, p.MIGRATING,
                                        f"partition {pid} is migrating")
            elif op == p.GET:
                value = store.get(pid, ns, key)
                self._answer_after(ident, header, slots, [] if value is None else [value])
            else:  # CONTAINS
                self._answer_after(ident, header, slots, [], found=store.contains(pid, ns, key))
            return
        iid = self._iid(header)
        if self._resent(ident, header, (pid, ns), iid):
            return
        if self.member.migrations.migrating(pid):
            self.member.reply_error(ident, header, p.MIGRATING, f"partition {pid} is migrating")
            return
        old, changed = None, True
        try:
            if op in (p.PUT, p.SET):
                old = store.put(pid, ns, key, frames[1])
            elif op == p.PUT_IF_ABSENT:
                old = store.get(pid, ns, key)
                changed = old is None
                if changed:
                    store.put(pid, ns, key, frames[1])
            elif op == p.REPLACE:
                old = store.get(pid, ns, key)
                changed = old is not None
                if changed:
                    store.put(pid, ns, key, frames[1])
            else:  # REMOVE, DELETE
                old = store.remove(pid, ns, key)
                changed = old is not None
        except ValueTooLargeError as exc:
            self.member.reply_error(ident, header, p.TOO_LARGE, str(exc),
                                    size=len(key) + len(frames[-1]),
                                    limit=self.config.max_value_bytes)
            return
        answer = [] if old is None else [old]
        if not changed:  # nothing to replicate, but the answer reports what it saw
            self._answer_after(ident, header, slots, answer)
            return
        ticket = Ticket(slots, [(ident, header.get("id"))], frames=answer,
                        outcome=old if op in RETURNS_OLD_VALUE else None)
        kind, items = (REMOVE_KIND, [key]) if op in (p.REMOVE, p.DELETE) else \
            (PUT_KIND, [key, frames[1]])
        client_id = header.get("cid")
        chain = [pid, client_id, header.get("id")] if client_id.__class__ is str else None
        self._replicate(ticket, ns, kind, {pid: items}, iid, op in RETURNS_OLD_VALUE,
                        chain=chain)

    # -- partitions ------------------------------------------------------------------------

    def _pids(self, header: dict[str, Any]) -> list[int]:
        pids = header.get("pids")
        if not isinstance(pids, list):
            raise ProtocolError("pids must be a list")
        for pid in pids:
            self.check_pid(pid)
        return pids

    def _moved(self, pids: list[int]) -> list[list[Any]]:
        """Our rows of the partitions we do not own, [pid, version, replicas] each: a client
        whose table is older goes straight to the new owner (as Redis Cluster's MOVED does)
        instead of waiting and fetching the whole table."""
        table = self.member.cluster.table
        return [[pid, table.version(pid), list(table.replicas(pid))]
                for pid in pids if not self._owns(pid)]

    def _wrong(self, wrong: list[int]) -> dict[str, Any]:
        """The reply fields for the partitions a batch did not serve here."""
        return {"wrong": wrong, "rows": self._moved(wrong)} if wrong else {"wrong": wrong}

    def _split(self, pids: list[int], write: bool) -> tuple[list[int], list[int]]:
        """The partitions served now: owned here, and not held by a migration (writes wait
        for one; reads too if migration_stale_read_disabled). The client sends the rest
        again, as it does partitions that moved. ``pids`` are checked already. Mostly a
        batch's partitions are all ours and none migrates: two set operations say so;
        otherwise the table's rows are read in line (a batch of 100 keys has 80
        partitions)."""
        me = self.member.info.uuid
        table = self.member.cluster.table
        outgoing = self.member.migrations.outgoing \
            if write or self.config.migration_stale_read_disabled else None
        if table.owned_by(me).issuperset(pids) and (
                not outgoing or outgoing.keys().isdisjoint(pids)):
            return list(pids), []
        served, wrong = [], []
        rows = table.live_rows()[0]
        for pid in pids:
            if rows[pid][0] == me and not (outgoing and pid in outgoing):
                served.append(pid)
            else:
                wrong.append(pid)
        return served, wrong

    def _grouped_items(self, header: dict[str, Any], frames: list[bytes]
                       ) -> tuple[dict[int, list[bytes] | RecordBlock], Any]:
        """A put_all's items (a key and a value an entry) grouped by partition, and all of
        them (a list, or a RecordBlock), as the
        header's counts say, checked: every partition id in range and named once, every
        count an int >= 0, and the counts add up to the items. (The checks are made inline:
        this runs for every partition of every batch.) The payload may be records, laid out
        as the store keeps them (``laid_out``: workers/record_block.py), cut by partition as
        items are."""
        pids, counts = header.get("pids"), header.get("counts")
        if counts.__class__ is not list or pids.__class__ is not list \
                or len(counts) != len(pids) or len(frames) != 1:
            raise ProtocolError("a batch needs pids, counts of the same length and one payload")
        partition_count = self.config.partition_count
        total = 0
        for pid, count in zip(pids, counts, strict=True):
            if count.__class__ is not int or count < 0:  # (class tests: a bool is no count)
                raise ProtocolError("counts must be non-negative ints")
            if pid.__class__ is not int or not 0 <= pid < partition_count:
                self.check_pid(pid)  # raises
            total += count
        items: Any = parse_records(frames[0], total) if header.get("laid_out") \
            else p.unpack_items(frames[0])
        if 2 * total != len(items):
            raise ProtocolError("batch counts do not match the payload")
        if len(set(pids)) != len(pids):
            raise ProtocolError("a batch names a partition twice")
        groups, at = {}, 0
        for pid, count in zip(pids, counts, strict=True):
            end = at + 2 * count
            groups[pid] = items[at:end]
            at = end
        return groups, items

    def _partition_write(self, ident: bytes, header: dict[str, Any], ns: str,
                         pids: list[int], wrong: list[int],
                         extra_slots: tuple[str, ...] = ()
                         ) -> tuple[Ticket, list[int], str | None]:
        """The common start of a write to whole partitions: the ticket to answer with, the
        partitions to apply it to now (not the ones an earlier attempt of the same
        invocation did or is doing: the ticket waits behind those instead), and the
        invocation id."""
        iid = self._iid(header)
        names = [ns, *extra_slots]
        ticket = Ticket(zip(pids, repeat(ns)) if not extra_slots else
                        [(pid, name) for pid in pids for name in names],
                        [(ident, header.get("id"))], self._wrong(wrong))
        if iid is None or (iid not in self.records and iid not in self.in_flight):
            return ticket, pids, iid  # a first attempt: nothing of it was applied yet
        fresh = [pid for pid in pids if self.records.get(pid, iid) is NOT_RECORDED
                 and self._under_way(pid, iid) is None]
        return ticket, fresh, iid

    def _on_put_all(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        ns = self._ns(header)
        groups, items = self._grouped_items(header, frames)
        # Refuse a too large entry before anything is applied: a refusal half way would leave
        # the partitions before it written here and on no backup.
        limit = self.config.max_value_bytes
        if len(frames[0]) > limit:  # else no entry of the payload can be larger
            for group in groups.values():
                size = group.largest() if isinstance(group, RecordBlock) else max(
                    (len(group[i]) + len(group[i + 1]) for i in range(0, len(group), 2)),
                    default=0)
                if size > limit:
                    self.member.reply_error(ident, header, p.TOO_LARGE,
                                            f"an entry of {size} bytes", size=size,
                                            limit=limit)
                    return
        owned, wrong = self._split(list(groups), write=True)
        owned = [pid for pid in owned if groups[pid]]
        ticket, fresh, iid = self._partition_write(ident, header, ns, owned, wrong)
        if len(fresh) == len(groups) and items.__class__ is not RecordBlock:
            self.store.put_runs(ns, header["pids"], header["counts"], items)  # as it came
        else:
            if len(fresh) != len(groups):  # (else they are the same partitions)
                groups = {pid: groups[pid] for pid in fresh}
            self.store.put_groups(ns, list(groups.items()))
        # Its backup may answer a first attempt (a resend's ticket waits on earlier ones).
        client_id = header.get("cid")
        chain = [None, client_id, header.get("id")] \
            if client_id.__class__ is str and len(fresh) == len(owned) else None
        self._replicate(ticket, ns, PUT_KIND, groups, iid, False, chain=chain)

    def _on_clear(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        ns = self._ns(header)
        owned, wrong = self._split(self._pids(header), write=True)
        ticket, fresh, iid = self._partition_write(ident, header, ns, owned, wrong)
        for pid in fresh:
            self.store.clear(pid, ns)
        self._replicate(ticket, ns, CLEAR_KIND, {pid: [] for pid in fresh},
                        iid, False)

    def _on_replace_contents(self, ident: bytes, header: dict[str, Any],
                             frames: list[bytes]) -> None:
        """Replace the target map's fragment of each partition with this map's (which empties):
        the publish step of a staged overwrite. Both fragments change, so both namespaces'
        replica versions move."""
        ns, target = self._ns(header), header.get("target")
        if not isinstance(target, str) or not target or target == ns:
            raise ProtocolError("replace_contents needs a target map other than the source")
        owned, wrong = self._split(self._pids(header), write=True)
        ticket, fresh, iid = self._partition_write(ident, header, ns, owned, wrong, (target,))
        for pid in fresh:
            self.store.move_fragment(pid, ns, target)
        self._replicate(ticket, ns, REPLACE_CONTENTS_KIND,
                        {pid: [target.encode()] for pid in fresh}, iid, False,
                        target)

    def _on_get_all(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        """The present entries among a batch of keys, each named with its partition (the
        header's ``pids``, one per key, in the keys' order, or one for all of them: the
        client sends a member its keys as it finds their owner, without grouping them by
        partition)."""
        ns = self._ns(header)
        pids, keys = header.get("pids"), None
        if pids.__class__ is list and len(frames) == 1:
            keys = p.unpack_items(frames[0])
        if not isinstance(pids, list) or keys is None \
                or len(pids) != len(keys) and not (len(pids) == 1 and keys):
            raise ProtocolError("a get_all needs a partition id per key (or one for all of "
                                "them) and one payload")
        if pids and (not set(map(type, pids)) <= {int}  # (type: a bool is no partition id)
                     or min(pids) < 0 or max(pids) >= self.config.partition_count):
            raise ProtocolError("partition ids are ints in range")
        served, wrong = self._split(list(set(pids)), write=False)
        found = self.store.found_in(ns, pids, keys, set(wrong))
        self._answer_after(ident, header, [(pid, ns) for pid in served], [b"".join(found)],
                           n=len(found), **self._wrong(wrong))

    def _on_size(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        ns = self._ns(header)
        owned, wrong = self._split(self._pids(header), write=False)
        self._answer_after(ident, header, [(pid, ns) for pid in owned], [],
                           size=sum(self.store.size(pid, ns) for pid in owned),
                           **self._wrong(wrong))

    def _on_entries(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        """The entries of the asked partitions: per partition one frame, its serialized keys
        and values laid end to end (the client decodes a frame in one call).

        With ``max_bytes``, a scan in chunks: each partition is read from the key hash that
        ``from`` gives it, until the reply holds about ``max_bytes`` (at least one record);
        ``next`` says per partition where its next chunk starts (None: it is done). Without,
        every partition comes whole."""
        ns = self._ns(header)
        pids = self._pids(header)
        max_bytes, lows = header.get("max_bytes"), header.get("from")
        if max_bytes is not None:
            if not isinstance(max_bytes, int) or max_bytes < 1 or not isinstance(lows, list) \
                    or len(lows) != len(pids) or not all(
                        isinstance(low, int) and 0 <= low < HASH_SPACE for low in lows):
                raise ProtocolError("a chunked scan needs max_bytes >= 1 and a start hash "
                                    "(from) per partition")
            low_of = dict(zip(pids, lows, strict=True))
        owned, wrong = self._split(pids, write=False)
        payload, counts, bounds = [], [], []
        budget = max_bytes
        for pid in owned:
            if budget is None:
                data, records = self.store.concatenated(pid, ns)
            elif budget <= 0 or (max_bytes is not None and budget < max_bytes and low_of[pid] == 0
                                 and self.store.live_bytes(pid, ns) > budget):
                # The reply is full, or too full for this partition to start in it: it waits
                # for a reply of its own, where it comes whole if it fits in max_bytes.
                data, records, bound = b"", 0, low_of[pid]
            else:
                data, records, bound = self.store.concatenated_from(pid, ns, low_of[pid],
                                                                    budget)
                budget -= len(data)
            payload.append(data)
            counts.append(records * 2)  # items: a key and a value each
            if budget is not None:
                bounds.append(bound)
        chunked = {} if max_bytes is None else {"next": bounds}
        self._answer_after(ident, header, [(pid, ns) for pid in owned], payload, pids=owned,
                           counts=counts, **chunked, **self._wrong(wrong))

    # -- replication: the owner's side -----------------------------------------------------

    def _backup_targets(self, pid: int) -> tuple[list[str], list[str]]:
        replicas = self.member.cluster.table.replicas(pid)
        sync_count, async_count = self.config.backup_count, self.config.async_backup_count
        sync = [r for r in replicas[1:1 + sync_count] if r]
        asynchronous = [r for r in replicas[1 + sync_count:1 + sync_count + async_count] if r]
        return sync, asynchronous

    def _replicate(self, ticket: Ticket, ns: str, kind: str,
                   items_by_pid: dict[int, Any], iid: str | None, want_old: bool,
                   target: str | None = None, chain: list[Any] | None = None) -> None:
        """Send one backup operation per backup member (on its ordered stream, if it is a
        synchronous one); the ticket is answered when the synchronous ones applied it.
        ``chain`` ([pid, client id, request id] of a single-key write; [None, client id,
        request id] of a batch) lets the backup answer the client in our place, where
        grid/cluster/chain.py allows it: a batch only when one backup holds all of it."""
        sync_count = self.config.backup_count
        async_count = self.config.async_backup_count
        sync_end, async_end = 1 + sync_count, 1 + sync_count + async_count
        rows, table_versions = self.member.cluster.table.live_rows()
        pids = list(items_by_pid)
        increment = self.versions.increment_many
        vectors = increment(pids, ns, sync_count + async_count)
        targets = None if target is None else increment(pids, target, sync_count + async_count)
        sync_groups: dict[str, tuple[list[int], list[Any]]] = {}
        async_groups: dict[str, tuple[list[int], list[Any]]] = {}
        journal = self.member.journal
        durable_wait = journal is not None and self.config.persistence_fsync == "always"
        ticket.written.update(pids)
        track = not self.ack_early
        # Every partition's synchronous backups, while each has one (the backup answers only
        # for all of the write; not an answer that says more than ok: "wrong" partitions).
        chain_to: set[str] | None = \
            set() if chain is not None and track and not any(ticket.fields.values()) else None
        # Each backup's payload: its partitions' items in one frame, or a put_all's records
        # (workers/record_block.py) cut from its frame.
        records = bool(pids) and items_by_pid[pids[0]].__class__ is RecordBlock
        fields: dict[str, Any] = {"ns": ns, "kind": kind}
        if records:
            fields["laid_out"] = True
        if iid is not None:
            fields["iid"] = iid
        if want_old:
            fields["old"] = True
        payload_of = records_frame if records else _items_frame
        # (A batch of 100 keys has 80 partitions: the table's rows are read in line.)
        group_of = sync_groups.get
        for pid, items in items_by_pid.items():
            for uuid in rows[pid][1:sync_end]:
                if uuid is None:
                    continue
                group = group_of(uuid)
                if group is None:
                    sync_groups[uuid] = ([pid], [items])
                else:
                    group[0].append(pid)
                    group[1].append(items)
            if async_count:
                for uuid in rows[pid][sync_end:async_end]:
                    if uuid:
                        group = async_groups.setdefault(uuid, ([], []))
                        group[0].append(pid)
                        group[1].append(items)
        if pids and (not sync_count or (
                sum(len(group[0]) for group in sync_groups.values()) < len(pids) * sync_count
                and not all(any(rows[pid][1:sync_end]) for pid in pids))):
            ticket.needs_lease = True  # a partition nobody else will hold: we act alone
            chain_to = None
        elif chain_to is not None:
            chain_to.update(sync_groups)
        if chain_to and owner_may_chain(len(chain_to), len(ticket.waiters), durable_wait):
            ticket.chained = True
        if iid is not None and items_by_pid:
            ticket.iid = iid
            self.in_flight.setdefault(iid, []).append(ticket)
        if durable_wait and journal is not None and journal.last_seq > journal.durable_seq:
            ticket.log_seq = journal.last_seq  # answered once the log has it on disk
            self.durable_waiting.append(ticket)
        self.order.enqueue(ticket)
        now = self.member.now()
        vector_of = dict(zip(pids, vectors, strict=True))
        target_of = None if targets is None else dict(zip(pids, targets, strict=True))

        def packed(group: tuple[list[int], list[Any]]) -> dict[str, Any]:
            group_pids = group[0]
            return {**fields, "pp": pack_parts(
                group_pids, list(map(len, group[1])),
                list(map(table_versions.__getitem__, group_pids)),
                list(map(vector_of.__getitem__, group_pids)),
                None if target_of is None else list(map(target_of.__getitem__, group_pids)))}

        for uuid, group in sync_groups.items():
            op_fields = packed(group)
            if track:
                ticket.waiting[uuid] = set(group[0])
            if ticket.chained:
                op_fields["answer"] = chain
            op = self.streams.add(uuid, op_fields, [payload_of(group[1])], now, group[0])
            if track:
                self.op_tickets[(uuid, op.seq)] = ticket
                self._send_backup(uuid, op)  # (ack_early: it leaves on the retransmit)
        for uuid, group in async_groups.items():
            # Asynchronous: nobody waits, a lost one is for replica sync to repair.
            self.member.tell_peer(uuid, p.BACKUP, packed(group), [payload_of(group[1])])
        self._settle(ticket)

    def _send_backup(self, uuid: str, op: OutgoingOp) -> None:
        def on_ack(header: dict[str, Any] | None, frames: list[bytes]) -> None:
            self._on_backup_ack(uuid, op.seq, header)

        self.member.request_peer(uuid, p.BACKUP, dict(op.fields), op.frames, on_ack,
                                 timeout=self.config.heartbeat_timeout)

    def _on_backup_ack(self, uuid: str, seq: int, header: dict[str, Any] | None) -> None:
        if header is None:  # not sent, or no answer: send the stream's backlog again soon
            self.streams.send_failed(uuid, self.member.now())
            return
        if not header.get("ok"):
            log.warning("backup %s answered %s: %s; sending again", uuid, header.get("code"),
                        header.get("msg"))
            return
        op = self.streams.acked(uuid, seq)
        ticket = self.op_tickets.pop((uuid, seq), None)
        if op is None or ticket is None:
            return
        if header.get("answered") and ticket.chained:  # the backup answered our caller
            ticket.chained = False
            ticket.waiters.pop(0)
        refused = header.get("refused")
        waiting = ticket.waiting.get(uuid)
        if waiting is not None:
            waiting.difference_update(set(op.pids).difference(refused) if refused else op.pids)
            if not waiting:
                del ticket.waiting[uuid]
        if refused:
            # Its table disagrees with ours and is not older: ours is, and the table that
            # tells us decides this write (a fail, or this backup no longer a replica).
            log.info("backup %s refused partitions %s", uuid, sorted(refused)[:5])
        self._settle(ticket)

    def on_table_change(self, pids: list[int]) -> None:
        """React to a newer table: drop partitions we no longer hold, settle writes whose
        backups changed, fail writes whose partition we no longer own, and take held backup
        operations that the new table lets us judge."""
        cluster = self.member.cluster
        was_ready = cluster.ready
        cluster.ready = cluster.joined and cluster.table.is_assigned()
        me = self.member.info.uuid
        table = cluster.table
        self.publish_ownership()  # first: no local read of what we may no longer own
        held = set(self.store.partitions())
        arriving = self.store.arriving_partitions()
        promoted = []
        keep_basis = cluster.state.rejoin_allowed
        for pid in pids:
            if (pid in held or pid in arriving) and table.replica_index(pid, me) < 0:
                if keep_basis and pid in self.basis:
                    continue
                self.basis.discard(pid)
                self.store.drop_partition(pid)
                self.versions.clear(pid)
                self.records.forget_partition(pid)
            elif pid in self.basis:
                self.basis.discard(pid)  # a replica now: what it holds is the replica's
            if table.owner(pid) != me:
                self.owned.discard(pid)
            elif pid not in self.owned:
                self.owned.add(pid)
                # (Holding nothing of it, too: its backups may hold what we do not. Not in
                # the first table, where nobody holds anything.)
                if pid in held or was_ready:
                    promoted.append(pid)
        self._recheck_pending(set(pids))
        self._process_held()
        for pid in promoted:
            self._sync_backups(pid)
        self.publish_ownership()

    def _sync_backups(self, pid: int) -> None:
        """Send the whole partition, as this new owner holds it, to its synchronous backups;
        answers about the partition wait until they have it."""
        sync, _ = self._backup_targets(pid)
        if not sync:
            return
        # Sent also when we hold nothing of it: a backup may hold writes that reached it and
        # not us (the old owner died while sending them), and no version shows that, since
        # its index moved up (seed 004's vectors take a lower index to hold all a higher one
        # does). It becomes a copy of ours, records included (the invocation records it kept
        # of those writes would answer a resend that nothing holds any more).
        namespaces = self.store.namespaces(pid)
        total = self.config.backup_count + self.config.async_backup_count
        for ns in namespaces:
            self.versions.increment(pid, ns, total)
        items, vectors = self.encode_namespaces(pid, namespaces)
        ticket = Ticket([(pid, ns) for ns in namespaces], [])
        ticket.written.add(pid)
        ticket.waiting = {uuid: {pid} for uuid in sync}
        parts = pack_parts([pid], [len(items)], [self.member.cluster.table.version(pid)],
                           [[0] * REPLICA_VERSION_COUNT])
        self.order.enqueue(ticket)
        fields = {"ns": namespaces[0] if namespaces else "", "kind": SYNC_KIND, "pp": parts,
                  "vectors": vectors, "records": self.records_of(pid)}
        frames = [p.pack_items(items)]
        now = self.member.now()
        for uuid in sync:
            op = self.streams.add(uuid, fields, frames, now, [pid])
            self.op_tickets[(uuid, op.seq)] = ticket
            self._send_backup(uuid, op)
        log.info("partition %d: promoted here; syncing %d namespaces to %d backups", pid,
                 len(namespaces), len(sync))

    def on_members_change(self, left: set[str]) -> None:
        for uuid in left:
            self.streams.drop(uuid)
            self.inbox.forget(uuid)
            for key in [k for k in self.op_tickets if k[0] == uuid]:
                del self.op_tickets[key]
        self._recheck_pending(None)

    def _recheck_pending(self, pids: set[int] | None) -> None:
        cluster = self.member.cluster
        table, members, me = cluster.table, cluster.members, self.member.info.uuid
        sync_count = self.config.backup_count
        for ticket in list(self.order.pending()):
            if ticket.failed is not None:
                continue
            ticket_pids = {slot[0] for slot in ticket.slots}
            if pids is not None and not ticket_pids & pids:
                continue
            moved = [pid for pid in ticket_pids if table.owner(pid) != me]
            if moved and not self._moved_away(ticket, moved, len(ticket_pids)):
                ticket.fail(p.WRONG_TARGET, OWNERSHIP_CHANGED)
                self._release(ticket.slots)
                continue
            for uuid, waiting in list(ticket.waiting.items()):
                # A backup that left the partition's replicas (or the cluster) no longer
                # decides: the write is safe on the replicas that remain.
                waiting.intersection_update(
                    pid for pid in waiting
                    if uuid in members and 0 < table.replica_index(pid, uuid) <= sync_count)
                if not waiting:
                    del ticket.waiting[uuid]
            if any(not self._backup_targets(pid)[0] for pid in ticket.written):
                ticket.needs_lease = True  # a partition lost every backup: we act alone
            self._settle(ticket)

    def _moved_away(self, ticket: Ticket, moved: list[int], partitions: int) -> bool:
        """A batch write (its answer names the partitions it did not write here: "wrong")
        some of whose partitions stopped being ours: answer those "wrong", so that the
        client sends them to their new owners (with the same invocation id, as after a
        failed answer), and go on with the rest, answered and recorded once their backups
        have them; the answer says "indeterminate": the partitions answered "wrong" may have
        been applied. Failing it all would leave the rest applied here without the record
        that answers their resend: it would be applied again. False, changing nothing, for a
        ticket that must fail whole: not a batch, a batch with no partition left here or
        none written, or one its backup answers in our place (it answers for all of it)."""
        wrong = ticket.fields.get("wrong")
        if wrong is None or ticket.chained or len(moved) >= partitions:
            return False
        gone = set(moved).difference(wrong)
        if not gone:
            return True  # (answered "wrong" already)
        if not ticket.written - gone:
            return False
        ticket.written -= gone
        for uuid, waiting in list(ticket.waiting.items()):
            waiting -= gone
            if not waiting:
                del ticket.waiting[uuid]
        ticket.fields.update(self._wrong(sorted({*wrong, *gone})), indeterminate=True)
        return True

    def tick(self, now: float) -> None:
        cluster = self.member.cluster
        if self.basis and cluster.ready and not cluster.state.rejoin_allowed:
            basis, self.basis = sorted(self.basis), set()
            self.on_table_change(basis)  # no reclaim comes: what we hold no replica of goes
        for uuid, ops in self.streams.due(now):
            for op in ops:
                self._send_backup(uuid, op)
        self.on_lease_renewed()
        if self.lease_waiting:
            self.member.cluster.ask_for_lease()  # the last ask may have gone to a dead master
        self.records.expire(now)
        if self.store.loading:
            self._on_slots_idle(self.store.loads_over())  # bulk loads over: settled now

    def on_lease_renewed(self) -> None:
        """Answers that wait for this member's lease may go now."""
        self.renew_local_reads()
        if self.lease_waiting and self.member.cluster.lease_valid():
            waiting, self.lease_waiting = self.lease_waiting, {}
            for ticket in waiting.values():
                self._settle(ticket)

    # -- local reads (workers/local_reads.py) ----------------------------------------------

    def renew_local_reads(self) -> None:
        """Tell local readers until when they may trust this member: its membership lease
        (nobody can remove it before), but not at all once it asked to leave, since the
        master may then remove it at any moment, however recently it heard from it."""
        local = self.store.local
        if local is not None:
            cluster = self.member.cluster
            local.renew(-math.inf if cluster.leave_started is not None
                        else cluster.lease_until())

    def publish(self, ns: str) -> None:
        """A client on this host reads ``ns`` locally: publish its fragments, and settle
        the slots of the partitions this member owns where no write waits."""
        local = self.store.local
        if local is None or local.slots_of(ns) is not None or not self.store.publish(ns):
            return
        log.info("map %r: published for local reads", ns)
        for pid in self.owned:
            self._on_slot_idle((pid, ns), check=True)

    def _on_slots_idle(self, slots: list[Slot]) -> None:
        """No answer about these slots waits any more (``_on_slot_idle``); only slots of a
        published map have anything to settle (a batch of 100 keys leaves 80 idle)."""
        local = self.store.local
        if local is None or not local.namespaces:
            return
        published, owned = local.namespaces, self.owned
        for pid, ns in slots:
            if ns in published and pid in owned:
                self.store.settle(pid, ns)

    def _on_slot_idle(self, slot: Slot, check: bool = False) -> None:
        """No answer about ``slot`` waits any more: what it holds is what a get answers
        (if we own it: a slot is settled only while its partition is ours)."""
        if not (check and self.order.busy((slot,))):
            self._on_slots_idle([slot])

    def publish_ownership(self) -> None:
        """Which partitions local readers may read here: those we own (by ``owned``; ready,
        not lite). One that stops being served is unsettled at once, so that it is settled
        again only by what happens once it is ours again (a promotion's sync first)."""
        local = self.store.local
        if local is None:
            return
        cluster = self.member.cluster
        me = self.member.info.uuid
        serving = cluster.ready and not cluster.is_lite
        table = cluster.table
        for pid in range(self.config.partition_count):
            owned = serving and pid in self.owned and table.owner(pid) == me
            if owned == bool(local.served[pid]):
                continue
            if owned:
                self.store.share(pid, True)  # its shared indexes, before it is served
                local.set_served(pid, True)
                for ns in local.namespaces:  # with a fragment here or not (all absent)
                    self._on_slot_idle((pid, ns), check=True)
            else:
                local.set_served(pid, False)
                local.unsettle(pid)
                self.store.share(pid, False)

    def owned_sizes(self) -> dict[str, int]:
        """Entries per map in the partitions this member owns (the dashboard's map sizes)."""
        sizes: dict[str, int] = {}
        for pid in self.owned:
            for ns in self.store.namespaces(pid):
                sizes[ns] = sizes.get(ns, 0) + self.store.size(pid, ns)
        return sizes

    def unbacked_partitions(self) -> int:
        """Owned partitions that have no synchronous backup: writes to them rest on this
        member alone."""
        table, me = self.member.cluster.table, self.member.info.uuid
        return sum(1 for pid in range(table.partition_count)
                   if table.owner(pid) == me and not self._backup_targets(pid)[0])

    # -- replication: the backup's side ----------------------------------------------------

    def _parse_backup(self, header: dict[str, Any], frames: list[bytes]) -> BackupParts:
        """A backup operation's parts (workers/backup_parts.py), checked, and kept in its
        header as ``parts`` (an operation held until our table catches up is judged from
        its header later); ProtocolError for a malformed one."""
        kind = header.get("kind")
        if kind != SYNC_KIND:  # (a sync names its namespaces in its items: maybe none)
            self._ns(header)
        if kind not in BACKUP_KINDS or len(frames) != 1:
            raise ProtocolError("malformed backup")
        parts = BackupParts.unpack(header.get("pp"), kind == REPLACE_CONTENTS_KIND,
                                   self.config.partition_count)
        iid = header.get("iid")
        if iid is not None and iid.__class__ is not str:
            raise ProtocolError("an invocation id is a str")
        if header.get("old", False).__class__ is not bool:
            raise ProtocolError("a backup's old is a bool")
        if kind == SYNC_KIND and not isinstance(header.get("vectors"), dict):
            raise ProtocolError("a sync carries the owner's version vector per namespace")
        answer = header.get("answer")
        if answer is not None and (not isinstance(answer, list) or len(answer) != 3
                                   or answer[1].__class__ is not str):
            raise ProtocolError("a chained answer is [pid, client id, request id]")
        header["parts"] = parts
        return parts

    def _on_backup(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        parts = self._parse_backup(header, frames)
        sender, seq = header.get("from"), header.get("seq")
        if not isinstance(sender, str):
            raise ProtocolError("a backup names its sender")
        # A sender our table does not name as owner is refused part by part (unless our
        # table is older: then we hold its operations until we know).
        if seq is None:  # an asynchronous backup: no stream, and no answer (nobody awaits
            self._apply_backup_op(header, frames)  # one; replica sync repairs what is lost)
            return
        if not isinstance(seq, int):
            raise ProtocolError("a backup's seq is an int")
        arrival, result = self.inbox.arrive(sender, seq)
        if arrival == Arrival.DUPLICATE:
            refused = result if result is not None else parts.pids
            self.member.reply_ok(ident, header, refused=refused)
        elif arrival == Arrival.PENDING:
            self.inbox.replace_held(sender, seq, (ident, header, frames))
        elif arrival == Arrival.HOLD or (arrival == Arrival.PROCESS and self._behind(parts)):
            self.inbox.hold(sender, seq, (ident, header, frames))
            self.member.cluster.ask_for_table()
        elif arrival == Arrival.PROCESS and self.missing and self._awaits_sync(header):
            self.inbox.hold(sender, seq, (ident, header, frames))
        elif arrival == Arrival.PROCESS:
            self._process(sender, seq, ident, header, frames)
        # Arrival.GAP: dropped; the owner sends the missing one and this one again, in order.

    def _behind(self, parts: BackupParts) -> bool:
        """Whether our table is older than the owner's for a partition of the operation:
        then we cannot judge it yet."""
        versions = self.member.cluster.table.live_rows()[1]  # (pids checked on arrival)
        return any(map(lt, map(versions.__getitem__, parts.pids), parts.table_versions))

    def _awaits_sync(self, header: dict[str, Any]) -> bool:
        """Whether the operation writes a replica that failed to apply an earlier one and
        has not been synced since (``_unapplied``): judged now, it would be taken for
        applied, and acknowledged, before the sync brought that write here. Not a sync
        itself (a new owner's brings what is missing), nor an operation of a sender our
        table no longer names as the replica's owner (refused, not judged): neither may
        hold up the sender's stream."""
        missing = self.missing
        if not missing or header["kind"] == SYNC_KIND:
            return False
        ns, sender = header["ns"], header["from"]
        rows, me = self.member.cluster.table.live_rows()[0], self.member.info.uuid
        for pid in header["parts"].pids:
            slot = (pid, ns)
            if slot in missing:
                if not self.versions.is_dirty(*slot):
                    missing.discard(slot)  # synced (or dropped) since
                elif rows[pid][0] == sender and me in rows[pid]:
                    return True
        return False

    def replica_synced(self) -> None:
        """A replica sync was installed: judge the operations that waited for it."""
        self._process_held()

    def _process_held(self) -> None:
        for sender, queue in list(self.inbox.held()):
            while queue:
                ident, header, frames = queue[0].request
                if self._behind(header["parts"]) or self._awaits_sync(header):
                    break
                self._process(sender, queue.popleft().seq, ident, header, frames)

    def _process(self, sender: str, seq: int, ident: bytes, header: dict[str, Any],
                 frames: list[bytes]) -> None:
        """Apply the next operation of a sender's stream and acknowledge it."""
        refused, answered = self._apply_backup_op(header, frames)
        self.inbox.processed(sender, seq, refused)
        if answered:
            self.member.reply_ok(ident, header, refused=refused, answered=True)
        else:
            self.member.reply_ok(ident, header, refused=refused)

    def _apply_backup_op(self, header: dict[str, Any], frames: list[bytes]
                         ) -> tuple[list[int], bool]:
        """Apply the parts whose partition our table says we back up for the sender;
        return the partitions refused, and whether we answered the caller of a chained
        write (grid/cluster/chain.py)."""
        sender, ns, kind = header["from"], header["ns"], header["kind"]
        parts: BackupParts = header["parts"]
        counts = parts.counts
        if header.get("laid_out"):  # records (workers/record_block.py), two items each
            if kind != PUT_KIND or any(map(and_, counts, repeat(1))):
                raise ProtocolError("records are a put's, a key and a value each")
            items: Any = parse_records(frames[0], sum(counts) >> 1)
        else:
            items = p.unpack_items(frames[0])
        if sum(counts) != len(items):
            raise ProtocolError("backup counts do not match the payload")
        rows, me = self.member.cluster.table.live_rows()[0], self.member.info.uuid
        if kind == SYNC_KIND:
            return self._apply_sync_op(header, parts, items, rows, me), False
        # Our replica index of each part's partition, if our table says we back it up for
        # the sender (a batch of 100 keys has 80 parts: rows are read in line).
        pids = parts.pids
        indexes = []
        for pid in pids:
            row = rows[pid]
            indexes.append(row.index(me) if row[0] == sender and me in row else 0)
        iid, want_old = header.get("iid"), header.get("old", False)
        answer: Any = header.get("answer")
        answer_pid = None if answer is None else answer[0]
        now = self.member.now()
        # A steady stream: a put of partitions we all back up for the sender, each the next
        # operation its replica expects, none of them with a replica sync under way: the
        # versions are taken and the items stored in one call (a single key's put returns
        # the previous value, which is the owner's: the replica was in step).
        if kind == PUT_KIND and 0 not in indexes and not self.drop_backup_every \
                and (answer_pid is None or answer_pid == pids[0]) \
                and (len(items) == 2 and len(pids) == 1 or not want_old and answer_pid is None) \
                and self.member.syncs.requests.pending.keys().isdisjoint(pids) \
                and self.versions.apply_in_sequence(ns, pids, indexes, parts.versions):
            old: Any = None  # (later what _decided returns: NOT_APPLIED too)
            try:
                if items.__class__ is RecordBlock:
                    self.store.put_groups(ns, list(zip(pids, _cut(items, counts), strict=True)))
                elif len(items) == 2:  # one key
                    old = self.store.put(pids[0], ns, items[0], items[1])
                else:
                    self.store.put_runs(ns, pids, list(map(rshift, counts, repeat(1))), items)
            except BaseException:
                self._unapplied(ns, pids)
                raise
            if iid is not None:
                self.records.record(iid, pids, old if want_old else None, now)
            return [], answer is not None and self._answer_caller(pids, ns, answer[1],
                                                                  answer[2], old, True)
        # Part by part: the parts whose partition our table says we back up for the sender;
        # the rest are refused.
        refused, taken, chunks, at = [], [], [], 0
        for i, count in enumerate(counts):
            if not indexes[i]:
                refused.append(pids[i])
            elif not self.drop_backup_every or self._keep_backup_part():
                taken.append(i)
                chunks.append(items[at:at + count])
            at += count
        decisions = self.versions.apply_backups(ns, [pids[i] for i in taken],
                                                [indexes[i] for i in taken],
                                                [parts.vector(i) for i in taken])
        # In-sequence puts that need no old value go to the store in one call; the rest one
        # by one.
        pending_syncs = self.member.syncs.requests.pending
        answered = False
        groups: list[tuple[int, list[bytes]]] = []
        applied_pids: list[int] = []
        outcome = None
        in_sequence = BackupDecision.APPLY if kind == PUT_KIND else None
        for i, chunk, decision in zip(taken, chunks, decisions, strict=True):
            pid, target_versions = pids[i], parts.target_vector(i)
            if decision is in_sequence and not want_old and pid != answer_pid \
                    and target_versions is None and pid not in pending_syncs:
                groups.append((pid, chunk))
                old = None
            else:
                old = self._decided(decision, pid, indexes[i], ns, kind, chunk,
                                    parts.vector(i), target_versions)
                if old is NOT_APPLIED:
                    continue
                if pid == answer_pid:
                    answered = self._answer_caller([pid], ns, answer[1], answer[2], old)
            if want_old and not applied_pids:
                outcome = old  # (the first part's: a call that wants it writes one key)
            applied_pids.append(pid)
        if groups:
            try:
                self.store.put_groups(ns, groups)
            except BaseException:
                self._unapplied(ns, [pid for pid, _ in groups])
                raise
        if iid is not None and applied_pids:
            self.records.record(iid, applied_pids, outcome, now)
        if answer is not None and answer_pid is None and \
                backup_may_answer_batch(len(pids), len(applied_pids)):
            # A batch: answered once every part of it was applied here, in sequence.
            answered = self._answer_caller(pids, ns, answer[1], answer[2], None)
        return refused, answered

    def _unapplied(self, ns: str, pids: list[int]) -> None:
        """Backup operations whose versions were taken failed to apply (the store could not
        grow, say): their replicas are marked for a replica sync, asked for now, and their
        next operations (the owner's resend first) wait for it. Else a resend would be
        judged applied already, acknowledged, and the replicas would lack the writes for
        good."""
        requests = self.member.syncs.requests
        for pid in pids:
            self.versions.mark_dirty(pid, ns)
            self.missing.add((pid, ns))
            requests.want(pid, (ns,))

    def _keep_backup_part(self) -> bool:
        """Tests only (``drop_backup_every``): False for every n-th part, which is then lost
        yet acknowledged."""
        self._backup_parts_seen += 1
        return self._backup_parts_seen % self.drop_backup_every != 0

    def _apply_sync_op(self, header: dict[str, Any], parts: BackupParts,
                       items: list[bytes], rows: Any, me: str) -> list[int]:
        """A replica sync's parts: become a copy of the owner's partition; return the
        partitions refused."""
        refused, at = [], 0
        for pid, count in zip(parts.pids, parts.counts, strict=True):
            chunk = items[at:at + count]
            at += count
            row = rows[pid]
            index = row.index(me) if me in row else -1
            if row[0] != header["from"] or index <= 0:
                refused.append(pid)
                continue
            self._apply_sync(pid, index, chunk, header["vectors"])
            self.take_records(pid, header.get("records"))
            self.member.syncs.requests.forget(pid)  # now a copy of the owner's
        return refused

    def _answer_caller(self, pids: list[int], ns: str, client_id: str, rid: Any,
                       old: bytes | None, in_step: bool = False) -> bool:
        """Answer a chained write we applied to partitions ``pids`` as its owner would have;
        False if we cannot (then the owner answers): a replica is not in step (``in_step``:
        each was applied in sequence, known already), or the caller is not known."""
        is_dirty = self.versions.is_dirty
        if not in_step and any(is_dirty(pid, ns) for pid in pids):  # else each was applied
            return False  # in sequence: our previous value is the owner's
        ident = self.clients.ident(client_id)
        if ident is None:
            return False
        self.member.reply(ident, [p.reply_ok(rid), *([] if old is None else [old])])
        self.chained_answers += 1
        return True

    def _decide_and_apply(self, pid: int, index: int, ns: str, kind: str,
                          chunk: list[bytes] | RecordBlock,
                          versions: list[int], target_versions: list[int] | None,
                          replay: bool = False) -> Any:
        """Seed 004's backup rules for one operation (``_decided``). Returns what the
        operation returned, or NOT_APPLIED."""
        decision = self.versions.apply_backup(pid, ns, index, versions)
        return self._decided(decision, pid, index, ns, kind, chunk, versions, target_versions,
                             replay)

    def _decided(self, decision: BackupDecision, pid: int, index: int, ns: str, kind: str,
                 chunk: list[bytes] | RecordBlock, versions: list[int],
                 target_versions: list[int] | None,
                 replay: bool = False) -> Any:
        """Seed 004's backup rules, once the versions decided: apply an operation newer than
        this replica's version (its versions are taken), ignore an older one (a replica
        sync brought it already); a gap or a dirty replica asks the owner for a replica
        sync. Returns what the operation returned, or NOT_APPLIED."""
        requests = self.member.syncs.requests
        if isinstance(chunk, RecordBlock):  # records, taken here one at a time
            chunk = chunk.items()
        in_sequence = decision is BackupDecision.APPLY  # (nearly always: no checks then)
        if not in_sequence and decision.request_sync:
            if decision is BackupDecision.APPLY_DIRTY:
                log.info("partition %d/%s missed a backup operation; marked dirty", pid, ns)
            requests.want(pid, (ns,))
        if target_versions is not None:
            target = chunk[0].decode()
            if self.versions.apply_backup(pid, target, index, target_versions).request_sync:
                requests.want(pid, (target,))
        if not in_sequence and not decision.apply:
            return NOT_APPLIED
        try:
            old = self._apply_backup(pid, ns, kind, chunk)
        except BaseException:
            self._unapplied(ns, [pid])
            raise
        if not replay and pid in requests.pending:  # a sync request is out: its window
            keys = chunk[0::2] if kind == PUT_KIND else chunk if kind == REMOVE_KIND else None
            requests.record(pid, WindowOp(
                ns, kind, versions[index - 1], keys,
                (ns, kind, chunk, versions, target_versions)))
        return old

    def _apply_sync(self, pid: int, index: int, chunk: list[bytes],
                    vectors: dict[str, list[int]]) -> None:
        """Become a copy of the owner's partition: its namespaces, entries and versions."""
        self.store.drop_partition(pid)
        self.versions.clear(pid)
        self.take_namespaces(pid, chunk, vectors, index)

    def records_of(self, pid: int) -> list[tuple[str, Any]]:
        """(invocation id, outcome) of the invocations applied here to ``pid``: recorded, or
        under way (applied, not answered yet: recorded once answered). What a migration or
        a sync hands on with the partition's data, which holds their writes."""
        records = self.records.of_partition(pid)
        recorded = {iid for iid, _ in records}
        for iid, tickets in self.in_flight.items():
            if iid not in recorded:
                ticket = next((t for t in tickets if pid in t.written), None)
                if ticket is not None:
                    records.append((iid, ticket.outcome))
        return records

    def take_records(self, pid: int, records: Any) -> None:
        """Invocation records that came with a partition (a sync or a migration): they
        replace ours of the partition, as its data replaces ours."""
        self.records.forget_partition(pid)
        if not isinstance(records, list):
            return
        now = self.member.now()
        for entry in records:
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str):
                self.records.record(entry[0], [pid], entry[1], now)

    def encode_namespaces(self, pid: int, namespaces: list[str]
                          ) -> tuple[list[bytes], dict[str, list[int]]]:
        """The namespaces of a partition as items (name, count, then keys and values) and
        their replica version vectors: what a promotion's SYNC carries, in one piece."""
        items: list[bytes] = []
        vectors: dict[str, list[int]] = {}
        for ns in namespaces:
            items += section(ns, self.store.items(pid, ns))
            vectors[ns] = list(self.versions.get(pid, ns))
        return items, vectors

    def take_namespaces(self, pid: int, items: list[bytes], vectors: dict[str, Any],
                        index: int) -> None:
        """Store what ``encode_namespaces`` made, with its versions at replica ``index``."""
        for ns, pairs in sections(items).items():
            self.store.put_many(pid, ns, pairs)
            self.versions.set(pid, ns, vectors[ns], index)

    def diff_namespaces(self, pid: int, namespaces: list[str], trees: dict[str, bytes]
                        ) -> FragmentChunk:
        """A differential fragment (seed 003): for namespaces whose tree the destination
        sent (it holds an older copy), only the entries under the leaves that differ."""
        depth = self.config.merkle_tree_depth
        chunk = FragmentChunk([], {}, 0, 0)
        for ns in namespaces:
            chunk.vectors[ns] = list(self.versions.get(pid, ns))
            theirs = MerkleTree.from_nodes(depth, trees[ns])
            chunk.roots[ns] = theirs.root
            leaves, _ = diff_leaves(theirs, self._tree(pid, ns))
            pairs = self.store.leaf_entries(pid, ns, leaves)
            chunk.leaves[ns] = leaves
            chunk.items += section(ns, pairs)
            chunk.entries += len(pairs)
            chunk.size += sum(len(k) + len(v) for k, v in pairs)
        return chunk

    def _tree(self, pid: int, ns: str) -> MerkleTree:
        """A fragment's Merkle tree, where differences are taken: members that keep none
        (``merkle_tree_depth`` 0) never ask for them."""
        tree = self.store.tree(pid, ns)
        if tree is None:
            raise ProtocolError("differences asked of a member that keeps no Merkle trees")
        return tree

    def lend_namespaces(self, pid: int, namespaces: list[str], max_bytes: float
                        ) -> tuple[list[FragmentChunk], list[FragmentLoan]]:
        """A migration fragment of these namespaces, lent through shared memory: the chunk
        messages (each about ``max_bytes`` of records, with the versions of the namespaces it
        starts) and the loans to release once the destination has them. There is always a
        chunk; a namespace without records travels as its versions alone."""
        chunks: list[FragmentChunk] = []
        loans: list[FragmentLoan] = []
        current = FragmentChunk([], {}, 0, 0)
        for ns in namespaces:
            current.vectors[ns] = list(self.versions.get(pid, ns))
            loan = self.store.lend(pid, ns)
            if loan is None:
                continue
            loans.append(loan)
            for part in loan.chunks(max_bytes):
                size = part["b"] - part["a"]
                if current.parts and current.size + size > max_bytes:
                    chunks.append(current)
                    current = FragmentChunk([], {}, 0, 0)
                current.parts.append(part)
                current.size += size
                current.entries += part["e1"] - part["e0"]
                if part["end"] is not None:
                    current.entries += loan.count - loan.entries
        chunks.append(current)
        return chunks, loans

    def take_chunk(self, pid: int, parts: list[dict[str, Any]], vectors: dict[str, Any],
                   index: int, leaves: dict[str, list[int]] | None = None,
                   items: Sequence[bytes] = (), roots: dict[str, int] | None = None) -> None:
        """Store one chunk that ``lend_namespaces`` (or ``diff_namespaces``: ``leaves``, their
        entries in ``items``, and the ``roots`` they apply to) made, with its versions at
        replica ``index``."""
        if leaves and (not isinstance(roots, dict) or set(roots) != set(leaves)):
            raise ProtocolError("differences name the tree roots they apply to")
        if leaves and roots is not None \
                and any(self._tree(pid, ns).root != root for ns, root in roots.items()):
            raise ValueError("what the differences were taken against changed here")
        for ns, vector in vectors.items():
            self.versions.set(pid, ns, vector, index)
        for part in parts:
            self.store.receive(pid, part)
        if leaves:
            entries = sections(list(items))
            for ns, replaced in leaves.items():
                self.store.replace_leaves(pid, ns, replaced, entries.get(ns, []))

    def _apply_backup(self, pid: int, ns: str, kind: str, chunk: list[bytes]) -> bytes | None:
        """Apply one part; for a single-key put or remove return the previous value (a
        replica in step with its owner sees the same one the owner answered with)."""
        if kind == PUT_KIND:
            if len(chunk) == 2:
                return self.store.put(pid, ns, chunk[0], chunk[1])
            self.store.put_groups(ns, ((pid, chunk),))
        elif kind == REMOVE_KIND:
            old = None
            for key in chunk:
                old = self.store.remove(pid, ns, key)
            return old
        elif kind == CLEAR_KIND:
            self.store.clear(pid, ns)
        else:
            self.store.move_fragment(pid, ns, chunk[0].decode())
        return None
