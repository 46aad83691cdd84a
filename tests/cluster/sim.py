"""A deterministic simulation of a whole cluster: real nodes on a simulated network and clock.

Every node is a ``workers.node.Node``, the very ClusterService and MapService a member process
runs, with the transport replaced: messages are events on one heap, delivered after a seeded
random delay, in order per channel (as one ZeroMQ connection keeps them) but reordered across
channels; every link has a delay of its own and can be made slow for a while. Faults are a
killed node (its messages vanish; the simulated supervisor tells the others, as the real one
does), a hung node (it stops taking messages and timers, for a set time or until the master
removes it and the supervisor fences it), sends that fail, and client requests delivered twice.
Clients write through the same protocol and remember what was acknowledged.

Invariants are checked after every step (``SimNetwork.check_step``): views never go back on a
node, a member-list version means one list everywhere, and when an owner answers a write (or
lets a reader see a value), the owner and every synchronous backup its table names hold it;
only a member of the newest member list answers a read.
Clients check what each answer says (a put returns the previous acknowledged value) and
readers that no value they saw is followed by an older one. The end state is checked against
what was acknowledged. A seed replays a run exactly.
"""

from __future__ import annotations

import heapq
import itertools
import random
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from grid import protocol as p
from grid.cluster.invocations import NOT_RECORDED, InvocationRecords
from grid.cluster.membership import MemberInfo, MemberList
from grid.config import GridConfig
from grid.local_reads import RECORD_HEADER, SLOT, VALID_UNTIL, VALID_UNTIL_OFFSET
from grid.partition.migration_plan import demote_table, plan_repartition
from grid.partition.table import PartitionTable
from grid.serialization import (
    deserialize_value,
    partition_id_of,
    serialize_key,
    serialize_value,
)
from workers.local_reads import LocalReadDirectory
from workers.map_service import MapService
from workers.node import Node
from workers.record_store import RecordStore, RecordStoreInvariantError
from workers.shm import remove_segments

TICK_S = 0.1
# The record store's and invocation records' methods that change a partition's data or its
# records, which SimNode.watch_rewrites notes for the record check, and the others: they
# leave both as they are, or change them only through a watched one (expire forgets through
# _forget_oldest). test_simulation_watches checks that every method of the two classes is in one of
# them, so a new way to change a partition cannot go unnoticed by the check.
STORE_REPLACES = frozenset({"clear", "move_fragment", "replace_leaves", "receive",
                            "drop_partition"})  # (noted as the whole partition)
STORE_REWRITES = STORE_REPLACES | {"put", "remove", "put_groups", "put_runs", "put_many"}
STORE_UNWATCHED = frozenset({
    "arriving_partitions", "close", "concatenated", "concatenated_from", "contains",
    "found_in", "get", "get_many", "items", "leaf_entries", "live_bytes", "namespaces",
    "new_segment", "partitions", "segment_prefix", "shm_bytes", "size", "tree",
    "lend",  # (a loan may compact the fragment first: the same records, moved)
    # (the shared index for local reads: check_local_reads)
    "publish", "settle", "share", "loads_over",
})
RECORDS_REWRITES = frozenset({"record", "adopt", "forget_unknown", "forget_partition",
                              "_forget_oldest"})
RECORDS_UNWATCHED = frozenset({"get", "invocations", "of_partition", "expire"})
SUPERVISOR = b"supervisor"


class SimNetwork:
    def __init__(self, seed: int, config: GridConfig, send_failure_rate: float = 0.0,
                 duplicate_rate: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.config = config
        self.time = 0.0
        # The nodes' record stores hold real shared-memory segments. Whoever runs a network
        # must close it; should a caller not (a failed assertion before its finally, a
        # script), they are unlinked when the network is collected or the interpreter exits.
        self._stores: list[Any] = []
        self._finalizer = weakref.finalize(self, _close_stores, self._stores)
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.nodes: dict[str, SimNode] = {}  # by endpoint
        self.uuids: dict[str, SimNode] = {}  # by member uuid
        self.channel_clock: dict[tuple[Any, Any], float] = {}
        self.link_delay: dict[tuple[Any, Any], float] = {}  # each link's own base delay
        self.slow_links: dict[tuple[Any, Any], tuple[float, float]] = {}  # until, extra delay
        self.failing_links: set[tuple[Any, Any]] = set()  # every send on them fails
        self.send_failure_rate = send_failure_rate
        self.duplicate_rate = duplicate_rate
        # Asynchronous backup operations lost on the way (they have no stream that sends them
        # again): what replica sync (seed 004) must find and repair.
        self.async_loss_rate = 0.0
        # Seconds a replica sync answer takes on top (its request stays out while the owner
        # takes more writes, which the backup applies meanwhile).
        self.sync_answer_delay = 0.0
        self.clients: dict[bytes, SimClient] = {}
        self.log: list[str] = []
        self.violations: list[str] = []
        self.fencing = True  # False: the supervisor is down, nobody kills removed members
        self.views: dict[str, tuple[int, list[int]]] = {}  # node -> members v, table vs
        # (client, request id) -> the (key, value) pairs it writes
        self.pending_writes: dict[tuple[bytes, int], list[tuple[str, int]]] = {}
        self.pending_reads: dict[tuple[bytes, int], str] = {}  # (reader, rid) -> key
        self.assigned: set[str] = set()  # nodes whose table had every partition owned
        self.syncs_seen: dict[str, int] = {}  # node -> replica syncs it had installed
        self.settled: set[tuple[str, int]] = set()  # (node, pid) slots settled this step
        self.loads_over = 0  # bulk loads whose shared index was built once they were over
        # (node, pid) -> the keys whose data changed this step (None: any of the partition's),
        # where data, invocation records or writes under way changed (SimNode.watch_rewrites)
        self.rewritten: dict[tuple[SimNode, int], set[bytes] | None] = {}
        self.owner_acked: dict[tuple[str, str], int] = {}  # (ns, key) -> newest value an
        # owner acknowledged (values of a key only grow)
        # invocation id -> (namespace, value, partition -> keys): what the invocation writes
        self.invocation_writes: dict[str, tuple[str, int, dict[int, list[bytes]]]] = {}
        # (partition, key) -> the invocations that write it, oldest (smallest value) first
        self.writes_of_key: dict[tuple[int, bytes], list[str]] = {}
        # invocation id -> until when its client may resend it (not answered yet)
        self.resendable: dict[str, float] = {}
        # master -> what its last safety check saw (check_safe_master)
        self.safe_seen: dict[str, tuple[Any, ...]] = {}

    # -- the event heap --------------------------------------------------------------------

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.seq), action))

    def run_until(self, end: float) -> None:
        while self.events and self.events[0][0] <= end:
            when, _, action = heapq.heappop(self.events)
            self.time = when
            action()
            self.check_step()
        self.time = end

    def delay(self, channel: tuple[Any, Any]) -> float:
        # Mostly fast, sometimes slow: enough spread to reorder messages across channels.
        base = self.link_delay.get(channel)
        if base is None:
            base = self.link_delay[channel] = self.rng.uniform(0.0, 0.004)
        extra = 0.0
        slow = self.slow_links.get(channel)
        if slow is not None and self.time < slow[0]:
            extra = slow[1] * self.rng.uniform(0.5, 1.0)
        return base + self.rng.expovariate(1 / 0.002) + extra + \
            (0.05 if self.rng.random() < 0.02 else 0.0)

    def slow_link(self, source: Any, target: Any, seconds: float, extra: float) -> None:
        self.slow_links[(source, target)] = (self.time + seconds, extra)
        self.log.append(f"{self.time:.3f} slow link {source!r}->{target!r} "
                        f"+{extra:.2f}s for {seconds:.2f}s")

    def send(self, source: Any, target: Any, deliver: Callable[[], None],
             sender: SimNode | None = None) -> None:
        """Deliver after a random delay, never before an earlier message on the channel.
        What a node had sent but not yet delivered when it was killed is lost or not, at
        random (a killed process loses what it had not yet written to the socket)."""
        channel = (source, target)
        when = max(self.time + self.delay(channel), self.channel_clock.get(channel, 0.0))
        self.channel_clock[channel] = when

        def arrive() -> None:
            if sender is not None and not sender.alive and self.rng.random() < 0.5:
                return
            deliver()

        self.at(when, arrive)

    # -- invariants, after every step ------------------------------------------------------

    def check_step(self) -> None:
        if self.settled:
            settled, self.settled = self.settled, set()
            self.check_local_reads(settled)
        if self.rewritten:
            by_node: dict[SimNode, dict[int, set[bytes] | None]] = {}
            for (node, pid), keys in sorted(self.rewritten.items(),
                                            key=lambda item: (item[0][0].name, item[0][1])):
                by_node.setdefault(node, {})[pid] = keys
            self.rewritten.clear()  # (in place: each node's watches add to it)
            for node, changed in by_node.items():
                if node.alive:
                    self.check_records(node, changed)
        self.check_safe_master()
        for node in self.nodes.values():
            if node.alive and node.syncs.synced != self.syncs_seen.get(node.name, 0):
                self.syncs_seen[node.name] = node.syncs.synced
                self.check_synced_backup(node)
        changed = False
        for node in self.nodes.values():
            members, table = node.cluster.members, node.cluster.table
            last = self.views.get(node.name)
            versions = table.live_rows()[1]  # (the table's own list: compared, not copied)
            if last is not None and last[0] == members.version and last[1] == versions:
                continue
            changed = True
            if node.alive:
                self.check_records(node, dict.fromkeys(range(node.cluster.table.partition_count)))
            if last is not None:
                if members.version < last[0]:
                    self.violation(f"{node.name}: member list version went back "
                                   f"{last[0]} -> {members.version}")
                if any(new < old for new, old in zip(versions, last[1], strict=True)):
                    self.violation(f"{node.name}: a partition version went back")
            self.views[node.name] = (members.version, list(versions))
        if changed:
            self.check_local_reads(None)
            # Once assigned, a master's table gives every partition an owner, always (a
            # partition with no replica left gets an empty one at once).
            for node in self.alive():
                if node.cluster.table.is_assigned():
                    self.assigned.add(node.name)
                elif node.name in self.assigned and node.cluster.is_master:
                    self.violation(f"{node.name}: the master's table has a partition without "
                                   f"an owner")
            # A partition version means one replica row, whoever holds the table: so two
            # members can never each take themselves for the owner at the same version.
            rows: dict[tuple[int, int], tuple] = {}
            for node in self.alive():
                table = node.cluster.table
                if not table.is_assigned():
                    continue
                for pid, version in enumerate(table.versions()):
                    row = tuple(table.replicas(pid))
                    if rows.setdefault((pid, version), row) != row:
                        self.violation(f"{node.name}: partition {pid} at version {version} "
                                       f"has rows {rows[(pid, version)]} and {row}")
            # A state version means one cluster state (grid/cluster/state_change.py).
            states: dict[int, Any] = {}
            for node in self.alive():
                cluster = node.cluster
                if states.setdefault(cluster.state_version, cluster.state) != cluster.state:
                    self.violation(f"{node.name}: state version {cluster.state_version} means "
                                   f"{states[cluster.state_version]} and {cluster.state}")
            # Among the members that run (zombies included), a version means one list: two
            # masters may never each publish a list of their own under one number.
            lists: dict[int, tuple[str, ...]] = {}
            for node in self.alive():
                members = node.cluster.members
                if members.version and \
                        lists.setdefault(members.version, tuple(members.uuids)) != \
                        tuple(members.uuids):
                    self.violation(f"member list version {members.version} means two lists")

    def check_safe_master(self) -> None:
        """A master that says the cluster is safe, in a state that lets it migrate, has
        nothing left to plan: what it would plan next from its table is nothing (cycles the
        planner cancels aside). Else a wait-safe returns while partitions still move.

        Looked at when the master's table, member list, plan or wish to plan changed."""
        for node in self.alive():
            cluster = node.cluster
            if not cluster.is_master:
                continue
            seen = (cluster.members.version, tuple(cluster.table.live_rows()[1]),
                    cluster.driver.active, cluster.plan_wanted, cluster.state_version,
                    frozenset(cluster.leaving))
            if self.safe_seen.get(node.name) == seen:
                continue
            self.safe_seen[node.name] = seen
            if not cluster.state.migration_allowed or not cluster.is_safe():
                continue
            staying = [u for u in cluster.members.data_members if u not in cluster.leaving]
            reclaim = cluster._reclaim_target(staying)
            table = cluster.table
            target = reclaim or cluster.driver.target(table, staying)
            start = demote_table(table, target) if reclaim is not None else table
            plan = plan_repartition(start, target)
            if start != table or plan.queues or plan.removals or plan.lost_owners:
                self.violation(f"{node.name}: says the cluster is safe with "
                               f"{plan.migration_count} migrations still to plan")

    def violation(self, text: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(f"{self.time:.3f} {text}")

    def newest_replicas(self, pid: int) -> tuple[str | None, ...]:
        """The partition's replicas in the newest table a running member holds: a committed
        migration may have moved a backup before the owner heard of it."""
        newest = max((n.cluster.table for n in self.alive()), key=lambda t: t.version(pid))
        return newest.replicas(pid)

    def check_acked_write(self, owner: SimNode, key: str, value: int) -> None:
        """An owner answers a write: it and every synchronous backup of the newest table hold
        it."""
        key_bytes, want = serialize_key(key), serialize_value(value)
        pid = partition_id_of(key_bytes, owner.cluster.table.partition_count)
        if owner.store.get(pid, "m", key_bytes) != want:
            self.violation(f"{owner.name} acked {key}={value} but does not hold it")
        for index, uuid_ in enumerate(self.newest_replicas(pid)[:1 + self.config.backup_count]):
            node = self.by_uuid(uuid_) if uuid_ else None
            if node is None:
                continue
            got = node.store.get(pid, "m", key_bytes)
            if got != want:
                self.violation(f"{owner.name} acked {key}={value} but replica {index} "
                               f"({node.name}) holds {got!r}")

    def check_synced_backup(self, node: SimNode) -> None:
        """A replica sync was installed on ``node``: where it is a synchronous backup it
        still holds every write an owner acknowledged, or a later one (a sync must never take
        one away). A synchronous backup in the newest table, as ``check_acked_write`` has it:
        a member that has not yet heard that a migration moved its backup elsewhere need not
        hold the writes acknowledged since (seed 92 ``loss-join`` of the replica sync
        simulation)."""
        partition_count, me = node.cluster.table.partition_count, node.info.uuid
        backups = slice(1, 1 + self.config.backup_count)
        for (ns, key), value in self.owner_acked.items():
            key_bytes = serialize_key(key)
            pid = partition_id_of(key_bytes, partition_count)
            if me not in self.newest_replicas(pid)[backups]:
                continue
            got = node.store.get(pid, ns, key_bytes)
            if got is None or deserialize_value(got) < value:
                self.violation(f"a replica sync left synchronous backup {node.name} with "
                               f"{key}={got!r}, acknowledged {value}")

    def check_records(self, node: SimNode, changed: dict[int, set[bytes] | None]) -> None:
        """Where ``node`` is a replica of a partition of ``changed`` (not one still arriving: a
        migration hands its records on with its first fragment):

        - its invocation record of a write means that its copy holds the write (or a later
          one): a resend reaching it as owner is answered from the record and applied
          nowhere, so a record whose write a sync, migration or stale operation took away
          loses the write;
        - its copy that holds a write whose client may still resend it has the write's
          record (or, on the owner, the write under way): else that resend, reaching it as
          owner, is applied again and answered with the write's own value as the previous
          one.

        After every step for the partitions whose data, records or writes under way changed
        in it (the records of the keys that changed: ``changed`` maps a partition to them,
        or to None for all; an installed sync or migration notes its whole partition), and
        for all of a member's when its table changed (which moves what it replicates and
        what is still arriving, its data untouched)."""
        table, me = node.cluster.table, node.info.uuid
        arriving = node.store.arriving_partitions()
        records, writes, store = node.maps.records, self.invocation_writes, node.store
        resendable = [iid for iid, until in self.resendable.items() if until >= self.time]
        for pid, keys_changed in changed.items():
            if pid in arriving or table.replica_index(pid, me) < 0:
                continue
            if keys_changed is not None:  # the newest write recorded of each key is the one
                for key_bytes in keys_changed:  # to hold (values of a key only grow)
                    for iid in reversed(self.writes_of_key.get((pid, key_bytes), ())):
                        if records.get(pid, iid) is NOT_RECORDED:
                            continue
                        ns, value, _ = writes[iid]
                        got = store.get(pid, ns, key_bytes)
                        if got is None or deserialize_value(got) < value:
                            self.violation(f"{node.name} keeps the record of {iid} in "
                                           f"partition {pid} but holds {key_bytes!r}={got!r}, "
                                           f"not {value}")
                        break
            for iid, _ in records.of_partition(pid) if keys_changed is None else ():
                written = writes.get(iid)
                if written is None:
                    continue
                ns, value, keys_of = written
                for key_bytes in keys_of.get(pid, ()):
                    got = store.get(pid, ns, key_bytes)
                    if got is None or deserialize_value(got) < value:
                        self.violation(f"{node.name} keeps the record of {iid} in partition "
                                       f"{pid} but holds {key_bytes!r}={got!r}, not {value}")
            for iid in resendable:
                ns, value, keys_of = writes[iid]
                keys = keys_of.get(pid)
                if keys is None or records.get(pid, iid) is not NOT_RECORDED or \
                        node.maps._under_way(pid, iid) is not None:
                    continue
                held = [store.get(pid, ns, key_bytes) for key_bytes in keys]
                if all(got is not None and deserialize_value(got) == value for got in held):
                    self.violation(f"{node.name} holds the write of {iid} in partition {pid}, "
                                   f"which its client may resend, without its record")

    def check_local_reads(self, only: set[tuple[str, int]] | None) -> None:
        """What a client on the host could read from a member's memory now (workers/
        local_reads.py: lease valid, partition served, slot settled, seqlock even; a dead
        member counts as fenced) is what a get may answer: held by every synchronous backup
        of the newest table (or a later value); and only a member of the newest member list,
        owning the partition in its own table, serves it.

        Checked for the (node, pid) slots settled in this step (``only``), and for every slot
        when a member list or table changed (None): a settle, a served flag, a lease and a
        removal change nowhere else."""
        newest = max((n.cluster.members for n in self.alive()), key=lambda m: m.version,
                     default=None)
        if only is None:
            self.check_served_flags()
        synchronous = slice(1, 1 + self.config.backup_count)
        for node in self.alive():
            local = node.store.local
            if local is None or local.closed or \
                    self.time >= VALID_UNTIL.unpack_from(local.mm, VALID_UNTIL_OFFSET)[0]:
                continue
            served = [pid for pid, flag in enumerate(local.served)
                      if flag and (only is None or (node.name, pid) in only)]
            if not served:
                continue
            if newest is not None and node.info.uuid not in newest:
                self.violation(f"{node.name} was removed (member list {newest.version}) but "
                               f"local readers may still read its memory")
            slots = local.slots_of("m")
            table, me = node.cluster.table, node.info.uuid
            for pid in served:
                if table.owner(pid) != me:
                    self.violation(f"{node.name} serves partition {pid} to local readers but "
                                   f"does not own it")
                if slots is None:
                    continue
                seq, settled, arena_1, _ = SLOT.unpack_from(slots.mm, SLOT.size * pid)
                if not settled or seq & 1:
                    continue
                fragment = node.store._partitions.get(pid, {}).get("m")
                if fragment is not None and fragment.count and \
                        (fragment.shared is None or not arena_1):
                    self.violation(f"{node.name} serves partition {pid} to local readers "
                                   f"with no shared index of its {fragment.count} records: "
                                   f"they would read every key absent")
                # The whole index, where a table changed (a partition shared then had its
                # index built): at every settle it cost a tenth of a simulated run.
                elif fragment is not None and only is None:
                    try:
                        fragment.check_shared()
                    except RecordStoreInvariantError:
                        self.violation(f"{node.name} serves partition {pid} to local readers "
                                       f"with a shared index that is not its records' index")
                backups = [backup for uuid_ in self.newest_replicas(pid)[synchronous]
                           if uuid_ and (backup := self.by_uuid(uuid_)) is not None]
                for key_bytes, value in node.store.items(pid, "m") if backups else ():
                    for backup in backups:
                        held = backup.store.get(pid, "m", key_bytes)
                        if held != value and (held is None or deserialize_value(held) <
                                              deserialize_value(value)):
                            self.violation(f"local readers of {node.name} may see "
                                           f"{key_bytes!r}={deserialize_value(value)}, which "
                                           f"{backup.name} does not hold yet")

    def check_served_flags(self) -> None:
        """A member serves local readers exactly the partitions it owns while it is ready:
        one it forgot to serve is not unsafe, but its local readers would ask it forever."""
        for node in self.alive():
            local, cluster = node.store.local, node.cluster
            if local is None or local.closed or node.paused:
                continue
            serving = cluster.ready and not cluster.is_lite
            me = node.info.uuid
            for pid, flag in enumerate(local.served):
                if bool(flag) != (serving and cluster.table.owner(pid) == me):
                    self.violation(f"{node.name} {'serves' if flag else 'does not serve'} "
                                   f"partition {pid} to local readers, ready={cluster.ready}, "
                                   f"owner={cluster.table.owner(pid) == me}")
                    return

    def check_read_by_member(self, owner: SimNode, key: str) -> None:
        """Only a member of the newest member list answers a read: a removed one (it hung and
        nobody fenced it) may miss what its partitions' new owners took since. A member that
        asked to leave is the exception: the master removes it once its last partition moved
        away, and until that table reaches it, it answers as any migration source may
        (stale reads are allowed unless migration_stale_read_disabled)."""
        newest = max((n.cluster.members for n in self.alive()), key=lambda m: m.version)
        if owner.info.uuid not in newest and owner.cluster.leave_started is None:
            self.violation(f"{owner.name} answered a read of {key} but was removed "
                           f"(member list {newest.version})")

    def check_read_durable(self, owner: SimNode, key: str, frames: list[bytes]) -> None:
        """An owner answers a read with a value: every synchronous backup of the newest table
        holds it too, or a later one (the writer's values only grow): nobody may see a write
        that could still be lost."""
        if len(frames) < 2:
            return
        key_bytes, seen = serialize_key(key), deserialize_value(frames[1])
        pid = partition_id_of(key_bytes, owner.cluster.table.partition_count)
        for uuid_ in self.newest_replicas(pid)[1:1 + self.config.backup_count]:
            node = self.by_uuid(uuid_) if uuid_ else None
            held = node.store.get(pid, "m", key_bytes) if node is not None else None
            if node is not None and (held is None or deserialize_value(held) < seen):
                self.violation(f"{owner.name} let a reader see {key}="
                               f"{deserialize_value(frames[1])}, which {node.name} does not "
                               f"hold yet")

    # -- nodes -----------------------------------------------------------------------------

    def add_node(self, join: list[str], lite: bool = False) -> SimNode:
        node = SimNode(self, f"member-{len(self.nodes)}", join, lite)
        self._stores.append(node.store)
        self.nodes[node.info.endpoint] = node
        self.uuids[node.info.uuid] = node
        node.cluster.start()
        self.at(self.time + TICK_S, node.timer)
        return node

    def by_uuid(self, member_uuid: str) -> SimNode | None:
        return self.uuids.get(member_uuid)

    def alive(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive]

    def master(self) -> SimNode:
        return next(n for n in self.alive() if n.cluster.is_master and not n.paused)

    def kill(self, node: SimNode, why: str) -> None:
        if not node.alive:
            return
        node.alive = False
        self.log.append(f"{self.time:.3f} kill {node.name} ({why})")
        # As the supervisor does: the dead member's segments lose their names (what is
        # mapped stays readable, so the checks can still look into its store).
        remove_segments(node.store.segment_prefix)
        for other in self.alive():  # the supervisor sees the death at once
            self.send(SUPERVISOR, other.info.endpoint, lambda o=other: o.deliver(
                SUPERVISOR, p.request(p.MEMBER_DIED, 0, self.config.cluster_name,
                                      uuid=node.info.uuid, k=self.config.cluster_secret), []))

    def hang(self, node: SimNode, seconds: float | None = None) -> None:
        """Stop ``node`` taking messages and timers; for ``seconds``, or until fenced."""
        node.paused = True
        self.log.append(f"{self.time:.3f} hang {node.name}"
                        + (f" for {seconds:.2f}s" if seconds else ""))
        if seconds is not None:
            self.at(self.time + seconds, lambda: self.resume(node))

    def resume(self, node: SimNode) -> None:
        """The hung node runs again: its timers fire first (the worst order, which a real
        process may well see), then it takes what it was sent meanwhile, in order."""
        if not node.alive or not node.paused:
            return
        node.paused = False
        self.log.append(f"{self.time:.3f} resume {node.name}")
        node.tick(self.time)
        held, node.held = node.held, []
        for action in held:
            action()

    def fence(self, member_uuid: str) -> None:
        if not self.fencing:
            return
        node = self.by_uuid(member_uuid)
        if node is not None:
            self.kill(node, "fenced")

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> SimNetwork:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _close_stores(stores: list[Any]) -> None:
    for store in stores:
        store.close()


class SimStore(RecordStore):
    """The record store of a simulated member. Compiled (grid/compiled.py), a class's own
    methods cannot be replaced, on it or on its instances; a Python subclass's can, and the
    compiled code calls them: so the simulation's watches (``SimNode.watch_rewrites``) and the
    broken-protocol tests replace them here."""


class SimRecords(InvocationRecords):
    """The invocation records of a simulated member (see ``SimStore``)."""


class SimMapService(MapService):
    """The map service of a simulated member (see ``SimStore``)."""

    records_class = SimRecords


class SimNode(Node):
    store_class = SimStore
    map_service_class = SimMapService

    def __init__(self, net: SimNetwork, name: str, join: list[str], lite: bool = False) -> None:
        self.net = net
        self.peers: dict[str, str] = {}  # key -> endpoint
        self.alive = True
        self.paused = False
        self.kill_after_reply = False  # die right after answering a client: the worst moment
        self.kill_after_publish = False  # die after a publish reached only some members
        self.kill_after_read = False  # die right after answering a reader: what it saw must
        # survive
        self.held: list[Callable[[], None]] = []
        info = MemberInfo(str(uuid.UUID(int=net.rng.getrandbits(128))), name,
                          f"sim://{name}", 1000 + len(net.nodes), lite)
        super().__init__(net.config, info, join)
        # Local reads of map "m" (workers/local_reads.py), checked after every step.
        self.store.local = LocalReadDirectory(self.store.segment_prefix, info.uuid,
                                              net.config.partition_count)
        self.store.shared_partitions = set()  # as a member's: those it serves
        settle = self.store.settle

        def settle_seen(pid: int, namespace: str) -> None:
            settle(pid, namespace)
            net.settled.add((name, pid))

        self.store.settle = settle_seen  # type: ignore[method-assign]
        loads_over = self.store.loads_over

        def loads_over_seen(*args: int) -> list[tuple[int, str]]:
            over = loads_over(*args)
            net.loads_over += len(over)
            return over

        self.store.loads_over = loads_over_seen  # type: ignore[method-assign]
        self.maps.publish("m")
        self.watch_rewrites()

    def watch_rewrites(self) -> None:
        """Note what changes a partition's data (the keys, where known), its invocation
        records or its writes under way, for the record check after the step
        (``SimNetwork.check_records``)."""
        rewritten, store, records = self.net.rewritten, self.store, self.maps.records
        writes = self.net.invocation_writes

        def mark(pid: int, keys: Iterable[bytes] | None) -> None:
            slot = (self, pid)
            if keys is None:
                rewritten[slot] = None
            elif slot not in rewritten:
                rewritten[slot] = set(keys)
            elif rewritten[slot] is not None:
                rewritten[slot].update(keys)  # type: ignore[union-attr]

        def recorded_keys(iid: str, pid: int) -> list[bytes]:
            written = writes.get(iid)
            return [] if written is None else written[2].get(pid, [])

        def watch(owner: Any, method: str,
                  touched: Callable[..., Iterable[tuple[int, Iterable[bytes] | None]]]) -> None:
            original = getattr(owner, method)

            def watched(*args: Any) -> Any:
                for pid, keys in touched(*args):
                    mark(pid, keys)
                return original(*args)

            setattr(owner, method, watched)

        for method in STORE_REPLACES:
            watch(store, method, lambda pid, *_: [(pid, None)])
        watch(store, "put", lambda pid, _ns, key, _value: [(pid, (key,))])
        watch(store, "remove", lambda pid, _ns, key: [(pid, (key,))])
        watch(store, "put_groups", lambda _ns, groups: [(pid, items[::2]) for pid, items in groups])

        def runs(_ns: str, pids: list[int], counts: list[int], items: list[bytes]
                 ) -> Iterator[tuple[int, list[bytes]]]:
            at = 0
            for pid, count in zip(pids, counts, strict=True):
                yield pid, items[2 * at:2 * (at + count):2]
                at += count

        watch(store, "put_runs", runs)
        put_many = store.put_many

        def put_many_watched(pid: int, namespace: str, pairs: Iterable[tuple[bytes, bytes]]
                             ) -> None:
            pairs = list(pairs)
            mark(pid, [key for key, _ in pairs])
            put_many(pid, namespace, pairs)

        store.put_many = put_many_watched  # type: ignore[method-assign]
        record = records.record

        def record_watched(iid: str, pids: Iterable[int], *args: Any) -> None:
            pids = list(pids)
            for pid in pids:
                mark(pid, recorded_keys(iid, pid))
            record(iid, pids, *args)

        records.record = record_watched  # type: ignore[method-assign]
        watch(records, "adopt", lambda pid, adopted, *_: [
            (pid, [key for iid, _ in adopted for key in recorded_keys(iid, pid)])])
        # What takes a record or a write under way away (no data changes): the data it leaves
        # must not be a resendable write's.
        watch(records, "forget_unknown", lambda pid, *_: [(pid, ())])
        watch(records, "forget_partition", lambda pid: [(pid, ())])
        watch(records, "_forget_oldest", lambda: [
            (pid, ()) for pid in records._records[records._order[0][1]][0]])
        watch(self.maps, "_answer", lambda ticket: [(pid, ()) for pid in ticket.written])
        assert vars(store).keys() >= STORE_REWRITES and \
            vars(records).keys() >= RECORDS_REWRITES, "a rewriting method is not watched"

    def now(self) -> float:
        return self.net.time

    def connect_peer(self, key: str, endpoint: str) -> None:
        self.peers[key] = endpoint

    def disconnect_peer(self, key: str) -> None:
        self.peers.pop(key, None)

    def send_peer(self, key: str, frames: list[bytes]) -> bool:
        endpoint = self.peers.get(key)
        if endpoint is None:
            return False
        me = self.info.uuid.encode()
        if (me, endpoint) in self.net.failing_links or \
                self.net.rng.random() < self.net.send_failure_rate:
            return False  # did not leave: the caller must not take it for delivered
        target = self.net.nodes.get(endpoint)
        if self.net.async_loss_rate and self.net.rng.random() < self.net.async_loss_rate:
            header = p.unpack_header(frames[0])
            if header.get("op") == p.BACKUP and header.get("seq") is None:
                return True  # it left, and is lost on the way
        if target is not None:
            self.net.send(me, endpoint, lambda: target.deliver(me, frames[0], frames[1:]),
                          sender=self)
        if self.kill_after_publish and p.unpack_header(frames[0]).get("op") == p.PUBLISH:
            self.net.kill(self, "chaos, in the middle of a publish")
        return True

    def reply(self, ident: bytes, frames: list[Any]) -> None:
        if ident == SUPERVISOR:
            return
        frames = [bytes(f) for f in frames]
        client = self.net.clients.get(ident)
        if client is not None:
            header = p.unpack_header(frames[0])
            writes = self.net.pending_writes.get((ident, header.get("id")))
            if writes is not None and header.get("ok") and not header.get("wrong"):
                for key, value in writes:
                    self.net.check_acked_write(self, key, value)
                    acked = (client.ns, key)
                    self.net.owner_acked[acked] = max(value, self.net.owner_acked.get(acked, 0))
            read = self.net.pending_reads.pop((ident, header.get("id")), None)
            if read is not None and header.get("ok"):
                self.net.check_read_by_member(self, read)
                self.net.check_read_durable(self, read, frames)
            self.net.send(self.info.endpoint, ident, lambda: client.on_reply(frames),
                          sender=self)
            if self.kill_after_reply or (self.kill_after_read and isinstance(client, SimReader)):
                self.net.kill(self, "chaos, right after a reply")
                for node in self.net.nodes.values():
                    node.kill_after_read = False
            return
        for node in self.net.nodes.values():
            if node.info.uuid.encode() == ident:
                def send(n: SimNode = node) -> None:
                    self.net.send(self.info.endpoint, ident, lambda: n.take_reply(frames),
                                  sender=self)
                if self.net.sync_answer_delay and "replaced" in p.unpack_header(frames[0]):
                    self.net.at(self.net.time + self.net.rng.uniform(0.5, 1.0) *
                                self.net.sync_answer_delay, send)
                else:
                    send()
                return

    def notify_supervisor(self, op: str, **fields: Any) -> None:
        if op == p.FENCE:
            self.net.at(self.net.time + 0.001, lambda: self.net.fence(fields["uuid"]))

    # -- what the network does to this node ------------------------------------------------

    def deliver(self, ident: bytes, head: bytes, frames: list[bytes]) -> None:
        if not self.alive:
            return
        if self.paused:
            self.held.append(lambda: self.deliver(ident, head, frames))
            return
        self.on_request(ident, head, frames)

    def take_reply(self, frames: list[bytes]) -> None:
        if not self.alive:
            return
        if self.paused:
            self.held.append(lambda: self.take_reply(frames))
            return
        self.on_reply(frames)

    def timer(self) -> None:
        if not self.alive:
            return
        if not self.paused:
            self.tick(self.net.time)
        if self.running:
            self.net.at(self.net.time + TICK_S, self.timer)
        else:
            self.net.kill(self, "stopped itself")


class SimClient:
    """Puts keys of its own one after another, resending a write with the same invocation id
    until it is acknowledged or its invocation timeout passed (then, as the real client, it
    gives up: the write is indeterminate); remembers each acknowledged value and checks that
    every put returns the previous one (or an indeterminate one since). With ``key_count`` it
    rewrites that many keys over and over (a lost update shows as an older value), without it
    every write has a key of its own (a lost write shows as a hole)."""

    def __init__(self, net: SimNetwork, name: str, ns: str = "m",
                 key_count: int | None = None, batch: int = 0, spread: bool = False,
                 laid_out: bool = False) -> None:
        self.key_count = key_count
        self.batch = batch  # > 0: each write is a PUT_ALL of this many keys of one hash tag
        self.spread = spread  # a batch's keys have no tag: a PUT_ALL to each owner
        # A spread batch's entries go as record blocks, as the Spark writer sends them
        # (workers/record_block.py): a bulk load, where every key is new (no key_count).
        self.laid_out = laid_out
        self.net = net
        self.ident = name.encode()
        self.ns = ns
        self.acked: dict[str, int] = {}
        # Values sent since the key's last acknowledgement: each may or may not have been
        # applied (no answer, or an answer that never came back), so each may be the value.
        self.unsure: dict[str, set[int]] = {}
        self.waiting: dict[int, Callable[[dict | None, list[bytes]], None]] = {}
        self.ids = itertools.count(1)
        self.members = MemberList()
        self.table = PartitionTable(partition_count=net.config.partition_count)
        self.counter = 0
        self.iid: str | None = None  # the invocation of the write under way
        self.stopped = False
        self.silent: dict[str, float] = {}  # endpoint -> when it last failed to answer
        self.greeted: set[str] = set()  # endpoints told our client id (a backup answers us)
        net.clients[self.ident] = self

    def request(self, endpoint: str, op: str, fields: dict, frames: list[bytes],
                callback: Callable[[dict | None, list[bytes]], None], timeout: float) -> int:
        rid = next(self.ids)

        def answered(header: dict | None, reply: list[bytes]) -> None:
            if header is not None:
                self.silent.pop(endpoint, None)  # it answers again
            callback(header, reply)

        self.waiting[rid] = answered
        head = p.request(op, rid, self.net.config.cluster_name, **fields)
        target = self.net.nodes.get(endpoint)
        if target is not None:
            copies = 2 if self.net.rng.random() < self.net.duplicate_rate else 1
            for _ in range(copies):  # the network may deliver a request twice
                self.net.send(self.ident, endpoint,
                              lambda: target.deliver(self.ident, head, list(frames)))
        self.net.at(self.net.time + timeout, lambda: self._expire(rid, endpoint))
        return rid

    def _expire(self, rid: int, endpoint: str) -> None:
        callback = self.waiting.pop(rid, None)
        if callback is not None:
            self.silent[endpoint] = self.net.time
            callback(None, [])

    def on_reply(self, frames: list[bytes]) -> None:
        header = p.unpack_header(frames[0])
        callback = self.waiting.pop(header.get("id"), None)
        if callback is not None:
            callback(header, frames[1:])

    def refresh(self, then: Callable[[], None], tried: frozenset[str] = frozenset()) -> None:
        alive = self.net.alive()
        if not alive:
            return
        untried = [n for n in alive if n.info.endpoint not in tried]
        if not untried:  # nobody answered: go on with the table we have
            self.net.at(self.net.time + 0.01, then)
            return
        # As the real client does: ask members that answered lately first, and the next one
        # when one does not answer.
        recent = [n for n in untried
                  if self.net.time - self.silent.get(n.info.endpoint, -10.0) > 2.0]
        node = self.net.rng.choice(recent or untried)

        def on_view(header: dict | None, frames: list[bytes]) -> None:
            if header is None:
                self.refresh(then, tried | {node.info.endpoint})
                return
            if header.get("ok"):
                members = MemberList.from_wire(header["members"])
                if members.version >= self.members.version:
                    self.members = members
                self.table.apply(PartitionTable.from_wire(header["table"]))
                self.greet()
            self.net.at(self.net.time + 0.01, then)

        self.request(node.info.endpoint, p.TABLE, {}, [], on_view, timeout=0.5)

    def greet(self) -> None:
        """Say HELLO to the members not greeted yet, as the real client does on each new
        link: a backup may then answer our writes in their owner's place. Nobody waits for
        the answer."""
        for member in self.members.members:
            target = self.net.nodes.get(member.endpoint)
            if target is None or member.endpoint in self.greeted:
                continue
            self.greeted.add(member.endpoint)
            head = p.request(p.HELLO, next(self.ids), self.net.config.cluster_name,
                             cid=self.ident.decode())
            self.net.send(self.ident, member.endpoint,
                          lambda target=target, head=head: target.deliver(self.ident, head, []))

    def start(self) -> None:
        self.refresh(self.write_next)

    def write_next(self) -> None:
        if self.stopped:
            return
        self.counter += 1
        index = self.counter if self.key_count is None else self.counter % self.key_count
        key = f"{self.ident.decode()}-{index}"
        iid = f"{self.ident.decode()}:{self.counter}"
        deadline = self.net.time + self.net.config.invocation_timeout
        keys = [f"{key}:{j}" for j in range(self.batch)] if self.batch and self.spread else \
            [f"{{{key}}}{j}" for j in range(self.batch)] if self.batch else [key]
        keys_of: dict[int, list[bytes]] = {}
        for written in map(serialize_key, keys):
            keys_of.setdefault(partition_id_of(written, self.table.partition_count),
                               []).append(written)
        self.net.invocation_writes[iid] = (self.ns, self.counter, keys_of)
        for pid, written_keys in keys_of.items():
            for written in written_keys:
                self.net.writes_of_key.setdefault((pid, written), []).append(iid)
        self.net.resendable.pop(self.iid, None)  # answered, or given up: never resent
        self.net.resendable[iid] = deadline
        self.iid = iid
        if self.batch and self.spread:
            self.attempt_spread(keys, self.counter, iid, deadline, None)
        elif self.batch:
            self.attempt_batch(keys, self.counter, iid, deadline)
        else:
            self.attempt(key, self.counter, iid, deadline)

    def owner_of(self, key: str) -> tuple[int, MemberInfo | None]:
        pid = partition_id_of(serialize_key(key), self.table.partition_count)
        return pid, self.members.get(self.table.owner(pid) or "")

    def attempt(self, key: str, value: int, iid: str, deadline: float) -> None:
        if self.stopped:
            return
        if self.net.time > deadline:  # indeterminate: it stays in unsure
            self.write_next()
            return
        pid, owner = self.owner_of(key)
        if owner is None:
            self.refresh(lambda: self.attempt(key, value, iid, deadline))
            return
        self.unsure.setdefault(key, set()).add(value)
        previous = self.acked.get(key)

        def on_ack(header: dict | None, frames: list[bytes]) -> None:
            self.net.pending_writes.pop((self.ident, rid), None)
            if header and header.get("ok"):
                got = frames[0] if frames else None
                allowed = {None if previous is None else serialize_value(previous)} | \
                    {serialize_value(v) for v in self.unsure.get(key, ()) if v != value}
                if got not in allowed:
                    self.net.violation(f"put {key}={value} returned {got!r}, not the previous "
                                       f"value {previous}")
                self.acked[key] = value
                self.unsure[key] = set()
                self.write_next()
            else:
                self.refresh(lambda: self.attempt(key, value, iid, deadline))

        rid = self.request(owner.endpoint, p.PUT,
                           {"ns": self.ns, "pid": pid, "iid": iid, "cid": self.ident.decode()},
                           [serialize_key(key), serialize_value(value)], on_ack, timeout=1.0)
        self.net.pending_writes[(self.ident, rid)] = [(key, value)]

    def attempt_batch(self, keys: list[str], value: int, iid: str, deadline: float) -> None:
        """A PUT_ALL of ``keys`` (one hash tag: one partition) to ``value``, as ``attempt``
        puts one key: resent with the same invocation id until acknowledged (an answer
        naming the partition "wrong" is no acknowledgement: it is sent to the new owner)."""
        if self.stopped:
            return
        if self.net.time > deadline:
            self.write_next()
            return
        pid, owner = self.owner_of(keys[0])
        if owner is None:
            self.refresh(lambda: self.attempt_batch(keys, value, iid, deadline))
            return
        for key in keys:
            self.unsure.setdefault(key, set()).add(value)

        def on_ack(header: dict | None, frames: list[bytes]) -> None:
            self.net.pending_writes.pop((self.ident, rid), None)
            if header and header.get("ok") and not header.get("wrong"):
                for key in keys:
                    self.acked[key] = value
                    self.unsure[key] = set()
                self.write_next()
            else:
                self.refresh(lambda: self.attempt_batch(keys, value, iid, deadline))

        items = [item for key in keys for item in (serialize_key(key), serialize_value(value))]
        rid = self.request(owner.endpoint, p.PUT_ALL,
                           {"ns": self.ns, "pids": [pid], "counts": [len(keys)], "iid": iid,
                            "cid": self.ident.decode()}, [p.pack_items(items)], on_ack,
                           timeout=1.0)
        self.net.pending_writes[(self.ident, rid)] = [(key, value) for key in keys]

    def attempt_spread(self, keys: list[str], value: int, iid: str, deadline: float,
                       remaining: set[int] | None) -> None:
        """A batch of ``keys`` spread over partitions, as the real client sends one: a
        PUT_ALL to each owner of the ``remaining`` partitions, all with the invocation id;
        a partition's keys count as acknowledged once its owner answered without naming it
        "wrong", and the rest are sent again (to the owners a fresh table names) until none
        is left or the invocation timed out."""
        if self.stopped:
            return
        if self.net.time > deadline:
            self.write_next()
            return
        by_pid: dict[int, list[str]] = {}
        for key in keys:
            by_pid.setdefault(partition_id_of(serialize_key(key), self.table.partition_count),
                              []).append(key)
        if remaining is None:
            remaining = set(by_pid)
            for key in keys:
                self.unsure.setdefault(key, set()).add(value)
        by_owner: dict[str, list[int]] = {}
        for pid in sorted(remaining):
            owner = self.members.get(self.table.owner(pid) or "")
            if owner is None:
                self.refresh(lambda: self.attempt_spread(keys, value, iid, deadline, remaining))
                return
            by_owner.setdefault(owner.endpoint, []).append(pid)
        unanswered = [len(by_owner)]

        def on_ack(rid: int, pids: list[int], header: dict | None, frames: list[bytes]) -> None:
            self.net.pending_writes.pop((self.ident, rid), None)
            if header and header.get("ok"):
                wrong = set(header.get("wrong") or ())
                for pid in pids:
                    if pid not in wrong:
                        remaining.discard(pid)
                        for key in by_pid[pid]:
                            self.acked[key] = value
                            self.unsure[key] = set()
            unanswered[0] -= 1
            if unanswered[0]:
                return
            if remaining:
                self.refresh(lambda: self.attempt_spread(keys, value, iid, deadline, remaining))
            else:
                self.write_next()

        for endpoint, pids in by_owner.items():
            items = [item for pid in pids for key in by_pid[pid]
                     for item in (serialize_key(key), serialize_value(value))]
            fields = {"ns": self.ns, "pids": pids, "counts": [len(by_pid[pid]) for pid in pids],
                      "iid": iid, "cid": self.ident.decode()}
            if self.laid_out:
                pairs = list(zip(items[0::2], items[1::2], strict=True))
                sizes = [RECORD_HEADER.pack(len(key), len(value_)) for key, value_ in pairs]
                frame = b"".join([*sizes, *(size + key + value_ for size, (key, value_)
                                            in zip(sizes, pairs, strict=True))])
                fields["laid_out"] = True
            else:
                frame = p.pack_items(items)
            sent: list[int] = []  # the request's id, once it has one
            rid = self.request(
                endpoint, p.PUT_ALL, fields, [frame],
                lambda h, f, sent=sent, pids=pids: on_ack(sent[0], pids, h, f), timeout=1.0)
            sent.append(rid)
            self.net.pending_writes[(self.ident, rid)] = \
                [(key, value) for pid in pids for key in by_pid[pid]]


class SimReader(SimClient):
    """Reads the keys of a writer over and over; a value it saw must never be followed by an
    older one (nobody may read a write that is later lost)."""

    def __init__(self, net: SimNetwork, name: str, writer: SimClient) -> None:
        super().__init__(net, name)
        self.writer = writer
        self.seen: dict[str, int] = {}

    def write_next(self) -> None:  # a reader reads instead
        if self.stopped:
            return
        # Mostly the key the writer is writing now: a read of a write not yet durable is
        # what must never happen.
        count = self.writer.key_count or 1
        index = self.writer.counter % count if self.net.rng.random() < 0.7 else \
            self.net.rng.randrange(count)
        self.read(f"{self.writer.ident.decode()}-{index}")

    def read(self, key: str) -> None:
        pid, owner = self.owner_of(key)
        if owner is None:
            self.refresh(self.write_next)
            return

        def on_value(header: dict | None, frames: list[bytes]) -> None:
            if header and header.get("ok") and frames:
                value = deserialize_value(frames[0])
                if value < self.seen.get(key, 0):
                    self.net.violation(f"{self.ident.decode()} read {key}={value} after "
                                       f"{self.seen[key]}")
                self.seen[key] = max(value, self.seen.get(key, 0))
            if header and header.get("ok"):
                self.net.at(self.net.time + 0.005, self.write_next)
            else:
                self.refresh(self.write_next)

        rid = self.request(owner.endpoint, p.GET, {"ns": self.ns, "pid": pid},
                           [serialize_key(key)], on_value, timeout=1.0)
        self.net.pending_reads[(self.ident, rid)] = key


def check_converged(net: SimNetwork) -> list[str]:
    """Problems with the end state: views that differ, partitions without a live owner."""
    problems = []
    alive = [n for n in net.alive() if not n.paused]
    views = {(n.cluster.members.version, n.cluster.table.stamp()) for n in alive}
    if len(views) != 1:
        problems.append(f"members disagree on the view: {views}")
    live = {n.info.uuid for n in alive}
    table = alive[0].cluster.table
    for pid in range(table.partition_count):
        if table.owner(pid) not in live:
            problems.append(f"partition {pid} has no live owner ({table.owner(pid)})")
    for node in alive:
        if node.store.loans or node.store.arriving_partitions():
            problems.append(f"{node.name} still lends {node.store.loans} or receives "
                            f"{node.store.arriving_partitions()} once quiet")
    return problems


def replicas_differing(net: SimNetwork) -> list[str]:
    """Replicas (synchronous and asynchronous) whose namespaces differ from their owner's."""
    by_uuid = {n.info.uuid: n for n in net.alive()}
    table = net.alive()[0].cluster.table
    problems = []
    for pid in range(table.partition_count):
        replicas = table.replicas(pid)
        owner = by_uuid.get(replicas[0])
        if owner is None:
            continue
        want = {ns: dict(owner.store.items(pid, ns)) for ns in owner.store.namespaces(pid)}
        for index, replica in enumerate(replicas[1:1 + net.config.total_backup_count], 1):
            node = by_uuid.get(replica) if replica else None
            if node is None:
                continue
            got = {ns: dict(node.store.items(pid, ns)) for ns in node.store.namespaces(pid)}
            if got != want:
                diff = {ns for ns in set(got) | set(want) if got.get(ns) != want.get(ns)}
                problems.append(f"partition {pid} replica {index} ({node.name}) differs from "
                                f"its owner in {sorted(diff)}")
    return problems


def lost_writes(net: SimNetwork, clients: list[SimClient]) -> list[str]:
    """Acknowledged writes that the partition's owner (or a backup) does not hold."""
    by_uuid = {n.info.uuid: n for n in net.alive()}
    table = net.alive()[0].cluster.table
    lost = []
    for client in clients:
        for key, value in client.acked.items():
            key_bytes = serialize_key(key)
            pid = partition_id_of(key_bytes, table.partition_count)
            for index, replica in enumerate(table.replicas(pid)):
                if replica is None or index > net.config.backup_count:
                    continue
                got = by_uuid[replica].store.get(pid, client.ns, key_bytes)
                allowed = {serialize_value(v) for v in client.unsure.get(key, ())}
                if got != serialize_value(value) and got not in allowed:
                    lost.append(f"{key}={value} on replica {index} of {pid}: {got!r}")
    return lost
