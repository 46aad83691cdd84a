"""Child process of the crash test: writes a seeded history with fsync="always" from several
threads, with compaction running hard, and prints each sequence number once it is durable.

Run as `python -m tests.persistence.crash_child SEED FOLDER`; the parent SIGKILLs it.
"""

from __future__ import annotations

import random
import sys
import threading

from persistence import LogStore, make_prefix

thread_count = 4
op_count = 40_000


def history(seed: int) -> list[tuple]:
    """The operations the child runs, in order: op i gets sequence i + 1."""
    rng = random.Random(seed)
    prefixes = [make_prefix(1, partition) for partition in range(3)]
    ops: list[tuple] = []
    for _index in range(op_count):
        roll = rng.random()
        prefix = rng.choice(prefixes)
        key = b"key-%d" % rng.randrange(60)
        if roll < 0.75:
            value = rng.randbytes(rng.choice([0, 10, 100, 1000, 4000]))
            ops.append(("put", prefix, key, value))
        elif roll < 0.98:
            ops.append(("remove", prefix, key))
        else:
            ops.append(("clear_prefix", prefix))
    return ops


def main() -> None:
    seed, folder = int(sys.argv[1]), sys.argv[2]
    ops = history(seed)
    store = LogStore(folder, fsync="always", segment_bytes=16 << 10, compaction_interval=0.005,
                     compaction_garbage_ratio=0.3)
    issue_lock = threading.Lock()
    print_lock = threading.Lock()
    next_op = [0]

    def worker() -> None:
        for _attempt in range(op_count):
            with issue_lock:
                index = next_op[0]
                if index >= len(ops):
                    return
                next_op[0] += 1
                op = ops[index]
                seq = getattr(store, op[0])(*op[1:])
            if seq != index + 1:
                raise AssertionError(f"op {index} got seq {seq}")
            store.wait_durable(seq)
            with print_lock:
                sys.stdout.write(f"{seq}\n")
                sys.stdout.flush()

    print("ready", flush=True)
    threads = [threading.Thread(target=worker) for _ in range(thread_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
