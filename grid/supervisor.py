"""The supervisor: a process manager, not a coordinator.

It starts member processes, watches them, tells the members at once when one dies (a single
host knows a death in milliseconds; heartbeats are the fallback for a hung process), kills
(fences) members the master removed, starts new members when asked, removes a dead member's
shared-memory segments, and keeps the registry file that clients and the CLI read. The cluster
keeps serving if the supervisor dies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import multiprocess
import zmq

from grid import protocol as p
from grid.client.registry import create_time, write_registry
from grid.config import SECRET_ENV, GridConfig
from grid.errors import NotAuthorizedError
from grid.local_reads import segment_prefix
from persistence import MetadataStore
from persistence.errors import CorruptMetadataError
from workers.local_reads import fence
from workers.member import run_member
from workers.shm import remove_segments

log = logging.getLogger("shmgrid.supervisor")

READY_TIMEOUT_S = 30.0
SHUTDOWN_GRACE_S = 5.0
POLL_MS = 100


class StartupError(RuntimeError):
    """The cluster could not be started; the message says why."""


def restart_names(persistence_dir: str) -> list[str]:
    """The members whose folders ``persistence_dir`` holds (a member's identity file in
    it), in the order they were first started. StartupError if the folders come from more
    than one cluster, or disagree on the partition count."""
    if not persistence_dir or not os.path.isdir(persistence_dir):
        return []
    identities: dict[str, dict[str, Any]] = {}
    for name in os.listdir(persistence_dir):
        meta = MetadataStore(os.path.join(persistence_dir, name, "meta"))
        if not os.path.isfile(meta.file_path("identity")):
            continue
        try:
            identities[name] = json.loads(meta.read("identity") or b"{}")
        except (CorruptMetadataError, ValueError) as exc:
            raise StartupError(f"the identity of {name} under {persistence_dir} is damaged: "
                               f"{exc}") from exc
    for key in ("cluster_name", "partition_count"):
        seen: dict[Any, list[str]] = {}
        for name, identity in identities.items():
            seen.setdefault(identity.get(key), []).append(name)
        if len(seen) > 1:
            raise StartupError(f"the member folders under {persistence_dir} disagree on "
                               f"{key}: " + "; ".join(f"{', '.join(sorted(n))}: {v!r}"
                                                     for v, n in seen.items()))
    return sorted(identities, key=_index)


def _index(name: str) -> int:
    """member-7 -> 7 (members are numbered in the order they were started)."""
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


@dataclass
class MemberProcess:
    name: str
    process: Any
    uuid: str = ""
    endpoint: str = ""
    pid: int = 0
    create_time: float = 0.0  # with the pid, tells this process from a later one of that pid
    lite: bool = False
    fenced: bool = False
    socket: Any = field(default=None, repr=False)

    def to_registry(self) -> dict[str, Any]:
        return {"name": self.name, "uuid": self.uuid, "endpoint": self.endpoint,
                "pid": self.pid, "create_time": self.create_time, "lite": self.lite}


@dataclass
class Starting:
    """A member process that was started and has not reported ready yet. Every started
    process is held here or in ``Supervisor.members``, so that whatever fails, it is stopped."""

    member: MemberProcess
    ready: Any  # the read end of the pipe on which the member reports its endpoint
    deadline: float
    requester: tuple[bytes, Any] | None = None  # ADD_MEMBER: (router identity, request id)


class Supervisor:
    def __init__(self, config: GridConfig) -> None:
        if not config.cluster_secret:
            config = config.replace(cluster_secret=secrets.token_hex(16))
        self.config = config
        self.registry = config.registry_path()
        self.mp = multiprocess.get_context("spawn")
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port(f"tcp://{config.host}")
        self.endpoint = f"tcp://{config.host}:{port}"
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.members: dict[str, MemberProcess] = {}  # by name: started and ready
        self.starting: dict[str, Starting] = {}  # by name: started, not ready yet
        self.next_index = 0
        self.state = "starting"
        self.stopping = False
        self.ids = 0
        self.started_at = time.time()
        self.create_time = create_time(os.getpid())

    # -- members ---------------------------------------------------------------------------

    def _segment_prefix(self, name: str) -> str:
        return segment_prefix(self.config.cluster_name, name)

    def _remove_segments(self, name: str) -> list[str]:
        """Fence a gone member's local read directory (clients that map it stop trusting
        it), then unlink all its segments. Fencing comes before anyone is told of the death,
        so no client reads the dead member once a new owner may have taken writes."""
        prefix = self._segment_prefix(name)
        fence(prefix)
        return remove_segments(prefix)

    def _join_endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members.values() if m.endpoint and not m.fenced]

    def spawn_members(self, count: int, lite: bool = False,
                      names: list[str] | None = None) -> list[MemberProcess]:
        """Start ``count`` members (or those ``names``) in parallel and wait until each
        reports its endpoint. On a failure the members of the batch that are still starting
        stay in ``self.starting``, where shutdown() stops them."""
        entries = [self._start_member(lite, name=name) for name in names] if names else \
            [self._start_member(lite) for _ in range(count)]
        for entry in entries:
            if not entry.ready.poll(max(0.0, entry.deadline - time.monotonic())):
                self._abandon(entry)
                raise StartupError(
                    f"{entry.member.name} did not start within {READY_TIMEOUT_S:g} s")
            try:
                self._accept(entry)
            except StartupError:
                self._abandon(entry)
                raise
        self.write_registry()
        return [entry.member for entry in entries]

    def _start_member(self, lite: bool, requester: tuple[bytes, Any] | None = None,
                      name: str | None = None) -> Starting:
        """Start one member process (a new name, or ``name`` restarting from its folder);
        it is in ``self.starting`` until it reports."""
        if name is None:
            name = f"member-{self.next_index}"
            self.next_index += 1
        receiver, sender = self.mp.Pipe(duplex=False)
        proc = self.mp.Process(
            target=run_member, name=name, daemon=False,
            args=(self.config.to_dict(), name, self._join_endpoints(), self.endpoint, lite,
                  sender))
        proc.start()
        sender.close()
        member = MemberProcess(name, proc, pid=proc.pid, create_time=create_time(proc.pid) or 0.0,
                               lite=lite)
        entry = Starting(member, receiver, time.monotonic() + READY_TIMEOUT_S, requester)
        self.starting[name] = entry
        return entry

    def _accept(self, entry: Starting) -> MemberProcess:
        """Take a starting member's report (it is ready to read): the member joins
        ``self.members``, or StartupError says why it did not start."""
        member = entry.member
        try:
            report = entry.ready.recv()
        except (EOFError, OSError):
            raise StartupError(f"{member.name} exited while starting") from None
        if "error" in report:
            raise StartupError(f"{member.name} failed to start: {report['error']}")
        del self.starting[member.name]
        entry.ready.close()
        member.uuid, member.endpoint = report["uuid"], report["endpoint"]
        member.socket = self._dealer(member.endpoint)
        self.members[member.name] = member
        log.info("started %s (pid %d) at %s", member.name, member.pid, member.endpoint)
        return member

    def _abandon(self, entry: Starting) -> None:
        """Stop a member that failed to start (it has joined no cluster, so nothing is lost)
        and clean up after it."""
        self.starting.pop(entry.member.name, None)
        entry.ready.close()
        entry.member.process.kill()
        entry.member.process.join(timeout=2)
        self._remove_segments(entry.member.name)

    def _dealer(self, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        return sock

    def _request(self, op: str, **fields: Any) -> bytes:
        """A request header with a new id and the cluster secret (members take control
        messages only with it)."""
        self.ids += 1
        fields[p.SECRET_FIELD] = self.config.cluster_secret
        return p.request(op, self.ids, self.config.cluster_name, **fields)

    def _ask(self, member: MemberProcess, op: str, timeout: float = 2.0,
             **fields: Any) -> dict[str, Any] | None:
        """A request to one member, answered within ``timeout`` or None."""
        header = self._request(op, **fields)
        rid = self.ids
        member.socket.send_multipart([header])
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if not member.socket.poll(remaining * 1000):
                return None
            header = p.unpack_header(member.socket.recv_multipart()[0])
            if header.get("id") == rid:
                return header
        return None

    def _tell(self, member: MemberProcess, op: str, **fields: Any) -> None:
        member.socket.send_multipart([self._request(op, **fields)], zmq.NOBLOCK)

    def live_members(self) -> list[MemberProcess]:
        return [m for m in self.members.values() if m.process.is_alive()]

    def wait_formed(self, expected: int, timeout: float = READY_TIMEOUT_S) -> None:
        """Until the master lists ``expected`` members and has assigned every partition."""
        deadline = time.monotonic() + timeout
        master = next(iter(self.members.values()))
        formed = False
        while time.monotonic() < deadline:
            if not formed:
                view = self._ask(master, p.TABLE)
                if view and view.get("ok") and len(view["members"][1]) >= expected:
                    reply = self._ask(master, p.FORM)
                    if reply and reply.get("refused"):
                        raise StartupError(reply["refused"])
                    # A restart may form without members whose files are stale (fenced).
                    formed = bool(reply and reply.get("assigned"))
            if formed:
                self._reap_fenced()
                if self._members_agree():
                    return
            time.sleep(0.05)
        raise StartupError(f"the cluster did not form within {timeout:g} s")

    def _reap_fenced(self) -> None:
        """While the cluster forms: take the master's fence requests (a restart removes a
        member whose files are stale) and forget members that died."""
        self._drain_commands()
        for member in list(self.members.values()):
            if not member.process.is_alive():
                self._on_death(member)

    def _members_agree(self) -> bool:
        """Every live member follows the same table (its stamp) and member list."""
        stamps = set()
        for member in self.live_members():
            status = self._ask(member, p.STATUS)
            if not status or not status.get("ok"):
                return False
            stamps.add((status["stamp"], status["members_version"]))
        return len(stamps) == 1

    # -- registry --------------------------------------------------------------------------

    def write_registry(self) -> None:
        write_registry(self.registry, {
            "cluster_name": self.config.cluster_name,
            "state": self.state,
            "supervisor": {"pid": os.getpid(), "create_time": self.create_time,
                           "endpoint": self.endpoint},
            "members": [m.to_registry() for m in self.members.values()],
            "config": self.config.to_dict(),
            "started_at": self.started_at,
        })

    # -- running ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the configured members and wait until the cluster has formed."""
        try:
            names = restart_names(self.config.persistence_dir)
            if names:
                # Hot restart: one member per folder, under its name; the first starts alone
                # (it is the master the others join), then the rest load in parallel.
                log.info("restarting %d members from %s", len(names),
                         self.config.persistence_dir)
                self.next_index = 1 + max(_index(name) for name in names)
                self.spawn_members(1, names=names[:1])
                if len(names) > 1:
                    self.spawn_members(len(names) - 1, names=names[1:])
                self.wait_formed(len(names))
            else:
                self.spawn_members(1)
                if self.config.members > 1:
                    self.spawn_members(self.config.members - 1)
                self.wait_formed(self.config.members)
        except BaseException:
            self.shutdown()
            raise
        self.state = "ready"
        self.write_registry()
        log.info("cluster %s ready: %d members", self.config.cluster_name, len(self.members))

    def serve(self) -> None:
        """Watch members and answer commands until asked to stop."""
        while not self.stopping:
            self.poll_once(POLL_MS)
        self.shutdown()

    def poll_once(self, timeout_ms: int) -> None:
        """One round of the loop: deaths, members that finished starting, commands. Nothing
        in it waits for a member, so a death is reported at once even while one starts."""
        # A member's sentinel (a pipe) hangs up when its process ends: zmq reports that as
        # POLLERR. Every member is also checked each round, which reaps it. A starting
        # member's report pipe becomes readable when it reports or exits.
        fds = [m.process.sentinel for m in self.members.values()]
        fds += [entry.ready.fileno() for entry in self.starting.values()]
        for fd in fds:
            self.poller.register(fd, zmq.POLLIN | zmq.POLLERR)
        try:
            ready = dict(self.poller.poll(timeout_ms))
        finally:
            for fd in fds:
                self.poller.unregister(fd)
        for member in list(self.members.values()):
            if not member.process.is_alive():
                self._on_death(member)
        for entry in list(self.starting.values()):
            if entry.ready.poll(0):
                self._on_started(entry)
            elif time.monotonic() >= entry.deadline:
                self._on_start_failed(entry, f"{entry.member.name} did not start within "
                                             f"{READY_TIMEOUT_S:g} s")
        if self.router in ready:
            self._drain_commands()

    def _on_started(self, entry: Starting) -> None:
        """An added member reported: it is ready, or it failed."""
        try:
            member = self._accept(entry)
        except StartupError as exc:
            self._on_start_failed(entry, str(exc))
            return
        self.write_registry()
        if entry.requester is not None:
            self._answer(entry.requester[0], p.reply_ok(entry.requester[1],
                                                        member=member.to_registry()))

    def _on_start_failed(self, entry: Starting, why: str) -> None:
        log.error("%s", why)
        self._abandon(entry)
        if entry.requester is not None:
            self._answer(entry.requester[0], p.reply_error(entry.requester[1], p.SERVER, why))

    def _answer(self, ident: bytes, reply: bytes) -> None:
        with contextlib.suppress(zmq.ZMQError):  # the requester may have gone
            self.router.send_multipart([ident, reply], zmq.NOBLOCK)

    def _on_death(self, member: MemberProcess, restart: bool = True) -> None:
        member.process.join(timeout=1)
        code = member.process.exitcode
        log.warning("%s (pid %d) died with exit code %s", member.name, member.pid, code)
        removed = self._remove_segments(member.name)
        if removed:
            log.info("removed %d shared-memory segments of %s", len(removed), member.name)
        del self.members[member.name]
        member.socket.close(0)
        if not self.stopping:
            for other in self.live_members():
                self._tell(other, p.MEMBER_DIED, uuid=member.uuid)
            if restart and self.config.restart_on_crash and self.config.persistence_dir \
                    and not member.fenced and self.state == "ready":
                log.warning("restart_on_crash: starting %s again from its files",
                            member.name)
                self._start_member(member.lite, name=member.name)
        self.write_registry()

    def _drain_commands(self) -> None:
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            ident = frames[0]
            try:
                header = p.unpack_header(frames[1])
                reply = self._command(ident, header)
            except Exception as exc:
                log.exception("command failed")
                reply = p.reply_error(None, p.SERVER, str(exc))
            if reply is not None:
                self.router.send_multipart([ident, reply])

    def _command(self, ident: bytes, header: dict[str, Any]) -> bytes | None:
        op, rid = header.get("op"), header.get("id")
        if isinstance(op, str) and op in p.SUPERVISOR_OPS and \
                not p.has_secret(header, self.config.cluster_secret):
            log.warning("refused %r from a sender without the cluster secret", op)
            if op == p.FENCE:
                return None
            return p.reply_error(rid, p.AUTH, str(NotAuthorizedError(op)), op=op)
        if op == p.FENCE:
            sender = next((m for m in self.members.values() if m.uuid == header.get("from")),
                          None)
            if sender is None or sender.fenced:
                # A removed member that still ran (it hung and came back) must not fence
                # the members of the cluster that removed it.
                log.warning("ignored a fence request from a removed member")
                return None
            self._fence(header.get("uuid"), header.get("reason", ""))
            return None
        if op == p.STOP:
            self.stopping = True
            return p.reply_ok(rid)
        if op == p.ADD_MEMBER:
            # Answered when the member reports (poll_once); the loop goes on meanwhile.
            self._start_member(bool(header.get("lite")), requester=(ident, rid))
            return None
        if op == p.RESTART_MEMBER:
            return self._restart_member(ident, rid, header.get("name"))
        return p.reply_error(rid, p.PROTOCOL, f"unknown command {op!r}")

    def _restart_member(self, ident: bytes, rid: Any, name: Any) -> bytes | None:
        """Kill member ``name`` (as a crash would) and start it again from its files; or,
        if it is not running (it died, or was killed), just start it from its files. The
        answer comes when it reports. Only with persistence: otherwise it would come back
        empty, under a new identity."""
        if not self.config.persistence_dir:
            return p.reply_error(rid, p.STATE, "restart-member needs a cluster started with "
                                 "--data-dir", op="restart-member", state="in memory")
        member = self.members.get(name) if isinstance(name, str) else None
        if member is None:
            folder = os.path.join(self.config.persistence_dir, str(name))
            if not isinstance(name, str) or name in self.starting or "/" in name or \
                    not os.path.isdir(folder):
                return p.reply_error(rid, p.PROTOCOL, f"no member named {name!r} runs or "
                                     f"has files in {self.config.persistence_dir}")
            log.warning("starting %s again from its files", name)
            self._start_member(False, requester=(ident, rid), name=name)
            return None
        log.warning("restarting %s (pid %d) from its files", name, member.pid)
        os.kill(member.pid, signal.SIGKILL)
        member.process.join(timeout=5)
        self._on_death(member, restart=False)
        self._start_member(member.lite, requester=(ident, rid), name=name)
        return None

    def _fence(self, uuid: Any, reason: str) -> None:
        """Kill a member the master removed, so it can never come back with stale data."""
        for member in self.members.values():
            if member.uuid == uuid and member.process.is_alive():
                log.warning("fencing %s (pid %d): %s", member.name, member.pid, reason)
                member.fenced = True
                os.kill(member.pid, signal.SIGKILL)

    def _master(self, live: list[MemberProcess]) -> MemberProcess | None:
        """The live member that is master: one that says so, or the first of a member's list."""
        by_uuid = {m.uuid: m for m in live}
        for member in live:
            view = self._ask(member, p.TABLE, timeout=1.0)
            if not view or not view.get("ok"):
                continue
            if view.get("master"):
                return member
            with contextlib.suppress(LookupError, TypeError):
                first = by_uuid.get(view["members"][1][0][0])
                if first is not None:
                    return first
        return None

    def shutdown(self) -> None:
        """Stop every member (refusing writes first), clean up segments and the registry."""
        self.stopping = True
        self.state = "stopping"
        for entry in self.starting.values():  # members still starting just stop
            entry.member.process.terminate()
            if entry.requester is not None:
                self._answer(entry.requester[0], p.reply_error(
                    entry.requester[1], p.SERVER, "the supervisor is stopping"))
        live = self.live_members()
        if live:
            with contextlib.suppress(OSError):
                self.write_registry()
            master = self._master(live)
            reply = self._ask(master, p.SET_STATE, timeout=1.0, state="PASSIVE",
                              stopping=True) \
                if master is not None else None
            if not reply or not reply.get("ok"):
                log.warning("could not set the cluster PASSIVE before stopping: %s",
                            reply.get("msg") if reply else "no master answered")
            for member in live:
                self._tell(member, p.SHUTDOWN)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        starting = [entry.member for entry in self.starting.values()]
        for member in list(self.members.values()) + starting:
            member.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if member.process.is_alive():
                log.warning("%s did not stop in time; killing it", member.name)
                member.process.kill()
                member.process.join(timeout=2)
            self._remove_segments(member.name)
            if member.socket is not None:
                member.socket.close(0)
        for entry in self.starting.values():
            entry.ready.close()
        self.starting.clear()
        self.members.clear()
        remove_segments(f"shmgrid-{self.config.cluster_name}")
        with contextlib.suppress(FileNotFoundError):
            self.registry.unlink()
        self.ctx.destroy(linger=0)
        log.info("cluster %s stopped", self.config.cluster_name)


def run(config: GridConfig) -> int:
    """Run a supervisor in this process until SIGINT/SIGTERM or `shmgrid stop`."""
    supervisor = Supervisor(config)

    def on_signal(signum: int, frame: Any) -> None:
        supervisor.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        supervisor.start()
    except Exception as exc:
        log.error("%s", exc)
        return 1
    supervisor.serve()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m grid.supervisor CONFIG_JSON``: the detached supervisor process."""
    import json

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s supervisor %(levelname)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    config = json.loads(argv[0])
    # The secret, if one was configured, comes in the environment: a command line is public.
    config.setdefault("cluster_secret", os.environ.get(SECRET_ENV, ""))
    return run(GridConfig(**config))


if __name__ == "__main__":
    sys.exit(main())
