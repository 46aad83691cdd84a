"""``shmgrid dashboard``: a live web view of one cluster, on 127.0.0.1.

Served by aiohttp: one package gives the HTTP server, the server-sent event stream and the
static files, with no ASGI server beside it (Starlette would need uvicorn and sse-starlette).
The page (grid/dashboard/static/, no build step, no CDN) draws what the collector
(grid/dashboard/collector.py) polls; the event stream pushes each snapshot and timeline event.

Every request needs the access token: ``?token=`` in the URL the command prints (the page then
keeps it in a same-site cookie), and for actions also the ``X-Token`` header, which a page of
another site cannot send. Actions run the `shmgrid` command itself, so they take the paths the
CLI takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from grid.cluster.state import ClusterState
from grid.dashboard.collector import Collector

STATIC = Path(__file__).with_name("static")
ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}
COOKIE = "shmgrid_dashboard"
STATES = tuple(state.value for state in ClusterState)
ACTION_TIMEOUT_S = 180.0
KEEPALIVE_S = 15.0

TOKEN_KEY = web.AppKey("token", str)
HUB_KEY = web.AppKey("hub", "Hub")
COLLECTOR_KEY = web.AppKey("collector", Collector)


class Hub:
    """The open event streams: each has a queue; the collector's thread publishes into all."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queues: set[asyncio.Queue[tuple[str, dict[str, Any]]]] = set()

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        """From any thread."""
        self.loop.call_soon_threadsafe(self._put, kind, data)

    def _put(self, kind: str, data: dict[str, Any]) -> None:
        for queue in self.queues:
            if queue.qsize() < 1000:  # a stalled page loses updates, not the server memory
                queue.put_nowait((kind, data))


def _token_ok(request: web.Request, *, header: bool = False) -> bool:
    token = request.app[TOKEN_KEY]
    given = request.headers.get("X-Token", "") if header else \
        request.query.get("token") or request.cookies.get(COOKIE, "")
    return hmac.compare_digest(given.encode(), token.encode())


@web.middleware
async def _require_token(request: web.Request, handler: Any) -> web.StreamResponse:
    if not _token_ok(request, header=request.method == "POST"):
        return web.Response(status=403, text="a valid access token is needed: use the URL "
                                             "`shmgrid dashboard` printed\n")
    return await handler(request)


async def _index(request: web.Request) -> web.Response:
    response = web.FileResponse(STATIC / "index.html")
    response.set_cookie(COOKIE, request.app[TOKEN_KEY], httponly=True, samesite="Strict")
    return response


async def _asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.FileResponse(STATIC / name, headers={"Content-Type": ASSETS[name]})


async def _status(request: web.Request) -> web.Response:
    collector = request.app[COLLECTOR_KEY]
    return web.json_response({"snapshot": collector.snapshot,
                              "timeline": list(collector.timeline)})


async def _stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events: "snapshot" (the whole view) and "event" (a timeline entry); the
    first messages are the current snapshot and the timeline so far."""
    hub, collector = request.app[HUB_KEY], request.app[COLLECTOR_KEY]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
    hub.queues.add(queue)
    try:
        for event in list(collector.timeline):
            await _send(response, "event", event)
        if collector.snapshot is not None:
            await _send(response, "snapshot", collector.snapshot)
        while True:
            try:
                kind, data = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                continue
            await _send(response, kind, data)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        hub.queues.discard(queue)
    return response


async def _send(response: web.StreamResponse, kind: str, data: dict[str, Any]) -> None:
    await response.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())


def action_command(body: Any, members: list[str]) -> list[str]:
    """The `shmgrid` arguments for an action the page asks for; ValueError if it is not one
    or names no member of the cluster."""
    if not isinstance(body, dict):
        raise ValueError("an action is a JSON object")
    action, member = body.get("action"), body.get("member")
    needs_member = {"kill": [], "pause": ["--signal", "STOP"], "resume": ["--signal", "CONT"],
                    "stop-member": [], "promote": []}
    if action in needs_member:
        if member not in members:
            raise ValueError(f"{action} needs a member of the cluster, not {member!r}")
        verb = "kill" if action in ("kill", "pause", "resume") else action
        return [verb, member, *needs_member[action]]
    if action == "add-member":
        return ["add-member", *(["--lite"] if body.get("lite") else [])]
    if action == "state":
        if body.get("state") not in STATES:
            raise ValueError(f"state is one of {', '.join(STATES)}")
        return ["state", body["state"]]
    raise ValueError(f"unknown action {action!r}")


async def _action(request: web.Request) -> web.Response:
    collector = request.app[COLLECTOR_KEY]
    snapshot = collector.snapshot or {}
    try:
        body = await request.json()
        args = action_command(body, [m["name"] for m in snapshot.get("members", [])])
    except (ValueError, json.JSONDecodeError) as exc:
        return web.json_response({"ok": False, "output": str(exc)}, status=400)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grid", *args, "--cluster-name", collector.cluster_name,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        output, _ = await asyncio.wait_for(process.communicate(), ACTION_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        return web.json_response({"ok": False, "output": "timed out"}, status=504)
    return web.json_response({"ok": process.returncode == 0,
                              "command": "shmgrid " + " ".join(args),
                              "output": output.decode(errors="replace")[-4000:]})


def make_app(cluster_name: str, token: str, loop: asyncio.AbstractEventLoop
             ) -> tuple[web.Application, Collector]:
    hub = Hub(loop)
    collector = Collector(cluster_name, hub.publish)
    app = web.Application(middlewares=[_require_token])
    app[TOKEN_KEY], app[HUB_KEY], app[COLLECTOR_KEY] = token, hub, collector
    app.router.add_get("/", _index)
    app.router.add_get("/static/{name}", _asset)
    app.router.add_get("/api/status", _status)
    app.router.add_get("/api/stream", _stream)
    app.router.add_post("/api/action", _action)
    return app, collector


async def serve(cluster_name: str, host: str, port: int, ready: Any = print) -> None:
    """Serve until the cluster stops (or the task is cancelled); ``ready(url)`` once the
    port is bound."""
    token = secrets.token_urlsafe(18)
    app, collector = make_app(cluster_name, token, asyncio.get_running_loop())
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    collector.start()
    ready(f"http://{host}:{bound}/?token={token}")
    try:
        while not collector.gone.is_set():
            await asyncio.sleep(0.5)
    finally:
        collector.stop()
        with contextlib.suppress(Exception):
            await runner.cleanup()
