"""A chaos run's client process: random map operations through the public API, each
recorded as it was invoked and how it ended (grid/chaos/history.py ``Op``).

Values are unique per run: worker ``w``'s ``n``-th write carries ``w * 10**9 + n`` in its first
8 bytes, padded to the value size, so the checker knows which write a read saw. A put_all is
recorded as one put per key (its results are not observed), a get_all as one get per key.
An operation ends "ok", "fail" (refused: it did not happen) or "info" (no answer in time: it
may have happened).
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

WRITE_BASE = 10**9
MAP_NAME = "chaos"
OPS = ("get", "put", "put_if_absent", "replace", "remove", "put_all", "get_all")
BATCH_OPS = ("put_all", "get_all")  # on 2 to 10 keys
READS = ("get", "get_all")


def encode(value: int, size: int) -> bytes:
    return value.to_bytes(8, "big") + b"." * max(0, size - 8)


def decode(raw: Any) -> int | None:
    if raw is None:
        return None
    if not isinstance(raw, bytes | bytearray) or len(raw) < 8:
        raise ValueError(f"a value this run never writes: {raw!r}")
    return int.from_bytes(raw[:8], "big")


def outcome(exc: BaseException) -> str:
    """How an operation that raised ended: indeterminate unless the error says it was
    refused before anything happened."""
    from grid import errors

    refused = (errors.ClusterStateError, errors.ValueTooLargeError, errors.NotAuthorizedError,
               errors.KeyNotSerializableError, errors.ValueNotSerializableError,
               errors.MemberIsLiteError)
    return "fail" if isinstance(exc, refused) else "info"


def run_worker(cluster_name: str, worker: int, seed: int, keys: int, value_size: int,
               mix: dict[str, int], stop_at: float, out_path: str,
               invocation_timeout: float, counters: Any = None,
               local_reads: bool = False) -> None:
    """Run operations until ``stop_at`` (time.monotonic, the same clock in every process),
    appending each to ``out_path`` as a JSON line. ``counters``: a shared array of three
    ints per worker (ok, fail, info) for the live view. With ``local_reads``, gets read the
    owners' shared memory where they can, and a get's line says whether it did."""
    import grid

    rng = random.Random(seed * 1000 + worker)
    names = [f for f in OPS if mix.get(f)]
    weights = [mix[f] for f in names]
    written = 0
    with open(out_path, "a", buffering=1 << 16) as out, \
            grid.connect(cluster_name=cluster_name, invocation_timeout=invocation_timeout,
                         local_reads=local_reads) as client:
        m = client.get_map(MAP_NAME)
        reader = m._local  # counts the gets answered from shared memory
        counter = 0
        while time.monotonic() < stop_at:
            f = rng.choices(names, weights)[0]
            batch = rng.sample(range(keys), rng.randint(2, 10)) if f in BATCH_OPS else \
                [rng.randrange(keys)]
            values = []
            for _ in batch:
                written += 1
                values.append(worker * WRITE_BASE + written)
            result, status = None, "ok"
            results = None  # a get_all's: key -> value
            hits = reader.hits if reader is not None else 0
            invoke = time.monotonic()
            try:
                if f == "get_all":
                    found = m.get_all([f"k{k}" for k in batch])
                    results = {k: decode(found.get(f"k{k}")) for k in batch}
                elif f == "put_all":
                    m.put_all({f"k{k}": encode(v, value_size) for k, v in zip(batch, values,
                                                                             strict=True)})
                elif f == "get":
                    result = decode(m.get(f"k{batch[0]}"))
                elif f == "remove":
                    result = decode(m.remove(f"k{batch[0]}"))
                else:
                    call = getattr(m, f)
                    result = decode(call(f"k{batch[0]}", encode(values[0], value_size)))
            except Exception as exc:  # recorded, never raised: the history says what happened
                status = outcome(exc)
                if f in READS:
                    status = "fail"  # a read that did not answer changed nothing
            complete = time.monotonic()
            # (a get_all that read some of its keys locally marks all of them so)
            local = f in READS and reader is not None and reader.hits > hits
            for k, v in zip(batch, values, strict=True):
                counter += 1
                out.write(json.dumps({
                    "index": worker * WRITE_BASE * 10 + counter, "process": worker,
                    "f": {"put_all": "put", "get_all": "get"}.get(f, f), "key": f"k{k}",
                    "value": None if f in ("get", "get_all", "remove") else v,
                    "result": results[k] if results is not None else result,
                    "status": status, "invoke": invoke,
                    "complete": complete, "observed": f != "put_all",
                    **({"local": True} if local else {})}) + "\n")
            if counters is not None:
                slot = 3 * worker + ("ok", "fail", "info").index(status)
                counters[slot] += 1
