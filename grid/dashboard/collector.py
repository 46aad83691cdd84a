"""The dashboard's poller: a thread that asks the cluster, every ``POLL_S``, for what `shmgrid
status` reads (every member's report, asked all at once), the partition table and the master's
new events, looks at each member's process (running, paused, dead), and hands a snapshot and
the new timeline events to ``publish``. A member that dies or hangs costs one short status
timeout; the process check marks it at once.

The timeline: the master's events (joins, removals, master changes, state changes, migration
plans, lost partitions; not each partition's migration) plus, after each change, when the
cluster was safe again (grid/dashboard/view.py ``SafeClock``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import psutil

from grid.dashboard.view import Rates, SafeClock, member_view, table_view

log = logging.getLogger("shmgrid.dashboard")

POLL_S = 0.25
STATUS_TIMEOUT_S = 0.5
LOST_SHOWN_S = 60.0  # a lost partition stays marked this long (it came back empty)
DEAD_SHOWN_S = 60.0  # a member that is gone stays listed, marked dead, this long
GONE_S = 3.0  # no registry and no answer this long: the cluster stopped
TIMELINE_KEPT = 500
QUIET = frozenset({"replica_migration"})  # too many for a timeline; the plan events count them

Publish = Callable[[str, dict[str, Any]], None]


def process_state(pid: Any) -> str:
    """"running", "paused" (stopped by a signal) or "dead" (no such process, or a zombie)."""
    if not isinstance(pid, int) or pid <= 0:  # psutil.Process(None) is this process
        return "dead"
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return "dead"
    if status == psutil.STATUS_ZOMBIE:
        return "dead"
    return "paused" if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP) \
        else "running"


class Collector:
    def __init__(self, cluster_name: str, publish: Publish) -> None:
        self.cluster_name = cluster_name
        self.publish = publish
        self.snapshot: dict[str, Any] | None = None
        self.timeline: deque[dict[str, Any]] = deque(maxlen=TIMELINE_KEPT)
        self.gone = threading.Event()  # the cluster stopped: the dashboard may end
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shmgrid-dashboard",
                                        daemon=True)
        self._rates = Rates()
        self._safe = SafeClock()
        self._lost: dict[int, float] = {}  # partition -> when it was lost
        # Every member seen (the registry and the cluster forget a dead one): uuid -> its
        # registry entry, and since when its process is dead.
        self._known: dict[str, dict[str, Any]] = {}
        self._dead_since: dict[str, float] = {}
        self._master: str | None = None
        self._since = 1
        self._seq = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import grid
        from grid.client.registry import registry_path
        from grid.errors import GridError

        client = None
        answered = time.monotonic()
        while not self._stop.is_set():
            try:
                if client is None:
                    client = grid.connect(cluster_name=self.cluster_name,
                                          invocation_timeout=2.0)
                self._poll(client)
                answered = time.monotonic()
            except GridError as exc:
                if client is not None:
                    client.close()
                    client = None
                log.info("cluster %s does not answer: %s", self.cluster_name, exc)
                if not registry_path(self.cluster_name).exists() and \
                        time.monotonic() - answered > GONE_S:
                    self.gone.set()
                    break
            except Exception:  # a dashboard that stops polling shows a lie: keep going
                log.exception("dashboard poll failed")
            self._stop.wait(POLL_S)
        if client is not None:
            client.close()

    def _poll(self, client: Any) -> None:
        from grid.client.registry import read_registry, registry_path
        from grid.client.status import member_rows, summarize

        now = time.monotonic()
        members, master, replicas = client.cluster.view()  # one table load a poll
        history = self.snapshot is None  # the log before we came: no time to safe from it
        for event in self._new_events(client, master):
            if event.get("type") == "partition_lost":
                self._lost[event["partition_id"]] = now
            if not history:
                self._safe.event(event, now)
            if event.get("type") not in QUIET:
                self._add(event)
        rows = member_rows(client, STATUS_TIMEOUT_S, members)
        summary = summarize(client.cluster_name, rows)
        registry = read_registry(registry_path(self.cluster_name))
        config = registry.get("config") or {}
        self._lost = {pid: t for pid, t in self._lost.items() if now - t < LOST_SHOWN_S}
        answered = {r["uuid"]: r for r in rows if not r.get("unreachable")}
        rates = self._rates.update(now, {u: r.get("requests") or 0 for u, r in answered.items()})
        for entry in [*registry["members"], *({"uuid": m.uuid, "name": m.name, "pid": m.pid,
                                                 "lite": m.lite} for m in members)]:
            self._known[entry["uuid"]] = entry  # the newest (a promotion ends "lite")
        states = {uuid: process_state(entry.get("pid")) for uuid, entry in self._known.items()}
        for uuid, state in states.items():
            if state != "dead":
                self._dead_since.pop(uuid, None)
            elif now - self._dead_since.setdefault(uuid, now) > DEAD_SHOWN_S:
                del self._known[uuid], self._dead_since[uuid]
        maps: dict[str, int] = {}
        for row in answered.values():
            for name, size in (row.get("maps") or {}).items():
                maps[name] = maps.get(name, 0) + size
        snapshot = {
            "cluster": summary["cluster"], "state": summary["state"], "safe": summary["safe"],
            "short_of_backups": summary["short_of_backups"], "unbacked": summary["unbacked"],
            "migrations": summary["migrations"], "maps": dict(sorted(maps.items())),
            "backup_count": config.get("backup_count"), "time": time.time(),
            "members": member_view(list(self._known.values()), {m.uuid for m in members},
                                   answered, {self._known[u].get("pid"): s
                                              for u, s in states.items() if u in self._known},
                                   rates),
            "table": table_view(replicas, int(config.get("backup_count", 1)),
                                sum(not m.lite for m in members),
                                summary["migrations"].get("in_flight") or (), self._lost)}
        safe_again = self._safe.poll(snapshot["safe"], now)
        if safe_again:
            self._add(safe_again)
        self.snapshot = snapshot
        self.publish("snapshot", snapshot)

    def _new_events(self, client: Any, master: Any) -> list[dict[str, Any]]:
        if master is None:
            return []
        uuid, events, following = client.cluster.events_since(self._since, master=master)
        if uuid is None:
            return []
        if uuid != self._master:
            first = self._master is None
            self._master = uuid
            if not first and self._since != 1:  # the old master's numbers: start over
                self._since = 1
                _, events, following = client.cluster.events_since(1, master=master)
        self._since = following
        return events

    def _add(self, event: dict[str, Any]) -> None:
        self._seq += 1
        event = {**event, "seq": self._seq, "time": time.time()}
        self.timeline.append(event)
        self.publish("event", event)
