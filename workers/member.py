"""The member process: one loop over ZeroMQ sockets that moves bytes and calls the services.

A ROUTER socket bound on the loopback takes requests from clients, peers and the supervisor;
one DEALER per peer carries this member's own requests (backups, joins, state fetches) and
brings their replies back. The loop polls them all, drains what is ready, and runs timers
(heartbeats, deadlines) between batches. It never blocks on anything but the poll.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import sys
import time
import uuid as uuid_mod
from collections.abc import Callable
from typing import Any

import psutil
import zmq

from grid import protocol as p
from grid.cluster.membership import MemberInfo
from grid.config import GridConfig
from grid.errors import GridError, ProtocolError
from workers.cluster_service import ClusterService
from workers.map_service import MapService
from workers.record_store import RecordStore

log = logging.getLogger("shmgrid.member")

DRAIN_MAX = 512  # messages taken from one socket before the others get a turn
TICK_S = 0.1

ReplyCallback = Callable[[dict[str, Any] | None, list[bytes]], None]


class Member:
    def __init__(self, config: GridConfig, name: str, join_endpoints: list[str],
                 supervisor_endpoint: str | None = None, lite: bool = False) -> None:
        self.config = config
        self.name = name
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.setsockopt(zmq.RCVHWM, 0)
        port = self.router.bind_to_random_port(f"tcp://{config.host}")
        self.info = MemberInfo(str(uuid_mod.uuid4()), name, f"tcp://{config.host}:{port}",
                               os.getpid(), lite)
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.peers: dict[str, zmq.Socket] = {}  # member uuid or endpoint -> DEALER
        self.callbacks: dict[int, tuple[float, ReplyCallback]] = {}
        self.ids = itertools.count(1)
        self.supervisor = None
        if supervisor_endpoint:
            self.supervisor = self._dealer(supervisor_endpoint)
        self.process = psutil.Process()
        self.store = RecordStore(f"shmgrid-{config.cluster_name}-{name}",
                                 max_record_bytes=config.max_value_bytes + 8)
        self.cluster = ClusterService(self, join_endpoints)
        self.maps = MapService(self)
        self.running = True
        self.handlers: dict[str, Callable[[bytes, dict[str, Any], list[bytes]], None]] = {
            p.PING: self._on_ping,
            p.STATUS: self._on_status,
            p.SHUTDOWN: self._on_shutdown,
        }
        self.handlers.update(self.cluster.handlers())
        self.handlers.update(self.maps.handlers())

    # -- sockets ---------------------------------------------------------------------------

    def _dealer(self, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        sock.connect(endpoint)
        self.poller.register(sock, zmq.POLLIN)
        return sock

    def connect_peer(self, key: str, endpoint: str) -> None:
        if key not in self.peers:
            self.peers[key] = self._dealer(endpoint)

    def disconnect_peer(self, key: str) -> None:
        sock = self.peers.pop(key, None)
        if sock is not None:
            self.poller.unregister(sock)
            sock.close(0)

    def send_peer(self, key: str, frames: list[bytes]) -> bool:
        sock = self.peers.get(key)
        if sock is None:
            return False
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.Again:
            log.warning("send to %s would block; dropped %s", key, frames[0][:40])
            return False

    def request_peer(self, key: str, op: str, fields: dict[str, Any], frames: list[bytes],
                     callback: ReplyCallback, timeout: float) -> int:
        """Send a request to a peer; ``callback(header, frames)`` runs on its reply, or
        ``callback(None, [])`` when it has not come within ``timeout`` seconds."""
        rid = next(self.ids)
        fields["from"] = self.info.uuid
        header = p.request(op, rid, self.config.cluster_name, **fields)
        self.callbacks[rid] = (time.monotonic() + timeout, callback)
        if not self.send_peer(key, [header, *frames]):
            del self.callbacks[rid]
            callback(None, [])
        return rid

    def notify_supervisor(self, op: str, **fields: Any) -> None:
        if self.supervisor is not None:
            header = p.request(op, next(self.ids), self.config.cluster_name,
                               **{"from": self.info.uuid, **fields})
            try:
                self.supervisor.send_multipart([header], zmq.NOBLOCK)
            except zmq.Again:
                log.warning("supervisor does not take messages; %s dropped", op)

    def reply(self, ident: bytes, frames: list[Any]) -> None:
        try:
            self.router.send_multipart([ident, *frames], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("reply dropped: client does not take messages")

    def reply_ok(self, ident: bytes, header: dict[str, Any], frames: list[Any] = (),
                 **fields: Any) -> None:
        self.reply(ident, [p.reply_ok(header.get("id"), **fields), *frames])

    def reply_error(self, ident: bytes, header: dict[str, Any], code: str, msg: str,
                    **fields: Any) -> None:
        self.reply(ident, [p.reply_error(header.get("id"), code, msg, **fields)])

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._loop()
        finally:
            self.close()

    def _loop(self) -> None:
        self.cluster.start()
        next_tick = time.monotonic()
        while self.running:
            timeout_ms = max(0, int((next_tick - time.monotonic()) * 1000))
            for sock, _ in self.poller.poll(timeout_ms):
                if sock.closed:  # a handler disconnected this peer during the round
                    continue
                if sock is self.router:
                    self._drain(sock, self._on_request)
                elif sock is self.supervisor:
                    self._drain(sock, lambda frames: None)
                else:
                    self._drain(sock, self._on_reply)
                if not self.running:
                    break
            now = time.monotonic()
            if now >= next_tick:
                self._expire_callbacks(now)
                self.cluster.tick(now)
                self.maps.tick(now)
                next_tick = now + TICK_S

    def _drain(self, sock: zmq.Socket, handle: Callable[[list[bytes]], None]) -> None:
        for _ in range(DRAIN_MAX):
            if sock.closed:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            handle(frames)

    def _on_request(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            log.warning("dropped a message of %d frames", len(frames))
            return
        ident, head, rest = frames[0], frames[1], frames[2:]
        try:
            header = p.unpack_header(head)
        except ProtocolError as exc:
            log.warning("dropped a message with a bad header: %s", exc)
            return
        try:
            self._dispatch(ident, header, rest)
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
        handler = self.handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            raise ProtocolError(f"unknown operation {op!r}")
        handler(ident, header, frames)

    def _on_reply(self, frames: list[bytes]) -> None:
        try:
            header = p.unpack_header(frames[0])
        except (ProtocolError, IndexError):
            log.warning("dropped an undecodable reply")
            return
        entry = self.callbacks.pop(header.get("id"), None)
        if entry is None:
            return  # late reply to a request that timed out
        try:
            entry[1](header, frames[1:])
        except Exception:
            log.exception("reply handler failed")

    def _expire_callbacks(self, now: float) -> None:
        expired = [rid for rid, (deadline, _) in self.callbacks.items() if deadline <= now]
        for rid in expired:
            _, callback = self.callbacks.pop(rid)
            try:
                callback(None, [])
            except Exception:
                log.exception("timeout handler failed")

    # -- small handlers --------------------------------------------------------------------

    def _on_ping(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        self.reply_ok(ident, header, cluster=self.config.cluster_name, uuid=self.info.uuid,
                      name=self.name)

    def _on_status(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        owned, backups = self.cluster.replica_counts()
        self.reply_ok(
            ident, header, name=self.name, uuid=self.info.uuid, pid=self.info.pid,
            endpoint=self.info.endpoint, lite=self.info.lite, master=self.cluster.is_master,
            owned=owned, backups=backups, shm_bytes=self.store.shm_bytes(),
            rss=self.process.memory_info().rss, state=self.cluster.state.value,
            safe=self.cluster.is_safe(), members_version=self.cluster.members.version,
            stamp=self.cluster.table.stamp(), cluster=self.config.cluster_name)

    def _on_shutdown(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        self.reply_ok(ident, header)
        self.running = False

    def close(self) -> None:
        """Unlink every segment and close every socket; safe to call twice."""
        self.running = False
        self.store.close()
        if not self.ctx.closed:
            self.ctx.destroy(linger=0)


def run_member(config_dict: dict[str, Any], name: str, join_endpoints: list[str],
               supervisor_endpoint: str | None, lite: bool, ready: Any) -> None:
    """Process entry point: build the member, report its endpoint, serve until shut down."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {name} %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
    member = None
    try:
        member = Member(GridConfig(**config_dict), name, join_endpoints, supervisor_endpoint,
                        lite)
        signal.signal(signal.SIGTERM, lambda *_: setattr(member, "running", False))
        ready.send({"uuid": member.info.uuid, "endpoint": member.info.endpoint,
                    "pid": os.getpid()})
        ready.close()
        member.run()
    except Exception as exc:
        log.exception("member %s failed", name)
        with contextlib.suppress(OSError):
            ready.send({"error": repr(exc)})
        if member is not None:
            member.close()
        raise SystemExit(1) from None
