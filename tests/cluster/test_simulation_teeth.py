"""The simulation has teeth: each test breaks one guarantee of the write path on purpose and
shows that the simulated runs catch it within a few seeds. If one of these starts passing
without a catch, the simulation has lost the power to see that bug."""

from __future__ import annotations

import itertools
import math

import pytest

from grid import protocol as p
from grid.cluster.invocations import InvocationRecords
from grid.cluster.migrations import MigrationDriver
from grid.cluster.reply_order import ReplyOrder, Ticket
from grid.cluster.state import ClusterState
from grid.cluster.state_change import CommitAll, Finished, Phase, StateChange
from tests.cluster import test_chain, test_simulation, test_state_change_sim, test_write_path
from tests.cluster.sim import SimMapService, SimRecords, SimStore
from workers import map_service
from workers.cluster_service import ClusterService
from workers.local_reads import LocalReadDirectory, NamespaceSlots
from workers.map_service import MapService
from workers.migration_service import MigrationService
from workers.state_service import StateService

pytestmark = pytest.mark.timeout(300)


def first_failure(run, cases: list[str], seeds: range,
                  known: tuple[int, str] | None = None) -> str | None:
    """The first (seed, case) for which ``run(seed, case)`` fails, with what failed; or None.

    ``known`` is a (seed, case) that caught the break when the test was written: it runs
    first, so a test whose catch lies deep in its seeds stays quick. If it no longer catches
    (a change to the simulation moves where a bug shows), the whole search follows."""
    tries = itertools.product(seeds, cases)
    for seed, case in itertools.chain([known] if known else [], tries):
        try:
            run(seed, case)
        except AssertionError as failure:
            return f"seed {seed}, {case}: {failure}"
    return None


def caught(faults: list[str], seeds: range, known: tuple[int, str] | None = None
           ) -> str | None:
    return first_failure(test_simulation.test_failover_keeps_every_acknowledged_write,
                         faults, seeds, known)


def test_an_owner_that_answers_before_its_backups_is_caught(monkeypatch):
    monkeypatch.setattr(Ticket, "ready", property(lambda self: True))
    assert caught(["kill", "flaky-kill"], range(6))


def test_a_failed_send_taken_for_an_ack_is_caught(monkeypatch):
    original = MapService._on_backup_ack

    def ack_on_failure(self, uuid, seq, header):
        original(self, uuid, seq, header if header is not None else {"ok": True})

    monkeypatch.setattr(SimMapService, "_on_backup_ack", ack_on_failure)
    assert caught(["flaky-kill", "flaky-kill-master"], range(12))


def test_a_resend_applied_twice_is_caught(monkeypatch):
    monkeypatch.setattr(SimMapService, "_resent", lambda self, *args: False)
    assert caught(["kill", "hang"], range(6))


def test_reads_of_writes_not_yet_durable_are_caught(monkeypatch):
    monkeypatch.setattr(ReplyOrder, "busy", lambda self, slots: False)
    assert caught(["kill-after-read"], range(20))


def test_a_follower_that_gives_up_on_a_live_master_is_caught(monkeypatch):
    def give_up(self, now):  # the old rule: a silent master is dead, whoever we are
        master = self.members.master
        if master and master.uuid != self.me and \
                now - self.master_heard > self.config.heartbeat_timeout:
            self.master_heard = now
            self.member_gone(master.uuid, "heartbeat timeout")

    monkeypatch.setattr(ClusterService, "_follower_checks", give_up)
    assert caught(["slow-master-link"], range(24), known=(10, "slow-master-link"))


def test_a_new_owner_that_does_not_sync_its_backups_is_caught(monkeypatch, make_cluster):
    monkeypatch.setattr(SimMapService, "_sync_backups", lambda self, pid: None)
    with pytest.raises(AssertionError):
        test_write_path.test_a_promoted_backup_brings_the_other_backups_up_to_date_before_it_answers(  # noqa: E501
            make_cluster)


def test_a_backup_that_judges_by_an_old_table_is_caught(monkeypatch, make_cluster):
    monkeypatch.setattr(SimMapService, "_behind", lambda self, parts: False)
    with pytest.raises(AssertionError):
        test_write_path.test_a_write_the_backup_cannot_take_yet_waits_and_nobody_reads_it_before(
            make_cluster)


def test_a_backup_that_answers_for_its_owner_out_of_step_is_caught(monkeypatch, make_cluster):
    def answer_anyway(self, pid, ns, client_id, rid, old, in_step=False):  # no in-step check
        ident = self.clients.ident(client_id)
        if ident is None:
            return False
        self.member.reply(ident, [p.reply_ok(rid), *([] if old is None else [old])])
        return True

    monkeypatch.setattr(SimMapService, "_answer_caller", answer_anyway)
    with pytest.raises(AssertionError):
        test_chain.test_a_backup_out_of_step_leaves_the_answer_to_its_owner(make_cluster)


def test_a_backup_that_answers_a_batch_it_did_not_all_apply_is_caught(monkeypatch,
                                                                      make_cluster):
    monkeypatch.setattr(map_service, "backup_may_answer_batch", lambda parts, applied: True)
    with pytest.raises(AssertionError):
        test_chain.test_a_batch_its_backup_did_not_apply_in_full_is_answered_by_the_owner(
            make_cluster)


def test_an_owner_that_lets_one_of_two_backups_answer_is_caught(monkeypatch):
    monkeypatch.setattr(map_service, "owner_may_chain",
                        lambda sync_backups, waiters, durable_wait: waiters == 1)
    assert caught(["kill-two"], range(3))


def test_an_owner_that_acts_alone_without_a_lease_is_caught(monkeypatch, make_cluster):
    monkeypatch.setattr(ClusterService, "lease_valid", lambda self: True)
    with pytest.raises(AssertionError):
        test_write_path.test_a_removed_owner_without_backups_acknowledges_nothing(make_cluster)


def read_without_a_lease(self, ident, header, slots, frames, **fields):
    """MapService._answer_after as it was: reads wait for earlier writes, not for the lease."""
    ticket = Ticket(slots, [(ident, header.get("id"))], fields, frames)
    self.order.enqueue(ticket)
    self._release(ticket.slots)


def test_an_owner_that_reads_without_a_lease_is_caught(monkeypatch, make_cluster):
    monkeypatch.setattr(SimMapService, "_answer_after", read_without_a_lease)
    with pytest.raises(AssertionError, match="a removed owner answered"):
        test_write_path.test_a_removed_owner_answers_no_read_of_what_its_successor_took(
            make_cluster)
    assert caught(["hang-resume", "hang-resume-master"], range(12))


def test_a_claimant_that_echoes_the_master_it_replaces_is_caught(monkeypatch):
    """The claimant goes on echoing the old master's heartbeats: the master's lease outlives
    the claim, and its local readers trust it after its removal."""
    original = ClusterService._on_heartbeat

    def echo_the_dead(self, ident, header, frames):
        dead, self.dead = self.dead, set()
        try:
            original(self, ident, header, frames)
        finally:
            self.dead = dead | self.dead

    monkeypatch.setattr(ClusterService, "_on_heartbeat", echo_the_dead)
    assert caught(["hang-near-timeout-master"], range(24),
                  known=(20, "hang-near-timeout-master"))


MIGRATION_FAULTS = ["join", "join-then-kill", "join-then-kill-master", "leave", "kill"]


def test_a_destination_that_takes_the_step_before_the_commit_is_caught(monkeypatch):
    original = MigrationService._on_fragment

    def take_early(self, ident, header, frames):
        original(self, ident, header, frames)
        mid, m, initial = self._request(header)
        arrival = self.incoming.get(m.partition_id)
        if arrival is not None and arrival.complete:
            self._on_commit(b"", {**header, "from": self.member.cluster.members.master.uuid},
                            [])

    monkeypatch.setattr(MigrationService, "_on_fragment", take_early)
    assert caught(MIGRATION_FAULTS, range(10), known=(1, "leave"))


def test_a_source_that_drops_its_data_before_the_commit_is_caught(monkeypatch):
    original = MigrationService._answer

    def drop_early(self, run, ok, why):
        if ok and run.migration.source_new_replica_index == -1 and \
                run.migration.source == self.member.info.uuid:
            self.member.store.drop_partition(run.migration.partition_id)
        original(self, run, ok, why)

    monkeypatch.setattr(MigrationService, "_answer", drop_early)
    # Caught where a migration fails after the early drop: a member dies while they run.
    assert caught(["join-then-kill", "join-then-kill-master"], range(20),
                  known=(19, "join-then-kill-master"))


def test_a_new_master_that_ignores_the_collected_migrations_is_caught(monkeypatch):
    original = ClusterService._finish_recovery

    def ignore(self):
        self.recovery_active = []
        original(self)

    monkeypatch.setattr(ClusterService, "_finish_recovery", ignore)
    assert caught(["join-then-kill-master", "kill-master", "leave-master"], range(20),
                  known=(19, "join-then-kill-master"))


def test_one_partition_version_with_two_rows_is_caught_at_the_step(make_cluster):
    """A member that took a step without its version rising (two members each owning a
    partition at one version) is a violation the moment it happens."""
    net = make_cluster(seed=5, backup_count=1, nodes=3)
    assert not net.violations
    node = next(n for n in net.alive() if not n.cluster.is_master)
    table = node.cluster.table
    row = table.replicas(0)
    table._rows[0] = (row[1], row[0], *row[2:])  # the same version, another owner
    net.views.pop(node.name)  # the check runs when a view changes; this one just did
    net.check_step()
    assert any("partition 0 at version" in v for v in net.violations), net.violations


def state_change_caught(races: list[str], seeds: range, known: tuple[int, str] | None = None
                        ) -> str | None:
    return first_failure(test_state_change_sim.run_race, races, seeds, known)


def test_members_that_take_the_state_when_they_lock_are_caught(monkeypatch):
    original = StateService._on_lock

    def take_early(self, ident, header, frames):
        original(self, ident, header, frames)
        cluster = self.member.cluster
        cluster.take_state(ClusterState(header["state"]), cluster.state_version + 1)

    monkeypatch.setattr(StateService, "_on_lock", take_early)
    assert state_change_caught(["lost-lock", "kill", "hang"], range(4))


def test_a_master_that_commits_without_every_lock_is_caught(monkeypatch):
    original = StateChange.lock_answered

    def commit_anyway(self, uuid, ok, why=""):
        return original(self, uuid, True, why)

    monkeypatch.setattr(StateChange, "lock_answered", commit_anyway)
    assert state_change_caught(["lost-lock", "hang"], range(4))


def test_a_master_that_answers_before_the_members_confirm_the_commit_is_caught(monkeypatch):
    """Answering at the decision: a master that dies before its commit reaches anyone has
    told its client of a state that is in force nowhere."""
    original = StateChange.lock_answered

    def answer_at_decision(self, uuid, ok, why=""):
        commands = original(self, uuid, ok, why)
        if any(isinstance(command, CommitAll) for command in commands):
            self.phase = Phase.DONE  # confirmations are no longer waited for
            commands.append(Finished(True, self.new, f"the cluster is {self.new}"))
        return commands

    monkeypatch.setattr(StateChange, "lock_answered", answer_at_decision)
    assert state_change_caught(["kill-master"], range(60, 80), known=(79, "kill-master"))


# -- local reads (workers/local_reads.py): what a client on the host reads from a member's
# memory is checked after every step (SimNetwork.check_local_reads) -------------------------

original_renew = LocalReadDirectory.renew
original_set_served = LocalReadDirectory.set_served


def test_local_reads_of_writes_not_yet_durable_are_caught(monkeypatch):
    """A write that leaves its slot settled: local readers see it before the backups have
    it."""
    monkeypatch.setattr(NamespaceSlots, "begin",
                        lambda self, pid: NamespaceSlots.end(self, pid))
    assert caught(["kill"], range(3))


def test_local_reads_that_outlive_the_membership_lease_are_caught(monkeypatch):
    """A member that lets local readers trust it for ever: once it hangs and is removed,
    they would read what its partitions' new owners have moved past."""
    monkeypatch.setattr(LocalReadDirectory, "renew",
                        lambda self, until: original_renew(self, math.inf))
    assert caught(["hang", "hang-master"], range(6))


def test_local_reads_of_a_partition_that_moved_away_are_caught(monkeypatch):
    """A member that goes on serving a partition to local readers after its table gave the
    partition to another member."""
    monkeypatch.setattr(LocalReadDirectory, "set_served",
                        lambda self, pid, served: original_set_served(self, pid, True)
                        if served or self.served[pid] else None)
    assert caught(MIGRATION_FAULTS, range(6))


def test_a_new_owner_that_serves_local_reads_before_it_shares_the_index_is_caught(monkeypatch):
    """A member that builds no shared index for a partition it starts to serve holding
    records of it already (a backup promoted by a kill): local readers would find no index
    there and read every key absent."""
    original_share = SimStore.share

    def share(self, pid, shared):
        if not (shared and self.namespaces(pid)):
            original_share(self, pid, shared)

    monkeypatch.setattr(SimStore, "share", share)
    assert caught(["kill"], range(6))


def test_a_shared_index_built_without_a_key_is_caught(monkeypatch):
    """A member whose shared index, whenever it is built (when it starts to serve a
    partition, a promoted backup's, or when a batch fills it), leaves out one key: local
    readers would read that key absent while a get through the owner finds it. Nothing the
    member does later need look the key up, so only the check of a served index against the
    records sees it."""
    from workers.local_reads import SharedIndex

    build = SharedIndex.build.__func__

    def build_without_one(cls, new_segment, entries, count, room=0):
        if count >= 2 and all(entry.__class__ is int for entry in entries.values()):
            entries = dict(entries)
            del entries[max(entries)]
            count -= 1
        return build(cls, new_segment, entries, count, room)

    monkeypatch.setattr(SharedIndex, "build", classmethod(build_without_one))
    assert caught(["kill"], range(3))


def test_an_owner_that_answers_a_spread_batch_once_one_backup_applied_it_is_caught(
        monkeypatch):
    """A batch over many partitions has a backup operation for each backup member; taking
    the first acknowledgement for all of them is a bug only the spread batch writer sees."""
    original = MapService._on_backup_ack

    def one_ack_for_all(self, uuid, seq, header):
        ticket = self.op_tickets.get((uuid, seq))
        if ticket is not None and header is not None and header.get("ok") \
                and len(ticket.written) > 1:
            ticket.waiting.clear()
        original(self, uuid, seq, header)

    monkeypatch.setattr(SimMapService, "_on_backup_ack", one_ack_for_all)
    assert first_failure(
        lambda seed, fault: test_simulation.test_failover_keeps_every_acknowledged_write(
            seed, fault, batches=True), ["kill", "kill-master"], range(6))


def test_a_new_owner_that_syncs_its_backups_only_when_it_holds_something_is_caught(
        monkeypatch):
    """A backup promoted to owner of a partition it holds nothing of, whose other backup got
    a write from the dead owner that it did not: unsynced, that backup keeps the write."""
    original = MapService._sync_backups

    def only_when_held(self, pid):
        if self.store.namespaces(pid):
            original(self, pid)

    monkeypatch.setattr(SimMapService, "_sync_backups", only_when_held)
    assert first_failure(
        lambda seed, fault: test_simulation.test_failover_keeps_every_acknowledged_write(
            seed, fault, batches=True), ["kill-two"], range(6), known=(52, "kill-two"))


def test_invocation_records_that_expire_while_their_client_may_resend_are_caught(monkeypatch):
    """Records kept for half the invocation timeout: a write whose answer was lost is still
    held by its replicas, without its record, while its client resends it. The record check
    after every step catches it the moment a record expires; checked only where a table
    changed or a sync was installed (as it was before), seeds 0-2 of every fault showed
    nothing of it."""
    init = InvocationRecords.__init__
    monkeypatch.setattr(SimRecords, "__init__",
                        lambda self, keep_s, max_records=1_000_000:
                        init(self, keep_s / 2, max_records))
    net = test_simulation.run_scenario(0, "kill", False)
    try:
        assert any("which its client may resend, without its record" in v
                   for v in net.violations), net.violations
    finally:
        net.close()


def test_a_master_that_says_safe_between_a_plan_and_the_next_is_caught(monkeypatch):
    """A master that forgets that a plan just ended (its next tick looks again for what the
    plan did not do) says the cluster is safe in between: a wait-safe returns while a
    graceful leave still has partitions to move (the window of a suite run: a failed
    migration left members unbalanced after wait-safe). Caught at seeds 2, 8, 9 and 11 of
    leave and leave-master when written."""
    monkeypatch.setattr(MigrationDriver, "ended", property(lambda self: False))

    def run(seed: int, fault: str) -> None:
        net = test_simulation.run_scenario(seed, fault, False)
        try:
            assert not any("says the cluster is safe with" in v for v in net.violations), \
                net.violations
        finally:
            net.close()

    assert first_failure(run, ["leave", "leave-master"], range(12), known=(2, "leave"))
