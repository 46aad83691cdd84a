"""`shmgrid dashboard` against a real cluster: the token, the JSON it serves, the event stream
seeing a kill, and actions through the CLI's paths."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import psutil
import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.timeout(120)


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    if token is not None:
        url += ("&" if "?" in url else "?") + f"token={token}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(dashboard, body: dict, header_token: str | None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{dashboard.base}/api/action?token={dashboard.token}", json.dumps(body).encode(),
        {"Content-Type": "application/json",
         **({"X-Token": header_token} if header_token is not None else {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}") if exc.code != 403 else {}


def wait_snapshot(dashboard, predicate, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = get(f"{dashboard.base}/api/status", dashboard.token)
        snapshot = json.loads(body)["snapshot"] if status == 200 else None
        if snapshot and predicate(snapshot):
            return snapshot
        time.sleep(0.2)
    raise AssertionError(f"no snapshot matched in {timeout} s")


def test_every_request_needs_the_token(dashboard):
    for path in ("/", "/api/status", "/api/stream", "/static/app.js"):
        assert get(dashboard.base + path)[0] == 403
        assert get(dashboard.base + path, "not-the-token")[0] == 403
    status, page = get(dashboard.base + "/", dashboard.token)
    assert status == 200 and b"shmgrid" in page
    assert get(dashboard.base + "/static/app.js", dashboard.token)[0] == 200
    assert get(dashboard.base + "/static/nope.js", dashboard.token)[0] == 404
    # An action needs the token in a header too: a page of another site cannot send one.
    assert post(dashboard, {"action": "add-member"}, None)[0] == 403
    assert post(dashboard, {"action": "add-member"}, "wrong")[0] == 403


def test_the_status_has_members_table_maps_and_timeline(dashboard):
    client = dashboard.cluster.connect()
    client.get_map("orders").put_all({f"o{i}": b"x" for i in range(500)})
    snapshot = wait_snapshot(dashboard, lambda s: s["maps"].get("orders") == 500)
    assert snapshot["cluster"] == dashboard.cluster.cluster_name
    assert snapshot["state"] == "ACTIVE" and snapshot["safe"] is True
    assert [m["name"] for m in snapshot["members"]] == ["member-0", "member-1", "member-2"]
    assert all(m["process"] == "running" and m["in_cluster"] for m in snapshot["members"])
    assert sum(m["owned"] for m in snapshot["members"]) == 271
    assert {m["role"] for m in snapshot["members"]} == {"master", "member"}
    table = snapshot["table"]
    assert table["partition_count"] == 271 and None not in table["owners"]
    assert all(len(b) == 1 for b in table["backups"])
    assert table["short"] == table["migrating"] == table["lost"] == []
    _, body = get(f"{dashboard.base}/api/status", dashboard.token)
    timeline = json.loads(body)["timeline"]
    assert [e["member"] for e in timeline if e["type"] == "member_joined"] == [
        "member-1", "member-2"] or len(timeline) >= 2


class Stream:
    """The event stream, read in a thread: (arrival time, kind, data) for each message."""

    def __init__(self, dashboard) -> None:
        url = urlparse(dashboard.base)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        self.conn.request("GET", f"/api/stream?token={dashboard.token}")
        self.response = self.conn.getresponse()
        assert self.response.status == 200
        assert self.response.getheader("Content-Type") == "text/event-stream"
        self.messages: list[tuple[float, str, dict]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        kind = None
        try:
            for raw in self.response:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    self.messages.append((time.monotonic(), kind, json.loads(line[6:])))
        except (OSError, ValueError, AttributeError):  # AttributeError: closed under us
            pass

    def first(self, predicate, after: float, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, kind, data in list(self.messages):
                if at >= after and predicate(kind, data):
                    return at
            time.sleep(0.02)
        kinds = [(kind, data.get("type")) for _, kind, data in self.messages[-5:]]
        raise AssertionError(f"nothing matched in {timeout} s; the last messages: {kinds}")

    def close(self) -> None:
        self.conn.close()


def dead(name):
    return lambda kind, data: kind == "snapshot" and any(
        m["name"] == name and m["process"] == "dead" for m in data["members"])


def test_the_stream_sees_a_kill_within_a_second_and_the_migrations_after(dashboard):
    stream = Stream(dashboard)
    try:
        stream.first(lambda kind, data: kind == "snapshot", 0, 10)
        pid = dashboard.cluster.member("member-2")["pid"]
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        seen = stream.first(dead("member-2"), killed_at, 5)
        assert seen - killed_at < 1.0, seen - killed_at
        stream.first(lambda kind, data: kind == "event" and data["type"] == "member_removed"
                     and data["members"] == ["member-2"], killed_at, 10)
        safe = stream.first(lambda kind, data: kind == "event"
                            and data["type"] == "cluster_safe", killed_at, 60)
        assert safe > killed_at
        assert any(kind == "event" and data["type"] == "migration_started"
                   for _, kind, data in stream.messages)
    finally:
        stream.close()


def test_actions_go_through_the_cli(dashboard):
    wait_snapshot(dashboard, lambda s: len(s["members"]) == 3)
    status, result = post(dashboard, {"action": "add-member", "lite": True}, dashboard.token)
    assert status == 200 and result["ok"], result
    assert result["command"] == "shmgrid add-member --lite"
    snapshot = wait_snapshot(dashboard, lambda s: any(m["role"] == "lite"
                                                      for m in s["members"]))
    lite = next(m["name"] for m in snapshot["members"] if m["role"] == "lite")
    status, result = post(dashboard, {"action": "pause", "member": "member-1"},
                          dashboard.token)
    assert status == 200 and result["ok"], result
    wait_snapshot(dashboard, lambda s: any(m["name"] == "member-1" and m["process"] == "paused"
                                           for m in s["members"]), 5)
    for body in ({"action": "resume", "member": "member-1"},
                 {"action": "promote", "member": lite}):
        status, result = post(dashboard, body, dashboard.token)
        assert status == 200 and result["ok"], result
    # A state change is refused while migrations run: wait, as a user would, until the
    # promoted member got its share and the cluster is quiet.
    wait_snapshot(dashboard, lambda s: s["safe"] and not s["migrations"].get("active") and any(
        m["name"] == lite and m["role"] == "member" and m["owned"] for m in s["members"]), 60)
    status, result = post(dashboard, {"action": "state", "state": "FROZEN"}, dashboard.token)
    assert status == 200 and result["ok"], result
    wait_snapshot(dashboard, lambda s: s["state"] == "FROZEN")
    status, result = post(dashboard, {"action": "kill", "member": "member-9"}, dashboard.token)
    assert status == 400 and "member-9" in result["output"]


def test_the_dashboard_ends_with_its_cluster(dashboard):
    run_cli("stop", "--cluster-name", dashboard.cluster.cluster_name)
    assert dashboard.process.wait(15) == 0


def test_start_with_dashboard_serves_it_until_the_cluster_stops():
    from tests.conftest import test_cluster_name

    name = test_cluster_name()
    result = run_cli("start", "--detach", "--dashboard", "--members", "2",
                     "--cluster-name", name)
    try:
        url = next(line.removeprefix("dashboard: ") for line in result.stdout.splitlines()
                   if line.startswith("dashboard: "))
        assert get(url)[0] == 200
    finally:
        run_cli("stop", "--cluster-name", name)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(
            name in " ".join(p.info["cmdline"] or ()) for p in psutil.process_iter(["cmdline"])):
        time.sleep(0.2)
    assert not any(name in " ".join(p.info["cmdline"] or ())
                   for p in psutil.process_iter(["cmdline"]))
