"""What recent mutating calls returned, so that a client's resend gets the first outcome.

A client resends a write when its reply is missing (timeout, member gone). Without memory a
resent ``put`` returns its own value as the previous one, ``remove`` returns None and
``put_if_absent`` says "not stored" when it was. Each mutating call carries an invocation id;
the owner and its backups remember which partitions it was applied to and what it returned,
for as long as a client may resend (its invocation timeout), so that whichever replica is
owner when the resend comes answers it as the first attempt was answered and applies nothing
twice. One record per invocation, not per partition: a batch costs one entry. Which
invocations each partition holds is asked only when a partition moves or is dropped, so that
index is brought up to date then, not on every write (a batch of 100 keys names 80
partitions, on its owner and again on its backup).

Pure state: times are passed in.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Container, Iterable, Sequence
from itertools import islice
from typing import Any

from mypy_extensions import mypyc_attr

NOT_RECORDED = object()


# The simulation watches it, and its broken-protocol tests break it, through subclasses
# (tests/cluster/sim.py): compiled (grid/compiled.py), it must let Python subclass it.
@mypyc_attr(allow_interpreted_subclasses=True)
class InvocationRecords:
    """Invocation id -> (partitions applied to, outcome: the previous value or None), bounded
    in age (``keep_s``) and in count (``max_records``)."""

    def __init__(self, keep_s: float, max_records: int = 1_000_000) -> None:
        if keep_s <= 0 or max_records <= 0:
            raise ValueError("keep_s and max_records must be positive")
        self.keep_s = keep_s
        self.max_records = max_records
        # Invocation id -> (partitions, outcome, the record's number: the count of records
        # made when it was made).
        self._records: dict[str, tuple[set[int], Any, int]] = {}
        self._made = 0
        self._order: deque[tuple[float, str]] = deque()  # (recorded at, invocation id)
        # What a migration of the partition carries (a set made where one is missing), for
        # every record but the newest ``_unindexed`` of ``_order`` (``_index`` adds those):
        # those numbered above ``_made - _unindexed``.
        self._by_pid: defaultdict[int, set[str]] = defaultdict(set)
        self._unindexed = 0

    def get(self, pid: int, iid: str) -> Any:
        """The outcome of ``iid`` if it was applied to partition ``pid``, else NOT_RECORDED."""
        record = self._records.get(iid)
        return record[1] if record is not None and pid in record[0] else NOT_RECORDED

    def __contains__(self, iid: str) -> bool:
        """Whether ``iid`` was applied to any partition (and is still remembered)."""
        return iid in self._records

    def record(self, iid: str, pids: Iterable[int], outcome: Any, now: float) -> None:
        """``iid`` was applied to ``pids``; a later record of it adds partitions (a resend
        that reached partitions the first attempt did not) and keeps the first outcome,
        unless no partition holds the first any more (``forget_partition``)."""
        pids = set(pids)
        record = self._records.get(iid)
        if record is None:
            self._made += 1
            self._records[iid] = (pids, outcome, self._made)
            self._order.append((now, iid))
            self._unindexed += 1  # (indexed by partition when one is asked for)
            while len(self._order) > self.max_records:
                self._forget_oldest()
            return
        # A resend's record, or a batch's other part: a member that backs up one part of a
        # put_all and owns another records its invocation twice, microseconds apart.
        if not record[0]:  # applied again after every partition forgot it: now the first
            self._records[iid] = (pids, outcome, record[2])
        else:
            record[0].update(pids)
        if record[2] > self._made - self._unindexed:
            return  # not indexed yet: ``_index`` takes all of its partitions in its turn
        by_pid = self._by_pid
        for pid in pids:
            by_pid[pid].add(iid)

    def _index(self) -> None:
        """Add the records not yet in the partition index to it."""
        if not self._unindexed:
            return
        records, by_pid = self._records, self._by_pid
        for _, iid in islice(reversed(self._order), self._unindexed):
            for pid in records[iid][0]:
                by_pid[pid].add(iid)
        self._unindexed = 0

    def of_partition(self, pid: int) -> list[tuple[str, Any]]:
        """(invocation id, outcome) of what was applied to ``pid``: a migration or a sync
        hands them on with the data, so the partition's next owner answers resends too."""
        self._index()
        records = self._records
        return [(iid, records[iid][1]) for iid in self._by_pid.get(pid, ())]

    def invocations(self, pid: int) -> set[str]:
        """The invocation ids recorded as applied to ``pid``."""
        self._index()
        return set(self._by_pid.get(pid, ()))

    def forget_unknown(self, pid: int, iids: Iterable[str], known: Container[str]) -> None:
        """Forget for ``pid`` each of ``iids`` that ``known`` lacks: a replica sync made this
        replica's copy of ``pid`` the owner's, and ``known`` is what the owner remembers of
        it (so the copy may not hold the others' writes)."""
        self._index()
        records, by_pid = self._records, self._by_pid.get(pid)
        if not by_pid:
            return
        for iid in iids:
            if iid in known or iid not in by_pid:
                continue
            by_pid.discard(iid)
            record = records.get(iid)
            if record is not None:
                record[0].discard(pid)  # (left empty, it still expires in its turn)
        if not by_pid:
            del self._by_pid[pid]

    def adopt(self, pid: int, records: Iterable[Sequence[Any]], now: float) -> None:
        """Take another replica's records of ``pid`` ([invocation id, outcome], as they come
        off the wire: lists, not tuples) where this one has none of the invocation for
        ``pid``: a replica sync made this replica's copy its owner's, which holds those
        writes, so a resend must be answered as they were."""
        for iid, outcome in records:
            if self.get(pid, iid) is NOT_RECORDED:
                self.record(iid, (pid,), outcome, now)

    def forget_partition(self, pid: int) -> None:
        """What was applied to ``pid`` is no longer known to be in it (its data was dropped,
        or replaced by another replica's): a resend to it must be applied again."""
        self.forget_unknown(pid, self.invocations(pid), ())

    def _forget_oldest(self) -> None:
        """Forget the oldest record (the head of ``_order``), and its partitions' index
        entries if it was indexed."""
        iid = self._order.popleft()[1]
        pids = self._records.pop(iid)[0]
        if len(self._order) < self._unindexed:  # it was among the newest, never indexed
            self._unindexed -= 1
            return
        by_pid = self._by_pid
        for pid in pids:
            iids = by_pid.get(pid)
            if iids is not None:
                iids.discard(iid)
                if not iids:
                    del by_pid[pid]

    def expire(self, now: float) -> None:
        """Forget what no client can resend any more."""
        order = self._order
        while order and order[0][0] < now - self.keep_s:
            self._forget_oldest()

    def __len__(self) -> int:
        return len(self._records)
