"""Busy polling on a real cluster (grid/busy_poll.py, the member loop): a client
learns per kind of request whether to spin, members do not spin under a trickle of requests,
and everything works with spinning off on both sides (client_busy_poll_us =
member_busy_poll_us = 0)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import psutil
import pytest

import grid
from grid import protocol as p
from grid.busy_poll import BusyPoll
from grid.config import GridConfig

pytestmark = pytest.mark.timeout(120)


def test_a_client_learns_which_requests_to_spin_for(grid_cluster, request):
    with grid_cluster.connect() as client:
        m = client.get_map(request.node.name)
        m.put_all({f"k{i}": b"v" * 100 for i in range(20_000)})
        for i in range(50):
            m.get(f"k{i}")
        polls = client._invoker.busy_poll
        assert polls.limit == GridConfig().client_busy_poll_us / 1e6
        assert 0 < polls.means[p.GET] < 0.05  # every get was measured
        assert p.PUT_ALL in polls.means
        # a get_all of everything takes longer than the limit: no spin for it (20,000 keys:
        # tens of milliseconds; 2,000 once came within 1 ms on a fast machine)
        for _ in range(20):
            m.get_all([f"k{i}" for i in range(20_000)])
        assert polls.budget(p.GET_ALL) == 0.0


def spin_turns(client: grid.Client, monkeypatch: pytest.MonkeyPatch, calls: Any,
               noted: Any) -> dict[int, set[Any]]:
    """For a client that may run on 2 and on 4 cores, and whose every wait earns spinning:
    ``noted(f_locals of its wait)`` at each turn of its spins (a yield) while ``calls()``
    runs, per core count."""
    invoker = client._invoker
    invoker.busy_poll = BusyPoll(1.0)  # a wait of any length earns spinning
    turns: list[Any] = []
    real_yield = os.sched_yield

    def watched_yield() -> None:
        turns.append(noted(sys._getframe(1).f_locals))  # the client's wait (Invoker._gather)
        real_yield()

    monkeypatch.setattr(os, "sched_yield", watched_yield)
    seen = {}
    for cores in (2, 4):
        invoker.spin_cores = cores
        turns.clear()
        calls()
        seen[cores] = set(turns)
    return seen


def test_a_client_spins_only_while_the_members_it_waits_for_leave_it_a_core(
        grid_cluster, request, monkeypatch):
    """A get_all sent to all three members: with two cores the client spins (yields, on each
    turn of its spin) only once one member is left to answer; with four, from the start."""
    with grid_cluster.connect() as client:
        m = client.get_map(request.node.name)
        keys = [f"k{i}" for i in range(100)]  # over 70 partitions: every member owns some
        m.put_all(dict.fromkeys(keys, b"v" * 100))

        def get_alls() -> None:
            for _ in range(30):
                assert len(m.get_all(keys)) == 100

        # (noted: the members yet to answer)
        seen = spin_turns(client, monkeypatch, get_alls,
                          lambda wait: len(wait["wanted"]) - len(wait["results"]))
        assert seen[2] <= {1}, seen
        assert 3 in seen[4], seen


def test_a_client_does_not_spin_for_a_write_whose_backups_need_the_cores_it_would_take(
        grid_cluster, request, monkeypatch):
    """A put is applied by its owner and then its backup, which answers while the owner
    still works on it: two members busy at once. With two cores the client sleeps through
    the wait (spinning, it took one from them: puts 1.2x faster without); with four it
    spins, as it does for a get, which keeps one member busy."""
    with grid_cluster.connect() as client:
        m = client.get_map(request.node.name)
        m.put("k", 1)

        def puts_and_gets() -> None:
            for i in range(30):
                m.put("k", i)
                assert m.get("k") == i

        seen = spin_turns(client, monkeypatch, puts_and_gets, lambda wait: wait["kind"])
        assert seen[2] == {p.GET}, seen
        assert seen[4] == {p.GET, p.PUT}, seen


def test_members_do_not_spin_under_a_trickle_of_requests(grid_cluster, request):
    """A get every 3 ms: a member that spun its whole limit (1 ms) after each would burn a
    third of a core (measured: a fifth with a get every 5 ms); one that learned its rounds
    come further apart than the limit sleeps between them (4% with a get every 5 ms)."""
    with grid_cluster.connect() as client:
        m = client.get_map(request.node.name)
        m.put("k", 1)
        processes = [psutil.Process(member.pid) for member in client.cluster.members]
        for _ in range(50):  # the owner learns the trickle's gaps
            m.get("k")
            time.sleep(0.003)
        before = [process.cpu_times() for process in processes]
        started = time.monotonic()
        for _ in range(400):
            assert m.get("k") == 1
            time.sleep(0.003)
        elapsed = time.monotonic() - started
        used = sum(after.user + after.system - first.user - first.system
                   for first, after in zip(before, (process.cpu_times() for process in processes),
                                           strict=True))
        assert used < 0.15 * elapsed, f"members used {used:.3f} s of CPU in {elapsed:.2f} s"


def test_everything_works_with_busy_polling_off(cluster_factory, tmp_path, request):
    config = tmp_path / "shmgrid.toml"
    config.write_text("member_busy_poll_us = 0\n")
    cluster = cluster_factory(members=3, config=str(config))
    client = grid.connect(cluster_name=cluster.cluster_name,
                          config=GridConfig(cluster_name=cluster.cluster_name,
                                            client_busy_poll_us=0))
    cluster.clients.append(client)
    m = client.get_map(request.node.name)
    entries = {f"k{i}": i for i in range(500)}
    m.put_all(entries)
    for i in range(100):
        assert m.put(f"k{i}", -i) == i  # answered by the backup or the owner
    assert m.get_all(list(entries)) == {**entries, **{f"k{i}": -i for i in range(100)}}
    assert client._invoker.busy_poll.means == {}
