"""Fixtures of the connector tests: a fake grid for Spark-less tests, one SparkSession per run.

The session is created at most once per test run (a cold start costs 10 to 20 s here) and is
stopped, JVM included, at the end, so no Spark process outlives the run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.spark import fake_grid as fake_module


@pytest.fixture
def fake_grid(monkeypatch: pytest.MonkeyPatch) -> Iterator[fake_module.FakeGrid]:
    """A fresh in-process fake grid that the connector connects to (no cluster, no Spark)."""
    from grid.spark import connection

    grid = fake_module.FakeGrid()
    monkeypatch.setattr(fake_module, "current", grid)
    monkeypatch.setenv(connection.factory_env_var, "tests.spark.fake_grid:connect")
    connection.close_all_clients()
    yield grid
    connection.close_all_clients()


@pytest.fixture(scope="session")
def spark():
    """One local[2,2] session for the whole run: two cores, a failed task is tried twice."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from grid.spark.local import local_session, stop_local_session

    session = local_session("shmgrid-tests", "local[2,2]", driver_memory="1g")
    try:
        yield session
    finally:
        stop_local_session(session)


@pytest.fixture(autouse=True)
def _maps_cleared_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the shared real cluster, clear every map it holds. Each fragment is a
    shared-memory segment: a cluster that kept every Spark test's maps (and staging maps)
    holds thousands of them, and every later test that lists /dev/shm slows down with it."""
    yield
    if "grid_cluster" not in request.fixturenames:
        return
    with request.getfixturevalue("grid_cluster").connect() as client:
        names = {name for _, status in client.cluster.members_status(5.0)
                 for name in (status or {}).get("maps") or ()}
        for name in names:
            client.get_map(name).clear()


@pytest.fixture
def map_name() -> str:
    """A map name no other test uses."""
    return f"t_{uuid.uuid4().hex[:10]}"
