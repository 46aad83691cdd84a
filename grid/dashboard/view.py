"""What the dashboard shows, computed from what it polled: pure functions and small state, no
sockets, no clocks (times are passed in).

- ``table_view``: the partition table as the page draws it (owner and backups of each
  partition; those migrating, short of backups, lost);
- ``member_view``: one row per member the registry or the cluster knows, with how its process
  is (running, paused, dead) and whether the cluster still counts it;
- ``Rates``: ops/s per member from the request counters of successive polls;
- ``SafeClock``: after each change (a join, a removal, a master change, a state change), how
  long until the cluster was safe again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CHANGES = frozenset({"member_joined", "member_removed", "master_changed", "state_changed"})


def table_view(replicas: dict[int, list[str | None]], backup_count: int, data_members: int,
               in_flight: Iterable[int], lost: Iterable[int]) -> dict[str, Any]:
    """The page's partition grid: per partition its owner's uuid (None: none) and its
    backups' uuids; the partitions migrating now, short of the backups the data members
    allow, and lost (every replica gone: it came back empty)."""
    count = len(replicas)
    want = 1 + min(backup_count, max(0, data_members - 1))
    rows = [replicas[pid] for pid in range(count)]
    return {"partition_count": count,
            "owners": [row[0] if row else None for row in rows],
            "backups": [[r for r in row[1:] if r is not None] for row in rows],
            "migrating": sorted(set(in_flight)),
            "short": [pid for pid, row in enumerate(rows)
                      if sum(r is not None for r in row[:want]) < want],
            "lost": sorted(set(lost))}


def member_view(registry_members: list[dict[str, Any]], cluster_uuids: set[str],
                rows: dict[str, dict[str, Any]], process_states: dict[int, str],
                rates: dict[str, float]) -> list[dict[str, Any]]:
    """One row per member, in the registry's order then any the registry lacks.

    ``process`` is "running", "paused" (SIGSTOP) or "dead"; ``in_cluster`` False for a
    member the cluster removed (fenced, or leaving) while its process may still run. The
    status fields come from the member's own report when it answered."""
    seen: set[str] = set()
    out = []
    entries = [*registry_members,
               *({"uuid": u, "name": r.get("name", u[:8]), "pid": r.get("pid")}
                 for u, r in rows.items() if u not in {m.get("uuid") for m in registry_members})]
    for member in entries:
        uuid = member.get("uuid")
        if uuid in seen:
            continue
        seen.add(uuid)
        row = rows.get(uuid) or {}
        pid = member.get("pid")
        process = process_states.get(pid, "dead")
        out.append({
            "name": member.get("name"), "uuid": uuid, "pid": pid,
            "role": "master" if row.get("master") else "lite" if (
                row.get("lite") if row else member.get("lite")) else "member",
            "process": process, "in_cluster": uuid in cluster_uuids,
            "answered": bool(row) and not row.get("unreachable"),
            "owned": row.get("owned"), "backups": row.get("backups"),
            "shm_bytes": row.get("shm_bytes"), "rss": row.get("rss"),
            "ops": rates.get(uuid)})
    return out


class Rates:
    """Requests per second of each member, from its counter in two successive polls."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def update(self, now: float, counters: dict[str, int]) -> dict[str, float]:
        rates = {}
        for uuid, count in counters.items():
            last = self._last.get(uuid)
            if last is not None and now > last[0] and count >= last[1]:
                rates[uuid] = (count - last[1]) / (now - last[0])
            self._last[uuid] = (now, count)
        for uuid in set(self._last) - set(counters):
            del self._last[uuid]
        return rates


class SafeClock:
    """Time to safe: a change starts the clock (unless it runs already) at the time it
    happened (its ``at``, else when it was seen), and the first poll that finds the cluster
    safe after it stops it and says how long it took (so to within one poll interval)."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._changes: list[str] = []

    def event(self, event: dict[str, Any], now: float) -> None:
        if event.get("type") in CHANGES:
            if self._since is None:
                at = event.get("at")
                self._since = at if isinstance(at, float) and at <= now else now
            self._changes.append(str(event["type"]))

    def poll(self, safe: bool, now: float) -> dict[str, Any] | None:
        """A ``cluster_safe`` timeline event when this poll ends the wait, else None."""
        if not safe or self._since is None:
            return None
        event = {"type": "cluster_safe", "after_s": round(now - self._since, 3),
                 "changes": self._changes}
        self._since, self._changes = None, []
        return event
