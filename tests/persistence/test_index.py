"""The index bookkeeping on an in-memory log: compaction never changes what recovery returns,
and the index kept up to date always equals one rebuilt from the segments."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persistence.index import KEEP, LogIndex, pack_entry, unpack_entry
from persistence.records import KIND_CLEAR, KIND_PUT, KIND_TOMBSTONE, record_head_bytes

Record = tuple[int, int, int, bytes, bytes]  # kind, seq, prefix, key, value


class MemoryLog:
    """Segments as lists of records, compacted with the index's decide/release like the
    real compactor, replayed like recovery."""

    def __init__(self) -> None:
        self.segments: dict[int, list[Record]] = {0: []}
        self.head_id = 0
        self.seq = 0
        self.durable_seq = 2**62  # everything written is durable unless a test says otherwise
        self.index = LogIndex()
        self.index.live_bytes[0] = 0

    def append(self, kind: int, prefix: int, key: bytes = b"", value: bytes = b"") -> None:
        self.seq += 1
        self.segments[self.head_id].append((kind, self.seq, prefix, key, value))
        self.index.add(kind, self.seq, prefix, key, self.head_id, _size(key, value))

    def roll(self) -> None:
        self.head_id += 1
        self.segments[self.head_id] = []
        self.index.live_bytes[self.head_id] = 0

    def compact(self, run: list[int]) -> None:
        refs = [(segment_id, record) for segment_id in run for record in self.segments[segment_id]]
        pending_keys: dict = {}
        pending_clears: dict = {}
        decisions = [self.index.decide(r[0], r[1], r[2], r[3], s, self.durable_seq,
                                       pending_keys, pending_clears)
                     for s, r in refs]
        self.segments[run[0]] = [r for (s, r), d in zip(refs, decisions, strict=True)
                                 if d == KEEP]
        for segment_id in run[1:]:
            del self.segments[segment_id]
        for (segment_id, r), decision in zip(refs, decisions, strict=True):
            self.index.release(decision, r[0], r[1], r[2], r[3], segment_id, run[0])
        for segment_id in run[1:]:
            self.index.forget_segment(segment_id)

    def replay(self) -> dict[tuple[int, bytes], bytes]:
        live: dict[int, dict[bytes, bytes]] = {}
        for segment_id in sorted(self.segments):
            for kind, _seq, prefix, key, value in self.segments[segment_id]:
                if kind == KIND_PUT:
                    live.setdefault(prefix, {})[key] = value
                elif kind == KIND_TOMBSTONE:
                    live.get(prefix, {}).pop(key, None)
                else:
                    live.pop(prefix, None)
        return {(p, k): v for p, keys in live.items() for k, v in keys.items()}

    def rebuilt(self) -> LogIndex:
        index = LogIndex()
        for segment_id in sorted(self.segments):
            index.live_bytes.setdefault(segment_id, 0)
            for kind, seq, prefix, key, value in self.segments[segment_id]:
                index.add(kind, seq, prefix, key, segment_id, _size(key, value))
        return index


def _size(key: bytes, value: bytes) -> int:
    return record_head_bytes + len(key) + len(value)


def assert_same_index(mine: LogIndex, theirs: LogIndex) -> None:
    assert mine.keys == theirs.keys
    assert mine.clears == theirs.clears
    assert {s: b for s, b in mine.live_bytes.items() if b} == \
        {s: b for s, b in theirs.live_bytes.items() if b}
    assert (mine.put_count, mine.tombstone_count) == (theirs.put_count, theirs.tombstone_count)


def test_entry_packing_round_trips() -> None:
    entry = pack_entry(2**62, 2**32 - 1, 12345, 7, True)
    assert unpack_entry(entry) == (2**62, 2**32 - 1, 12345, 7, True)
    assert unpack_entry(pack_entry(1, 0, 32, 0, False)) == (1, 0, 32, 0, False)


def test_overwrites_move_live_bytes_and_count_dead_records() -> None:
    log = MemoryLog()
    log.append(KIND_PUT, 1, b"k", b"v1")
    log.roll()
    log.append(KIND_PUT, 1, b"k", b"v22")
    assert log.index.live_bytes == {0: 0, 1: _size(b"k", b"v22")}
    assert unpack_entry(log.index.keys[1][b"k"])[3] == 1  # one dead record of k on disk
    log.append(KIND_TOMBSTONE, 1, b"k")
    # The tombstone is live while the two older records of k are on disk.
    assert log.index.live_bytes[1] == _size(b"k", b"")
    assert log.index.tombstone_count == 1
    assert log.index.put_count == 0


def test_tombstone_stays_until_no_older_record_remains() -> None:
    log = MemoryLog()
    log.append(KIND_PUT, 1, b"k", b"old")
    log.roll()
    log.append(KIND_TOMBSTONE, 1, b"k")
    log.roll()
    log.compact([1])  # the tombstone's segment, while the put is still in segment 0
    assert log.segments[1] == [(KIND_TOMBSTONE, 2, 1, b"k", b"")]
    assert log.replay() == {}
    log.compact([0])  # the put is dead: dropped, and the tombstone no longer hides anything
    assert log.segments[0] == []
    assert log.index.live_bytes[1] == 0
    log.compact([1])
    assert log.segments[1] == []
    assert log.index.keys == {}
    assert_same_index(log.index, log.rebuilt())


def test_clear_stays_until_no_older_record_of_its_prefix_remains() -> None:
    log = MemoryLog()
    for i in range(3):
        log.append(KIND_PUT, 7, b"k%d" % i, b"v")
    log.roll()
    log.append(KIND_CLEAR, 7)
    log.append(KIND_PUT, 7, b"new", b"v")
    log.roll()
    log.compact([1])
    assert [r[0] for r in log.segments[1]] == [KIND_CLEAR, KIND_PUT]
    log.compact([0])
    assert log.segments[0] == []
    log.compact([1])
    assert [r[0] for r in log.segments[1]] == [KIND_PUT]
    assert log.replay() == {(7, b"new"): b"v"}
    assert_same_index(log.index, log.rebuilt())


def test_a_tombstone_after_dead_records_in_the_same_run_goes_at_once() -> None:
    log = MemoryLog()
    log.append(KIND_PUT, 1, b"k", b"v")
    log.append(KIND_TOMBSTONE, 1, b"k")
    log.roll()
    log.compact([0])
    assert log.segments[0] == []


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 2), st.integers(0, 5), st.binary(max_size=6)),
        st.tuples(st.just("remove"), st.integers(0, 2), st.integers(0, 5)),
        st.tuples(st.just("clear"), st.integers(0, 2)),
        st.tuples(st.just("roll")),
        st.tuples(st.just("compact"), st.integers(0, 10**6), st.integers(1, 3)),
    ),
    max_size=80,
)


@settings(database=None, max_examples=300, deadline=None)
@given(ops)
def test_compaction_keeps_recovery_and_index_exact(steps: list[tuple]) -> None:
    log = MemoryLog()
    expected: dict[tuple[int, bytes], bytes] = {}
    for step in steps:
        if step[0] == "put":
            key = b"k%d" % step[2]
            log.append(KIND_PUT, step[1], key, step[3])
            expected[(step[1], key)] = step[3]
        elif step[0] == "remove":
            key = b"k%d" % step[2]
            log.append(KIND_TOMBSTONE, step[1], key)
            expected.pop((step[1], key), None)
        elif step[0] == "clear":
            log.append(KIND_CLEAR, step[1])
            expected = {k: v for k, v in expected.items() if k[0] != step[1]}
        elif step[0] == "roll":
            log.roll()
        else:
            sealed = sorted(s for s in log.segments if s < log.head_id)
            if sealed:
                start = step[1] % len(sealed)
                log.compact(sealed[start:start + step[2]])
        assert log.replay() == expected
    assert_same_index(log.index, log.rebuilt())
    # Compacting everything sealed, oldest first, leaves no dead record and no useless
    # tombstone; a second round must find nothing more to drop.
    log.roll()
    for _round in range(2):
        for segment_id in sorted(s for s in log.segments if s < log.head_id):
            if segment_id in log.segments:
                log.compact([segment_id])
    assert log.replay() == expected
    # Only the live puts are left: every dead record, tombstone and clear went.
    left = [r for records in log.segments.values() for r in records]
    assert sorted((r[2], r[3], r[4]) for r in left) == sorted((p, k, v) for (p, k), v in
                                                                expected.items())
    assert_same_index(log.index, log.rebuilt())


@pytest.mark.parametrize("seed", range(5))
def test_random_long_histories_stay_exact(seed: int) -> None:
    rng = random.Random(seed)
    log = MemoryLog()
    expected: dict[tuple[int, bytes], bytes] = {}
    for step in range(3000):
        roll = rng.random()
        prefix, key = rng.randrange(4), b"k%d" % rng.randrange(30)
        if roll < 0.6:
            value = rng.randbytes(rng.randrange(8))
            log.append(KIND_PUT, prefix, key, value)
            expected[(prefix, key)] = value
        elif roll < 0.9:
            log.append(KIND_TOMBSTONE, prefix, key)
            expected.pop((prefix, key), None)
        elif roll < 0.93:
            log.append(KIND_CLEAR, prefix)
            expected = {k: v for k, v in expected.items() if k[0] != prefix}
        elif roll < 0.97:
            log.roll()
        else:
            sealed = sorted(s for s in log.segments if s < log.head_id)
            if sealed:
                start = rng.randrange(len(sealed))
                log.compact(sealed[start:start + rng.randrange(1, 4)])
        if step % 500 == 0:
            assert log.replay() == expected
            assert_same_index(log.index, log.rebuilt())
    assert log.replay() == expected
    assert_same_index(log.index, log.rebuilt())


def test_a_record_superseded_only_by_a_record_not_yet_durable_stays() -> None:
    log = MemoryLog()
    log.append(KIND_PUT, 1, b"k", b"old")
    log.roll()
    log.durable_seq = log.seq
    log.append(KIND_PUT, 1, b"k", b"new")  # still in the writer's queue, say
    log.compact([0])
    assert log.segments[0] == [(KIND_PUT, 1, 1, b"k", b"old")]
    log.durable_seq = log.seq
    log.compact([0])
    assert log.segments[0] == []


crash_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 1), st.integers(0, 3), st.binary(max_size=4)),
        st.tuples(st.just("remove"), st.integers(0, 1), st.integers(0, 3)),
        st.tuples(st.just("clear"), st.integers(0, 1)),
        st.tuples(st.just("roll")),
        st.tuples(st.just("sync")),
        st.tuples(st.just("compact"), st.integers(0, 10**6), st.integers(1, 3)),
    ),
    max_size=60,
)


@settings(database=None, max_examples=300, deadline=None)
@given(crash_ops)
def test_a_crash_after_any_compaction_recovers_the_durable_prefix(steps: list[tuple]) -> None:
    """Lose every record newer than the last sync, as a crash may: what is left must replay
    to exactly the history up to that sync, however compaction rewrote the segments."""
    log = MemoryLog()
    log.durable_seq = 0
    history: list[tuple] = []
    for step in steps:
        if step[0] == "put":
            log.append(KIND_PUT, step[1], b"k%d" % step[2], step[3])
            history.append(("put", step[1], b"k%d" % step[2], step[3]))
        elif step[0] == "remove":
            log.append(KIND_TOMBSTONE, step[1], b"k%d" % step[2])
            history.append(("remove", step[1], b"k%d" % step[2]))
        elif step[0] == "clear":
            log.append(KIND_CLEAR, step[1])
            history.append(("clear", step[1]))
        elif step[0] == "roll":
            log.roll()
        elif step[0] == "sync":
            log.durable_seq = log.seq
        else:
            sealed = sorted(s for s in log.segments if s < log.head_id)
            if sealed:
                start = step[1] % len(sealed)
                log.compact(sealed[start:start + step[2]])
        crashed = MemoryLog()
        crashed.segments = {s: [r for r in records if r[1] <= log.durable_seq]
                            for s, records in log.segments.items()}
        expected: dict[tuple[int, bytes], bytes] = {}
        for op in history[:log.durable_seq]:
            if op[0] == "put":
                expected[(op[1], op[2])] = op[3]
            elif op[0] == "remove":
                expected.pop((op[1], op[2]), None)
            else:
                expected = {k: v for k, v in expected.items() if k[0] != op[1]}
        assert crashed.replay() == expected
