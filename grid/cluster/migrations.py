"""The master's migration driver (seed 002 sections 2 and 3, seed 001 section 2.2).

From a table that is not what the data members should hold (a backup lost with a member, a new
member holding nothing) to the balanced target of ``assign``: removals and lost owners are
applied at once, every other step is a migration, at most ``max_parallel_migrations`` running
per member, one at a time per partition. Each migration runs in two phases:

1. **Transfer.** The data sender (the owner, or the source if it leaves index 0) sets the
   partition's migration flag (writes wait) and sends the partition to the destination.
2. **Commit.** The master commits to the destination first and waits for it; only then does
   it apply the step to its table (the version rises by the step's increment) and publish.
   The source finalises (drops its data after a MOVE) only on the published table.

A failure in either phase leaves the replicas as they were and raises the partition version
by increment + 1, so that a destination that may have committed takes the master's table again
(and drops what it received); then nothing more of the plan starts, and the master plans again.

Sans-IO: every method takes the master's current table and returns commands for the shell:
``Transfer`` and ``Commit`` (send to a member), ``NewTable`` (adopt and publish).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grid.cluster.state import ClusterState
from grid.partition.assignment import SPREAD, assign
from grid.partition.migration_plan import (
    MigrationPlan,
    RepartitionPlan,
    demote_table,
    plan_repartition,
    source_side,
)
from grid.partition.planner import Migration, apply_migration
from grid.partition.table import PartitionTable

TRANSFER, COMMIT = "transfer", "commit"


@dataclass(frozen=True)
class Transfer:
    """Ask ``sender`` to send partition ``migration.partition_id`` to its destination."""

    mid: int
    migration: Migration
    sender: str
    initial_version: int


@dataclass(frozen=True)
class Commit:
    """Ask the destination to take the step into its table (it must hold ``initial_version``)."""

    mid: int
    migration: Migration
    initial_version: int


@dataclass(frozen=True)
class NewTable:
    """The master's table after a change: adopt it and publish it."""

    table: PartitionTable


Command = Transfer | Commit | NewTable


@dataclass
class Running:
    migration: Migration
    initial_version: int
    sender: str
    phase: str
    deadline: float
    committed_row: tuple[str | None, ...]  # the partition's row once the step is taken

    def state(self, table: PartitionTable) -> str:
        """Where ``table`` stands for this migration: "before" it, "after" it (a master
        that was the destination took the step itself), or "moved" (anything else)."""
        m = self.migration
        version = table.version(m.partition_id)
        if version == self.initial_version:
            return "before"
        if version == self.initial_version + m.partition_version_increment and \
                table.replicas(m.partition_id) == self.committed_row:
            return "after"
        return "moved"


@dataclass
class MigrationStats:
    """What ``status`` shows: the plan in progress and what happened since the last change."""

    planned: int = 0
    completed: int = 0
    failed: int = 0


def _replica_event(m: Migration, ok: bool) -> dict[str, Any]:
    return {"type": "replica_migration", "partition_id": m.partition_id, "kind": m.kind,
            "source": m.source, "destination": m.destination,
            "source_replica_index": m.source_current_replica_index,
            "destination_replica_index": m.destination_new_replica_index, "success": ok}


def migration_to_wire(m: Migration) -> list:
    return [m.source, m.source_current_replica_index, m.source_new_replica_index,
            m.destination, m.destination_current_replica_index,
            m.destination_new_replica_index, m.partition_id]


def migration_from_wire(obj: object) -> Migration:
    if not isinstance(obj, list | tuple) or len(obj) != 7:
        raise ValueError("a migration is [source, sci, sni, destination, dci, dni, pid]")
    source, sci, sni, destination, dci, dni, pid = obj
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (sci, sni, dci, dni, pid)):
        raise ValueError("a migration's indexes and partition id are ints")
    if not all(x is None or isinstance(x, str) for x in (source, destination)):
        raise ValueError("a migration's members are uuids or None")
    return Migration(source, sci, sni, destination, dci, dni, pid)


def _apply_at_once(new: PartitionTable, repartition: RepartitionPlan) -> PartitionTable:
    """Apply the plan's removals and lost owners to ``new`` (the master does them at once)."""
    for step in (*repartition.removals, *repartition.lost_owners):
        pid = step.partition_id
        new.set_replicas(pid, apply_migration(new.replicas(pid), step))
    return new


class MigrationDriver:
    def __init__(self, backup_count: int, max_parallel_migrations: int,
                 migration_timeout: float, backup_placement: str = SPREAD) -> None:
        self.backup_count = backup_count
        self.backup_placement = backup_placement
        self.max_parallel = max_parallel_migrations
        self.timeout = migration_timeout
        self.plan: MigrationPlan | None = None
        self.running: dict[int, Running] = {}
        self.stats = MigrationStats()
        self._table: PartitionTable | None = None
        self._ids = itertools.count(1)
        self._ended = False
        # What a migration listener hears, as Hazelcast's MigrationListener does: a plan
        # started (with its size), each migration completed or failed, the plan finished.
        self.events: list[dict[str, Any]] = []

    @property
    def active(self) -> bool:
        """A plan is in progress (it may still be launching, or waiting for running ones)."""
        return self.plan is not None

    def target(self, table: PartitionTable, data_members: Sequence[str]) -> PartitionTable:
        return assign(table, list(data_members), self.backup_count, self.backup_placement)

    def start(self, table: PartitionTable, data_members: Sequence[str], now: float,
              state: ClusterState, target: PartitionTable | None = None) -> list[Command]:
        """Plan from ``table`` towards the balanced target, if they differ, no plan runs and
        the cluster ``state`` allows migrations (seed 000: never by the state's name); or
        towards ``target`` (STABLE_CLUSTER's reclaim: members that came back take back
        their partitions), which no state forbids.

        For a reclaim only, backups that the target puts at a colder index, into a slot empty
        now, are first demoted in place (``demote_table``, seed 003), before the removals
        and lost owners are applied: the first ``NewTable`` carries them, before any
        ``Transfer``, and the plan starts from the demoted table; when nothing is left to
        migrate, that table is published and no plan starts."""
        if self.plan is not None or not data_members or \
                (target is None and not state.migration_allowed):
            return []
        reclaim = target is not None
        if target is None:
            target = self.target(table, data_members)
        if all(target.replicas(pid) == table.replicas(pid)
               for pid in range(table.partition_count)):
            return []
        start, demoted = table, False
        if reclaim:
            # Seed 003: backups that only go colder take their slot at once (no data moves),
            # so that the planner shifts owners down instead of dropping and copying back.
            # Before the removals: the planner may REMOVE a backup only to COPY it back colder.
            lowered = demote_table(table, target)
            demoted = lowered != table
            if demoted:
                start = lowered
        repartition = plan_repartition(start, target)
        if not demoted and not (repartition.queues or repartition.removals or
                                repartition.lost_owners):
            return []  # what differs are cycles the planner cancels: nothing to do
        new = _apply_at_once(start.copy(), repartition)
        commands: list[Command] = [NewTable(new)] if new != table else []
        self._table = new
        if demoted and not repartition.queues:
            return commands  # only demotions (and removals): publish, no empty plan
        self.plan = MigrationPlan(repartition.queues, lambda pid: self._table.owner(pid),
                                  self.max_parallel)
        self.stats = MigrationStats(planned=repartition.migration_count)
        self.events.append({"type": "migration_started", "planned": self.stats.planned})
        return commands + self._launch(now)

    def _launch(self, now: float) -> list[Command]:
        commands: list[Command] = []
        if self.plan is None:
            return commands
        table = self._table
        for m in self.plan.start_runnable():
            sender = source_side(m, table.owner(m.partition_id))
            mid = next(self._ids)
            self.running[mid] = Running(
                m, table.version(m.partition_id), sender, TRANSFER, now + self.timeout,
                apply_migration(table.replicas(m.partition_id), m))
            commands.append(Transfer(mid, m, sender, table.version(m.partition_id)))
        self._maybe_done()
        return commands

    def _maybe_done(self) -> None:
        if self.plan is not None and not self.running and \
                (self.plan.is_done or self.plan.is_aborted):
            self.plan = None
            self._ended = True
            self.events.append({"type": "migration_finished", "planned": self.stats.planned,
                                "completed": self.stats.completed,
                                "failed": self.stats.failed})

    @property
    def ended(self) -> bool:
        """A plan ended (done, failed or aborted) and the master has not looked again yet
        (``take_ended``): until it does, it may have more to plan."""
        return self._ended

    def take_ended(self) -> bool:
        """Whether a plan ended (done, failed or aborted) since the last call: the master
        then looks again, for what the plan did not do."""
        ended, self._ended = self._ended, False
        return ended

    def transferred(self, mid: int, ok: bool, table: PartitionTable,
                    now: float) -> list[Command]:
        """The data sender answered the transfer: commit on the destination, or fail."""
        run = self.running.get(mid)
        if run is None or run.phase != TRANSFER:
            return []
        if not ok or run.state(table) != "before":
            return self._fail(mid, table, now)
        run.phase, run.deadline = COMMIT, now + self.timeout
        return [Commit(mid, run.migration, run.initial_version)]

    def committed(self, mid: int, ok: bool, table: PartitionTable,
                  now: float) -> list[Command]:
        """The destination answered the commit: apply the step and publish, or fail."""
        run = self.running.get(mid)
        if run is None or run.phase != COMMIT:
            return []
        m = run.migration
        state = run.state(table)  # "after": the master was the destination and took it
        if not ok or state == "moved":
            return self._fail(mid, table, now)
        del self.running[mid]
        new = table.copy()
        if state == "before":
            new.set_replicas(m.partition_id, run.committed_row)
        self._table = new
        self.plan.report_completed(m)
        self.stats.completed += 1
        self.events.append(_replica_event(m, True))
        return [NewTable(new), *self._launch(now)]

    def _fail(self, mid: int, table: PartitionTable, now: float) -> list[Command]:
        run = self.running.pop(mid)
        m = run.migration
        new = table.copy()
        new.raise_version(m.partition_id, m.partition_version_increment + 1)
        self._table = new
        self.plan.report_failed(m)
        self.stats.failed += 1
        self.events.append(_replica_event(m, False))
        self._maybe_done()
        return [NewTable(new)]

    def members_changed(self, table: PartitionTable, gone: set[str],
                        now: float) -> list[Command]:
        """Members left (or joined): start nothing more of this plan; fail the running
        migrations a gone member takes part in. The master plans again once it is done."""
        self._table = table
        if self.plan is not None:
            self.plan.abort()
        commands: list[Command] = []
        for mid, run in list(self.running.items()):
            m = run.migration
            if run.state(self._table) == "moved" or gone & {m.source, m.destination, run.sender}:
                commands += self._fail(mid, self._table, now)  # it moves self._table on
        self._maybe_done()
        return commands

    def tick(self, table: PartitionTable, now: float) -> list[Command]:
        """Fail what ran out of time."""
        self._table = table
        commands: list[Command] = []
        for mid, run in list(self.running.items()):
            if now >= run.deadline:
                commands += self._fail(mid, self._table, now)  # it moves self._table on
        return commands
