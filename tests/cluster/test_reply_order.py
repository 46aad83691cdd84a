"""Reply order (grid/cluster/reply_order.py): an answer about a (partition, namespace) slot
waits behind the earlier writes to that slot; a ticket goes when ready and first in all of its
slots."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from grid.cluster.reply_order import ReplyOrder, Ticket

A, B, C = (0, "m"), (1, "m"), (0, "other")  # (0, "m") and (0, "other") are distinct slots


def unready(*slots, name: str = "") -> Ticket:
    """A write still waiting for a synchronous backup."""
    ticket = Ticket(slots, [(name.encode(), name)])
    ticket.waiting = {"backup": {slots[0][0]}}
    return ticket


def ready(*slots, name: str = "") -> Ticket:
    return Ticket(slots, [(name.encode(), name)])


def make_ready(ticket: Ticket) -> None:
    ticket.waiting.clear()
    ticket.needs_lease = False


# -- Ticket ----------------------------------------------------------------------------------


def test_a_ticket_with_nothing_to_wait_for_is_ready():
    assert ready(A).ready


def test_a_ticket_waiting_for_a_backup_or_the_lease_is_not_ready():
    t = unready(A)
    assert not t.ready
    t2 = ready(A)
    t2.needs_lease = True
    assert not t2.ready
    make_ready(t)
    make_ready(t2)
    assert t.ready and t2.ready


def test_a_failed_ticket_is_ready_whatever_it_waits_for():
    t = unready(A)
    t.needs_lease = True
    t.fail("CODE", "msg")
    assert t.ready
    assert t.failed == ("CODE", "msg")


def test_the_first_failure_is_kept():
    t = unready(A)
    t.fail("FIRST", "one")
    t.fail("SECOND", "two")
    assert t.failed == ("FIRST", "one")


def test_ticket_slots_are_deduplicated_in_order():
    t = Ticket([B, A, B, A, C], [])
    assert t.slots == (B, A, C)


def test_ticket_defaults():
    t = Ticket([A], [])
    assert t.fields == {} and t.frames == [] and t.outcome is None
    assert t.waiting == {} and not t.needs_lease and t.failed is None
    assert t.iid is None and t.written == set()


# -- busy, len, pending ----------------------------------------------------------------------


def test_an_empty_order_is_not_busy():
    order = ReplyOrder()
    assert not order.busy([A, B])
    assert not order.busy([])
    assert len(order) == 0
    assert list(order.pending()) == []


def test_busy_while_any_of_the_slots_has_a_ticket():
    order = ReplyOrder()
    t = unready(A)
    order.enqueue(t)
    assert order.busy([A])
    assert order.busy([B, A])
    assert not order.busy([B])
    assert not order.busy([C]), "same partition, other namespace: another slot"
    make_ready(t)
    assert order.release([A]) == [t]
    assert not order.busy([A])


def test_len_counts_a_ticket_in_several_slots_once():
    order = ReplyOrder()
    order.enqueue(unready(A, B))
    order.enqueue(unready(B))
    order.enqueue(unready(C))
    assert len(order) == 3


def test_pending_yields_each_pending_ticket_once_oldest_first_per_slot():
    order = ReplyOrder()
    t1, t2, t3, t4 = unready(A, B), unready(B), unready(A, C), unready(C)
    for t in (t1, t2, t3, t4):
        order.enqueue(t)
    pending = list(order.pending())
    assert len(pending) == 4
    assert {id(t) for t in pending} == {id(t) for t in (t1, t2, t3, t4)}
    for slot in (A, B, C):
        in_slot = [t for t in pending if slot in t.slots]
        assert in_slot == [t for t in (t1, t2, t3, t4) if slot in t.slots]


def test_pending_may_be_consumed_while_tickets_are_released():
    """The shell releases tickets while iterating over list(pending())."""
    order = ReplyOrder()
    tickets = [unready(A), unready(A, B), unready(B)]
    for t in tickets:
        order.enqueue(t)
    released = []
    for t in list(order.pending()):
        make_ready(t)
        released += order.release(t.slots)
    assert released == tickets
    assert len(order) == 0


# -- release ---------------------------------------------------------------------------------


def test_release_of_empty_or_unknown_slots_gives_nothing():
    order = ReplyOrder()
    assert order.release([]) == []
    assert order.release([A, B]) == []


def test_a_ready_ticket_alone_in_its_slot_is_released():
    order = ReplyOrder()
    t = ready(A)
    order.enqueue(t)
    assert order.release([A]) == [t]
    assert len(order) == 0
    assert order.release([A]) == [], "released once"


def test_an_unready_ticket_is_not_released():
    order = ReplyOrder()
    t = unready(A)
    order.enqueue(t)
    assert order.release([A]) == []
    assert len(order) == 1
    make_ready(t)
    assert order.release([A]) == [t]


def test_a_ticket_behind_an_unready_one_waits_until_the_first_is_ready():
    order = ReplyOrder()
    first, second = unready(A), ready(A)
    order.enqueue(first)
    order.enqueue(second)
    assert order.release([A]) == []
    assert order.busy([A]) and len(order) == 2
    make_ready(first)
    assert order.release([A]) == [first, second]
    assert not order.busy([A])


def test_a_ready_first_ticket_is_released_and_an_unready_second_stays():
    order = ReplyOrder()
    first, second = ready(A), unready(A)
    order.enqueue(first)
    order.enqueue(second)
    assert order.release([A]) == [first]
    assert list(order.pending()) == [second]


def test_tickets_in_different_slots_do_not_wait_for_each_other():
    order = ReplyOrder()
    blocked, free = unready(A), ready(B)
    order.enqueue(blocked)
    order.enqueue(free)
    assert order.release([B]) == [free]
    assert order.release([A]) == []


def test_a_ticket_spanning_two_slots_goes_only_when_first_in_both():
    order = ReplyOrder()
    in_b = unready(B)
    both = ready(A, B)
    order.enqueue(in_b)
    order.enqueue(both)
    assert order.release([A]) == [], "first in A, but behind an unready ticket in B"
    assert order.release([A, B]) == []
    make_ready(in_b)
    assert order.release([B]) == [in_b, both]
    assert len(order) == 0


def test_a_ticket_spanning_two_slots_is_first_in_one_and_blocked_in_the_other():
    order = ReplyOrder()
    in_a = unready(A)
    both = ready(A, B)
    after_in_b = ready(B)
    order.enqueue(in_a)
    order.enqueue(both)
    order.enqueue(after_in_b)
    assert order.release([B]) == [], "B's head waits for A's head"
    make_ready(in_a)
    assert order.release([A]) == [in_a, both, after_in_b]


def test_release_cascades_across_slots():
    """A chain A -> (A, B) -> (B, C) -> C: readying the head in A releases the whole chain,
    even though only slot A is named."""
    order = ReplyOrder()
    head = unready(A)
    chain = [head, ready(A, B), ready(B, C), ready(C)]
    for t in chain:
        order.enqueue(t)
    assert order.release([A, B, C]) == []
    make_ready(head)
    assert order.release([A]) == chain
    assert len(order) == 0
    assert not order.busy([A, B, C])


def test_release_cascade_stops_at_an_unready_ticket():
    order = ReplyOrder()
    head, middle = unready(A), unready(B, C)
    tickets = [head, ready(A, B), middle, ready(C), ready(A)]
    for t in tickets:
        order.enqueue(t)
    make_ready(head)
    assert order.release([A]) == [head, tickets[1], tickets[4]]
    assert list(order.pending()) == [middle, tickets[3]]
    make_ready(middle)
    assert order.release([B]) == [middle, tickets[3]]


def test_failed_tickets_count_as_ready():
    order = ReplyOrder()
    failed, after = unready(A), ready(A)
    order.enqueue(failed)
    order.enqueue(after)
    failed.fail("WRONG_TARGET", "ownership changed")
    assert order.release([A]) == [failed, after]
    assert failed.failed == ("WRONG_TARGET", "ownership changed")


def test_a_ticket_needing_the_lease_waits_and_blocks_those_behind():
    order = ReplyOrder()
    alone = ready(A)
    alone.needs_lease = True
    after = ready(A)
    order.enqueue(alone)
    order.enqueue(after)
    assert order.release([A]) == []
    alone.needs_lease = False
    assert order.release([A]) == [alone, after]


def test_a_ticket_enqueued_with_duplicate_slots_is_queued_once_per_slot():
    order = ReplyOrder()
    t = ready(A, A, B)
    order.enqueue(t)
    assert order.release([A]) == [t]
    assert not order.busy([A, B])


def test_an_unready_ticket_with_no_slots_waits_until_it_is_ready():
    order = ReplyOrder()
    t = Ticket([], [])
    t.waiting["backup"] = {0}
    order.enqueue(t)
    assert len(order) == 1 and list(order.pending()) == [t]
    assert not order.busy([A]) and order.release([]) == []
    t.waiting.clear()
    assert order.release([]) == [t]
    assert len(order) == 0


def test_a_ready_ticket_with_no_slots_is_released():
    order = ReplyOrder()
    t = Ticket([], [(b"client", 1)], {"wrong": [0]})
    assert t.ready
    order.enqueue(t)
    assert order.release(t.slots) == [t]


def test_slots_may_be_any_iterable():
    order = ReplyOrder()
    t = ready(A, B)
    order.enqueue(t)
    assert order.busy(s for s in [B])
    assert order.release(s for s in [A]) == [t]


# -- property --------------------------------------------------------------------------------

SLOTS = [(0, "m"), (1, "m"), (0, "n"), (2, "m")]

_ticket_slots = st.lists(st.sampled_from(SLOTS), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    tickets=st.lists(_ticket_slots, min_size=1, max_size=15),
    seed=st.integers(0, 2**32 - 1),
    fail_share=st.sampled_from([0.0, 0.3]),
    ready_at_once_share=st.sampled_from([0.0, 0.3]),
)
def test_random_tickets_are_released_in_fifo_order_per_slot_exactly_once(
        tickets, seed, fail_share, ready_at_once_share):
    """Tickets over a few slots are enqueued and made ready (or failed) in a random
    interleaving, the shell's way: each newly ready ticket's slots are released at once.
    Then: nothing unready is ever released; in every slot tickets leave in the order they
    entered; after each release nothing answerable is left behind; and once all are ready,
    every ticket has been released exactly once."""
    rng = random.Random(seed)
    order = ReplyOrder()
    made = [Ticket(slots, [(b"c", i)]) for i, slots in enumerate(tickets)]
    entered: dict[tuple[int, str], list[int]] = {}  # slot -> ticket indexes, in entry order
    left: dict[tuple[int, str], list[int]] = {}
    released: list[int] = []
    enqueued: list[int] = []
    to_enqueue = list(range(len(made)))
    unready_ones: list[int] = []
    index = {id(t): i for i, t in enumerate(made)}

    def take(out: list[Ticket]) -> None:
        for t in out:
            assert t.ready, "an unready ticket was released"
            i = index[id(t)]
            released.append(i)
            for slot in t.slots:
                left.setdefault(slot, []).append(i)

    def nothing_answerable_left() -> None:
        gone = set(released)
        heads = {slot: next(i for i in ins if i not in gone)
                 for slot, ins in entered.items() if not set(ins) <= gone}
        for t in order.pending():
            i = index[id(t)]
            assert not (t.ready and all(heads[s] == i for s in t.slots)), \
                "a ready ticket first in all its slots was left behind"

    while to_enqueue or unready_ones:
        if to_enqueue and (not unready_ones or rng.random() < 0.5):
            i = to_enqueue.pop(0)
            t = made[i]
            if rng.random() >= ready_at_once_share:
                t.waiting = {"backup": {t.slots[0][0]}}
                unready_ones.append(i)
            enqueued.append(i)
            for slot in t.slots:
                entered.setdefault(slot, []).append(i)
            order.enqueue(t)
            take(order.release(t.slots))
        else:
            i = unready_ones.pop(rng.randrange(len(unready_ones)))
            t = made[i]
            if rng.random() < fail_share:
                t.fail("E", "failed")
            else:
                t.waiting.clear()
            take(order.release(t.slots))
        nothing_answerable_left()
        assert len(order) == len(enqueued) - len(released)
        for t in order.pending():
            assert index[id(t)] not in released
    assert sorted(released) == list(range(len(made))), "every ticket released exactly once"
    assert len(order) == 0
    assert not order.busy(SLOTS)
    for slot, order_in in entered.items():
        assert left[slot] == order_in, f"slot {slot} did not keep its FIFO order"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    tickets=st.lists(_ticket_slots, min_size=1, max_size=12),
    permutation_seed=st.integers(0, 2**32 - 1),
)
def test_all_enqueued_then_readied_in_any_order_release_each_slot_in_fifo_order(
        tickets, permutation_seed):
    """Everything enqueued first (unready), then made ready one by one in a random order;
    the released set after each step is exactly what a reference computes."""
    order = ReplyOrder()
    made = [unready(*slots, name=str(i)) for i, slots in enumerate(tickets)]
    for t in made:
        order.enqueue(t)
    readiness = list(range(len(made)))
    random.Random(permutation_seed).shuffle(readiness)
    queues = {slot: [i for i, t in enumerate(made) if slot in t.slots] for slot in SLOTS}
    is_ready = [False] * len(made)
    released_order: list[int] = []
    for i in readiness:
        make_ready(made[i])
        is_ready[i] = True
        out = [int(t.waiters[0][1]) for t in order.release(made[i].slots)]
        # Reference: repeatedly take any ready ticket at the head of all its queues.
        expected: set[int] = set()
        progress = True
        while progress:
            progress = False
            for j, t in enumerate(made):
                if j in expected or j in released_order or not is_ready[j]:
                    continue
                if all(queues[s][0] == j for s in t.slots):
                    expected.add(j)
                    for s in t.slots:
                        queues[s].pop(0)
                    progress = True
        assert set(out) == expected
        assert len(out) == len(set(out))
        released_order += out
    assert sorted(released_order) == list(range(len(made)))
    for slot in SLOTS:
        mine = [i for i in released_order if slot in made[i].slots]
        assert mine == sorted(mine), f"slot {slot} released out of entry order"


def test_a_ticket_alone_in_one_of_its_slots_still_waits_behind_another_in_the_next():
    """Released whole at once only when it is alone in every one of its slots: first in the
    slot looked at first is not enough."""
    order = ReplyOrder()
    first = unready(B, name="first")
    batch = ready(A, B, name="batch")  # alone in A, behind ``first`` in B
    order.enqueue(first)
    order.enqueue(batch)
    assert order.release(batch.slots) == []
    assert order.release((A,)) == []
    make_ready(first)
    assert order.release(first.slots) == [first, batch]
    assert len(order) == 0 and not order.busy([A, B])


def test_a_batch_alone_in_its_slots_leaves_them_all_idle_and_the_ones_behind_follow():
    idle: list = []
    order = ReplyOrder(on_idle=idle.extend)
    batch = unready(A, B, C, name="batch")
    order.enqueue(batch)
    behind = ready(B, name="behind")
    order.enqueue(behind)
    make_ready(batch)
    assert order.release(batch.slots) == [batch, behind]
    assert sorted(idle) == sorted([A, B, C]) and len(order) == 0
