"""What recent mutating calls returned, so that a client's resend gets the first outcome.

A client resends a write when its reply is missing (timeout, member gone). Without memory a
resent ``put`` returns its own value as the previous one, ``remove`` returns None and
``put_if_absent`` says "not stored" when it was. Each mutating call carries an invocation id;
the owner and its backups remember which partitions it was applied to and what it returned,
for as long as a client may resend (its invocation timeout), so that whichever replica is
owner when the resend comes answers it as the first attempt was answered and applies nothing
twice. One record per invocation, not per partition: a batch costs one entry.

Pure state: times are passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

NOT_RECORDED = object()


class InvocationRecords:
    """Invocation id -> (partitions applied to, outcome: the previous value or None), bounded
    in age (``keep_s``) and in count (``max_records``)."""

    def __init__(self, keep_s: float, max_records: int = 1_000_000) -> None:
        if keep_s <= 0 or max_records <= 0:
            raise ValueError("keep_s and max_records must be positive")
        self.keep_s = keep_s
        self.max_records = max_records
        self._records: dict[str, tuple[set[int], Any]] = {}
        self._order: deque[tuple[float, str]] = deque()  # (recorded at, invocation id)

    def get(self, pid: int, iid: str) -> Any:
        """The outcome of ``iid`` if it was applied to partition ``pid``, else NOT_RECORDED."""
        record = self._records.get(iid)
        return record[1] if record is not None and pid in record[0] else NOT_RECORDED

    def record(self, iid: str, pids: Iterable[int], outcome: Any, now: float) -> None:
        """``iid`` was applied to ``pids``; a later record of it adds partitions (a resend
        that reached partitions the first attempt did not) and keeps the first outcome."""
        record = self._records.get(iid)
        if record is None:
            self._records[iid] = (set(pids), outcome)
            self._order.append((now, iid))
            while len(self._order) > self.max_records:
                self._records.pop(self._order.popleft()[1], None)
        else:
            record[0].update(pids)

    def expire(self, now: float) -> None:
        """Forget what no client can resend any more."""
        order, records = self._order, self._records
        while order and order[0][0] < now - self.keep_s:
            records.pop(order.popleft()[1], None)

    def __len__(self) -> int:
        return len(self._records)
