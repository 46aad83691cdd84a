"""A member's persistence (seed 003): every mutation of every replica it holds, on disk.

With ``persistence_dir`` set, member NAME keeps ``persistence_dir/NAME/``:

- ``meta/``: its identity (name, uuid, cluster name, partition count, how keys are placed
  in partitions), the ids it gave map names, and the member list, partition table and
  cluster state it last followed, each file written atomically (persistence/metadata.py);
- ``log/``: a LogStore (persistence/store.py) with a record for every put, remove and clear
  the record store applies: owner writes, backup operations, migrations received (a clear,
  then the fragment's records) and partitions dropped (a clear per map). A record's prefix
  is (map id, partition id).

On start the member loads the log into its record store before it joins (recovery mode),
then opens the log for appending (persistence mode). With ``persistence_fsync = always`` the
owner answers a write only once its records are on disk (``MapService`` waits for
``durable_seq``); the log's writer thread wakes the member's loop through ``on_durable``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from grid.serialization import deserialize_key, partition_id_of
from persistence import LogStore, MetadataStore, make_prefix, split_prefix
from persistence.errors import CorruptMetadataError
from persistence.fileio import FileOps

log = logging.getLogger("shmgrid.journal")

IDENTITY, NAMESPACES, VIEW = "identity", "namespaces", "view"
# How keys are placed in partitions (grid/serialization.py). Folders written before hash tags
# have no such entry: they load only if none of their keys has a tag that moves it.
KEY_PLACEMENT = "murmur3, hash tags"
# A test hook: seconds each write to the log waits before it reaches the file (a slow disk),
# so that a test can kill the member while acknowledged-looking writes are still queued.
SLOW_DISK_ENV = "SHMGRID_TEST_SLOW_DISK"


class _SlowDisk(FileOps):
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def writev(self, fd: int, buffers: Any) -> int:
        time.sleep(self.delay_s)
        return super().writev(fd, buffers)


PROGRESS_FILE = "loading"  # "records loaded/records in the log", while a member loads
PROGRESS_EVERY = 50_000


def _report_progress(path: str, loaded: int, total: int) -> None:
    """Best effort: a progress bar is no reason to fail a restart."""
    with contextlib.suppress(OSError):
        with open(path + ".tmp", "w") as f:
            f.write(f"{loaded}/{total}")
        os.replace(path + ".tmp", path)


def read_progress(folder: str) -> tuple[int, int] | None:
    """(records loaded, records in the log) a member reported while it loads, or None."""
    try:
        with open(os.path.join(folder, PROGRESS_FILE)) as f:
            loaded, _, total = f.read().partition("/")
        return int(loaded), int(total)
    except (OSError, ValueError):
        return None


class JournalError(RuntimeError):
    """A member's folder cannot be used (another cluster's, another partition count, damaged
    metadata); the message says which file and what differs."""


@dataclass
class Restored:
    """What a member found in its folder when it started."""

    uuid: str | None = None  # its identity, reused
    table: Any = None  # the partition table (wire form), if any
    state: str | None = None
    clean: bool = False  # it stopped cleanly: its log holds every write it applied
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0


class Journal:
    """Member ``name``'s folder. Open it, ``restore`` the log into the record store, then
    the store calls ``put``/``put_many``/``remove``/``clear`` on every mutation."""

    def __init__(self, folder: str, name: str, cluster_name: str, partition_count: int,
                 fsync: str, fsync_interval: float) -> None:
        self.folder = folder
        self.fsync = fsync
        self.fsync_interval = fsync_interval
        try:
            self.meta = MetadataStore(os.path.join(folder, "meta"))
            identity = self._read_json(IDENTITY)
            self.namespace_ids: dict[str, int] = self._read_json(NAMESPACES) or {}
            view = self._read_json(VIEW) or {}
        except CorruptMetadataError as exc:
            raise JournalError(f"{name}'s metadata under {folder} is damaged: {exc}") from exc
        self.restored = Restored(table=view.get("table"),
                                 state=view.get("state"), clean=view.get("clean") is True)
        self._view = view
        if identity is not None:
            # Another cluster name is fine: a copied folder starts a new cluster (seed 003,
            # requirement 9); the supervisor checks that all folders agree on one.
            differs = [f"{key} {identity.get(key)!r} there, {value!r} here"
                       for key, value in (("name", name), ("partition_count", partition_count))
                       if identity.get(key) != value]
            if differs:
                raise JournalError(f"{folder} holds data this member cannot load: " +
                                   "; ".join(differs) + ". A key's partition follows from "
                                   "partition_count, so the files load only under the count "
                                   "they were written with")
            if identity.get("cluster_name") != cluster_name:
                log.info("%s was written by cluster %r; it starts cluster %r now", folder,
                         identity.get("cluster_name"), cluster_name)
            self.restored.uuid = identity.get("uuid")
            placement = identity.get("key_placement")
            if placement not in (None, KEY_PLACEMENT):
                raise JournalError(f"{folder} places keys by {placement!r}, which this "
                                   f"version does not know (it places them by "
                                   f"{KEY_PLACEMENT!r})")
        # Written before hash tags: restore checks the keys, then the identity says so.
        self.placement_unchecked = identity is not None and "key_placement" not in identity
        self.identity = {"name": name, "cluster_name": cluster_name,
                         "partition_count": partition_count}
        if not self.placement_unchecked:
            self.identity["key_placement"] = KEY_PLACEMENT
        self.ids = itertools.count(max(self.namespace_ids.values(), default=0) + 1)
        self.log: LogStore | None = None
        self.last_seq = 0
        self.view_dirty = False

    def _read_json(self, name: str) -> Any:
        payload = self.meta.read(name)
        if payload is None:
            return None
        try:
            return json.loads(payload)
        except ValueError as exc:
            raise CorruptMetadataError(self.meta.file_path(name), f"bad JSON: {exc}") from exc

    def _write_json(self, name: str, value: Any) -> None:
        self.meta.write(name, json.dumps(value, sort_keys=True).encode())

    def save_identity(self, uuid: str) -> None:
        self.identity["uuid"] = uuid
        self._write_json(IDENTITY, self.identity)

    # -- recovery, then persistence ------------------------------------------------------------

    def restore(self, put_many: Callable[[int, str, Iterable[tuple[bytes, bytes]]], None],
                on_durable: Callable[[], None] | None = None) -> Restored:
        """Load the log through ``put_many(pid, namespace, pairs)``, then open it for
        appending. Damage the library finds (a torn tail, a bad region) is logged and
        skipped: everything before it is loaded."""
        path = os.path.join(self.folder, "log")
        started = time.monotonic()
        with contextlib.suppress(OSError):  # last start's report is not this one's
            os.remove(os.path.join(self.folder, PROGRESS_FILE))
        names = {number: name for name, number in self.namespace_ids.items()}
        recovery = LogStore.recover(path)
        restored = self.restored
        progress_path = os.path.join(self.folder, PROGRESS_FILE)
        next_report = 0
        for prefix, group in itertools.groupby(recovery, key=lambda item: item[0]):
            if restored.records >= next_report:  # for `shmgrid start`'s progress bar
                _report_progress(progress_path, restored.records, recovery.live_count)
                next_report = restored.records + PROGRESS_EVERY
            ns_id, pid = split_prefix(prefix)
            namespace = names.get(ns_id)
            pairs = [(bytes(key), bytes(value)) for _, key, value in group]
            if namespace is None:
                log.warning("%d records of an unknown map id %d skipped", len(pairs), ns_id)
                continue
            if self.placement_unchecked:
                self._check_placement(pid, namespace, pairs)
            put_many(pid, namespace, pairs)
            restored.records += len(pairs)
            restored.bytes += sum(len(k) + len(v) for k, v in pairs)
        if self.placement_unchecked:  # every key is where a client looks for it
            self.placement_unchecked = False
            self.identity["key_placement"] = KEY_PLACEMENT
            self._write_json(IDENTITY, self.identity)
        for damage in recovery.damages:
            log.warning("log damage skipped while loading: %s", damage)
        if recovery.damages:
            restored.clean = False  # its replicas may differ from the others': re-sync
        restored.seconds = time.monotonic() - started
        _report_progress(progress_path, restored.records, recovery.live_count)
        if self._view.get("clean"):  # from now on a crash must not pass for a clean stop
            self._write_json(VIEW, {**self._view, "clean": False})
        slow = float(os.environ.get(SLOW_DISK_ENV) or 0)
        self.log = LogStore(path, fsync=self.fsync, fsync_interval=self.fsync_interval,
                            _file_ops=_SlowDisk(slow) if slow > 0 else None)
        if on_durable is not None:
            self.log.set_durable_listener(on_durable)
        return restored

    def _check_placement(self, pid: int, namespace: str,
                         pairs: list[tuple[bytes, bytes]]) -> None:
        """Refuse a folder written before hash tags that holds a key whose tag now places it
        in another partition: a get would not find it there (nothing is loaded or lost; the
        version that wrote the folder can still read it)."""
        count = self.identity["partition_count"]
        moved = [key for key, _ in pairs
                 if b"{" in key and partition_id_of(key, count) != pid]
        if moved:
            raise JournalError(
                f"{self.folder} was written before keys with a hash tag ({{...}}) were placed "
                f"by their tag: {len(moved)} key(s) of map {namespace!r} in partition {pid} "
                f"(the first {deserialize_key(moved[0])!r}) now belong to another partition, "
                f"where a get would not find them. Read the folder with the shmgrid version "
                f"that wrote it")

    def _prefix(self, pid: int, namespace: str) -> int:
        number = self.namespace_ids.get(namespace)
        if number is None:
            number = self.namespace_ids[namespace] = next(self.ids)
            self._write_json(NAMESPACES, self.namespace_ids)  # before any record names it
        return make_prefix(number, pid)

    def put(self, pid: int, namespace: str, key: bytes, value: Any) -> None:
        self.last_seq = self.log.put(self._prefix(pid, namespace), key,
                                     value if value.__class__ is bytes else bytes(value))

    def put_many(self, pid: int, namespace: str, pairs: Iterable[tuple[bytes, Any]]) -> None:
        prefix, put = self._prefix(pid, namespace), self.log.put
        seq = self.last_seq
        for key, value in pairs:
            seq = put(prefix, key, value if value.__class__ is bytes else bytes(value))
        self.last_seq = seq

    def remove(self, pid: int, namespace: str, key: bytes) -> None:
        self.last_seq = self.log.remove(self._prefix(pid, namespace), key)

    def clear(self, pid: int, namespace: str) -> None:
        self.last_seq = self.log.clear_prefix(self._prefix(pid, namespace))

    @property
    def durable_seq(self) -> int:
        return self.log.durable_seq if self.log is not None else 0

    def flush(self) -> None:
        """Write and fsync everything so far (a migration's destination, before it commits)."""
        if self.log is not None:
            self.log.flush()

    # -- the view --------------------------------------------------------------------------------

    def save_view(self, members: Any, table: Any, state: str, state_version: int,
                  clean: bool = False) -> None:
        """The member list, table and state this member follows (written at most once a
        tick: a migration changes the table often, and each write is an fsync); ``clean``
        when the member stops in order, its log closed after."""
        self._view = {"members": members, "table": table, "state": state,
                      "sv": state_version, "clean": clean}
        self._write_json(VIEW, self._view)
        self.view_dirty = False

    def backup(self, dest: str) -> dict[str, Any]:
        """A point-in-time copy of this folder in ``dest`` (must not exist or be empty): the
        log's sealed segments hard-linked (persistence/store.py ``backup``), then the
        metadata as it is now, so that a start on ``dest`` restarts from that point."""
        result = self.log.backup(os.path.join(dest, "log"))
        meta = os.path.join(dest, "meta")
        os.makedirs(meta, exist_ok=True)
        for name in os.listdir(self.meta.path):
            if name.endswith(".meta"):
                shutil.copy2(os.path.join(self.meta.path, name), os.path.join(meta, name))
        return {"dir": dest, "seq_last": result.seq_last, "segments": result.segment_count,
                "bytes_copied": result.bytes_copied}

    def stats(self) -> dict[str, Any]:
        stats = self.log.stats() if self.log is not None else None
        return {"dir": self.folder, "fsync": self.fsync,
                "loaded_records": self.restored.records, "loaded_bytes": self.restored.bytes,
                "load_seconds": round(self.restored.seconds, 3),
                "log_bytes": stats.log_bytes if stats else None}

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
