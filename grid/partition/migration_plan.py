"""From a target table to a running set of migrations (seed 001 section 2.2).

Two pure parts, used by the master:

- ``plan_repartition(current, target)`` plans every partition (seed 002's planner, then its
  prioritisation) the way the reference's repartitioning task collects the steps: removals are
  not queued but applied to the table at once, a COPY to index 0 with no source ("lost
  partition") is assigned directly as the owner, and every other step joins its partition's
  queue. Queues come in partition id order.
- ``MigrationPlan`` hands out the next runnable migrations: one at a time per partition, in
  queue order, and at most ``max_parallel_migrations`` running per member, a member counting
  when it is the destination or the *source side* (the migration source if it leaves index 0,
  otherwise the partition owner, who sends the data, as in the reference). The caller reports
  started, completed and failed migrations; a failure cancels everything not yet started, so
  that the master can plan again from the table as it then is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from grid.partition.planner import Migration, plan_migrations, prioritize_copies_and_shift_ups
from grid.partition.table import MAX_REPLICA_COUNT, PartitionTable, PartitionTableError

__all__ = [
    "DEFAULT_MAX_PARALLEL_MIGRATIONS",
    "MigrationPlan",
    "MigrationPlanError",
    "RepartitionPlan",
    "demote_in_place",
    "demote_table",
    "plan_repartition",
    "source_side",
]

DEFAULT_MAX_PARALLEL_MIGRATIONS = 10


class MigrationPlanError(ValueError):
    """The caller reported something the plan does not allow (a bug in the caller)."""


@dataclass(frozen=True, slots=True)
class RepartitionPlan:
    """What the master does to move from the current table to the target."""

    removals: tuple[Migration, ...]
    """Replica slots to clear at once (kind REMOVE); no data moves."""
    lost_owners: tuple[Migration, ...]
    """COPY to index 0 with no source: partitions with no live replica get an owner directly."""
    queues: tuple[tuple[Migration, ...], ...]
    """Per partition (non-empty only, partition id order), the prioritised migrations."""

    @property
    def migration_count(self) -> int:
        """Queued migrations, over all partitions."""
        return sum(len(queue) for queue in self.queues)


def _is_lost_owner(m: Migration) -> bool:
    return (
        m.source is None
        and m.destination_current_replica_index == -1
        and m.destination_new_replica_index == 0
    )


def plan_repartition(current: PartitionTable, target: PartitionTable) -> RepartitionPlan:
    """Plan every partition from ``current`` to ``target`` (cycles are cancelled first)."""
    if current.partition_count != target.partition_count:
        raise PartitionTableError(
            f"partition counts differ: {current.partition_count} and {target.partition_count}"
        )
    removals: list[Migration] = []
    lost_owners: list[Migration] = []
    queues: list[tuple[Migration, ...]] = []
    for pid in range(current.partition_count):
        before = current.replicas(pid)
        after = target.replicas(pid)
        if before == after:
            continue
        queued: list[Migration] = []
        for m in plan_migrations(before, after, pid):
            if m.destination is None:
                removals.append(m)
            elif _is_lost_owner(m):
                lost_owners.append(m)
            else:
                queued.append(m)
        if queued:
            queues.append(tuple(prioritize_copies_and_shift_ups(queued)))
    return RepartitionPlan(tuple(removals), tuple(lost_owners), tuple(queues))


def demote_in_place(
    current: Sequence[Hashable | None], target: Sequence[Hashable | None]
) -> list[Hashable | None]:
    """``current`` (a copy, 7 slots, None empty) with every backup that the target puts at a
    colder replica index, into a slot empty here, moved there directly.

    Seed 003 ("Migration planning"): when a member rejoins in STABLE_CLUSTER and takes back
    its partitions, ``[A, B, None] -> [C, A, B]`` is planned as MOVE A 0->-1 / C -1->0 (A's
    good data deleted) then B 1->2 / A -1->1 (the same data copied back to A). Demoting B to
    index 2 first leaves ``[A, None, B] -> [C, A, B]``, which the planner does as one SHIFT
    DOWN {src=A, 0->1, dst=C, -1->0}: A keeps its data as a backup. A demotion in place moves
    no data (the member already holds the partition; a colder backup needs less), so the
    master applies it to the table at once, as it does removals.

    Only backups move (replica index >= 1; the owner at index 0 never does), only to a colder
    index, only into a slot empty in the row as it is then; colder slots go first and the
    row is walked again until nothing moves, so that a chain frees up.
    """
    if len(current) > MAX_REPLICA_COUNT or len(target) > MAX_REPLICA_COUNT:
        raise PartitionTableError(f"a partition has at most {MAX_REPLICA_COUNT} replicas")
    row = list(current) + [None] * (MAX_REPLICA_COUNT - len(current))
    wanted = {m: i for i, m in enumerate(target) if m is not None}
    moved = True
    while moved:
        moved = False
        for index in range(MAX_REPLICA_COUNT - 1, 0, -1):
            member = row[index]
            colder = wanted.get(member, -1) if member is not None else -1
            if colder > index and row[colder] is None:
                row[colder], row[index] = member, None
                moved = True
    return row


def demote_table(table: PartitionTable, target: PartitionTable) -> PartitionTable:
    """A copy of ``table`` with ``demote_in_place`` applied to every partition (each
    partition's version rises by the slots that changed, as ``set_replicas`` does)."""
    if table.partition_count != target.partition_count:
        raise PartitionTableError(
            f"partition counts differ: {table.partition_count} and {target.partition_count}"
        )
    demoted = table.copy()
    for pid in range(table.partition_count):
        demoted.set_replicas(pid, demote_in_place(table.replicas(pid), target.replicas(pid)))
    return demoted


def source_side(m: Migration, owner: Hashable | None) -> Hashable | None:
    """The member that sends the data: the source if it leaves index 0, else the owner."""
    if m.source_current_replica_index == 0:
        return m.source
    return owner


class MigrationPlan:
    """Schedules queued migrations: one per partition at a time, bounded per member.

    ``owner_of(partition_id)`` gives the partition's owner now (for the source side of
    migrations that do not leave index 0); pass ``table.owner``.
    """

    def __init__(
        self,
        queues: Iterable[Sequence[Migration]],
        owner_of: Callable[[int], Hashable | None],
        max_parallel_migrations: int = DEFAULT_MAX_PARALLEL_MIGRATIONS,
    ) -> None:
        if (
            not isinstance(max_parallel_migrations, int)
            or isinstance(max_parallel_migrations, bool)
            or max_parallel_migrations < 1
        ):
            raise MigrationPlanError(
                f"max_parallel_migrations must be an int >= 1, got {max_parallel_migrations!r}"
            )
        self.max_parallel_migrations = max_parallel_migrations
        self._owner_of = owner_of
        self._queues: dict[int, deque[Migration]] = {}
        for queue in queues:
            steps = deque(queue)
            if not steps:
                continue
            pid = steps[0].partition_id
            if any(m.partition_id != pid for m in steps):
                raise MigrationPlanError(f"a queue mixes partitions: {list(steps)}")
            if pid in self._queues:
                raise MigrationPlanError(f"two queues for partition {pid}")
            if any(m.destination is None for m in steps):
                raise MigrationPlanError("removals are applied at once, not queued")
            self._queues[pid] = steps
        self._running: dict[int, tuple[Migration, tuple[Hashable, ...]]] = {}
        self._load: dict[Hashable, int] = {}
        self._aborted = False

    # -- queries ------------------------------------------------------------------------------

    @property
    def is_aborted(self) -> bool:
        """A migration failed: nothing more will start; the master should plan again."""
        return self._aborted

    @property
    def is_done(self) -> bool:
        """Nothing queued and nothing running."""
        return not self._queues and not self._running

    @property
    def pending_count(self) -> int:
        """Migrations queued and not started."""
        return sum(len(queue) for queue in self._queues.values())

    def running(self) -> list[Migration]:
        """Migrations started and not yet reported completed or failed."""
        return [m for m, _ in self._running.values()]

    def load(self, member: Hashable) -> int:
        """How many running migrations ``member`` takes part in."""
        return self._load.get(member, 0)

    def _participants(self, m: Migration) -> tuple[Hashable, ...]:
        sender = source_side(m, self._owner_of(m.partition_id))
        members = [x for x in (m.destination, sender) if x is not None]
        return tuple(dict.fromkeys(members))  # a member counts once per migration

    def _fits(self, participants: tuple[Hashable, ...], load: dict[Hashable, int]) -> bool:
        return all(load.get(x, 0) < self.max_parallel_migrations for x in participants)

    def runnable(self) -> list[Migration]:
        """The migrations that could start now, together, in queue order (nothing changes)."""
        load = dict(self._load)
        found: list[Migration] = []
        for pid, queue in self._queues.items():
            if pid in self._running:
                continue
            head = queue[0]
            participants = self._participants(head)
            if not self._fits(participants, load):
                continue
            for x in participants:
                load[x] = load.get(x, 0) + 1
            found.append(head)
        return found

    # -- reports ------------------------------------------------------------------------------

    def report_started(self, m: Migration) -> None:
        """``m`` was sent off; it must be runnable now."""
        queue = self._queues.get(m.partition_id)
        if self._aborted:
            raise MigrationPlanError("the plan was aborted by a failed migration")
        if queue is None or queue[0] != m:
            raise MigrationPlanError(f"{m} is not the next migration of its partition")
        if m.partition_id in self._running:
            raise MigrationPlanError(f"partition {m.partition_id} already has a migration running")
        participants = self._participants(m)
        if not self._fits(participants, self._load):
            raise MigrationPlanError(f"{m} would pass max_parallel_migrations for a member")
        queue.popleft()
        if not queue:
            del self._queues[m.partition_id]
        self._running[m.partition_id] = (m, participants)
        for x in participants:
            self._load[x] = self._load.get(x, 0) + 1

    def start_runnable(self) -> list[Migration]:
        """Report every runnable migration started, and return them for sending."""
        started = self.runnable()
        for m in started:
            self.report_started(m)
        return started

    def _finish(self, m: Migration) -> None:
        entry = self._running.get(m.partition_id)
        if entry is None or entry[0] != m:
            raise MigrationPlanError(f"{m} is not running")
        del self._running[m.partition_id]
        for x in entry[1]:
            self._load[x] -= 1
            if not self._load[x]:
                del self._load[x]

    def report_completed(self, m: Migration) -> None:
        """``m`` was committed; its partition's next migration may start."""
        self._finish(m)

    def report_failed(self, m: Migration) -> list[Migration]:
        """``m`` failed: cancel every migration not started and return them, in queue order.

        Migrations already running stay tracked until reported; nothing new starts.
        """
        self._finish(m)
        return self.abort()

    def abort(self) -> list[Migration]:
        """Start nothing more (the membership changed, say): cancel every migration not
        started and return them, in queue order. Running ones stay tracked until reported."""
        cancelled = [step for queue in self._queues.values() for step in queue]
        self._queues.clear()
        self._aborted = True
        return cancelled
