"""Measure the member's shared-memory record store in-process: ops/s per operation.

Run from the project root: ``python tools/bench_record_store.py [--keys N] [--value-bytes N]``.
Prints one line per measurement; numbers are for comparing variants within one run and one
machine, not thresholds. A plain dict doing the same work is printed as a reference ceiling.
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
batch_size = 1000  # pairs per put_many / keys per get_many call
pid = 7
namespace = "bench"


def best_rate(
    operation_count: int, run: Callable[[], object], setup: Callable[[], object]
) -> float:
    """Best ops/s over ``repeat_count`` runs; ``setup`` runs untimed before each."""
    seconds_best = float("inf")
    for _ in range(repeat_count):
        setup()
        started = time.perf_counter()
        run()
        seconds_best = min(seconds_best, time.perf_counter() - started)
    return operation_count / seconds_best


def bench_store(keys: list[bytes], value: bytes, prefix: str) -> dict[str, float]:
    """ops/s of each store operation over ``keys``."""
    store = RecordStore(prefix)
    batches = [keys[i : i + batch_size] for i in range(0, len(keys), batch_size)]
    pair_batches = [[(key, value) for key in batch] for batch in batches]
    n = len(keys)
    rates: dict[str, float] = {}
    try:

        def fill() -> None:
            store.drop_partition(pid)
            for key in keys:
                store.put(pid, namespace, key, value)

        def put_new() -> None:
            for key in keys:
                store.put(pid, namespace, key, value)

        rates["put (new keys)"] = best_rate(n, put_new, lambda: store.drop_partition(pid))
        rates["put (overwrite, same size)"] = best_rate(n, put_new, fill)
        # As a member applies a batch (put_all, a Spark write): flat key, value, key, ...
        groups = [(pid, [item for key in batch for item in (key, value)]) for batch in batches]

        def put_groups() -> None:
            store.put_groups(namespace, groups)

        rates["put_groups (new keys)"] = best_rate(n, put_groups,
                                                   lambda: store.drop_partition(pid))
        rates["put_groups (overwrite, same size)"] = best_rate(n, put_groups, fill)
        value_other = value + b"x"

        def put_grow() -> None:
            for key in keys:
                store.put(pid, namespace, key, value_other)

        rates["put (overwrite, new size)"] = best_rate(n, put_grow, fill)

        def get_all() -> None:
            get = store.get
            for key in keys:
                get(pid, namespace, key)

        rates["get (hit)"] = best_rate(n, get_all, fill)
        misses = [b"miss-" + key for key in keys]

        def get_misses() -> None:
            get = store.get
            for key in misses:
                get(pid, namespace, key)

        rates["get (miss)"] = best_rate(n, get_misses, lambda: None)

        def put_many_all() -> None:
            for pairs in pair_batches:
                store.put_many(pid, namespace, pairs)

        rates[f"put_many (batches of {batch_size})"] = best_rate(
            n, put_many_all, lambda: store.drop_partition(pid)
        )
        rates[f"put_many (batches of {batch_size}, overwrite)"] = best_rate(
            n, put_many_all, fill
        )

        def get_many_all() -> None:
            for batch in batches:
                store.get_many(pid, namespace, batch)

        rates[f"get_many (batches of {batch_size})"] = best_rate(n, get_many_all, fill)

        def iterate() -> None:
            for _ in store.items(pid, namespace):
                pass

        rates["items() iteration"] = best_rate(n, iterate, lambda: None)

        def scan_whole() -> None:
            store.concatenated(pid, namespace)

        rates["scan: concatenated (one reply)"] = best_rate(n, scan_whole, lambda: None)

        def scan_chunks() -> None:
            low: int | None = 0
            while low is not None:
                low = store.concatenated_from(pid, namespace, low, 4 << 20)[2]

        rates["scan: 4 MiB hash-range chunks"] = best_rate(n, scan_chunks, lambda: None)

        def remove_all() -> None:
            for key in keys:
                store.remove(pid, namespace, key)

        rates["remove"] = best_rate(n, remove_all, fill)
        fill()
        peer = RecordStore(peer_prefix(prefix))
        try:

            def transfer() -> None:
                """A migration's copy: lend the fragment, the peer takes it in chunks."""
                loan = store.lend(pid, namespace)
                for chunk in loan.chunks(4 << 20):
                    peer.receive(pid, chunk)
                loan.release()

            rates["lend + receive (a migration's copy)"] = best_rate(
                n, transfer, lambda: peer.drop_partition(pid))
        finally:
            peer.close()
        rates["shm MiB for the keys"] = store.shm_bytes() / (1 << 20)
    finally:
        store.close()
    return rates


def peer_prefix(prefix: str) -> str:
    return prefix[:-1] + "1"


def bench_dict(keys: list[bytes], value: bytes) -> dict[str, float]:
    """The same puts and gets on a plain dict: the ceiling for any Python-level store."""
    table: dict[bytes, bytes] = {}

    def put_new() -> None:
        for key in keys:
            table[key] = value

    def get_all() -> None:
        get = table.get
        for key in keys:
            get(key)

    return {
        "put (new keys)": best_rate(len(keys), put_new, table.clear),
        "get (hit)": best_rate(len(keys), get_all, lambda: None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    arguments = parser.parse_args()
    keys = [b"key-%012d" % i for i in range(arguments.keys)]
    value = os.urandom(arguments.value_bytes)
    prefix = f"shmgrid-bench{uuid.uuid4().hex[:8]}-0"
    print(
        f"{arguments.keys} keys of {len(keys[0])} bytes, values of {arguments.value_bytes}"
        f" bytes, best of {repeat_count}"
    )
    try:
        store_rates = bench_store(keys, value, prefix)
    finally:
        leaked = remove_segments(prefix) + remove_segments(peer_prefix(prefix))
    dict_rates = bench_dict(keys, value)
    for name, rate in store_rates.items():
        if name.startswith("shm MiB"):
            print(f"  {name:36s} {rate:12.1f}")
            continue
        reference = dict_rates.get(name)
        ratio = f"  (dict: {reference:12,.0f} ops/s, x{rate / reference:.2f})" if reference else ""
        print(f"  {name:36s} {rate:12,.0f} ops/s{ratio}")
        if name.startswith("lend"):
            record_bytes = 8 + len(keys[0]) + len(value)
            print(f"  {'':36s} {rate * record_bytes / 1e6:12,.0f} MB/s")
    if leaked or list_segments(prefix):
        print(f"LEAKED segments: {leaked}")
        sys.exit(1)


if __name__ == "__main__":
    main()
