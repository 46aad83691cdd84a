"""The smart client: finds the cluster, keeps its member list and partition table, and routes
each key to the owner of its partition."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grid import protocol as p
from grid.client import registry
from grid.client.events import EventListeners, Listener
from grid.client.invocation import Invoker
from grid.client.local_reads import LocalReader
from grid.client.map import Map
from grid.cluster.membership import MemberInfo, MemberList
from grid.cluster.repair import is_cluster_safe
from grid.cluster.state import ClusterState
from grid.config import GridConfig
from grid.errors import (
    ClusterNotRunningError,
    NotReadyError,
    OperationTimeoutError,
    UnknownMemberError,
    WrongClusterNameError,
)
from grid.serialization import partition_id_of, serialize_key

ANSWER_MARGIN_S = 5.0  # beyond a state change's own timeout, for its answer to come


class ClusterView:
    """What the client knows of the cluster; ``refresh`` asks the members again."""

    def __init__(self, invoker: Invoker, backup_count: int, secret: str,
                 local: str | None) -> None:
        self._invoker = invoker
        self._backup_count = backup_count
        self._secret = secret  # for the calls only members and the cluster's owner may make
        self._local = local  # the member this client was connected to by address, if any
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
        """The cluster state (ACTIVE, NO_MIGRATION, FROZEN or PASSIVE), as the master says."""
        master = self.master
        status = self.member_status(master) if master else None
        return status.get("state", "UNKNOWN") if status else "UNKNOWN"

    def change_state(self, state: str, timeout: float = 30.0) -> str:
        """Change the cluster state on every member, all or nothing (seed 000). Refused with
        StateChangeError while migrations are in flight, except a change to PASSIVE, which
        waits up to ``timeout`` seconds for them to end; also when a member does not lock
        the change or the members change meanwhile. Returns the state now in force."""
        state = str(state).upper()
        if state not in ClusterState.__members__:
            raise ValueError(f"a cluster state is one of {', '.join(ClusterState)}; got "
                             f"{state!r}")
        header = self._control(self._master_endpoint, p.CHANGE_STATE,
                               timeout + ANSWER_MARGIN_S, state=state, timeout=timeout)
        return header["state"]

    def promote_member(self, member: str, timeout: float = 10.0) -> list[MemberInfo]:
        """Make lite member ``member`` (a name or uuid) a data member; it asks the master,
        which publishes the new member list and rebalances (seed 000). Raises
        IllegalMemberStateError if it is a data member already or the master changed
        meanwhile (ask again), UnknownMemberError if the master does not know it."""
        def endpoint() -> str:
            for m in self.members:
                if member in (m.name, m.uuid):
                    return m.endpoint
            raise UnknownMemberError(f"no member is named {member!r}")
        return self._promoted(self._control(endpoint, p.PROMOTE_LOCAL, timeout))

    def promote_local_member(self, timeout: float = 10.0) -> list[MemberInfo]:
        """``promote_member`` for the member this client was connected to by address (seed
        000's promoteLocalMember)."""
        if self._local is None:
            raise ValueError("promote_local_member needs a client connected to a member by "
                             "address: grid.connect('tcp://127.0.0.1:PORT')")
        return self._promoted(self._control(lambda: self._local, p.PROMOTE_LOCAL, timeout))

    def _promoted(self, header: dict[str, Any]) -> list[MemberInfo]:
        self._invoker.refresh(prefer_master=False)
        return list(MemberList.from_wire(header["members"]).members)

    def _master_endpoint(self) -> str:
        self._invoker.refresh()
        master = self._invoker.members.master
        if master is None:
            raise NotReadyError("the cluster has no master right now")
        return master.endpoint

    def _control(self, endpoint: Callable[[], str], op: str, wait_s: float,
                 **fields: Any) -> dict[str, Any]:
        """A control call with the cluster secret, sent again while the answer is
        retryable (not the master, a mastership claim in progress) until ``wait_s``."""
        deadline = time.monotonic() + wait_s
        backoff = 0.05
        while True:
            reply = self._invoker.call(endpoint(), op, {**fields, p.SECRET_FIELD: self._secret},
                                       timeout=max(0.1, deadline - time.monotonic()))
            if reply is None:  # perhaps done: a resend could meet the first attempt
                raise OperationTimeoutError(op, wait_s)
            header = reply[0]
            if header.get("ok"):
                return header
            error = p.error_from_reply(header)
            if not error.retryable:
                raise error
            if time.monotonic() + backoff >= deadline:
                raise error
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    def member_status(self, member: MemberInfo, timeout: float = 2.0) -> dict[str, Any] | None:
        """What a member reports of itself (partitions, memory, role, cluster state), or None
        if it does not answer within ``timeout`` seconds."""
        reply = self._invoker.call(member.endpoint, p.STATUS, timeout=timeout)
        return reply[0] if reply and reply[0].get("ok") else None

    def view(self) -> tuple[list[MemberInfo], MemberInfo | None, dict[int, list[str | None]]]:
        """The members, the master and each partition's replicas (owner first, None for an
        empty slot), from one fresh load of the table (the master's, if it answers)."""
        self._invoker.refresh()
        table = self._invoker.table
        return (list(self._invoker.members.members), self._invoker.members.master,
                {pid: list(table.replicas(pid)) for pid in range(table.partition_count)})

    def members_status(self, timeout: float = 2.0, members: list[MemberInfo] | None = None
                       ) -> list[tuple[MemberInfo, dict | None]]:
        """``member_status`` of every member (of ``members``, default: a fresh list), asked
        all at once: a hung member costs one ``timeout``, not one each."""
        members = list(self.members) if members is None else members
        replies = self._invoker.exchange([(m.endpoint, p.STATUS, {}, []) for m in members],
                                         timeout)
        return [(m, r[0] if r and r[0].get("ok") else None)
                for m, r in zip(members, replies, strict=True)]

    def events_since(self, since: int, timeout: float = 2.0,
                     master: MemberInfo | None = None
                     ) -> tuple[str | None, list[dict[str, Any]], int]:
        """The master's events numbered ``since`` and later (grid/client/events.py says
        which), the master's uuid (its numbers are its own: a new master starts at 1), and
        the number to ask for next; (None, [], since) if the master (default: as a fresh
        load says) does not answer."""
        master = master or self.master
        reply = self._invoker.call(master.endpoint, p.EVENTS, {"since": since},
                                   timeout=timeout) if master else None
        if reply is None or not reply[0].get("ok"):
            return None, [], since
        header = reply[0]
        return (header.get("master"), [e for _, e in header.get("events") or []],
                header.get("next", since))

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
                 where: str, secret: str = "", local: str | None = None,
                 local_reads: bool = False, busy_poll_us: int = 0) -> None:
        self._invoker = Invoker(seeds, cluster_name, invocation_timeout, attempt_timeout,
                                busy_poll_us / 1e6)
        self.max_value_bytes = max_value_bytes
        try:
            self._invoker.refresh()
        except BaseException:
            self._invoker.close()
            raise
        if cluster_name and self._invoker.cluster_name != cluster_name:
            self._invoker.close()
            raise WrongClusterNameError(cluster_name, self._invoker.cluster_name, where)
        self.cluster = ClusterView(self._invoker, backup_count, secret, local)
        self._maps: dict[tuple[str, bool], Map] = {}
        self.local_reads = local_reads  # the default of get_map
        self._local_reader: LocalReader | None = None

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

    def partition_replicas(self) -> dict[int, list[str | None]]:
        """Partition id -> its replicas' member uuids (owner first, None for an empty
        slot), from a freshly loaded table."""
        return self.cluster.view()[2]

    def get_map(self, name: str, local_reads: bool | None = None) -> Map:
        """The map ``name``. ``local_reads`` (default: the client's ``local_reads``) lets
        gets read the owners' shared memory when this process runs on the grid's host
        (grid/client/local_reads.py says what such a read can miss)."""
        if not isinstance(name, str) or not name:
            raise ValueError("a map name is a non-empty string")
        local = self.local_reads if local_reads is None else bool(local_reads)
        m = self._maps.get((name, local))
        if m is None:
            reader = None
            if local:
                if self._local_reader is None:
                    self._local_reader = LocalReader(self.cluster_name)
                reader = self._local_reader
            m = self._maps[(name, local)] = Map(name, self._invoker, self.max_value_bytes,
                                                reader)
        return m

    def close(self) -> None:
        self.cluster.close()
        self._invoker.close()
        if self._local_reader is not None:
            self._local_reader.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MEMBER_ADDRESS = re.compile(r"tcp://(\[[0-9a-fA-F:.]+\]|[^\s:/\[\]]+):\d{1,5}")


def connect(address: str | None = None, *, cluster_name: str | None = None,
            registry_path: str | None = None, invocation_timeout: float | None = None,
            config: GridConfig | None = None, local_reads: bool = False) -> Client:
    """Connect to a cluster: by address (``tcp://127.0.0.1:PORT`` of any member), or through
    the local registry file of ``cluster_name`` (default "dev"). ``local_reads`` turns on
    reads from shared memory for every map this client gets (see ``Client.get_map``)."""
    config = config or GridConfig.load(
        **({"cluster_name": cluster_name} if cluster_name else {}))
    timeout = invocation_timeout if invocation_timeout is not None else config.invocation_timeout
    secret, local = config.cluster_secret, None
    if address and not MEMBER_ADDRESS.fullmatch(address):
        raise ValueError(f"{address!r} is not a member's address (tcp://HOST:PORT); to connect "
                         f"by cluster name, pass it as cluster_name (--cluster-name)")
    if address:
        seeds, where, local = [address], address, address
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
        # The registry file is readable by the cluster's owner alone (0600): whoever reads
        # it may change the cluster's state or promote members, as the shmgrid command does.
        secret = data.get("config", {}).get("cluster_secret") or secret
    return Client(seeds, cluster_name, timeout, min(config.attempt_timeout, timeout),
                  config.max_value_bytes, config.backup_count, where, secret, local, local_reads,
                  config.client_busy_poll_us)
