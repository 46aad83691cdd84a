"""How long a process polls for its next message without sleeping: a client per kind of
request, a member for the next round of messages.

A process that sleeps in ``poll`` must be woken when its message comes. On this project's small
virtual machines that wake-up costs more than the reply itself: a bare round trip on a link
takes about 59 µs when both ends sleep, 20 µs when the waiting end polls without sleeping
(and the sender's CPU per message falls from 29 to 8 µs, since it has no sleeper to wake;
``tools/bench_transport.py``). So a process that expects its message soon spins on a
non-blocking poll for a while before it sleeps.

Spinning costs a core, and on a host whose cores the others need, a spin that outlasts the
wait only slows them down. So the budget follows what waits of the same kind took lately: a
kind whose waits come within ``limit`` on average spins for twice its mean wait, up to
``limit``; a slower kind (a put_all of a hundred keys, a scan; a member that hears from
anyone only now and then) does not spin at all. A new kind spins for the whole limit once,
and learns. One slow outlier must not turn spinning off for long, so each sample counts at
most twice the limit.

A client's kinds are its requests' ops, its waits the time from a request to its whole reply.
A client spins only while the members still working on its requests are fewer than the cores
it may run on: each of them and the client then has a core. A batch sent to every member of
three on two cores leaves none to spare, and a client spinning through its wait takes one
from the members it waits for; it sleeps until one member is left to answer, and spins for
that one (a spread get_all of 100 keys 1.12x, alternately against spinning through the whole
wait; a put, a get or a batch of one hash tag waits on one member and spins as before).
A member has one kind: the time from the start of one round of messages to the next
(workers/member.py), which under a client's steady load is a few hundred microseconds (the
member is the owner of one request, the backup of another, and hears the acknowledgements),
and with only heartbeats about a second. It spins the whole limit while that kind earns any
spin: its gaps are a round's own messages, microseconds apart, and the next request's,
hundreds, and twice their mean would stop short of the latter.

``BusyPoll`` is pure: the caller measures the waits and owns the clock.
"""

from __future__ import annotations

import os

# Weight of the newest wait in a kind's running mean (an exponentially weighted mean).
WEIGHT = 0.125


class BusyPoll:
    """Per kind of wait, the running mean of its waits and the spin it earns."""

    __slots__ = ("limit", "means")

    def __init__(self, limit_s: float) -> None:
        self.limit = max(0.0, limit_s)
        self.means: dict[str, float] = {}

    def budget(self, kind: str) -> float:
        """Seconds to poll without sleeping for the end of a wait of ``kind``."""
        mean = self.means.get(kind)
        if mean is None:
            return self.limit
        if mean > self.limit:
            return 0.0
        return min(self.limit, 2 * mean)

    def record(self, kind: str, waited_s: float) -> None:
        """A wait of ``kind`` (a request's for its whole reply) took ``waited_s``."""
        if not self.limit:
            return
        sample = min(waited_s, 2 * self.limit)
        mean = self.means.get(kind)
        self.means[kind] = sample if mean is None else mean + WEIGHT * (sample - mean)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the platform has one."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1
