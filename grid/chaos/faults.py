"""The fault schedule of a chaos run: what happens when, from the seed alone.

``plan_faults`` is pure: the same seed, weights, interval and duration give the same list of
faults, each with the random draws it needs (which member, by rank among the candidates at
that moment; how long a pause lasts). The runner picks the member when the fault comes, from
the members alive then, so a run is reproducible as far as the cluster behaves the same.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULT_KINDS = ("kill", "pause", "master-kill", "stop-member", "add-member")
DESTRUCTIVE = frozenset({"kill", "pause", "master-kill", "stop-member"})


@dataclass(frozen=True)
class PlannedFault:
    at: float  # seconds after the run started
    kind: str
    pick: float  # in [0, 1): which candidate member, by rank
    pause_s: float  # for a pause: how long the member stays stopped


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
    removed and fenced."""
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
