"""Shared helpers of the persistence tests: a model of what the log should hold."""

from __future__ import annotations

import os

from persistence import LogStore, Recovery

Items = dict[tuple[int, bytes], bytes]


def recovered(path: str) -> Items:
    """Everything LogStore.recover returns for path, values copied to bytes."""
    return {(prefix, key): bytes(value) for prefix, key, value in LogStore.recover(path)}


def recovered_with_report(path: str) -> tuple[Items, Recovery]:
    recovery = LogStore.recover(path, copy_values=True)
    return {(prefix, key): value for prefix, key, value in recovery}, recovery


class Model:
    """The state a log must recover to: a dict, with clears removing a whole prefix."""

    def __init__(self) -> None:
        self.items: Items = {}

    def put(self, prefix: int, key: bytes, value: bytes) -> None:
        self.items[(prefix, key)] = value

    def remove(self, prefix: int, key: bytes) -> None:
        self.items.pop((prefix, key), None)

    def clear_prefix(self, prefix: int) -> None:
        for item_key in [k for k in self.items if k[0] == prefix]:
            del self.items[item_key]

    def apply(self, op: tuple) -> None:
        getattr(self, op[0])(*op[1:])


def apply_op(store: LogStore, op: tuple) -> int:
    """Run ("put", prefix, key, value), ("remove", prefix, key) or ("clear_prefix", prefix)."""
    return getattr(store, op[0])(*op[1:])


def segment_files(path: str) -> list[str]:
    return sorted(name for name in os.listdir(path) if name.startswith("segment-"))
