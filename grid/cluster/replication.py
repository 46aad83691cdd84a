"""Backup operations as ordered, retransmitted streams, one per owner and backup member.

An owner must answer a write only after every synchronous backup applied it (seed 002's
guarantee that a promoted backup holds every acknowledged write). A message can fail to leave
(the peer's socket is gone for a moment) or be lost with a connection, so an owner keeps every
backup operation until the backup acknowledged it and sends it again after a back-off. The
backup takes a sender's operations strictly in sequence (go-back-N): a duplicate is answered
from memory, an operation after a gap is dropped until the missing one comes again. So a
retransmitted old operation can never overwrite a newer value on a backup.

Pure state: no sockets, no clocks (times are passed in).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

RETRANSMIT_S_MIN = 0.05
RETRANSMIT_S_MAX = 1.0
RESULTS_KEPT = 4096  # per sender: how far back a duplicate is answered from memory


class OutgoingOp:
    """One backup message the owner keeps until the backup acknowledges it."""

    # (A plain class, not a dataclass: one is made per write, and compiled, a dataclass's
    # generated __init__ would still run as Python.)
    def __init__(self, seq: int, fields: dict[str, Any], frames: list[bytes],
                 pids: list[int]) -> None:
        self.seq = seq
        self.fields = fields
        self.frames = frames
        self.pids = pids  # the partitions it writes


@dataclass
class _Stream:
    next_seq: int = 1
    unacked: OrderedDict[int, OutgoingOp] = field(default_factory=OrderedDict)
    retry_at: float = 0.0
    backoff_s: float = RETRANSMIT_S_MIN


class BackupStreams:
    """The owner's side: sequence numbers, unacknowledged operations, retransmission."""

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}

    def add(self, member: str, fields: dict[str, Any], frames: list[bytes],
            now: float, pids: list[int] | None = None) -> OutgoingOp:
        """A new operation for ``member`` (writing partitions ``pids``): numbered, kept until
        acknowledged. The caller sends it now; if nothing else was waiting, its
        retransmission clock starts now."""
        stream = self._streams.get(member)
        if stream is None:
            stream = self._streams[member] = _Stream()
        op = OutgoingOp(stream.next_seq, {**fields, "seq": stream.next_seq}, frames,
                        [] if pids is None else pids)
        stream.next_seq += 1
        if not stream.unacked:
            stream.retry_at = now + RETRANSMIT_S_MIN
            stream.backoff_s = RETRANSMIT_S_MIN
        stream.unacked[op.seq] = op
        return op

    def acked(self, member: str, seq: int) -> OutgoingOp | None:
        """The backup processed ``seq``: forget it (None if it was not waiting)."""
        stream = self._streams.get(member)
        if stream is None:
            return None
        op = stream.unacked.pop(seq, None)
        if op is not None:
            stream.backoff_s = RETRANSMIT_S_MIN  # the backup is taking messages again
        return op

    def send_failed(self, member: str, now: float) -> None:
        """A send did not leave: try again soon rather than after the back-off."""
        stream = self._streams.get(member)
        if stream is not None:
            stream.retry_at = min(stream.retry_at, now + RETRANSMIT_S_MIN)

    def due(self, now: float) -> Iterator[tuple[str, list[OutgoingOp]]]:
        """Streams whose unacknowledged operations are to be sent again now, each with its
        operations in sequence order (a backup takes them only in order)."""
        for member, stream in self._streams.items():
            if stream.unacked and stream.retry_at <= now:
                stream.retry_at = now + stream.backoff_s
                stream.backoff_s = min(stream.backoff_s * 2, RETRANSMIT_S_MAX)
                yield member, list(stream.unacked.values())

    def unacked_count(self, member: str | None = None) -> int:
        streams = self._streams.values() if member is None else \
            [self._streams[member]] if member in self._streams else []
        return sum(len(s.unacked) for s in streams)

    def drop(self, member: str) -> None:
        """``member`` left the cluster: nothing will ever be acknowledged by it."""
        self._streams.pop(member, None)


@dataclass
class HeldOp:
    """An operation the backup cannot judge yet (its table is older than the owner's)."""

    seq: int
    request: Any  # whatever the shell needs to process and answer it later


@dataclass
class _Inbox:
    expected: int = 1
    held: deque[HeldOp] = field(default_factory=deque)
    results: OrderedDict[int, Any] = field(default_factory=OrderedDict)


class Arrival:
    """What a backup does with an operation that arrived (see ``BackupInbox.arrive``)."""

    # (Final: compiled, a class attribute read through the class must be one.)
    PROCESS: Final = "process"  # the next in sequence: judge it now
    HOLD: Final = "hold"  # the next in sequence, but earlier ones wait: queue behind them
    DUPLICATE: Final = "duplicate"  # processed before: answer with the remembered result
    PENDING: Final = "pending"  # a duplicate of a held one: it will be answered when processed
    GAP: Final = "gap"  # an earlier one is missing: drop; the owner sends both again


class BackupInbox:
    """The backup's side: per sender, the next expected sequence number, the operations
    held until the local table catches up, and the results of recent ones."""

    def __init__(self) -> None:
        self._inboxes: dict[str, _Inbox] = {}

    def _inbox(self, sender: str) -> _Inbox:
        inbox = self._inboxes.get(sender)
        if inbox is None:
            inbox = self._inboxes[sender] = _Inbox()
        return inbox

    def arrive(self, sender: str, seq: int) -> tuple[str, Any]:
        """Classify an arriving operation: (Arrival.X, remembered result or None)."""
        inbox = self._inbox(sender)
        if seq < inbox.expected:
            if any(h.seq == seq for h in inbox.held):
                return Arrival.PENDING, None
            return Arrival.DUPLICATE, inbox.results.get(seq)
        if seq > inbox.expected:
            return Arrival.GAP, None
        return (Arrival.HOLD if inbox.held else Arrival.PROCESS), None

    def hold(self, sender: str, seq: int, request: Any) -> None:
        """Queue the expected operation; later ones from this sender queue behind it."""
        inbox = self._inboxes[sender]
        assert seq == inbox.expected, (seq, inbox.expected)
        inbox.held.append(HeldOp(seq, request))
        inbox.expected += 1

    def replace_held(self, sender: str, seq: int, request: Any) -> None:
        """A retransmission of a held operation: answer the newest request for it."""
        for held in self._inboxes[sender].held:
            if held.seq == seq:
                held.request = request

    def processed(self, sender: str, seq: int, result: Any) -> None:
        """The operation was judged (applied or refused): remember the result."""
        inbox = self._inbox(sender)
        if seq == inbox.expected:
            inbox.expected += 1
        inbox.results[seq] = result
        while len(inbox.results) > RESULTS_KEPT:
            inbox.results.popitem(last=False)

    def held(self) -> Iterator[tuple[str, deque[HeldOp]]]:
        """Senders with held operations, oldest first in each queue."""
        for sender, inbox in self._inboxes.items():
            if inbox.held:
                yield sender, inbox.held

    def forget(self, sender: str) -> None:
        """``sender`` left the cluster: its stream ends."""
        self._inboxes.pop(sender, None)
