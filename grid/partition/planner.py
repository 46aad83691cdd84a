"""The migration planner of seed 002 section 3.2, as the reference implementation runs it.

Given the current replicas of one partition and the target replicas from repartitioning, the
planner decides the *types and order* of migrations (MOVE, COPY, SHIFT UP, SHIFT DOWN) that take
the partition from one to the other without lowering the number of live replicas, hotter
indices first. Cyclic targets are first cancelled (section 3.2.1), and COPY / SHIFT UP steps are
then moved ahead of non-conflicting MOVEs and SHIFT DOWNs (section 3.2.3).

Where the seed's pseudo-code is open, this follows ``shared/reference/planner.md`` rule by rule
(rule numbers in comments refer to its section 2 table). Members are any hashable values compared
with ``==``; None is an empty slot and never matches anything.

``plan_migrations`` returns every step, removals included: a removal is
``Migration(source, i, -1, None, -1, -1)`` (kind ``REMOVE``), which the reference's master
applies to the table at once instead of queueing it. A COPY to index 0 with no source is the
reference's "lost partition" case: the master assigns that owner directly.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from grid.partition.table import MAX_REPLICA_COUNT

__all__ = [
    "MAX_REPLICA_COUNT",
    "Migration",
    "PlanningError",
    "apply_migration",
    "fix_cycle",
    "is_cyclic",
    "plan_migrations",
    "prioritize_copies_and_shift_ups",
]

Member = Hashable
Replicas = list  # a working array of MAX_REPLICA_COUNT members or None

MOVE = "MOVE"
COPY = "COPY"
SHIFT_UP = "SHIFT_UP"
SHIFT_DOWN = "SHIFT_DOWN"
REMOVE = "REMOVE"

# Each main-loop pass either advances the index or fills / fixes one more slot, and a chain
# walk visits each index at most once; these bounds are far above what valid input can reach.
_MAIN_LOOP_STEPS_MAX = 8 * MAX_REPLICA_COUNT * MAX_REPLICA_COUNT
_CHAIN_STEPS_MAX = MAX_REPLICA_COUNT + 1


class PlanningError(RuntimeError):
    """The planner broke one of its own invariants (a bug, not bad luck)."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One planned step, with the reference's six fields; -1 means "none".

    ``source`` leaves ``source_current_replica_index`` and ends at ``source_new_replica_index``
    (-1: it is no longer a replica). ``destination`` ends at ``destination_new_replica_index``
    and came from ``destination_current_replica_index`` (-1: it held no replica).
    """

    source: Member | None
    source_current_replica_index: int
    source_new_replica_index: int
    destination: Member | None
    destination_current_replica_index: int
    destination_new_replica_index: int
    partition_id: int = 0

    @property
    def kind(self) -> str:
        """MOVE, COPY, SHIFT_UP, SHIFT_DOWN or REMOVE, derived from the fields (seed 002 3.1).

        A step that shifts the destination up is SHIFT_UP even when it also shifts the
        source down or drops it; SHIFT_DOWN is the source going colder while a new member
        is copied into its slot.
        """
        if self.destination is None:
            return REMOVE
        if self.destination_current_replica_index != -1:
            return SHIFT_UP
        if self.source is None:
            return COPY
        if self.source_new_replica_index != -1:
            return SHIFT_DOWN
        return MOVE

    @property
    def partition_version_increment(self) -> int:
        """Replica slots this step changes: the reference's partitionVersionIncrement."""
        if self.destination is None:
            return 1
        return (
            1 + (self.source_new_replica_index > -1) + (self.destination_current_replica_index > -1)
        )


def _index_of(replicas: Sequence[Member | None], member: Member | None) -> int:
    """First index holding ``member``; -1 for None or absent (the reference's getReplicaIndex)."""
    if member is None:
        return -1
    for index, candidate in enumerate(replicas):
        if candidate is not None and candidate == member:
            return index
    return -1


def _as_replicas(replicas: Sequence[Member | None], what: str) -> Replicas:
    """Copy into a 7-slot list, checking the shape and that no member appears twice."""
    if isinstance(replicas, (str, bytes)):
        raise ValueError(f"{what} must be a sequence of members, not a string")
    working = list(replicas)
    if len(working) > MAX_REPLICA_COUNT:
        raise ValueError(f"{what} has {len(working)} slots; at most {MAX_REPLICA_COUNT}")
    working.extend([None] * (MAX_REPLICA_COUNT - len(working)))
    present = [member for member in working if member is not None]
    if len(present) != len(set(present)):
        raise ValueError(f"{what} holds a member twice: {working!r}")
    return working


def apply_migration(
    replicas: Sequence[Member | None], migration: Migration
) -> tuple[Member | None, ...]:
    """The replicas after committing ``migration`` (the reference's applyMigration).

    Checks that the step fits: its source and destination sit where it says they do.
    """
    state = list(replicas) + [None] * (MAX_REPLICA_COUNT - len(replicas))
    m = migration
    indexes = (
        m.source_current_replica_index,
        m.source_new_replica_index,
        m.destination_current_replica_index,
        m.destination_new_replica_index,
    )
    if len(state) != MAX_REPLICA_COUNT or not all(-1 <= i < MAX_REPLICA_COUNT for i in indexes):
        raise PlanningError(f"{m} or {state} is out of range")
    if m.destination is not None and m.destination_new_replica_index == -1:
        raise PlanningError(f"{m} has a destination but no new index for it")
    if m.source_current_replica_index > -1 and state[m.source_current_replica_index] != m.source:
        raise PlanningError(f"{m} does not fit {state}: source is not at its current index")
    if m.destination_current_replica_index > -1 and (
        state[m.destination_current_replica_index] != m.destination
    ):
        raise PlanningError(f"{m} does not fit {state}: destination is not at its current index")
    if m.source_current_replica_index > -1:
        state[m.source_current_replica_index] = None
    if m.destination_current_replica_index > -1:
        state[m.destination_current_replica_index] = None
    if m.destination is not None:
        state[m.destination_new_replica_index] = m.destination
    if m.source_new_replica_index > -1:
        state[m.source_new_replica_index] = m.source
    return tuple(state)


# -- cycles (seed 002 section 3.2.1; reference section 4) ----------------------------------


def _is_cyclic_at(old: Replicas, new: Replicas, index: int) -> bool:
    owner = new[index]
    at = index
    for _ in range(_CHAIN_STEPS_MAX):
        nxt = _index_of(new, old[at])
        if nxt == -1 or nxt == at:
            return False
        if old[nxt] is not None and old[nxt] == owner:
            return True
        at = nxt
    raise PlanningError(f"cycle walk did not end: old={old} new={new}")


def _cyclic_indexes(old: Replicas, new: Replicas) -> list[int]:
    return [
        i
        for i in range(MAX_REPLICA_COUNT)
        if old[i] is not None and new[i] is not None and old[i] != new[i]
    ]


def is_cyclic(current: Sequence[Member | None], target: Sequence[Member | None]) -> bool:
    """True if reaching ``target`` needs members to swap places in a ring."""
    old = _as_replicas(current, "current")
    new = _as_replicas(target, "target")
    return any(_is_cyclic_at(old, new, i) for i in _cyclic_indexes(old, new))


def _fix_cycle_in_place(old: Replicas, new: Replicas) -> bool:
    fixed = False
    for i in range(MAX_REPLICA_COUNT):  # the condition is re-read after every fix, as upstream
        if old[i] is None or new[i] is None or old[i] == new[i]:
            continue
        if not _is_cyclic_at(old, new, i):
            continue
        at = i
        for _ in range(_CHAIN_STEPS_MAX):
            nxt = _index_of(new, old[at])  # looked up before the write, as the reference does
            new[at] = old[at]
            if nxt == -1:
                break
            at = nxt
        else:
            raise PlanningError(f"cycle fix did not end: old={old} new={new}")
        fixed = True
    return fixed


def fix_cycle(
    current: Sequence[Member | None], target: Sequence[Member | None]
) -> tuple[bool, list[Member | None]]:
    """Cancel cyclic moves: members in a ring keep their current slots.

    Returns (whether a cycle was fixed, the fixed target); the inputs are not changed.
    """
    old = _as_replicas(current, "current")
    new = _as_replicas(target, "target")
    fixed = _fix_cycle_in_place(old, new)
    return fixed, new


# -- planning (seed 002 section 3.2.2; reference section 2) -----------------------------------


class _Plan:
    """The working state of one planning run: the replica array and the steps so far."""

    __slots__ = ("state", "new", "steps", "partition_id")

    def __init__(self, state: Replicas, new: Replicas, partition_id: int) -> None:
        self.state = state
        self.new = new
        self.steps: list[Migration] = []
        self.partition_id = partition_id

    def migrate(
        self,
        source: Member | None,
        source_current: int,
        source_new: int,
        destination: Member | None,
        destination_current: int,
        destination_new: int,
    ) -> None:
        self.steps.append(
            Migration(
                source,
                source_current,
                source_new,
                destination,
                destination_current,
                destination_new,
                self.partition_id,
            )
        )

    def step(self, i: int) -> bool:
        """Apply the first matching rule at index ``i``; True if ``i`` is done."""
        state, new = self.state, self.new
        if new[i] is None:  # rule 1: the slot empties
            if state[i] is not None:
                self.migrate(state[i], i, -1, None, -1, -1)
                state[i] = None
            return True
        if state[i] is None:
            j = _index_of(state, new[i])
            if j == -1:  # rule 2a: COPY
                self.migrate(None, -1, -1, new[i], -1, i)
                state[i] = new[i]
                return True
            if j < i:  # rule 2c: hotter indexes already equal the target, so new repeats a member
                raise PlanningError(f"target holds {new[i]!r} twice: {new}")
            self.migrate(None, -1, -1, state[j], j, i)  # rule 2b: SHIFT UP into the empty slot
            state[i] = state[j]
            state[j] = None
            return False
        if new[i] == state[i]:  # rule 3
            return True
        if _index_of(new, state[i]) == -1 and _index_of(state, new[i]) == -1:  # rule 4: MOVE
            self.migrate(state[i], i, -1, new[i], -1, i)
            state[i] = new[i]
            return True
        if _index_of(state, new[i]) == -1:  # rule 5: SHIFT DOWN (+ COPY) or MOVE-3
            k = _index_of(new, state[i])
            if k <= i:
                raise PlanningError(f"{state[i]!r} must go hotter, to {k}: {state} -> {new}")
            if state[k] is None:
                self.migrate(state[i], i, k, new[i], -1, i)
                state[k] = state[i]
            else:
                self.migrate(state[i], i, -1, new[i], -1, i)
            state[i] = new[i]
            return True
        self.chain(i)  # rule 6
        return False

    def chain(self, start: int) -> None:
        """Follow "who must go where" from ``start`` to a step that unblocks it."""
        state, new = self.state, self.new
        c = start
        for _ in range(_CHAIN_STEPS_MAX):
            t = _index_of(state, new[c])
            if t == -1:
                raise PlanningError(f"chain walk lost {new[c]!r}: {state} -> {new}")
            if new[t] is None:  # SHIFT UP of state[t] from t to c
                if state[c] is None:
                    raise PlanningError(f"chain walk reached an empty slot {c}: {state}")
                k = _index_of(new, state[c])
                if k != -1 and state[k] is None:  # with a SHIFT DOWN of state[c] to k
                    self.migrate(state[c], c, k, state[t], t, c)
                    state[k] = state[c]
                else:  # state[c] leaves, or comes back later through a MOVE
                    self.migrate(state[c], c, -1, state[t], t, c)
                state[c] = state[t]
                state[t] = None
                return
            if _index_of(state, new[t]) == -1:  # MOVE-2 at index t
                self.migrate(state[t], t, -1, new[t], -1, t)
                state[t] = new[t]
                return
            c = t
        raise PlanningError(f"chain walk did not end: {state} -> {new}")


def _check_unique(state: Replicas, plan: _Plan) -> None:
    present = [member for member in state if member is not None]
    if len(present) != len(set(present)):
        raise PlanningError(f"a planned step put a member twice: {state} after {plan.steps}")


def plan_migrations(
    current: Sequence[Member | None],
    target: Sequence[Member | None],
    partition_id: int = 0,
) -> list[Migration]:
    """Every step from ``current`` to the cycle-fixed ``target``, in planned order.

    Removals are included (kind REMOVE). The result is not yet prioritised; pass it to
    ``prioritize_copies_and_shift_ups`` for the order the master queues.
    """
    state = _as_replicas(current, "current")
    new = _as_replicas(target, "target")
    _fix_cycle_in_place(list(state), new)
    plan = _Plan(state, new, partition_id)
    i = 0
    for _ in range(_MAIN_LOOP_STEPS_MAX):
        if i >= MAX_REPLICA_COUNT:
            break
        if plan.step(i):
            i += 1
        _check_unique(state, plan)
    else:
        raise PlanningError(f"planning did not end: {current} -> {target}")
    if state != new:
        raise PlanningError(f"plan ends at {state}, not at the target {new}")
    return plan.steps


# -- prioritisation (seed 002 section 3.2.3; reference section 5) ------------------------------


def _blocks_promotion(other: Migration, m: Migration) -> bool:
    """Whether ``m`` (a COPY or SHIFT UP without source) must stay behind ``other``."""
    if other.source_current_replica_index == -1:
        return True  # never jump ahead of another COPY or SHIFT UP
    if m.destination == other.source or m.destination == other.destination:
        return True  # a common participant: a conflict
    return -1 < other.source_new_replica_index < m.destination_new_replica_index


def prioritize_copies_and_shift_ups(migrations: Sequence[Migration]) -> list[Migration]:
    """Move COPY and SHIFT UP steps ahead of non-conflicting MOVEs and colder SHIFT DOWNs.

    Works on the steps of one partition; returns a new list holding the same objects.
    """
    ordered = list(migrations)
    for i in range(len(ordered)):
        m = ordered[i]
        if m.source_current_replica_index != -1:
            continue
        k = i - 1
        while k >= 0 and not _blocks_promotion(ordered[k], m):
            k -= 1
        if k + 1 != i:
            del ordered[i]
            ordered.insert(k + 1, m)
    return ordered
