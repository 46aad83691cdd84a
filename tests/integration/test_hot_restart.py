"""Hot restart on real processes (issue 11, seed 003): members write every mutation to their
folders; a cluster stopped, or killed with its supervisor, starts again from them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

import grid
from grid.client.registry import pid_alive
from tests.conftest import run_cli
from tests.integration.test_failover import Writers, _assert_all_readable, _status, _wait
from tests.integration.test_migrations import _wait_safe
from workers.journal import SLOW_DISK_ENV

pytestmark = pytest.mark.timeout(300)


def _restart(cluster, data_dir, *extra: str, check: bool = True):
    return run_cli("start", "--detach", "--cluster-name", cluster.cluster_name, "--data-dir",
                   str(data_dir), *extra, check=check, timeout=120)


def _kill_everything(cluster) -> None:
    """kill -9 of the supervisor and every member, at once (a host that lost power)."""
    registry = cluster.registry
    pids = [registry["supervisor"]["pid"], *(m["pid"] for m in registry["members"])]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    _wait(lambda: not any(pid_alive(pid) for pid in pids), what="every process to die")


def test_a_stopped_cluster_restarts_with_its_data_identity_and_state(cluster_factory,
                                                                      tmp_path):
    cluster = cluster_factory(members=3, data_dir=tmp_path)
    uuids = {m["name"]: m["uuid"] for m in cluster.registry["members"]}
    with cluster.connect() as client:
        m = client.get_map("kept")
        m.put_all({f"k{i}": i for i in range(3000)})
        m.set("one", 1)
        m.remove("k7")
        m2 = client.get_map("other")
        m2.set("x", "y")
        client.cluster.change_state("FROZEN")
    cluster.cli("stop")
    assert sorted(os.listdir(tmp_path)) == ["member-0", "member-1", "member-2"]
    _restart(cluster, tmp_path)
    assert {m["name"]: m["uuid"] for m in cluster.registry["members"]} == uuids
    with cluster.connect() as client:
        m = client.get_map("kept")
        assert m.size() == 3000 and m.get("k7") is None and m.get("one") == 1
        assert m.get_all([f"k{i}" for i in range(3000)]) == {
            f"k{i}": i for i in range(3000) if i != 7}
        assert client.get_map("other").get("x") == "y"
        assert client.cluster.state == "FROZEN", "the state from before the stop"
    status = _status(cluster)
    assert status["safe"], status


@pytest.mark.parametrize("slow_disk", [False, True], ids=["disk", "slow-disk"])
def test_kill_minus_9_of_everything_under_writes_loses_no_acknowledged_write(
        cluster_factory, tmp_path, monkeypatch, slow_disk):
    """R4: with fsync always, an owner answers a write only once it is on disk. The slow
    disk (each log write waits 30 ms) leaves writes queued when the kill comes: an owner
    that answered before its log had them would lose them here."""
    if slow_disk:
        monkeypatch.setenv(SLOW_DISK_ENV, "0.03")
    cluster = cluster_factory(members=3, data_dir=tmp_path, fsync="always")
    # The writers' last calls meet a dead cluster: they give up after 2 s (not counted).
    with Writers(cluster, invocation_timeout=2) as writers:
        writers.wait_for(300 if slow_disk else 1500)
        _kill_everything(cluster)
    acked = dict(writers.acked)
    monkeypatch.delenv(SLOW_DISK_ENV, raising=False)
    _restart(cluster, tmp_path, "--fsync", "always")
    _assert_all_readable(cluster, acked)
    assert _status(cluster)["safe"]


def test_a_copied_folder_starts_a_new_cluster_and_mismatches_are_refused(cluster_factory,
                                                                         tmp_path):
    """Seed 003 requirement 9: move (copy) the files, start them under another name."""
    source = tmp_path / "a"
    cluster = cluster_factory(members=2, data_dir=source)
    with cluster.connect() as client:
        client.get_map("m").put_all({i: i for i in range(500)})
    cluster.cli("stop")
    copy = tmp_path / "b"
    shutil.copytree(source, copy)
    name = cluster.cluster_name + "b"
    try:
        run_cli("start", "--detach", "--cluster-name", name, "--data-dir", str(copy),
                timeout=120)
        with grid.connect(cluster_name=name) as client:
            assert client.get_map("m").get_all(list(range(500))) == {i: i for i in range(500)}
    finally:
        run_cli("stop", "--cluster-name", name, check=False)
    # What cannot be loaded is refused, saying exactly what differs.
    other_count = _restart(cluster, source, "--partition-count", "97", check=False)
    assert other_count.returncode != 0
    assert "partition_count 271 there, 97 here" in other_count.stdout + other_count.stderr
    other_members = _restart(cluster, source, "--members", "3", check=False)
    assert other_members.returncode == 1
    assert "holds 2 members' folders" in other_members.stderr
    shutil.copytree(copy / "member-1", source / "member-9")  # a folder of another cluster
    (source / "member-9" / "meta" / "identity.meta").unlink()
    run_cli("start", "--detach", "--cluster-name", name, "--members", "1", "--data-dir",
            str(tmp_path / "c"), timeout=120)
    run_cli("stop", "--cluster-name", name)
    shutil.copytree(tmp_path / "c" / "member-0", source / "member-9", dirs_exist_ok=True)
    mixed = _restart(cluster, source, check=False)
    assert mixed.returncode == 1 and "disagree on cluster_name" in mixed.stderr, mixed.stderr


def test_a_missing_member_fails_the_restart_naming_what_is_missing(cluster_factory,
                                                                   tmp_path):
    """full_recovery_only: the saved table names a member whose folder is gone."""
    cluster = cluster_factory(members=3, data_dir=tmp_path)
    with cluster.connect() as client:
        client.get_map("m").put_all({i: i for i in range(100)})
    cluster.cli("stop")
    shutil.rmtree(tmp_path / "member-2")
    failed = _restart(cluster, tmp_path, check=False)
    assert failed.returncode != 0
    assert "missing" in failed.stdout + failed.stderr, failed.stdout + failed.stderr
    # force-start: asks first, then deletes every member's files and starts empty.
    asked = subprocess.run([sys.executable, "-m", "grid", "force-start", "--cluster-name",
                            cluster.cluster_name, "--data-dir", str(tmp_path), "--detach"],
                           input="n\n", capture_output=True, text=True, timeout=60)
    assert asked.returncode == 1 and "nothing deleted" in asked.stdout
    assert sorted(os.listdir(tmp_path)) == ["member-0", "member-1"]
    run_cli("force-start", "--cluster-name", cluster.cluster_name, "--data-dir", str(tmp_path),
            "--detach", "--yes", timeout=120)
    with cluster.connect() as client:
        assert client.get_map("m").size() == 0
    assert sorted(os.listdir(tmp_path)) == ["member-0", "member-1", "member-2"]


def test_a_backup_taken_under_writes_restarts_as_a_cluster(cluster_factory, tmp_path):
    cluster = cluster_factory(members=3, data_dir=tmp_path / "live")
    with Writers(cluster) as writers:
        writers.wait_for(500)
        with writers.lock:
            before = dict(writers.acked)
        out = cluster.cli("backup", str(tmp_path / "copy")).stdout
        assert out.count("segments up to record") == 3 and "restart from it" in out
    cluster.cli("stop")
    name = cluster.cluster_name + "c"
    try:
        run_cli("start", "--detach", "--cluster-name", name, "--data-dir",
                str(tmp_path / "copy"), timeout=120)
        with grid.connect(cluster_name=name) as client:
            got = client.get_map("acked").get_all(list(before))
        assert got == before, "every write acknowledged before the backup is in it"
    finally:
        run_cli("stop", "--cluster-name", name, check=False)
    refused = cluster_factory(members=1).cli("backup", str(tmp_path / "x"), check=False)
    assert refused.returncode == 1 and "without --data-dir" in refused.stderr


@pytest.mark.parametrize("policy", ["partial_recovery_most_recent",
                                    "partial_recovery_most_complete"])
def test_partial_recovery_restarts_without_a_missing_member(cluster_factory, tmp_path,
                                                           monkeypatch, policy):
    cluster = cluster_factory(members=3, data_dir=tmp_path)
    with cluster.connect() as client:
        client.get_map("m").put_all({i: i for i in range(2000)})
    cluster.cli("stop")
    shutil.rmtree(tmp_path / "member-1")
    monkeypatch.setenv("SHMGRID_RESTART_POLICY", policy)
    _restart(cluster, tmp_path)
    status = _wait_safe(cluster)
    assert {m["name"] for m in status["members"]} == {"member-0", "member-2"}
    with cluster.connect() as client:
        # Backup 1: every partition had a replica on a member that came back.
        assert client.get_map("m").get_all(list(range(2000))) == {i: i for i in range(2000)}


@pytest.mark.parametrize("auto_remove", [True, False], ids=["wiped", "removed"])
def test_a_member_with_stale_files_is_wiped_or_removed(cluster_factory, tmp_path,
                                                       monkeypatch, auto_remove):
    """member-2's folder is put back as it was before the cluster moved on: its table is
    older than the others', its data stale."""
    cluster = cluster_factory(members=3, data_dir=tmp_path / "d")
    with cluster.connect() as client:
        client.get_map("m").put_all({i: "old" for i in range(1000)})
    cluster.cli("stop")
    shutil.copytree(tmp_path / "d" / "member-2", tmp_path / "old-member-2")
    _restart(cluster, tmp_path / "d")
    cluster.cli("add-member")  # the table moves on: partitions migrate to member-3
    _wait_safe(cluster)
    with cluster.connect() as client:
        client.get_map("m").put_all({i: "new" for i in range(1000)})
    cluster.cli("stop")
    shutil.rmtree(tmp_path / "d" / "member-2")
    shutil.copytree(tmp_path / "old-member-2", tmp_path / "d" / "member-2")
    refused = _restart(cluster, tmp_path / "d", check=False)
    assert refused.returncode != 0 and "member-2 restored another table" in (
        refused.stdout + refused.stderr)
    monkeypatch.setenv("SHMGRID_RESTART_POLICY", "partial_recovery_most_recent")
    monkeypatch.setenv("SHMGRID_AUTO_REMOVE_STALE_DATA", str(auto_remove).lower())
    _restart(cluster, tmp_path / "d")
    status = _wait_safe(cluster)
    names = {m["name"] for m in status["members"]}
    assert names == ({"member-0", "member-1", "member-2", "member-3"} if auto_remove
                     else {"member-0", "member-1", "member-3"}), status
    with cluster.connect() as client:
        assert set(client.get_map("m").get_all(list(range(1000))).values()) == {"new"}
    assert (tmp_path / "d" / "member-2" / "meta").is_dir(), "the folder is kept either way"


def _owned(cluster) -> dict[int, str]:
    with cluster.connect() as client:
        owners = client.partition_owners()
        names = {m.uuid: m.name for m in client.cluster.members}
    return {pid: names.get(uuid, uuid) for pid, uuid in owners.items()}


@pytest.mark.parametrize("how", ["restart-member", "restart_on_crash"])
def test_a_member_restarted_in_stable_cluster_takes_back_its_partitions(
        cluster_factory, tmp_path, monkeypatch, how):
    """Seed 003's STABLE_CLUSTER: no new member joins, nothing rebalances, and a member
    that left comes back from its files and owns its partitions of the stable table again;
    under writes, nothing acknowledged is lost."""
    if how == "restart_on_crash":
        monkeypatch.setenv("SHMGRID_RESTART_ON_CRASH", "true")
    cluster = cluster_factory(members=3, data_dir=tmp_path)
    with cluster.connect() as client:
        client.cluster.change_state("STABLE_CLUSTER")
    stable = _owned(cluster)
    refused = cluster.cli("add-member", check=False)
    assert refused.returncode == 1 and "STABLE_CLUSTER" in refused.stderr
    old_pid = cluster.member("member-1")["pid"]
    with Writers(cluster) as writers:
        writers.wait_for(300)
        if how == "restart-member":
            out = cluster.cli("restart-member", "member-1").stdout
            assert "restarted member-1" in out
        else:
            os.kill(old_pid, signal.SIGKILL)
        _wait(lambda: any(m["name"] == "member-1" and m["pid"] != old_pid
                          for m in cluster.registry["members"]), what="member-1 back")
        status = _wait_safe(cluster)
        writers.wait_for(300)
    assert not writers.failures, writers.failures
    assert status["state"] == "STABLE_CLUSTER" and status["safe"], status
    assert _owned(cluster) == stable, "every partition has its stable owner again"
    _assert_all_readable(cluster, writers.acked)


def test_damaged_files_restart_with_everything_before_the_damage_or_a_clear_error(
        cluster_factory, tmp_path):
    cluster = cluster_factory(members=3, data_dir=tmp_path)
    with cluster.connect() as client:
        client.get_map("m").put_all({i: i for i in range(2000)})
    cluster.cli("stop")
    # A torn tail: a write cut short at the end of member-0's newest segment.
    log_dir = tmp_path / "member-0" / "log"
    newest = sorted(p for p in log_dir.iterdir() if p.name.startswith("segment-"))[-1]
    with open(newest, "ab") as f:
        f.write(os.urandom(100))
    _restart(cluster, tmp_path)
    with cluster.connect() as client:
        assert client.get_map("m").get_all(list(range(2000))) == {i: i for i in range(2000)}
    assert _wait_safe(cluster)["safe"]
    cluster.cli("stop")
    # Damaged metadata: refused, naming the member and the file.
    view = tmp_path / "member-1" / "meta" / "view.meta"
    data = bytearray(view.read_bytes())
    data[-5] ^= 0xFF
    view.write_bytes(bytes(data))
    failed = _restart(cluster, tmp_path, check=False)
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "member-1" in output and "view.meta" in output, output
