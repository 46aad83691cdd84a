"""The member's part in cluster state changes and lite member promotion (seed 000).

- **State change** (grid/cluster/state_change.py decides): a client asks the master
  (CHANGE_STATE); the master asks every member, itself included, to lock the change
  (STATE_LOCK), then commits it (STATE_COMMIT) or calls it off (STATE_UNLOCK), and answers
  the client once every member confirmed the commit (or left). A member locks one change at
  a time, only from its master.
- **Promotion**: a client asks a lite member (PROMOTE_LOCAL); the lite member asks the master
  (PROMOTE); the master makes it a data member in a new member list, publishes it, plans the
  rebalance, and returns the list, which the lite member takes.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any

from grid import protocol as p
from grid.cluster.membership import MemberList
from grid.cluster.state import ClusterState
from grid.cluster.state_change import (
    CommitAll,
    Finished,
    LockAll,
    Phase,
    StateChange,
    StateChangeRefused,
    StateLock,
    UnlockAll,
)
from grid.errors import ProtocolError

if TYPE_CHECKING:
    from workers.node import Node

log = logging.getLogger("shmgrid.state")

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 600.0


def _state(value: Any) -> ClusterState:
    if not isinstance(value, str) or value not in ClusterState.__members__:
        raise ProtocolError(f"a cluster state is one of {', '.join(ClusterState)}; got "
                            f"{value!r}")
    return ClusterState(value)


class StateService:
    def __init__(self, member: Node) -> None:
        self.member = member
        self.lock = StateLock()
        self.change: StateChange | None = None  # master: the change it runs
        self.reply_to: tuple[bytes, dict[str, Any]] | None = None  # who asked for it
        self.txns = itertools.count(1)

    def handlers(self) -> dict[str, Any]:
        return {p.CHANGE_STATE: self._on_change_state, p.STATE_LOCK: self._on_lock,
                p.STATE_COMMIT: self._on_commit, p.STATE_UNLOCK: self._on_unlock,
                p.PROMOTE_LOCAL: self._on_promote_local, p.PROMOTE: self._on_promote}

    @property
    def holds_migrations(self) -> bool:
        """A state change runs: the master starts no migration until it is over."""
        return self.change is not None and self.change.holds_migrations

    def _not_master(self, ident: bytes, header: dict[str, Any]) -> bool:
        cluster = self.member.cluster
        if cluster.is_master:
            return False
        master = cluster.members.master
        why = "a mastership claim is in progress" if cluster.recovering else "not the master"
        self.member.reply_error(ident, header, p.NOT_READY, why,
                                master=master.endpoint if master else None)
        return True

    def _from_master(self, header: dict[str, Any]) -> bool:
        cluster = self.member.cluster
        master = cluster.members.master
        return master is not None and header.get("from") == master.uuid and \
            master.uuid not in cluster.dead

    # -- the master's side of a state change -------------------------------------------------

    def _on_change_state(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        new = _state(header.get("state"))
        timeout = header.get("timeout", DEFAULT_TIMEOUT_S)
        if not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
            raise ProtocolError(f"timeout must be in (0, {MAX_TIMEOUT_S:g}] seconds")
        if self._not_master(ident, header):
            return
        if self.change is not None and self.change.phase is not Phase.DONE:
            self.member.reply_error(ident, header, p.STATE_CHANGE,
                                    f"a change to {self.change.new} is in progress; ask again "
                                    "when it is over")
            return
        cluster = self.member.cluster
        now = self.member.now()
        try:
            change, commands = StateChange.begin(
                next(self.txns), cluster.state, new, cluster.state_version,
                cluster.members.uuids, cluster.members.version, cluster.driver.active, now,
                float(timeout))
        except StateChangeRefused as exc:
            self.member.reply_error(ident, header, p.STATE_CHANGE, str(exc))
            return
        log.info("cluster state change %s -> %s begins", cluster.state, new)
        self.change, self.reply_to = change, (ident, header)
        if change.holds_migrations:
            cluster.hold_migrations()  # a change to PASSIVE: the plan starts nothing more
        self._run(commands)

    def _run(self, commands: list[Any]) -> None:
        change = self.change
        cluster = self.member.cluster
        for command in commands:
            if isinstance(command, LockAll):
                lease = max(0.0, change.deadline - self.member.now())
                for uuid in command.uuids:
                    self.member.request_peer(
                        uuid, p.STATE_LOCK,
                        {"txn": command.txn, "state": command.state.value, "lease": lease},
                        [], self._lock_answer(change, uuid),
                        timeout=min(lease, self._answer_s()))
            elif isinstance(command, CommitAll):
                if cluster.state_version < command.state_version:  # the decision: here first
                    self.lock.release(command.txn, cluster.me)
                    cluster.take_state(command.state, command.state_version)
                    cluster.publish_view()
                fields = {"txn": command.txn, "state": command.state.value,
                          "sv": command.state_version}
                for uuid in command.uuids:
                    if uuid != cluster.me:
                        self.member.request_peer(uuid, p.STATE_COMMIT, dict(fields), [],
                                                 self._commit_answer(change, uuid),
                                                 timeout=self._answer_s())
                if cluster.me in command.uuids:
                    self._run(change.commit_answered(
                        cluster.me, cluster.state_version >= command.state_version))
            elif isinstance(command, UnlockAll):
                for uuid in command.uuids:
                    self.member.request_peer(uuid, p.STATE_UNLOCK, {"txn": command.txn}, [],
                                             lambda h, f: None, timeout=self._answer_s())
            elif isinstance(command, Finished):
                log.info("cluster state change: %s", command.message)
                if self.reply_to is not None:
                    ident, header = self.reply_to
                    self.reply_to = None
                    if command.ok:
                        self.member.reply_ok(ident, header, state=command.state.value,
                                             msg=command.message)
                    else:
                        self.member.reply_error(ident, header, p.STATE_CHANGE, command.message,
                                                state=command.state.value)

    def _answer_s(self) -> float:
        """How long a member's answer to a state or promotion message may take."""
        return self.member.config.heartbeat_timeout

    def _lock_answer(self, change: StateChange, uuid: str) -> Any:
        def on_reply(header: dict[str, Any] | None, frames: list[bytes]) -> None:
            if self.change is not change:
                return
            ok = bool(header and header.get("ok"))
            why = "" if ok else (header.get("msg", "") if header else "no answer")
            self._run(change.lock_answered(uuid, ok, why))
        return on_reply

    def _commit_answer(self, change: StateChange, uuid: str) -> Any:
        def on_reply(header: dict[str, Any] | None, frames: list[bytes]) -> None:
            if self.change is change:
                self._run(change.commit_answered(uuid, bool(header and header.get("ok"))))
        return on_reply

    def tick(self, now: float) -> None:
        if self.change is not None:
            cluster = self.member.cluster
            if not cluster.is_master:
                self.change, self.reply_to = None, None  # a new master decides; we lost it
                return
            self._run(self.change.tick(now, cluster.driver.active))

    def members_changed(self, members_version: int, members: list[str]) -> None:
        """Master: the member list changed (``members``, now); a change not yet decided is
        off, a decided one waits no more for members that left."""
        if self.change is not None:
            self._run(self.change.members_changed(members_version, members))

    # -- every member's side of a state change -----------------------------------------------

    def _on_lock(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        txn, lease = header.get("txn"), header.get("lease")
        _state(header.get("state"))  # a lock names a state the cluster knows
        if not isinstance(txn, int) or not isinstance(lease, int | float):
            raise ProtocolError("a state lock carries txn and lease")
        if not self._from_master(header):
            self.member.reply_error(ident, header, p.STATE_CHANGE, "not from our master")
            return
        refusal = self.lock.lock(txn, header["from"], self.member.now(),
                                 min(float(lease), MAX_TIMEOUT_S))
        if refusal:
            self.member.reply_error(ident, header, p.STATE_CHANGE, refusal)
        else:
            self.member.reply_ok(ident, header)

    def _on_commit(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        txn, state, version = header.get("txn"), _state(header.get("state")), header.get("sv")
        if not isinstance(txn, int) or not isinstance(version, int):
            raise ProtocolError("a state commit carries txn and sv")
        if not self._from_master(header):
            self.member.reply_error(ident, header, p.STATE_CHANGE, "not from our master")
            return
        self.lock.release(txn, header["from"])
        self.member.cluster.take_state(state, version)
        self.member.reply_ok(ident, header)  # confirmed: it holds this state version or later

    def _on_unlock(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        txn = header.get("txn")
        if not isinstance(txn, int):
            raise ProtocolError("a state unlock carries txn")
        self.lock.release(txn, header.get("from"))
        self.member.reply_ok(ident, header)

    # -- lite member promotion -----------------------------------------------------------------

    def _on_promote_local(self, ident: bytes, header: dict[str, Any],
                          frames: list[bytes]) -> None:
        """Promote this member (seed 000's promoteLocalMember): it asks the master."""
        cluster = self.member.cluster
        me = cluster.members.get(cluster.me)
        if not cluster.joined or me is None:
            self.member.reply_error(ident, header, p.NOT_READY, "this member has not joined yet")
            return
        if not me.lite:
            self.member.reply_error(ident, header, p.ILLEGAL_STATE,
                                    f"{me.name} is a data member already")
            return
        master = cluster.members.master
        if master is None or master.uuid in cluster.dead or cluster.recovering:
            self.member.reply_error(ident, header, p.NOT_READY, "no master to ask right now")
            return

        def on_reply(reply: dict[str, Any] | None, _: list[bytes]) -> None:
            if reply is None:
                self.member.reply_error(ident, header, p.NOT_READY,
                                        f"the master ({master.name}) did not answer")
                return
            if not reply.get("ok"):
                self.member.reply_error(ident, header, str(reply.get("code", p.SERVER)),
                                        str(reply.get("msg", "")),
                                        master=reply.get("master"), state=reply.get("state"),
                                        op=reply.get("op"))
                return
            try:
                members = MemberList.from_wire(reply.get("members"))
            except ValueError as exc:
                self.member.reply_error(ident, header, p.PROTOCOL, f"bad member list: {exc}")
                return
            if not cluster.take_members(members, master.uuid):
                self.member.reply_error(ident, header, p.ILLEGAL_STATE,
                                        "the master changed during the promotion; ask again")
                return
            log.info("promoted to a data member (member list version %d)", members.version)
            self.member.reply_ok(ident, header, members=members.to_wire())

        self.member.request_peer(master.uuid, p.PROMOTE, {"uuid": cluster.me}, [], on_reply,
                                 timeout=self._answer_s())

    def _on_promote(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        """Master: make a lite member a data member, publish, rebalance, return the list."""
        uuid = header.get("uuid")
        if not isinstance(uuid, str):
            raise ProtocolError("a promotion names the member (uuid)")
        if self._not_master(ident, header):
            return
        cluster = self.member.cluster
        info = cluster.members.get(uuid)
        if info is None or uuid in cluster.dead:
            self.member.reply_error(ident, header, p.UNKNOWN_MEMBER,
                                    f"the master does not know member {uuid}")
            return
        if not cluster.state.join_allowed:
            self.member.reply_error(ident, header, p.STATE, "promotion refused",
                                    op="promote", state=cluster.state.value)
            return
        if info.lite:
            cluster.promote(uuid)
        self.member.reply_ok(ident, header, members=cluster.members.to_wire())
