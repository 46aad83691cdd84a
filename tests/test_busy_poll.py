"""The busy-poll budget (grid/busy_poll.py): who spins, for how long, and
how it learns."""

import pytest

from grid.busy_poll import BusyPoll

LIMIT = 250e-6


def learned(samples: list[float], kind: str = "get") -> BusyPoll:
    poll = BusyPoll(LIMIT)
    for waited in samples:
        poll.record(kind, waited)
    return poll


def test_a_new_kind_spins_the_whole_limit_once_then_follows_its_waits():
    poll = BusyPoll(LIMIT)
    assert poll.budget("get") == LIMIT
    poll.record("get", 40e-6)
    assert poll.budget("get") == pytest.approx(80e-6)


@pytest.mark.parametrize(("mean_us", "budget_us"), [
    (10, 20), (100, 200), (125, 250), (200, 250), (250, 250), (251, 0), (1000, 0)])
def test_the_budget_is_twice_the_mean_wait_up_to_the_limit_and_none_past_it(mean_us, budget_us):
    poll = learned([mean_us * 1e-6] * 50)
    assert poll.budget("get") == pytest.approx(budget_us * 1e-6)


def test_kinds_learn_apart():
    poll = learned([40e-6] * 20, "get")
    for _ in range(20):
        poll.record("put_all", 1.2e-3)
    assert poll.budget("get") == pytest.approx(80e-6)
    assert poll.budget("put_all") == 0.0
    assert poll.budget("put") == LIMIT  # never seen


def test_one_slow_reply_does_not_stop_the_spinning():
    poll = learned([40e-6] * 50 + [2.0])  # one reply two seconds late (a member paused)
    assert 0 < poll.budget("get") <= LIMIT


def test_a_kind_that_became_fast_spins_again():
    poll = learned([5e-3] * 50 + [40e-6] * 60)
    assert poll.budget("get") == pytest.approx(80e-6, rel=0.05)


def test_a_kind_that_became_slow_stops_spinning():
    poll = learned([40e-6] * 50 + [3e-3] * 20)
    assert poll.budget("get") == 0.0


@pytest.mark.parametrize("limit", [0.0, -1.0])
def test_no_limit_never_spins(limit):
    poll = BusyPoll(limit)
    poll.record("get", 10e-6)
    assert poll.budget("get") == 0.0
    assert poll.means == {}


def test_a_member_spins_under_a_clients_steady_load_and_not_on_heartbeats_or_a_trickle():
    """A member's one kind: the gaps between its rounds of messages (workers/member.py spins
    the whole limit while the budget is not 0). Under a client's steady load they are a
    round's own messages, microseconds apart, and the next request's, hundreds; an idle
    member hears heartbeats a second apart; a trickle of requests comes milliseconds apart."""
    limit = 1e-3
    steady, idle, trickle = BusyPoll(limit), BusyPoll(limit), BusyPoll(limit)
    for _ in range(100):
        steady.record("round", 20e-6)
        steady.record("round", 600e-6)
        idle.record("round", 1.0)
        trickle.record("round", 5e-3)
    assert steady.budget("round") > 0
    assert idle.budget("round") == 0.0
    assert trickle.budget("round") == 0.0
    for _ in range(40):  # load again after a quiet while: it spins again within a few rounds
        idle.record("round", 300e-6)
    assert idle.budget("round") > 0
