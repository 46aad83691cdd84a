"""Backup streams (grid/cluster/replication.py): the owner's numbered, retransmitted backup
operations and the backup's go-back-N receiver."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.cluster.replication import (
    RESULTS_KEPT,
    RETRANSMIT_S_MAX,
    RETRANSMIT_S_MIN,
    Arrival,
    BackupInbox,
    BackupStreams,
)

# -- BackupStreams: numbering ----------------------------------------------------------------


def test_sequence_numbers_start_at_one_and_increase_per_member_independently():
    streams = BackupStreams()
    a1 = streams.add("a", {"k": 1}, [b"x"], now=0.0)
    a2 = streams.add("a", {"k": 2}, [], now=0.0)
    b1 = streams.add("b", {"k": 3}, [], now=0.0)
    a3 = streams.add("a", {"k": 4}, [], now=0.0)
    b2 = streams.add("b", {"k": 5}, [], now=0.0)
    assert [a1.seq, a2.seq, a3.seq] == [1, 2, 3]
    assert [b1.seq, b2.seq] == [1, 2]


def test_added_op_carries_its_seq_in_its_fields_without_touching_the_callers_dict():
    streams = BackupStreams()
    fields = {"ns": "m", "kind": "put"}
    frames = [b"payload"]
    op = streams.add("a", fields, frames, now=0.0)
    assert op.fields == {"ns": "m", "kind": "put", "seq": 1}
    assert op.frames == [b"payload"]
    assert fields == {"ns": "m", "kind": "put"}, "the caller's fields are not modified"


def test_acked_numbering_does_not_restart_after_everything_is_acknowledged():
    streams = BackupStreams()
    for _ in range(3):
        op = streams.add("a", {}, [], now=0.0)
        assert streams.acked("a", op.seq) is op
    assert streams.add("a", {}, [], now=0.0).seq == 4


# -- BackupStreams: acknowledgement ------------------------------------------------------------


def test_acked_removes_and_returns_the_op():
    streams = BackupStreams()
    op1 = streams.add("a", {}, [], now=0.0)
    op2 = streams.add("a", {}, [], now=0.0)
    assert streams.unacked_count("a") == 2
    assert streams.acked("a", 1) is op1
    assert streams.unacked_count("a") == 1
    assert streams.acked("a", 2) is op2
    assert streams.unacked_count("a") == 0


def test_acked_returns_none_for_a_duplicate_ack():
    streams = BackupStreams()
    op = streams.add("a", {}, [], now=0.0)
    assert streams.acked("a", op.seq) is op
    assert streams.acked("a", op.seq) is None


def test_acked_returns_none_for_an_unknown_member_or_seq():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    assert streams.acked("nobody", 1) is None
    assert streams.acked("a", 99) is None
    assert streams.acked("a", 0) is None
    assert streams.unacked_count("a") == 1, "a stray ack removes nothing"


def test_acks_out_of_order_leave_the_rest_in_sequence_order():
    streams = BackupStreams()
    for _ in range(5):
        streams.add("a", {}, [], now=0.0)
    streams.acked("a", 2)
    streams.acked("a", 4)
    due = dict(streams.due(now=RETRANSMIT_S_MIN))
    assert [op.seq for op in due["a"]] == [1, 3, 5]


def test_unacked_count_totals_all_members_or_one_member():
    streams = BackupStreams()
    for _ in range(3):
        streams.add("a", {}, [], now=0.0)
    for _ in range(2):
        streams.add("b", {}, [], now=0.0)
    assert streams.unacked_count() == 5
    assert streams.unacked_count("a") == 3
    assert streams.unacked_count("b") == 2
    assert streams.unacked_count("unknown") == 0
    assert BackupStreams().unacked_count() == 0


# -- BackupStreams: retransmission -----------------------------------------------------------


def test_nothing_is_due_before_the_retry_time():
    streams = BackupStreams()
    streams.add("a", {}, [], now=10.0)
    assert list(streams.due(now=10.0)) == []
    assert list(streams.due(now=10.0 + RETRANSMIT_S_MIN / 2)) == []


def test_due_yields_unacked_ops_in_sequence_order_once_the_retry_time_has_come():
    streams = BackupStreams()
    ops = [streams.add("a", {"i": i}, [], now=10.0) for i in range(4)]
    due = list(streams.due(now=10.0 + RETRANSMIT_S_MIN))
    assert len(due) == 1
    member, sent = due[0]
    assert member == "a"
    assert sent == ops
    assert [op.seq for op in sent] == [1, 2, 3, 4]


def test_due_returns_a_copy_so_acks_while_sending_are_safe():
    streams = BackupStreams()
    for _ in range(3):
        streams.add("a", {}, [], now=0.0)
    (_, ops), = streams.due(now=1.0)
    for op in ops:
        streams.acked("a", op.seq)
    assert [op.seq for op in ops] == [1, 2, 3]
    assert streams.unacked_count() == 0


def test_an_empty_stream_is_never_due():
    streams = BackupStreams()
    op = streams.add("a", {}, [], now=0.0)
    streams.acked("a", op.seq)
    assert list(streams.due(now=100.0)) == []


def test_only_streams_whose_retry_time_came_are_due():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    streams.add("b", {}, [], now=10.0)
    assert [m for m, _ in streams.due(now=5.0)] == ["a"]
    assert "b" not in [m for m, _ in streams.due(now=10.0 + RETRANSMIT_S_MIN * 0.99)]
    assert "b" in [m for m, _ in streams.due(now=10.0 + RETRANSMIT_S_MIN)]


def test_retransmission_backs_off_doubling_up_to_the_cap():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    # The first retry comes RETRANSMIT_S_MIN after the add, then each waits twice as long as
    # the one before, up to RETRANSMIT_S_MAX.
    intervals = [RETRANSMIT_S_MIN]
    backoff = RETRANSMIT_S_MIN
    while len(intervals) < 12:
        intervals.append(backoff)
        backoff = min(backoff * 2, RETRANSMIT_S_MAX)
    assert intervals[:7] == [0.05, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0]
    at = 0.0
    for interval in intervals:
        at += interval
        assert list(streams.due(at - 1e-9)) == [], at
        assert [m for m, _ in streams.due(at)] == ["a"], at
    assert list(streams.due(at + RETRANSMIT_S_MAX - 1e-9)) == []
    assert list(streams.due(at + RETRANSMIT_S_MAX))


def test_retransmission_intervals_exactly():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    assert list(streams.due(0.0499)) == []
    assert list(streams.due(0.05))  # retry_at = 0.05; next interval MIN
    assert list(streams.due(0.0999)) == []
    assert list(streams.due(0.10))  # next interval 0.1
    assert list(streams.due(0.1999)) == []
    assert list(streams.due(0.20))  # next interval 0.2
    assert list(streams.due(0.3999)) == []
    assert list(streams.due(0.40))


def test_back_off_is_capped_at_retransmit_s_max():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    now = 0.0
    for _ in range(30):  # far more doublings than needed to reach the cap
        now += RETRANSMIT_S_MAX
        assert list(streams.due(now)), "with the cap, every RETRANSMIT_S_MAX something is due"
    assert list(streams.due(now + RETRANSMIT_S_MAX * 0.99)) == []
    assert list(streams.due(now + RETRANSMIT_S_MAX))


def test_an_ack_resets_the_back_off():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    streams.add("a", {}, [], now=0.0)
    now = 0.0
    for _ in range(8):  # back off to the cap
        now += RETRANSMIT_S_MAX
        assert list(streams.due(now))
    # Next retry is scheduled RETRANSMIT_S_MAX after `now`; an ack in between resets the
    # back-off, so the retry after that one comes only RETRANSMIT_S_MIN later.
    streams.acked("a", 1)
    now += RETRANSMIT_S_MAX
    (_, ops), = streams.due(now)
    assert [op.seq for op in ops] == [2]
    assert list(streams.due(now + RETRANSMIT_S_MIN * 0.99)) == []
    assert list(streams.due(now + RETRANSMIT_S_MIN))


def test_a_stale_ack_does_not_reset_the_back_off():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    streams.add("a", {}, [], now=0.0)
    streams.acked("a", 1)
    now = 0.0
    for _ in range(8):
        now += RETRANSMIT_S_MAX
        assert list(streams.due(now))
    assert streams.acked("a", 1) is None  # a duplicate ack: the backup took nothing new
    now += RETRANSMIT_S_MAX
    assert list(streams.due(now))
    assert list(streams.due(now + RETRANSMIT_S_MAX * 0.99)) == []


def test_a_new_op_on_an_empty_stream_restarts_the_clock_at_the_minimum():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    now = 0.0
    for _ in range(8):
        now += RETRANSMIT_S_MAX
        assert list(streams.due(now))
    streams.acked("a", 1)
    streams.add("a", {}, [], now=100.0)
    assert list(streams.due(100.0 + RETRANSMIT_S_MIN * 0.99)) == []
    (_, ops), = streams.due(100.0 + RETRANSMIT_S_MIN)
    assert [op.seq for op in ops] == [2]
    assert list(streams.due(100.0 + 2 * RETRANSMIT_S_MIN))  # back-off starts at MIN again


def test_a_new_op_behind_waiting_ones_does_not_postpone_the_retry():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    streams.add("a", {}, [], now=0.04)
    (_, ops), = streams.due(RETRANSMIT_S_MIN)
    assert [op.seq for op in ops] == [1, 2]


def test_send_failed_brings_the_retry_forward():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    now = 0.0
    for _ in range(8):
        now += RETRANSMIT_S_MAX
        assert list(streams.due(now))
    # The next retry would be RETRANSMIT_S_MAX away; a failed send makes it MIN away.
    streams.send_failed("a", now + 0.01)
    assert list(streams.due(now + 0.01 + RETRANSMIT_S_MIN * 0.99)) == []
    assert list(streams.due(now + 0.01 + RETRANSMIT_S_MIN))


def test_send_failed_never_postpones_the_retry():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    streams.send_failed("a", now=0.04)  # would be 0.09: the earlier 0.05 stays
    assert list(streams.due(RETRANSMIT_S_MIN))


def test_send_failed_for_an_unknown_member_is_harmless():
    streams = BackupStreams()
    streams.send_failed("nobody", now=0.0)
    assert list(streams.due(100.0)) == []
    assert streams.unacked_count() == 0


def test_drop_forgets_a_member_and_its_unacked_ops():
    streams = BackupStreams()
    streams.add("a", {}, [], now=0.0)
    streams.add("a", {}, [], now=0.0)
    streams.add("b", {}, [], now=0.0)
    streams.drop("a")
    assert streams.unacked_count("a") == 0
    assert streams.unacked_count() == 1
    assert [m for m, _ in streams.due(now=10.0)] == ["b"]
    assert streams.acked("a", 1) is None
    assert streams.add("a", {}, [], now=0.0).seq == 1, "a member seen again starts a new stream"


def test_drop_of_an_unknown_member_is_harmless():
    streams = BackupStreams()
    streams.drop("nobody")
    assert streams.unacked_count() == 0


def _hold(inbox: BackupInbox, sender: str, seq: int, request: object) -> None:
    """Hold an arriving operation as the shell does: only after ``arrive`` said it is the
    next in sequence (PROCESS, with the table behind, or HOLD)."""
    assert inbox.arrive(sender, seq)[0] in (Arrival.PROCESS, Arrival.HOLD)
    inbox.hold(sender, seq, request)


# -- BackupInbox: classification -------------------------------------------------------------


def test_the_first_expected_seq_is_one_and_is_processed():
    inbox = BackupInbox()
    assert inbox.arrive("o", 1) == (Arrival.PROCESS, None)


def test_a_later_seq_is_a_gap():
    inbox = BackupInbox()
    assert inbox.arrive("o", 2) == (Arrival.GAP, None)
    inbox.processed("o", 1, "r1")
    assert inbox.arrive("o", 3) == (Arrival.GAP, None)
    assert inbox.arrive("o", 2) == (Arrival.PROCESS, None)


def test_a_gap_does_not_advance_the_expected_seq():
    inbox = BackupInbox()
    assert inbox.arrive("o", 5)[0] == Arrival.GAP
    assert inbox.arrive("o", 1)[0] == Arrival.PROCESS


def test_a_processed_seq_arriving_again_is_a_duplicate_with_its_result():
    inbox = BackupInbox()
    inbox.processed("o", 1, ["refused", 3])
    inbox.processed("o", 2, [])
    assert inbox.arrive("o", 1) == (Arrival.DUPLICATE, ["refused", 3])
    assert inbox.arrive("o", 2) == (Arrival.DUPLICATE, [])
    assert inbox.arrive("o", 3) == (Arrival.PROCESS, None)


def test_arrive_does_not_change_the_state():
    inbox = BackupInbox()
    for _ in range(3):
        assert inbox.arrive("o", 1) == (Arrival.PROCESS, None)
    inbox.processed("o", 1, "r")
    for _ in range(3):
        assert inbox.arrive("o", 2) == (Arrival.PROCESS, None)
        assert inbox.arrive("o", 1) == (Arrival.DUPLICATE, "r")


def test_senders_are_independent():
    inbox = BackupInbox()
    inbox.processed("a", 1, "ra")
    inbox.processed("a", 2, "ra2")
    assert inbox.arrive("b", 1) == (Arrival.PROCESS, None)
    assert inbox.arrive("b", 2) == (Arrival.GAP, None)
    assert inbox.arrive("a", 1) == (Arrival.DUPLICATE, "ra")
    assert inbox.arrive("a", 3) == (Arrival.PROCESS, None)


def test_hold_advances_the_expected_seq_and_later_ones_hold_behind_it():
    inbox = BackupInbox()
    assert inbox.arrive("o", 1) == (Arrival.PROCESS, None)
    inbox.hold("o", 1, "req1")  # the shell holds it: its table is behind the owner's
    assert inbox.arrive("o", 2) == (Arrival.HOLD, None)
    inbox.hold("o", 2, "req2")
    assert inbox.arrive("o", 3) == (Arrival.HOLD, None)
    assert inbox.arrive("o", 4) == (Arrival.GAP, None)


def test_a_duplicate_of_a_held_op_is_pending():
    inbox = BackupInbox()
    _hold(inbox, "o", 1, "req1")
    _hold(inbox, "o", 2, "req2")
    assert inbox.arrive("o", 1) == (Arrival.PENDING, None)
    assert inbox.arrive("o", 2) == (Arrival.PENDING, None)


def test_hold_of_anything_but_the_expected_seq_is_refused():
    inbox = BackupInbox()
    inbox.arrive("o", 1)
    with pytest.raises(AssertionError):
        inbox.hold("o", 2, "req")


def test_replace_held_answers_the_newest_request():
    inbox = BackupInbox()
    _hold(inbox, "o", 1, "first")
    _hold(inbox, "o", 2, "second")
    inbox.replace_held("o", 2, "second again")
    inbox.replace_held("o", 7, "never held")  # not held: nothing happens
    (sender, queue), = inbox.held()
    assert sender == "o"
    assert [(h.seq, h.request) for h in queue] == [(1, "first"), (2, "second again")]


def test_held_yields_only_senders_with_held_ops_oldest_first():
    inbox = BackupInbox()
    inbox.processed("a", 1, None)
    _hold(inbox, "b", 1, "b1")
    _hold(inbox, "b", 2, "b2")
    inbox.processed("c", 1, None)
    _hold(inbox, "c", 2, "c2")
    held = {sender: [h.seq for h in queue] for sender, queue in inbox.held()}
    assert held == {"b": [1, 2], "c": [2]}


def test_processing_held_ops_like_the_shell_turns_them_into_duplicates():
    """The shell pops the head of a held queue, then reports it processed."""
    inbox = BackupInbox()
    _hold(inbox, "o", 1, "r1")
    _hold(inbox, "o", 2, "r2")
    (_, queue), = inbox.held()
    held_op = queue.popleft()
    inbox.processed("o", held_op.seq, "result1")
    assert inbox.arrive("o", 1) == (Arrival.DUPLICATE, "result1")
    assert inbox.arrive("o", 2) == (Arrival.PENDING, None)
    assert inbox.arrive("o", 3) == (Arrival.HOLD, None), "still behind the held one"
    queue.popleft()
    inbox.processed("o", 2, "result2")
    assert list(inbox.held()) == []
    assert inbox.arrive("o", 2) == (Arrival.DUPLICATE, "result2")
    assert inbox.arrive("o", 3) == (Arrival.PROCESS, None)


def test_processed_held_op_does_not_advance_the_expected_seq_twice():
    inbox = BackupInbox()
    _hold(inbox, "o", 1, "r1")
    (_, queue), = inbox.held()
    queue.popleft()
    inbox.processed("o", 1, "x")
    assert inbox.arrive("o", 2) == (Arrival.PROCESS, None)
    assert inbox.arrive("o", 3) == (Arrival.GAP, None)


def test_forget_ends_a_senders_stream():
    inbox = BackupInbox()
    inbox.processed("o", 1, "r1")
    _hold(inbox, "o", 2, "r2")
    inbox.forget("o")
    assert list(inbox.held()) == []
    assert inbox.arrive("o", 1) == (Arrival.PROCESS, None), "a new stream starts at 1"
    inbox.forget("nobody")  # harmless


def test_results_are_kept_for_the_last_results_kept_ops_only():
    inbox = BackupInbox()
    total = RESULTS_KEPT + 10
    for seq in range(1, total + 1):
        inbox.processed("o", seq, f"r{seq}")
    # The oldest 10 are forgotten: still duplicates, but answered without a result.
    for seq in range(1, 11):
        assert inbox.arrive("o", seq) == (Arrival.DUPLICATE, None)
    assert inbox.arrive("o", 11) == (Arrival.DUPLICATE, "r11")
    assert inbox.arrive("o", total) == (Arrival.DUPLICATE, f"r{total}")
    assert len(inbox._inboxes["o"].results) == RESULTS_KEPT
    assert inbox.arrive("o", total + 1) == (Arrival.PROCESS, None)


def test_results_bound_is_per_sender():
    inbox = BackupInbox()
    inbox.processed("a", 1, "a1")
    for seq in range(1, RESULTS_KEPT + 2):
        inbox.processed("b", seq, seq)
    assert inbox.arrive("a", 1) == (Arrival.DUPLICATE, "a1")
    assert inbox.arrive("b", 1) == (Arrival.DUPLICATE, None)


# -- the two together, over a lossy, duplicating, reordering network ---------------------------


def _run_lossy_stream(seed: int, ops: int, loss: float, dup: float, hold: float,
                      max_steps: int) -> list[int]:
    """One owner streams ``ops`` operations to one backup across a network that loses,
    duplicates and reorders both the operations and the acks. The owner sends each new one
    once and then retransmits whatever ``due`` says; the backup acts like the shell
    (workers/map_service.py): it processes, holds (as if its table were behind), answers
    duplicates from memory and drops gaps. After ``max_steps`` the network heals and the
    stream drains. Returns the order in which the backup processed operations."""
    rng = random.Random(seed)
    streams, inbox = BackupStreams(), BackupInbox()
    to_backup: list[tuple[int, str]] = []  # in flight: (seq, payload)
    to_owner: list[tuple[int, object]] = []  # in flight: (seq, result)
    processed: list[int] = []
    acked_results: dict[int, object] = {}
    added = 0
    now = 0.0

    def send(seq: int, payload: str) -> None:
        if rng.random() < loss:
            return
        copies = 2 if rng.random() < dup else 1
        for _ in range(copies):
            to_backup.insert(rng.randrange(len(to_backup) + 1), (seq, payload))

    def answer(seq: int, result: object) -> None:
        if rng.random() < loss:
            return
        copies = 2 if rng.random() < dup else 1
        for _ in range(copies):
            to_owner.insert(rng.randrange(len(to_owner) + 1), (seq, result))

    def process(seq: int, payload: str) -> None:
        assert payload == f"op{seq}", "a sequence number always names the same operation"
        processed.append(seq)
        result = f"result{seq}"
        inbox.processed("o", seq, result)
        answer(seq, result)

    for _ in range(max_steps):
        if added == ops and streams.unacked_count() == 0:
            break
        now += rng.choice((0.0, 0.01, 0.03, 0.1, 0.5))
        action = rng.random()
        if action < 0.2 and added < ops:
            op = streams.add("b", {"payload": f"op{added + 1}"}, [], now)
            added += 1
            send(op.seq, op.fields["payload"])
        elif action < 0.55 and to_backup:
            seq, payload = to_backup.pop(rng.randrange(len(to_backup)))
            arrival, result = inbox.arrive("o", seq)
            if arrival == Arrival.PROCESS and rng.random() >= hold:
                process(seq, payload)
            elif arrival in (Arrival.PROCESS, Arrival.HOLD):
                inbox.hold("o", seq, payload)
            elif arrival == Arrival.PENDING:
                inbox.replace_held("o", seq, payload)
            elif arrival == Arrival.DUPLICATE:
                answer(seq, result)
            else:
                assert arrival == Arrival.GAP
        elif action < 0.7:
            # The backup's table caught up: process held ones, oldest first.
            for sender, queue in list(inbox.held()):
                while queue and rng.random() < 0.8:
                    held_op = queue.popleft()
                    assert sender == "o"
                    process(held_op.seq, held_op.request)
        elif action < 0.85 and to_owner:
            seq, result = to_owner.pop(rng.randrange(len(to_owner)))
            op = streams.acked("b", seq)
            if op is not None:
                assert seq not in acked_results, "an op is acknowledged once"
                acked_results[seq] = result
        else:
            for member, due_ops in streams.due(now):
                assert member == "b"
                seqs = [op.seq for op in due_ops]
                assert seqs == sorted(seqs)
                for op in due_ops:
                    send(op.seq, op.fields["payload"])
    # Let the network heal so that the run always completes: no more loss, drain everything.
    loss, dup = 0.0, 0.0
    for _ in range(10_000):
        if added == ops and streams.unacked_count() == 0:
            break
        while added < ops:
            op = streams.add("b", {"payload": f"op{added + 1}"}, [], now)
            added += 1
            send(op.seq, op.fields["payload"])
        now += RETRANSMIT_S_MAX
        for _member, due_ops in streams.due(now):
            for op in due_ops:
                send(op.seq, op.fields["payload"])
        for sender, queue in list(inbox.held()):
            while queue:
                held_op = queue.popleft()
                assert sender == "o"
                process(held_op.seq, held_op.request)
        to_backup.sort()  # in order, so that a healed network makes progress
        while to_backup:
            seq, payload = to_backup.pop(0)
            arrival, result = inbox.arrive("o", seq)
            if arrival == Arrival.PROCESS:
                process(seq, payload)
            elif arrival == Arrival.DUPLICATE:
                answer(seq, result)
            assert arrival != Arrival.HOLD and arrival != Arrival.PENDING
        while to_owner:
            seq, result = to_owner.pop(0)
            if streams.acked("b", seq) is not None:
                acked_results[seq] = result
    assert streams.unacked_count() == 0, "the stream drains once the network heals"
    assert [acked_results[s] for s in sorted(acked_results)] == \
        [f"result{s}" for s in range(1, ops + 1)], "every ack carries the op's first result"
    return processed


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    ops=st.integers(min_value=1, max_value=25),
    loss=st.sampled_from([0.0, 0.1, 0.3, 0.6]),
    dup=st.sampled_from([0.0, 0.2, 0.5]),
    hold=st.sampled_from([0.0, 0.2, 0.5]),
)
def test_lossy_duplicating_reordering_delivery_processes_every_op_exactly_once_in_order(
        seed, ops, loss, dup, hold):
    processed = _run_lossy_stream(seed, ops, loss, dup, hold, max_steps=400)
    assert processed == list(range(1, ops + 1))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    deliveries=st.lists(
        st.tuples(st.booleans(), st.booleans(), st.integers(0, 7)),  # lost, duplicated, delay
        min_size=1, max_size=200),
    acks_lost=st.lists(st.booleans(), min_size=1, max_size=200),
    ops=st.integers(min_value=1, max_value=12),
)
def test_explicit_loss_patterns_never_break_exactly_once_in_order(deliveries, acks_lost, ops):
    """A variant with the loss, duplication and delay of every message drawn by hypothesis
    itself (so that it shrinks to a minimal pattern), on a discrete clock."""
    streams, inbox = BackupStreams(), BackupInbox()
    processed: list[int] = []
    in_flight: list[tuple[int, int]] = []  # (arrival tick, seq)
    acks: list[tuple[int, int]] = []
    sends = acks_sent = 0
    tick = 0

    def send(seq: int) -> None:
        nonlocal sends
        lost, duplicated, delay = deliveries[sends % len(deliveries)]
        sends += 1
        if lost and sends <= len(deliveries):  # patterns apply once; later the network heals
            return
        in_flight.append((tick + delay, seq))
        if duplicated:
            in_flight.append((tick + delay + 1, seq))

    def ack(seq: int) -> None:
        nonlocal acks_sent
        lost = acks_lost[acks_sent % len(acks_lost)]
        acks_sent += 1
        if not (lost and acks_sent <= len(acks_lost)):
            acks.append((tick + 1, seq))

    for _ in range(ops):
        send(streams.add("b", {}, [], now=0.0).seq)
    for tick in range(1, 2000):
        now = tick * RETRANSMIT_S_MIN
        for arrival_tick, seq in sorted(m for m in in_flight if m[0] <= tick):
            in_flight.remove((arrival_tick, seq))
            kind, _ = inbox.arrive("o", seq)
            if kind == Arrival.PROCESS:
                processed.append(seq)
                inbox.processed("o", seq, seq)
                ack(seq)
            elif kind == Arrival.DUPLICATE:
                ack(seq)
        for arrival_tick, seq in [m for m in acks if m[0] <= tick]:
            acks.remove((arrival_tick, seq))
            streams.acked("b", seq)
        for _, due_ops in streams.due(now):
            for op in due_ops:
                send(op.seq)
        if streams.unacked_count() == 0 and not in_flight:
            break
    assert streams.unacked_count() == 0
    assert processed == list(range(1, ops + 1))
