"""Configuration: the seeds' property names in snake case, with the seeds' defaults.

Every key can be set in code (``GridConfig(backup_count=2)``), in a TOML file (top-level keys
or a ``[shmgrid]`` table) and by an environment variable ``SHMGRID_<KEY>``; later sources win:
defaults < TOML file < environment < explicit arguments.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from grid.partition.assignment import BACKUP_PLACEMENTS

LINK_TRANSPORTS = ("unix", "tcp")  # what grid/link.py can listen on

MAX_BACKUP_COUNT = 6
# The cluster secret's variable; the CLI hands a configured secret to the detached supervisor
# in it rather than on the command line, which every user can read.
SECRET_ENV = "SHMGRID_CLUSTER_SECRET"


@dataclass(frozen=True)
class GridConfig:
    cluster_name: str = "dev"
    members: int = 3
    partition_count: int = 271
    backup_count: int = 1
    async_backup_count: int = 0
    # Where an owner's backups go (grid/partition/assignment.py): "paired", all on the members
    # after it in a ring of the members, so that a batch of writes sends each owner's part to
    # one backup member (fewer messages: a put_all of keys spread over partitions is 1.2x to
    # 1.4x as fast), at the price of backup copies after membership changes (to pair them
    # again) and of one member taking over all of a lost member's partitions until
    # migrations even the owners out again (where the members left hold a replica of every
    # partition, a few can stay uneven until a member is added: evening them out would be a
    # cycle, which the planner leaves); or "spread", over every other member, so that a
    # member that leaves has its partitions taken over evenly. On one host the takeover costs
    # the same either way (README: "Where backups go").
    backup_placement: str = "paired"
    max_parallel_migrations: int = 10
    # Seconds a migration may take (transfer, then commit) before the master fails it.
    migration_timeout: float = 300.0
    # Seconds the master waits between the end of one migration plan and the next.
    partition_migration_interval: float = 0.0
    # Bytes of migration fragments a member has lent and not yet seen taken: past this it
    # waits before it lends the next (one fragment always goes).
    migration_max_bytes_in_flight: int = 64 * 1024 * 1024
    # Record bytes a destination copies per migration message: a larger fragment takes
    # several, so that heartbeats, backups and other partitions go on meanwhile.
    migration_chunk_bytes: int = 4 * 1024 * 1024
    # Seconds a gracefully leaving member waits for its replicas to move before it goes.
    graceful_shutdown_max_wait: float = 600.0
    migration_fragments_enabled: bool = True
    migration_stale_read_disabled: bool = False
    # Anti-entropy (seed 004): every this many seconds an owner sends each backup its
    # replica versions; a backup that is behind, or missed an operation, asks for a replica
    # sync (at most one request per partition per interval).
    backup_sync_interval: float = 30.0
    # Replica syncs a member runs at once, as the backup asking and as the owner answering:
    # many dirty replicas must not copy every fragment at the same moment.
    max_parallel_replications: int = 5
    # Depth of the Merkle tree a fragment keeps once it has been compared (seed 003): a
    # replica sync moves only the entries under leaves that differ. 0: whole fragments.
    merkle_tree_depth: int = 10
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    invocation_timeout: float = 60.0
    attempt_timeout: float = 5.0
    # Microseconds a client polls for a reply without sleeping, for requests whose replies
    # have lately come that fast (a wake-up costs more than a fast reply: see
    # grid/busy_poll.py). 0: always sleep until the reply comes. A put (three hops:
    # 400 to 600 µs on two cores) is within 1000; with 250 it slept for every reply.
    client_busy_poll_us: int = 1000
    # Microseconds, from the start of a round of messages, until which a member goes on
    # polling without sleeping, while rounds have lately come that often on average (under a
    # client's steady load: the next request, or a backup's acknowledgement, comes sooner
    # than a sleeping member wakes up); a member that hears from anyone only now and then
    # does not spin. It yields its core meanwhile to whoever else wants it. 0: no spin.
    # With 100, the limit before, members slept between most requests of one client.
    member_busy_poll_us: int = 1000
    # What the data path's links run on (grid/link.py): "unix", a Unix socket in Linux's
    # abstract namespace, a third of TCP's kernel time a message (TCP on other platforms);
    # or "tcp", on ``host``.
    link_transport: str = "unix"
    max_value_bytes: int = 64 * 1024 * 1024
    max_message_bytes: int = 512 * 1024 * 1024
    host: str = "127.0.0.1"
    registry_dir: str = ""
    # Hot restart (seed 003): each member writes every mutation of every replica it holds to
    # persistence_dir/<member name>/, and a cluster started on that folder loads it back.
    # Empty: nothing is written.
    persistence_dir: str = ""
    # When a write counts as on disk: "always" (fsync before the owner acknowledges it),
    # "interval" (fsync every persistence_fsync_interval seconds; a crash of the whole host
    # loses at most that window), "never" (the OS decides).
    persistence_fsync: str = "interval"
    persistence_fsync_interval: float = 0.05
    # When members' files disagree or some are missing (grid/cluster/restart.py):
    # full_recovery_only refuses; partial_recovery_most_recent / _most_complete restart on
    # the newest / largest group of members that restored one table.
    restart_policy: str = "full_recovery_only"
    # A member whose files are older than the chosen table's: wiped and given a share by
    # migrations (true), or removed with its folder kept (false).
    auto_remove_stale_data: bool = True
    # With persistence_dir: the supervisor starts a member that died again, under its name,
    # from its files (it rejoins in STABLE_CLUSTER and takes back its partitions).
    restart_on_crash: bool = False
    # Control messages (member list changes, state, shutdown, fences) carry this; the supervisor
    # creates one at start when none is set, and keeps it in the registry file (mode 0600).
    cluster_secret: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        errors = []
        if not 1 <= self.partition_count <= 65536:
            errors.append(f"partition_count must be 1..65536, not {self.partition_count}")
        if not 0 <= self.backup_count <= MAX_BACKUP_COUNT:
            errors.append(f"backup_count must be 0..{MAX_BACKUP_COUNT}, not {self.backup_count}")
        if not 0 <= self.async_backup_count <= MAX_BACKUP_COUNT - self.backup_count:
            errors.append("backup_count + async_backup_count must not exceed 6")
        if self.backup_placement not in BACKUP_PLACEMENTS:
            errors.append(f"backup_placement must be one of {BACKUP_PLACEMENTS}, not "
                          f"{self.backup_placement!r}")
        if self.backup_sync_interval <= 0 or self.max_parallel_replications < 1:
            errors.append("backup_sync_interval must be positive and "
                          "max_parallel_replications at least 1")
        if not 0 <= self.merkle_tree_depth <= 20:
            errors.append(f"merkle_tree_depth must be 0..20, not {self.merkle_tree_depth}")
        if self.members < 1:
            errors.append(f"members must be at least 1, not {self.members}")
        if self.heartbeat_interval <= 0 or self.heartbeat_timeout <= self.heartbeat_interval:
            errors.append("heartbeat_timeout must be greater than heartbeat_interval > 0")
        if self.invocation_timeout <= 0 or self.attempt_timeout <= 0:
            errors.append("invocation_timeout and attempt_timeout must be positive")
        for name in ("client_busy_poll_us", "member_busy_poll_us"):
            if not 0 <= getattr(self, name) <= 100_000:
                errors.append(f"{name} must be 0..100000, not {getattr(self, name)}")
        if not self.cluster_name or not all(c.isalnum() or c in "_." for c in self.cluster_name):
            errors.append(
                f"cluster_name {self.cluster_name!r} must be letters, digits, '_' or '.'")
        if self.link_transport not in LINK_TRANSPORTS:
            errors.append(f"link_transport must be one of {LINK_TRANSPORTS}, not "
                          f"{self.link_transport!r}")
        if self.persistence_fsync not in ("always", "interval", "never"):
            errors.append(f"persistence_fsync must be always, interval or never, not "
                          f"{self.persistence_fsync!r}")
        if self.restart_policy not in ("full_recovery_only", "partial_recovery_most_recent",
                                       "partial_recovery_most_complete"):
            errors.append(f"restart_policy {self.restart_policy!r} is not full_recovery_only, "
                          "partial_recovery_most_recent or partial_recovery_most_complete")
        if self.persistence_fsync_interval <= 0:
            errors.append("persistence_fsync_interval must be positive")
        if errors:
            raise ValueError("invalid configuration: " + "; ".join(errors))

    @classmethod
    def load(cls, toml_path: str | os.PathLike | None = None,
             env: dict[str, str] | None = None, **overrides: Any) -> GridConfig:
        """Defaults, then the TOML file, then SHMGRID_* variables, then overrides (not None)."""
        values: dict[str, Any] = {}
        if toml_path:
            with open(toml_path, "rb") as f:
                data = tomllib.load(f)
            values.update(data.get("shmgrid", data))
        env = os.environ if env is None else env
        names = {f.name: f for f in fields(cls)}
        for name in names:
            raw = env.get(f"SHMGRID_{name.upper()}")
            if raw is not None:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - set(names)
        if unknown:
            raise ValueError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
        return cls(**{k: _coerce(names[k].type, k, v) for k, v in values.items()})

    @property
    def total_backup_count(self) -> int:
        """Backup replicas a partition has: the synchronous ones, then the asynchronous."""
        return self.backup_count + self.async_backup_count

    def replace(self, **changes: Any) -> GridConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def registry_path(self) -> Path:
        return registry_dir(self.registry_dir) / f"{self.cluster_name}.json"


def registry_dir(configured: str = "") -> Path:
    """Where registry files live: configured, $SHMGRID_REGISTRY_DIR, or a per-user temp dir."""
    if configured:
        return Path(configured)
    if os.environ.get("SHMGRID_REGISTRY_DIR"):
        return Path(os.environ["SHMGRID_REGISTRY_DIR"])
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"shmgrid-{os.getuid()}"


def _coerce(type_name: Any, key: str, value: Any) -> Any:
    kind = type_name if isinstance(type_name, str) else type_name.__name__
    try:
        if kind == "bool":
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
        return str(value)
    except ValueError:
        raise ValueError(f"configuration key {key}: cannot read {value!r} as {kind}") from None
