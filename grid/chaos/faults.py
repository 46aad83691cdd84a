"""The faults of a chaos run: the schedule, from the seed alone, and the record of each
fault as it was injected.

``plan_faults`` is pure: the same seed, weights, interval and duration give the same list of
faults, each with the random draws it needs (which member, by rank among the candidates at
that moment, or which cluster state; how long a pause or a state lasts). The runner picks the
member when the fault comes, from the members alive then, so a run is reproducible as far as
the cluster behaves the same.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

FAULT_KINDS = ("kill", "pause", "master-kill", "stop-member", "add-member", "state-change")
DESTRUCTIVE = frozenset({"kill", "pause", "master-kill", "stop-member"})
# What a state-change fault holds for a while before it goes back to ACTIVE.
HELD_STATES = ("NO_MIGRATION", "FROZEN", "PASSIVE", "STABLE_CLUSTER")


@dataclass(frozen=True)
class PlannedFault:
    at: float  # seconds after the run started
    kind: str
    pick: float  # in [0, 1): which candidate member, by rank, or which of HELD_STATES
    pause_s: float  # how long a paused member stays stopped, or a state is held


@dataclass
class FaultRecord:
    """A fault as it was injected: ``start`` and ``end`` in seconds after the run started."""

    kind: str
    member: str | None
    start: float
    end: float
    within_promise: bool
    note: str = ""
    # Partitions the member held a replica of when it was hit: writes to them wait for
    # the promotion (owner) or the removal (backup). Empty: every partition (an added
    # member, a cluster state).
    affected: list[int] = field(default_factory=list)
    write_stall: float = 0.0  # grid/chaos/analysis.py write_stalls

    @property
    def skipped(self) -> bool:
        return self.note.startswith("skipped")


def parse_weights(text: str, known: tuple[str, ...], what: str) -> dict[str, int]:
    """``"a=1,b=2"`` as {a: 1, b: 2}; ValueError naming the bad part."""
    weights: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, number = part.partition("=")
        if not sep or name not in known:
            raise ValueError(f"{what}: {part!r} is not NAME=WEIGHT with NAME one of "
                             f"{', '.join(known)}")
        try:
            weights[name] = int(number)
        except ValueError:
            raise ValueError(f"{what}: the weight of {name} is not an integer") from None
        if weights[name] < 0:
            raise ValueError(f"{what}: the weight of {name} is negative")
    if weights and not any(weights.values()):
        raise ValueError(f"{what}: every weight is 0")
    return weights


def parse_seconds(text: str) -> float:
    """``"60"``, ``"60s"``, ``"2m"`` as seconds."""
    text = text.strip().lower()
    scale = 60.0 if text.endswith("m") else 1.0
    number = float(text.rstrip("sm"))
    if number <= 0:
        raise ValueError(f"a duration must be positive, not {text!r}")
    return number * scale


def plan_faults(seed: int, weights: dict[str, int], interval: float, duration: float,
                heartbeat_timeout: float) -> list[PlannedFault]:
    """One fault every ``interval`` seconds (the first after one interval, none in the last
    interval, so that the cluster settles before the end). A pause lasts a random time on
    either side of the heartbeat timeout: shorter, the member is only slow; longer, it is
    removed and fenced. A state change holds its state as long."""
    rng = random.Random(seed)
    kinds = [k for k in FAULT_KINDS if weights.get(k)]
    if not kinds:
        return []
    faults, at = [], interval
    while at < duration - interval:
        kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
        faults.append(PlannedFault(at, kind, rng.random(),
                                   rng.uniform(0.3, 1.7) * heartbeat_timeout))
        at += interval
    return faults
