"""Invocation records (grid/cluster/invocations.py): what a recent mutating call returned, so
that a resend is answered as the first attempt was."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.cluster.invocations import NOT_RECORDED, InvocationRecords


def test_unknown_invocation_is_not_recorded():
    records = InvocationRecords(keep_s=10.0)
    assert records.get(0, "nobody") is NOT_RECORDED
    assert len(records) == 0


def test_recorded_outcome_is_returned_for_each_of_its_partitions():
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [3, 5], b"old", now=0.0)
    assert records.get(3, "i1") == b"old"
    assert records.get(5, "i1") == b"old"
    assert len(records) == 1, "one record per invocation, not per partition"


def test_contains_says_whether_an_invocation_is_remembered():
    """What an owner asks first of a batch write: no per-partition look-up for a new one."""
    records = InvocationRecords(keep_s=10.0)
    assert "i1" not in records
    records.record("i1", [3], None, now=0.0)
    assert "i1" in records and "i2" not in records
    records.expire(now=20.0)
    assert "i1" not in records


def test_partition_not_in_the_record_is_not_recorded():
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [3], b"old", now=0.0)
    assert records.get(4, "i1") is NOT_RECORDED


def test_a_none_outcome_is_recorded_and_distinct_from_not_recorded():
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [0], None, now=0.0)
    assert records.get(0, "i1") is None
    assert records.get(0, "i1") is not NOT_RECORDED


def test_record_with_no_partitions_answers_nothing():
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [], b"x", now=0.0)
    assert records.get(0, "i1") is NOT_RECORDED


def test_record_accepts_any_iterable_of_partitions():
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", (p for p in (1, 2)), "o", now=0.0)
    records.record("i2", {7}, "o2", now=0.0)
    assert records.get(2, "i1") == "o"
    assert records.get(7, "i2") == "o2"


def test_recording_again_adds_partitions_and_keeps_the_first_outcome():
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [1], b"first", now=0.0)
    records.record("i1", [2, 1], b"second", now=1.0)
    assert records.get(1, "i1") == b"first"
    assert records.get(2, "i1") == b"first"
    assert len(records) == 1


def test_recording_again_keeps_the_first_outcome_even_when_it_was_none():
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [1], None, now=0.0)
    records.record("i1", [1], b"resend saw its own value", now=1.0)
    assert records.get(1, "i1") is None


def test_the_callers_partition_collection_is_not_kept():
    records = InvocationRecords(keep_s=10.0)
    pids = {1}
    records.record("i1", pids, "o", now=0.0)
    pids.add(2)
    assert records.get(2, "i1") is NOT_RECORDED


# -- age -------------------------------------------------------------------------------------


def test_expire_keeps_a_record_exactly_keep_s_old():
    # expire drops records with `recorded_at < now - keep_s`: exactly keep_s old stays.
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [0], "o", now=100.0)
    records.expire(now=110.0)
    assert records.get(0, "i1") == "o"
    assert len(records) == 1


def test_expire_forgets_a_record_just_older_than_keep_s():
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [0], "o", now=100.0)
    records.expire(now=110.25)
    assert records.get(0, "i1") is NOT_RECORDED
    assert len(records) == 0


def test_expire_forgets_only_the_old_records():
    records = InvocationRecords(keep_s=10.0)
    records.record("old", [0], "a", now=0.0)
    records.record("mid", [0], "b", now=5.0)
    records.record("new", [0], "c", now=9.0)
    records.expire(now=16.0)
    assert records.get(0, "old") is NOT_RECORDED
    assert records.get(0, "mid") is NOT_RECORDED
    assert records.get(0, "new") == "c"
    assert len(records) == 1


def test_a_later_record_of_the_same_invocation_does_not_extend_its_life():
    """The record's age is that of its first recording (a client resends within its invocation
    timeout of the first send)."""
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [0], "o", now=0.0)
    records.record("i1", [1], "o", now=9.0)
    records.expire(now=10.5)
    assert records.get(1, "i1") is NOT_RECORDED


def test_an_expired_invocation_can_be_recorded_anew():
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [0], "first", now=0.0)
    records.expire(now=20.0)
    records.record("i1", [1], "second", now=20.0)
    assert records.get(0, "i1") is NOT_RECORDED
    assert records.get(1, "i1") == "second"
    records.expire(now=30.0)
    assert records.get(1, "i1") == "second"
    records.expire(now=30.5)
    assert len(records) == 0


def test_expire_on_empty_records_is_harmless():
    records = InvocationRecords(keep_s=1.0)
    records.expire(now=1e9)
    assert len(records) == 0


# -- count -----------------------------------------------------------------------------------


def test_max_records_evicts_the_oldest():
    records = InvocationRecords(keep_s=100.0, max_records=3)
    for i in range(5):
        records.record(f"i{i}", [0], i, now=float(i))
    assert len(records) == 3
    assert records.get(0, "i0") is NOT_RECORDED
    assert records.get(0, "i1") is NOT_RECORDED
    assert [records.get(0, f"i{i}") for i in (2, 3, 4)] == [2, 3, 4]


def test_adding_partitions_to_a_record_does_not_count_against_max_records():
    records = InvocationRecords(keep_s=100.0, max_records=2)
    records.record("a", [0], "a", now=0.0)
    records.record("b", [0], "b", now=1.0)
    for pid in range(1, 5):
        records.record("a", [pid], "ignored", now=2.0)
    assert len(records) == 2
    assert records.get(4, "a") == "a"
    assert records.get(0, "b") == "b"


def test_max_records_of_one_keeps_only_the_newest():
    records = InvocationRecords(keep_s=100.0, max_records=1)
    records.record("a", [0], "a", now=0.0)
    records.record("b", [0], "b", now=1.0)
    assert records.get(0, "a") is NOT_RECORDED
    assert records.get(0, "b") == "b"
    assert len(records) == 1


@pytest.mark.parametrize(("keep_s", "max_records"), [
    (0, 10), (-1.0, 10), (10.0, 0), (10.0, -5), (0.0, 0),
])
def test_constructor_rejects_non_positive_bounds(keep_s, max_records):
    with pytest.raises(ValueError):
        InvocationRecords(keep_s=keep_s, max_records=max_records)


def test_constructor_accepts_small_positive_bounds():
    records = InvocationRecords(keep_s=1e-9, max_records=1)
    assert records.keep_s == 1e-9
    assert records.max_records == 1


# -- a model ---------------------------------------------------------------------------------

_op = st.one_of(
    st.tuples(st.just("record"), st.sampled_from("abcdef"),
              st.frozensets(st.integers(0, 4), max_size=3), st.integers(0, 99),
              st.integers(0, 3)),
    st.tuples(st.just("expire"), st.integers(0, 3)),
    st.tuples(st.just("forget"), st.integers(0, 4)),
    st.tuples(st.just("forget_unknown"), st.integers(0, 4),
              st.frozensets(st.sampled_from("abcdef")), st.frozensets(st.sampled_from("abcdef"))),
    st.tuples(st.just("adopt"), st.integers(0, 4),
              st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 99)), max_size=4),
              st.integers(0, 3)),
    # Asks which invocations each partition holds: the partition index is brought up to
    # date only then (and by forget/adopt), so records come and go unindexed between looks.
    st.tuples(st.just("look")),
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(ops=st.lists(_op, max_size=40), keep_s=st.integers(1, 6),
       max_records=st.integers(1, 5))
def test_records_match_a_simple_model(ops, keep_s, max_records):
    """Against a dictionary model, with time moving forward by whole seconds."""
    records = InvocationRecords(keep_s=float(keep_s), max_records=max_records)
    model: dict[str, tuple[set[int], int, int]] = {}  # iid -> (pids, outcome, recorded at)
    now = 0

    def model_record(iid: str, pids: set[int], outcome: int) -> None:
        if iid in model and model[iid][0]:
            model[iid][0].update(pids)
        elif iid in model:  # every partition forgot it: this outcome is the first now
            model[iid] = (set(pids), outcome, model[iid][2])
        else:
            model[iid] = (set(pids), outcome, now)
            while len(model) > max_records:
                oldest = min(model, key=lambda k: model[k][2])
                # Ties in time are broken by insertion order, which dict order keeps.
                del model[oldest]

    for op in ops:
        if op[0] == "record":
            _, iid, pids, outcome, advance = op
            now += advance
            records.record(iid, pids, outcome, now=float(now))
            model_record(iid, set(pids), outcome)
        elif op[0] == "adopt":
            _, pid, owner_records, advance = op
            now += advance
            records.adopt(pid, owner_records, now=float(now))
            for iid, outcome in owner_records:
                if iid not in model or pid not in model[iid][0]:
                    model_record(iid, {pid}, outcome)
        elif op[0] == "forget":
            records.forget_partition(op[1])
            for pids, _, _ in model.values():
                pids.discard(op[1])
        elif op[0] == "forget_unknown":
            _, pid, iids, known = op
            records.forget_unknown(pid, iids, known)
            for iid in iids - known:
                if iid in model:
                    model[iid][0].discard(pid)
        elif op[0] == "look":
            for pid in range(5):
                assert records.invocations(pid) == {k for k, v in model.items() if pid in v[0]}
                assert sorted(records.of_partition(pid)) == sorted(
                    (k, v[1]) for k, v in model.items() if pid in v[0])
        else:
            now += op[1]
            records.expire(now=float(now))
            for iid in [k for k, v in model.items() if v[2] < now - keep_s]:
                del model[iid]
        assert len(records) == len(model)
        for iid in "abcdef":
            for pid in range(5):
                if iid in model and pid in model[iid][0]:
                    assert records.get(pid, iid) == model[iid][1]
                else:
                    assert records.get(pid, iid) is NOT_RECORDED
    for pid in range(5):
        assert records.invocations(pid) == {k for k, v in model.items() if pid in v[0]}
    # The index holds nothing that was forgotten.
    assert {iid for iids in records._by_pid.values() for iid in iids} <= set(model)
    assert all(records._by_pid.values())


def test_records_never_asked_for_by_partition_leave_no_index_behind():
    """Writes record their partitions; the index by partition is built only when a partition
    is asked for, so records that expire unasked never enter it, and one asked for leaves
    it when it expires."""
    records = InvocationRecords(keep_s=10.0, max_records=3)
    for i in range(10):
        records.record(f"w{i}", range(80), None, now=float(i))
    assert records._by_pid == {}
    assert records.invocations(5) == {"w7", "w8", "w9"}  # max_records kept the newest three
    records.record("w10", [1, 2], None, now=10.0)  # w7 goes, indexed; w10 is not yet
    assert set(records._by_pid[5]) == {"w8", "w9"}
    records.expire(now=100.0)
    assert len(records) == 0
    assert records._by_pid == {}
    assert records.invocations(1) == set()


def test_a_resend_recorded_before_its_first_record_was_indexed_is_indexed_whole():
    records = InvocationRecords(keep_s=10.0)
    records.record("a", [1, 2], "old", now=0.0)
    records.record("b", [3], None, now=0.0)
    records.record("a", [2, 4], "new", now=1.0)  # a resend: partitions added, first outcome
    assert records.of_partition(4) == [("a", "old")]
    assert records.invocations(1) == {"a"} and records.invocations(3) == {"b"}
    records.forget_partition(2)
    assert records.get(2, "a") is NOT_RECORDED and records.get(1, "a") == "old"
    records.expire(now=20.0)
    assert records._by_pid == {}


def test_a_second_record_of_an_invocation_indexes_nothing_else():
    """A member that backs up one part of a put_all and owns another records its invocation
    twice: the second record leaves the index alone (it used to bring every record since
    the last look into it), and a record already indexed takes its new partitions at once."""
    records = InvocationRecords(keep_s=10.0)
    records.record("a", [1, 2], None, now=0.0)
    records.record("b", [3], None, now=0.0)
    records.record("a", [4], None, now=0.0)
    assert records._by_pid == {}
    assert records.invocations(4) == {"a"} and records.invocations(3) == {"b"}
    records.record("c", [5], None, now=1.0)
    records.record("a", [6], None, now=1.0)  # indexed already: in the index at once
    assert set(records._by_pid) == {1, 2, 3, 4, 6} and records._by_pid[6] == {"a"}
    assert records.invocations(5) == {"c"}
    assert sorted(records.of_partition(6)) == [("a", None)]


def test_a_resend_that_expires_unasked_leaves_no_index_behind():
    records = InvocationRecords(keep_s=10.0)
    records.record("a", [1], None, now=0.0)
    records.record("a", [2], None, now=1.0)  # a resend, before anything asked by partition
    records.record("b", [3], None, now=1.0)
    records.expire(now=10.5)
    assert len(records) == 1 and records._by_pid == {}
    assert records.invocations(3) == {"b"} and records.invocations(2) == set()


def test_a_forgotten_partition_answers_a_resend_as_new_and_hands_nothing_on():
    """Its data was dropped or replaced by another replica's: what the record says was
    applied there may be gone, so a resend must be applied again (seed 52 kill-two of the
    simulation's batch writers: else a backup kept the record of a write that its new
    owner's copy no longer held)."""
    records = InvocationRecords(keep_s=10.0)
    records.record("i1", [3, 5], b"old", now=0.0)
    records.record("i2", [3], None, now=0.0)
    records.forget_partition(3)
    assert records.get(3, "i1") is NOT_RECORDED and records.get(3, "i2") is NOT_RECORDED
    assert records.get(5, "i1") == b"old", "the other partition still holds the write"
    assert records.of_partition(3) == []
    assert records.of_partition(5) == [("i1", b"old")]
    # Applied again to the forgotten partition: the outcome of a first attempt anywhere
    # else stays; where nothing held it any more, the new one is the first.
    records.record("i1", [3], b"newer", now=1.0)
    records.record("i2", [3], b"new", now=1.0)
    assert records.get(3, "i1") == b"old" and records.get(3, "i2") == b"new"
    records.expire(now=10.5)
    assert records.get(3, "i2") is NOT_RECORDED, "it expires by its first record's time"


def test_forget_unknown_forgets_only_what_the_owner_does_not_know_of_that_partition():
    """A replica sync made partition 3 a copy of its owner's: of the invocations recorded
    here when the request left, those the owner does not know of are gone from the copy."""
    records = InvocationRecords(keep_s=10.0)
    records.record("stale", [3, 5], b"old", now=0.0)  # the owner of 3 never had it
    records.record("known", [3], None, now=0.0)
    records.record("since", [3], None, now=1.0)  # applied after the request left
    records.forget_unknown(3, {"stale", "known", "elsewhere"}, {"known"})
    assert records.get(3, "stale") is NOT_RECORDED
    assert records.get(5, "stale") == b"old", "partition 5 still holds that write"
    assert records.get(3, "known") is None and records.get(3, "since") is None
    assert records.invocations(3) == {"known", "since"}
    records.forget_unknown(3, {"known", "since"}, set())
    assert records.invocations(3) == set() and records.of_partition(3) == []
    records.forget_unknown(3, {"known"}, set())  # nothing left of 3: harmless


def test_adopt_takes_the_owners_records_this_replica_lacks_and_keeps_its_own():
    """A replica sync brought partition 3's writes from its owner: a write recorded there and
    not here is recorded here with the owner's outcome; one recorded here keeps this
    replica's; a batch recorded here for another partition gains partition 3 and keeps its
    first outcome."""
    records = InvocationRecords(keep_s=10.0)
    records.record("mine", [3], b"here", now=0.0)
    records.record("batch", [5], None, now=0.0)
    records.adopt(3, [("missed", b"prev"), ("mine", b"owner's"), ("batch", None)], now=2.0)
    assert records.get(3, "missed") == b"prev"
    assert records.get(3, "mine") == b"here"
    assert records.get(3, "batch") is None and records.get(5, "batch") is None
    assert records.invocations(3) == {"missed", "mine", "batch"}
    records.expire(now=12.5)
    assert records.get(3, "missed") is NOT_RECORDED, "kept keep_s from when it was adopted"
