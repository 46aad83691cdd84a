"""The membership lease (grid/cluster/lease.py): how long a member may act alone, from the
heartbeat numbers its peers echo."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.cluster.lease import MembershipLease

TIMEOUT = 10.0


def test_heartbeat_numbers_start_at_one_and_increase():
    lease = MembershipLease(TIMEOUT)
    assert [lease.next_heartbeat(float(t)) for t in range(4)] == [1, 2, 3, 4]
    assert lease.counter == 4


def test_valid_forever_with_no_peers():
    lease = MembershipLease(TIMEOUT)
    assert lease.valid_until([]) == math.inf
    lease.next_heartbeat(0.0)
    lease.echoed("p", 1)
    assert lease.valid_until([]) == math.inf, "echoes from peers not asked about do not count"


def test_not_valid_with_a_peer_that_echoed_nothing():
    lease = MembershipLease(TIMEOUT, margin_s=1.0)
    lease.next_heartbeat(0.0)
    until = lease.valid_until(["p"])
    assert until == -math.inf
    assert not until > 0.0


def test_an_echo_gives_sent_time_plus_timeout_minus_margin():
    lease = MembershipLease(TIMEOUT, margin_s=1.5)
    lease.next_heartbeat(0.0)
    n = lease.next_heartbeat(4.0)
    lease.echoed("p", n)
    assert lease.valid_until(["p"]) == 4.0 + TIMEOUT - 1.5


def test_margin_defaults_to_zero():
    lease = MembershipLease(TIMEOUT)
    lease.echoed("p", lease.next_heartbeat(3.0))
    assert lease.valid_until(["p"]) == 3.0 + TIMEOUT


def test_a_newer_echo_moves_the_lease_forward():
    lease = MembershipLease(TIMEOUT)
    n1 = lease.next_heartbeat(1.0)
    n2 = lease.next_heartbeat(2.0)
    lease.echoed("p", n1)
    assert lease.valid_until(["p"]) == 1.0 + TIMEOUT
    lease.echoed("p", n2)
    assert lease.valid_until(["p"]) == 2.0 + TIMEOUT


def test_an_old_number_echoed_later_does_not_move_the_lease_back():
    lease = MembershipLease(TIMEOUT)
    n1 = lease.next_heartbeat(1.0)
    n2 = lease.next_heartbeat(2.0)
    lease.echoed("p", n2)
    lease.echoed("p", n1)  # a delayed, reordered heartbeat answer
    assert lease.valid_until(["p"]) == 2.0 + TIMEOUT


def test_the_same_number_echoed_again_changes_nothing():
    lease = MembershipLease(TIMEOUT)
    n = lease.next_heartbeat(1.0)
    lease.echoed("p", n)
    lease.echoed("p", n)
    assert lease.valid_until(["p"]) == 1.0 + TIMEOUT


@pytest.mark.parametrize("number", [0, -1, 2, 99])
def test_a_number_never_sent_is_ignored(number):
    lease = MembershipLease(TIMEOUT)
    lease.next_heartbeat(1.0)
    lease.echoed("p", number)
    assert lease.valid_until(["p"]) == -math.inf
    lease.echoed("q", 1)
    lease.echoed("q", number)
    assert lease.valid_until(["q"]) == 1.0 + TIMEOUT


@pytest.mark.parametrize("number", [None, "1", 1.0, [1], b"\x01", {"n": 1}])
def test_a_non_int_echo_is_ignored(number):
    lease = MembershipLease(TIMEOUT)
    lease.next_heartbeat(1.0)
    lease.echoed("p", number)
    assert lease.valid_until(["p"]) == -math.inf


def test_a_bool_echo_is_ignored():
    lease = MembershipLease(TIMEOUT)
    lease.next_heartbeat(1.0)
    lease.echoed("p", True)
    assert lease.valid_until(["p"]) == -math.inf


def test_numbers_sent_more_than_two_timeouts_ago_are_pruned_and_their_echo_ignored():
    lease = MembershipLease(TIMEOUT)
    old = lease.next_heartbeat(0.0)
    lease.next_heartbeat(2 * TIMEOUT + 0.5)  # prunes what was sent before now - 2*timeout
    lease.echoed("p", old)
    assert lease.valid_until(["p"]) == -math.inf


def test_a_number_sent_exactly_two_timeouts_ago_is_kept():
    # Pruning drops numbers sent at `< now - 2 * timeout`: exactly 2*timeout old stays.
    lease = MembershipLease(TIMEOUT)
    old = lease.next_heartbeat(0.0)
    lease.next_heartbeat(2 * TIMEOUT)
    lease.echoed("p", old)
    assert lease.valid_until(["p"]) == 0.0 + TIMEOUT


def test_pruning_keeps_the_recent_numbers():
    lease = MembershipLease(TIMEOUT)
    numbers = {t: lease.next_heartbeat(float(t)) for t in range(0, 31, 5)}
    # At t=30 everything sent before 10 is pruned: 0 and 5 go, 10..30 stay.
    assert sorted(lease._sent) == [numbers[t] for t in (10, 15, 20, 25, 30)]
    lease.echoed("p", numbers[5])
    assert lease.valid_until(["p"]) == -math.inf
    lease.echoed("p", numbers[10])
    assert lease.valid_until(["p"]) == 10.0 + TIMEOUT


def test_a_pruned_number_does_not_undo_an_earlier_echo():
    lease = MembershipLease(TIMEOUT)
    n = lease.next_heartbeat(0.0)
    lease.echoed("p", n)
    lease.next_heartbeat(100.0)
    lease.echoed("p", n)  # pruned by now: ignored
    assert lease.valid_until(["p"]) == TIMEOUT


def test_forget_drops_a_peers_echo():
    lease = MembershipLease(TIMEOUT)
    n = lease.next_heartbeat(1.0)
    lease.echoed("p", n)
    lease.echoed("q", n)
    lease.forget("p")
    assert lease.valid_until(["p"]) == -math.inf
    assert lease.valid_until(["q"]) == 1.0 + TIMEOUT
    lease.forget("nobody")  # harmless


def test_a_forgotten_peer_can_echo_again_even_an_older_number():
    lease = MembershipLease(TIMEOUT)
    n1 = lease.next_heartbeat(1.0)
    n2 = lease.next_heartbeat(2.0)
    lease.echoed("p", n2)
    lease.forget("p")
    lease.echoed("p", n1)
    assert lease.valid_until(["p"]) == 1.0 + TIMEOUT


def test_the_lease_is_the_minimum_over_the_peers():
    lease = MembershipLease(TIMEOUT, margin_s=0.5)
    numbers = [lease.next_heartbeat(float(t)) for t in (1, 2, 3)]
    lease.echoed("a", numbers[2])
    lease.echoed("b", numbers[0])
    lease.echoed("c", numbers[1])
    assert lease.valid_until(["a", "b", "c"]) == 1.0 + TIMEOUT - 0.5
    assert lease.valid_until(["a", "c"]) == 2.0 + TIMEOUT - 0.5
    assert lease.valid_until(["a"]) == 3.0 + TIMEOUT - 0.5
    assert lease.valid_until(["a", "silent"]) == -math.inf, "one silent peer: no lease"


def test_valid_until_accepts_any_iterable_of_peers():
    lease = MembershipLease(TIMEOUT)
    lease.echoed("a", lease.next_heartbeat(1.0))
    assert lease.valid_until(p for p in ["a"]) == 1.0 + TIMEOUT


@settings(max_examples=200, deadline=None, derandomize=True)
@given(steps=st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 8)),  # advance, then send a heartbeat
        st.tuples(st.just("echo"), st.sampled_from("ab"), st.integers(-1, 12)),
        st.tuples(st.just("forget"), st.sampled_from("ab")),
    ), max_size=40))
def test_lease_matches_a_model(steps):
    """Against a model: a peer's lease rests on the newest send time among the numbers it
    echoed that were still remembered (sent at most 2*timeout before the latest send)."""
    timeout, margin = 5.0, 0.5
    lease = MembershipLease(timeout, margin_s=margin)
    sent: dict[int, float] = {}
    best: dict[str, float] = {}
    now = 0.0
    def answers() -> dict[str, float]:
        return {peers: lease.valid_until(peers) for peers in ("", "a", "b", "ab")}

    before = (lease.changes, answers())
    for step in steps:
        if step[0] == "send":
            now += step[1]
            n = lease.next_heartbeat(now)
            sent[n] = now
            for k in [k for k, t in sent.items() if t < now - 2 * timeout]:
                del sent[k]
        elif step[0] == "echo":
            _, peer, n = step
            lease.echoed(peer, n)
            if n in sent and sent[n] > best.get(peer, -math.inf):
                best[peer] = sent[n]
        else:
            lease.forget(step[1])
            best.pop(step[1], None)
        for peers in ([], ["a"], ["b"], ["a", "b"]):
            expected = min((best.get(p, -math.inf) + timeout - margin for p in peers),
                           default=math.inf)
            assert lease.valid_until(peers) == expected
        # A caller may keep an answer for as long as ``changes`` stays (ClusterService does).
        now_answers = answers()
        if lease.changes == before[0]:
            assert now_answers == before[1], "the lease changed but its changes count did not"
        before = (lease.changes, now_answers)
        # The lease never moves back while a peer is not forgotten.
        for peer, t in best.items():
            assert lease.valid_until([peer]) >= t + timeout - margin
