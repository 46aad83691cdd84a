"""Deterministic target assignment: which data member should hold each replica slot.

Seed 003 ("Deterministic partition assignment") asks for an assignment that every process
computes identically from the member list, so that no stable table has to be kept centrally.
``assign(table, data_members, backup_count)`` is a pure function of its inputs: it uses the
order of ``data_members`` and MurmurHash3 of partition ids (never Python's salted ``hash`` or
an unseeded random source), and iterates only lists and insertion-ordered dicts.

What the target guarantees (``replica_count = min(len(data_members), backup_count + 1, 7)``):

- every index below ``replica_count`` is filled, every index at or above it is empty;
- only data members appear, and no member twice in a partition;
- at every index, member counts differ by at most one (one exception, below);
- replicas of data members stay where they are unless balance needs them elsewhere (or, with
  the "paired" placement, a backup is not on its owner's partner, step 5); within a
  partition a member normally only moves hotter, so the target rarely holds a cycle that the
  planner would cancel (seed 002 section 3.2.1). When every member holds every partition
  (``replica_count == len(data_members)``) any rebalancing *is* a cycle, and the planner keeps
  those partitions as they are, exactly as the reference does;
- owner safety: a partition whose owner is gone but which still has live replicas gets one of
  those replicas as its owner, never a member without its data (the planner would otherwise
  plan a COPY to index 0 with no source, the reference's "lost partition" case). When this
  conflicts with balance, owner safety wins and index 0 may be off by more than one: that
  needs a member to be the only live replica of more partitions than its share, i.e. several
  members lost at once. Once those promotions are done, assigning again balances the table.

How it works, per replica index from hot to cold (as the reference's arrange does):

1. Clean up: drop replicas of non-members and repeats, close the gaps by moving the surviving
   replicas up in order (the first backup becomes the owner, seed 002 section 1.1), and cut
   each partition to ``replica_count`` slots.
2. Quotas: ``partition_count // members`` each, plus one for ``partition_count % members``
   members, preferring those already holding more (so a balanced table stays as it is).
3. Members over quota give up slots (partitions visited in a per-index MurmurHash3 order);
   free slots go to members under quota: the slot's previous holder first, then a member new to
   the partition (at backup indexes the one that least often backs the same owner, so that a
   leaving member's partitions are taken over evenly; with the "paired" placement, where step
   5 does not apply, the member ``index`` places after the owner in the ring, the members
   sorted, where it is under quota), then one from a colder slot of the same partition (a
   shift up), then a member the partition held before.
4. A free slot no member under quota can take is filled along an augmenting path: a member that
   can take it hands one of its own slots to another member, and so on, until a member under
   quota is reached (a breadth-first search over members). Owner counts still two apart
   (quotas that guessed wrong around promoted owners) are evened out the same way.
5. Should a backup index still be unbalanced (seen only with fewer partitions than a few times
   the members), backups fall back to a rotation of the member list after each owner. With the
   "paired" placement a rotation of the members sorted (the ring) is the target of every
   backup index once the owners are balanced (steps 2-4 at index 0): whoever held a backup
   before, each owner's backups are the members after it in the ring (its partners), so that
   the pairs a batch write needs survive membership changes (which fill free slots with
   whoever has room), and members restarted from their files, whatever the order they join
   in, find them where they were. It costs a backup copy per partition whose backup is not
   its owner's partner (a join of a 4th member to 3 moves 1.34x the entries that the spread
   placement moves: tools/bench_migration.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from functools import lru_cache

import mmh3

from grid.partition.table import MAX_REPLICA_COUNT, PartitionTable, PartitionTableError

__all__ = ["BACKUP_PLACEMENTS", "assign", "is_balanced", "replica_count_for"]

# Where backups go: "spread", a free backup slot to the member that least often backs the
# partition's owner (``_Assigner.choose``), so that when a member leaves, the backups that take
# over its partitions are evenly spread; "paired", every backup ``index`` of an owner on the
# member ``index`` places after it in the members sorted (a ring, step 5 above), so that every
# partition of an owner has the same backups and a batch write sends one backup operation to
# each (where every member holds every partition, the two are the same as far as messages
# go, and the spread one is kept).
SPREAD, PAIRED = "spread", "paired"
BACKUP_PLACEMENTS = (SPREAD, PAIRED)

ORDER_SEED = 0x5348_4D47  # "SHMG": seeds the per-index partition visiting order
RELIEVE_ATTEMPTS_MAX = 1024  # bounds the augmenting searches that even out owner counts

Row = list  # one partition's slots 0..replica_count-1, member id or None


def replica_count_for(member_count: int, backup_count: int) -> int:
    """How many replica indexes a target fills: min(members, backup_count + 1, 7)."""
    return min(member_count, backup_count + 1, MAX_REPLICA_COUNT)


@lru_cache(maxsize=64)
def _partition_order(partition_count: int, index: int) -> tuple[int, ...]:
    """A fixed pseudo-random visiting order of partitions for one replica index.

    It spreads which partitions a member gives up or takes, so that the members backing one
    owner's partitions are mixed (a member's departure then spreads its load evenly).
    """
    seed = (ORDER_SEED + index) & 0xFFFFFFFF
    keys = [mmh3.hash(p.to_bytes(4, "big"), seed, False) for p in range(partition_count)]
    return tuple(sorted(range(partition_count), key=keys.__getitem__))


def _check_inputs(
    table: PartitionTable, data_members: Sequence[str], backup_count: int
) -> list[str]:
    if not isinstance(table, PartitionTable):
        raise PartitionTableError(f"assign needs a PartitionTable, got {type(table).__name__}")
    if isinstance(data_members, (str, bytes)):
        raise PartitionTableError("data_members must be a sequence of member ids, not a string")
    members = list(data_members)
    for member in members:
        if not isinstance(member, str) or not member:
            raise PartitionTableError(f"a data member id must be a non-empty str: {member!r}")
    if len(set(members)) != len(members):
        raise PartitionTableError("data_members lists a member twice")
    if not isinstance(backup_count, int) or isinstance(backup_count, bool) or backup_count < 0:
        raise PartitionTableError(f"backup_count must be an int >= 0, got {backup_count!r}")
    return members


def assign(table: PartitionTable, data_members: Sequence[str], backup_count: int,
           placement: str = SPREAD) -> PartitionTable:
    """The target table for ``data_members`` (lite members are simply not passed), with
    free backup slots filled by ``placement`` (``BACKUP_PLACEMENTS``).

    Returns a copy of ``table`` whose replicas are the target; its versions rose by the slots
    that changed, as any change does. ``table`` itself is not modified.
    """
    members = _check_inputs(table, data_members, backup_count)
    if placement not in BACKUP_PLACEMENTS:
        raise PartitionTableError(f"placement is one of {BACKUP_PLACEMENTS}, not {placement!r}")
    replica_count = replica_count_for(len(members), backup_count)
    target = table.copy()
    if replica_count == 0:
        for pid in range(table.partition_count):
            target.set_replicas(pid, ())
        return target
    # Pairing saves messages only where a member does not hold every partition anyway; there
    # it would cost the owners' balance after a loss for nothing (evening it out again would
    # be a cycle, which the planner leaves as it is).
    paired = placement == PAIRED and replica_count < len(members)
    assigner = _Assigner(table, members, replica_count, paired)
    for index in range(replica_count):
        if index == 1 and paired and assigner.is_balanced(0):
            # Every owner's backups on the members after it, whatever held them before:
            # after a membership change, whoever had room took the free slots; this brings
            # each owner's backups back to one member (a backup copy per partition moved).
            # Balanced owners give balanced backups.
            assigner.rotate_backups()
            break
        assigner.balance_index(index)
        if index > 0 and assigner.is_balanced(0) and not assigner.is_balanced(index):
            assigner.rotate_backups()
            break
    for pid, row in enumerate(assigner.rows):
        _check_row(pid, row, assigner.rank)
        target.set_replicas(pid, row)
    return target


def _check_row(pid: int, row: list[str | None], rank: dict[str, int]) -> None:
    """The invariants every target row must meet; a failure is a bug in this module."""
    if any(member is None or member not in rank for member in row):
        raise AssertionError(f"assign left partition {pid} with a hole or a non-member: {row}")
    if len(set(row)) != len(row):
        raise AssertionError(f"assign put a member twice in partition {pid}: {row}")


def is_balanced(table: PartitionTable, data_members: Sequence[str], backup_count: int) -> bool:
    """Whether ``table`` already meets the balance ``assign`` aims for.

    At every index below the replica count, every partition is filled and member counts
    differ by at most one. The master can use it to decide whether to repartition again.
    """
    members = _check_inputs(table, data_members, backup_count)
    replica_count = replica_count_for(len(members), backup_count)
    for index in range(replica_count):
        counts = dict.fromkeys(members, 0)
        for pid in range(table.partition_count):
            member = table.replicas(pid)[index]
            if member not in counts:
                return False
            counts[member] += 1
        if max(counts.values()) - min(counts.values()) > 1:
            return False
    return True


class _Assigner:
    """Working state of one ``assign`` run: the target rows, built one index at a time."""

    def __init__(self, table: PartitionTable, members: list[str], replica_count: int,
                 paired: bool = False) -> None:
        self.members = members
        self.paired = paired
        self.rank = {member: k for k, member in enumerate(members)}
        # The order of the backup rotation: the paired placement's partners are the members
        # after an owner in it. Sorted, not the member list's order (which is the order of
        # joining): members that restart together from their files, in whatever order they
        # join, find their backups where they left them, and nothing moves.
        self.ring = sorted(members) if paired else members
        self.ring_rank = {member: k for k, member in enumerate(self.ring)}
        self.replica_count = replica_count
        self.partition_count = table.partition_count
        self.every_partition_full = replica_count == len(members)
        self.plus = dict.fromkeys(members, 0)  # indexes at which a member ended above base
        self.original: list[tuple[str | None, ...]] = []
        self.rows: list[Row] = []
        self.survivors: list[list[str]] = []  # live replicas, hottest first, before cutting
        self.survivor_only: list[bool] = []  # owner gone but live replicas remain
        for pid in range(table.partition_count):
            replicas = table.replicas(pid)
            self.original.append(replicas)
            survivors = [m for m in dict.fromkeys(replicas) if m is not None and m in self.rank]
            self.survivors.append(survivors)
            self.survivor_only.append(bool(survivors) and replicas[0] not in self.rank)
            row = survivors[:replica_count]
            row.extend([None] * (replica_count - len(row)))
            self.rows.append(row)
        # Partitions each member holds at the index being balanced; built on first need.
        self.held: dict[str, dict[int, None]] | None = None
        self.held_index = -1
        # pairs[owner][member]: partitions of ``owner`` with ``member`` at the index in work.
        self.pairs: dict[str, dict[str, int]] = {}

    # -- counting and quotas ----------------------------------------------------------------

    def counts(self, index: int) -> dict[str, int]:
        """How many partitions each member holds at ``index``."""
        counts = dict.fromkeys(self.members, 0)
        for row in self.rows:
            if row[index] is not None:
                counts[row[index]] += 1
        return counts

    def is_balanced(self, index: int) -> bool:
        """Whether member counts at ``index`` differ by at most one."""
        counts = self.counts(index).values()
        return max(counts) - min(counts) <= 1

    def quotas(self, index: int, counts: dict[str, int]) -> dict[str, int]:
        """Per-member quota at ``index``: who gets one of the extra partitions.

        First those that cannot give up enough (at index 0, the only live replica of more
        partitions than the base share), then those already above the base count, so that a
        balanced table stays as it is.
        """
        base, extra = divmod(self.partition_count, len(self.members))
        quota = dict.fromkeys(self.members, base)
        if not extra:
            return quota
        pinned = dict.fromkeys(self.members, 0)
        if index == 0:
            for pid, row in enumerate(self.rows):
                if self.survivor_only[pid] and len(self.survivors[pid]) == 1:
                    pinned[row[0]] += 1
        if self.every_partition_full:
            # Every member is in every partition, so its counts over all indexes sum to
            # partition_count: each member must get the extra one at exactly `extra` indexes.
            remaining = self.replica_count - index
            chosen = sorted(
                self.members,
                key=lambda x: (
                    self.plus[x] >= extra,  # had its share (only after an owner-safety exception)
                    extra - self.plus[x] < remaining,  # forced ones first
                    pinned[x] <= base,
                    counts[x] <= base,
                    -counts[x],
                    self.rank[x],
                ),
            )[:extra]
        else:
            chosen = sorted(
                self.members,
                key=lambda x: (
                    pinned[x] <= base,
                    counts[x] <= base,
                    self.plus[x],
                    -counts[x],
                    self.rank[x],
                ),
            )[:extra]
        assert len(chosen) == extra, (chosen, extra)
        for member in chosen:
            quota[member] += 1
        return quota

    # -- writing slots ----------------------------------------------------------------------

    def write(self, pid: int, index: int, member: str | None) -> None:
        """Set one slot at the index being balanced, keeping ``held`` current."""
        row = self.rows[pid]
        if self.held is not None and self.held_index == index:
            if row[index] is not None:
                del self.held[row[index]][pid]
            if member is not None:
                self.held[member][pid] = None
        row[index] = member

    def place(self, pid: int, index: int, member: str) -> None:
        """Put ``member`` at ``index``; if it sat colder in the partition, it shifts up."""
        row = self.rows[pid]
        if member in row:
            at = row.index(member)
            assert at > index, (pid, index, row, member)
            row[at] = None
        self.write(pid, index, member)

    def holdings(self, index: int) -> dict[str, dict[int, None]]:
        if self.held is None or self.held_index != index:
            self.held = {x: {} for x in self.members}
            self.held_index = index
            for pid, row in enumerate(self.rows):
                if row[index] is not None:
                    self.held[row[index]][pid] = None
        return self.held

    # -- one index ----------------------------------------------------------------------------

    def balance_index(self, index: int) -> None:
        """Make member counts at ``index`` meet their quotas, moving as little as possible."""
        rows = self.rows
        order = _partition_order(self.partition_count, index)
        counts = self.counts(index)
        quota = self.quotas(index, counts)
        shed_from = self.shed(index, order, counts, quota)
        deficit = {x: quota[x] - counts[x] for x in self.members}
        if index > 0:
            self.pairs = {x: dict.fromkeys(self.members, 0) for x in self.members}
            for row in rows:
                if row[index] is not None:
                    self.pairs[row[0]][row[index]] += 1
        stuck = []
        for pid in order:
            if rows[pid][index] is not None:
                continue
            member = self.choose(pid, index, deficit)
            if member is None:
                stuck.append(pid)
                continue
            self.place(pid, index, member)
            deficit[member] -= 1
            if index > 0:
                self.pairs[rows[pid][0]][member] += 1
        for pid in stuck:
            end = self.augment(pid, index, lambda x: deficit[x] > 0)
            if end is None:
                self.place_anyway(pid, index, shed_from.get(pid))
            else:
                deficit[end] -= 1
        if index == 0:
            self.relieve_owners(order)
        assert all(row[index] is not None for row in rows)
        for member, count in self.counts(index).items():
            self.plus[member] += count > self.partition_count // len(self.members)

    def shed(
        self, index: int, order: tuple[int, ...], counts: dict[str, int], quota: dict[str, int]
    ) -> dict[int, str]:
        """Free the slots over-quota members give up; returns {partition: member that left}.

        A member gives up first the partitions that a member under quota can take directly,
        then the others; a promoted owner's partition only if another live replica exists.
        """
        over = [x for x in self.members if counts[x] > quota[x]]
        if not over:
            return {}
        under = [x for x in self.members if counts[x] < quota[x]]
        takeable: dict[str, list[int]] = {x: [] for x in over}
        other: dict[str, list[int]] = {x: [] for x in over}
        promoted: dict[str, list[int]] = {x: [] for x in over}
        for pid in order:
            row = self.rows[pid]
            holder = row[index]
            if holder not in takeable:
                continue
            if index == 0 and self.survivor_only[pid]:
                if len(self.survivors[pid]) > 1:
                    promoted[holder].append(pid)
            elif any(x not in row for x in under):
                takeable[holder].append(pid)
            else:
                other[holder].append(pid)
        shed_from: dict[int, str] = {}
        for member in over:
            excess = counts[member] - quota[member]
            for pid in (takeable[member] + other[member] + promoted[member])[:excess]:
                self.write(pid, index, None)
                counts[member] -= 1
                shed_from[pid] = member
        return shed_from

    def eligible(self, pid: int, index: int) -> list[str]:
        """Members that may take slot ``index`` of ``pid`` (ignoring quotas)."""
        row = self.rows[pid]
        if index == 0 and self.survivor_only[pid]:
            return [m for m in self.survivors[pid] if m != row[0]]
        hot = row[: index + 1]
        return [x for x in self.members if x not in hot]

    def choose(self, pid: int, index: int, deficit: dict[str, int]) -> str | None:
        """The member under quota that should take a free slot, or None if none can.

        In order: the slot's previous holder; a member new to the partition (furthest below
        quota); a member from a colder slot (a shift up); a member the partition held before.
        """
        row = self.rows[pid]
        if index == 0 and self.survivor_only[pid]:
            live = [m for m in self.survivors[pid] if deficit[m] > 0]
            return live[0] if live else None
        hot = row[:index]
        candidates = [x for x in self.members if deficit[x] > 0 and x not in hot]
        if not candidates:
            return None
        before = self.original[pid]
        if before[index] in candidates and before[index] not in row:
            return before[index]
        fresh = [x for x in candidates if x not in row and x not in before]
        if fresh:
            if index == 0:
                return max(fresh, key=deficit.__getitem__)
            if self.paired:  # the member ``index`` after the owner, where it may
                partner = self.ring[(self.ring_rank[row[0]] + index) % len(self.ring)]
                if partner in fresh:
                    return partner
            # Spread each owner's backups over the other members, so that when a member
            # leaves, the first backups that take over its partitions are evenly spread.
            pairs = self.pairs[row[0]]
            return min(fresh, key=lambda x: (pairs[x], -deficit[x]))
        colder = [m for m in row[index + 1 :] if m is not None and deficit[m] > 0]
        if colder:
            return colder[0]
        return max(candidates, key=deficit.__getitem__)

    def augment(self, pid: int, index: int, accepts: Callable[[str], bool]) -> str | None:
        """Fill the free slot ``index`` of ``pid`` along a path of hand-overs.

        Breadth-first over members: a member that may take the slot but must not grow hands
        one of its own slots at this index to another member, and so on, until a member that
        ``accepts`` one more is reached. Returns that member, or None (nothing changed).
        """
        parent: dict[str, tuple[str | None, int]] = {}
        queue: deque[str] = deque()
        for member in self.eligible(pid, index):
            parent[member] = (None, pid)
            queue.append(member)
        while queue:
            member = queue.popleft()
            if accepts(member):
                self.apply_path(member, parent, index)
                return member
            for q in self.holdings(index)[member]:
                for other in self.eligible(q, index):
                    if other not in parent:
                        parent[other] = (member, q)
                        queue.append(other)
                if len(parent) == len(self.members):
                    break
        return None

    def apply_path(self, end: str, parent: dict[str, tuple[str | None, int]], index: int) -> None:
        """Each member on the path takes the slot its parent gives up, from the end back."""
        member: str | None = end
        for _ in range(len(self.members) + 1):
            if member is None:
                return
            previous, pid = parent[member]
            self.place(pid, index, member)
            member = previous
        raise AssertionError("augmenting path longer than the member list")

    def place_anyway(self, pid: int, index: int, shed: str | None) -> None:
        """No balanced fill exists: keep the slot filled, breaking balance by one."""
        if shed is not None:
            self.write(pid, index, shed)
            return
        candidates = self.eligible(pid, index)
        if not candidates:  # cannot happen: index < replica_count <= len(members)
            raise AssertionError(f"no member can take slot {index} of partition {pid}")
        self.place(pid, index, candidates[0])

    def relieve_owners(self, order: tuple[int, ...]) -> None:
        """Even out owner counts that still differ by two or more.

        This happens when the quotas guessed wrong around promoted owners (a partition whose
        owner is gone may only pass to another live replica). A partition of a member owning
        two more than another is handed along an augmenting path to a member owning at most
        two fewer; if balance is possible at all, such a path exists. Attempts are bounded so
        that hopeless cases (a member is the only live replica of too many partitions) stay
        cheap.
        """
        counts = self.counts(0)
        attempts_left = RELIEVE_ATTEMPTS_MAX
        progress = True
        while progress and max(counts.values()) - min(counts.values()) > 1:
            progress = False
            for pid in order:
                holder = self.rows[pid][0]
                limit = counts[holder] - 2
                if min(counts.values()) > limit:
                    continue
                if self.survivor_only[pid] and len(self.survivors[pid]) < 2:
                    continue
                if attempts_left <= 0:
                    return
                attempts_left -= 1
                self.write(pid, 0, None)
                end = self.augment(pid, 0, lambda x, limit=limit: counts[x] <= limit)
                if end is None:
                    self.write(pid, 0, holder)
                    continue
                counts[holder] -= 1
                counts[end] += 1
                progress = True

    def rotate_backups(self) -> None:
        """Fallback when the backups cannot be balanced incrementally (seen only with fewer
        partitions than a few times the members), and the paired placement's target: backup
        ``i`` of a partition owned by the ``k``-th member of the ring is the ``(k + i)``-th.
        Balanced owners give balanced backups."""
        ring, count = self.ring, len(self.ring)
        for row in self.rows:
            k = self.ring_rank[row[0]]
            for index in range(1, self.replica_count):
                row[index] = ring[(k + index) % count]
