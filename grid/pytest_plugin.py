"""pytest fixtures that give a test a throwaway, real shmgrid cluster (docs/testing.md).

Registered through the ``pytest11`` entry point, so installing shmgrid is enough:

    def test_orders_survive_a_crash(shmgrid_cluster):
        client = shmgrid_cluster.client()
        client.get_map("orders").put("o1", 3)
        shmgrid_cluster.kill("member-1")
        shmgrid_cluster.wait_safe()
        assert client.get_map("orders").get("o1") == 3

Clusters are started the way a user starts them (``shmgrid start --detach``), so a test
exercises the real processes, shared memory and failover, not a mock. They are isolated from
the user's own clusters: every cluster has a unique name, and its registry file lives in a
temporary directory of the pytest session (the CLI subprocesses get it as
SHMGRID_REGISTRY_DIR; clients get the file's path), so ``dev`` or any cluster the user runs is
never found, stopped or killed.

Teardown never depends on the test: clients are closed, paused members resumed and
``shmgrid stop`` run; whatever that leaves (or everything, when it fails or a second Ctrl-C
cuts it short) is killed by an environment marker every process of the cluster inherits, and
the cluster's /dev/shm segments are removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import psutil
import pytest

from grid.client.registry import is_registered_process, read_registry
from grid.config import GridConfig
from grid.errors import ClusterNotRunningError

# Every process of a fixture's cluster (the CLI commands, the supervisor, its members) carries
# this variable with the cluster's name: the last-resort teardown finds them by it, even a
# supervisor that never wrote its registry file.
MARKER_ENV = "SHMGRID_PYTEST_CLUSTER"
# The settings every SHMGRID_<KEY> variable could carry; the user's own are not passed on to
# the fixtures' clusters, which get exactly the options the test asked for.
_CONFIG_KEYS = {f.name for f in fields(GridConfig)}
# Chosen by the fixtures: a unique name per cluster, and the session's registry directory.
_MANAGED_KEYS = {"cluster_name", "registry_dir"}
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.]+")
STOP_TIMEOUT_S = 60.0  # `shmgrid stop` kills a supervisor that has not stopped after 20 s
GONE_TIMEOUT_S = 30.0


class ClusterCommandError(RuntimeError):
    """A ``shmgrid`` command a fixture ran failed; the message has its output."""


_FACTORIES = pytest.StashKey[list["ClusterFactory"]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    help_text = ("first characters of the names of the clusters the shmgrid fixtures start "
                 "(letters, digits, '_' and '.'; default 'pytest'); a unique suffix follows")
    parser.addini("shmgrid_name_prefix", help_text, default="pytest")
    parser.getgroup("shmgrid").addoption("--shmgrid-name-prefix", help=help_text)


_SIGTERM_HANDLER = pytest.StashKey[object]()


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_FACTORIES] = []
    # A run stopped with SIGTERM (`timeout`, a CI job that ran out of time) tears its
    # clusters down as at a Ctrl-C; by default the signal would end pytest on the spot and
    # leave every member and segment behind.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and \
            threading.current_thread() is threading.main_thread():
        config.stash[_SIGTERM_HANDLER] = signal.signal(signal.SIGTERM, _terminated)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The safety net: pytest stops tearing down fixtures at a KeyboardInterrupt raised in
    a teardown (a second Ctrl-C), but it always unconfigures; whatever cluster is left then
    is killed."""
    for factory in config.stash.get(_FACTORIES, []):
        factory.stop_all(graceful=False)
    if _SIGTERM_HANDLER in config.stash:
        signal.signal(signal.SIGTERM, config.stash[_SIGTERM_HANDLER])  # type: ignore[arg-type]


class ShmgridCluster:
    """A handle on one running cluster that a fixture started; see docs/testing.md.

    Members are signalled directly (a registry lookup and ``os.kill``) rather than through
    ``shmgrid kill``: a chaos test wants the signal at the moment it asks, not after an
    interpreter has started. Everything else goes through the ``shmgrid`` command, as a user
    would.
    """

    def __init__(self, name: str, registry_dir: Path) -> None:
        self.name = name
        self.registry_dir = registry_dir
        self.registry_path = registry_dir / f"{name}.json"
        self.log_path = registry_dir / f"{name}.log"  # the supervisor's and members' log
        self._clients: list[Any] = []
        self._stopped = False

    def __repr__(self) -> str:
        return f"<ShmgridCluster {self.name}>"

    # -- finding and using the cluster ---------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """Variables that let other code find this cluster the way `grid.connect()` does:
        merge them into a subprocess's environment (``{**os.environ, **cluster.env}``) or
        ``monkeypatch.setenv`` them for code under test that connects by itself."""
        return {"SHMGRID_REGISTRY_DIR": str(self.registry_dir), "SHMGRID_CLUSTER_NAME": self.name}

    def client(self, **kwargs: Any) -> Any:
        """A connected ``grid`` client (``grid.connect`` keyword arguments such as
        ``invocation_timeout``); closed at teardown."""
        import grid

        client = grid.connect(cluster_name=self.name, registry_path=str(self.registry_path),
                              **kwargs)
        self._clients.append(client)
        return client

    def registry(self) -> dict[str, Any]:
        """The registry file the supervisor keeps (members, pids, endpoints, config)."""
        return read_registry(self.registry_path)

    @property
    def members(self) -> list[str]:
        """Names of the members whose processes run now (paused ones included), from the
        registry: no network round trip, and a killed member is gone at once."""
        try:
            entries = self.registry()["members"]
        except ClusterNotRunningError:
            return []
        return [m["name"] for m in entries if is_registered_process(m)]

    def pid(self, member: str) -> int:
        """The process id of a running member."""
        return self._entry(member)["pid"]

    def status(self) -> dict[str, Any]:
        """``shmgrid status --json``: state, safety, migrations and every member's view."""
        return json.loads(self.cli("status", "--json").stdout)

    def cli(self, *args: str, timeout: float = 120.0,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``shmgrid ARGS --cluster-name NAME`` against this cluster (for commands the
        handle has no method for, e.g. ``cli("state", "FROZEN")``)."""
        return _run_cli([*args, "--cluster-name", self.name], self._cli_env(), timeout, check,
                        self.log_path)

    # -- disturbing it ---------------------------------------------------------------------

    def kill(self, member: str) -> None:
        """SIGKILL a member, as a crash would; returns once its process is gone."""
        entry = self._entry(member)
        os.kill(entry["pid"], signal.SIGKILL)
        _wait_until(lambda: not is_registered_process(entry), GONE_TIMEOUT_S,
                    f"{member} (pid {entry['pid']}) to be gone")

    def pause(self, member: str) -> None:
        """SIGSTOP a member, and return once it is stopped: it hangs (no heartbeats, no
        answers) until ``resume``. After heartbeat_timeout the cluster removes it and the
        supervisor kills it."""
        entry = self._entry(member)
        os.kill(entry["pid"], signal.SIGSTOP)
        # The kernel stops it a moment later; the test's next step must meet it stopped.
        _wait_until(lambda: _stopped(entry["pid"]) is not False, GONE_TIMEOUT_S,
                    f"{member} (pid {entry['pid']}) to stop")

    def resume(self, member: str) -> bool:
        """SIGCONT a paused member. False if its process is no longer running (the
        supervisor fences a member the cluster removed while it hung)."""
        try:
            entry = self._entry(member)
        except LookupError:
            return False
        os.kill(entry["pid"], signal.SIGCONT)
        _wait_until(lambda: not _stopped(entry["pid"]), GONE_TIMEOUT_S,
                    f"{member} (pid {entry['pid']}) to continue")
        return True

    def add_member(self, lite: bool = False) -> str:
        """Start one more member (``shmgrid add-member``); returns its name. Migrations then
        give a data member its share: ``wait_safe()`` waits for them."""
        out = self.cli("add-member", *(["--lite"] if lite else [])).stdout
        found = re.search(r"^added (\S+) ", out, re.MULTILINE)
        if found is None:
            raise ClusterCommandError(f"cannot find the new member's name in:\n{out}")
        return found.group(1)

    def stop_member(self, member: str, timeout: float = 300.0) -> None:
        """Stop a member gracefully (``shmgrid stop-member``): its replicas move first."""
        self.cli("stop-member", member, "--timeout", str(timeout), timeout=timeout + 30)

    def wait_safe(self, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until every partition has its backups and nothing migrates (``shmgrid
        wait-safe``); returns the final status, raises ClusterCommandError on timeout."""
        out = self.cli("wait-safe", "--timeout", str(timeout), "--json",
                       timeout=timeout + 30).stdout
        return json.loads(out)

    # -- teardown --------------------------------------------------------------------------

    def stop(self, graceful: bool = True) -> None:
        """Stop the cluster and remove everything it left; safe to call twice. ``shmgrid
        stop`` first (unless ``graceful`` is False); then, whatever happened, the kill path:
        every process carrying the cluster's marker or registered for it is killed, and its
        /dev/shm segments and registry file are removed."""
        if self._stopped:
            return
        self._stopped = True
        try:
            for client in self._clients:
                with contextlib.suppress(Exception):
                    client.close()
            self._clients.clear()
            if graceful:
                self._graceful_stop()
        finally:
            with _sigint_deferred():
                self._force_cleanup()

    def _graceful_stop(self) -> None:
        # A stopped process cannot take part in a shutdown: continue every one of ours,
        # also those the test paused with os.kill itself.
        for proc in self._processes():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
        if self.registry_path.exists():
            with contextlib.suppress(subprocess.TimeoutExpired):  # the kill path follows
                self.cli("stop", timeout=STOP_TIMEOUT_S, check=False)

    def _force_cleanup(self) -> None:
        procs = self._processes()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()  # SIGKILL ends a stopped process too
        psutil.wait_procs(procs, timeout=10)
        from workers.shm import remove_segments

        remove_segments(f"shmgrid-{self.name}")  # only once no member can make new ones
        self.registry_path.unlink(missing_ok=True)

    def _processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: by marker, and by registry (pid and start
        time, so a reused pid is never taken for ours)."""
        found: dict[int, psutil.Process] = {}
        me = os.getpid()
        for proc in psutil.process_iter():
            if proc.pid == me:
                continue
            with contextlib.suppress(psutil.Error, OSError):
                if proc.status() != psutil.STATUS_ZOMBIE and \
                        proc.environ().get(MARKER_ENV) == self.name:
                    found[proc.pid] = proc
        with contextlib.suppress(ClusterNotRunningError):
            data = self.registry()
            for entry in [data.get("supervisor", {}), *data.get("members", [])]:
                if is_registered_process(entry) and entry["pid"] not in found:
                    with contextlib.suppress(psutil.Error):
                        found[entry["pid"]] = psutil.Process(entry["pid"])
        return list(found.values())

    # -- helpers ---------------------------------------------------------------------------

    def _cli_env(self, options: dict[str, Any] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith("SHMGRID_") and k[8:].lower() in _CONFIG_KEYS)}
        env.update({f"SHMGRID_{k.upper()}": str(v) for k, v in (options or {}).items()})
        env["SHMGRID_REGISTRY_DIR"] = str(self.registry_dir)
        env[MARKER_ENV] = self.name
        return env

    def _start(self, options: dict[str, Any]) -> None:
        _run_cli(["start", "--detach", "--cluster-name", self.name], self._cli_env(options),
                 120.0, True, self.log_path)

    def _entry(self, member: str) -> dict[str, Any]:
        data = self.registry()
        for entry in data["members"]:
            if entry["name"] == member and is_registered_process(entry):
                return entry
        raise LookupError(f"no running member {member!r} in cluster {self.name} "
                          f"(running: {', '.join(self.members) or 'none'})")


class ClusterFactory:
    """Starts clusters and stops every one it started when its fixture's scope ends."""

    def __init__(self, registry_dir: Path, prefix: str) -> None:
        self.registry_dir = registry_dir
        self.prefix = prefix
        self.clusters: list[ShmgridCluster] = []

    def __call__(self, members: int = 3, backup_count: int = 1,
                 **options: Any) -> ShmgridCluster:
        """Start a cluster of ``members`` processes and wait until it is ready. ``options``
        are GridConfig keys (async_backup_count, partition_count, heartbeat_timeout, ...);
        they reach the cluster as SHMGRID_<KEY> variables of ``shmgrid start``."""
        options = {"members": members, "backup_count": backup_count, **options}
        bad = sorted((set(options) & _MANAGED_KEYS) | (set(options) - _CONFIG_KEYS))
        if bad:
            raise TypeError(f"not a cluster option the fixtures take: {', '.join(bad)}")
        GridConfig.load(env={}, **options)  # a bad value fails here, with the config's message
        cluster = ShmgridCluster(f"{self.prefix}{uuid.uuid4().hex[:10]}", self.registry_dir)
        # Recorded before it starts: an interrupted start is torn down too.
        self.clusters.append(cluster)
        cluster._start(options)
        return cluster

    def stop_all(self, graceful: bool = True) -> None:
        """Stop every cluster, newest first. After an interruption (a second Ctrl-C during
        teardown) the rest go the quick way, killed; the interruption is raised at the end."""
        interrupted: BaseException | None = None
        while self.clusters:
            cluster = self.clusters.pop()
            try:
                cluster.stop(graceful=graceful and interrupted is None)
            except BaseException as exc:  # every cluster must still go
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted


# -- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def shmgrid_registry_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's registry directory. Under pytest's basetemp, so the clusters' logs
    (``<name>.log``) stay for a look after a failure, like other tmp_path files."""
    return tmp_path_factory.mktemp("shmgrid-registry", numbered=True)


@pytest.fixture(scope="session")
def _shmgrid_name_prefix(pytestconfig: pytest.Config) -> str:
    prefix = pytestconfig.getoption("shmgrid_name_prefix") or \
        pytestconfig.getini("shmgrid_name_prefix")
    if not _NAME_CHARS.fullmatch(prefix):
        raise pytest.UsageError(f"shmgrid_name_prefix {prefix!r}: letters, digits, '_', '.'")
    return prefix


def _factory_lifetime(request: pytest.FixtureRequest, registry_dir: Path,
                      prefix: str) -> Iterator[ClusterFactory]:
    """A factory for the fixture's scope; every cluster it started stops with it."""
    factory = _new_factory(request, registry_dir, prefix)
    try:
        yield factory
    finally:
        factory.stop_all()
        request.config.stash[_FACTORIES].remove(factory)


@pytest.fixture
def shmgrid_cluster_factory(request: pytest.FixtureRequest, shmgrid_registry_dir: Path,
                            _shmgrid_name_prefix: str) -> Iterator[ClusterFactory]:
    """Start clusters with chosen options: ``shmgrid_cluster_factory(members=2,
    backup_count=0, heartbeat_timeout=3)``. Each is stopped when the test ends.

    Two factories rather than one that reads its caller's scope: a fixture cannot depend on
    one of a narrower scope, and a session-scoped factory would keep a test's clusters
    until the end of the run. This one is for a test (or a function-scoped fixture);
    ``shmgrid_session_cluster_factory`` for session-scoped fixtures.
    """
    yield from _factory_lifetime(request, shmgrid_registry_dir, _shmgrid_name_prefix)


@pytest.fixture(scope="session")
def shmgrid_session_cluster_factory(request: pytest.FixtureRequest, shmgrid_registry_dir: Path,
                                    _shmgrid_name_prefix: str) -> Iterator[ClusterFactory]:
    """Like ``shmgrid_cluster_factory``, for clusters that many tests share (start them in
    a session-scoped fixture of your own); they are stopped at the end of the session. A
    module- or class-scoped fixture can use it too and call ``cluster.stop()`` after its
    ``yield`` to stop the cluster earlier."""
    yield from _factory_lifetime(request, shmgrid_registry_dir, _shmgrid_name_prefix)


@pytest.fixture
def shmgrid_cluster(shmgrid_cluster_factory: ClusterFactory) -> ShmgridCluster:
    """A 3-member cluster with one synchronous backup, for this test alone."""
    return shmgrid_cluster_factory()


# -- helpers ---------------------------------------------------------------------------------

def _new_factory(request: pytest.FixtureRequest, registry_dir: Path,
                 prefix: str) -> ClusterFactory:
    factory = ClusterFactory(registry_dir, prefix)
    request.config.stash[_FACTORIES].append(factory)
    return factory


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C back until the block ends (it is raised then): the kill path takes a
    moment, and cut short it would leave processes and segments behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _run_cli(args: list[str], env: dict[str, str], timeout: float, check: bool,
             log_path: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "grid", *args], capture_output=True,
                            text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise ClusterCommandError(
            f"shmgrid {' '.join(args)} exited with {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\nlog: {log_path}")
    return result


def _stopped(pid: int) -> bool | None:
    """Whether process ``pid`` is stopped by a signal; None if it is gone."""
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return None
    if status == psutil.STATUS_ZOMBIE:
        return None
    return status == psutil.STATUS_STOPPED


def _wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout:g} s: {what}")
        time.sleep(0.02)
