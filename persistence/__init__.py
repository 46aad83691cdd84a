"""The log-structured hot restart store: append-only segments, group commit, compaction,
recovery, and atomically written cluster metadata. Knows nothing of members or sockets.
"""

from .errors import (
    CorruptMetadataError,
    DiskFullError,
    DurabilityTimeoutError,
    LogInvariantError,
    PersistenceError,
    RecordTooLargeError,
    StoreClosedError,
    StoreFailedError,
    StoreLockedError,
    StoreOpenError,
    WriteQueueFullError,
)
from .metadata import MetadataStore
from .prefix import make_prefix, split_prefix
from .recovery import Recovery
from .segment import Damage
from .store import BackupResult, LogStore, StoreStats

__all__ = [
    "BackupResult",
    "CorruptMetadataError",
    "Damage",
    "DiskFullError",
    "DurabilityTimeoutError",
    "LogInvariantError",
    "LogStore",
    "MetadataStore",
    "PersistenceError",
    "RecordTooLargeError",
    "Recovery",
    "StoreClosedError",
    "StoreFailedError",
    "StoreLockedError",
    "StoreOpenError",
    "StoreStats",
    "WriteQueueFullError",
    "make_prefix",
    "split_prefix",
]
