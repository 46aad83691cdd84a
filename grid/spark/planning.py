"""Pure planning for reads and overwrites: which grid partitions or keys each task handles.

No sockets and no Spark here: the source calls these with a fresh partition table and turns
the result into InputPartitions, so the grouping rules are tested on plain values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ScanTask",
    "KeyTask",
    "plan_scan_tasks",
    "plan_key_tasks",
    "partitions_to_clear",
    "normalize_filter_key",
]


@dataclass(frozen=True, slots=True)
class ScanTask:
    """Scan these grid partitions, all owned by `owner` when planned."""

    owner: str
    partition_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KeyTask:
    """Fetch these keys, all in partitions owned by `owner` when planned."""

    owner: str
    keys: tuple[object, ...]


def _split_even(items: Sequence, chunk_count: int) -> list[tuple]:
    """`chunk_count` contiguous chunks whose sizes differ by at most one (none empty)."""
    assert chunk_count >= 1
    chunk_count = min(chunk_count, len(items))
    base, extra = divmod(len(items), chunk_count)
    chunks, start = [], 0
    for index in range(chunk_count):
        size = base + (1 if index < extra else 0)
        chunks.append(tuple(items[start : start + size]))
        start += size
    assert start == len(items)
    return chunks


def _interleave(groups: Sequence[Sequence]) -> list:
    """Round-robin over groups, so consecutive tasks go to different members."""
    out = []
    longest = max((len(g) for g in groups), default=0)
    for index in range(longest):
        out.extend(g[index] for g in groups if index < len(g))
    return out


def plan_scan_tasks(
    partition_count: int, owners: Mapping[int, str], task_count: int
) -> list[ScanTask]:
    """Group all grid partitions by owning member into about `task_count` scan tasks.

    Each member gets a share of tasks proportional to the partitions it owns (at least one);
    a task never spans two owners, so it streams from one member. Partitions without an
    owner in the table (not assigned yet) form their own group; the client routes them.
    """
    assert partition_count >= 1
    assert task_count >= 1
    by_owner: dict[str, list[int]] = {}
    for partition_id in range(partition_count):
        by_owner.setdefault(owners.get(partition_id) or "", []).append(partition_id)
    groups = []
    for owner in sorted(by_owner):
        ids = by_owner[owner]
        share = max(1, round(task_count * len(ids) / partition_count))
        groups.append([ScanTask(owner, chunk) for chunk in _split_even(ids, share)])
    tasks = _interleave(groups)
    covered = [p for task in tasks for p in task.partition_ids]
    assert sorted(covered) == list(range(partition_count))
    return tasks


def plan_key_tasks(
    keys: Iterable[object],
    partition_id: Callable[[object], int],
    owners: Mapping[int, str],
    keys_per_task_max: int,
) -> list[KeyTask]:
    """Group point-get keys by the owner of their partition, at most `keys_per_task_max` each."""
    assert keys_per_task_max >= 1
    by_owner: dict[str, list[object]] = {}
    for key in sorted(set(keys), key=repr):
        by_owner.setdefault(owners.get(partition_id(key)) or "", []).append(key)
    groups = []
    for owner in sorted(by_owner):
        owner_keys = by_owner[owner]
        groups.append(
            [
                KeyTask(owner, tuple(owner_keys[i : i + keys_per_task_max]))
                for i in range(0, len(owner_keys), keys_per_task_max)
            ]
        )
    return _interleave(groups)


def partitions_to_clear(partition_count: int, staged: Iterable[int]) -> list[int]:
    """Target partitions no successful write task wrote to: the complement of `staged`.

    `move_to` already empties the target's partitions in which the staging map holds nothing
    (it replaces every partition); after it, an overwrite's commit removes from these
    partitions the rows that a failed task attempt left in the staging map and that `move_to`
    therefore published (staging.py, step 4).
    """
    staged_set = set(staged)
    assert all(0 <= p < partition_count for p in staged_set)
    return [p for p in range(partition_count) if p not in staged_set]


_key_scalars = (str, bytes, int, float, bool)


def normalize_filter_key(value: object) -> tuple[bool, object]:
    """(usable, key) for a literal Spark pushed down: lists become tuples, bytearrays bytes.

    A literal that cannot be a grid key (a date, a null) can match no stored key.
    """
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if isinstance(value, (list, tuple)):
        parts = [normalize_filter_key(v) for v in value]
        if not all(ok for ok, _ in parts):
            return False, None
        return True, tuple(part for _, part in parts)
    if isinstance(value, _key_scalars):
        return True, value
    return False, None
