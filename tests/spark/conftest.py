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


@pytest.fixture
def map_name() -> str:
    """A map name no other test uses."""
    return f"t_{uuid.uuid4().hex[:10]}"
