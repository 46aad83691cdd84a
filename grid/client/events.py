"""Listeners for the master's events: migrations and lost partitions.

A background thread asks the master for the events after the last one it saw, every
``POLL_S``, and calls the listeners in order from that thread (as Hazelcast calls its
MigrationListener and PartitionLostListener from an event thread). A listener that raises is
logged and keeps being called. Events, each a dict with a ``type``:

- ``migration_started``: a migration plan of ``planned`` migrations starts;
- ``replica_migration``: one migration ended: ``partition_id``, ``kind``, ``source``,
  ``destination``, ``source_replica_index``, ``destination_replica_index``, ``success``;
- ``migration_finished``: the plan ended: ``planned``, ``completed``, ``failed``;
- ``partition_lost``: ``partition_id`` lost all ``lost_replicas`` replicas; it is empty now.

The log also holds what the dashboard's timeline shows (no listener of this module hears
them): ``member_joined`` (``member``, ``lite``), ``member_removed`` (``members``, ``reason``,
``promoted``: partitions whose owner they were), ``master_changed`` (the new ``master``, the
``gone``), ``state_changed`` (``from``, ``to``); each with ``at``, the master's
time.monotonic() when it happened (one clock for every process of the host).

A new master keeps a log of its own: listeners then hear its events from its first one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from grid import protocol as p
from grid.client.invocation import Invoker
from grid.errors import GridError

log = logging.getLogger("shmgrid.client")

POLL_S = 0.2
MIGRATION_EVENTS = frozenset({"migration_started", "replica_migration", "migration_finished"})
Listener = Callable[[dict[str, Any]], None]


class EventListeners:
    def __init__(self, seeds: Sequence[str], cluster_name: str, timeout: float) -> None:
        # An invoker of its own: polling never waits on the user's calls, nor they on it.
        self._invoker = Invoker(seeds, cluster_name, timeout, timeout)
        self._migration: list[Listener] = []
        self._partition_lost: list[Listener] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._master: str | None = None
        self._since = 1

    def add_migration_listener(self, listener: Listener) -> None:
        self._migration.append(listener)
        self._start()

    def add_partition_lost_listener(self, listener: Listener) -> None:
        self._partition_lost.append(listener)
        self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shmgrid-events",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except GridError as exc:
                log.debug("event poll failed: %s", exc)
            self._stop.wait(POLL_S)

    def _poll(self) -> None:
        invoker = self._invoker
        if invoker.members.master is None:
            invoker.refresh()
        master = invoker.members.master
        reply = invoker.call(master.endpoint, p.EVENTS, {"since": self._since})
        if reply is None or not reply[0].get("ok"):
            invoker.refresh()  # the master changed, or is gone
            return
        header = reply[0]
        if header.get("master") != self._master:
            self._master = header.get("master")
            if self._since != 1:  # the numbers were the old master's: start over
                self._since = 1
                return
        for _, event in header.get("events") or []:
            self._dispatch(event)
        self._since = header.get("next", self._since)

    def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        listeners = self._migration if kind in MIGRATION_EVENTS else \
            self._partition_lost if kind == "partition_lost" else []
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("a %s listener failed", kind)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._invoker.close()
