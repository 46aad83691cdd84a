"""How long a client polls for a reply without sleeping, per kind of request.

A process that sleeps in ``poll`` must be woken when its reply comes. On this project's small
virtual machines that wake-up costs more than the reply itself: a bare round trip on a link
takes about 59 µs when both ends sleep, 20 µs when the waiting end polls without sleeping
(and the sender's CPU per message falls from 29 to 8 µs, since it has no sleeper to wake;
``tools/bench_transport.py``). So a client that expects its reply soon spins on a
non-blocking poll for a while before it sleeps.

Spinning costs a core, and on a host whose cores the members need, a spin that outlasts the
reply only slows the members down. So the budget follows what replies of the same kind (the
request's op) took lately: a kind whose replies come within ``limit`` on average spins for
twice its mean wait, up to ``limit``; a slower kind (a put_all of a hundred keys, a scan)
does not spin at all. A new kind spins for the whole limit once, and learns. One slow
outlier must not turn spinning off for long, so each sample counts at most twice the limit.

Pure: the caller measures the waits and owns the clock.
"""

from __future__ import annotations

# Weight of the newest wait in a kind's running mean (an exponentially weighted mean).
WEIGHT = 0.125


class BusyPoll:
    """Per kind of request, the running mean of its waits and the spin it earns."""

    __slots__ = ("limit", "means")

    def __init__(self, limit_s: float) -> None:
        self.limit = max(0.0, limit_s)
        self.means: dict[str, float] = {}

    def budget(self, kind: str) -> float:
        """Seconds to poll without sleeping for a reply to a request of ``kind``."""
        mean = self.means.get(kind)
        if mean is None:
            return self.limit
        if mean > self.limit:
            return 0.0
        return min(self.limit, 2 * mean)

    def record(self, kind: str, waited_s: float) -> None:
        """A request of ``kind`` got its whole reply ``waited_s`` after it was sent."""
        if not self.limit:
            return
        sample = min(waited_s, 2 * self.limit)
        mean = self.means.get(kind)
        self.means[kind] = sample if mean is None else mean + WEIGHT * (sample - mean)
