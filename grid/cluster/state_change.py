"""Changing the cluster state, all or nothing (seed 000's states, changed as Hazelcast does).

The master runs one change at a time, as a transaction, with ``StateChange``:

1. **Begin.** A change to the state the cluster is in is done at once. Any other change is
   refused while migrations are in flight, except a change to PASSIVE: that one first waits
   for them to end (the master starts no new one meanwhile), or fails when its time is up.
2. **Lock.** Every member is asked to lock the change: the transaction, the new state, the
   member list it was started on. A member holds one lock at a time (``StateLock``), until the
   change commits, is unlocked, or the lock's lease runs out (its master died).
3. **Commit.** Once every member holds the lock, the change is decided: the state version
   rises by one and every member is told to commit. The master publishes the state with its
   view too, and members take a state with a higher state version from any publish, so a
   member that missed the commit still ends in the new state. A new master takes the state
   with the highest state version among those it collects.
4. **Confirm.** The master answers only once every member has confirmed the commit (or left
   the member list): had it answered at the decision and died before its commit or its view
   reached anyone, the members would collect the old state, and a change answered ok would
   be in force nowhere. A member that has not confirmed is told again every
   ``COMMIT_RESEND_S``. The decision stands whatever happens; should the time run out before
   every member confirmed, the master answers ok all the same and says who had not (they
   take the state from its view, unless it dies first).

A refusal, a missing answer, a member joining or leaving, or the time running out before the
decision aborts the change: the members that locked it are unlocked, and every member keeps the
old state.

Pure state: the master's shell sends what the methods return and feeds back the answers;
times are passed in.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum

from grid.cluster.state import ClusterState

# How long the master waits for a member to confirm a commit before it tells it again.
COMMIT_RESEND_S = 1.0


class Phase(StrEnum):
    WAITING = "waiting"  # for migrations in flight to end (a change to PASSIVE)
    LOCKING = "locking"  # asked every member to lock; waiting for their answers
    COMMITTING = "committing"  # decided; waiting for every member to confirm the commit
    DONE = "done"


@dataclass(frozen=True)
class LockAll:
    """Ask each of ``uuids`` to lock transaction ``txn`` (the change to ``state``)."""

    txn: int
    state: ClusterState
    uuids: tuple[str, ...]


@dataclass(frozen=True)
class CommitAll:
    """Tell each of ``uuids`` to take ``state`` at ``state_version`` and confirm it; the master
    takes it too (and confirms its own with ``commit_answered``)."""

    txn: int
    state: ClusterState
    state_version: int
    uuids: tuple[str, ...]


@dataclass(frozen=True)
class UnlockAll:
    """Tell each of ``uuids`` that transaction ``txn`` is off."""

    txn: int
    uuids: tuple[str, ...]


@dataclass(frozen=True)
class Finished:
    """The change is over: ``ok`` with the state now in force, or not, and why."""

    ok: bool
    state: ClusterState
    message: str


Command = LockAll | CommitAll | UnlockAll | Finished


class StateChangeRefused(ValueError):
    """A change that cannot begin (migrations in flight); the message says why."""


@dataclass
class StateChange:
    """One change of the cluster state, run by the master. Create it with ``begin``."""

    txn: int
    old: ClusterState
    new: ClusterState
    state_version: int  # the cluster's state version when the change began
    members: tuple[str, ...]
    members_version: int
    deadline: float
    phase: Phase = Phase.WAITING
    locked: set[str] = field(default_factory=set)
    confirmed: set[str] = field(default_factory=set)  # members that took the commit, or left
    resend_at: float | None = None  # when the commit goes again to those not confirmed

    @classmethod
    def begin(cls, txn: int, old: ClusterState, new: ClusterState, state_version: int,
              members: list[str], members_version: int, migrating: bool, now: float,
              timeout: float) -> tuple[StateChange, list[Command]]:
        """Start a change (StateChangeRefused if migrations are in flight and ``new`` is not
        PASSIVE). ``migrating``: a migration plan is in progress."""
        change = cls(txn, old, new, state_version, tuple(members), members_version,
                     now + timeout)
        if new is old:
            change.phase = Phase.DONE
            return change, [Finished(True, new, f"the cluster is {new} already")]
        if migrating and new is not ClusterState.PASSIVE:
            raise StateChangeRefused(
                f"migrations are in flight; the cluster stays {old}. Wait until it is safe "
                f"(shmgrid wait-safe), then change the state to {new}")
        if migrating:
            return change, []  # PASSIVE: first the migrations end (tick)
        return change, change._lock()

    @property
    def holds_migrations(self) -> bool:
        """While the change runs, the master starts no migration."""
        return self.phase is not Phase.DONE

    def _lock(self) -> list[Command]:
        self.phase = Phase.LOCKING
        return [LockAll(self.txn, self.new, self.members)]

    def _abort(self, why: str) -> list[Command]:
        self.phase = Phase.DONE
        commands: list[Command] = []
        if self.locked:
            commands.append(UnlockAll(self.txn, tuple(sorted(self.locked))))
        commands.append(Finished(False, self.old, f"{why}; the cluster stays {self.old}"))
        return commands

    def lock_answered(self, uuid: str, ok: bool, why: str = "") -> list[Command]:
        """A member's answer to the lock: once all locked, commit; a refusal aborts."""
        if self.phase is not Phase.LOCKING or uuid not in self.members:
            return []
        if not ok:
            return self._abort(f"member {uuid} did not lock the change: {why or 'no answer'}")
        self.locked.add(uuid)
        if self.locked != set(self.members):
            return []
        self.phase = Phase.COMMITTING
        return [CommitAll(self.txn, self.new, self.state_version + 1, self.members)]

    def commit_answered(self, uuid: str, ok: bool) -> list[Command]:
        """A member's answer to the commit: once every member confirmed it, answer ok. A
        refusal or no answer waits for the next resend (``tick``)."""
        if self.phase is not Phase.COMMITTING or uuid not in self.members or not ok:
            return []
        self.confirmed.add(uuid)
        return self._finish_if_confirmed()

    def _finish_if_confirmed(self) -> list[Command]:
        if not self.confirmed.issuperset(self.members):
            return []
        self.phase = Phase.DONE
        return [Finished(True, self.new, f"the cluster is {self.new}")]

    def members_changed(self, members_version: int, members: Collection[str]) -> list[Command]:
        """A member joined or left (``members``: the list now): a change not yet decided is
        off; a decided one waits no more for the confirmations of members that left."""
        if self.phase is Phase.DONE or members_version == self.members_version:
            return []
        if self.phase is Phase.COMMITTING:
            self.confirmed.update(set(self.members).difference(members))
            return self._finish_if_confirmed()
        return self._abort("the members changed during the change")

    def tick(self, now: float, migrating: bool) -> list[Command]:
        """Time passes: a PASSIVE change locks once migrations ended; time up aborts an
        undecided change; a decided one tells the members that did not confirm it again,
        and at its deadline answers ok, saying who had not confirmed."""
        if self.phase is Phase.DONE:
            return []
        if self.phase is Phase.COMMITTING:
            waiting = tuple(m for m in self.members if m not in self.confirmed)
            if now >= self.deadline:
                self.phase = Phase.DONE
                return [Finished(True, self.new, f"the cluster is {self.new}; not yet "
                                 f"confirmed by {', '.join(waiting)} (they take it from the "
                                 "master's view)")]
            if self.resend_at is None:
                self.resend_at = now + COMMIT_RESEND_S
            elif now >= self.resend_at:
                self.resend_at = now + COMMIT_RESEND_S
                return [CommitAll(self.txn, self.new, self.state_version + 1, waiting)]
            return []
        if now >= self.deadline:
            what = "migrations in flight did not end" if self.phase is Phase.WAITING \
                else "not every member locked the change"
            return self._abort(f"{what} in time")
        if self.phase is Phase.WAITING and not migrating:
            return self._lock()
        return []


@dataclass
class StateLock:
    """A member's side: the one change it has locked, if any, until when."""

    txn: int | None = None
    master: str | None = None
    expires: float = 0.0

    def lock(self, txn: int, master: str, now: float, lease: float) -> str:
        """Lock ``txn``; return "" or why not (another change holds the lock)."""
        if self.txn is not None and now < self.expires and \
                (self.txn, self.master) != (txn, master):
            return f"another state change (transaction {self.txn}) holds the lock"
        self.txn, self.master, self.expires = txn, master, now + lease
        return ""

    def holds(self, txn: int, master: str) -> bool:
        return (self.txn, self.master) == (txn, master)

    def release(self, txn: int, master: str) -> None:
        if self.holds(txn, master):
            self.txn = self.master = None
