"""Suite-wide guarantees: every test run is isolated from the user's clusters, and the run fails
if it leaves a process or a shared-memory segment behind, even when tests fail.

Every process a test starts inherits SHMGRID_TEST_RUN; at the end of the session any process
still carrying this run's marker, and any new ``shmgrid-*`` entry in /dev/shm, is a leak: it
is killed or removed, reported, and the run's exit status becomes "tests failed".
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

RUN_ID = uuid.uuid4().hex[:12]
# Every cluster (and shared-memory segment) this run makes has a name starting with this, so
# the leak check never touches the segments of the user's clusters or of another test run.
RUN_PREFIX = f"t{RUN_ID[:6]}"


def test_cluster_name(kind: str = "") -> str:
    """A cluster name of this run, for real clusters, simulations and stores alike."""
    return f"{RUN_PREFIX}{kind}{uuid.uuid4().hex[:8]}"


test_cluster_name.__test__ = False  # a helper, not a test
os.environ["SHMGRID_TEST_RUN"] = RUN_ID
_REGISTRY_DIR = tempfile.mkdtemp(prefix=f"shmgrid-test-{RUN_ID}-")
os.environ["SHMGRID_REGISTRY_DIR"] = _REGISTRY_DIR
SHM_DIR = Path("/dev/shm")


def _marked_processes() -> list[psutil.Process]:
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get("SHMGRID_TEST_RUN") == RUN_ID and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def leaked_resources() -> tuple[list[str], list[str]]:
    """(descriptions of leaked processes, names of leaked segments), cleaned up on the way."""
    procs = []
    for proc in _marked_processes():
        try:
            procs.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:120]}")
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        except psutil.Error:
            pass
    segments = sorted(p.name for p in SHM_DIR.glob(f"shmgrid-{RUN_PREFIX}*"))
    for name in segments:
        (SHM_DIR / name).unlink(missing_ok=True)
    return procs, segments


ROOT = Path(__file__).resolve().parent.parent
# What the processes a test starts import (supervisors, members, the CLI, clients, tools).
COMPILED = ("grid", "workers", "persistence", "pyspark_shmgrid", "tools", "tests")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Write the project's bytecode once, before any test starts a process. The suite starts
    hundreds of Python processes; where PYTHONDONTWRITEBYTECODE is set (as on the machines
    shmgrid is built on), each would compile the project's modules again, about 0.3 s a
    process (the integration tests ran 1.3x as long). Python checks a cached file against
    its source at import, so a stale one is never used."""
    import compileall

    for package in COMPILED:
        compileall.compile_dir(ROOT / package, quiet=1)


def _segments_without_cluster() -> list[str]:
    """This run's segments whose cluster has no registry file: no cluster, and no store a
    test still holds (every test has closed its stores by its end), may own them."""
    found = []
    for path in SHM_DIR.glob(f"shmgrid-{RUN_PREFIX}*"):
        cluster = path.name.removeprefix("shmgrid-").split("-", 1)[0]
        if not (Path(_REGISTRY_DIR) / f"{cluster}.json").exists():
            found.append(path.name)
    return sorted(found)


@pytest.fixture(autouse=True)
def _no_segment_outlives_its_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """Name the test after which a stopped cluster's (or a closed store's) segment is still
    in /dev/shm, rather than only the run at its end. A second look a moment later lets a
    member that is still exiting finish; what is left then is removed and fails the test."""
    yield
    leaked = _segments_without_cluster()
    deadline = time.monotonic() + 2
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked = _segments_without_cluster()
    for name in leaked:
        (SHM_DIR / name).unlink(missing_ok=True)
    assert not leaked, f"{request.node.nodeid} left segments of a stopped cluster or a " \
                       f"closed store (or one stopped late before it): {leaked[:10]}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Give supervisors that are stopping a moment to finish their own clean-up.
    deadline = time.monotonic() + 5
    while _marked_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    procs, segments = leaked_resources()
    shutil.rmtree(_REGISTRY_DIR, ignore_errors=True)
    if procs or segments:
        lines = ["", "LEAK CHECK FAILED: the test run left resources behind (now removed):"]
        lines += [f"  process {p}" for p in procs]
        lines += [f"  segment /dev/shm/{s}" for s in segments[:10]]
        if len(segments) > 10:
            lines.append(f"  ... and {len(segments) - 10} more segments")
        print("\n".join(lines), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# -- real clusters ------------------------------------------------------------------------

def run_cli(*args: str, timeout: float = 90, check: bool = True) -> subprocess.CompletedProcess:
    """Run the `shmgrid` command the way a user does (python -m grid ...)."""
    result = subprocess.run([sys.executable, "-m", "grid", *args], capture_output=True,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"shmgrid {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


@dataclass
class ClusterHandle:
    cluster_name: str
    registry_path: Path
    clients: list = field(default_factory=list)

    @property
    def registry(self) -> dict:
        from grid.client.registry import read_registry

        return read_registry(self.registry_path)

    @property
    def address(self) -> str:
        return self.registry["members"][0]["endpoint"]

    def connect(self, **kwargs):
        import grid

        client = grid.connect(cluster_name=self.cluster_name, **kwargs)
        self.clients.append(client)
        return client

    def member(self, name: str) -> dict:
        return next(m for m in self.registry["members"] if m["name"] == name)

    def cli(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return run_cli(*args, "--cluster-name", self.cluster_name, **kwargs)

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()
        if self.registry_path.exists():
            run_cli("stop", "--cluster-name", self.cluster_name, check=False)


def start_cluster(members: int = 3, backup_count: int = 1, **options: object) -> ClusterHandle:
    name = test_cluster_name()
    args = ["start", "--detach", "--cluster-name", name, "--members", str(members),
            "--backup-count", str(backup_count)]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    handle = ClusterHandle(name, Path(_REGISTRY_DIR) / f"{name}.json")
    try:
        run_cli(*args)
    except BaseException:
        handle.stop()
        raise
    return handle


@pytest.fixture
def cluster_factory():
    """Start clusters with chosen options; every one is stopped after the test."""
    started: list[ClusterHandle] = []

    def factory(**kwargs) -> ClusterHandle:
        handle = start_cluster(**kwargs)
        started.append(handle)
        return handle

    yield factory
    for handle in started:
        handle.stop()


@pytest.fixture(scope="session")
def grid_cluster():
    """One 3-member cluster shared by the tests that only read and write data."""
    handle = start_cluster(members=3)
    yield handle
    handle.stop()
