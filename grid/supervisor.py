"""The supervisor: a process manager, not a coordinator.

It starts member processes, watches them, tells the members at once when one dies (a single
host knows a death in milliseconds; heartbeats are the fallback for a hung process), kills
(fences) members the master removed, starts new members when asked, removes a dead member's
shared-memory segments, and keeps the registry file that clients and the CLI read. The cluster
keeps serving if the supervisor dies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import multiprocess
import zmq

from grid import protocol as p
from grid.client.registry import write_registry
from grid.config import GridConfig
from workers.member import run_member
from workers.shm import remove_segments

log = logging.getLogger("shmgrid.supervisor")

READY_TIMEOUT_S = 30.0
SHUTDOWN_GRACE_S = 5.0
POLL_MS = 100


class StartupError(RuntimeError):
    """The cluster could not be started; the message says why."""


@dataclass
class MemberProcess:
    name: str
    process: Any
    uuid: str = ""
    endpoint: str = ""
    pid: int = 0
    lite: bool = False
    fenced: bool = False
    socket: Any = field(default=None, repr=False)

    def to_registry(self) -> dict[str, Any]:
        return {"name": self.name, "uuid": self.uuid, "endpoint": self.endpoint,
                "pid": self.pid, "lite": self.lite}


class Supervisor:
    def __init__(self, config: GridConfig) -> None:
        self.config = config
        self.registry = config.registry_path()
        self.mp = multiprocess.get_context("spawn")
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port(f"tcp://{config.host}")
        self.endpoint = f"tcp://{config.host}:{port}"
        self.members: dict[str, MemberProcess] = {}  # by name
        self.next_index = 0
        self.state = "starting"
        self.stopping = False
        self.ids = 0
        self.started_at = time.time()

    # -- members ---------------------------------------------------------------------------

    def _segment_prefix(self, name: str) -> str:
        return f"shmgrid-{self.config.cluster_name}-{name}"

    def _join_endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members.values() if m.endpoint and not m.fenced]

    def spawn_members(self, count: int, lite: bool = False) -> list[MemberProcess]:
        """Start ``count`` members in parallel and wait until each reports its endpoint."""
        join = self._join_endpoints()
        started = []
        for _ in range(count):
            name = f"member-{self.next_index}"
            self.next_index += 1
            receiver, sender = self.mp.Pipe(duplex=False)
            proc = self.mp.Process(
                target=run_member, name=name, daemon=False,
                args=(self.config.to_dict(), name, join, self.endpoint, lite, sender))
            proc.start()
            sender.close()
            started.append((MemberProcess(name, proc, lite=lite), receiver))
        for member, receiver in started:
            if not receiver.poll(READY_TIMEOUT_S):
                member.process.kill()
                raise StartupError(f"{member.name} did not start within {READY_TIMEOUT_S} s")
            try:
                report = receiver.recv()
            except EOFError:
                raise StartupError(f"{member.name} exited while starting") from None
            if "error" in report:
                raise StartupError(f"{member.name} failed to start: {report['error']}")
            member.uuid, member.endpoint, member.pid = (
                report["uuid"], report["endpoint"], report["pid"])
            member.socket = self._dealer(member.endpoint)
            self.members[member.name] = member
            log.info("started %s (pid %d) at %s", member.name, member.pid, member.endpoint)
        self.write_registry()
        return [m for m, _ in started]

    def _dealer(self, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        return sock

    def _ask(self, member: MemberProcess, op: str, timeout: float = 2.0,
             **fields: Any) -> dict[str, Any] | None:
        """A request to one member, answered within ``timeout`` or None."""
        self.ids += 1
        rid = self.ids
        member.socket.send_multipart(
            [p.request(op, rid, self.config.cluster_name, **fields)])
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if not member.socket.poll(remaining * 1000):
                return None
            header = p.unpack_header(member.socket.recv_multipart()[0])
            if header.get("id") == rid:
                return header
        return None

    def _tell(self, member: MemberProcess, op: str, **fields: Any) -> None:
        self.ids += 1
        member.socket.send_multipart(
            [p.request(op, self.ids, self.config.cluster_name, **fields)], zmq.NOBLOCK)

    def live_members(self) -> list[MemberProcess]:
        return [m for m in self.members.values() if m.process.is_alive()]

    def wait_formed(self, expected: int, timeout: float = READY_TIMEOUT_S) -> None:
        """Until the master lists ``expected`` members and has assigned every partition."""
        deadline = time.monotonic() + timeout
        master = next(iter(self.members.values()))
        while time.monotonic() < deadline:
            view = self._ask(master, p.TABLE)
            if view and view.get("ok") and len(view["members"][1]) >= expected:
                reply = self._ask(master, p.FORM)
                if reply and reply.get("assigned") and self._members_agree():
                    return
            time.sleep(0.05)
        raise StartupError(f"the cluster did not form within {timeout:g} s")

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
            "supervisor": {"pid": os.getpid(), "endpoint": self.endpoint},
            "members": [m.to_registry() for m in self.members.values()],
            "config": self.config.to_dict(),
            "started_at": self.started_at,
        })

    # -- running ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the configured members and wait until the cluster has formed."""
        try:
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
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stopping:
            # A member's sentinel (a pipe) hangs up when its process ends: zmq reports that as
            # POLLERR. Every member is also checked each round, which reaps it.
            sentinels = [m.process.sentinel for m in self.members.values()]
            for fd in sentinels:
                poller.register(fd, zmq.POLLIN | zmq.POLLERR)
            ready = dict(poller.poll(POLL_MS))
            for fd in sentinels:
                poller.unregister(fd)
            for member in list(self.members.values()):
                if not member.process.is_alive():
                    self._on_death(member)
            if self.router in ready:
                self._drain_commands()
        self.shutdown()

    def _on_death(self, member: MemberProcess) -> None:
        member.process.join(timeout=1)
        code = member.process.exitcode
        log.warning("%s (pid %d) died with exit code %s", member.name, member.pid, code)
        removed = remove_segments(self._segment_prefix(member.name))
        if removed:
            log.info("removed %d shared-memory segments of %s", len(removed), member.name)
        del self.members[member.name]
        member.socket.close(0)
        if not self.stopping:
            for other in self.live_members():
                self._tell(other, p.MEMBER_DIED, uuid=member.uuid)
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
                reply = self._command(header)
            except Exception as exc:
                log.exception("command failed")
                reply = p.reply_error(None, p.SERVER, str(exc))
            if reply is not None:
                self.router.send_multipart([ident, reply])

    def _command(self, header: dict[str, Any]) -> bytes | None:
        op, rid = header.get("op"), header.get("id")
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
            [member] = self.spawn_members(1, lite=bool(header.get("lite")))
            return p.reply_ok(rid, member=member.to_registry())
        return p.reply_error(rid, p.PROTOCOL, f"unknown command {op!r}")

    def _fence(self, uuid: Any, reason: str) -> None:
        """Kill a member the master removed, so it can never come back with stale data."""
        for member in self.members.values():
            if member.uuid == uuid and member.process.is_alive():
                log.warning("fencing %s (pid %d): %s", member.name, member.pid, reason)
                member.fenced = True
                os.kill(member.pid, signal.SIGKILL)

    def shutdown(self) -> None:
        """Stop every member (refusing writes first), clean up segments and the registry."""
        self.stopping = True
        self.state = "stopping"
        live = self.live_members()
        if live:
            with contextlib.suppress(OSError):
                self.write_registry()
            master = live[0]
            self._ask(master, p.SET_STATE, timeout=1.0, state="PASSIVE")
            for member in live:
                self._tell(member, p.SHUTDOWN)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for member in list(self.members.values()):
            member.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if member.process.is_alive():
                log.warning("%s did not stop in time; killing it", member.name)
                member.process.kill()
                member.process.join(timeout=2)
            remove_segments(self._segment_prefix(member.name))
            if member.socket is not None:
                member.socket.close(0)
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
    return run(GridConfig(**json.loads(argv[0])))


if __name__ == "__main__":
    sys.exit(main())
