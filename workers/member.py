"""The member process: the node's transport shell.

A ROUTER socket bound on the loopback takes requests from the supervisor, and from clients and
peers that have no link to us; a link listener (grid/link.py) takes the links of peers and
clients that know us from the member list. This member's own requests (backups, joins, state
fetches) go to a peer over a link when the member list gives the peer's link address, else
over a DEALER, and their replies come back the same way. The loop polls them all, drains what
is ready, and runs the node's timers between batches. It never blocks on anything but the
poll.
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
from grid.busy_poll import BusyPoll
from grid.bytecode_count import COUNT_BYTECODES_ENV, count_on_signals
from grid.cluster.membership import MemberInfo
from grid.config import GridConfig
from grid.link import POLLERR, POLLIN, POLLOUT, Link, LinkError, address_of, listen
from workers.journal import Journal
from workers.local_reads import LocalReadDirectory
from workers.node import Node
from workers.poller import make_poller

log = logging.getLogger("shmgrid.member")

DRAIN_MAX = 512  # messages taken from one socket before the others get a turn
TICK_S = 0.1
# A spinning member's yield that takes longer than this gave its core to other work (``_loop``):
# a peer of the same exchange sharing the core (the client, a backup) runs a round of 50 to
# 200 µs and sleeps again, which is the turn-taking a spin is for.
YIELD_CONTENDED_S = 300e-6
ROUND = "round"  # the member's one kind of wait for busy polling: from a round to the next
# A test hook: "member-2=5,member-3=1" makes those members wait so many seconds before they
# start (a slow start that tests can rely on). Unset in normal runs.
START_DELAY_ENV = "SHMGRID_TEST_START_DELAY"
# A test hook: the member so named dies on its first migration commit, after it took the step
# into its table and before its answer leaves (the master cannot know it committed).
DIE_ON_COMMIT_ENV = "SHMGRID_TEST_DIE_ON_COMMIT"
# Tests only: this member acknowledges every Nth backup operation without applying it (a lost
# operation that replica sync must repair). Never set outside tests.
DROP_BACKUP_OPS_ENV = "SHMGRID_TEST_DROP_BACKUP_OPS"
# Tests only: the member acknowledges writes before its backups have them (a broken grid for
# the chaos checker to catch). Never set outside tests.
ACK_EARLY_ENV = "SHMGRID_TEST_ACK_EARLY"


class Member(Node):
    def __init__(self, config: GridConfig, name: str, join_endpoints: list[str],
                 supervisor_endpoint: str | None = None, lite: bool = False) -> None:
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.setsockopt(zmq.RCVHWM, 0)
        port = self.router.bind_to_random_port(f"tcp://{config.host}")
        self.poller = make_poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.peers: dict[str, zmq.Socket] = {}  # member uuid or endpoint -> DEALER
        self.max_message_bytes = config.max_message_bytes
        # Whether to poll on without sleeping after a round of messages began: learned from
        # the gaps between rounds (grid/busy_poll.py), so that a member spins while a client
        # keeps it busy and not when it hears from anyone only now and then.
        self.busy_poll = BusyPoll(config.member_busy_poll_us / 1e6)
        self.link_listener = listen(config.host, config.link_transport)
        self.poller.register(self.link_listener.fileno(), zmq.POLLIN)
        # Links by file descriptor: (the ident its requests are answered to, the link); the
        # ident is None for our own links to peers, which bring replies.
        self.links: dict[int, tuple[bytes | None, Link]] = {}
        self.accepted: dict[bytes, Link] = {}  # ident -> a link a peer or client opened
        self.link_numbers = itertools.count(1)
        self.peer_links: dict[str, Link] = {}  # member uuid -> our open link to it
        self.link_addresses: dict[str, str] = {}  # member uuid -> its link listener
        self.supervisor = self._dealer(supervisor_endpoint) if supervisor_endpoint else None
        self.process = psutil.Process()
        journal = None
        if config.persistence_dir:
            journal = Journal(os.path.join(config.persistence_dir, name), name,
                              config.cluster_name, config.partition_count,
                              config.persistence_fsync, config.persistence_fsync_interval)
        uuid = (journal.restored.uuid if journal else None) or str(uuid_mod.uuid4())
        if journal is not None:
            journal.save_identity(uuid)
        # The log's writer thread wakes the loop through this pipe when writes became
        # durable (an owner with persistence_fsync = always answers only then).
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.poller.register(self._wake_r, zmq.POLLIN)
        info = MemberInfo(uuid, name, f"tcp://{config.host}:{port}", os.getpid(), lite,
                          address_of(self.link_listener))
        super().__init__(config, info, join_endpoints, journal)
        if not config.migration_stale_read_disabled:
            # Clients on this host may read published maps from our memory. Not with
            # migration_stale_read_disabled: the directory does not say which partitions
            # migrate, and a get must not read those then.
            self.store.local = LocalReadDirectory(self.store.segment_prefix, uuid,
                                                  config.partition_count)
            self.store.shared_partitions = set()  # those we serve (publish_ownership)
        self.handlers[p.STATUS] = self._on_status
        self.handlers[p.SHUTDOWN] = self._on_shutdown

    # -- transport -------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic()

    def _dealer(self, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.connect(endpoint)
        self.poller.register(sock, zmq.POLLIN)
        return sock

    def connect_peer(self, key: str, endpoint: str) -> None:
        """A member of our list gets a link (opened at the first send); any other address
        (a join seed, a removed member) a DEALER."""
        if key in self.peers or key in self.link_addresses:
            return
        info = self.info if key == self.info.uuid else self.cluster.members.get(key)
        if info is not None and info.link:
            self.link_addresses[key] = info.link
        else:
            self.peers[key] = self._dealer(endpoint)

    def disconnect_peer(self, key: str) -> None:
        self.link_addresses.pop(key, None)
        link = self.peer_links.get(key)
        if link is not None:
            self._drop_link(link.fd)
        sock = self.peers.pop(key, None)
        if sock is not None:
            self.poller.unregister(sock)
            sock.close(0)

    def send_peer(self, key: str, frames: list[Any]) -> bool:
        address = self.link_addresses.get(key)
        if address is not None:
            link = self.peer_links.get(key)
            if link is None:
                try:
                    link = Link.connect(address, self.max_message_bytes)
                except OSError:
                    return False  # nobody listens there: the peer is gone
                self.peer_links[key] = link
                self._add_link(None, link)
            return self._send_link(link, frames)
        sock = self.peers.get(key)
        if sock is None:
            return False
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.Again:
            log.warning("send to %s would block; dropped %s", key, frames[0][:40])
            return False
        finally:
            self.poller.used(sock)

    def notify_supervisor(self, op: str, **fields: Any) -> None:
        if self.supervisor is not None:
            header = p.request(op, next(self.ids), self.config.cluster_name,
                               **{"from": self.info.uuid,
                                  p.SECRET_FIELD: self.config.cluster_secret, **fields})
            try:
                self.supervisor.send_multipart([header], zmq.NOBLOCK)
            except zmq.Again:
                log.warning("supervisor does not take messages; %s dropped", op)
            self.poller.used(self.supervisor)

    def wake(self) -> None:
        """From another thread: make the loop look at durable writes now."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def reply(self, ident: bytes, frames: list[Any]) -> None:
        link = self.accepted.get(ident)
        if link is not None:
            self._send_link(link, frames)
            return
        try:
            self.router.send_multipart([ident, *frames], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("reply dropped: client does not take messages")
        self.poller.used(self.router)

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> None:
        try:
            # The supervisor has our endpoint already, so the members load in parallel; the
            # others' joins wait (and retry) until we serve.
            self.restore()
            self._loop()
        finally:
            self.close()

    def _loop(self) -> None:
        self.cluster.start()
        next_tick = time.monotonic()
        polls = self.busy_poll
        spin_until = round_began = 0.0
        while self.running:
            # Busy-poll until a while after a round of messages began: the next one (a
            # client's next request, a backup's acknowledgement) often comes sooner than this
            # process would wake up from a sleep (grid/busy_poll.py has the numbers).
            events = self.poller.poll(0) if polls.limit else None
            if not events:
                now = time.perf_counter()
                if now < spin_until:
                    os.sched_yield()  # whoever else wants this core comes first
                    if time.perf_counter() - now < YIELD_CONTENDED_S:
                        continue
                    # Another process had this core meanwhile: spinning on would take
                    # turns with it. Sleep, and leave the core to it.
                    spin_until = 0.0
                timeout_ms = max(0, int((next_tick - time.monotonic()) * 1000))
                events = self.poller.poll(timeout_ms)
            if events:
                now = time.perf_counter()
                if round_began:
                    polls.record(ROUND, now - round_began)
                round_began = now
                # The whole limit while rounds come that often on average, else none
                # (grid/busy_poll.py says why not twice the mean).
                spin_until = now + polls.limit if polls.budget(ROUND) else 0.0
            for sock, event in events:
                if sock.__class__ is int:
                    if sock == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                        self.maps.on_durable()
                    elif sock == self.link_listener.fileno():
                        self._accept_links()
                    else:
                        self._on_link(sock, event)
                    if not self.running:
                        break
                    continue
                if sock.closed:  # a handler disconnected this peer during the round
                    continue
                if sock is self.router:
                    self._drain(sock, self._on_router_message)
                elif sock is self.supervisor:
                    self._drain(self.supervisor, lambda frames: None)
                else:
                    self._drain(sock, self.on_reply)
                if not self.running:
                    break
            now = time.monotonic()
            if now >= next_tick:
                self.tick(now)
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
        self.poller.used(sock)  # more may wait: the next round looks

    # -- links ---------------------------------------------------------------------------

    def _add_link(self, ident: bytes | None, link: Link) -> None:
        self.links[link.fd] = (ident, link)
        if ident is not None:
            self.accepted[ident] = link
        self.poller.register(link.fd, zmq.POLLIN)

    def _drop_link(self, fd: int) -> None:
        entry = self.links.pop(fd, None)
        if entry is None:
            return
        ident, link = entry
        self.poller.unregister(fd)
        link.close()
        if ident is not None:
            del self.accepted[ident]
            self.maps.clients.closed(ident)
        else:
            for key in [k for k, v in self.peer_links.items() if v is link]:
                del self.peer_links[key]  # the next send opens a new one

    def _send_link(self, link: Link, frames: list[Any]) -> bool:
        if not link.send(frames):
            self._drop_link(link.fd)
            return False
        if link.wants_write:  # the socket took part of it: the loop sends the rest
            self.poller.modify(link.fd, POLLIN | POLLOUT)
        return True

    def _accept_links(self) -> None:
        while True:
            try:
                sock, _ = self.link_listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("could not accept a link: %s", exc)
                return
            self._add_link(b"link-%d" % next(self.link_numbers),
                           Link(sock, self.max_message_bytes))

    def _on_link(self, fd: int, event: int) -> None:
        entry = self.links.get(fd)
        if entry is None:
            return  # dropped earlier in this round
        ident, link = entry
        if event & POLLOUT:
            if not link.flush():
                self._drop_link(fd)
                return
            if not link.wants_write:
                self.poller.modify(fd, POLLIN)
        if not event & (POLLIN | POLLERR):
            return
        try:
            messages = link.receive()
        except LinkError:
            self._drop_link(fd)
            return
        for frames in messages:  # a message has at least one frame, its header
            if ident is None:
                self.on_reply(frames)
            else:
                self.on_request(ident, frames[0], frames[1:])

    def _on_router_message(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            log.warning("dropped a message of %d frames", len(frames))
            return
        self.on_request(frames[0], frames[1], frames[2:])

    # -- member-only handlers --------------------------------------------------------------

    def _on_status(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        owned, backups = self.cluster.replica_counts()
        self.reply_ok(
            ident, header, name=self.name, uuid=self.info.uuid, pid=self.info.pid,
            endpoint=self.info.endpoint, lite=self.cluster.is_lite, master=self.cluster.is_master,
            owned=owned, backups=backups, shm_bytes=self.store.shm_bytes(),
            rss=self.process.memory_info().rss, state=self.cluster.state.value,
            safe=self.cluster.is_safe(), unbacked=self.maps.unbacked_partitions(),
            migrations=self.cluster.migration_status() if self.cluster.is_master else None,
            short_of_backups=self.cluster.short_of_backups() if self.cluster.is_master
            else None,
            sent_entries=self.migrations.sent_entries, sent_bytes=self.migrations.sent_bytes,
            # Backup operations sent and not yet acknowledged (a slow or hung backup grows it).
            backup_backlog=self.maps.streams.unacked_count(),
            # Replica sync (seed 004): dirty namespaces here, syncs asked for or lent out.
            **self.syncs.status(),
            members_version=self.cluster.members.version,
            stamp=self.cluster.table.stamp(), cluster=self.config.cluster_name,
            requests=self.maps.requests, chained_answers=self.maps.chained_answers,
            maps=self.maps.owned_sizes(),
            persistence=self.journal.stats() if self.journal is not None else None)

    def _on_shutdown(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        self.reply_ok(ident, header)
        self.running = False

    def close(self) -> None:
        """Write the log out, unlink every segment and close every socket; safe to call
        twice."""
        self.running = False
        if self.journal is not None:
            try:
                # Clean only if we stop in order: every write we applied is in the log.
                if self.journal.log is not None:
                    self.journal.log.close()
                    self.save_view(clean=self.journal.log.failure is None)
                self.journal.close()
            except Exception:
                log.exception("could not close the persistence log cleanly")
        self.syncs.close()
        self.store.close()
        for fd in list(self.links):
            self._drop_link(fd)
        self.link_listener.close()
        self.poller.close()
        if not self.ctx.closed:
            self.ctx.destroy(linger=0)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1


def run_member(config_dict: dict[str, Any], name: str, join_endpoints: list[str],
               supervisor_endpoint: str | None, lite: bool, ready: Any) -> None:
    """Process entry point: build the member, report its endpoint, serve until shut down."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {name} %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
    if os.environ.get(COUNT_BYTECODES_ENV):  # tools/count_bytecodes.py
        count_on_signals(os.environ[COUNT_BYTECODES_ENV])
    if os.environ.get(START_DELAY_ENV):  # tests only: a member that is slow to start
        time.sleep(_member_value(os.environ[START_DELAY_ENV], name))
    member = None
    try:
        member = Member(GridConfig(**config_dict), name, join_endpoints, supervisor_endpoint,
                        lite)
        if os.environ.get(DIE_ON_COMMIT_ENV) == name:
            _die_on_first_commit(member)
        drop = _member_value(os.environ.get(DROP_BACKUP_OPS_ENV, ""), name)
        if drop:
            log.warning("test hook %s: every %d-th backup operation is dropped",
                        DROP_BACKUP_OPS_ENV, int(drop))
            member.maps.drop_backup_every = int(drop)
        if os.environ.get(ACK_EARLY_ENV) == "1":
            log.warning("test hook %s: writes are acknowledged before the backups have them",
                        ACK_EARLY_ENV)
            member.maps.ack_early = True
        # SIGTERM: leave gracefully (the master moves our replicas away, then removes us).
        # (Named arguments, not ``*_``: mypyc mis-compiles a lambda of only ``*args``.)
        leave = member.cluster.request_leave
        signal.signal(signal.SIGTERM, lambda _signal, _frame: leave())
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


def _die_on_first_commit(member: Member) -> None:
    commit = member.handlers[p.COMMIT]

    def commit_then_die(ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        member.reply = lambda *_: None  # type: ignore[method-assign]  # no answer leaves
        commit(ident, header, frames)
        log.warning("test hook %s: dying after a commit", DIE_ON_COMMIT_ENV)
        os.kill(os.getpid(), signal.SIGKILL)

    member.handlers[p.COMMIT] = commit_then_die


def _member_value(spec: str, name: str) -> float:
    """The number ``spec`` (``name=number,...``) gives member ``name``; 0 if none."""
    for item in spec.split(","):
        who, _, seconds = item.partition("=")
        if who.strip() == name:
            return float(seconds)
    return 0.0
