"""Replica sync on a backup (seed 004): which fragments to ask the owner for, when, and
whether an answer may be installed.

A backup's namespace becomes *wanted* when a backup operation shows it missed one (a version
gap, see grid/partition/replica_versions.py), or when the owner's periodic versions say it is
behind and it has not caught up a moment later (operations may still be on their way), or
ahead (it holds something the owner does not). ``SyncRequests`` turns wanted namespaces into
requests, one per partition at a time: at most ``limit`` partitions in flight on the member,
and a partition asks again only once its request was answered or an ``interval`` passed.

While a request is out, the backup keeps applying the owner's operations (a dirty synchronous
backup must still hold every write it acknowledges) and records them in the request's
*window*. The owner's answer is a snapshot at versions ``s``: whole fragments, or only the
entries under the Merkle leaves where the two replicas differed (seed 003). ``plan_install``
decides from the window whether the snapshot can be installed and which window operations
must be applied again on top of it (those newer than ``s``, which the snapshot lacks):

- an operation newer than the snapshot is applied again after it (puts, removes and clears
  give the same result applied twice in order);
- an older one is in the snapshot; with a differential answer, only if its keys lie under the
  leaves that were replaced: elsewhere the backup's entry came from the operation while the
  owner's leaf compared equal, which happens when later operations put the leaf back as it was
  (x=1, x=2, x=1): then the answer is not installed and the backup asks again;
- an operation that moved a whole fragment (replace_contents) cannot be applied twice: the
  answer is not installed.

Pure: no I/O, times are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

REPLAYABLE = frozenset({"put", "remove", "clear"})
RETRY_S = 0.1  # after an answer that could not be installed, or a busy owner
GRACE_S = 1.0  # how long operations in flight may explain a backup behind its owner's versions


@dataclass
class WindowOp:
    """A backup operation applied to a partition while its sync request was out."""

    ns: str
    kind: str
    carried: int  # its version at this replica's index
    keys: list[bytes] | None  # the keys it touched; None: the whole fragment
    request: object = None  # what the shell needs to apply it again


@dataclass
class Pending:
    namespaces: list[str]
    sent_at: float
    window: list[WindowOp] = field(default_factory=list)


class SyncRequests:
    """The backup's replica sync requests: wanted namespaces, requests in flight, suspects."""

    def __init__(self, limit: int, interval: float) -> None:
        self.limit = limit
        self.interval = interval
        self.wanted: dict[int, set[str]] = {}
        self.pending: dict[int, Pending] = {}
        self._retry_at: dict[int, float] = {}
        # (pid, ns) -> the owner's version at our index, and when to look again
        self._suspects: dict[tuple[int, str], tuple[int, float]] = {}

    def want(self, pid: int, namespaces: Iterable[str]) -> None:
        self.wanted.setdefault(pid, set()).update(namespaces)

    def suspect(self, pid: int, ns: str, version: int, now: float) -> None:
        """The owner's versions say this replica is behind: look again after ``GRACE_S``."""
        self._suspects.setdefault((pid, ns), (version, now + GRACE_S))

    def due(self, now: float, known: Callable[[int, str], int]) -> list[tuple[int, list[str]]]:
        """The requests to send now, each marked as sent. ``known(pid, ns)`` is this
        replica's version now (for the suspects)."""
        for key, (version, check_at) in list(self._suspects.items()):
            if now >= check_at:
                del self._suspects[key]
                if known(*key) < version:  # still behind: an operation was lost
                    self.want(key[0], [key[1]])
        for pid, run in list(self.pending.items()):
            if now - run.sent_at >= self.interval:  # no answer within the interval
                self.failed(pid, now)
        out = []
        for pid in sorted(self.wanted):
            if len(self.pending) >= self.limit:
                break
            if pid in self.pending or self._retry_at.get(pid, 0.0) > now:
                continue
            namespaces = sorted(self.wanted.pop(pid))
            self._retry_at.pop(pid, None)
            self.pending[pid] = Pending(namespaces, now)
            out.append((pid, namespaces))
        return out

    def record(self, pid: int, op: WindowOp) -> None:
        """A backup operation was applied to ``pid``: part of its request's window."""
        run = self.pending.get(pid)
        if run is not None:
            run.window.append(op)

    def installed(self, pid: int) -> None:
        """The answer was installed: the request ends, and what its namespaces wanted
        meanwhile (a dirty replica asks with every operation) is answered by it."""
        run = self.pending.pop(pid)
        wanted = self.wanted.get(pid)
        if wanted is not None:
            wanted.difference_update(run.namespaces)
            if not wanted:
                del self.wanted[pid]

    def failed(self, pid: int, now: float, retry_s: float = RETRY_S) -> None:
        """No answer, a busy owner, or an answer not installed: ask again later."""
        run = self.pending.pop(pid, None)
        if run is not None:
            self.want(pid, run.namespaces)
            self._retry_at[pid] = now + retry_s

    def forget(self, pid: int) -> None:
        """This member no longer backs the partition up (or its owner changed)."""
        self.pending.pop(pid, None)
        self.wanted.pop(pid, None)
        self._retry_at.pop(pid, None)
        for key in [k for k in self._suspects if k[0] == pid]:
            del self._suspects[key]

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    @property
    def waiting(self) -> int:
        """Partitions with namespaces to sync that have no request out yet."""
        return len(self.wanted)


def plan_install(window: Iterable[WindowOp], snapshot: Mapping[str, int],
                 replaced: Mapping[str, set[int] | None], leaf_of: Callable[[bytes], int]
                 ) -> tuple[bool, list[WindowOp]]:
    """Whether an answer at versions ``snapshot`` (per namespace, at our index) may be
    installed, and the window operations to apply again after it, in order. ``replaced``
    gives per namespace the leaves the answer replaces, or None for the whole fragment."""
    again = []
    for op in window:
        if op.ns not in snapshot:
            continue  # the answer leaves this namespace alone
        if op.kind not in REPLAYABLE:
            return False, []
        if op.carried > snapshot[op.ns]:
            again.append(op)
            continue
        leaves = replaced[op.ns]
        if leaves is not None and (op.keys is None or
                                   any(leaf_of(key) not in leaves for key in op.keys)):
            return False, []
    return True, again
