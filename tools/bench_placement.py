"""How long a client takes to serialize and place a batch of keys, by the three ways the code
has: key by key (``serialize_key`` and ``partition_id_of``, as ``put`` does), the batch of
serialized keys (packed in one pass, then ``partition_ids_of``: its tags found in the bytes,
a Python call per tagged key; get_all's way until it had ``place_keys``), and
``place_keys`` (tags found in the str, one hash for a batch that begins with one tag).

    python tools/bench_placement.py
    python tools/bench_placement.py --batch 1000 --seconds 2

Each row is a kind of batch; the times are µs a batch (the best of five runs), and the
ratio is partition_ids_of / place_keys (get_all's placement before and after).
"""

from __future__ import annotations

import argparse
import timeit

import msgpack

from grid.serialization import partition_id_of, partition_ids_of, place_keys, serialize_key

PARTITIONS = 271


def batches(size: int) -> dict[str, list[str]]:
    return {
        "no hash tag": [f"key-{i}" for i in range(size)],
        "one hash tag, at the start": [f"{{user-7}}:key-{i}" for i in range(size)],
        "one hash tag, inside": [f"key-{i}:{{user-7}}" for i in range(size)],
        "a hash tag each": [f"{{user-{i}}}:cart" for i in range(size)],
    }


def key_by_key(keys: list[str]) -> list[int]:
    return [partition_id_of(serialize_key(key), PARTITIONS) for key in keys]


def serialized_batch(keys: list[str]) -> list[int]:
    return partition_ids_of(list(map(msgpack.Packer().pack, keys)), PARTITIONS)


def best_us(function, keys: list[str], seconds: float) -> float:
    number = max(1, int(seconds / 5 / max(1e-6, timeit.timeit(lambda: function(keys),
                                                                number=1))))
    return min(timeit.repeat(lambda: function(keys), number=number, repeat=5)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100, help="keys a batch (default 100)")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="time for each way and batch (default 1)")
    args = parser.parse_args()
    print(f"{'batch of ' + str(args.batch):<28}{'key by key':>12}{'partition_ids_of':>18}"
          f"{'place_keys':>12}{'ratio':>8}   (µs a batch)")
    for name, keys in batches(args.batch).items():
        assert place_keys(keys, PARTITIONS)[1] == key_by_key(keys) == serialized_batch(keys)
        one, batch, placed = (best_us(f, keys, args.seconds) for f in (
            key_by_key, serialized_batch, lambda ks: place_keys(ks, PARTITIONS)))
        print(f"{name:<28}{one:>12.1f}{batch:>18.1f}{placed:>12.1f}{batch / placed:>7.1f}x")


if __name__ == "__main__":
    main()
