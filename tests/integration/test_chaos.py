"""`shmgrid chaos` end to end (issue 13): a short run against the real grid passes, and the
same run against a member that acknowledges writes before its backups have them (a debug
switch) is caught; attached to a running cluster, a run leaves it running as it was."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from workers.member import ACK_EARLY_ENV

pytestmark = pytest.mark.timeout(300)

RUN = ["chaos", "--duration", "13s", "--seed", "3", "--clients", "2", "--keys", "200",
       "--faults", "kill=1,master-kill=1,pause=1", "--fault-interval", "3s",
       "--heartbeat-timeout", "2", "--json"]


def test_a_short_run_against_the_grid_is_valid(tmp_path):
    result = run_cli(*RUN, "--out", str(tmp_path), timeout=240)
    report = json.loads(result.stdout[result.stdout.index("{"):result.stdout.rindex("}") + 1])
    assert report["valid"] and report["violations"] == 0, report["verdict"]
    assert report["ok"] > 1000 and sum(report["faults_by_kind"].values()) >= 3, report
    assert report["beyond_promise"] == 0
    # For each kind of fault, how long writes to the partitions it hit waited.
    assert set(report["worst_unavailability"]) == set(report["faults_by_kind"])
    assert all(0 <= s < 30 for s in report["worst_unavailability"].values()), report
    assert {p.name for p in tmp_path.iterdir()} >= {"history.jsonl", "faults.json",
                                                     "report.json", "timeline.png"}
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert len(lines) == report["operations"]


def test_a_short_run_with_local_reads_is_valid(tmp_path):
    """Gets from the owners' shared memory, through kills, a master kill and a pause: the
    checker finds every key linearizable."""
    result = run_cli(*RUN, "--local-reads", "--out", str(tmp_path), timeout=240)
    report = json.loads(result.stdout[result.stdout.index("{"):result.stdout.rindex("}") + 1])
    assert report["valid"] and report["violations"] == 0, report["verdict"]
    assert report["local_gets"] > 500, f"only {report['local_gets']} gets read locally"


def test_a_grid_that_acknowledges_early_is_caught(tmp_path, monkeypatch):
    monkeypatch.setenv(ACK_EARLY_ENV, "1")
    result = run_cli(*RUN, "--out", str(tmp_path), timeout=240, check=False)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert not report["valid"] and report["violations"] > 0
    assert report["verdict"]["lost_writes"] or report["verdict"]["failures"]


def test_attached_to_a_running_cluster_it_takes_its_settings_and_leaves_it_running(
        tmp_path, cluster_factory):
    cluster = cluster_factory(members=3, heartbeat_timeout=2)
    run = ["chaos", "--duration", "12s", "--seed", "2", "--clients", "2", "--keys", "200",
           "--faults", "state-change=3,kill=1", "--fault-interval", "3s", "--json",
           "--out", str(tmp_path)]
    cluster.cli("state", "NO_MIGRATION")
    refused = cluster.cli(*run, check=False)
    assert refused.returncode == 2 and "needs ACTIVE" in refused.stderr, refused.stderr
    cluster.cli("state", "ACTIVE")
    result = cluster.cli(*run, timeout=240)
    report = json.loads(result.stdout[result.stdout.index("{"):result.stdout.rindex("}") + 1])
    assert report["valid"], report["verdict"]
    options = report["options"]
    assert (options["members"], options["heartbeat_timeout"], options["backup_count"]) == \
        (3, 2.0, 1)
    changes = [f for f in report["faults"] if f["kind"] == "state-change"]
    assert changes and all(f["note"].endswith(" s") for f in changes), changes
    status = json.loads(cluster.cli("status", "--json").stdout)
    assert status["state"] == "ACTIVE"
    assert sum(not m["lite"] for m in status["members"]) == 3  # the kill was made good


def test_bad_options_are_refused_with_a_reason(tmp_path):
    result = run_cli("chaos", "--faults", "kill=1,explode=1", "--out", str(tmp_path),
                     check=False)
    assert result.returncode == 2 and "explode" in result.stderr
    result = run_cli("chaos", "--cluster-name", "nosuchcluster", "--out", str(tmp_path),
                     check=False)
    assert result.returncode == 2 and "nosuchcluster" in result.stderr, result.stderr
