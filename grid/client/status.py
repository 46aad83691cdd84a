"""What `shmgrid status` and the dashboard show: every member's report of itself, and the
cluster summary that the master's report gives (state, safety, migrations)."""

from __future__ import annotations

from typing import Any

MEMBER_FIELDS = ("name", "uuid", "pid", "endpoint", "master", "lite", "owned", "backups",
                 "unbacked", "backup_backlog", "dirty", "syncs_in_flight", "syncs_waiting",
                 "synced", "sync_entries", "sent_entries", "sent_bytes", "shm_bytes", "rss",
                 "persistence", "requests", "chained_answers", "maps", "unreachable")


def member_rows(client: Any, timeout: float = 2.0, members: list[Any] | None = None
                ) -> list[dict[str, Any]]:
    """Each member's status report (of ``members``, default: the cluster's now); a member
    that does not answer within ``timeout`` is a row with its name, uuid, pid, endpoint and
    ``unreachable``."""
    return [status or {"name": member.name, "uuid": member.uuid, "pid": member.pid,
                       "endpoint": member.endpoint, "unreachable": True}
            for member, status in client.cluster.members_status(timeout, members)]


def summarize(cluster_name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    master = next((r for r in rows if r.get("master")), rows[0] if rows else {})
    return {"cluster": cluster_name, "state": master.get("state", "UNKNOWN"),
            "safe": bool(master.get("safe")),
            # Owned partitions with no synchronous backup: their writes rest on one member.
            "unbacked": sum(r.get("unbacked") or 0 for r in rows),
            "short_of_backups": master.get("short_of_backups") or 0,
            # Replica sync (seed 004): backups that missed operations, syncs under way.
            "dirty": sum(r.get("dirty") or 0 for r in rows),
            "syncs_in_flight": sum(r.get("syncs_in_flight") or 0 for r in rows),
            "migrations": master.get("migrations") or {},
            "members": [{k: r[k] for k in MEMBER_FIELDS if k in r} for r in rows]}
