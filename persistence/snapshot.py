"""The index of a cleanly closed store, saved beside its segments.

A restart reads the whole log once for recovery; without this the store would read it a
second time to rebuild its index. close() saves the index with a fingerprint (id, size,
inode, ctime) of every segment file; the next open uses it only if every file still matches,
and deletes it either way, so it never outlives the files it describes. After a crash there
is no snapshot and the open rebuilds the index from the segments.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import struct
import zlib

from .fileio import atomic_write
from .index import LogIndex
from .rebuild import RebuiltLog
from .segment import Damage, list_segments

log = logging.getLogger("shmgrid.persistence")

SNAPSHOT_FILE_NAME = "index.snapshot"
SNAPSHOT_MAGIC = b"SHMGIDX1"
SNAPSHOT_HEAD = struct.Struct("<8sIQ")  # magic, payload crc, payload bytes
SNAPSHOT_FORMAT_VERSION = 1
MARSHAL_VERSION = 4


def _fingerprints(path: str) -> list[tuple[int, int, int, int]]:
    found = []
    for segment_id, segment_path in list_segments(path):
        stat = os.stat(segment_path)
        found.append((segment_id, stat.st_size, stat.st_ino, stat.st_ctime_ns))
    return found


def save_snapshot(path: str, index: LogIndex, segment_bytes: dict[int, int],
                  damages: list[Damage]) -> None:
    """Save the index of a closed store (nothing may change the segments meanwhile)."""
    payload = marshal.dumps({
        "version": SNAPSHOT_FORMAT_VERSION,
        "files": _fingerprints(path),
        "keys": index.keys,
        "clears": index.clears,
        "live_bytes": index.live_bytes,
        "counts": (index.put_count, index.tombstone_count, index.seq_last),
        "segment_bytes": segment_bytes,
        "damages": [(d.path, d.offset, d.length_bytes, d.kind) for d in damages],
    }, MARSHAL_VERSION)
    head = SNAPSHOT_HEAD.pack(SNAPSHOT_MAGIC, zlib.crc32(payload), len(payload))
    atomic_write(os.path.join(path, SNAPSHOT_FILE_NAME), head + payload)


def take_snapshot(path: str) -> RebuiltLog | None:
    """The saved index if it still describes the segments exactly; the file is removed."""
    snapshot_path = os.path.join(path, SNAPSHOT_FILE_NAME)
    try:
        with open(snapshot_path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(snapshot_path)
    try:
        return _parse(path, data)
    except (ValueError, EOFError, TypeError, KeyError, struct.error) as exc:
        log.warning("ignoring the index snapshot of %s: %s", path, exc)
        return None


def _parse(path: str, data: bytes) -> RebuiltLog | None:
    magic, crc, payload_bytes = SNAPSHOT_HEAD.unpack_from(data, 0)
    payload = data[SNAPSHOT_HEAD.size:]
    if magic != SNAPSHOT_MAGIC or len(payload) != payload_bytes or zlib.crc32(payload) != crc:
        raise ValueError("damaged snapshot file")
    saved = marshal.loads(payload)
    if saved["version"] != SNAPSHOT_FORMAT_VERSION:
        raise ValueError(f"snapshot format {saved['version']}")
    if [tuple(f) for f in saved["files"]] != _fingerprints(path):
        log.info("index snapshot of %s is stale: segments changed since", path)
        return None
    index = LogIndex()
    index.keys = saved["keys"]
    index.clears = saved["clears"]
    index.live_bytes = saved["live_bytes"]
    index.put_count, index.tombstone_count, index.seq_last = saved["counts"]
    segment_bytes = saved["segment_bytes"]
    if sorted(segment_bytes) != [f[0] for f in saved["files"]]:
        raise ValueError("snapshot segments disagree with its file list")
    rebuilt = RebuiltLog(index, segment_bytes, max(segment_bytes, default=-1))
    rebuilt.damages = [Damage(*d) for d in saved["damages"]]
    return rebuilt
