"""The registry file the supervisor writes and clients read: how to find a local cluster."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import psutil

from grid.config import registry_dir
from grid.errors import ClusterNotRunningError

DEFAULT_CLUSTER_NAME = "dev"
REGISTRY_MODE = 0o600  # the file holds the cluster secret: its owner alone may read it
# How far a process's start time may differ from the one recorded (psutil derives it from the
# boot time, which moves when the wall clock is stepped); a pid the system has given to
# another process since does not start within this of the recorded time.
CREATE_TIME_TOLERANCE_S = 1.0


def registry_path(cluster_name: str | None = None, directory: str = "") -> Path:
    return registry_dir(directory) / f"{cluster_name or DEFAULT_CLUSTER_NAME}.json"


def write_registry(path: Path, data: dict[str, Any]) -> None:
    """Atomically replace the registry file (readers never see half of it), mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.fchmod(fd, REGISTRY_MODE)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def read_registry(path: Path) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ClusterNotRunningError(str(path), "no registry file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ClusterNotRunningError(str(path), f"unreadable registry: {exc}") from None
    if not isinstance(data, dict) or "members" not in data:
        raise ClusterNotRunningError(str(path), "registry file has no member list")
    return data


def live_member_endpoints(data: dict[str, Any]) -> list[str]:
    """Endpoints of registered members whose process still exists."""
    return [m["endpoint"] for m in data.get("members", []) if pid_alive(m.get("pid"))]


def pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def create_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), None if there is none."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def is_registered_process(entry: dict[str, Any]) -> bool:
    """Whether the process a registry entry names (``pid``, ``create_time``) still runs and
    is that process, not an unrelated one that was given the same pid since. An entry without
    a start time is never taken for ours."""
    pid, created = entry.get("pid"), entry.get("create_time")
    if not pid_alive(pid) or not isinstance(created, int | float):
        return False
    started = create_time(pid)
    return started is not None and abs(started - created) <= CREATE_TIME_TOLERANCE_S
