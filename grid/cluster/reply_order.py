"""When an owner may answer: after the write is durable, and never before an earlier write to
the same partition and namespace is.

An owner applies a write at once and answers once every synchronous backup has applied it. A
read (or a write that changed nothing, whose answer reports what it saw) that comes meanwhile
sees the applied value; if it were answered at once and the owner then died before any backup
had the write, a reader would have seen a value that no later read sees. So every answer about
a (partition, namespace) slot waits in that slot's queue behind the writes that came before
it. A ticket is answered when it is ready (durable, or failed) and first in all of its slots.

Pure state: no sockets, no clocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from typing import Any

Slot = tuple[int, str]  # (partition id, namespace)


class Ticket:
    """One answer to give: to every request waiting on it (a resend waits on the first)."""

    __slots__ = ("slots", "waiting", "needs_lease", "failed", "fields", "frames", "waiters",
                 "iid", "outcome", "written", "log_seq", "chained")

    def __init__(self, slots: Iterable[Slot], waiters: list[tuple[bytes, Any]],
                 fields: dict[str, Any] | None = None, frames: list[bytes] | None = None,
                 outcome: Any = None) -> None:
        self.slots = tuple(dict.fromkeys(slots))
        self.waiters = waiters  # (ident, request id) of each request to answer
        self.fields = fields or {}
        self.frames = frames or []
        self.outcome = outcome  # what a resend of this invocation is answered with
        self.waiting: dict[str, set[int]] = {}  # sync backup -> partitions it has yet to apply
        # The owner acts alone (a write no sync backup holds, or any read): only while no one
        # can have removed it.
        self.needs_lease = False
        self.failed: tuple[str, str] | None = None  # (error code, message)
        self.iid: str | None = None  # the invocation to remember once it is durable
        self.written: set[int] = set()  # partitions this write was applied to here
        self.log_seq = 0  # the owner's log record to see on disk first (0: none to wait for)
        # The backup may answer the first waiter in the owner's place (grid/cluster/chain.py).
        self.chained = False

    @property
    def ready(self) -> bool:
        return self.failed is not None or (
            not self.waiting and not self.needs_lease and not self.log_seq)

    def fail(self, code: str, msg: str) -> None:
        if self.failed is None:
            self.failed = (code, msg)


class ReplyOrder:
    def __init__(self, on_idle: Callable[[list[Slot]], None] | None = None) -> None:
        self._queues: dict[Slot, deque[Ticket]] = {}
        # Told of the slots whose last waiting answer left (once a release, all of them):
        # from then on, until the next write to one, what it holds is durable (local reads
        # may answer from it).
        self._on_idle = on_idle
        # Tickets about no slot (a batch write naming no partition of ours): nothing to wait
        # behind, so they leave as soon as they are ready.
        self._free: list[Ticket] = []

    def busy(self, slots: Iterable[Slot]) -> bool:
        """Whether any of ``slots`` has an answer still waiting."""
        queues = self._queues
        return bool(queues) and not queues.keys().isdisjoint(slots)

    def busy_partition(self, pid: int) -> bool:
        """Whether any answer about partition ``pid`` is still waiting."""
        return any(slot[0] == pid for slot in self._queues)

    def enqueue(self, ticket: Ticket) -> None:
        slots, queues = ticket.slots, self._queues
        if not slots:
            self._free.append(ticket)
        elif queues.keys().isdisjoint(slots):  # (mostly: nothing waits in any of them)
            queues.update(zip(slots, map(deque, repeat((ticket,))), strict=False))
            return
        for slot in slots:
            queue = queues.get(slot)
            if queue is None:
                queue = queues[slot] = deque()
            queue.append(ticket)

    def release(self, slots: Iterable[Slot]) -> list[Ticket]:
        """Take the tickets that may be answered now, in the order they must be."""
        out = [ticket for ticket in self._free if ticket.ready]
        if out:
            self._free = [ticket for ticket in self._free if not ticket.ready]
        work = list(slots)
        queues = self._queues
        idle: list[Slot] = []
        if work and len(queues.get(work[-1], ())) == 1:
            # The first slot looked at holds one ticket; if that ticket is ready and alone in
            # every one of its slots (a batch write nothing waits behind or before), they
            # all go at once.
            ticket = queues[work[-1]][0]
            if ticket.ready and max(map(len, map(queues.__getitem__, ticket.slots))) == 1:
                deque(map(queues.__delitem__, ticket.slots), 0)
                idle.extend(ticket.slots)
                out.append(ticket)
                if slots is ticket.slots:
                    work = []
        while work:
            queue = queues.get(work.pop())
            while queue:
                ticket = queue[0]
                if not ticket.ready or any(queues[s][0] is not ticket for s in ticket.slots):
                    break
                for slot in ticket.slots:
                    q = queues[slot]
                    q.popleft()
                    if not q:
                        del queues[slot]
                        idle.append(slot)
                    elif q is not queue:
                        work.append(slot)
                out.append(ticket)
        if idle and self._on_idle is not None:
            self._on_idle(idle)
        return out

    def pending(self) -> Iterator[Ticket]:
        """Every ticket not yet answered, once each."""
        yield from list(self._free)
        seen: set[int] = set()
        for queue in list(self._queues.values()):
            for ticket in queue:
                if id(ticket) not in seen:
                    seen.add(id(ticket))
                    yield ticket

    def __len__(self) -> int:
        return len(self._free) + len({id(t) for q in self._queues.values() for t in q})
