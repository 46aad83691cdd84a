"""Exceptions of the persistence layer; the grid wraps them in its own GridError classes."""

from __future__ import annotations


class PersistenceError(Exception):
    """Base of every error the persistence layer raises on purpose."""


class StoreClosedError(PersistenceError):
    """The store was closed; open a new LogStore on the folder to write again."""

    def __init__(self, path: str) -> None:
        super().__init__(f"log store {path} is closed; open a new LogStore to write to it")
        self.path = path


class StoreOpenError(PersistenceError):
    """The store's folder cannot be created, locked or written; the message says why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot open log store folder {path}: {reason}")
        self.path = path


class StoreLockedError(PersistenceError):
    """Another LogStore (in this or another process) already has the folder open."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"log store folder {path} is in use by another open LogStore; "
            "close it (or stop the process holding it) first")
        self.path = path


class StoreFailedError(PersistenceError):
    """The writer thread met an I/O error; the store refuses writes from then on.

    Records acknowledged durable before the failure are on disk; later ones may not be.
    Close the store and reopen it once the cause (named in the message) is fixed.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class DiskFullError(StoreFailedError):
    """The disk (or quota) under the store is full."""


class WriteQueueFullError(PersistenceError):
    """More bytes are waiting for the writer than the store's bound allows; retry later."""


class RecordTooLargeError(PersistenceError, ValueError):
    """A key or value is larger than the record format allows."""


class DurabilityTimeoutError(PersistenceError, TimeoutError):
    """wait_durable gave up before the sequence reached the disk."""


class CorruptMetadataError(PersistenceError):
    """A metadata file exists but cannot be trusted; the message names the file."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"metadata file {path} is corrupt ({reason}); restore it from a backup or "
            "remove it to start this member without its persisted cluster metadata")
        self.path = path
        self.reason = reason


class LogInvariantError(PersistenceError):
    """Internal bookkeeping disagrees with the log: a bug, never a user error."""
