"""Start, inspect and stop real clusters through the `shmgrid` command."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import grid
from grid.client.registry import pid_alive, read_registry
from tests.conftest import run_cli, start_cluster, test_cluster_name

pytestmark = pytest.mark.timeout(120)


def _segments(cluster_name: str) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(f"shmgrid-{cluster_name}-*")]


def test_start_status_stop(cluster_factory):
    cluster = cluster_factory(members=3)
    status = json.loads(cluster.cli("status", "--json").stdout)
    assert status["state"] == "ACTIVE" and status["safe"] is True
    members = status["members"]
    assert sorted(m["name"] for m in members) == ["member-0", "member-1", "member-2"]
    assert members[0]["name"] == "member-0", "the first started is the oldest: the master"
    assert [m["master"] for m in members] == [True, False, False]
    owned = [m["owned"] for m in members]
    backups = [m["backups"] for m in members]
    assert sum(owned) == 271 and max(owned) - min(owned) <= 1
    assert sum(backups) == 271 and max(backups) - min(backups) <= 1
    assert all(m["rss"] > 0 for m in members)
    pids = [m["pid"] for m in members] + [cluster.registry["supervisor"]["pid"]]

    with cluster.connect() as client:
        client.get_map("m").put_all({f"k{i}": i for i in range(1000)})
    assert _segments(cluster.cluster_name), "data lives in shared memory"
    status = json.loads(cluster.cli("status", "--json").stdout)
    assert all(m["shm_bytes"] > 0 for m in status["members"])

    table = cluster.cli("status").stdout
    assert "member-0" in table and "master" in table and "safe" in table

    out = cluster.cli("stop").stdout
    assert "stopped" in out
    assert not cluster.registry_path.exists()
    assert not any(pid_alive(pid) for pid in pids)
    assert _segments(cluster.cluster_name) == []


def test_start_refuses_a_second_cluster_of_the_same_name(cluster_factory):
    cluster = cluster_factory(members=1)
    result = cluster.cli("start", "--detach", "--members", "1", check=False)
    assert result.returncode == 1
    assert "already running" in result.stderr


def test_stop_and_status_without_a_cluster_say_so():
    result = run_cli("status", "--cluster-name", "nosuchcluster", check=False)
    assert result.returncode == 1
    assert "no shmgrid cluster is running" in result.stderr and "nosuchcluster.json" in \
        result.stderr
    for command in (["bench"], ["chaos", "--duration", "1"], ["wait-safe"],
                    ["state"]):  # (bench once printed a traceback here)
        result = run_cli(*command, "--cluster-name", "nosuchcluster", check=False)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("error: no shmgrid cluster is running"), result.stderr
    result = run_cli("bench", "--address", "nosuchcluster", check=False)
    assert result.returncode == 2 and "not a member's address" in result.stderr
    result = run_cli("stop", "--cluster-name", "nosuchcluster", check=False)
    assert result.returncode == 1


def test_bad_options_are_refused_before_anything_starts():
    result = run_cli("start", "--backup-count", "9", "--cluster-name", "bad", check=False)
    assert result.returncode == 2 and "backup_count" in result.stderr
    assert "--members" in run_cli("start", "--help").stdout


def test_add_member_and_lite_member(cluster_factory):
    cluster = cluster_factory(members=2)
    assert "added member-2" in cluster.cli("add-member").stdout
    assert "lite" in cluster.cli("add-member", "--lite").stdout
    status = json.loads(cluster.cli("status", "--json").stdout)
    names = {m["name"]: m for m in status["members"]}
    assert set(names) == {"member-0", "member-1", "member-2", "member-3"}
    assert names["member-3"]["lite"] and names["member-3"]["owned"] == 0
    with cluster.connect() as client:
        m = client.get_map("after-join")
        m.put_all({i: i for i in range(300)})
        assert m.size() == 300


def test_supervisor_death_leaves_the_cluster_serving_and_stop_cleans_up():
    cluster = start_cluster(members=2)
    try:
        with cluster.connect() as client:
            client.get_map("m").put("k", 1)
            os.kill(cluster.registry["supervisor"]["pid"], 9)
            assert client.get_map("m").get("k") == 1
            client.get_map("m").put("k", 2)
            assert client.get_map("m").get("k") == 2
        member_pids = [m["pid"] for m in cluster.registry["members"]]
        out = cluster.cli("stop").stdout
        assert "orphaned" in out
        assert not any(pid_alive(p) for p in member_pids)
        assert _segments(cluster.cluster_name) == []
    finally:
        cluster.stop()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_foreground_start_stops_cleanly_on_signal(sig):
    name = test_cluster_name("fg")
    registry = Path(os.environ["SHMGRID_REGISTRY_DIR"]) / f"{name}.json"
    proc = subprocess.Popen([sys.executable, "-m", "grid", "start", "--cluster-name", name,
                             "--members", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (registry.exists() and read_registry(registry).get("state") == "ready"):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "foreground cluster did not become ready"
            time.sleep(0.05)
        pids = [m["pid"] for m in read_registry(registry)["members"]]
        with grid.connect(cluster_name=name) as client:
            client.get_map("m").put_all({i: i for i in range(100)})
        assert _segments(name)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "is running" in out and "Ctrl-C" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert not registry.exists()
    assert not any(pid_alive(pid) for pid in pids)
    assert _segments(name) == []
