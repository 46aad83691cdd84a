"""The master's event log: what migration and partition-lost listeners hear.

Events are numbered; a listener asks for those after the last number it saw. The log is
bounded: a listener that falls further behind than ``capacity`` events misses the oldest
(it is told, with the number it asked for no longer in the log). A new master starts a log
of its own; listeners start over with it.

Pure state.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class EventLog:
    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError("an event log holds at least one event")
        self._events: deque[tuple[int, dict[str, Any]]] = deque(maxlen=capacity)
        self.next_seq = 1

    def add(self, event: dict[str, Any]) -> int:
        seq = self.next_seq
        self._events.append((seq, event))
        self.next_seq += 1
        return seq

    def since(self, seq: int) -> tuple[list[tuple[int, dict[str, Any]]], bool]:
        """The events numbered ``seq`` and later, and whether some of those were dropped."""
        first = self._events[0][0] if self._events else self.next_seq
        events = [(n, e) for n, e in self._events if n >= seq]
        return events, seq < first
