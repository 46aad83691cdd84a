"""The replica sync simulation has teeth: each test breaks one rule of replica sync on purpose
and shows that the simulated runs (tests/cluster/test_replica_sync_sim.py) catch it."""

from __future__ import annotations

import pytest

from grid.cluster import replica_sync
from grid.partition.replica_versions import BackupDecision, ReplicaVersions
from grid.serialization import serialize_value
from tests.cluster.sim import SimMapService, SimRecords
from tests.cluster.test_replica_sync_sim import CASES, check_case
from tests.cluster.test_simulation_teeth import first_failure
from tests.cluster.test_write_path import (
    resend_to_a_backup_a_replica_sync_brought_the_write_to,
    resend_to_an_async_backup_a_replica_sync_repaired,
)
from workers.replica_sync_service import ReplicaSyncService

pytestmark = pytest.mark.timeout(300)


def caught(cases: list[str], seeds: range, known: tuple[int, str] | None = None
           ) -> str | None:
    return first_failure(check_case, cases, seeds, known)


def test_a_backup_that_never_installs_an_answer_is_caught(monkeypatch):
    monkeypatch.setattr(ReplicaSyncService, "_install", lambda self, *args: None)
    assert caught(["loss"], range(3))


def test_an_owner_that_never_sends_its_versions_is_caught(monkeypatch):
    """Only a later operation would show a backup its gap; the last ones lost stay lost."""
    monkeypatch.setattr(ReplicaSyncService, "_send_versions", lambda self: None)
    assert caught(["loss", "loss-kill"], range(6))


def test_an_answer_installed_without_the_window_operations_is_caught(monkeypatch):
    """Operations newer than the snapshot, applied while the request was out, are dropped."""
    plan = replica_sync.plan_install

    def no_replay(window, snapshot, replaced, leaf_of):
        return plan(window, snapshot, replaced, leaf_of)[0], []
    monkeypatch.setattr("workers.replica_sync_service.plan_install", no_replay)
    assert caught(CASES, range(6), known=(2, "two-sync-slow-answers-kill"))


def test_an_answer_installed_whatever_was_applied_meanwhile_is_caught(monkeypatch):
    monkeypatch.setattr("workers.replica_sync_service.plan_install",
                        lambda window, snapshot, replaced, leaf_of: (True, []))
    assert caught(CASES, range(6), known=(2, "two-sync-slow-answers-kill"))


def test_a_dirty_backup_that_drops_operations_until_its_sync_is_caught(monkeypatch):
    """The seed's fourth rule read as "drop the operation": a dirty synchronous backup then
    acknowledges writes it does not hold."""
    monkeypatch.setattr(BackupDecision, "apply", property(
        lambda self: self in (BackupDecision.APPLY, BackupDecision.APPLY_DIRTY)))
    assert caught(["two-sync-slow-answers-kill"], range(6))


def test_a_sync_that_keeps_the_records_of_the_writes_it_took_away_is_caught(monkeypatch,
                                                                             make_cluster):
    """The backup's records stay as they were (the rule before this test): the simulation's
    record check catches it (seeds 4, 6 and 10 of loss-kill-master since backups are paired
    with their owners by default, in a ring of the members sorted; seed 7 after asynchronous
    backup operations went unanswered, seed 20 before: where a seed catches it moves with
    the runs), and in the scenario the resend is answered as done from the record while
    nothing holds the write."""
    monkeypatch.setattr(SimRecords, "forget_unknown", lambda self, *args: None)
    assert caught(["loss-kill-master"], range(12), known=(4, "loss-kill-master"))
    net = make_cluster(seed=21, backup_count=1, async_backup_count=2, nodes=5,
                       backup_sync_interval=0.5)
    answer, held = resend_to_an_async_backup_a_replica_sync_repaired(net)
    assert answer["ok"] and held is None, "acknowledged, and lost"
    assert any("keeps the record of w7" in v for v in net.violations), "sim.check_records"


def test_a_sync_that_brings_writes_without_their_records_is_caught(monkeypatch, make_cluster):
    """The backup takes none of the owner's records (the rule before this test): the
    simulation's record check catches it (a copy holding a write its client may still
    resend, without its record), and in the scenario the new owner applies the resend again
    and answers it with the write's own value as the previous one."""
    monkeypatch.setattr(SimRecords, "adopt", lambda self, *args: None)
    assert caught(["loss"], range(3))
    net = make_cluster(seed=21, backup_count=1, async_backup_count=1, nodes=5,
                       backup_sync_interval=0.5)
    frames, recorded = resend_to_a_backup_a_replica_sync_brought_the_write_to(net)
    assert frames == [serialize_value(7)], "the resend answered with its own value"
    assert any("holds the write of w7" in v for v in net.violations), "sim.check_records"


def test_a_sync_whose_records_leave_out_the_writes_under_way_is_caught(monkeypatch):
    """The owner hands on only the records of writes it has answered: a write it applied
    and still waits on its backups for is in the snapshot without its record."""
    monkeypatch.setattr(SimMapService, "records_of",
                        lambda self, pid: self.records.of_partition(pid))
    assert caught(["loss"], range(3))


def test_a_backup_that_takes_a_batch_with_a_gap_for_one_in_sequence_is_caught(monkeypatch):
    """The backups' fast path (``ReplicaVersions.apply_in_sequence``) taking every batch
    whole, whatever versions it carries: an asynchronous backup that lost an operation
    neither sees its gap nor asks for a sync, and keeps lacking the write."""

    def whatever_the_versions(self, namespace, pids, replica_indexes, versions):
        for i, (pid, index) in enumerate(zip(pids, replica_indexes, strict=True)):
            self._install(self._entry(pid, namespace), tuple(versions[6 * i:6 * i + 6]), index)
        return True

    monkeypatch.setattr(ReplicaVersions, "apply_in_sequence", whatever_the_versions)
    assert caught(["loss"], range(3))
