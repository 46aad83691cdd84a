"""The overwrite protocol: stage under the job's id, publish on commit, clean up on abort.

An overwrite must never leave the target map empty or half-written when the job fails, so
the write tasks put their rows into a staging map named after the job, and only the driver's
`commit()` (which Spark calls once, after every task succeeded) publishes it:

1. check that the job's entry is still in the staging registry (a stale-job sweep by another
   writer may have removed it; then the staging data is gone and publishing would lose rows);
2. take the grid partitions the write tasks put rows into (each task's commit message lists
   its partitions; only if a message is missing does commit scan the staging map for them);
3. `staging.move_to(target)`: in every partition of the map, on the owner and its backups,
   the target's fragment is atomically replaced by the staging fragment, which empties the
   staging map. This covers the partitions the staging map holds nothing in too: there the
   target becomes empty (the member's `move_fragment` drops the target's fragment whether or
   not the source has one), so no old entry survives the overwrite;
4. remove, in the target partitions no successful task wrote to (those not in step 2's list),
   whatever step 3 published there: only rows a failed task attempt left in the staging map
   can be there (with deterministic input a retry puts the same keys, which lie in partitions
   its own message lists). When step 2 scanned the staging map, these partitions are exactly
   the ones it held nothing in, and step 4 finds them already empty;
5. remove the job's registry entry.

`abort()` (and a later writer's sweep of jobs older than `staging.ttl`, for jobs whose driver
died before commit or abort ran) clears the staging map and removes the entry. A failed task
attempt needs no cleanup of its own: its rows went to the job's staging map, a retry of the
same Spark partition puts the same keys again (an idempotent upsert), and a failed job's
staging map is cleared as a whole.

Readers of the target see, during commit, each partition switch from old to new contents
(empty where nothing was staged) atomically, but not all partitions at the same instant;
between steps 3 and 4 a partition of step 4 may show a failed attempt's rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from grid.spark.planning import partitions_to_clear

__all__ = [
    "STAGING_REGISTRY_MAP",
    "StagingLostError",
    "staging_map_name",
    "begin_overwrite",
    "commit_overwrite",
    "abort_overwrite",
    "sweep_stale_jobs",
]

STAGING_REGISTRY_MAP = "__shmgrid_spark_staging__"
_staging_prefix = "__shmgrid_staging__"
registry_entries_max = 100_000


class StagingLostError(RuntimeError):
    """The job's staging data was swept before commit; the target was left untouched."""


def staging_map_name(target: str, job_id: str) -> str:
    """The staging map of one overwrite job of `target`."""
    assert job_id and "/" not in job_id
    return f"{_staging_prefix}{target}__{job_id}"


def _registry_entries(client: Any) -> list[tuple[str, dict]]:
    registry = client.get_map(STAGING_REGISTRY_MAP)
    entries: list[tuple[str, dict]] = []
    for keys, values in registry.scan_partitions(range(client.partition_count)):
        entries.extend(zip(keys, values, strict=True))
        if len(entries) > registry_entries_max:
            raise RuntimeError(
                f"the staging registry map {STAGING_REGISTRY_MAP!r} has more than "
                f"{registry_entries_max} entries; clear it"
            )
    return entries


def sweep_stale_jobs(client: Any, now_s: float, ttl_s: float) -> list[str]:
    """Clear the staging maps of jobs registered more than `ttl_s` ago; return their names."""
    assert ttl_s > 0
    registry = client.get_map(STAGING_REGISTRY_MAP)
    swept = []
    for name, entry in _registry_entries(client):
        created_s = entry.get("created_s", 0.0) if isinstance(entry, dict) else 0.0
        if now_s - created_s <= ttl_s:
            continue
        client.get_map(name).clear()
        registry.remove(name)
        swept.append(name)
    return swept


def begin_overwrite(
    client: Any, target: str, job_id: str, *, ttl_s: float, now_s: float | None = None
) -> str:
    """Register an overwrite job (after sweeping stale ones); return its staging map's name."""
    now = time.time() if now_s is None else now_s
    sweep_stale_jobs(client, now, ttl_s)
    name = staging_map_name(target, job_id)
    entry = {"target": target, "job_id": job_id, "created_s": now}
    client.get_map(STAGING_REGISTRY_MAP).put(name, entry)
    return name


def staged_partitions(client: Any, staging_name: str) -> list[int]:
    """The grid partitions in which the staging map holds at least one entry.

    The fallback of commit when a task's message is missing: it reads the whole staging map.
    """
    staging = client.get_map(staging_name)
    staged: set[int] = set()
    for keys, _values in staging.scan_partitions(range(client.partition_count)):
        staged.update(map(client.partition_id, keys))
    return sorted(staged)


def clear_partitions(client: Any, map_name: str, partition_ids: Iterable[int]) -> int:
    """Remove every entry of `map_name` in these partitions; return how many were removed."""
    target = client.get_map(map_name)
    ids = list(partition_ids)
    if not ids:
        return 0
    removed = 0
    for keys, _values in target.scan_partitions(ids):
        for key in keys:
            target.remove(key)
            removed += 1
    return removed


def commit_overwrite(
    client: Any, target: str, staging_name: str, staged: Iterable[int] | None
) -> dict[str, int]:
    """Publish the staging map as the target's new contents (steps 1 to 5 above).

    `staged` are the partitions the tasks wrote to (None: find them by scanning). `move_to`
    replaces every partition of the target, so the partitions outside `staged` hold nothing
    after it except rows a failed attempt staged there; step 4 removes those.
    """
    registry = client.get_map(STAGING_REGISTRY_MAP)
    if registry.get(staging_name) is None:
        raise StagingLostError(
            f"shmgrid: the staging map {staging_name!r} of this overwrite of {target!r} was "
            "swept as stale before the job committed (option 'staging.ttl'); the map "
            f"{target!r} was left as it was; run the job again"
        )
    staged = sorted(set(staged)) if staged is not None else staged_partitions(client, staging_name)
    client.get_map(staging_name).move_to(target)
    to_clear = partitions_to_clear(client.partition_count, staged)
    removed = clear_partitions(client, target, to_clear)
    registry.remove(staging_name)
    assert len(staged) + len(to_clear) == client.partition_count
    return {"partitions_published": len(staged), "stale_entries_removed": removed}


def abort_overwrite(client: Any, staging_name: str) -> None:
    """Drop what the job staged; the target map is untouched."""
    client.get_map(staging_name).clear()
    client.get_map(STAGING_REGISTRY_MAP).remove(staging_name)
