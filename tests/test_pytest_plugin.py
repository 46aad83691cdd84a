"""The pytest plugin (grid/pytest_plugin.py) as a user meets it: a test file of theirs, run by
pytest in a subprocess, gets real clusters, and whatever the tests do (pass, fail, leave a
member paused) or whatever happens to the run (Ctrl-C, twice), no process and no shared-memory
segment of those clusters is left afterwards.

Every process the inner run starts inherits a marker variable unique to the test, and every
cluster it makes has a name under a prefix of this run (tests/conftest.py's leak check covers
them too).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from importlib.metadata import entry_points
from pathlib import Path

import psutil
import pytest

from tests.conftest import test_cluster_name

pytestmark = pytest.mark.timeout(300)

MARK_ENV = "SHMGRID_PLUGIN_TEST_MARK"
SHM_DIR = Path("/dev/shm")

USER_TESTS = '''
import psutil
import pytest

SHARED = {}


@pytest.fixture(scope="session")
def shared_cluster(shmgrid_session_cluster_factory):
    return shmgrid_session_cluster_factory(members=2, partition_count=31)


def test_put_and_get(shmgrid_cluster):
    orders = shmgrid_cluster.client().get_map("orders")
    orders.put("o1", {"qty": 3})
    assert orders.get("o1") == {"qty": 3}
    assert shmgrid_cluster.members == ["member-0", "member-1", "member-2"]


def test_kill_then_read_back(shmgrid_cluster):
    orders = shmgrid_cluster.client().get_map("orders")
    written = {f"o{i}": i for i in range(500)}
    orders.put_all(written)
    shmgrid_cluster.kill("member-1")
    assert "member-1" not in shmgrid_cluster.members
    assert shmgrid_cluster.wait_safe(timeout=60)["safe"]
    assert orders.get_all(list(written)) == written
    assert len(shmgrid_cluster.status()["members"]) == 2


def test_pause_resume_add_and_stop_members(shmgrid_cluster_factory):
    cluster = shmgrid_cluster_factory(members=2, heartbeat_timeout=30, partition_count=61)
    cluster.client().get_map("m").put_all({i: i for i in range(100)})
    cluster.pause("member-1")
    assert psutil.Process(cluster.pid("member-1")).status() == psutil.STATUS_STOPPED
    assert cluster.resume("member-1")
    assert psutil.Process(cluster.pid("member-1")).status() != psutil.STATUS_STOPPED
    new = cluster.add_member()
    lite = cluster.add_member(lite=True)
    cluster.wait_safe()
    assert cluster.members == ["member-0", "member-1", new, lite]
    cluster.stop_member("member-1")
    assert "member-1" not in cluster.members
    assert cluster.client().get_map("m").get_all(range(100)) == {i: i for i in range(100)}


def test_options_are_checked_before_anything_starts(shmgrid_cluster_factory):
    with pytest.raises(TypeError, match="no_such_key"):
        shmgrid_cluster_factory(no_such_key=1)
    with pytest.raises(ValueError, match="backup_count"):
        shmgrid_cluster_factory(backup_count=9)


def test_shared_cluster_first(shared_cluster):
    SHARED["name"] = shared_cluster.name
    shared_cluster.client().get_map("shared").put("k", "v")


def test_shared_cluster_second(shared_cluster):
    assert shared_cluster.name == SHARED["name"]
    assert shared_cluster.client().get_map("shared").get("k") == "v"


def test_fails_on_purpose(shmgrid_cluster):
    shmgrid_cluster.pause("member-0")  # left paused: the teardown must cope
    assert False, "failing on purpose"
'''

INTERRUPTED_TEST = '''
import os
import time
from pathlib import Path

import pytest


@pytest.fixture
def cluster(shmgrid_cluster):
    yield shmgrid_cluster
    # Torn down just before the plugin's fixture: its stop begins now.
    Path(os.environ["READY_FILE"] + ".teardown").write_text("teardown")


def test_interrupted(cluster, shmgrid_session_cluster_factory):
    shmgrid_session_cluster_factory(members=1, backup_count=0)
    cluster.client().get_map("m").put_all({i: i for i in range(100)})
    cluster.pause("member-2")
    Path(os.environ["READY_FILE"]).write_text("ready")
    time.sleep(240)
'''


def _plugin_args() -> list[str]:
    """-p grid.pytest_plugin unless the installed entry point loads it already."""
    loaded = any(ep.value == "grid.pytest_plugin" for ep in entry_points(group="pytest11"))
    return [] if loaded else ["-p", "grid.pytest_plugin"]


class InnerRun:
    """A pytest run in a subprocess on a user-style test file, and what it leaves behind."""

    def __init__(self, tmp_path: Path, source: str) -> None:
        self.dir = tmp_path
        self.mark = uuid.uuid4().hex
        self.prefix = test_cluster_name("plug")
        (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 120\n")
        (tmp_path / "test_user.py").write_text(source)
        self.env = {**os.environ, MARK_ENV: self.mark,
                    "READY_FILE": str(tmp_path / "ready")}
        self.env.pop("PYTEST_ADDOPTS", None)
        self.args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *_plugin_args(),
                     "--basetemp", str(tmp_path / "basetemp"), "--shmgrid-name-prefix",
                     self.prefix, "-rA", "test_user.py"]

    def run(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.args, cwd=self.dir, env=self.env, capture_output=True,
                              text=True, timeout=280)

    def popen(self) -> subprocess.Popen[str]:
        return subprocess.Popen(self.args, cwd=self.dir, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def processes(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and \
                        proc.environ().get(MARK_ENV) == self.mark:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    def segments(self) -> list[str]:
        return sorted(p.name for p in SHM_DIR.glob(f"shmgrid-{self.prefix}*"))

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 5
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [f"{p.pid}: {' '.join(p.cmdline())[:100]}" for p in self.processes()]
        segments = self.segments()
        registries = list((self.dir / "basetemp").glob("shmgrid-registry*/*.json"))
        try:
            assert not left, f"processes left: {left}"
            assert not segments, f"segments left: {segments}"
            assert not registries, f"registry files left: {registries}"
        finally:  # the suite's own leak check need not see them again
            for proc in self.processes():
                proc.kill()
            for name in self.segments():
                (SHM_DIR / name).unlink(missing_ok=True)


def _counts(output: str) -> dict[str, int]:
    summary = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|error)", summary)}


def test_user_tests_get_real_clusters_and_leave_nothing(tmp_path):
    inner = InnerRun(tmp_path, USER_TESTS)
    result = inner.run()
    output = result.stdout + result.stderr
    assert _counts(result.stdout) == {"passed": 6, "failed": 1}, output
    assert result.returncode == 1, output
    assert "failing on purpose" in result.stdout
    assert "FAILED test_user.py::test_fails_on_purpose" in result.stdout
    inner.assert_nothing_left()


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"the inner run did not reach {path.name}"
        time.sleep(0.01)


@pytest.mark.parametrize(("interrupts", "signum"), [(1, signal.SIGINT), (2, signal.SIGINT),
                                                   (1, signal.SIGTERM)],
                         ids=["ctrl-c", "ctrl-c-twice", "sigterm"])
def test_interrupted_run_leaves_nothing(tmp_path, interrupts, signum):
    """Ctrl-C while a test holds a cluster (a member paused) and a session cluster is up;
    a second Ctrl-C lands in the teardown, in the graceful stop of the test's cluster: that
    one is killed instead, and the session's cluster by the plugin's unconfigure hook.
    SIGTERM (`timeout`, a CI job out of time) is taken as a Ctrl-C."""
    inner = InnerRun(tmp_path, INTERRUPTED_TEST)
    proc = inner.popen()
    try:
        _wait_for(tmp_path / "ready", proc)
        assert len(inner.processes()) >= 1 + 4 + 2  # pytest, 2 supervisors, 4 members
        assert inner.segments()
        proc.send_signal(signum)
        if interrupts == 2:
            _wait_for(tmp_path / "ready.teardown", proc)
            proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=150)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in output, output
    assert proc.returncode != 0, output
    inner.assert_nothing_left()
