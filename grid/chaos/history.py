"""The history of a chaos run: every map operation a client performed, as the client saw it,
and the register model the checker holds each key to.

An operation ends "ok" (it happened, and ``result`` is what the grid returned), "fail" (it
definitely did not happen) or "info" (indeterminate, e.g. a timeout: it may have taken effect
at any time after ``invoke``, even after the client gave up at ``complete``, or never).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

FUNCTIONS = ("get", "put", "put_if_absent", "replace", "remove")
STATUSES = ("ok", "fail", "info")


@dataclass(frozen=True, slots=True)
class Op:
    """One operation on one key. ``result``: for get the value read, for the others the
    previous value a map returns (None: absent). ``observed`` False (a put_all, recorded as
    one put per key) means the result was not seen: only the effect is checked."""

    index: int  # unique, in the order of invocation
    process: int  # the client worker that ran it
    f: str
    key: str
    value: int | None  # the argument; None for get and remove
    result: int | None
    status: str
    invoke: float  # monotonic seconds
    complete: float  # for "info": when the client gave up, not when it took effect
    observed: bool = True
    local: bool = False  # a get answered from the owner's shared memory (--local-reads)

    def __post_init__(self) -> None:
        if self.f not in FUNCTIONS:
            raise ValueError(f"op {self.index}: unknown function {self.f!r}")
        if self.status not in STATUSES:
            raise ValueError(f"op {self.index}: unknown status {self.status!r}")
        if self.complete < self.invoke:
            raise ValueError(f"op {self.index}: completes before it is invoked")

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in _FIELDS}

    def __str__(self) -> str:
        arg = "" if self.value is None else f", {self.value}"
        result = self.result if self.observed and self.status == "ok" else "?"
        return (f"#{self.index} p{self.process} {self.f}({self.key}{arg}) -> {result} "
                f"{self.status} [{self.invoke:.3f}, {self.complete:.3f}]")


_FIELDS = tuple(Op.__dataclass_fields__)


def apply(f: str, value: int | None, state: int | None) -> tuple[int | None, int | None]:
    """The register model: what ``f(value)`` returns on a key holding ``state`` (None:
    absent), and the key's state afterwards."""
    if f == "get":
        return state, state
    if f == "put":
        return state, value
    if f == "put_if_absent":
        return (None, value) if state is None else (state, state)
    if f == "replace":
        return (None, None) if state is None else (state, value)
    if f == "remove":
        return state, None
    raise ValueError(f"unknown function {f!r}")


def write_jsonl(path: str | Path, ops: Iterable[Op]) -> None:
    """One JSON object per line; floats are written exactly (``read_jsonl`` round-trips)."""
    with open(path, "w") as out:
        for op in ops:
            out.write(json.dumps(op.to_dict()) + "\n")


def read_jsonl(path: str | Path) -> list[Op]:
    with open(path) as f:
        return [Op(**json.loads(line)) for line in f if line.strip()]
