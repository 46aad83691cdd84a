"""A deterministic simulation of a whole cluster: real nodes on a simulated network and clock.

Every node is a ``workers.node.Node``, the very ClusterService and MapService a member process
runs, with the transport replaced: messages are events on one heap, delivered after a seeded
random delay, in order per channel (as one ZeroMQ connection keeps them). Faults are a killed
node (its messages vanish; the simulated supervisor tells the others, as the real one does) and
a hung node (it stops taking messages and timers until the master removes it and the supervisor
fences it). Clients write through the same protocol and remember what was acknowledged, so the
end state can be checked against it. A seed replays a run exactly.
"""

from __future__ import annotations

import heapq
import itertools
import random
import uuid
from collections.abc import Callable
from typing import Any

from grid import protocol as p
from grid.cluster.membership import MemberInfo, MemberList
from grid.config import GridConfig
from grid.partition.table import PartitionTable
from grid.serialization import partition_id_of, serialize_key, serialize_value
from workers.node import Node

TICK_S = 0.1
SUPERVISOR = b"supervisor"


class SimNetwork:
    def __init__(self, seed: int, config: GridConfig) -> None:
        self.rng = random.Random(seed)
        self.config = config
        self.time = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.nodes: dict[str, SimNode] = {}  # by endpoint
        self.channel_clock: dict[tuple[Any, Any], float] = {}
        self.clients: dict[bytes, SimClient] = {}
        self.log: list[str] = []
        self.fencing = True  # False: the supervisor is down, nobody kills removed members

    # -- the event heap --------------------------------------------------------------------

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.seq), action))

    def run_until(self, end: float) -> None:
        while self.events and self.events[0][0] <= end:
            when, _, action = heapq.heappop(self.events)
            self.time = when
            action()
        self.time = end

    def delay(self) -> float:
        # Mostly fast, sometimes slow: enough spread to reorder messages across channels.
        return self.rng.expovariate(1 / 0.002) + (0.05 if self.rng.random() < 0.02 else 0.0)

    def send(self, source: Any, target: Any, deliver: Callable[[], None],
             sender: SimNode | None = None) -> None:
        """Deliver after a random delay, never before an earlier message on the channel.
        What a node had sent but not yet delivered when it was killed is lost or not, at
        random (a killed process loses what it had not yet written to the socket)."""
        channel = (source, target)
        when = max(self.time + self.delay(), self.channel_clock.get(channel, 0.0))
        self.channel_clock[channel] = when

        def arrive() -> None:
            if sender is not None and not sender.alive and self.rng.random() < 0.5:
                return
            deliver()

        self.at(when, arrive)

    # -- nodes -----------------------------------------------------------------------------

    def add_node(self, join: list[str]) -> SimNode:
        node = SimNode(self, f"member-{len(self.nodes)}", join)
        self.nodes[node.info.endpoint] = node
        node.cluster.start()
        self.at(self.time + TICK_S, node.timer)
        return node

    def alive(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive]

    def kill(self, node: SimNode, why: str) -> None:
        if not node.alive:
            return
        node.alive = False
        self.log.append(f"{self.time:.3f} kill {node.name} ({why})")
        for other in self.alive():  # the supervisor sees the death at once
            self.send(SUPERVISOR, other.info.endpoint, lambda o=other: o.deliver(
                SUPERVISOR, p.request(p.MEMBER_DIED, 0, self.config.cluster_name,
                                      uuid=node.info.uuid), []))

    def hang(self, node: SimNode) -> None:
        node.paused = True
        self.log.append(f"{self.time:.3f} hang {node.name}")

    def resume(self, node: SimNode) -> None:
        """The hung node runs again: its timers fire first (the worst order, which a real
        process may well see), then it takes what it was sent meanwhile, in order."""
        node.paused = False
        self.log.append(f"{self.time:.3f} resume {node.name}")
        node.tick(self.time)
        held, node.held = node.held, []
        for action in held:
            action()

    def fence(self, member_uuid: str) -> None:
        if not self.fencing:
            return
        for node in self.nodes.values():
            if node.info.uuid == member_uuid:
                self.kill(node, "fenced")

    def close(self) -> None:
        for node in self.nodes.values():
            node.store.close()


class SimNode(Node):
    def __init__(self, net: SimNetwork, name: str, join: list[str]) -> None:
        self.net = net
        self.peers: dict[str, str] = {}  # key -> endpoint
        self.alive = True
        self.paused = False
        self.kill_after_reply = False  # die right after answering a client: the worst moment
        self.kill_after_publish = False  # die after a publish reached only some members
        self.held: list[Callable[[], None]] = []
        info = MemberInfo(str(uuid.UUID(int=net.rng.getrandbits(128))), name,
                          f"sim://{name}", 1000 + len(net.nodes))
        super().__init__(net.config, info, join)

    def now(self) -> float:
        return self.net.time

    def connect_peer(self, key: str, endpoint: str) -> None:
        self.peers[key] = endpoint

    def disconnect_peer(self, key: str) -> None:
        self.peers.pop(key, None)

    def send_peer(self, key: str, frames: list[bytes]) -> bool:
        endpoint = self.peers.get(key)
        if endpoint is None:
            return False
        target = self.net.nodes.get(endpoint)
        me = self.info.uuid.encode()
        if target is not None:
            self.net.send(me, endpoint, lambda: target.deliver(me, frames[0], frames[1:]),
                          sender=self)
        if self.kill_after_publish and p.unpack_header(frames[0]).get("op") == p.PUBLISH:
            self.net.kill(self, "chaos, in the middle of a publish")
        return True

    def reply(self, ident: bytes, frames: list[Any]) -> None:
        if ident == SUPERVISOR:
            return
        frames = [bytes(f) for f in frames]
        client = self.net.clients.get(ident)
        if client is not None:
            self.net.send(self.info.endpoint, ident, lambda: client.on_reply(frames),
                          sender=self)
            if self.kill_after_reply:
                self.net.kill(self, "chaos, right after a reply")
            return
        for node in self.net.nodes.values():
            if node.info.uuid.encode() == ident:
                self.net.send(self.info.endpoint, ident, lambda n=node: n.take_reply(frames),
                              sender=self)
                return

    def notify_supervisor(self, op: str, **fields: Any) -> None:
        if op == p.FENCE:
            self.net.at(self.net.time + 0.001, lambda: self.net.fence(fields["uuid"]))

    # -- what the network does to this node ------------------------------------------------

    def deliver(self, ident: bytes, head: bytes, frames: list[bytes]) -> None:
        if not self.alive:
            return
        if self.paused:
            self.held.append(lambda: self.deliver(ident, head, frames))
            return
        self.on_request(ident, head, frames)

    def take_reply(self, frames: list[bytes]) -> None:
        if not self.alive:
            return
        if self.paused:
            self.held.append(lambda: self.take_reply(frames))
            return
        self.on_reply(frames)

    def timer(self) -> None:
        if not self.alive:
            return
        if not self.paused:
            self.tick(self.net.time)
        if self.running:
            self.net.at(self.net.time + TICK_S, self.timer)
        else:
            self.net.kill(self, "stopped itself")


class SimClient:
    """Writes keys of its own one after another; remembers each acknowledged value. With
    ``key_count`` it rewrites that many keys over and over (a lost update shows as an older
    value), without it every write has a key of its own (a lost write shows as a hole)."""

    def __init__(self, net: SimNetwork, name: str, ns: str = "m",
                 key_count: int | None = None) -> None:
        self.key_count = key_count
        self.net = net
        self.ident = name.encode()
        self.ns = ns
        self.acked: dict[str, int] = {}
        # Values sent since the key's last acknowledgement: each may or may not have been
        # applied (no answer, or an answer that never came back), so each may be the value.
        self.unsure: dict[str, set[int]] = {}
        self.waiting: dict[int, Callable[[dict | None, list[bytes]], None]] = {}
        self.ids = itertools.count(1)
        self.members = MemberList()
        self.table = PartitionTable(partition_count=net.config.partition_count)
        self.counter = 0
        self.stopped = False
        self.silent: dict[str, float] = {}  # endpoint -> when it last failed to answer
        net.clients[self.ident] = self

    def request(self, endpoint: str, op: str, fields: dict, frames: list[bytes],
                callback: Callable[[dict | None, list[bytes]], None], timeout: float) -> None:
        rid = next(self.ids)
        self.waiting[rid] = callback
        head = p.request(op, rid, self.net.config.cluster_name, **fields)
        target = self.net.nodes.get(endpoint)
        if target is not None:
            self.net.send(self.ident, endpoint,
                          lambda: target.deliver(self.ident, head, list(frames)))
        self.net.at(self.net.time + timeout, lambda: self._expire(rid, endpoint))

    def _expire(self, rid: int, endpoint: str) -> None:
        callback = self.waiting.pop(rid, None)
        if callback is not None:
            self.silent[endpoint] = self.net.time
            callback(None, [])

    def on_reply(self, frames: list[bytes]) -> None:
        header = p.unpack_header(frames[0])
        callback = self.waiting.pop(header.get("id"), None)
        if callback is not None:
            callback(header, frames[1:])

    def refresh(self, then: Callable[[], None]) -> None:
        alive = self.net.alive()
        if not alive:
            return
        # As the real client does: ask members that answered lately first.
        recent = [n for n in alive
                  if self.net.time - self.silent.get(n.info.endpoint, -10.0) > 2.0]
        node = self.net.rng.choice(recent or alive)

        def on_view(header: dict | None, frames: list[bytes]) -> None:
            if header and header.get("ok"):
                members = MemberList.from_wire(header["members"])
                if members.version >= self.members.version:
                    self.members = members
                self.table.apply(PartitionTable.from_wire(header["table"]))
            self.net.at(self.net.time + 0.01, then)

        self.request(node.info.endpoint, p.TABLE, {}, [], on_view, timeout=0.5)

    def start(self) -> None:
        self.refresh(self.write_next)

    def write_next(self) -> None:
        if self.stopped:
            return
        self.counter += 1
        index = self.counter if self.key_count is None else self.counter % self.key_count
        key = f"{self.ident.decode()}-{index}"
        self.attempt(key, self.counter)

    def attempt(self, key: str, value: int) -> None:
        if self.stopped:
            return
        key_bytes = serialize_key(key)
        pid = partition_id_of(key_bytes, self.table.partition_count)
        owner = self.members.get(self.table.owner(pid) or "")
        if owner is None:
            self.refresh(lambda: self.attempt(key, value))
            return

        self.unsure.setdefault(key, set()).add(value)

        def on_ack(header: dict | None, frames: list[bytes]) -> None:
            if header and header.get("ok"):
                self.acked[key] = value
                self.unsure[key] = set()
                self.write_next()
            else:
                self.refresh(lambda: self.attempt(key, value))

        self.request(owner.endpoint, p.SET, {"ns": self.ns, "pid": pid},
                     [key_bytes, serialize_value(value)], on_ack, timeout=1.0)


def check_converged(net: SimNetwork) -> list[str]:
    """Problems with the end state: views that differ, partitions without a live owner."""
    problems = []
    alive = [n for n in net.alive() if not n.paused]
    views = {(n.cluster.members.version, n.cluster.table.stamp()) for n in alive}
    if len(views) != 1:
        problems.append(f"members disagree on the view: {views}")
    live = {n.info.uuid for n in alive}
    table = alive[0].cluster.table
    for pid in range(table.partition_count):
        if table.owner(pid) not in live:
            problems.append(f"partition {pid} has no live owner ({table.owner(pid)})")
    return problems


def lost_writes(net: SimNetwork, clients: list[SimClient]) -> list[str]:
    """Acknowledged writes that the partition's owner (or a backup) does not hold."""
    by_uuid = {n.info.uuid: n for n in net.alive()}
    table = net.alive()[0].cluster.table
    lost = []
    for client in clients:
        for key, value in client.acked.items():
            key_bytes = serialize_key(key)
            pid = partition_id_of(key_bytes, table.partition_count)
            for index, replica in enumerate(table.replicas(pid)):
                if replica is None or index > net.config.backup_count:
                    continue
                got = by_uuid[replica].store.get(pid, client.ns, key_bytes)
                allowed = {serialize_value(v) for v in client.unsure.get(key, ())}
                if got != serialize_value(value) and got not in allowed:
                    lost.append(f"{key}={value} on replica {index} of {pid}: {got!r}")
    return lost
