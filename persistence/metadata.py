"""A member's cluster metadata on disk: member list, partition table, cluster state.

Seed 003's recovery mode restores and validates these before any data is loaded, so each is
a file of its own, written atomically (temp file, fsync, rename, fsync of the folder) and
framed with a length and CRC: a crash leaves the old version or the new one, and a damaged
file is reported by name rather than misread.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from typing import Any

from .errors import CorruptMetadataError, StoreOpenError
from .fileio import atomic_write

METADATA_MAGIC = b"SHMGMETA"
METADATA_FORMAT_VERSION = 1
METADATA_HEAD = struct.Struct("<8sHHIQ")  # magic, version, flags, payload crc, payload bytes
metadata_head_bytes = METADATA_HEAD.size
metadata_bytes_max = 1 << 30
NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

MEMBER_LIST = "member_list"
PARTITION_TABLE = "partition_table"
CLUSTER_STATE = "cluster_state"

assert metadata_head_bytes == 24


class MetadataStore:
    """Named metadata files in folder path, each replaced atomically on every write."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise StoreOpenError(self.path, str(exc)) from exc

    def file_path(self, name: str) -> str:
        if not NAME.match(name):
            raise ValueError(f"metadata name {name!r} must match {NAME.pattern}")
        return os.path.join(self.path, f"{name}.meta")

    def write(self, name: str, payload: bytes) -> None:
        """Replace metadata file name with payload, atomically and durably."""
        if not isinstance(payload, bytes):
            raise TypeError(f"metadata payload must be bytes, not {type(payload).__name__}")
        if len(payload) > metadata_bytes_max:
            raise ValueError(f"metadata {name} of {len(payload)} bytes is too large")
        head = METADATA_HEAD.pack(METADATA_MAGIC, METADATA_FORMAT_VERSION, 0,
                                  zlib.crc32(payload), len(payload))
        atomic_write(self.file_path(name), head + payload)

    def read(self, name: str) -> bytes | None:
        """The payload last written under name, None if never written.

        Raises CorruptMetadataError, naming the file, if it cannot be trusted.
        """
        path = self.file_path(name)
        try:
            with open(path, "rb") as file:
                data = file.read(metadata_head_bytes + metadata_bytes_max + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CorruptMetadataError(path, f"unreadable: {exc}") from exc
        if len(data) < metadata_head_bytes:
            raise CorruptMetadataError(path, f"only {len(data)} bytes, shorter than its head")
        magic, version, flags, crc, payload_bytes = METADATA_HEAD.unpack_from(data, 0)
        if magic != METADATA_MAGIC:
            raise CorruptMetadataError(path, "not a shmgrid metadata file (bad magic)")
        if version != METADATA_FORMAT_VERSION or flags != 0:
            raise CorruptMetadataError(path, f"unknown format version {version}")
        payload = data[metadata_head_bytes:]
        if len(payload) != payload_bytes:
            raise CorruptMetadataError(
                path, f"holds {len(payload)} payload bytes, its head says {payload_bytes}")
        if zlib.crc32(payload) != crc:
            raise CorruptMetadataError(path, "CRC mismatch")
        return payload

    # -- the three kinds a member keeps -------------------------------------------------

    def write_member_list(self, members: Any) -> None:
        """Store a JSON-serializable member list (the member decides its shape)."""
        self.write(MEMBER_LIST, json.dumps(members, sort_keys=True).encode())

    def read_member_list(self) -> Any:
        payload = self.read(MEMBER_LIST)
        if payload is None:
            return None
        try:
            return json.loads(payload)
        except ValueError as exc:
            raise CorruptMetadataError(self.file_path(MEMBER_LIST), f"bad JSON: {exc}") from exc

    def write_partition_table(self, table: bytes) -> None:
        """Store the partition table, already encoded (seed 001's format)."""
        self.write(PARTITION_TABLE, table)

    def read_partition_table(self) -> bytes | None:
        return self.read(PARTITION_TABLE)

    def write_cluster_state(self, state: str) -> None:
        if not isinstance(state, str):
            raise TypeError(f"cluster state must be a str, not {type(state).__name__}")
        self.write(CLUSTER_STATE, state.encode())

    def read_cluster_state(self) -> str | None:
        payload = self.read(CLUSTER_STATE)
        if payload is None:
            return None
        try:
            return payload.decode()
        except UnicodeDecodeError as exc:
            raise CorruptMetadataError(self.file_path(CLUSTER_STATE), str(exc)) from exc
