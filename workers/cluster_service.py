"""The member's part in the cluster: joining, the member list and partition table it follows,
heartbeats, and, on the master, the only changes ever made to both (seed 002, section 1).

The decisions (what a removal does to the table, who is master, whether the cluster is safe)
are the pure functions of ``grid.cluster``; this module moves their inputs and outputs.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from grid import protocol as p
from grid.cluster.events import EventLog
from grid.cluster.lease import MembershipLease
from grid.cluster.membership import MemberInfo, MemberList
from grid.cluster.migrations import (
    Command,
    Commit,
    MigrationDriver,
    NewTable,
    Transfer,
    migration_to_wire,
)
from grid.cluster.recovery import collected_table
from grid.cluster.repair import initial_assignment, is_cluster_safe, remove_members
from grid.cluster.restart import RestartDecision, decide_restart, reclaim_target
from grid.cluster.state import ClusterState
from grid.errors import ProtocolError
from grid.partition.table import PartitionTable, PartitionTableError

if TYPE_CHECKING:
    from workers.node import Node

log = logging.getLogger("shmgrid.cluster")

JOIN_RETRY_S = 0.5
JOIN_TIMEOUT_S = 30.0
MIGRATION_RETRY_S = 1.0  # pause before planning again after a failed migration
LEASE_ASK_S = 0.05  # at most this often, a member whose writes wait for its lease asks


class ClusterService:
    def __init__(self, member: Node, join_endpoints: list[str]) -> None:
        self.member = member
        self.config = member.config
        self.me = member.info.uuid
        self.join_endpoints = list(join_endpoints)
        # Members live on this host: the master connects to nothing else on a peer's word.
        self.local_endpoint_prefix = member.info.endpoint.rsplit(":", 1)[0] + ":"
        self.members = MemberList()
        self.table = PartitionTable(partition_count=self.config.partition_count)
        # Master: the member list version and partition versions it last published, so that
        # the next publish can carry only the rows that changed since.
        self.published: tuple[int, tuple[int, ...]] | None = None
        self.state = ClusterState.ACTIVE
        self.state_version = 0  # rises with each committed state change (state_change.py)
        # What a hot restart restores: the state, except the PASSIVE of a cluster stopping.
        self.saved_state = ClusterState.ACTIVE
        # STABLE_CLUSTER (seed 003): the table when the state was entered; a member that
        # left and comes back takes back its partitions of it.
        self.stable_table: PartitionTable | None = None
        # Members we hold for gone: reported dead by the supervisor, timed out by us as master
        # or as next in line, or given up for a claimant we follow. We refuse their publishes.
        self.dead: set[str] = set()
        # A master we stopped hearing but are not next in line to replace: we keep following
        # it (its publishes are taken, and clear this) and back a claimant who replaces it.
        self.suspected: set[str] = set()
        # The claimant we went along with, when, and whom we gave up for it: if it has not
        # become our master within the heartbeat timeout, we follow the old master again.
        self.claim_followed: tuple[str, float, set[str]] | None = None
        # Master: members that refuse our publishes, since when (they are removed in time).
        self.refusing: dict[str, float] = {}
        self.last_heard: dict[str, float] = {}
        self.lease = MembershipLease(self.config.heartbeat_timeout,
                                     margin_s=self.config.heartbeat_timeout * 0.05)
        self.heard_number: dict[str, int] = {}  # peer -> newest heartbeat number from it
        # lease_until's last answer: (member list, the lease's changes, its master, until)
        self._lease_cache: tuple[MemberList | None, int, str | None, float] = \
            (None, -1, None, -math.inf)
        # is_lite's last answer: (member list, lite); every client request asks it.
        self._lite_cache: tuple[MemberList | None, bool] = (None, False)
        self.next_table_ask = 0.0
        self.next_lease_ask = 0.0
        self.next_catch_up: dict[str, float] = {}
        self.master_heard = self.member.now()
        self.last_tick = self.master_heard
        self.next_heartbeat = 0.0
        self.joined = False
        self.ready = False  # joined and every partition has an owner: data ops may run
        self.join_started = 0.0
        self.next_join = 0.0
        # Master change (seed 002, section 1.2): whom we still wait for, what they sent.
        self.recovering = False
        self.recovery_started = 0.0
        self.recovery_waiting: set[str] = set()
        self.recovery_refused: set[str] = set()  # they still follow the master we gave up on
        self.recovery_tables: list[PartitionTable] = []
        self.recovery_versions: list[int] = []
        self.recovery_states: list[tuple[int, ClusterState]] = []  # (state version, state)
        self.recovery_active: list[list[int]] = []  # [pid, initial, increment] unresolved
        # Master: the migrations that make the table what the data members should hold.
        self.driver = self._new_driver()
        self.plan_wanted = False  # something changed that may call for migrations
        self.leaving: set[str] = set()  # master: members whose replicas move away first
        self.events = EventLog()  # master: what migration and partition-lost listeners hear
        self.lost_partitions = 0  # master: partitions that lost every replica so far
        self.leave_started: float | None = None  # this member asked to leave, when
        self.next_leave_request = 0.0
        self.next_plan = 0.0
        self.next_fetch = 0.0
        # Hot restart: the table and state this member's files hold, and (master) the stamp
        # of the table each joining member restored, checked before the cluster forms on it.
        self.restored_table: PartitionTable | None = None
        self.restored_state: ClusterState | None = None
        self.restored_tables: dict[str, PartitionTable | None] = {}
        self.wipe_publish: list[str] = []  # master: members told to drop their stale data
        self.restored_clean: dict[str, bool] = {}  # master: who stopped in order
        self.in_sync_publish = False  # master: the restart's first publish needs no SYNC
        journal = member.journal
        if journal is not None and journal.restored.table is not None:
            try:
                self.restored_table = PartitionTable.from_wire(journal.restored.table)
            except PartitionTableError as exc:
                raise RuntimeError(f"the partition table under {journal.folder} is "
                                   f"damaged: {exc}") from exc
            state = journal.restored.state
            self.restored_state = ClusterState(state) if state in ClusterState.__members__ \
                else ClusterState.ACTIVE

    def handlers(self) -> dict[str, Any]:
        return {
            p.JOIN: self._on_join,
            p.PUBLISH: self._on_publish,
            p.HEARTBEAT: self._on_heartbeat,
            p.FETCH_STATE: self._on_fetch_state,
            p.MEMBER_DIED: self._on_member_died,
            p.FORM: self._on_form,
            p.TABLE: self._on_table,
            p.SET_STATE: self._on_set_state,
            p.LEAVE: self._on_leave,
            p.EVENTS: self._on_events,
        }

    # -- views -----------------------------------------------------------------------------

    @property
    def is_master(self) -> bool:
        master = self.members.master
        return self.joined and not self.recovering and master is not None \
            and master.uuid == self.me

    def is_safe(self) -> bool:
        # A master that is about to plan (a member just joined, or a plan just ended and
        # the next tick looks again for what it did not do) is not safe yet either:
        # otherwise a wait-safe right after add-member could end before any migration, or
        # between a failed plan and the next.
        pending = self.is_master and (self.plan_wanted or self.driver.ended) and \
            self.table.is_assigned() and self.state.migration_allowed
        return self.joined and is_cluster_safe(self.table, self.members.data_members,
                                               self.config.total_backup_count,
                                               migrating=self.driver.active or pending)

    def lease_valid(self) -> bool:
        """Whether nobody can have removed this member yet (grid/cluster/lease.py): what an
        owner checks before it acknowledges a write that no backup holds."""
        return self.member.now() < self.lease_until()

    def lease_until(self) -> float:
        """Until when nobody can have removed this member (-inf: no lease now); local
        readers trust this member's memory until then (workers/local_reads.py).

        Every read and write asks this, so the answer is kept until the member list (an
        immutable value, replaced on every change) or the lease's echoes change."""
        if not self.joined or self.recovering:
            return -math.inf
        members = self.members
        cached_members, changes, master, until = self._lease_cache
        if cached_members is not members or changes != self.lease.changes:
            master = members.master.uuid if members.members else None
            if master is None:
                until = -math.inf
            elif master == self.me:  # the master: every member could claim mastership
                until = self.lease.valid_until([u for u in members.uuids if u != self.me])
            else:
                until = self.lease.valid_until([master])
            self._lease_cache = (members, self.lease.changes, master, until)
        if master != self.me and master in self.dead:
            return -math.inf
        return until

    def ask_for_table(self) -> None:
        """Our table is older than a peer's: heartbeat the master now (at most once a
        heartbeat interval), which answers a differing stamp with its view."""
        now = self.member.now()
        master = self.members.master
        if self.is_master or master is None or now < self.next_table_ask:
            return
        self.next_table_ask = now + self.config.heartbeat_interval
        self._heartbeat_to(master.uuid)

    def ask_for_lease(self) -> None:
        """A write rests on our lease alone and the lease lapsed (after a master change it
        rests on a master that has not echoed us yet): heartbeat the peers it rests on now,
        asking them to answer at once, instead of waiting up to two heartbeat intervals.
        Early heartbeats only renew the lease sooner; what it is worth stays the same."""
        now = self.member.now()
        if not self.joined or self.recovering or now < self.next_lease_ask:
            return
        self.next_lease_ask = now + LEASE_ASK_S
        for uuid in self._heartbeat_targets():
            self._heartbeat_to(uuid, want_echo=True)

    def migration_status(self) -> dict[str, Any]:
        """The master's migrations: whether a plan runs, and what the latest plan did."""
        stats = self.driver.stats
        return {"active": self.driver.active, "planned": stats.planned,
                "completed": stats.completed, "failed": stats.failed,
                "running": len(self.driver.running),
                "remaining": max(0, stats.planned - stats.completed) if self.driver.active
                else 0,
                "leaving": len(self.leaving), "lost_partitions": self.lost_partitions,
                "in_flight": sorted(run.migration.partition_id
                                    for run in self.driver.running.values())}

    def replica_counts(self) -> tuple[int, int]:
        counts = self.table.replica_counts(self.me)
        return counts[0], sum(counts[1:])

    def view_fields(self) -> dict[str, Any]:
        return {"members": self.members.to_wire(), "table": self.table.to_wire(),
                "state": self.state.value, "sv": self.state_version,
                "saved": self.saved_state.value, "in_sync": self.in_sync_publish,
                "wipe": self.wipe_publish}

    @property
    def is_lite(self) -> bool:
        """Whether this member holds no partitions: as the member list says (a promotion
        changes it), else as it started. Kept until the member list (an immutable value,
        replaced on every change) changes."""
        members = self.members
        cached_members, lite = self._lite_cache
        if cached_members is not members:
            me = members.get(self.me)
            lite = me.lite if me is not None else self.member.info.lite
            self._lite_cache = (members, lite)
        return lite

    def short_of_backups(self) -> int:
        """Partitions with fewer replicas (synchronous and asynchronous) than the data
        members allow (what a state without migrations holds back)."""
        want = 1 + min(self.config.total_backup_count, len(self.members.data_members) - 1)
        return sum(1 for pid in range(self.table.partition_count)
                   if sum(r is not None for r in self.table.replicas(pid)[:want]) < want)

    def take_state(self, state: ClusterState, version: int,
                   saved: ClusterState | None = None) -> None:
        """Take a committed cluster state that is newer than ours (state_change.py);
        ``saved`` is what a restart restores (the state itself unless it is stopping)."""
        if version > self.state_version:
            log.info("cluster state %s -> %s", self.state, state)
            if self.is_master:
                self.events.add({"type": "state_changed", "from": self.state.value,
                                 "to": state.value, "at": self.member.now()})
            if state.rejoin_allowed and not self.state.rejoin_allowed:
                self.stable_table = self.table.copy()
            elif not state.rejoin_allowed:
                self.stable_table = None
            self.state, self.state_version = state, version
            self.saved_state = saved or state
            self.plan_wanted = True
            if self.member.journal is not None:
                self.member.journal.view_dirty = True

    # -- start and join --------------------------------------------------------------------

    def start(self) -> None:
        # A master may itself send or receive a migration: it talks to itself like to a peer.
        self.member.connect_peer(self.me, self.member.info.endpoint)
        now = self.member.now()
        if not self.join_endpoints:
            self.members = MemberList(1, (self.member.info,))
            self.joined = True
            log.info("started as master of a new cluster at %s", self.member.info.endpoint)
            return
        self.join_started = now
        for endpoint in self.join_endpoints:
            self.member.connect_peer(endpoint, endpoint)

    def _send_join(self, now: float) -> None:
        self.next_join = now + JOIN_RETRY_S
        if now - self.join_started > JOIN_TIMEOUT_S:
            raise RuntimeError(f"could not join the cluster at {self.join_endpoints}")
        restored = self.restored_table.to_wire() if self.restored_table is not None else None
        clean = self.member.journal is not None and self.member.journal.restored.clean
        for endpoint in list(self.join_endpoints):
            self.member.request_peer(endpoint, p.JOIN, {"info": self.member.info.to_wire(),
                                                        "restored": restored, "clean": clean},
                                     [], self._on_join_reply, timeout=JOIN_RETRY_S * 2)

    def _on_join_reply(self, header: dict[str, Any] | None, frames: list[bytes]) -> None:
        if header is None or self.joined:
            return
        if not header.get("ok"):
            if header.get("code") == p.STATE:
                log.error("the cluster is %s, which takes no new member; this member stops. "
                          "`shmgrid state ACTIVE` (or NO_MIGRATION) lets members join",
                          header.get("state"))
                self.member.running = False
                return
            master = header.get("master")
            if isinstance(master, str) and master not in self.join_endpoints:
                self.join_endpoints.append(master)
                self.member.connect_peer(master, master)
            return
        self._apply_view(header)
        if self.me in self.members:
            self.joined = True
            self.ready = self.table.is_assigned()
            # The view's table was taken before we were joined: serve its partitions now.
            self.member.maps.publish_ownership()
            for endpoint in self.join_endpoints:
                self.member.disconnect_peer(endpoint)
            log.info("joined: %d members, master %s", len(self.members),
                     self.members.master.name)

    def _on_join(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        info = MemberInfo.from_wire(header["info"])
        if not self.is_master:
            master = self.members.master
            self.member.reply_error(ident, header, p.NOT_READY, "not the master",
                                    master=master.endpoint if master else None)
            return
        if info.uuid not in self.members:
            try:
                restored = header.get("restored")
                self.restored_tables[info.uuid] = None if restored is None else \
                    PartitionTable.from_wire(restored)
            except PartitionTableError:
                self.restored_tables[info.uuid] = None
            self.restored_clean[info.uuid] = header.get("clean") is True
            if not self.state.join_allowed and not self._may_rejoin(info.uuid):
                self.member.reply_error(ident, header, p.STATE, "join refused",
                                        op="join", state=self.state.value)
                return
            if info.uuid in self.dead:
                log.info("%s comes back: it takes back its partitions of the stable table",
                         info.name)
                self.dead.discard(info.uuid)
            self._change_view(self.members.with_member(info), self.table)
            self._run_commands(self.driver.members_changed(self.table, set(),
                                                           self.member.now()))
            # A lite member holds nothing: its join calls for no plan, and the cluster stays
            # safe (a plan it aborted above ends, and the master looks again then).
            if not info.lite:
                self.plan_wanted = True
            self.events.add({"type": "member_joined", "member": info.name, "lite": info.lite,
                             "at": self.member.now()})
            log.info("member %s joined (%d members)", info.name, len(self.members))
        self.member.reply_ok(ident, header, **self.view_fields())

    # -- following the master ----------------------------------------------------------------

    def _apply_view(self, fields: dict[str, Any]) -> None:
        """Take a published member list and table where they are newer than ours."""
        try:
            members = MemberList.from_wire(fields["members"])
            if "rows" in fields:  # only the rows that changed: on our table, if newer
                table = self.table.copy()
                for pid, version, replicas in fields["rows"]:
                    table.take_row(pid, version, replicas)
            else:
                table = PartitionTable.from_wire(fields["table"])
        except (ValueError, KeyError, TypeError, PartitionTableError) as exc:
            log.warning("ignored a malformed view: %s", exc)
            return
        if table.partition_count != self.table.partition_count:
            log.error("ignored a table of %d partitions (ours: %d)", table.partition_count,
                      self.table.partition_count)
            return
        newer = None
        if members.version > self.members.version:
            if self.joined and self.me not in members:
                log.error("the master removed this member; stopping")
                self.member.running = False
                return
            newer = members
        if fields.get("in_sync") and self.member.journal is not None:
            self._owning_already(table)
        if self.me in (fields.get("wipe") or ()) and self.member.journal is not None:
            self._wipe()  # the restart's first table: our files are older than the cluster's
        state, version = fields.get("state"), fields.get("sv")
        saved = fields.get("saved")
        if isinstance(state, str) and state in ClusterState.__members__ and \
                isinstance(version, int):
            self.take_state(ClusterState(state), version,
                            ClusterState(saved) if saved in ClusterState.__members__ else None)
        self._adopt(newer, table)

    def _adopt(self, members: MemberList | None, table: PartitionTable) -> None:
        """Take a newer member list (if any) and table together, then tell the map service:
        it must never judge a write by a member list without its table."""
        left = self._set_members(members) if members is not None else set()
        changed = self.table.apply(table)
        if self.member.journal is not None and (members is not None or changed):
            self.member.journal.view_dirty = True
        if left:
            self.member.maps.on_members_change(left)
            self.member.syncs.on_members_change(left)
        if changed:
            self._table_changed(changed)

    def _table_changed(self, pids: list[int]) -> None:
        """Partitions whose row changed: migrations resolve first (a flag goes), then the
        map service drops, promotes and settles."""
        self.member.migrations.on_table_change(pids)
        self.member.maps.on_table_change(pids)
        self.member.syncs.on_table_change(pids)

    def commit_locally(self, pid: int, row: tuple[str | None, ...]) -> None:
        """The destination's side of a migration commit (the master commits here first)."""
        if row[0] == self.me:
            self.member.maps.owned.add(pid)  # it has the data: no promotion sync
        if self.member.journal is not None:
            self.member.journal.flush()  # what it received is on disk before it counts
            self.member.journal.view_dirty = True
        self.table.set_replicas(pid, row)
        self._table_changed([pid])

    def _set_members(self, members: MemberList) -> set[str]:
        """Take a newer member list; return who left."""
        old = set(self.members.uuids)
        self.members = members
        now = self.member.now()
        for m in members.members:
            if m.uuid != self.me and m.uuid not in old:
                self.member.connect_peer(m.uuid, m.endpoint)
                self.last_heard[m.uuid] = now
        self.dead -= set(members.uuids) - old  # a member that came back (STABLE_CLUSTER)
        left = old - set(members.uuids) - {self.me}
        for uuid in left:
            self.member.disconnect_peer(uuid)
            self.last_heard.pop(uuid, None)
            self.lease.forget(uuid)
            self.heard_number.pop(uuid, None)
            self.refusing.pop(uuid, None)
        self.suspected &= set(members.uuids)
        if self.claim_followed and members.master and \
                members.master.uuid == self.claim_followed[0]:
            self.claim_followed = None  # the claimant we backed is our master now
        self.master_heard = now
        return left

    def _on_publish(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        sender = header.get("from")
        if sender in self.dead or not self._is_publisher(sender, header.get("members")):
            # A removed master that came back (hung, then resumed before it was fenced):
            # its table carries higher versions for changes nobody may follow.
            self.member.reply_error(ident, header, p.NOT_READY, "not our master",
                                    not_following=True)
            return
        self._apply_view(header)
        if sender == getattr(self.members.master, "uuid", None):
            self.master_heard = self.member.now()
            self.suspected.discard(sender)
        self.member.reply_ok(ident, header)

    def _is_publisher(self, sender: Any, members_wire: Any) -> bool:
        """Only the master of our view, or of a newer member list, publishes to us."""
        if sender == getattr(self.members.master, "uuid", None):
            return True
        try:
            members = MemberList.from_wire(members_wire)
        except ValueError:
            return False
        return members.version > self.members.version and \
            getattr(members.master, "uuid", None) == sender

    def _on_table(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        self.member.reply_ok(ident, header, partition_count=self.table.partition_count,
                             cluster=self.config.cluster_name, master=self.is_master,
                             **self.view_fields())

    def _on_heartbeat(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        sender = header.get("from")
        if not isinstance(sender, str):
            return
        now = self.member.now()
        # Echoing a member we hold dead (we claim its mastership, or back a claim) would give
        # it a lease that our claim breaks: its heartbeats go unechoed.
        if sender in self.members and sender not in self.dead:
            self.last_heard[sender] = now
            number = header.get("n")
            if isinstance(number, int):
                self.heard_number[sender] = number
            self.lease.echoed(sender, header.get("echo"))
            self.member.maps.on_lease_renewed()
            if header.get("want_echo"):
                self._heartbeat_to(sender)  # its lease waits for our echo of that number
        if sender == getattr(self.members.master, "uuid", None):
            self.master_heard = now
            self.suspected.discard(sender)
        if not self.is_master:
            # A member that heartbeats us with a newer member list is a master we do not
            # follow yet (its publish was lost, or we refused it then): heartbeat it back,
            # and it answers our old stamp with its view.
            version = header.get("mv")
            if isinstance(version, int) and version > self.members.version and \
                    now >= self.next_catch_up.get(sender, 0.0):
                self.next_catch_up[sender] = now + self.config.heartbeat_interval
                self._heartbeat_to(sender)
            return
        if sender not in self.members:
            # A removed member that still runs (it hung and came back before it was fenced):
            # our view, which lacks it, makes it stop.
            # The connection stays open: closing it at once could drop the publish unsent.
            endpoint = header.get("endpoint")
            if isinstance(endpoint, str) and endpoint.startswith(self.local_endpoint_prefix):
                self.member.connect_peer(endpoint, endpoint)
                self.member.request_peer(endpoint, p.PUBLISH, self.view_fields(), [],
                                         lambda h, f: None, timeout=1.0)
        elif header.get("mv") != self.members.version or \
                header.get("sv") != self.state_version or \
                header.get("stamp") != self.table.stamp():
            self._publish_to(sender)  # a member that missed a publish catches up here

    def _on_fetch_state(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        """A member claims mastership and collects our view. We go along only if we, too,
        hold every member older than the claimant for gone; otherwise the claimant is wrong
        (it was paused, say) and we say so, and it goes back to following."""
        claimant = header.get("from")
        if not self.joined:
            # A member still joining (its master died before answering) has no view to
            # defend: it gives what it has, and joins the claimant once it is master.
            self.member.reply_ok(ident, header, active=[], **self.view_fields())
            return
        older = []
        for m in self.members.members:
            if m.uuid == claimant:
                break
            older.append(m.uuid)
        else:
            older = None  # not a member of our view
        if older is None or any(u not in self.dead and u not in self.suspected
                                for u in older):
            self.member.reply_error(ident, header, p.NOT_READY, "our master is alive",
                                    master_alive=True)
            return
        now = self.member.now()
        gave_up = set(older) - self.dead
        if self.claim_followed is not None:
            gave_up |= self.claim_followed[2]
        self.dead |= gave_up
        self.suspected -= gave_up
        self.claim_followed = (claimant, now, gave_up)
        self.master_heard = now
        self.member.reply_ok(ident, header, active=self.member.migrations.active(),
                             **self.view_fields())

    def _on_set_state(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        state = ClusterState(header["state"])
        if not self.is_master:
            self.member.reply_error(ident, header, p.NOT_READY, "not the master")
            return
        # The supervisor's, while stopping: a restart restores the state from before.
        self.take_state(state, self.state_version + 1,
                        self.saved_state if header.get("stopping") else None)
        self._publish()
        self.member.reply_ok(ident, header, state=state.value)

    # -- the master's changes ------------------------------------------------------------------

    def _on_form(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        """The supervisor says every initial member has joined: assign all partitions."""
        if not self.is_master:
            self.member.reply_error(ident, header, p.NOT_READY, "not the master")
            return
        if not self.table.is_assigned() and self.members.data_members:
            names = {m.uuid: m.name for m in self.members.members}
            restored = {u: self.restored_tables.get(u) for u in self.members.uuids}
            restored[self.me] = self.restored_table
            decision = decide_restart(restored, names, self.config.restart_policy)
            if decision.refusal:
                log.error("cannot form the cluster from its files: %s", decision.refusal)
                self.member.reply_ok(ident, header, assigned=False, refused=decision.refusal)
                return
            if decision.table is not None:
                self._form_restarted(decision, names)
            else:
                self._change_view(self.members, initial_assignment(
                    self.table, self.members.data_members, self.config.total_backup_count,
                    self.config.backup_placement))
                log.info("assigned %d partitions over %d members", self.table.partition_count,
                         len(self.members.data_members))
        self.member.reply_ok(ident, header, assigned=self.table.is_assigned())

    def _form_restarted(self, decision: RestartDecision, names: dict[str, str]) -> None:
        """Form on the table the members' files hold (seed 003): without the members that
        did not come, and without (or wiped of) those whose data is stale."""
        members, table = self.members, decision.table
        stale = decision.stale
        # Stale members are removed (their folders kept), or, by default, wiped and given a
        # share by migrations; the master cannot remove itself, so its stale data is wiped.
        removed = stale - {self.me} if not self.config.auto_remove_stale_data else set()
        if removed:
            log.error("removing %s: their data is older than the cluster's "
                      "(auto_remove_stale_data is false, so their folders stay as they are)",
                      ", ".join(sorted(names[u] for u in removed)))
            members = members.without(removed)
            self.dead |= removed
        if stale - removed:
            log.warning("%s hold stale data: it is wiped, and migrations give them a share",
                        ", ".join(sorted(names[u] for u in stale - removed)))
            if self.me in stale:
                self._wipe()
        gone = decision.missing | stale
        if gone:
            log.warning("restarting without the data of %d members of the saved table; "
                        "migrations re-create their replicas", len(gone))
            self._report_lost(gone, table)
        table = remove_members(table, gone, members.data_members, self.config.backup_count)
        # Every member stopped in order: owners and backups hold the same writes, so the
        # owners need not send their partitions to their backups (a SYNC each).
        in_sync = not gone and self.member.journal.restored.clean and all(
            self.restored_clean.get(u) for u in members.uuids if u != self.me)
        if in_sync:
            self._owning_already(table)
        self.in_sync_publish, self.wipe_publish = in_sync, sorted(stale - removed - {self.me})
        self._change_view(members, table)
        self.in_sync_publish, self.wipe_publish = False, []
        self.take_state(self.restored_state, self.state_version + 1)
        self.plan_wanted = True
        log.info("restarted on the partition table of the files (stamp %x), %s",
                 decision.table.stamp(), self.state)
        for uuid in removed:
            self.member.notify_supervisor(p.FENCE, uuid=uuid, reason="stale data")

    def _wipe(self) -> None:
        """Drop every partition this member holds (its data is stale), on disk too."""
        for pid in self.member.store.partitions():
            self.member.store.drop_partition(pid)
            self.member.maps.versions.clear(pid)

    def _owning_already(self, table: PartitionTable) -> None:
        """Owners in ``table`` hold their partitions as their backups do (a clean restart):
        taking the table is no promotion that must bring the backups up to date."""
        self.member.maps.owned.update(pid for pid in range(table.partition_count)
                                      if table.owner(pid) == self.me)


    def _change_view(self, members: MemberList, table: PartitionTable) -> None:
        """Master only: adopt a new member list and table locally, then publish both."""
        self._adopt(members if members is not self.members else None, table)
        self._publish()
        self.member.states.members_changed(self.members.version, self.members.uuids)

    def publish_view(self) -> None:
        """Master: publish the view now (a committed state change goes with it)."""
        self._publish()

    def hold_migrations(self) -> None:
        """Master: start no more migrations of the current plan (those running end)."""
        self._run_commands(self.driver.members_changed(self.table, set(), self.member.now()))

    def promote(self, uuid: str) -> None:
        """Master: make lite member ``uuid`` a data member (seed 000): a new member list,
        published, and a rebalance planned."""
        log.info("promoting %s to a data member", self.members.get(uuid).name)
        self._change_view(self.members.promoted(uuid), self.table)
        self.plan_wanted = True

    def take_members(self, members: MemberList, master: str) -> bool:
        """A promoted lite member takes the list its master returned; False when that master
        is not ours any more, or the list does not make us a data member."""
        if members.master is None or members.master.uuid != master or \
                self.members.master is None or self.members.master.uuid != master:
            return False
        if members.version > self.members.version:
            self._adopt(members, self.table)
        return not self.is_lite

    def _publish(self) -> None:
        """Send our view to every member: the rows changed since the last publish where
        that is a few (a migration's commit changes one), else the whole table. A member
        that misses one heartbeats an old stamp and gets the whole view (``_on_heartbeat``)."""
        versions = self.table.versions()
        fields = None
        if self.published is not None and self.published[0] == self.members.version:
            changed = [pid for pid, (new, old) in enumerate(zip(versions, self.published[1],
                                                                 strict=True)) if new != old]
            if len(changed) <= self.table.partition_count // 8:
                rows = [[pid, versions[pid], list(self.table.replicas(pid))]
                        for pid in changed]
                fields = {"members": self.members.to_wire(), "state": self.state.value,
                          "sv": self.state_version, "rows": rows}
        if fields is None:
            fields = self.view_fields()  # the table's wire form, built once for everyone
        self.published = (self.members.version, versions)
        for m in self.members.members:
            if m.uuid != self.me:
                self._publish_to(m.uuid, fields)

    def _publish_to(self, uuid: str, fields: dict[str, Any] | None = None) -> None:
        def on_reply(header: dict[str, Any] | None, frames: list[bytes]) -> None:
            if header is None or not self.is_master:
                return
            if header.get("ok"):
                self.refusing.pop(uuid, None)
            elif header.get("not_following"):
                self.refusing.setdefault(uuid, self.member.now())

        self.member.request_peer(uuid, p.PUBLISH, dict(fields or self.view_fields()), [],
                                 on_reply, timeout=self.config.heartbeat_timeout)

    # -- migrations (the master's) -----------------------------------------------------------

    def _new_driver(self) -> MigrationDriver:
        return MigrationDriver(self.config.total_backup_count,
                               self.config.max_parallel_migrations, self.config.migration_timeout,
                               self.config.backup_placement)

    def _run_commands(self, commands: list[Command]) -> None:
        for event in self.driver.events:
            self.events.add(event)
        self.driver.events.clear()
        for command in commands:
            if isinstance(command, NewTable):
                self._change_view(self.members, command.table)
            elif isinstance(command, Transfer):
                self._ask_migration(command.sender, p.MIGRATE, command, self.driver.transferred)
            elif isinstance(command, Commit):
                self._ask_migration(command.migration.destination, p.COMMIT, command,
                                    self.driver.committed)

    def _ask_migration(self, uuid: str, op: str, command: Transfer | Commit, then: Any) -> None:
        driver = self.driver

        def on_reply(header: dict[str, Any] | None, frames: list[bytes]) -> None:
            if driver is not self.driver or not self.is_master:
                return  # a driver of an earlier mastership
            ok = bool(header and header.get("ok"))
            if not ok:
                log.info("migration %s of partition %d: %s", op,
                         command.migration.partition_id,
                         header.get("msg") if header else "no answer")
            self._run_commands(then(command.mid, ok, self.table, self.member.now()))

        fields = {"mid": command.mid, "m": migration_to_wire(command.migration),
                  "initial": command.initial_version}
        timeout = self.config.migration_timeout if op == p.MIGRATE else \
            self.config.heartbeat_timeout
        self.member.request_peer(uuid, op, fields, [], on_reply, timeout=timeout)

    def _migration_tick(self, now: float) -> None:
        self._run_commands(self.driver.tick(self.table, now))
        if self.driver.take_ended():
            # A plan ended (done, failed or aborted): look again, after a pause if it failed.
            self.plan_wanted = True
            pause = MIGRATION_RETRY_S if self.driver.stats.failed else 0.0
            self.next_plan = now + max(self.config.partition_migration_interval, pause)
        staying = [u for u in self.members.data_members if u not in self.leaving]
        if self.plan_wanted and not self.driver.active and now >= self.next_plan and \
                self.table.is_assigned() and not self.member.states.holds_migrations:
            self.plan_wanted = False
            self._run_commands(self.driver.start(self.table, staying, now, self.state,
                                                 self._reclaim_target(staying)))
        self._let_go(staying)

    def _may_rejoin(self, uuid: str) -> bool:
        """In STABLE_CLUSTER only a member of the stable table may join (it left and came
        back, restarted from its files)."""
        return self.state.rejoin_allowed and self.stable_table is not None and any(
            uuid in self.stable_table.replicas(pid)
            for pid in range(self.stable_table.partition_count))

    def _reclaim_target(self, data_members: list[str]) -> PartitionTable | None:
        """STABLE_CLUSTER: where members that came back take back their partitions."""
        if self.stable_table is None or not self.state.rejoin_allowed:
            return None
        return reclaim_target(self.table, self.stable_table, data_members)

    def _let_go(self, staying: list[str]) -> None:
        """Remove the leaving members that hold nothing any more (or that nothing can be
        moved to); the master itself, when it leaves, stops once it holds nothing."""
        if not self.leaving:
            return
        self.leaving &= set(self.members.uuids)
        busy = {x for run in self.driver.running.values()
                for x in (run.migration.source, run.migration.destination, run.sender)}
        for uuid in sorted(self.leaving):
            empty = not any(self.table.replica_counts(uuid))
            if (empty and uuid not in busy) or not staying or \
                    not self.state.migration_allowed:
                if uuid == self.me:
                    log.info("this master left gracefully: its replicas moved; stopping")
                    self.member.running = False
                else:
                    self.leaving.discard(uuid)
                    self.remove({uuid}, "left gracefully")

    def request_leave(self) -> None:
        """Leave gracefully (SIGTERM): the master moves our replicas away, then removes us;
        we go when we learn of it, or after graceful_shutdown_max_wait."""
        if self.leave_started is None:
            self.leave_started = self.member.now()
            self.member.maps.renew_local_reads()  # before the master hears we leave
            log.info("leaving gracefully: asking the master to move our replicas away")

    def _leave_tick(self, now: float) -> None:
        if now - self.leave_started > self.config.graceful_shutdown_max_wait:
            log.warning("replicas did not move away within %g s; leaving anyway",
                        self.config.graceful_shutdown_max_wait)
            self.member.running = False
        elif self.is_master:
            if self.me not in self.leaving:
                self.leaving.add(self.me)
                self.plan_wanted = True
        elif now >= self.next_leave_request and self.members.master is not None:
            self.next_leave_request = now + self.config.heartbeat_interval
            self.member.request_peer(self.members.master.uuid, p.LEAVE, {"uuid": self.me},
                                     [], lambda h, f: None,
                                     timeout=self.config.heartbeat_interval)

    def _on_leave(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        uuid = header.get("uuid")
        if not self.is_master:
            master = self.members.master
            self.member.reply_error(ident, header, p.NOT_READY, "not the master",
                                    master=master.endpoint if master else None)
            return
        if uuid in self.members and uuid not in self.leaving:
            self.leaving.add(uuid)
            log.info("%s asks to leave: moving its replicas away first",
                     self.members.get(uuid).name)
            self._run_commands(self.driver.members_changed(self.table, set(),
                                                           self.member.now()))
            self.plan_wanted = True
        self.member.reply_ok(ident, header, leaving=uuid in self.leaving)

    def remove(self, uuids: set[str], reason: str) -> None:
        """Master only: remove members, promote backups, publish, have the removed fenced."""
        uuids = {u for u in uuids if u in self.members and u != self.me}
        if not uuids:
            return
        self.dead |= uuids
        names = [self.members.get(u).name for u in uuids]
        lite = all(self.members.get(u).lite for u in uuids)  # they held nothing
        members = self.members.without(uuids)
        promoted = sum(1 for pid in range(self.table.partition_count)
                       if self.table.owner(pid) in uuids)
        self.events.add({"type": "member_removed", "members": sorted(names), "reason": reason,
                         "promoted": promoted, "at": self.member.now()})
        self._report_lost(uuids, self.table)
        table = remove_members(self.table, uuids, members.data_members,
                               self.config.backup_count)
        # The migrations the removal fails raise their partitions' versions past what a
        # destination may have committed (seed 002 section 2.1). The repair and those raises
        # go out as one table: published apart, the repaired row would reach members at the
        # very version a destination already holds with the migration's row, and two members
        # would each own the partition at one version.
        commands = self.driver.members_changed(table, uuids, self.member.now())
        for command in commands:
            if isinstance(command, NewTable):
                table = command.table
        self._change_view(members, table)
        self._run_commands([c for c in commands if not isinstance(c, NewTable)])
        if not lite:  # (as for a lite join: nothing to plan)
            self.plan_wanted = True
        for uuid in uuids:
            self.member.notify_supervisor(p.FENCE, uuid=uuid, reason=reason)
        log.info("removed %s (%s); %d members left", ", ".join(names), reason, len(members))

    def _report_lost(self, gone: set[str], table: PartitionTable) -> None:
        """Partitions every replica of which is gone: they come back empty (the data is
        lost); say so in the log, the count in status and to partition-lost listeners."""
        for pid in range(table.partition_count):
            replicas = [r for r in table.replicas(pid) if r is not None]
            if replicas and all(r in gone for r in replicas):
                self.lost_partitions += 1
                log.warning("partition %d lost all its %d replicas; it is empty now", pid,
                            len(replicas))
                self.events.add({"type": "partition_lost", "partition_id": pid,
                                 "lost_replicas": len(replicas)})

    def _on_events(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        """Master: the events after ``since`` for a client's listeners."""
        since = header.get("since")
        if not isinstance(since, int):
            raise ProtocolError("events takes since (an int)")
        if not self.is_master:
            master = self.members.master
            self.member.reply_error(ident, header, p.NOT_READY, "not the master",
                                    master=master.endpoint if master else None)
            return
        events, missed = self.events.since(since)
        self.member.reply_ok(ident, header, events=[[n, e] for n, e in events],
                             next=self.events.next_seq, missed=missed, master=self.me)

    def _on_member_died(self, ident: bytes, header: dict[str, Any], frames: list[bytes]) -> None:
        uuid = header["uuid"]
        self.member.reply_ok(ident, header)
        self.member_gone(uuid, "process died")

    def member_gone(self, uuid: str, reason: str) -> None:
        if self.claim_followed is not None and reason == "process died":
            self.claim_followed[2].discard(uuid)  # truly gone, whatever the claimant does
        if uuid == self.me or uuid in self.dead:
            return
        self.dead.add(uuid)
        self.heard_number.pop(uuid, None)  # no more echoes to it (see _on_heartbeat)
        if self.is_master:
            self.remove({uuid}, reason)
        else:
            self._maybe_take_over()

    # -- master change (seed 002, section 1.2) -----------------------------------------------

    def _maybe_take_over(self) -> None:
        if not self.joined or self.recovering or self.is_master:
            return
        first = self.members.first_alive(self.dead)
        if first is None or first.uuid != self.me:
            return
        self.recovering = True
        self.recovery_started = self.member.now()
        self.recovery_waiting = {u for u in self.members.uuids
                                 if u != self.me and u not in self.dead}
        self.recovery_tables, self.recovery_versions = [], []
        self.recovery_states = []
        self.recovery_active = []
        self.recovery_refused = set()
        self.next_fetch = 0.0
        log.info("master %s is gone; collecting partition tables from %d members",
                 self.members.master.name, len(self.recovery_waiting))
        self._recovery_step(self.member.now())

    def _recovery_step(self, now: float) -> None:
        self.recovery_waiting -= self.dead
        if now - self.recovery_started > self.config.heartbeat_timeout:
            if self.recovery_refused & self.recovery_waiting:
                self._abort_recovery()
                return
            # Seed 002: every member returns its table or leaves the cluster.
            self.dead |= self.recovery_waiting
            self.recovery_waiting = set()
        if not self.recovery_waiting:
            self._finish_recovery()
            return
        if now >= self.next_fetch:
            # Ask again every heartbeat interval: a member is given up only after a whole
            # heartbeat timeout of asking, not after one or two lost messages.
            self.next_fetch = now + self.config.heartbeat_interval
            for uuid in sorted(self.recovery_waiting):
                self.member.request_peer(uuid, p.FETCH_STATE, {}, [],
                                         self._fetch_callback(uuid),
                                         timeout=self.config.heartbeat_timeout)

    def _abort_recovery(self) -> None:
        """Members still hear the master we held for gone: we were wrong (paused, or cut off
        from it); follow it again instead of splitting the cluster."""
        older = []
        for m in self.members.members:
            if m.uuid == self.me:
                break
            older.append(m.uuid)
        self.dead -= set(older)
        self.recovering = False
        self.master_heard = self.member.now()
        log.warning("%d members still follow master %s: not taking over",
                    len(self.recovery_refused), self.members.master.name)

    def _fetch_callback(self, uuid: str):
        def on_reply(header: dict[str, Any] | None, frames: list[bytes]) -> None:
            if header is None or uuid not in self.recovery_waiting:
                return
            if not header.get("ok"):
                if header.get("master_alive"):
                    self.recovery_refused.add(uuid)
                    # Usually it has not yet heard of the death we heard of (the supervisor
                    # tells every member at once): ask again at the next tick, not after a
                    # whole heartbeat interval.
                    self.next_fetch = 0.0
                return
            self.recovery_refused.discard(uuid)
            try:
                self.recovery_tables.append(PartitionTable.from_wire(header["table"]))
                self.recovery_versions.append(MemberList.from_wire(header["members"]).version)
                state, version = header.get("state"), header.get("sv")
                if state in ClusterState.__members__ and isinstance(version, int):
                    self.recovery_states.append((version, ClusterState(state)))
                self.recovery_active += [a for a in header.get("active") or []
                                         if isinstance(a, list) and len(a) == 3
                                         and all(isinstance(x, int) for x in a)]
            except (ValueError, KeyError, PartitionTableError) as exc:
                log.warning("bad state from %s: %s", uuid, exc)
                return
            self.recovery_waiting.discard(uuid)
        return on_reply

    def _finish_recovery(self) -> None:
        gone = {u for u in self.dead if u in self.members}
        version = max([self.members.version, *self.recovery_versions])
        members = self.members.with_version(version).without(gone)
        if members.version == version:  # nothing removed; still a new master's list
            members = members.with_version(version + 1)
        table = collected_table(self.table, self.recovery_tables,
                                [*self.recovery_active, *self.member.migrations.active()])
        self.events.add({"type": "master_changed", "master": self.member.name,
                         "gone": sorted(self.members.get(u).name for u in gone),
                         "at": self.member.now()})
        self._report_lost(gone, table)
        table = remove_members(table, gone, members.data_members, self.config.backup_count)
        # A state change that some member committed was decided (every member had locked
        # it): the newest committed state is the cluster's (grid/cluster/state_change.py).
        for version, state in self.recovery_states:
            self.take_state(state, version)
        self.recovering = False
        self.driver = self._new_driver()
        self.plan_wanted = True
        # Members heartbeat only the master, so what we heard of them as a follower is old:
        # their heartbeat timeout starts now.
        now = self.member.now()
        self.last_heard = {u: now for u in members.uuids if u != self.me}
        self._change_view(members, table)
        for uuid in gone:
            self.member.notify_supervisor(p.FENCE, uuid=uuid, reason="left during master change")
        log.info("now master; %d members, table stamp %x", len(members), self.table.stamp())

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        paused_s = now - self.last_tick
        self.last_tick = now
        if self.joined and paused_s > self.config.heartbeat_timeout / 2:
            # We were not running (stopped, swapped out): what we did not hear meanwhile says
            # nothing about the others. Their timers restart now.
            log.warning("this member was paused for %.1f s; restarting failure timers",
                        paused_s)
            self.master_heard = now
            self.last_heard = dict.fromkeys(self.last_heard, now)
        if not self.joined:
            if now >= self.next_join:
                self._send_join(now)
            return
        if self.recovering:
            self._recovery_step(now)
        if self.leave_started is not None:
            self._leave_tick(now)
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.config.heartbeat_interval
            self._send_heartbeats()
        timeout = self.config.heartbeat_timeout
        if self.is_master:
            late = {u for u, t in self.last_heard.items()
                    if now - t > timeout and u in self.members}
            if late:
                self.remove(late, f"no heartbeat for {timeout:g} s")
            # A member that refuses our publishes for long neither follows us nor leaves:
            # it may not sit between views, so it is removed (and fenced).
            stuck = {u for u, t in self.refusing.items()
                     if now - t > 2 * timeout and u in self.members}
            if stuck:
                self.remove(stuck, "it does not follow the master's view")
            self._migration_tick(now)
        elif not self.recovering:
            self._follower_checks(now)

    def _follower_checks(self, now: float) -> None:
        timeout = self.config.heartbeat_timeout
        if self.claim_followed is not None and now - self.claim_followed[1] > timeout:
            claimant, _, gave_up = self.claim_followed
            self.claim_followed = None
            self.dead -= gave_up
            self.suspected |= gave_up
            log.warning("claimant %s did not take over; following our master again",
                        getattr(self.members.get(claimant), "name", claimant))
        master = self.members.master
        if master and master.uuid != self.me and now - self.master_heard > timeout:
            self.master_heard = now
            first = self.members.first_alive(self.dead | {master.uuid})
            if first is not None and first.uuid == self.me:
                log.warning("no heartbeat from master %s for %g s", master.name, timeout)
                self.member_gone(master.uuid, "heartbeat timeout")
            elif master.uuid not in self.suspected:
                # Not ours to replace it: the next in line decides, and we back its claim.
                log.warning("no heartbeat from master %s for %g s; suspecting it",
                            master.name, timeout)
                self.suspected.add(master.uuid)

    def _heartbeat_targets(self) -> list[str]:
        """A master heartbeats every member, a follower only its master."""
        if self.is_master:
            return [u for u in self.members.uuids if u != self.me]
        master = self.members.master
        return [master.uuid] if master and master.uuid != self.me else []

    def _send_heartbeats(self) -> None:
        for uuid in self._heartbeat_targets():
            self._heartbeat_to(uuid)

    def _heartbeat_to(self, uuid: str, want_echo: bool = False) -> None:
        """One heartbeat: our view (a master answers a differing one with its own), our
        heartbeat number, and the newest number we heard from the peer (its lease)."""
        header = p.request(p.HEARTBEAT, 0, self.config.cluster_name, **{
            "from": self.me, p.SECRET_FIELD: self.config.cluster_secret,
            "mv": self.members.version, "stamp": self.table.stamp(), "sv": self.state_version,
            "endpoint": self.member.info.endpoint,
            "n": self.lease.next_heartbeat(self.member.now()),
            "echo": self.heard_number.get(uuid), "want_echo": want_echo})
        self.member.send_peer(uuid, [header])
