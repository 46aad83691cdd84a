"""Map operations on the member: the owner's side (apply, send backups, answer once the
synchronous backups have applied) and the backup's side (check, apply in version order).

An owner answers a write only after every synchronous backup acknowledged it, or left the
partition's replicas in a table the master published (then the write is safe on the replicas
that remain). A backup applies a change only from the member its own table names as owner,
so a former owner that still writes after a promotion gets a refusal, never an acknowledgement.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grid import protocol as p
from grid.errors import ProtocolError
from grid.partition.replica_versions import BackupDecision, ReplicaVersions
from workers.record_store import ValueTooLargeError

if TYPE_CHECKING:
    from workers.node import Node

log = logging.getLogger("shmgrid.maps")

PUT_KIND, REMOVE_KIND, CLEAR_KIND, MOVE_KIND = "put", "remove", "clear", "move"


@dataclass
class PendingWrite:
    """A write the owner applied and answers once its synchronous backups have."""

    ident: bytes
    reply: list[Any]
    pids: set[int]
    waiting: dict[int, str] = field(default_factory=dict)  # backup request id -> member uuid
    failed: tuple[str, str] | None = None


class MapService:
    def __init__(self, member: Node) -> None:
        self.member = member
        self.store = member.store
        self.config = member.config
        self.versions = ReplicaVersions()
        self.pending: dict[int, PendingWrite] = {}  # backup request id -> write

    def handlers(self) -> dict[str, Any]:
        table = {op: self._on_key_op for op in p.KEY_OPS}
        table.update({
            p.PUT_ALL: self._on_put_all, p.GET_ALL: self._on_get_all, p.SIZE: self._on_size,
            p.CLEAR: self._on_clear, p.ENTRIES: self._on_entries, p.MOVE: self._on_move,
        })
        guarded = {op: self._guarded(op, handler) for op, handler in table.items()}
        guarded[p.BACKUP] = self._on_backup  # a backup follows its owner, whatever the state
        return guarded

    def _guarded(self, op: str, handler: Any) -> Any:
        """The handler, behind the checks every client map operation passes first."""
        write = op in p.WRITE_OPS

        def checked(ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
            refusal = self._refusal(op, write)
            if refusal:
                self.member.reply_error(ident, header, refusal[0], refusal[1], **refusal[2])
            else:
                handler(ident, header, frames)
        return checked

    # -- checks ----------------------------------------------------------------------------

    def _refusal(self, op: str, write: bool) -> tuple[str, str, dict[str, Any]] | None:
        cluster = self.member.cluster
        if self.member.info.lite:
            return p.LITE, "lite member", {"member": self.member.name, "op": op}
        if not cluster.ready:
            return p.NOT_READY, "partitions are not assigned yet", {}
        if write and not cluster.state.writes_allowed:
            return p.STATE, "refused in this cluster state", {"op": op,
                                                             "state": cluster.state.value}
        return None

    def _pid(self, value: Any) -> int:
        if not isinstance(value, int) or not 0 <= value < self.config.partition_count:
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

    # -- one key ---------------------------------------------------------------------------

    def _on_key_op(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        op = header["op"]
        pid, ns = self._pid(header.get("pid")), self._ns(header)
        if not self._owns(pid):
            self.member.reply_error(ident, header, p.WRONG_TARGET, f"not the owner of {pid}")
            return
        needs_value = op in (p.PUT, p.SET, p.PUT_IF_ABSENT, p.REPLACE)
        if len(frames) != (2 if needs_value else 1):
            raise ProtocolError(f"{op} takes {2 if needs_value else 1} frames")
        key = frames[0]
        store = self.store
        if op == p.GET:
            value = store.get(pid, ns, key)
            self.member.reply_ok(ident, header, [] if value is None else [value])
            return
        if op == p.CONTAINS:
            self.member.reply_ok(ident, header, found=store.contains(pid, ns, key))
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
        reply = [p.reply_ok(header.get("id")), *([] if old is None else [old])]
        if not changed:
            self.member.reply(ident, reply)
            return
        if op in (p.REMOVE, p.DELETE):
            self._replicate(ident, reply, ns, REMOVE_KIND, {pid: [key]})
        else:
            self._replicate(ident, reply, ns, PUT_KIND, {pid: [key, frames[1]]})

    # -- partitions ------------------------------------------------------------------------

    def _split_owned(self, header: dict[str, Any]) -> tuple[list[int], list[int]]:
        pids = header.get("pids")
        if not isinstance(pids, list):
            raise ProtocolError("pids must be a list")
        owned, wrong = [], []
        for pid in pids:
            (owned if self._owns(self._pid(pid)) else wrong).append(pid)
        return owned, wrong

    def _grouped_items(self, header: dict[str, Any], frames: list[bytes],
                       per_entry: int) -> dict[int, list[bytes]]:
        """Items of a batch payload grouped by partition, as the header's counts say."""
        pids, counts = header.get("pids"), header.get("counts")
        if not isinstance(counts, list) or not isinstance(pids, list) \
                or len(counts) != len(pids) or len(frames) != 1:
            raise ProtocolError("a batch needs pids, counts of the same length and one payload")
        items = p.unpack_items(frames[0])
        if sum(counts) * per_entry != len(items):
            raise ProtocolError("batch counts do not match the payload")
        groups, at = {}, 0
        for pid, count in zip(pids, counts, strict=True):
            if not isinstance(count, int) or count < 0:
                raise ProtocolError("counts must be non-negative ints")
            groups[self._pid(pid)] = items[at:at + count * per_entry]
            at += count * per_entry
        return groups

    def _on_put_all(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        ns = self._ns(header)
        groups = self._grouped_items(header, frames, 2)
        # Refuse a too large entry before anything is applied: a refusal half way would leave
        # the partitions before it written here and on no backup.
        limit = self.config.max_value_bytes
        for items in groups.values():
            for i in range(0, len(items), 2):
                size = len(items[i]) + len(items[i + 1])
                if size > limit:
                    self.member.reply_error(ident, header, p.TOO_LARGE,
                                            f"an entry of {size} bytes", size=size, limit=limit)
                    return
        wrong = [pid for pid in groups if not self._owns(pid)]
        applied = {}
        for pid, items in groups.items():
            if pid in wrong or not items:
                continue
            self.store.put_many(pid, ns, zip(items[0::2], items[1::2], strict=True))
            applied[pid] = items
        reply = [p.reply_ok(header.get("id"), wrong=wrong)]
        self._replicate(ident, reply, ns, PUT_KIND, applied)

    def _on_get_all(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        ns = self._ns(header)
        groups = self._grouped_items(header, frames, 1)
        wrong, parts, found = [], [], 0
        for pid, keys in groups.items():
            if not self._owns(pid):
                wrong.append(pid)
                continue
            for key, value in zip(keys, self.store.get_many(pid, ns, keys), strict=True):
                if value is not None:
                    parts.append(key)
                    parts.append(value)
                    found += 1
        self.member.reply_ok(ident, header, [b"".join(parts)], wrong=wrong, n=found * 2)

    def _on_size(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        ns = self._ns(header)
        owned, wrong = self._split_owned(header)
        self.member.reply_ok(ident, header, wrong=wrong,
                             size=sum(self.store.size(pid, ns) for pid in owned))

    def _on_entries(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        """Every entry of the asked partitions: per partition one frame, its serialized keys
        and values laid end to end (the client decodes a frame in one call)."""
        ns = self._ns(header)
        owned, wrong = self._split_owned(header)
        payload, counts = [], []
        for pid in owned:
            data, records = self.store.concatenated(pid, ns)
            payload.append(data)
            counts.append(records * 2)  # items: a key and a value each
        self.member.reply_ok(ident, header, payload, pids=owned, counts=counts, wrong=wrong)

    def _on_clear(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        ns = self._ns(header)
        owned, wrong = self._split_owned(header)
        for pid in owned:
            self.store.clear(pid, ns)
        reply = [p.reply_ok(header.get("id"), wrong=wrong)]
        self._replicate(ident, reply, ns, CLEAR_KIND, {pid: [] for pid in owned})

    def _on_move(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        """Replace the target map's fragment of each partition with this map's (which empties):
        the publish step of a staged overwrite."""
        ns, target = self._ns(header), header.get("target")
        if not isinstance(target, str) or not target or target == ns:
            raise ProtocolError("move needs a target map other than the source")
        owned, wrong = self._split_owned(header)
        for pid in owned:
            self.store.move_fragment(pid, ns, target)
        reply = [p.reply_ok(header.get("id"), wrong=wrong)]
        self._replicate(ident, reply, ns, MOVE_KIND, {pid: [target.encode()] for pid in owned})

    # -- replication -----------------------------------------------------------------------

    def _backup_targets(self, pid: int) -> tuple[list[str], list[str]]:
        replicas = self.member.cluster.table.replicas(pid)
        sync_count, async_count = self.config.backup_count, self.config.async_backup_count
        sync = [r for r in replicas[1:1 + sync_count] if r]
        asynchronous = [r for r in replicas[1 + sync_count:1 + sync_count + async_count] if r]
        return sync, asynchronous

    def _replicate(self, ident: bytes, reply: list[Any], ns: str, kind: str,
                   items_by_pid: dict[int, list[bytes]]) -> None:
        """Send one backup message per backup member; answer when the sync ones applied it."""
        total = self.config.backup_count + self.config.async_backup_count
        per_member: dict[str, tuple[list, list, bool]] = defaultdict(lambda: ([], [], False))
        for pid, items in items_by_pid.items():
            versions = self.versions.increment(pid, ns, total)
            sync, asynchronous = self._backup_targets(pid)
            for uuid, is_sync in [(u, True) for u in sync] + [(u, False) for u in asynchronous]:
                parts, payload, was_sync = per_member[uuid]
                parts.append([pid, list(versions), len(items)])
                payload.extend(items)
                per_member[uuid] = (parts, payload, was_sync or is_sync)
        write = PendingWrite(ident, reply, set(items_by_pid))
        for uuid, (parts, payload, is_sync) in per_member.items():
            fields = {"ns": ns, "kind": kind, "parts": parts}
            frames = [p.pack_items(payload)]
            if not is_sync:
                self.member.request_peer(uuid, p.BACKUP, fields, frames, lambda h, f: None,
                                         timeout=self.config.invocation_timeout)
                continue
            rid = self.member.request_peer(uuid, p.BACKUP, fields, frames, self._on_backup_ack,
                                           timeout=self.config.invocation_timeout)
            if rid in self.member.callbacks:  # sent (else the ack handler already ran)
                write.waiting[rid] = uuid
                self.pending[rid] = write
        if not write.waiting:
            self._finish(write)

    def _on_backup_ack(self, header: dict[str, Any] | None, frames: list[bytes]) -> None:
        if header is None:
            return  # timed out: handled by tick, which knows the request id
        rid = header.get("id")
        write = self.pending.pop(rid, None)
        if write is None:
            return
        write.waiting.pop(rid, None)
        if not header.get("ok"):
            write.failed = (p.WRONG_TARGET, f"backup refused: {header.get('msg')}")
        if not write.waiting:
            self._finish(write)

    def _finish(self, write: PendingWrite) -> None:
        for rid in write.waiting:
            self.pending.pop(rid, None)
        write.waiting.clear()
        if write.failed:
            code, msg = write.failed
            header = p.unpack_header(write.reply[0])
            self.member.reply(write.ident, [p.reply_error(header.get("id"), code, msg)])
        else:
            self.member.reply(write.ident, write.reply)

    def on_table_change(self, pids: list[int]) -> None:
        """React to a newer table: drop partitions we no longer hold, stop waiting for
        backups that are no longer replicas, fail writes whose partition we no longer own."""
        cluster = self.member.cluster
        cluster.ready = cluster.joined and cluster.table.is_assigned()
        me = self.member.info.uuid
        table = cluster.table
        held = set(self.store.partitions())
        for pid in pids:
            if pid in held and table.replica_index(pid, me) < 0:
                self.store.drop_partition(pid)
                self.versions.clear(pid)
        self._recheck_pending(set(pids))

    def on_members_change(self) -> None:
        self._recheck_pending(None)

    def _recheck_pending(self, pids: set[int] | None) -> None:
        table, members = self.member.cluster.table, self.member.cluster.members
        me = self.member.info.uuid
        for write in {id(w): w for w in self.pending.values()}.values():
            if pids is not None and not (write.pids & pids):
                continue
            if any(table.owner(pid) != me for pid in write.pids):
                write.failed = (p.WRONG_TARGET, "ownership changed during the write")
                self._finish(write)
                continue
            for rid, uuid in list(write.waiting.items()):
                still_backup = any(table.replica_index(pid, uuid) > 0 for pid in write.pids)
                if uuid not in members or not still_backup:
                    del write.waiting[rid]
                    self.pending.pop(rid, None)
            if not write.waiting:
                self._finish(write)

    def tick(self, now: float) -> None:
        # Backups that never answered: their callbacks expired (member._expire_callbacks).
        expired = [rid for rid in self.pending if rid not in self.member.callbacks]
        for rid in expired:
            write = self.pending.pop(rid)
            write.waiting.pop(rid, None)
            write.failed = (p.TIMEOUT, "a backup did not acknowledge in time")
            if not write.waiting:
                self._finish(write)

    # -- the backup's side -----------------------------------------------------------------

    def _on_backup(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        sender, ns, kind = header.get("from"), self._ns(header), header.get("kind")
        parts = header.get("parts")
        if kind not in (PUT_KIND, REMOVE_KIND, CLEAR_KIND, MOVE_KIND) \
                or not isinstance(parts, list) or len(frames) != 1:
            raise ProtocolError("malformed backup")
        items = p.unpack_items(frames[0])
        table, me = self.member.cluster.table, self.member.info.uuid
        for part in parts:
            pid = self._pid(part[0])
            if table.owner(pid) != sender or table.replica_index(pid, me) <= 0:
                self.member.reply_error(ident, header, p.WRONG_TARGET,
                                        f"this member is not a backup of {pid} under {sender}")
                return
        if sum(part[2] for part in parts) != len(items):
            raise ProtocolError("backup counts do not match the payload")
        at = 0
        for pid, versions, count in parts:
            chunk = items[at:at + count]
            at += count
            # Every op from the owner our table names is applied, in the order it arrives on
            # that owner's one ordered channel: acknowledged writes are then always here. The
            # version vector still flags replicas that missed ops (refused or unacknowledged
            # ones) as dirty, for replica sync to repair (seed 004).
            decision = self.versions.apply_backup(pid, ns, table.replica_index(pid, me), versions)
            if decision is BackupDecision.APPLY_DIRTY:
                log.info("partition %d/%s missed backup versions; marked dirty", pid, ns)
            self._apply_backup(pid, ns, kind, chunk)
        self.member.reply_ok(ident, header)

    def _apply_backup(self, pid: int, ns: str, kind: str, chunk: list[bytes]) -> None:
        if kind == PUT_KIND:
            self.store.put_many(pid, ns, zip(chunk[0::2], chunk[1::2], strict=True))
        elif kind == REMOVE_KIND:
            for key in chunk:
                self.store.remove(pid, ns, key)
        elif kind == CLEAR_KIND:
            self.store.clear(pid, ns)
        else:
            self.store.move_fragment(pid, ns, chunk[0].decode())
