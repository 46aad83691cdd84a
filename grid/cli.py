"""The ``shmgrid`` command: start, stop, inspect and disturb a local cluster."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from grid import protocol as p
from grid.client.registry import is_registered_process, pid_alive, read_registry, registry_path
from grid.config import SECRET_ENV, GridConfig
from grid.errors import ClusterNotRunningError, GridError

DETACH_WAIT_S = 60.0
DASHBOARD_WAIT_S = 30.0
WAIT_POLL_S = 0.2
STOP_WAIT_S = 20.0
ORPHAN_EXIT_WAIT_S = 5.0  # how long `stop` waits for the members it killed to be gone


def _config(args: argparse.Namespace) -> GridConfig:
    return GridConfig.load(
        getattr(args, "config", None), cluster_name=args.cluster_name,
        members=getattr(args, "members", None),
        backup_count=getattr(args, "backup_count", None),
        async_backup_count=getattr(args, "async_backup_count", None),
        backup_placement=getattr(args, "backup_placement", None),
        backup_sync_interval=getattr(args, "backup_sync_interval", None),
        partition_count=getattr(args, "partition_count", None),
        heartbeat_interval=getattr(args, "heartbeat_interval", None),
        heartbeat_timeout=getattr(args, "heartbeat_timeout", None),
        persistence_dir=os.path.abspath(args.data_dir) if getattr(args, "data_dir", None)
        else None,
        persistence_fsync=getattr(args, "fsync", None))


def _registry(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    path = registry_path(args.cluster_name or GridConfig.load().cluster_name)
    return path, read_registry(path)


def _supervisor_call(data: dict[str, Any], op: str, timeout: float = 10.0,
                     **fields: Any) -> dict[str, Any] | None:
    """A command to the supervisor, with the cluster secret from the registry file."""
    fields[p.SECRET_FIELD] = data.get("config", {}).get("cluster_secret", "")
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(data["supervisor"]["endpoint"])
        sock.send_multipart([p.request(op, 1, data["cluster_name"], **fields)])
        if not sock.poll(timeout * 1000):
            return None
        return p.unpack_header(sock.recv_multipart()[0])
    finally:
        ctx.destroy(linger=0)


def _print_ready(data: dict[str, Any], path: Path) -> None:
    print(f"cluster {data['cluster_name']!r} is running "
          f"(supervisor pid {data['supervisor']['pid']})")
    for m in data["members"]:
        print(f"  {m['name']:<10} pid {m['pid']:<8} {m['endpoint']}")
    print(f"registry: {path}")
    print("connect with: grid.connect()" if data["cluster_name"] == "dev"
          else f"connect with: grid.connect(cluster_name={data['cluster_name']!r})")


# -- commands ------------------------------------------------------------------------------

def cmd_start(args: argparse.Namespace) -> int:
    config = _config(args)
    if config.persistence_dir:
        from grid.supervisor import StartupError, restart_names

        try:
            names = restart_names(config.persistence_dir)
        except StartupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if names and args.members is not None and args.members != len(names):
            print(f"error: {config.persistence_dir} holds {len(names)} members' folders "
                  f"({', '.join(names)}), not --members {args.members}; a restart starts "
                  f"exactly those (add members afterwards with `shmgrid add-member`)",
                  file=sys.stderr)
            return 1
    path = config.registry_path()
    if path.exists():
        try:
            data = read_registry(path)
        except ClusterNotRunningError:
            data = {}
        if is_registered_process(data.get("supervisor", {})):
            print(f"error: cluster {config.cluster_name!r} is already running (registry {path});"
                  f" stop it with `shmgrid stop --cluster-name {config.cluster_name}`",
                  file=sys.stderr)
            return 1
        _cleanup_orphans(data, config.cluster_name)
        path.unlink(missing_ok=True)
    if args.detach:
        code = _start_detached(config, path)
        if code == 0 and args.dashboard:
            _start_dashboard(config.cluster_name, args.dashboard_port, path.with_suffix(".log"),
                             detached=True)
        return code
    from grid import supervisor

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s supervisor %(levelname)s %(message)s")
    sup = supervisor.Supervisor(config)
    signal.signal(signal.SIGTERM, lambda *_: setattr(sup, "stopping", True))
    signal.signal(signal.SIGINT, lambda *_: setattr(sup, "stopping", True))
    try:
        sup.start()
    except supervisor.StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print_ready(read_registry(path), path)
    dashboard = _start_dashboard(config.cluster_name, args.dashboard_port, None,
                                 detached=False) if args.dashboard else None
    print("press Ctrl-C to stop", flush=True)
    try:
        sup.serve()
    finally:
        if dashboard is not None:
            dashboard.terminate()
    return 0


def _start_dashboard(cluster_name: str, port: int, log_path: Path | None,
                     detached: bool) -> subprocess.Popen | None:
    """Start `shmgrid dashboard` for the cluster and print its URL (it ends when the
    cluster stops); None, with the reason printed, if it did not come up."""
    with open(log_path or os.devnull, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grid", "dashboard", "--cluster-name", cluster_name,
             "--port", str(port)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=log_file if detached else None, start_new_session=detached)
    ready, _, _ = select.select([proc.stdout], [], [], DASHBOARD_WAIT_S)
    line = proc.stdout.readline().decode().strip() if ready else ""
    proc.stdout.close()  # it prints its URL and nothing more
    if not line.startswith("dashboard: "):
        proc.kill()
        print(f"error: the dashboard did not start: {line or 'no answer'}"
              + (f"; see {log_path}" if log_path else ""), file=sys.stderr)
        return None
    print(line, flush=True)
    return proc


def _start_detached(config: GridConfig, path: Path) -> int:
    log_path = path.with_suffix(".log")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Any process can read a command line: a configured secret goes in the environment.
    public = {k: v for k, v in config.to_dict().items() if k != "cluster_secret"}
    env = dict(os.environ)
    if config.cluster_secret:
        env[SECRET_ENV] = config.cluster_secret
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grid.supervisor", json.dumps(public)],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            start_new_session=True, close_fds=True, env=env)
    from rich.progress import Progress

    deadline = time.monotonic() + DETACH_WAIT_S
    with Progress(disable=not sys.stderr.isatty(), console=_stderr_console(),
                  transient=True) as progress:
        task = progress.add_task("starting", total=None)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                progress.stop()
                print(f"error: the supervisor exited with code {proc.returncode}; "
                      f"see {log_path}:\n{_tail(log_path)}", file=sys.stderr)
                return 1
            try:
                data = read_registry(path)
            except ClusterNotRunningError:
                data = {}
            if data.get("state") == "ready":
                progress.stop()
                _print_ready(data, path)
                print(f"log: {log_path}\nstop with: shmgrid stop"
                      + ("" if config.cluster_name == "dev"
                         else f" --cluster-name {config.cluster_name}"))
                return 0
            if config.persistence_dir:
                _show_loading(progress, task, config.persistence_dir)
            time.sleep(0.05)
    proc.kill()
    print(f"error: the cluster did not become ready in {DETACH_WAIT_S:g} s; see {log_path}",
          file=sys.stderr)
    return 1


def _show_loading(progress: Any, task: Any, folder: str) -> None:
    """A restart's progress: the records each member has loaded from its files so far."""
    from workers.journal import read_progress

    loads = {}
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(folder)):
            report = read_progress(os.path.join(folder, name))
            if report is not None:
                loads[name] = report
    if loads:
        progress.update(task, completed=sum(done for done, _ in loads.values()),
                        total=sum(total for _, total in loads.values()) or None,
                        description="loading " + ", ".join(
                            f"{name} {done:,}/{total:,}" for name, (done, total) in
                            loads.items()))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _cleanup_orphans(data: dict[str, Any], cluster_name: str) -> list[int]:
    """Kill members a dead supervisor left behind and remove their segments. A pid is killed
    only while it is still the registered process (same start time): the system may have
    given it to an unrelated process since."""
    from workers.shm import remove_segments

    killed = []
    for m in data.get("members", []):
        if is_registered_process(m):
            try:
                os.kill(m["pid"], signal.SIGKILL)
                killed.append(m["pid"])
            except ProcessLookupError:
                pass
    # SIGKILL is delivered when a member next leaves the kernel: one inside shm_open makes
    # its segment first. Unlinking before every member is gone could leave that segment.
    deadline = time.monotonic() + ORPHAN_EXIT_WAIT_S
    while any(pid_alive(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.01)
    remove_segments(f"shmgrid-{cluster_name}")
    return killed


def cmd_stop(args: argparse.Namespace) -> int:
    try:
        path, data = _registry(args)
    except ClusterNotRunningError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sup = data.get("supervisor", {})
    sup_pid = sup.get("pid")
    if is_registered_process(sup):
        reply = _supervisor_call(data, p.STOP)
        deadline = time.monotonic() + STOP_WAIT_S
        while reply is not None and is_registered_process(sup) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        if is_registered_process(sup):
            print("the supervisor did not stop in time; killing it and its members",
                  file=sys.stderr)
            os.kill(sup_pid, signal.SIGKILL)
    killed = _cleanup_orphans(data, data["cluster_name"])
    path.unlink(missing_ok=True)
    extra = f" (killed {len(killed)} orphaned members)" if killed else ""
    print(f"cluster {data['cluster_name']!r} stopped{extra}")
    return 0


def _cluster_summary(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The cluster summary and every member's report (grid/client/status.py); raises
    GridError if the cluster does not answer."""
    import grid
    from grid.client.status import member_rows, summarize

    with grid.connect(cluster_name=args.cluster_name, invocation_timeout=5.0) as client:
        rows = member_rows(client)
        return summarize(client.cluster_name, rows), rows


def _migration_line(migrations: dict[str, Any]) -> str:
    if not migrations:
        return ""
    if migrations.get("active"):
        # Each member counts from its own table, and a destination commits before the
        # publish reaches the source: a partition just moved shows on both for a moment.
        return (f"migrations: {migrations['running']} in flight, {migrations['remaining']} to "
                f"go of {migrations['planned']} planned ({migrations['failed']} failed, "
                f"planned again); until they end, a partition just moved may count on both "
                f"its members")
    return (f"migrations: none in flight; the last plan completed {migrations['completed']} "
            f"of {migrations['planned']}")


def cmd_status(args: argparse.Namespace) -> int:
    try:
        summary, rows = _cluster_summary(args)
    except GridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cluster {summary['cluster']}: {summary['state']}, "
                        + ("safe" if summary["safe"] else "NOT SAFE"))
    # Replicas that missed writes get a column while there are any (replica sync).
    repairing = bool(summary["dirty"] or summary["syncs_in_flight"])
    numbers = ("pid", "owned", "backups", "dirty", "shm", "rss")
    for col in ("member", "pid", "endpoint", "role", "owned", "backups",
                *(("dirty",) if repairing else ()), "shm", "rss"):
        table.add_column(col, justify="right" if col in numbers else "left")
    for r in rows:
        role = "unreachable" if r.get("unreachable") else (
            "master" if r.get("master") else ("lite" if r.get("lite") else "member"))
        table.add_row(r.get("name", "?"), str(r.get("pid", "")), r.get("endpoint", ""), role,
                      str(r.get("owned", "")), str(r.get("backups", "")),
                      *((str(r.get("dirty", "")),) if repairing else ()),
                      _mib(r.get("shm_bytes")), _mib(r.get("rss")))
    Console().print(table)
    if _migration_line(summary["migrations"]):
        print(_migration_line(summary["migrations"]))
    lost = summary["migrations"].get("lost_partitions")
    if lost:
        print(f"{lost} partitions lost every replica since this master took over; they are "
              f"available again, empty")
    persisted = [r for r in rows if r.get("persistence")]
    if persisted:
        first = persisted[0]["persistence"]
        loaded = sum(r["persistence"]["loaded_records"] for r in persisted)
        print(f"persistence: {os.path.dirname(first['dir'])}, fsync {first['fsync']}; loaded "
              f"at start: {loaded:,} records (" + ", ".join(
                  f"{r['name']} {r['persistence']['loaded_records']:,} in "
                  f"{r['persistence']['load_seconds']:.2f} s" for r in persisted) + ")")
    if summary["state"] in ("NO_MIGRATION", "FROZEN"):
        idle = [r["name"] for r in rows
                if not r.get("lite") and not r.get("owned") and not r.get("backups")]
        print(f"{summary['state']}: no migration runs. Held back: "
              f"{summary['short_of_backups']} partitions short of backups; members holding "
              f"nothing: {', '.join(idle) or 'none'}. `shmgrid state ACTIVE` lets them run")
    if not summary["safe"]:
        print("not safe: some partitions lack their configured backups or are migrating")
    if summary["dirty"] or summary["syncs_in_flight"]:
        print(f"replica sync: {summary['dirty']} backup namespaces missed operations; "
              f"{summary['syncs_in_flight']} syncs under way (every backup_sync_interval "
              f"the owners compare versions and repair them)")
    if summary["unbacked"]:
        print(f"{summary['unbacked']} partitions have no backup: a write to them is "
              f"acknowledged by its owner alone")
    return 0


def cmd_wait_safe(args: argparse.Namespace) -> int:
    """Until the cluster is safe (every partition has its backups, nothing migrates)."""
    from rich.progress import Progress

    deadline = time.monotonic() + args.timeout
    summary: dict[str, Any] = {}
    with Progress(disable=args.json or not sys.stderr.isatty(),
                  console=_stderr_console()) as progress:
        task = progress.add_task("waiting for the cluster to be safe", total=None)
        while time.monotonic() < deadline:
            try:
                summary, _ = _cluster_summary(args)
            except GridError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            migrations = summary["migrations"]
            if migrations.get("active"):
                progress.update(task, total=migrations["planned"],
                                completed=migrations["completed"],
                                description=f"migrations ({migrations['running']} in flight)")
            if summary["safe"]:
                break
            time.sleep(WAIT_POLL_S)
    if args.json:
        print(json.dumps(summary, indent=1))
    if not summary.get("safe"):
        print(f"error: the cluster is not safe after {args.timeout:g} s; "
              f"{_migration_line(summary.get('migrations') or {}) or 'no migrations running'}"
              f"; see `shmgrid status`", file=sys.stderr)
        return 1
    if not args.json:
        print(f"cluster {summary['cluster']!r} is safe")
    return 0


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _mib(n: Any) -> str:
    return f"{n / 2**20:.1f} MiB" if isinstance(n, int) else ""


def _registry_data(args: argparse.Namespace) -> dict[str, Any] | None:
    """The cluster's registry, or None after saying why there is none."""
    try:
        return _registry(args)[1]
    except ClusterNotRunningError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _running_member(args: argparse.Namespace,
                    data: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The registry entry of the member ``args.member`` names (name or uuid prefix) if its
    process still runs; otherwise print why not and return None."""
    data = data or _registry_data(args)
    if data is None:
        return None
    matches = [m for m in data["members"]
               if m["name"] == args.member or m["uuid"].startswith(args.member)]
    if len(matches) != 1:
        names = ", ".join(m["name"] for m in data["members"])
        print(f"error: no single member matches {args.member!r} (members: {names})",
              file=sys.stderr)
        return None
    if not is_registered_process(matches[0]):  # its pid may belong to another process now
        print(f"error: {matches[0]['name']} (pid {matches[0]['pid']}) is no longer running",
              file=sys.stderr)
        return None
    return matches[0]


def cmd_kill(args: argparse.Namespace) -> int:
    member = _running_member(args)
    if member is None:
        return 1
    sig = getattr(signal, f"SIG{args.signal.upper().removeprefix('SIG')}")
    os.kill(member["pid"], sig)
    print(f"sent {sig.name} to {member['name']} (pid {member['pid']})")
    return 0


def cmd_stop_member(args: argparse.Namespace) -> int:
    """A graceful leave: SIGTERM makes the member ask the master to move its replicas away;
    the master removes it once they have, and it exits."""
    from rich.progress import Progress

    member = _running_member(args)
    if member is None:
        return 1
    os.kill(member["pid"], signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    with Progress(disable=not sys.stderr.isatty(), console=_stderr_console()) as progress:
        task = progress.add_task(f"moving {member['name']}'s replicas away", total=None)
        while is_registered_process(member):
            if time.monotonic() >= deadline:
                print(f"error: {member['name']} has not left after {args.timeout:g} s; see "
                      f"`shmgrid status` (it leaves anyway after graceful_shutdown_max_wait)",
                      file=sys.stderr)
                return 1
            with contextlib.suppress(GridError):
                _, rows = _cluster_summary(args)
                mine = next((r for r in rows if r.get("uuid") == member["uuid"]), None)
                if mine and "owned" in mine:
                    progress.update(task, description=(
                        f"moving {member['name']}'s replicas away: {mine['owned']} owned, "
                        f"{mine['backups']} backups left"))
            time.sleep(WAIT_POLL_S)
    print(f"{member['name']} left the cluster gracefully")
    return 0


def _join_refusal(args: argparse.Namespace) -> str:
    """Why the cluster would refuse a new member now (its state), or "" (a member that meets
    a refusal anyway stops and says why in the cluster's log)."""
    import grid
    from grid.cluster.state import ClusterState

    try:
        with grid.connect(cluster_name=args.cluster_name, invocation_timeout=5.0) as client:
            state = client.cluster.state
    except GridError:
        return ""  # the supervisor's answer tells
    if state in ClusterState.__members__ and not ClusterState(state).join_allowed:
        return (f"the cluster is {state}, which takes no new member; `shmgrid state ACTIVE` "
                f"(or NO_MIGRATION) first")
    return ""


def cmd_add_member(args: argparse.Namespace) -> int:
    data = _registry_data(args)
    if data is None:
        return 1
    refusal = _join_refusal(args)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 1
    reply = _supervisor_call(data, p.ADD_MEMBER, timeout=60.0, lite=args.lite)
    if not reply or not reply.get("ok"):
        print(f"error: the supervisor did not add a member: "
              f"{reply.get('msg') if reply else 'no answer'}", file=sys.stderr)
        return 1
    m = reply["member"]
    print(f"added {m['name']} (pid {m['pid']}) at {m['endpoint']}"
          + (" as a lite member" if m.get("lite") else ""))
    if not m.get("lite"):
        print("migrations now give it its share; `shmgrid wait-safe` waits for them")
    return 0


def cmd_state(args: argparse.Namespace) -> int:
    """Print the cluster state, or change it on every member (all or nothing)."""
    import grid

    try:
        with grid.connect(cluster_name=args.cluster_name, invocation_timeout=5.0) as client:
            before = client.cluster.state
            state = before
            if args.state:
                state = client.cluster.change_state(args.state, timeout=args.timeout)
    except GridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"state": state, "before": before}))
    elif args.state and before != state:
        print(f"cluster state changed from {before} to {state}")
    else:
        print(state)
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    """Promote a lite member to a data member: it takes its share of the partitions."""
    import grid

    try:
        with grid.connect(cluster_name=args.cluster_name, invocation_timeout=5.0) as client:
            members = client.cluster.promote_member(args.member, timeout=args.timeout)
    except GridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"members": [{"name": m.name, "uuid": m.uuid, "lite": m.lite}
                                      for m in members]}))
    else:
        print(f"{args.member} is a data member now; migrations give it its share "
              f"(`shmgrid wait-safe` waits for them)")
    return 0


def cmd_force_start(args: argparse.Namespace) -> int:
    """Delete every member's folder under --data-dir (after a confirmation), then start."""
    import shutil

    from grid.supervisor import restart_names

    config = _config(args)
    with contextlib.suppress(ClusterNotRunningError):
        data = read_registry(config.registry_path())
        if is_registered_process(data.get("supervisor", {})):
            print(f"error: cluster {config.cluster_name!r} is running; stop it first",
                  file=sys.stderr)
            return 1
    folder = config.persistence_dir
    try:
        names = restart_names(folder)
    except Exception:  # damaged or mixed folders are what force-start is for
        names = sorted(n for n in os.listdir(folder)
                       if os.path.isdir(os.path.join(folder, n, "meta")))
    if names and not args.yes:
        answer = input(f"delete the data of {len(names)} members under {folder} "
                       f"({', '.join(names)}) and start empty? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    for name in names:
        shutil.rmtree(os.path.join(folder, name))
    if names:
        print(f"deleted the data of {', '.join(names)}")
    return cmd_start(args)


def cmd_backup(args: argparse.Namespace) -> int:
    """A point-in-time copy of every member's persistence folder into DIR."""
    data = _registry_data(args)
    if data is None:
        return 1
    folder = os.path.abspath(args.dir)
    if os.path.exists(folder) and os.listdir(folder):
        print(f"error: {folder} is not empty; back up into a new folder", file=sys.stderr)
        return 1
    secret = data.get("config", {}).get("cluster_secret", "")
    failed = 0
    ctx = zmq.Context()
    try:
        for m in data["members"]:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(m["endpoint"])
            sock.send_multipart([p.request(p.PERSIST_BACKUP, 1, data["cluster_name"],
                                           dir=folder, **{p.SECRET_FIELD: secret})])
            reply = p.unpack_header(sock.recv_multipart()[0]) if sock.poll(60_000) else None
            sock.close(0)
            if reply and reply.get("ok"):
                print(f"{m['name']}: {reply['segments']} segments up to record "
                      f"{reply['seq_last']} ({reply['bytes_copied']} bytes copied, the rest "
                      f"hard-linked)")
            else:
                failed += 1
                print(f"error: {m['name']}: {reply.get('msg') if reply else 'no answer'}",
                      file=sys.stderr)
    finally:
        ctx.destroy(linger=0)
    if not failed:
        print(f"backup in {folder}; restart from it with `shmgrid start --data-dir {folder}`")
    return 1 if failed else 0


def cmd_restart_member(args: argparse.Namespace) -> int:
    """Kill a member and start it again from its files (a cluster with --data-dir); a
    member that is not running (killed, or died) is started from its files."""
    data = _registry_data(args)
    if data is None:
        return 1
    running = [m for m in data["members"]
               if m["name"] == args.member or m["uuid"].startswith(args.member)]
    name = running[0]["name"] if len(running) == 1 else args.member
    reply = _supervisor_call(data, p.RESTART_MEMBER, timeout=60.0, name=name)
    if not reply or not reply.get("ok"):
        print(f"error: {name} was not restarted: "
              f"{reply.get('msg') if reply else 'no answer from the supervisor'}",
              file=sys.stderr)
        return 1
    m = reply["member"]
    print(f"restarted {m['name']} (pid {m['pid']}) from its files; in STABLE_CLUSTER it takes "
          f"back its partitions (`shmgrid wait-safe` waits for them)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from grid.bench import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shmgrid",
        description="A local in-memory data grid: members in processes, partitions in shared "
                    "memory, synchronous backups, failover.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--cluster-name", help="which cluster (default: dev, or "
                        "$SHMGRID_CLUSTER_NAME)")

    def start_options(sp: argparse.ArgumentParser) -> None:
        common(sp)
        sp.add_argument("--members", type=int, help="member processes (default 3)")
        sp.add_argument("--backup-count", type=int,
                        help="synchronous backups, 0..6 (default 1)")
        sp.add_argument("--async-backup-count", type=int,
                        help="asynchronous backups after the synchronous ones (a write does "
                        "not wait for them; replica sync repairs what they miss); "
                        "sync + async <= 6 (default 0)")
        sp.add_argument("--backup-placement", choices=["paired", "spread"],
                        help="where an owner's backups go: paired, all on the members after "
                        "it in a ring, so that a batch write sends each owner's part to one "
                        "backup (put_all of spread keys 1.2x to 1.4x as fast), while one "
                        "member takes over all of a lost member's partitions until migrations "
                        "even the owners out, and backups move after membership changes to "
                        "pair them again (default); or spread over the other members, so that "
                        "a lost member's partitions are taken over evenly")
        sp.add_argument("--backup-sync-interval", type=float,
                        help="seconds between an owner's anti-entropy rounds: it sends its "
                        "replica versions and backups that are behind ask for a sync "
                        "(default 30)")
        sp.add_argument("--partition-count", type=int, help="partitions (default 271)")
        sp.add_argument("--heartbeat-interval", type=float, help="seconds (default 1)")
        sp.add_argument("--heartbeat-timeout", type=float,
                        help="seconds without heartbeat before a member is removed "
                        "(default 10)")
        sp.add_argument("--config", help="a TOML file with configuration keys")
        sp.add_argument("--fsync", choices=["always", "interval", "never"],
                        help="with --data-dir: fsync before a write is acknowledged (always), "
                        "every persistence_fsync_interval (interval, the default), or never")
        sp.add_argument("--detach", action="store_true",
                        help="run in the background; stop with `shmgrid stop`")
        sp.add_argument("--dashboard", action="store_true",
                        help="also serve the live web view (`shmgrid dashboard`) and print "
                        "its URL; it stops with the cluster")
        sp.add_argument("--dashboard-port", type=int, default=0,
                        help="its port (default: a free one)")

    sp = sub.add_parser("start", help="start a local cluster",
                        description="Start a supervisor that runs N member processes, wait "
                        "until every partition is assigned, print the endpoints.")
    start_options(sp)
    sp.add_argument("--data-dir", help="hot restart: each member writes every mutation under "
                    "DIR/<member>/, and a start on a DIR that holds members' folders restarts "
                    "them from their files (persistence_dir)")
    sp.set_defaults(func=cmd_start)

    sp = sub.add_parser(
        "force-start", help="delete every member's files under --data-dir and start empty",
        description="For a cluster that cannot restart from its files (members missing, "
        "tables that differ): delete every member's folder under DIR, after a confirmation, "
        "and start a new, empty cluster that persists there.")
    start_options(sp)
    sp.add_argument("--data-dir", required=True, help="the persistence folder to wipe")
    sp.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    sp.set_defaults(func=cmd_force_start)

    sp = sub.add_parser("stop", help="stop a running cluster and clean up")
    common(sp)
    sp.set_defaults(func=cmd_stop)

    sp = sub.add_parser("status", help="members, partitions, memory, safety")
    common(sp)
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=cmd_status)

    sp = sub.add_parser("kill", help="send a signal to a member (SIGKILL by default)")
    common(sp)
    sp.add_argument("member", help="member name (member-1) or uuid prefix")
    sp.add_argument("--signal", default="KILL", help="KILL (default), STOP, CONT, TERM")
    sp.set_defaults(func=cmd_kill)

    sp = sub.add_parser("stop-member", help="stop a member gracefully: its replicas move first",
                        description="Send SIGTERM to a member: it asks the master to migrate "
                        "its replicas to the other members, the master removes it once they "
                        "have, and it exits. No acknowledged write is lost and no partition "
                        "runs short of replicas because of the leave.")
    common(sp)
    sp.add_argument("member", help="member name (member-1) or uuid prefix")
    sp.add_argument("--timeout", type=float, default=300.0,
                    help="seconds to wait for it to leave (default 300)")
    sp.set_defaults(func=cmd_stop_member)

    sp = sub.add_parser("wait-safe", help="wait until every backup exists and nothing migrates",
                        description="Wait, with a progress bar of the migrations, until the "
                        "cluster is safe; exit 1 on timeout.")
    common(sp)
    sp.add_argument("--timeout", type=float, default=120.0,
                    help="seconds to wait (default 120)")
    sp.add_argument("--json", action="store_true", help="print the final status as JSON")
    sp.set_defaults(func=cmd_wait_safe)

    sp = sub.add_parser("add-member", help="start one more member process")
    common(sp)
    sp.add_argument("--lite", action="store_true", help="a lite member (holds no partitions)")
    sp.set_defaults(func=cmd_add_member)

    sp = sub.add_parser(
        "state", help="print or change the cluster state",
        description="Without STATE, print the cluster state. With it, change the state on "
        "every member, all or nothing: ACTIVE (joins and migrations), NO_MIGRATION (joins, "
        "but no rebalance and no re-creation of lost backups; promotions after a death go "
        "on), FROZEN (no join, no migration, every operation served), PASSIVE (no join, no "
        "migration, reads only). A change is refused while migrations are in flight, except "
        "to PASSIVE, which waits for them up to --timeout.")
    common(sp)
    sp.add_argument("state", nargs="?", type=str.upper,
                    choices=["ACTIVE", "NO_MIGRATION", "FROZEN", "PASSIVE",
                             "STABLE_CLUSTER"],
                    help="the state to change to")
    sp.add_argument("--timeout", type=float, default=30.0,
                    help="seconds a change may take (default 30)")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=cmd_state)

    sp = sub.add_parser(
        "promote", help="make a lite member a data member",
        description="Promote a lite member (started with `add-member --lite`): the master "
        "makes it a data member and migrations give it its share of the partitions.")
    common(sp)
    sp.add_argument("member", help="member name (member-3) or uuid")
    sp.add_argument("--timeout", type=float, default=10.0,
                    help="seconds to keep asking while the master is busy (default 10)")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=cmd_promote)

    sp = sub.add_parser(
        "backup", help="copy every member's persistence folder (a cluster started with "
        "--data-dir)", description="Take a point-in-time copy of each member's log and "
        "metadata into DIR/<member>/ while the cluster runs (sealed log segments are "
        "hard-linked). `shmgrid start --data-dir DIR` restarts from it.")
    common(sp)
    sp.add_argument("dir", help="a new (or empty) folder")
    sp.set_defaults(func=cmd_backup)

    sp = sub.add_parser(
        "restart-member", help="kill a member and start it again from its files",
        description="For a cluster started with --data-dir: kill the member as a crash "
        "would, start it again under its name from its files (a member that is not running "
        "is just started). In STABLE_CLUSTER it rejoins and takes back the partitions it "
        "held when the state was entered; the migrations move only what changed while it "
        "was away (Merkle trees, seed 003).")
    common(sp)
    sp.add_argument("member", help="member name (member-1) or uuid prefix")
    sp.set_defaults(func=cmd_restart_member)

    sp = sub.add_parser(
        "bench", help="measure put/get/put_all/get_all against a cluster",
        description="Rates and p50/p99 latencies of put, get, put_all and get_all, and, for a "
                    "cluster found by name, the members' CPU time per entry while each ran.")
    common(sp)
    from grid.bench import add_arguments

    add_arguments(sp)
    sp.set_defaults(func=cmd_bench)

    from grid.chaos import cli as chaos_cli

    sp = sub.add_parser(
        "chaos", help="a workload, seeded faults, a recorded history and a verdict",
        description="Start a cluster (or attach to --cluster-name), run a random workload "
        "from client processes while seeded faults hit the members, record every operation, "
        "then check the history: linearizable per key, no acknowledged write lost. Exit 1 "
        "on a violation within the faults the grid promises to survive (at most "
        "backup-count members down at once).")
    chaos_cli.add_arguments(sp)
    sp.set_defaults(func=chaos_cli.cmd_chaos)

    sp = sub.add_parser(
        "dashboard", help="a live web view of the cluster, with actions for chaos by hand",
        description="Serve a page on 127.0.0.1 that shows, live: the members (role, process, "
        "partitions, memory, ops/s), the partition table coloured by owner (migrating, short "
        "of backups, lost), migrations, maps, and a timeline of joins, deaths, master and "
        "state changes with the time to safe after each. Buttons kill, pause, resume, stop or "
        "promote a member, add one, or change the cluster state, through this command's own "
        "paths. The printed URL carries a random access token; requests without it are "
        "refused. It stops with the cluster, or with Ctrl-C.")
    common(sp)
    sp.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on "
                    "(default 127.0.0.1)")
    sp.set_defaults(func=cmd_dashboard)
    return parser


def cmd_dashboard(args: argparse.Namespace) -> int:
    import asyncio

    if _registry_data(args) is None:
        return 1
    try:
        from grid.dashboard.server import serve
    except ImportError as exc:
        print(f"error: the dashboard needs aiohttp ({exc}): pip install shmgrid[dashboard]",
              file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s dashboard %(levelname)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.cluster_name or GridConfig.load().cluster_name, args.host,
                          args.port,
                          ready=lambda url: print(f"dashboard: {url}", flush=True)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except GridError as exc:  # no cluster there, a refusal: what went wrong, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1
