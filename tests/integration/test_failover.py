"""Kill -9 and SIGSTOP members while clients write: no acknowledged write is lost."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from grid.client.registry import pid_alive

pytestmark = pytest.mark.timeout(180)


class Writers:
    """Client threads that write until stopped and remember every acknowledged write."""

    def __init__(self, cluster, count: int = 2, invocation_timeout: float = 60) -> None:
        self.cluster = cluster
        self.invocation_timeout = invocation_timeout
        self.acked: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(n,), daemon=True)
                        for n in range(count)]

    def _run(self, n: int) -> None:
        try:
            with self.cluster.connect(invocation_timeout=self.invocation_timeout) as client:
                m = client.get_map("acked")
                i = 0
                while not self.stop.is_set():
                    if n % 2 == 0:
                        key = f"w{n}-{i}"
                        m.set(key, i)
                        done = {key: i}
                    else:
                        done = {f"w{n}-{i}-{j}": i for j in range(10)}
                        m.put_all(done)
                    with self.lock:
                        self.acked.update(done)
                    i += 1
        except BaseException as exc:  # reported by the test, never swallowed
            self.failures.append(exc)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def wait_for(self, extra: int, timeout: float = 60) -> None:
        target = self.count() + extra
        deadline = time.monotonic() + timeout
        while self.count() < target:
            assert not self.failures, self.failures
            assert time.monotonic() < deadline, f"writes stalled at {self.count()}"
            time.sleep(0.02)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def _status(cluster) -> dict:
    return json.loads(cluster.cli("status", "--json").stdout)


def _wait(predicate, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _assert_all_readable(cluster, acked: dict[str, int]) -> None:
    with cluster.connect() as client:
        got = client.get_map("acked").get_all(list(acked))
    missing = [k for k in acked if got.get(k) != acked[k]]
    assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {missing[:5]}"


@pytest.mark.parametrize("victim", ["member-1", "member-2", "member-0"],
                         ids=["owner-and-backup", "youngest", "master"])
def test_kill_while_writing_loses_nothing(cluster_factory, victim):
    cluster = cluster_factory(members=3)
    pid = cluster.member(victim)["pid"]
    with Writers(cluster) as writers:
        writers.wait_for(300)
        cluster.cli("kill", victim)
        writers.wait_for(1500)
    assert not writers.failures, writers.failures
    _wait(lambda: not pid_alive(pid), what="the killed process to be gone")
    _assert_all_readable(cluster, writers.acked)
    status = _status(cluster)
    assert len(status["members"]) == 2
    assert victim not in {m["name"] for m in status["members"]}
    assert status["members"][0]["master"]
    # Migrations re-create the lost backups. Until they end, each member counts what its own
    # table says: a destination that took a commit counts a partition its source still
    # counts until the publish reaches it. So the owners add up to 271 once it is safe.
    cluster.cli("wait-safe", "--timeout", "60", timeout=90)
    status = _status(cluster)
    assert status["safe"] is True
    assert sum(m["owned"] for m in status["members"]) == 271, status
    # The supervisor removed the dead member's segments.
    assert not list(Path("/dev/shm").glob(f"shmgrid-{cluster.cluster_name}-{victim}-*"))


def test_sync_backups_hold_every_write(cluster_factory):
    """With two backups, every acknowledged write survives losing any two of three members."""
    cluster = cluster_factory(members=3, backup_count=2)
    with cluster.connect() as client:
        m = client.get_map("acked")
        acked = {f"k{i}": i for i in range(3000)}
        m.put_all(acked)
        for i in range(200):
            m.set(f"s{i}", i)
            acked[f"s{i}"] = i
        m.remove("k0")
        del acked["k0"]
    for name in ("member-0", "member-2"):
        os.kill(cluster.member(name)["pid"], signal.SIGKILL)
    _wait(lambda: len(_status(cluster)["members"]) == 1, what="two removals")
    _assert_all_readable(cluster, acked)
    with cluster.connect() as client:
        assert client.get_map("acked").size() == len(acked)


@pytest.mark.parametrize("victim", ["member-2", "member-0"], ids=["member", "master"])
def test_hung_member_is_removed_and_fenced(cluster_factory, victim):
    cluster = cluster_factory(members=3, heartbeat_interval=0.2, heartbeat_timeout=2)
    pid = cluster.member(victim)["pid"]
    with Writers(cluster) as writers:
        writers.wait_for(300)
        cluster.cli("kill", victim, "--signal", "STOP")
        _wait(lambda: not pid_alive(pid), timeout=60, what="the hung member to be fenced")
        writers.wait_for(500)
    assert not writers.failures, writers.failures
    _assert_all_readable(cluster, writers.acked)
    names = {m["name"] for m in _status(cluster)["members"]}
    assert victim not in names and len(names) == 2


def test_member_that_returns_after_its_removal_stops_itself(cluster_factory):
    """With the supervisor gone nobody fences: a hung member that resumes after the master
    removed it must learn so from the master, stop, and remove its own segments."""
    cluster = cluster_factory(members=3, heartbeat_interval=0.2, heartbeat_timeout=2)
    os.kill(cluster.registry["supervisor"]["pid"], signal.SIGKILL)
    victim = cluster.member("member-2")
    with cluster.connect() as client:
        client.get_map("m").put_all({i: i for i in range(500)})
        os.kill(victim["pid"], signal.SIGSTOP)
        try:
            _wait(lambda: len(client.cluster.members) == 2, what="the hung member's removal")
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
        _wait(lambda: not pid_alive(victim["pid"]), what="the returned member to stop itself")
        assert client.get_map("m").get_all(range(500)) == {i: i for i in range(500)}
    assert not list(Path("/dev/shm").glob(f"shmgrid-{cluster.cluster_name}-member-2-*"))
