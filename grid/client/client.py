"""The smart client: finds the cluster, keeps its member list and partition table, and routes
each key to the owner of its partition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grid import protocol as p
from grid.client import registry
from grid.client.events import EventListeners, Listener
from grid.client.invocation import Invoker
from grid.client.map import Map
from grid.cluster.membership import MemberInfo
from grid.cluster.repair import is_cluster_safe
from grid.config import GridConfig
from grid.errors import ClusterNotRunningError, WrongClusterNameError
from grid.serialization import partition_id_of, serialize_key


class ClusterView:
    """What the client knows of the cluster; ``refresh`` asks the members again."""

    def __init__(self, invoker: Invoker, backup_count: int) -> None:
        self._invoker = invoker
        self._backup_count = backup_count
        self._listeners: EventListeners | None = None

    def add_migration_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` for every migration event (a plan started, a migration
        completed or failed, the plan finished), from a background thread; see
        grid/client/events.py for the fields."""
        self._events().add_migration_listener(listener)

    def add_partition_lost_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` when a partition lost every replica (its
        ``partition_id`` and ``lost_replicas``); it is available again, empty."""
        self._events().add_partition_lost_listener(listener)

    def _events(self) -> EventListeners:
        if self._listeners is None:
            invoker = self._invoker
            seeds = [m.endpoint for m in invoker.members.members] + invoker.seeds
            self._listeners = EventListeners(seeds, invoker.cluster_name,
                                             invoker.attempt_timeout)
        return self._listeners

    def close(self) -> None:
        if self._listeners is not None:
            self._listeners.close()

    @property
    def members(self) -> list[MemberInfo]:
        self._invoker.refresh(prefer_master=False)
        return list(self._invoker.members.members)

    @property
    def master(self) -> MemberInfo | None:
        self._invoker.refresh(prefer_master=False)
        return self._invoker.members.master

    @property
    def state(self) -> str:
        master = self.master
        status = self.member_status(master) if master else None
        return status.get("state", "UNKNOWN") if status else "UNKNOWN"

    def member_status(self, member: MemberInfo, timeout: float = 2.0) -> dict[str, Any] | None:
        """What a member reports of itself (partitions, memory, role, cluster state), or None
        if it does not answer within ``timeout`` seconds."""
        reply = self._invoker.call(member.endpoint, p.STATUS, timeout=timeout)
        return reply[0] if reply and reply[0].get("ok") else None

    def is_safe(self) -> bool:
        """Every partition has its configured replicas and nothing is migrating."""
        self._invoker.refresh(prefer_master=False)
        table = self._invoker.table
        return table is not None and is_cluster_safe(
            table, self._invoker.members.data_members, self._backup_count)

    def refresh(self) -> None:
        self._invoker.refresh()


class Client:
    def __init__(self, seeds: list[str], cluster_name: str | None, invocation_timeout: float,
                 attempt_timeout: float, max_value_bytes: int, backup_count: int,
                 where: str) -> None:
        self._invoker = Invoker(seeds, cluster_name, invocation_timeout, attempt_timeout)
        self.max_value_bytes = max_value_bytes
        try:
            self._invoker.refresh()
        except BaseException:
            self._invoker.close()
            raise
        if cluster_name and self._invoker.cluster_name != cluster_name:
            self._invoker.close()
            raise WrongClusterNameError(cluster_name, self._invoker.cluster_name, where)
        self.cluster = ClusterView(self._invoker, backup_count)
        self._maps: dict[str, Map] = {}

    @property
    def cluster_name(self) -> str:
        return self._invoker.cluster_name

    @property
    def partition_count(self) -> int:
        return self._invoker.table.partition_count

    def partition_id(self, key: object) -> int:
        return partition_id_of(serialize_key(key), self.partition_count)

    def partition_owners(self) -> dict[int, str]:
        """Partition id -> the owning member's uuid, from a freshly loaded table."""
        self._invoker.refresh()
        table = self._invoker.table
        return {pid: table.owner(pid) for pid in range(table.partition_count)}

    def get_map(self, name: str) -> Map:
        if not isinstance(name, str) or not name:
            raise ValueError("a map name is a non-empty string")
        m = self._maps.get(name)
        if m is None:
            m = self._maps[name] = Map(name, self._invoker, self.max_value_bytes)
        return m

    def close(self) -> None:
        self.cluster.close()
        self._invoker.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(address: str | None = None, *, cluster_name: str | None = None,
            registry_path: str | None = None, invocation_timeout: float | None = None,
            config: GridConfig | None = None) -> Client:
    """Connect to a cluster: by address (``tcp://127.0.0.1:PORT`` of any member), or through
    the local registry file of ``cluster_name`` (default "dev")."""
    config = config or GridConfig.load(
        **({"cluster_name": cluster_name} if cluster_name else {}))
    timeout = invocation_timeout if invocation_timeout is not None else config.invocation_timeout
    if address:
        seeds, where = [address], address
    else:
        path = Path(registry_path) if registry_path else registry.registry_path(
            cluster_name or config.cluster_name, config.registry_dir)
        data = registry.read_registry(path)
        seeds, where = registry.live_member_endpoints(data), str(path)
        if not seeds:
            raise ClusterNotRunningError(where, "no registered member process is alive")
        cluster_name = cluster_name or data.get("cluster_name")
        backup = data.get("config", {}).get("backup_count")
        if isinstance(backup, int):
            config = config.replace(backup_count=backup)
    return Client(seeds, cluster_name, timeout, min(config.attempt_timeout, timeout),
                  config.max_value_bytes, config.backup_count, where)
