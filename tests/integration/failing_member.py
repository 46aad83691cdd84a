"""A member entry point for tests: the member named in $SHMGRID_TEST_FAIL_START reports a
start failure (as a member that cannot bind or load does); the others start normally."""

import os
from typing import Any

from workers.member import run_member

FAIL_START_ENV = "SHMGRID_TEST_FAIL_START"


def run_member_or_fail(config_dict: dict[str, Any], name: str, join_endpoints: list[str],
                       supervisor_endpoint: str | None, lite: bool, ready: Any) -> None:
    if name == os.environ.get(FAIL_START_ENV):
        ready.send({"error": "RuntimeError('injected start failure')"})
        ready.close()
        raise SystemExit(1)
    run_member(config_dict, name, join_endpoints, supervisor_endpoint, lite, ready)
