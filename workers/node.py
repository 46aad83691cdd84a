"""A member without its transport: services, dispatch, request callbacks and timers.

``Member`` (workers/member.py) puts ZeroMQ sockets and a poll loop around this; the protocol
simulation (tests/cluster/sim.py) puts a simulated network and clock around it. Both run the
same ClusterService and MapService code, so what the simulation shows holds for the member.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable
from typing import Any

from grid import protocol as p
from grid.cluster.membership import MemberInfo
from grid.config import GridConfig
from grid.errors import GridError, NotAuthorizedError, ProtocolError
from grid.local_reads import segment_prefix
from persistence import PersistenceError
from workers.cluster_service import ClusterService
from workers.journal import Journal
from workers.map_service import MapService
from workers.migration_service import MigrationService
from workers.record_store import RecordStore
from workers.replica_sync_service import ReplicaSyncService
from workers.state_service import StateService

log = logging.getLogger("shmgrid.member")

ReplyCallback = Callable[[dict[str, Any] | None, list[bytes]], None]
Handler = Callable[[bytes, dict[str, Any], list[bytes]], None]


class Node:
    """Transport-independent member. Subclasses provide the clock and the five transport
    methods: connect_peer, disconnect_peer, send_peer, reply, notify_supervisor."""

    # What holds the data and serves the maps: the simulation's nodes use subclasses that
    # watch them (tests/cluster/sim.py).
    store_class: type[RecordStore] = RecordStore
    map_service_class: type[MapService] = MapService

    def __init__(self, config: GridConfig, info: MemberInfo, join_endpoints: list[str],
                 journal: Journal | None = None) -> None:
        self.config = config
        self.info = info
        self.name = info.name
        self.callbacks: dict[int, tuple[float, ReplyCallback]] = {}
        self.ids = itertools.count(1)
        self.running = True
        self.store = self.store_class(segment_prefix(config.cluster_name, info.name),
                                      max_record_bytes=config.max_value_bytes + 8,
                                      merkle_depth=config.merkle_tree_depth)
        self.journal = journal  # its log is loaded by ``restore``, before the member runs
        self.cluster = ClusterService(self, join_endpoints)
        self.maps = self.map_service_class(self)
        self.migrations = MigrationService(self)
        self.syncs = ReplicaSyncService(self)
        self.states = StateService(self)
        self.handlers: dict[str, Handler] = {p.PING: self._on_ping,
                                             p.PERSIST_BACKUP: self._on_persist_backup}
        self.handlers.update(self.cluster.handlers())
        self.handlers.update(self.maps.handlers())
        self.handlers.update(self.migrations.handlers())
        self.handlers.update(self.syncs.handlers())
        self.handlers.update(self.states.handlers())

    # -- provided by the transport ---------------------------------------------------------

    def now(self) -> float:
        raise NotImplementedError

    def connect_peer(self, key: str, endpoint: str) -> None:
        raise NotImplementedError

    def disconnect_peer(self, key: str) -> None:
        raise NotImplementedError

    def send_peer(self, key: str, frames: list[bytes]) -> bool:
        raise NotImplementedError

    def reply(self, ident: bytes, frames: list[Any]) -> None:
        raise NotImplementedError

    def notify_supervisor(self, op: str, **fields: Any) -> None:
        raise NotImplementedError

    def wake(self) -> None:
        """From the log's writer thread: writes became durable (a transport with a loop to
        wake overrides this)."""

    # -- requests and replies --------------------------------------------------------------

    def request_peer(self, key: str, op: str, fields: dict[str, Any], frames: list[bytes],
                     callback: ReplyCallback, timeout: float) -> int:
        """Send a request to a peer; ``callback(header, frames)`` runs on its reply, or
        ``callback(None, [])`` when it has not come within ``timeout`` seconds."""
        rid = next(self.ids)
        self.callbacks[rid] = (self.now() + timeout, callback)
        if not self.send_peer(key, [self._peer_header(op, rid, fields), *frames]):
            del self.callbacks[rid]
            callback(None, [])
        return rid

    def tell_peer(self, key: str, op: str, fields: dict[str, Any], frames: list[bytes]) -> bool:
        """Send a request that wants no reply (an asynchronous backup operation: what gets
        lost is for replica sync to repair); False if it did not leave."""
        return self.send_peer(key, [self._peer_header(op, next(self.ids), fields), *frames])

    def _peer_header(self, op: str, rid: int, fields: dict[str, Any]) -> bytes:
        fields["from"] = self.info.uuid
        fields[p.SECRET_FIELD] = self.config.cluster_secret
        return p.request(op, rid, self.config.cluster_name, **fields)

    def reply_ok(self, ident: bytes, header: dict[str, Any], frames: list[Any] = (),
                 **fields: Any) -> None:
        self.reply(ident, [p.reply_ok(header.get("id"), **fields), *frames])

    def reply_error(self, ident: bytes, header: dict[str, Any], code: str, msg: str,
                    **fields: Any) -> None:
        self.reply(ident, [p.reply_error(header.get("id"), code, msg, **fields)])

    def on_request(self, ident: bytes, head: bytes, frames: list[bytes]) -> None:
        """Serve one request. Nothing a peer sends can raise out of here."""
        try:
            header = p.unpack_header(head)
        except ProtocolError as exc:
            log.warning("dropped a message with a bad header: %s", exc)
            return
        try:
            self._dispatch(ident, header, frames)
        except ProtocolError as exc:
            self.reply_error(ident, header, p.PROTOCOL, str(exc))
        except GridError as exc:
            self.reply_error(ident, header, p.SERVER, str(exc))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            # Malformed fields from a hostile or broken peer: answer, never crash.
            self.reply_error(ident, header, p.PROTOCOL,
                             f"malformed {header.get('op')!r} request: {exc!r}")
        except Exception:
            log.exception("failed to serve %r", header.get("op"))
            self.reply_error(ident, header, p.SERVER, "internal error; see the member log")

    def _dispatch(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        op = header.get("op")
        cluster = header.get("c", "")
        if cluster and cluster != self.config.cluster_name:
            self.reply_error(ident, header, p.WRONG_CLUSTER, "wrong cluster name",
                             expected=cluster, actual=self.config.cluster_name,
                             endpoint=self.info.endpoint)
            return
        if op.__class__ is not str:  # (msgpack gives str itself, never a subclass)
            raise ProtocolError(f"unknown operation {op!r}")
        if op in p.CONTROL_OPS and not p.has_secret(header, self.config.cluster_secret):
            log.warning("refused %r from a sender without the cluster secret", op)
            self.reply_error(ident, header, p.AUTH, str(NotAuthorizedError(op)), op=op)
            return
        handler = self.handlers.get(op)
        if handler is None:
            raise ProtocolError(f"unknown operation {op!r}")
        handler(ident, header, frames)

    def on_reply(self, frames: list[bytes]) -> None:
        """A reply to one of our requests: run its callback (a late one is dropped)."""
        try:
            header = p.unpack_header(frames[0])
        except (ProtocolError, IndexError):
            log.warning("dropped an undecodable reply")
            return
        entry = self.callbacks.pop(header.get("id"), None)
        if entry is None:
            return
        try:
            entry[1](header, frames[1:])
        except Exception:
            log.exception("reply handler failed")

    # -- timers ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Periodic work: expired requests, heartbeats and failure detection, write deadlines."""
        expired = [rid for rid, (deadline, _) in self.callbacks.items() if deadline <= now]
        for rid in expired:
            _, callback = self.callbacks.pop(rid)
            try:
                callback(None, [])
            except Exception:
                log.exception("timeout handler failed")
        self.cluster.tick(now)
        self.maps.tick(now)
        self.migrations.tick(now)
        self.syncs.tick(now)
        self.states.tick(now)
        if self.journal is not None and self.journal.view_dirty:
            self.save_view()

    def restore(self) -> None:
        """Recovery mode (hot restart): the log into shared memory, then open it for
        appending. Before the member joins or serves anything."""
        journal = self.journal
        if journal is None or journal.log is not None:
            return
        restored = journal.restore(self.store.put_many, self.wake)
        self.maps.basis = set(self.store.partitions())
        log.info("loaded %d records (%.1f MB) from %s in %.2f s", restored.records,
                 restored.bytes / 1e6, journal.folder, restored.seconds)
        self.store.journal = journal

    def save_view(self, clean: bool = False) -> None:
        """Persist the member list, table and state we follow (hot restart); not before
        the log is loaded and a table was formed, or an empty view would replace the saved
        one (a restart that was refused must leave the files as they were)."""
        if self.journal.log is None or not self.cluster.table.is_assigned():
            return
        cluster = self.cluster
        self.journal.save_view(cluster.members.to_wire(), cluster.table.to_wire(),
                               cluster.saved_state.value, cluster.state_version, clean)

    def _on_persist_backup(self, ident: bytes, header: dict[str, Any],
                           frames: list[bytes]) -> None:
        folder = header.get("dir")
        if not isinstance(folder, str) or not os.path.isabs(folder):
            raise ProtocolError("a backup names an absolute folder (dir)")
        if self.journal is None:
            self.reply_error(ident, header, p.STATE, "this cluster runs without --data-dir, so "
                             "there is nothing to back up", op="backup", state="in memory")
            return
        self.save_view()
        try:
            result = self.journal.backup(os.path.join(folder, self.name))
        except (OSError, PersistenceError) as exc:
            self.reply_error(ident, header, p.SERVER, f"backup of {self.name} failed: {exc}")
            return
        self.reply_ok(ident, header, **result)

    def _on_ping(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        self.reply_ok(ident, header, cluster=self.config.cluster_name, uuid=self.info.uuid,
                      name=self.name)
