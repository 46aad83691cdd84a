"""Local reads on a real cluster: gets answered from the owners' shared memory stay
linearizable while partitions migrate, owners are killed, and a hung owner is removed with
nobody left to fence it.

One writer thread sets per-key counters; reader threads get the same keys with local reads on.
Each read must return a value between the last one acknowledged before the read began and the
last one whose write had begun when the read ended (a stale or invented value fails)."""

from __future__ import annotations

import os
import random
import signal
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from grid.client.registry import pid_alive
from grid.serialization import partition_id_of, serialize_key, serialize_value
from tests.integration.test_failover import _wait
from tests.integration.test_migrations import _kill, _wait_safe

pytestmark = pytest.mark.timeout(180)

KEYS = 60


class CounterRace:
    """A writer of per-key counters, and readers (gets, and whole-map scans) that check
    every value against them."""

    def __init__(self, cluster, readers: int = 2, invocation_timeout: float = 60) -> None:
        self.cluster = cluster
        self.invocation_timeout = invocation_timeout
        self.started = [0] * KEYS  # the newest value whose set has begun, per key
        self.acked = [0] * KEYS  # the newest value whose set returned, per key
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.reads = 0
        self.maps: list = []
        self.threads = [threading.Thread(target=self._write, daemon=True),
                        threading.Thread(target=self._reading, args=(-1, self._scan_once),
                                         daemon=True)] + [
            threading.Thread(target=self._reading, args=(n, self._get_once), daemon=True)
            for n in range(readers)]

    def _write(self) -> None:
        try:
            with self.cluster.connect(invocation_timeout=self.invocation_timeout) as client:
                m = client.get_map("counters")
                value = 0
                while not self.stop.is_set():
                    value += 1
                    key = value % KEYS
                    self.started[key] = value
                    m.set(f"c{key}", value)
                    self.acked[key] = value
        except BaseException as exc:
            self.failures.append(exc)

    def _reading(self, seed: int, check: Callable[[Any, random.Random], None]) -> None:
        """Connect with local reads on and run ``check(map, rng)`` until stopped."""
        rng = random.Random(seed)
        try:
            with self.cluster.connect(invocation_timeout=self.invocation_timeout,
                                      local_reads=True) as client:
                m = client.get_map("counters")
                self.maps.append(m)
                while not self.stop.is_set():
                    check(m, rng)
                    self.reads += 1
        except BaseException as exc:
            self.failures.append(exc)

    def _get_once(self, m: Any, rng: random.Random) -> None:
        key = rng.randrange(KEYS)
        low = self.acked[key]
        hits = m._local.hits
        value = m.get(f"c{key}") or 0
        high = self.started[key]
        assert low <= value <= high, \
            f"key c{key}: read {value}, acknowledged {low}, last begun {high} " \
            f"({'from shared memory' if m._local.hits > hits else 'asked of the owner'})"

    def _scan_once(self, m: Any, rng: random.Random) -> None:
        """A whole-map scan: each key's value lies between its acknowledged value when the
        scan began and its begun one when it ended."""
        low = list(self.acked)
        found = dict(m.items())
        high = list(self.started)
        for key in range(KEYS):
            value = found.get(f"c{key}", 0)
            assert low[key] <= value <= high[key], \
                f"scan: key c{key}: read {value}, acknowledged {low[key]}, last begun " \
                f"{high[key]}"

    def local_hits(self) -> int:
        return sum(m._local.hits for m in self.maps)

    def wait_reads(self, count: int, timeout: float = 60) -> None:
        target = self.reads + count
        _wait(lambda: self.reads >= target or bool(self.failures), timeout,
              f"{count} more reads")
        assert not self.failures, self.failures

    def wait_local_hits(self, count: int, timeout: float = 30) -> None:
        target = self.local_hits() + count
        _wait(lambda: self.local_hits() >= target or bool(self.failures), timeout,
              f"{count} more local reads")
        assert not self.failures, self.failures

    def __enter__(self) -> CounterRace:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=self.invocation_timeout + 10)
        assert not self.failures, self.failures


def test_local_reads_answer_from_shared_memory_and_see_every_write(cluster_factory):
    cluster = cluster_factory(members=3)
    with cluster.connect() as writer, cluster.connect(local_reads=True) as reader:
        source, local = writer.get_map("m"), reader.get_map("m")
        plain = reader.get_map("m", local_reads=False)
        assert local.local_reads and not plain.local_reads
        source.put_all({f"k{i}": {"i": i} for i in range(500)})

        def sweep() -> int:
            """Read every key; how many were read from memory."""
            hits = local._local.hits
            assert [local.get(f"k{i}") for i in range(500)] == [{"i": i} for i in range(500)]
            return local._local.hits - hits

        # The first get of a map from each owner asks it to publish the map, and a member
        # serves local reads once it holds its membership lease (within a heartbeat).
        _wait(lambda: sweep() == 500, what="every owner to publish the map")
        hits = local._local.hits
        assert local.get_all([f"k{i}" for i in range(500)] + ["absent"]) == \
            {f"k{i}": {"i": i} for i in range(500)}
        assert local._local.hits - hits == 501
        hits = local._local.hits
        assert dict(local.items()) == {f"k{i}": {"i": i} for i in range(500)}
        assert local._local.hits - hits == reader.partition_count  # scanned from memory
        # A partition larger than the scan's chunk is left to its owner, which sends it in
        # chunks: a local scan never copies more than a chunk of it.
        sizes: dict[int, int] = {}
        for i in range(500):
            key_bytes = serialize_key(f"k{i}")
            pid = partition_id_of(key_bytes, reader.partition_count)
            sizes[pid] = sizes.get(pid, 0) + len(key_bytes) + len(serialize_value({"i": i}))
        limit = sorted(sizes.values())[len(sizes) // 2]
        larger = sum(size > limit for size in sizes.values())
        hits, misses, oversized = local._local.hits, local._local.misses, local._local.oversized
        scanned = {}
        for keys, values in local.scan_partitions(range(reader.partition_count),
                                                  chunk_bytes=limit):
            scanned.update(zip(keys, values, strict=True))
        assert scanned == {f"k{i}": {"i": i} for i in range(500)}
        hits, misses = local._local.hits - hits, local._local.misses - misses
        oversized = local._local.oversized - oversized
        assert hits + misses == reader.partition_count
        # A partition may also be left to its owner when its read does not settle in time on
        # a loaded machine (seqlock retries, the owner's lease): a miss, not an oversized one,
        # whether it is larger than the limit or not (seen in CI: 95 misses for 94 oversized
        # partitions; and 93 oversized of 94 larger ones). At most two such misses here.
        assert 0 < oversized <= larger <= misses <= oversized + 2
        source.put("k1", "new")
        source.remove("k2")
        assert local.get("k1") == "new" and local.get("k2") is None
        assert local.get("absent") is None
        source.clear()
        assert [local.get(f"k{i}") for i in range(0, 500, 50)] == [None] * 10


def test_a_bulk_load_into_a_published_map_is_read_locally_once_it_is_over(cluster_factory):
    """A packed write (the Spark writer's record blocks) into a map published for local
    reads leaves its owners' shared indexes behind until the load is over
    (workers/local_reads.py, ``SharedFragment``): meanwhile a local get is answered by the
    owner, right, and a tick or two after the last call every key is read from memory."""
    cluster = cluster_factory(members=3)
    with cluster.connect() as writer, cluster.connect(local_reads=True) as reader:
        source, local = writer.get_map("m"), reader.get_map("m")
        source.put_all({f"seed{i}": i for i in range(50)})
        _wait(lambda: _local_hits(local, [f"seed{i}" for i in range(50)]) == 50,
              what="every owner to publish the map")
        expected = {f"k{i}": i for i in range(3000)}
        keys = list(expected)
        for first in range(0, 3000, 1000):  # a load of three calls, as the writer's come
            source.put_all_packed(_pieces({key: expected[key] for key in keys[first:first + 1000]},
                                          writer.partition_count), None)
        assert local.get_all(list(expected)) == expected  # whoever answers, right
        _wait(lambda: _local_hits(local, list(expected)) == len(expected),
              what="the loads to be over and every key read from memory")
        assert dict(local.items()) == {**expected, **{f"seed{i}": i for i in range(50)}}


def _pieces(entries: dict[str, Any], partition_count: int) -> dict[int, tuple[int, list, list]]:
    """``entries`` laid out as record blocks a partition (workers/record_block.py)."""
    pieces: dict[int, tuple[int, list, list]] = {}
    for key, value in entries.items():
        key_bytes, value_bytes = serialize_key(key), serialize_value(value)
        sizes = struct.pack("<II", len(key_bytes), len(value_bytes))
        pid = partition_id_of(key_bytes, partition_count)
        count, table, records = pieces.get(pid, (0, [], []))
        table.append(sizes)
        records.append(sizes + key_bytes + value_bytes)
        pieces[pid] = (count + 1, table, records)
    return pieces


def _local_hits(local: Any, keys: list[str]) -> int:
    """How many of ``keys`` one get_all read from memory (all must be right)."""
    hits = local._local.hits
    found = local.get_all(keys)
    assert len(found) == len(keys), sorted(set(keys) - set(found))[:5]
    return local._local.hits - hits


def test_local_reads_stay_linearizable_while_an_added_member_takes_its_share(cluster_factory):
    cluster = cluster_factory(members=3)
    with CounterRace(cluster) as race:
        race.wait_local_hits(2000)
        cluster.cli("add-member")
        _wait_safe(cluster)
        race.wait_reads(2000)
        race.wait_local_hits(2000)  # the new owners publish too


def test_local_reads_stay_linearizable_when_an_owner_is_killed(cluster_factory):
    cluster = cluster_factory(members=3)
    with CounterRace(cluster) as race:
        race.wait_local_hits(2000)
        _kill(cluster, "member-1")
        race.wait_reads(2000)
        _wait_safe(cluster)
        race.wait_local_hits(2000)


def test_a_hung_owner_nobody_fences_is_not_read_past_its_lease(cluster_factory):
    """The supervisor is dead, so a hung member's memory stays, unfenced. The master removes
    it after the heartbeat timeout and its backups take its partitions and new writes; local
    readers must have stopped trusting it by then (its membership lease ran out)."""
    cluster = cluster_factory(members=3, heartbeat_interval=0.2, heartbeat_timeout=2)
    os.kill(cluster.registry["supervisor"]["pid"], signal.SIGKILL)
    victim = cluster.member("member-2")
    with CounterRace(cluster) as race:
        race.wait_local_hits(2000)
        os.kill(victim["pid"], signal.SIGSTOP)
        try:
            with cluster.connect() as client:
                _wait(lambda: len(client.cluster.members) == 2,
                      what="the hung member's removal")
            race.wait_reads(3000)  # its keys' new values come from the new owners
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
        _wait(lambda: not pid_alive(victim["pid"]), what="the returned member to stop itself")
        time.sleep(0.2)
        race.wait_reads(1000)
