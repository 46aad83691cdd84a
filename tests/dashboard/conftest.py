"""A running cluster with `shmgrid dashboard` serving it, for the dashboard's tests."""

from __future__ import annotations

import select
import subprocess
import sys
from dataclasses import dataclass
from urllib.parse import parse_qs, urlparse

import pytest

from tests.conftest import ClusterHandle


@dataclass
class Dashboard:
    cluster: ClusterHandle
    url: str  # with the token
    process: subprocess.Popen

    @property
    def base(self) -> str:
        return self.url.split("?")[0].rstrip("/")

    @property
    def token(self) -> str:
        return parse_qs(urlparse(self.url).query)["token"][0]


@pytest.fixture
def dashboard(cluster_factory):
    cluster = cluster_factory(members=3, heartbeat_timeout=3)
    process = subprocess.Popen(
        [sys.executable, "-m", "grid", "dashboard", "--cluster-name", cluster.cluster_name],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 30)
        line = process.stdout.readline().decode().strip() if ready else ""
        assert line.startswith("dashboard: http://127.0.0.1:"), line
        yield Dashboard(cluster, line.removeprefix("dashboard: "), process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
