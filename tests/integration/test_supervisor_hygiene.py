"""The supervisor's process hygiene (issue 8, hole 7): a failed start stops every member it
started, `shmgrid stop` kills only processes that are still ours, a slow add-member does not
hold up the reporting of deaths, and shutdown makes the master (not just any member) refuse
writes first.

Some tests run a Supervisor in the test process (a small cluster of real member processes)
and drive its loop with poll_once; the others go through the `shmgrid` command.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import multiprocess
import psutil
import pytest
import zmq
from multiprocess import resource_tracker

import grid.supervisor
from grid import protocol as p
from grid.client.registry import pid_alive, read_registry, write_registry
from grid.config import GridConfig
from grid.supervisor import StartupError, Supervisor
from tests.conftest import run_cli, test_cluster_name
from tests.integration.failing_member import FAIL_START_ENV, run_member_or_fail
from workers.member import START_DELAY_ENV

pytestmark = pytest.mark.timeout(120)


def _segments(cluster_name: str) -> list[str]:
    return [s.name for s in Path("/dev/shm").glob(f"shmgrid-{cluster_name}-*")]


def _wait_until(condition, timeout: float, what: str, step=None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {timeout:g} s: {what}")
        if step is not None:
            step()
        else:
            time.sleep(0.05)


@pytest.fixture
def supervisor(monkeypatch):
    """Make in-process Supervisors of small clusters. Every member process they start is
    recorded (``supervisor.started``); after the test each is shut down and any process
    still running is killed, so a failing test leaks nothing."""
    made: list[Supervisor] = []
    started: list = []
    process_class = multiprocess.get_context("spawn").Process

    def tracked_process(*args, **kwargs):
        proc = process_class(*args, **kwargs)
        started.append(proc)
        return proc

    def make(**options) -> Supervisor:
        config = GridConfig(**{"cluster_name": test_cluster_name("sup"), "members": 3,
                               "partition_count": 7, **options})
        sup = Supervisor(config)
        monkeypatch.setattr(sup.mp, "Process", tracked_process)
        made.append(sup)
        return sup

    make.started = started
    yield make
    for sup in made:
        if not sup.ctx.closed:
            sup.shutdown()
    for proc in started:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    # Starting a process started multiprocess's resource tracker in this process; it would
    # outlive the test (a detached supervisor's ends with it).
    resource_tracker._resource_tracker._stop()


def _command(sup: Supervisor, op: str, timeout: float = 60.0, **fields) -> dict:
    """Send a command to an in-process supervisor as the CLI does; run its loop until the
    reply comes."""
    sock = sup.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(sup.endpoint)
    try:
        sock.send_multipart([p.request(op, 1, sup.config.cluster_name,
                                       k=sup.config.cluster_secret, **fields)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sup.poll_once(50)
            if sock.poll(0):
                return p.unpack_header(sock.recv_multipart()[0])
        raise AssertionError(f"no reply to {op} within {timeout:g} s")
    finally:
        sock.close(0)


# -- a failed start ----------------------------------------------------------------------

def test_a_failed_start_stops_every_member_it_started(supervisor, monkeypatch):
    """member-1 fails while member-2, started in the same batch, is starting fine: the
    supervisor gives up, and stops member-2 as well as member-0."""
    monkeypatch.setattr(grid.supervisor, "run_member", run_member_or_fail)
    monkeypatch.setenv(FAIL_START_ENV, "member-1")
    sup = supervisor(members=3)
    with pytest.raises(StartupError, match="member-1 failed to start: .*injected"):
        sup.start()
    assert [proc.name for proc in supervisor.started] == ["member-0", "member-1", "member-2"]
    assert [proc.name for proc in supervisor.started if proc.is_alive()] == []
    assert not sup.registry.exists()
    assert _segments(sup.config.cluster_name) == []


def test_an_added_member_that_fails_to_start_is_refused_and_stopped(supervisor, monkeypatch):
    monkeypatch.setattr(grid.supervisor, "run_member", run_member_or_fail)
    monkeypatch.setenv(FAIL_START_ENV, "member-1")
    sup = supervisor(members=1)
    sup.start()
    reply = _command(sup, p.ADD_MEMBER)
    assert reply["ok"] is False and "member-1 failed to start" in reply["msg"]
    failed = next(proc for proc in supervisor.started if proc.name == "member-1")
    assert not failed.is_alive()
    assert list(sup.members) == ["member-0"] and sup.starting == {}
    reply = _command(sup, p.ADD_MEMBER)  # the supervisor goes on serving
    assert reply["ok"] and reply["member"]["name"] == "member-2"
    assert [m["name"] for m in read_registry(sup.registry)["members"]] == ["member-0",
                                                                          "member-2"]


# -- `shmgrid stop` and pids that are no longer ours -------------------------------------------

def test_stop_kills_only_processes_that_are_still_the_registered_ones():
    """A registry left by a supervisor that died long ago names pids that the system may have
    given to unrelated processes since: stop kills a pid only if the process started when the
    registry says ours did."""
    name = test_cluster_name("reg")
    path = Path(os.environ["SHMGRID_REGISTRY_DIR"]) / f"{name}.json"
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(4)]
    try:
        started = [psutil.Process(s.pid).create_time() for s in sleepers]
        endpoint = "tcp://127.0.0.1:9"
        write_registry(path, {
            "cluster_name": name, "state": "ready",
            # The supervisor and member-0 are gone; their pids belong to later processes.
            "supervisor": {"pid": sleepers[0].pid, "create_time": started[0] - 100,
                           "endpoint": endpoint},
            "members": [
                {"name": "member-0", "uuid": "u0", "endpoint": endpoint,
                 "pid": sleepers[1].pid, "create_time": started[1] - 100, "lite": False},
                # An entry without a start time is never taken for ours.
                {"name": "member-1", "uuid": "u1", "endpoint": endpoint,
                 "pid": sleepers[2].pid, "lite": False},
                # This one is still the registered process: an orphan, which stop kills.
                {"name": "member-2", "uuid": "u2", "endpoint": endpoint,
                 "pid": sleepers[3].pid, "create_time": started[3], "lite": False},
            ],
            "config": {"cluster_name": name, "cluster_secret": "0" * 32},
        })
        out = run_cli("stop", "--cluster-name", name, timeout=60).stdout
        assert "stopped (killed 1 orphaned members)" in out
        assert [s.poll() is None for s in sleepers] == [True, True, True, False]
        assert not path.exists()
    finally:
        for s in sleepers:
            s.kill()
            s.wait()


# -- add-member does not block the supervisor --------------------------------------------------

def _member_processes(supervisor_pid: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(supervisor_pid).children()
            if "spawn_main" in " ".join(c.cmdline())]


def _member_uuids(endpoint: str, cluster_name: str) -> set[str]:
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send_multipart([p.request(p.TABLE, 1, cluster_name)])
        assert sock.poll(5000), "the master answers"
        view = p.unpack_header(sock.recv_multipart()[0])
        return {m[0] for m in view["members"][1]}
    finally:
        ctx.destroy(linger=0)


def test_a_death_is_reported_while_an_added_member_is_still_starting(cluster_factory,
                                                                     monkeypatch):
    """member-2 takes 10 s to start (a test hook); member-1 is killed meanwhile. The
    supervisor reports the death at once, while the add is still in progress (heartbeats,
    the fallback, would take 30 s here), and the add completes afterwards."""
    monkeypatch.setenv(START_DELAY_ENV, "member-2=10")
    cluster = cluster_factory(members=2, heartbeat_timeout=30)
    registry = cluster.registry
    master, victim = registry["members"]
    adder = subprocess.Popen(
        [sys.executable, "-m", "grid", "add-member", "--cluster-name", cluster.cluster_name],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until(lambda: len(_member_processes(registry["supervisor"]["pid"])) == 3, 30,
                    "the supervisor starts member-2")
        os.kill(victim["pid"], signal.SIGKILL)
        _wait_until(lambda: [m["name"] for m in cluster.registry["members"]] == ["member-0"],
                    10, "the supervisor notes the death")
        _wait_until(lambda: victim["uuid"] not in _member_uuids(master["endpoint"],
                                                               cluster.cluster_name),
                    10, "the master removes the dead member")
        assert adder.poll() is None, "the add was still in progress"
        out, err = adder.communicate(timeout=60)
        assert adder.returncode == 0, err
        assert "added member-2" in out
    finally:
        if adder.poll() is None:
            adder.kill()
            adder.communicate()
    assert [m["name"] for m in cluster.registry["members"]] == ["member-0", "member-2"]
    with cluster.connect() as client:
        client.get_map("m").put("k", 1)
        assert client.get_map("m").get("k") == 1


# -- shutdown ------------------------------------------------------------------------------------

def test_shutdown_sets_passive_on_the_master_when_it_is_not_the_first_started(supervisor,
                                                                              monkeypatch):
    """member-1 starts slowly, so member-2 joins before it; when member-0 (the master) dies,
    member-2, the oldest left, becomes master though member-1 was started first. Shutdown
    must make member-2 refuse writes: member-1 would refuse the request (not the master)."""
    monkeypatch.setenv(START_DELAY_ENV, "member-1=2")
    sup = supervisor(members=3)
    sup.start()
    view = sup._ask(sup.members["member-0"], p.TABLE)
    assert [m[1] for m in view["members"][1]] == ["member-0", "member-2", "member-1"]
    os.kill(sup.members["member-0"].pid, signal.SIGKILL)

    def new_master() -> bool:
        live = sup.members.get("member-2")
        status = sup._ask(live, p.STATUS, timeout=0.5) if live else None
        return "member-0" not in sup.members and bool(status and status.get("master"))

    _wait_until(new_master, 60, "member-2 takes over", step=lambda: sup.poll_once(100))
    assert list(sup.members) == ["member-1", "member-2"]

    asked = []
    ask = sup._ask

    def recording_ask(member, op, timeout=2.0, **fields):
        reply = ask(member, op, timeout, **fields)
        asked.append((member.name, op, bool(reply and reply.get("ok"))))
        return reply

    monkeypatch.setattr(sup, "_ask", recording_ask)
    pids = [m.pid for m in sup.members.values()]
    sup.shutdown()
    assert [(name, ok) for name, op, ok in asked if op == p.SET_STATE] == [("member-2", True)]
    assert not any(pid_alive(pid) for pid in pids)
