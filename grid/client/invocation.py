"""Sending requests to members and the client's whole retry policy.

Synchronous on purpose: one link (grid/link.py) per member the member list gives, a DEALER to
any other address (a seed), requests tagged with a correlation id, replies matched by id (a
late reply to an abandoned attempt is dropped). Every decision to retry is made in
:meth:`Invoker.invoke_partitions`: wrong target, partition migrating, member left and attempt
time-outs are retried with backoff, after refreshing the partition table, until the
invocation deadline; anything else goes to the caller at once.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from grid import protocol as p
from grid.busy_poll import BusyPoll, usable_cores
from grid.client.registry import pid_alive
from grid.cluster.membership import MemberList
from grid.errors import (
    ClusterNotRunningError,
    GridError,
    IndeterminateOperationStateError,
    MemberLeftError,
    NotReadyError,
    OperationTimeoutError,
    PartlyAppliedError,
    ProtocolError,
)
from grid.link import POLLERR, POLLIN, POLLOUT, Link, LinkError, LinkPoll
from grid.partition.table import PartitionTable, PartitionTableError

# The largest reply frame a link takes: a member's own limit on what it is sent.
MAX_REPLY_BYTES = 1 << 31
BACKOFF_S_MIN = 0.01
BACKOFF_S_MAX = 0.5
REFRESH_TIMEOUT_S = 1.0
SILENT_S = 5.0
LIVENESS_CHECK_S = 0.05

Reply = tuple[dict[str, Any], list[bytes]]
# A partition request: its pids' part of one message, and what to do with the reply (to the
# pids of a group, which in invoke_keys's first attempt names a partition once a key).
BuildRequest = Callable[[list[int]], tuple[dict[str, Any], list[bytes]]]
HandleReply = Callable[[list[int], dict[str, Any], list[bytes]], None]


class _SocketPoll:
    """zmq_poll over ZeroMQ sockets and descriptors (a request went on a DEALER)."""

    __slots__ = ("items",)

    def __init__(self, items: list[tuple[Any, int]]) -> None:
        self.items = items

    def poll(self, timeout_ms: int) -> list[tuple[Any, int]]:
        return zmq.zmq_poll(self.items, timeout_ms)


class Invoker:
    def __init__(self, seeds: Sequence[str], cluster_name: str | None,
                 invocation_timeout: float, attempt_timeout: float,
                 busy_poll_s: float = 0.0) -> None:
        self.ctx = zmq.Context()
        self.seeds = list(seeds)
        self.cluster_name = cluster_name or ""
        self.invocation_timeout = invocation_timeout
        self.attempt_timeout = attempt_timeout
        self.sockets: dict[str, zmq.Socket] = {}
        self.links: dict[str, Link] = {}  # endpoint -> open link
        self.link_endpoints: dict[int, str] = {}  # an open link's file descriptor -> endpoint
        self.link_addresses: dict[str, str] = {}  # endpoint -> its member's link listener
        self.ids = itertools.count(1)
        self.lock = threading.RLock()
        self.members = MemberList()
        self.table: PartitionTable | None = None
        self.endpoints: dict[str, str] = {}  # member uuid -> endpoint
        # Each partition's owner endpoint (_owner_list).
        self._owner_endpoints: list[str | None] | None = None
        # The poll of the open links for replies, and for writing where one waits to (_poller).
        self._poll_links: LinkPoll | None = None
        self.pids: dict[str, int] = {}  # endpoint -> member process id (same host)
        self.silent: dict[str, float] = {}  # endpoint -> when it last failed to answer
        self.dead_pids: set[int] = set()  # member processes seen gone: asked no more
        self.closed = False
        # Invocation ids of mutating calls: unique per client, the same on every resend, so
        # that a member answers a resend with the first outcome instead of applying it twice.
        self.client_id = uuid.uuid4().hex[:16]
        self.invocations = itertools.count(1)
        self.busy_poll = BusyPoll(busy_poll_s)
        # A wait spins only while the members still working on it fit on the cores beside
        # this process (grid/busy_poll.py): a tunable for tests.
        self.spin_cores = usable_cores()

    def invocation_id(self) -> str:
        return f"{self.client_id}-{next(self.invocations)}"

    # -- raw requests ----------------------------------------------------------------------

    def _socket(self, endpoint: str) -> zmq.Socket:
        sock = self.sockets.get(endpoint)
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            try:
                sock.connect(endpoint)
            except zmq.ZMQError:
                sock.close(0)  # else closing the context waits for it forever
                raise
            self.sockets[endpoint] = sock
        return sock

    def _drop_socket(self, endpoint: str) -> None:
        sock = self.sockets.pop(endpoint, None)
        if sock is not None:
            sock.close(0)
        link = self.links.pop(endpoint, None)
        if link is not None:
            self._poll_links = None
            if self.link_endpoints.get(link.fd) == endpoint:  # (a closed link's fd is reused)
                del self.link_endpoints[link.fd]
            link.close()

    def _send(self, endpoint: str, frames: list[bytes]) -> bool:
        """Send one request to ``endpoint``; False when it cannot go (nobody listens)."""
        address = self.link_addresses.get(endpoint)
        if address is None:
            self._socket(endpoint).send_multipart(frames)
            return True
        link = self.links.get(endpoint)
        if link is None or link.closed:
            link = self._open_link(endpoint, address)
            if link is None:
                return False
        if link.send(frames):
            if link.out:
                self._poll_links = None  # the socket took part: poll it for writing too
            return True
        self._drop_socket(endpoint)  # it broke: the next request opens a new one
        return False

    def _open_link(self, endpoint: str, address: str) -> Link | None:
        """A new link to a member; None if it cannot be opened (nobody listens)."""
        self._drop_socket(endpoint)  # (a closed link, and a seed's DEALER, if any)
        try:
            link = self.links[endpoint] = Link.connect(address, MAX_REPLY_BYTES)
        except OSError:
            return None
        self._poll_links = None
        self.link_endpoints[link.fd] = endpoint
        # First on every link: who we are, so that a backup can answer our single-key
        # writes in their owner's place (grid/cluster/chain.py). Nobody waits for its reply.
        link.send([p.request(p.HELLO, next(self.ids), self.cluster_name, cid=self.client_id)])
        return link

    def _greet_members(self) -> None:
        """Open a link to every member we know that we have none to yet (a backup can only
        answer us on a link we opened)."""
        for endpoint, address in self.link_addresses.items():
            link = self.links.get(endpoint)
            if (link is None or link.closed) and self.pids.get(endpoint) not in self.dead_pids:
                self._open_link(endpoint, address)

    def exchange(self, requests: list[tuple[str, str, dict[str, Any], list[bytes]]],
                 timeout: float, replicas: int = 1) -> list[Reply | None]:
        """Send every (endpoint, op, fields, frames) request, then gather replies until all
        have come or ``timeout`` passed; a missing reply is None. ``replicas``: the members
        that work on each request at once (a write's owner and its backups, which apply it
        while the owner still works on it), for the spin's count of busy members."""
        with self.lock:
            if self.closed:
                raise GridError("the client is closed")
            rids, wanted = [], {}
            dealers = False  # a request went on a DEALER socket (a member without a link)
            for endpoint, op, fields, frames in requests:
                rid = next(self.ids)
                rids.append(rid)
                if self.pids.get(endpoint) in self.dead_pids:
                    continue  # its reply would never come: None at once
                header = p.request(op, rid, self.cluster_name, **fields)
                if self._send(endpoint, [header, *frames]):
                    wanted[rid] = endpoint
                    dealers = dealers or endpoint not in self.link_addresses
            return self._gather(rids, wanted, requests[0][1] if requests else "", timeout,
                                dealers, replicas)

    def _gather(self, rids: list[int], wanted: dict[int, str], kind: str, timeout: float,
                dealers: bool, replicas: int = 1) -> list[Reply | None]:
        """The replies to the requests ``rids`` (None for each that did not come in
        ``timeout``), of which ``wanted`` (request id -> endpoint) were sent, some on
        DEALER sockets if ``dealers``, each worked on by ``replicas`` members at once.
        Caller holds the lock."""
        if not wanted:
            return [None] * len(rids)
        results: dict[int, Reply] = {}
        clock = time.perf_counter
        sent = clock()
        deadline = sent + timeout
        spin_until = sent + self.busy_poll.budget(kind)  # (grid/busy_poll.py)
        # Spin only while the members still working for us leave this process a core.
        cores = self.spin_cores / replicas
        poller = self._poller(wanted, dealers)
        left = len(wanted)
        while left:
            now = clock()
            if now >= deadline:
                break
            events = None
            if left < cores:  # not while they need every core: spinning would take one
                while now < spin_until:
                    events = poller.poll(0)
                    if events:
                        break
                    os.sched_yield()  # whoever else wants this core comes first
                    now = clock()
            if not events:
                events = poller.poll(int(min(deadline - now, LIVENESS_CHECK_S) * 1000) + 1)
            for sock, mask in events:
                if sock.__class__ is not int:
                    if mask & POLLIN:
                        self._collect(sock, wanted, results)
                elif not self._on_link(sock, mask, wanted, results):
                    break  # a link broke: its requests get no reply
            if not events and self._gone(wanted, results):
                break  # a member we wait for has died: retry elsewhere now
            if poller is not self._poll_links:
                poller = self._poller(wanted, dealers)  # a link broke, wrote, or waits to
            left = len(wanted) - len(results)
        if not left:
            self.busy_poll.record(kind, clock() - sent)
        return list(map(results.get, rids))

    def _poller(self, wanted: dict[int, str], dealers: bool) -> LinkPoll | _SocketPoll:
        """What to poll: every open link (a reply may come from a member other than the one
        asked: a backup answering a write), for writing too while it has bytes to send, and
        with ``dealers`` the sockets of the requests sent without a link. The links' poll
        is kept from one call to the next (``_poll_links``) until a link opens, closes, or
        starts or stops waiting to write."""
        links = self._poll_links
        if links is None:
            links = self._poll_links = LinkPoll(
                [(link.fd, POLLIN | (POLLOUT if link.out else 0))
                 for link in self.links.values() if not link.closed])
        if not dealers:
            return links
        addresses, open_links = self.link_addresses, self.links
        return _SocketPoll([*links.items, *((self.sockets[endpoint], POLLIN)
                                            for endpoint in set(wanted.values())
                                            if endpoint not in addresses
                                            or endpoint not in open_links)])

    def _on_link(self, fd: int, mask: int, wanted: dict[int, str],
                 results: dict[int, Reply]) -> bool:
        """Send what waits on the link with ``fd`` and take its replies; False if it broke
        (its waiting requests are given up: the caller retries them)."""
        endpoint = self.link_endpoints[fd]
        link = self.links[endpoint]
        try:
            if mask & POLLOUT:
                if not link.flush():
                    raise LinkError("the link broke")
                if not link.out:
                    self._poll_links = None  # all written: poll it for replies only
            messages = link.receive() if mask & (POLLIN | POLLERR) else []
        except LinkError:
            self._drop_socket(endpoint)
            for rid in [rid for rid, ep in wanted.items() if ep == endpoint]:
                if rid not in results:
                    del wanted[rid]
            return False
        for frames in messages:
            self._take_reply(frames, wanted, results)
        return True

    def _gone(self, wanted: dict[int, str], results: dict[int, Reply]) -> bool:
        """Whether a member we still wait for is a local process that no longer exists (so
        its reply will never come: no need to wait out the attempt timeout). Such a process
        is remembered, so that retries until the table names a new owner do not wait again."""
        pending = {ep for rid, ep in wanted.items() if rid not in results}
        gone = {self.pids[ep] for ep in pending
                if ep in self.pids and not pid_alive(self.pids[ep])}
        self.dead_pids |= gone
        return bool(gone)

    @staticmethod
    def _collect(sock: zmq.Socket, wanted: dict[int, str], results: dict[int, Reply]) -> None:
        """Take every reply waiting on ``sock``; keep the ones asked for (late ones drop)."""
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            Invoker._take_reply(frames, wanted, results)

    @staticmethod
    def _take_reply(frames: list[bytes], wanted: dict[int, str],
                    results: dict[int, Reply]) -> None:
        try:
            header = p.unpack_header(frames[0])
        except ProtocolError:
            return
        if header.get("id") in wanted:
            results[header["id"]] = (header, frames[1:])

    def call(self, endpoint: str, op: str, fields: dict[str, Any] | None = None,
             frames: list[bytes] | None = None, timeout: float | None = None) -> Reply | None:
        return self.exchange([(endpoint, op, fields or {}, frames or [])],
                             self.attempt_timeout if timeout is None else timeout)[0]

    # -- the cluster view ------------------------------------------------------------------

    def refresh(self, prefer_master: bool = True) -> None:
        """Load the member list and table: from the master if it answers (its view is the
        newest), else from any member; raise ClusterNotRunningError if nobody answers."""
        with self.lock:
            candidates = []
            if self.members.master:
                candidates.append(self.members.master.endpoint)
            candidates += [m.endpoint for m in self.members.members] + self.seeds
            # Members that just failed to answer are asked last: they are likely gone.
            now = time.monotonic()
            candidates.sort(key=lambda e: now - self.silent.get(e, -SILENT_S) < SILENT_S)
            seen, answered, last = set(), False, None
            for endpoint in candidates:
                if endpoint in seen:
                    continue
                seen.add(endpoint)
                reply = self.call(endpoint, p.TABLE, timeout=REFRESH_TIMEOUT_S)
                if reply is None:
                    last = f"{endpoint} did not answer"
                    self.silent[endpoint] = time.monotonic()
                    continue
                self.silent.pop(endpoint, None)
                header, _ = reply
                if not header.get("ok"):
                    error = p.error_from_reply(header)
                    if not error.retryable:
                        raise error
                    last = str(error)
                    continue
                self._take_view(header)
                answered = True
                if header.get("master") or not prefer_master:
                    return
            if not answered:
                raise ClusterNotRunningError(", ".join(self.seeds) or "(no address)",
                                             last or "no member answered")

    def _take_view(self, header: dict[str, Any]) -> None:
        members = MemberList.from_wire(header["members"])
        table = PartitionTable.from_wire(header["table"])
        if not self.cluster_name:
            self.cluster_name = header.get("cluster", "")
        if members.version >= self.members.version:
            gone = set(self.endpoints.values()) - {m.endpoint for m in members.members}
            for endpoint in gone:
                if endpoint not in self.seeds:
                    self._drop_socket(endpoint)
            self.members = members
            self.endpoints = {m.uuid: m.endpoint for m in members.members}
            self.pids = {m.endpoint: m.pid for m in members.members}
            self.link_addresses = {m.endpoint: m.link for m in members.members if m.link}
            self.dead_pids &= set(self.pids.values())
            self._greet_members()
        if self.table is None:
            self.table = table
        else:
            self.table.apply(table)
        self._owner_endpoints = None

    def _working_on(self, write: bool, pid: int) -> int:
        """The members that work on a request about ``pid`` at once, for the spin's count: a
        write's live replicas (its backups apply it while its owner still works on it), a
        read's owner."""
        if not write:
            return 1
        row = self.table.replicas(pid)  # type: ignore[union-attr]
        return len(row) - row.count(None)

    def owner_endpoint(self, pid: int) -> str | None:
        owners = self._owner_list()
        return None if owners is None else owners[pid]

    def _owner_list(self) -> list[str | None] | None:
        """Each partition's owner endpoint (None: it has none, or we do not know it), or None
        without a table: built on first use after the table or the endpoints changed, since
        every batch looks up one per partition it touches."""
        owners = self._owner_endpoints
        if owners is None:
            if not self.table:
                return None
            endpoints, table = self.endpoints, self.table
            owners = self._owner_endpoints = [
                endpoints.get(table.owner(i)) for i in range(table.partition_count)]  # type: ignore[arg-type]
        return owners

    # -- partition invocations with retries ------------------------------------------------

    def invoke_key(self, op: str, pid: int, fields: dict[str, Any], frames: list[bytes]
                   ) -> Reply:
        """``invoke_partitions`` of one request to one partition; its reply. Most such calls
        (a get, a put) know the owner and get a plain answer at once: that first attempt is
        made here, one ``exchange`` without the batch's bookkeeping. Anything else it brings
        (no answer, an error, a hint that the partition moved) goes on in
        ``invoke_partitions`` as that call's first attempt, so that retries and what a
        failed write reports are decided in one place."""
        deadline = time.monotonic() + self.invocation_timeout
        owners = self._owner_endpoints or self._owner_list()
        endpoint = owners[pid] if owners else None
        first = None
        if endpoint is not None:
            first = self.exchange([(endpoint, op, fields, frames)],
                                  min(self.attempt_timeout, self.invocation_timeout),
                                  self._working_on(op in p.WRITE_OPS, pid))
            reply = first[0]
            if reply is not None and reply[0].get("ok") and not reply[0].get("rows") \
                    and not reply[0].get("wrong"):
                return reply
        out: list[Reply] = []
        self.invoke_partitions(op, [pid], lambda group: (fields, frames),
                               lambda group, header, frames: out.append((header, frames)),
                               None if first is None else (deadline, [[pid]], first))
        return out[0]

    def invoke_keys(self, op: str, pids: list[int], keys: Sequence[bytes],
                    fields: dict[str, Any], handle: HandleReply) -> None:
        """``invoke_partitions`` of a read of keys, ``keys[i]`` of partition ``pids[i]``: one
        message per owner with its keys and each key's partition (``pids``, one per key, or
        one for all when they share it), the keys grouped by owner as they come, not by
        partition first (a batch of 100 keys spans about 80 partitions: grouping them so
        took 38 of the 88 µs of a get_all's Python in the client, by owner 14). Partitions
        whose first attempt fails are retried as ``invoke_partitions`` retries them."""

        def build(group: list[int]) -> tuple[dict[str, Any], list[bytes]]:
            wanted = set(group)
            chosen = [i for i, pid in enumerate(pids) if pid in wanted]
            return {**fields, "pids": [pids[i] for i in chosen]}, \
                [p.pack_items([keys[i] for i in chosen])]

        if not pids:
            return
        owners = self._owner_list()
        by_owner: dict[str | None, tuple[list[int], list[bytes]]] = {}
        if owners is not None and pids.count(pids[0]) == len(pids):
            # One partition (a batch of one hash tag): its id once stands for every key's.
            by_owner[owners[pids[0]]] = ([pids[0]], list(keys))
        elif owners is not None:
            for pid, key in zip(pids, keys, strict=True):
                endpoint = owners[pid]
                group = by_owner.get(endpoint)
                if group is None:
                    by_owner[endpoint] = group = ([], [])
                group[0].append(pid)
                group[1].append(key)
        if owners is None or None in by_owner:  # an owner not known yet: wait for it there
            self.invoke_partitions(op, pids, build, handle)
            return
        deadline = time.monotonic() + self.invocation_timeout
        replies = self.exchange(
            [(endpoint, op, {**fields, "pids": group[0]}, [p.pack_items(group[1])])
             for endpoint, group in by_owner.items()],
            min(self.attempt_timeout, self.invocation_timeout))
        self.invoke_partitions(op, pids, build, handle,
                               (deadline, [group[0] for group in by_owner.values()], replies))

    def invoke_partitions(self, op: str, pids: Sequence[int], build: BuildRequest,
                          handle: HandleReply,
                          first: tuple[float, list[list[int]], list[Reply | None]] | None = None
                          ) -> None:
        """Run ``op`` on every partition in ``pids``: one message per owning member with
        that member's partitions, retrying the partitions that failed retryably. A write
        that runs out of time after an attempt that may have been applied (no answer, or
        the owner lost the partition while it waited for backups) raises
        IndeterminateOperationStateError. ``first``: the invocation's deadline, and the
        partitions and replies of its first attempt, made already, one message per owner
        (``invoke_key``, ``invoke_keys``; a group may name a partition more than once)."""
        deadline = time.monotonic() + self.invocation_timeout if first is None else first[0]
        todo = [] if first is not None else sorted(set(pids))  # (the first attempt's, made)
        backoff = BACKOFF_S_MIN
        last: GridError | None = None
        maybe_applied = False
        applied = False  # a part of this write was answered as done
        write = op in p.WRITE_OPS
        for _attempt in itertools.count():
            moved = False  # a member's hint moved one of our partitions on: retry at once
            retry = []
            timeout = min(self.attempt_timeout, max(0.0, deadline - time.monotonic()))
            if first is not None:
                groups, replies = first[1], first[2]
                timeout = min(self.attempt_timeout, self.invocation_timeout)
                first = None
            else:
                if self.table is None:
                    self.refresh()
                by_owner: dict[str, list[int]] = defaultdict(list)
                owners = self._owner_list()
                for pid in todo:
                    endpoint = None if owners is None else owners[pid]
                    if endpoint is None:
                        retry.append(pid)
                        last = NotReadyError(f"partition {pid} has no owner yet")
                    else:
                        by_owner[endpoint].append(pid)
                requests, groups = [], []
                for endpoint, group in by_owner.items():
                    fields, frames = build(group)
                    requests.append((endpoint, op, fields, frames))
                    groups.append(group)
                replies = self.exchange(requests, timeout,
                                        self._working_on(write, groups[0][0])) \
                    if requests else []
            for group, reply in zip(groups, replies, strict=True):
                if reply is None:
                    retry.extend(group)
                    last = MemberLeftError(f"no reply to {op} in {timeout:.1f} s")
                    maybe_applied = True
                    continue
                header, frames = reply
                if header.get("rows"):
                    moved = self._take_rows(header["rows"]) or moved
                if not header.get("ok"):
                    error = p.error_from_reply(header)
                    if not error.retryable:
                        if write and (maybe_applied or applied or any(
                                r is None or r[0].get("ok") for r in replies)):
                            raise PartlyAppliedError(op, error) from error
                        raise error
                    retry.extend(group)
                    last = error
                    maybe_applied = maybe_applied or bool(header.get("indeterminate"))
                    continue
                wrong = header.get("wrong")
                if wrong:
                    wrong = set(wrong)
                    handle([pid for pid in group if pid not in wrong], header, frames)
                else:
                    handle(group, header, frames)
                applied = True
                if wrong:
                    retry.extend(wrong)
                    last = MemberLeftError(f"partitions {sorted(wrong)[:5]} moved")
                    # (moved away after the owner applied them: workers/map_service.py)
                    maybe_applied = maybe_applied or bool(header.get("indeterminate"))
            if not retry:
                return
            todo = sorted(set(retry))
            if moved and all(self.owner_endpoint(pid) for pid in todo):
                continue  # versions only rise, so this cannot go on for ever
            if time.monotonic() + backoff >= deadline:
                error = IndeterminateOperationStateError if write and maybe_applied \
                    else OperationTimeoutError
                raise error(op, self.invocation_timeout, todo[0] if len(todo) == 1 else None,
                            last)
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_S_MAX)
            try:
                self.refresh(prefer_master=False)
            except ClusterNotRunningError as exc:
                last = exc

    def _take_rows(self, rows: Any) -> bool:
        """Apply a member's rows of partitions it does not own; whether any was newer."""
        if self.table is None or not isinstance(rows, list):
            return False
        moved = False
        for row in rows:
            try:
                pid, version, replicas = row
                moved = self.table.take_row(pid, version, replicas) or moved
            except (TypeError, ValueError, PartitionTableError):
                continue  # a malformed hint is only a hint
        if moved:
            self._owner_endpoints = None
        return moved

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for sock in self.sockets.values():
                sock.close(0)
            self.sockets.clear()
            for link in self.links.values():
                link.close()
            self.links.clear()
            self.link_endpoints.clear()
            self.ctx.term()
