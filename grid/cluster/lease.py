"""How long a member may act alone: its membership lease, from echoed heartbeats.

An owner whose partition has no live backup acknowledges a write with nobody to check that it
is still the owner. If it was paused long enough to be removed (and resumed before it was
fenced), such a write is lost when it learns of its removal. A member can be removed only by
one that has not heard from it for ``heartbeat_timeout``: the master removes a silent follower,
and a follower claims mastership only when the master was silent that long. So when a peer
echoes the number of our heartbeat sent at time ``t``, that peer cannot act against us before
``t + heartbeat_timeout``. A follower's lease rests on the master's echo; the master's on the
echo of every follower (any of them could become a claimant).

Pure state: times are passed in.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable


class MembershipLease:
    def __init__(self, heartbeat_timeout: float, margin_s: float = 0.0) -> None:
        self.timeout = heartbeat_timeout
        self.margin_s = margin_s
        self.counter = 0
        self._sent: OrderedDict[int, float] = OrderedDict()  # our heartbeat number -> sent at
        self._echoed: dict[str, float] = {}  # peer -> send time of the newest number it echoed
        self.changes = 0  # rises whenever an echo is taken or forgotten (a caller's cache key)

    def next_heartbeat(self, now: float) -> int:
        """Number the heartbeat about to be sent at ``now``."""
        self.counter += 1
        self._sent[self.counter] = now
        while self._sent and next(iter(self._sent.values())) < now - 2 * self.timeout:
            self._sent.popitem(last=False)  # an echo of it would give no lease any more
        return self.counter

    def echoed(self, peer: str, number: object) -> None:
        """``peer`` says the newest heartbeat of ours it received is ``number``."""
        valid = isinstance(number, int) and not isinstance(number, bool)
        sent = self._sent.get(number) if valid else None
        if sent is not None and sent > self._echoed.get(peer, -math.inf):
            self._echoed[peer] = sent
            self.changes += 1

    def forget(self, peer: str) -> None:
        if self._echoed.pop(peer, None) is not None:
            self.changes += 1

    def valid_until(self, peers: Iterable[str]) -> float:
        """Until when none of ``peers`` can have removed us (infinite with no peer). For the
        same peers, this changes only when ``changes`` does."""
        until = math.inf
        for peer in peers:
            until = min(until, self._echoed.get(peer, -math.inf) + self.timeout - self.margin_s)
        return until
