"""Measure what per-fragment Merkle trees cost the record store: writes with trees vs without.

Run from the project root: ``python tools/bench_merkle.py [--keys N] [--partitions N]``.
One store never builds a tree, the other has the tree of every fragment built before the
timed writes (so each write also updates its tree); both do the same single-key puts and
put_many batches (one batch per partition). Also timed: building the trees from scratch.
Numbers are for comparing within one run on one machine, not thresholds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workers.record_store import RecordStore  # noqa: E402
from workers.shm import list_segments, remove_segments  # noqa: E402

repeat_count = 3  # best of, to damp noise from other processes
namespace = "bench"


def best_seconds(run: Callable[[], object], setup: Callable[[], object]) -> float:
    """Fastest of ``repeat_count`` runs; ``setup`` runs untimed before each."""
    best = float("inf")
    for _ in range(repeat_count):
        setup()
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def write_rates(store: RecordStore, by_pid: dict[int, list[bytes]], value: bytes,
                with_trees: bool) -> dict[str, float]:
    """ops/s of puts and put_many, new keys and same-size overwrites, on ``store`` whose
    fragments exist (and have trees built when ``with_trees``) before each timed run."""
    n = sum(len(keys) for keys in by_pid.values())
    value_other = bytes(reversed(value))
    batches = {pid: [(key, value) for key in keys] for pid, keys in by_pid.items()}

    def fill() -> None:
        for pid, pairs in batches.items():
            store.put_many(pid, namespace, pairs)
            if with_trees:
                store.tree(pid, namespace)

    def empty() -> None:
        """Fragments that exist (with their trees) but hold nothing: puts of new keys."""
        fill()
        for pid, keys in by_pid.items():
            for key in keys:
                store.remove(pid, namespace, key)

    def put(new_value: bytes) -> Callable[[], None]:
        def run() -> None:
            for pid, keys in by_pid.items():
                for key in keys:
                    store.put(pid, namespace, key, new_value)
        return run

    def put_many(new_value: bytes) -> Callable[[], None]:
        pairs_by_pid = {pid: [(key, new_value) for key in keys] for pid, keys in by_pid.items()}

        def run() -> None:
            for pid, pairs in pairs_by_pid.items():
                store.put_many(pid, namespace, pairs)
        return run

    rates = {
        "put (new keys)": n / best_seconds(put(value), empty),
        "put (overwrite, same size)": n / best_seconds(put(value_other), fill),
        "put_many (new keys)": n / best_seconds(put_many(value), empty),
        "put_many (overwrite, same size)": n / best_seconds(put_many(value_other), fill),
    }
    if with_trees:
        assert all(store._partitions[pid][namespace].tree is not None for pid in by_pid)
        store._check()  # the trees followed every write
    else:
        assert all(store._partitions[pid][namespace].tree is None for pid in by_pid)
    return rates


def build_rate(store: RecordStore, by_pid: dict[int, list[bytes]], value: bytes) -> float:
    """Entries/s of building every fragment's tree from scratch (fresh fragments each run)."""
    n = sum(len(keys) for keys in by_pid.values())

    def fill() -> None:
        for pid, keys in by_pid.items():
            store.drop_partition(pid)
            store.put_many(pid, namespace, [(key, value) for key in keys])

    def build() -> None:
        for pid in by_pid:
            store.tree(pid, namespace)

    return n / best_seconds(build, fill)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=271)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--depth", type=int, default=10, help="merkle_depth of the stores")
    arguments = parser.parse_args()
    keys = [b"key-%012d" % i for i in range(arguments.keys)]
    by_pid: dict[int, list[bytes]] = {}
    for i, key in enumerate(keys):
        by_pid.setdefault(i % arguments.partitions, []).append(key)
    value = os.urandom(arguments.value_bytes)
    run_id = uuid.uuid4().hex[:8]
    prefixes = [f"shmgrid-bench{run_id}-{member}" for member in range(3)]  # one per store
    print(f"{arguments.keys} keys of {len(keys[0])} bytes over {len(by_pid)} partitions,"
          f" values of {arguments.value_bytes} bytes, depth {arguments.depth},"
          f" best of {repeat_count}")
    try:
        plain = RecordStore(prefixes[0], merkle_depth=arguments.depth)
        treed = RecordStore(prefixes[1], merkle_depth=arguments.depth)
        try:
            without = write_rates(plain, by_pid, value, with_trees=False)
            plain.close()
            with_trees = write_rates(treed, by_pid, value, with_trees=True)
            treed.close()
            builder = RecordStore(prefixes[2], merkle_depth=arguments.depth)
            try:
                build_many = build_rate(builder, by_pid, value)
                build_one = build_rate(builder, {0: keys}, value)
            finally:
                builder.close()
        finally:
            plain.close()
            treed.close()
    finally:
        leaked = [name for prefix in prefixes for name in remove_segments(prefix)]
    print(f"  {'':34s} {'no trees':>15s} {'trees built':>15s} {'ratio':>7s}")
    for name, rate in without.items():
        print(f"  {name:34s} {rate:10,.0f} op/s {with_trees[name]:10,.0f} op/s"
              f" {with_trees[name] / rate:7.2f}")
    print(f"  {'build the trees, ' + str(len(by_pid)) + ' fragments':34s}"
          f" {build_many:10,.0f} entries/s ({arguments.keys / build_many * 1e3:.0f} ms)")
    print(f"  {'build the tree, 1 fragment':34s}"
          f" {build_one:10,.0f} entries/s ({arguments.keys / build_one * 1e3:.0f} ms)")
    if leaked or any(list_segments(prefix) for prefix in prefixes):
        print(f"LEAKED segments: {leaked}")
        sys.exit(1)


if __name__ == "__main__":
    main()
