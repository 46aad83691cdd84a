"""The verdict on a chaos run's history: is every key's history linearizable as a register
(initial value None, ``history.apply``), and was any acknowledged write lost?

Keys are checked one by one (linearizability is compositional). ``check_key`` searches for a
linearization as Wing & Gong and Lowe do. "fail" ops are dropped. "ok" ops are *required*:
each takes effect between its invoke and its completion and returns what it returned (unless
not observed). "info" ops are *optional*: they take effect at any point after their invoke, or
never, and their results are not checked. The invokes and completions of the required ops are
a doubly linked list in time order (at equal times invokes first: ops that touch count as
concurrent). From a configuration (ops linearized, register state) the candidates are the ops
invoked before the earliest completion among the required ops not linearized yet (just-in-time
linearization). Required candidates are tried first, in invoke order, optional ones only when
no required one leads anywhere. A candidate is taken if the model gives its recorded result and
the configuration it leads to is not known to fail. Success when every required op is
linearized; failure when no candidate is left and nothing to undo. An explicit stack replaces
recursion; ``max_steps`` bounds the iterations (each tries a candidate or undoes an op).

Pruning, all exact (when a linearization exists, one of those the search tries does):

- memo: a configuration entered by a required op is recorded when it fails, as (required ops
  linearized, state) -> optional ops taken. One with the same required ops and state and a
  superset of those optional ops can only do less, so it is not entered. Sets are bitmasks in
  invoke order, the required one shifted by its trailing ones, so a long history costs memory
  in proportion to its concurrency, not to its length. (A configuration entered by an optional
  op is not recorded: the rule on rows below restricts what it tries.)
- the values that no checked result shows are one symbol (which of them the register holds is
  never checked), and optional reads are dropped (no effect);
- optional ops alike but for their invoke (same function and value) are interchangeable: only
  the earliest not taken yet of each kind is a candidate;
- an optional op is not taken if it would change nothing, and at most two in a row: a row of
  optional ops between required ones matters only by the state it leaves, which one of them
  reaches (a put or a remove, a put_if_absent from absent, a replace from present) or two (a
  remove then a put_if_absent, a put or put_if_absent then a replace). So a second one is
  taken only if it would have changed nothing without the first.

The window of a key that fails comes from its shortest failing prefix. Prefix k is the history
as it stood when the k-th ok op, in completion order, completed: the ok ops completed by then
are required, the ops invoked by then and not completed (ok ops still running, info ops) are
optional, as they may already have taken effect. Every prefix of a linearizable history is
linearizable, so a binary search finds the shortest failing one (a prefix on which the search
gives up counts as passing, so the window may then come later); its last ok op is the
*culprit*. The window keeps, of that prefix: the ok ops overlapping the culprit in time, the
last ``WINDOW_BEFORE`` ok ops completed before the culprit was invoked, the last ok write or
remove completed before it; the optional ops invoked since the earliest of those (an optional
op invoked earlier may have taken effect any time, but it would make long histories' windows
long); and the latest write of the value the culprit returned (even a failed or old one: a
refused write that took effect shows so).

A *lost write* is an acknowledged write (an ok put, an ok put_if_absent that returned None, an
ok replace that returned a value) that an ok get invoked after it completed does not return,
although no other op that may write the key (ok or info put, remove, put_if_absent or replace,
except those whose result shows they changed nothing) overlaps the write or is invoked after
it and before the get completed. For each such write the first such get is reported.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from grid.chaos.history import Op, apply

INF = math.inf
WINDOW_BEFORE = 3  # ok ops completed just before the culprit that a window keeps
_ANY = object()  # an expected result that is not checked
_UNSHOWN = object()  # a value that no checked result shows


class _Call(NamedTuple):
    invoke: float
    complete: float  # INF: optional
    f: str
    value: int | None
    expected: object  # the result the model must give, or _ANY


@dataclass
class KeyResult:
    """One key's verdict: ``ok`` None means the search gave up after ``max_steps``; ``steps``
    are those of the search over the whole history. When not ok: the culprit and the window
    of its shortest failing prefix (module docstring)."""

    ok: bool | None
    steps: int
    window: list[Op] = field(default_factory=list)
    culprit: Op | None = None

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "steps": self.steps,
                "culprit": None if self.culprit is None else self.culprit.to_dict(),
                "window": [op.to_dict() for op in self.window]}


@dataclass
class Verdict:
    """A history's verdict: ``valid`` when no key is known not to be linearizable and no
    write was lost; keys on which the search gave up are listed in ``unknown_keys``."""

    valid: bool
    keys_checked: int
    failures: dict[str, KeyResult]
    lost_writes: list[tuple[Op, Op]]  # (write, the read that missed it)
    unknown_keys: list[str]

    def summary(self, limit: int = 5) -> str:
        lines = [f"{'valid' if self.valid else 'INVALID'}: {self.keys_checked} keys checked, "
                 f"{len(self.failures)} not linearizable, {len(self.lost_writes)} lost "
                 f"writes, {len(self.unknown_keys)} unknown (search gave up)"]
        lines += [f"lost write {w}, then read {r}" for w, r in self.lost_writes[:limit]]
        lines += [f"key {key}: not linearizable at {result.culprit} "
                  f"(window of {len(result.window)} ops)"
                  for key, result in list(self.failures.items())[:limit]]
        hidden = max(0, len(self.lost_writes) - limit) + max(0, len(self.failures) - limit)
        if hidden:
            lines.append(f"... and {hidden} more")
        if self.unknown_keys:
            lines.append("unknown: " + ", ".join(self.unknown_keys[:limit])
                         + (" ..." if len(self.unknown_keys) > limit else ""))
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {"valid": self.valid, "keys_checked": self.keys_checked,
                "failures": {key: result.to_json() for key, result in self.failures.items()},
                "lost_writes": [{"write": w.to_dict(), "read": r.to_dict()}
                                for w, r in self.lost_writes],
                "unknown_keys": self.unknown_keys}


def check(ops: list[Op], max_steps: int = 2_000_000) -> Verdict:
    """Check every key of a history (``max_steps`` per key search) and look for lost writes."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    failures: dict[str, KeyResult] = {}
    unknown: list[str] = []
    lost: list[tuple[Op, Op]] = []
    for key in sorted(by_key):
        result = check_key(by_key[key], max_steps)
        if result.ok is False:
            failures[key] = result
        elif result.ok is None:
            unknown.append(key)
        lost += _lost_writes(by_key[key])
    return Verdict(not failures and not lost, len(by_key), failures, lost, unknown)


def check_key(ops: list[Op], max_steps: int = 2_000_000) -> KeyResult:
    """Whether one key's ops are linearizable as a register; when not, with the window."""
    if len({op.key for op in ops}) > 1:
        raise ValueError("check_key takes the ops of one key")
    live = sorted((op for op in ops if op.status != "fail"), key=lambda op: (op.invoke, op.index))
    acked = sorted((i for i, op in enumerate(live) if op.status == "ok"),
                   key=lambda i: (live[i].complete, i))
    if not acked:
        return KeyResult(True, 0)
    rank = [len(acked)] * len(live)  # completion rank of the ok ops; others rank last
    for r, i in enumerate(acked):
        rank[i] = r
    ok, steps = _search(_prefix(live, rank, acked, len(acked) - 1), max_steps)
    if ok is not False:
        return KeyResult(ok, steps)
    lo, hi = 0, len(acked) - 1  # the shortest failing prefix is at most hi
    while lo < hi:
        mid = (lo + hi) // 2
        if _search(_prefix(live, rank, acked, mid), max_steps)[0] is False:
            hi = mid
        else:
            lo = mid + 1
    culprit = live[acked[lo]]
    return KeyResult(False, steps, _window(ops, live, rank, lo, culprit), culprit)


def _prefix(live: list[Op], rank: list[int], acked: list[int], k: int) -> list[_Call]:
    """Prefix k (module docstring) of ops sorted by invoke, as calls sorted by invoke."""
    until = live[acked[k]].complete
    calls = []
    for i, op in enumerate(live):
        if op.invoke > until:
            break
        if rank[i] <= k:
            calls.append(_Call(op.invoke, op.complete, op.f, op.value,
                               op.result if op.observed else _ANY))
        else:
            calls.append(_Call(op.invoke, INF, op.f, op.value, _ANY))
    return calls


def _window(ops: list[Op], live: list[Op], rank: list[int], k: int, culprit: Op) -> list[Op]:
    """The ops that show why prefix k fails (module docstring), in invoke order."""
    overlapping, before, pending = [], [], []  # done ops by when they completed; the rest
    for i, op in enumerate(live):
        if op.invoke > culprit.complete:
            break
        if rank[i] > k:
            pending.append(i)
        elif op.complete >= culprit.invoke:
            overlapping.append(i)
        else:
            before.append(i)
    before.sort(key=rank.__getitem__)
    writes = [i for i in before if live[i].f != "get"]
    keep = {*overlapping, *before[-WINDOW_BEFORE:], *writes[-1:]}
    since = min(live[i].invoke for i in keep)
    keep.update(i for i in pending if live[i].invoke >= since)
    window = [live[i] for i in sorted(keep)]
    if culprit.observed and culprit.result is not None:
        sources = [op for op in ops if op.f != "get" and op.value == culprit.result
                   and op.invoke <= culprit.complete and op is not culprit]
        source = max(sources, key=lambda op: (op.invoke, op.index), default=None)
        if source is not None and source not in window:
            window = sorted([*window, source], key=lambda op: (op.invoke, op.index))
    return window


def _canonical(calls: list[_Call]) -> list[_Call]:
    """Without the optional reads (they have no effect), and with every value that no checked
    result shows replaced by one symbol: which of them the register holds never matters."""
    shown = {c.expected for c in calls if c.expected is not _ANY}
    return [c if c.value is None or c.value in shown else c._replace(value=_UNSHOWN)
            for c in calls if c.complete != INF or c.f != "get"]


def _search(calls: list[_Call], max_steps: int) -> tuple[bool | None, int]:
    """Whether ``calls`` (sorted by invoke) have a linearization, None if telling would take
    more than ``max_steps`` steps; and the steps taken."""
    calls = _canonical(calls)
    required = [i for i, c in enumerate(calls) if c.complete != INF]
    optional = [i for i, c in enumerate(calls) if c.complete == INF]
    remaining = len(required)
    if not remaining:
        return True, 0
    events, kinds = _Events(calls, required), _Kinds(calls, optional)
    is_req, bit = [False] * len(calls), [0] * len(calls)
    for group in (required, optional):
        for position, i in enumerate(group):
            bit[i] = 1 << position
            is_req[i] = group is required
    # Configurations entered by a required op that failed: (required mask shifted by its
    # trailing ones, the shift, state) -> the masks of optional ops taken.
    failed: dict[tuple[int, int, object], list[int]] = {}
    # An entry: (op, state before it, limit then, configuration it led to, run before it).
    stack: list[tuple[int, object, float, tuple[int, int, object], int]] = []
    state: object = None
    req = opt = 0  # the linearized ops, as bitmasks
    run = 0  # optional ops taken since the last required one
    walking_required, e, limit = True, events.nxt[_HEAD], INF
    steps = 0
    while True:
        steps += 1
        if steps > max_steps:
            return None, steps
        if walking_required:
            if not events.is_call[e]:
                # No required candidate leads anywhere: try the optional ops invoked by now.
                walking_required, limit = False, events.time[e]
                e = kinds.end if run == 2 else kinds.nxt[kinds.head]
                continue
            i, e = events.op_of[e], events.nxt[e]
        elif e == kinds.end or kinds.since[e] > limit:
            if not stack:
                return False, steps
            i, state, limit, config, run = stack.pop()
            if is_req[i]:
                failed.setdefault(config, []).append(opt)
                req ^= bit[i]
                remaining += 1
                events.restore(i)
                e = events.nxt[events.call_node[i]]
            else:
                opt ^= bit[i]
                e = kinds.nxt[kinds.untake(i)]
            walking_required = is_req[i]
            continue
        else:
            i, e = kinds.first_left(e), kinds.nxt[e]
            if calls[i].invoke > limit:
                continue
        call = calls[i]
        result, new = apply(call.f, call.value, state)
        if call.expected is not _ANY and result != call.expected:
            continue
        if not walking_required and (new == state or run == 1 and apply(
                call.f, call.value, stack[-1][1])[1] != stack[-1][1]):
            continue  # it would change nothing, or would have without the optional op before
        r2, o2 = (req | bit[i], opt) if walking_required else (req, opt | bit[i])
        low = (~r2 & (r2 + 1)).bit_length() - 1
        config = (r2 >> low, low, new)
        if any(o & ~o2 == 0 for o in failed.get(config, ())):
            continue  # it failed before with the same or fewer optional ops taken
        stack.append((i, state, limit, config, run))
        state, req, opt = new, r2, o2
        if walking_required:
            events.remove(i)
            remaining -= 1
            if not remaining:
                return True, steps
            run = 0
        else:
            kinds.take(i)
            run += 1
        walking_required, e = True, events.nxt[_HEAD]


_HEAD, _END = 0, 1


class _Events:
    """The invokes and completions of the required ops as a doubly linked list in time order
    (at equal times invokes first), from node _HEAD to node _END. Linearizing an op removes its
    two nodes; undoing it, in reverse order, puts them back."""

    def __init__(self, calls: list[_Call], required: list[int]) -> None:
        self.time, self.op_of, self.is_call = [-INF, INF], [-1, -1], [False, False]
        self.call_node, self.done_node = [0] * len(calls), [0] * len(calls)
        chain = [_HEAD]
        for t, kind, i in sorted([(calls[i].invoke, 0, i) for i in required]
                                 + [(calls[i].complete, 1, i) for i in required]):
            chain.append(len(self.time))
            self.time.append(t)
            self.op_of.append(i)
            self.is_call.append(kind == 0)
            (self.done_node if kind else self.call_node)[i] = chain[-1]
        chain.append(_END)
        self.nxt, self.prv = [-1] * len(self.time), [-1] * len(self.time)
        for a, b in zip(chain, chain[1:], strict=False):
            self.nxt[a], self.prv[b] = b, a

    def remove(self, i: int) -> None:
        nxt, prv = self.nxt, self.prv
        for node in (self.call_node[i], self.done_node[i]):
            nxt[prv[node]], prv[nxt[node]] = nxt[node], prv[node]

    def restore(self, i: int) -> None:
        nxt, prv = self.nxt, self.prv
        for node in (self.done_node[i], self.call_node[i]):
            nxt[prv[node]] = prv[nxt[node]] = node


class _Kinds:
    """The optional ops by kind (function and value). Ops of a kind differ only in their
    invoke, so of each kind only the earliest one not taken is a candidate. The kinds with ops
    left are a doubly linked list, from node ``head`` to node ``end``, in the order of their
    first invokes (``since``)."""

    def __init__(self, calls: list[_Call], optional: list[int]) -> None:
        numbers: dict[tuple[str, object], int] = {}
        self.members: list[list[int]] = []
        self.kind_of = [-1] * len(calls)
        for i in optional:
            k = self.kind_of[i] = numbers.setdefault((calls[i].f, calls[i].value), len(numbers))
            if k == len(self.members):
                self.members.append([])
            self.members[k].append(i)
        self.since = [calls[ops[0]].invoke for ops in self.members]
        self.used = [0] * len(self.members)
        self.head, self.end = len(self.members), len(self.members) + 1
        chain = [self.head, *range(len(self.members)), self.end]
        self.nxt, self.prv = [-1] * len(chain), [-1] * len(chain)
        for a, b in zip(chain, chain[1:], strict=False):
            self.nxt[a], self.prv[b] = b, a

    def first_left(self, k: int) -> int:
        return self.members[k][self.used[k]]

    def take(self, i: int) -> None:
        k = self.kind_of[i]
        self.used[k] += 1
        if self.used[k] == len(self.members[k]):
            self.nxt[self.prv[k]], self.prv[self.nxt[k]] = self.nxt[k], self.prv[k]

    def untake(self, i: int) -> int:
        """Undo the last ``take`` of op i's kind; returns the kind."""
        k = self.kind_of[i]
        if self.used[k] == len(self.members[k]):
            self.nxt[self.prv[k]] = self.prv[self.nxt[k]] = k
        self.used[k] -= 1
        return k


def _lost_writes(ops: list[Op]) -> list[tuple[Op, Op]]:
    """One key's lost writes (module docstring), each with the first read that missed it."""
    writers = sorted((op for op in ops if op.status != "fail" and _may_write(op)),
                     key=lambda op: (op.invoke, op.index))
    reads = sorted((op for op in ops if op.status == "ok" and op.f == "get" and op.observed),
                   key=lambda op: (op.invoke, op.index))
    read_invokes = [op.invoke for op in reads]
    lost = []
    reach = -INF  # the latest end of the writers before this one (info: never ends)
    for p, w in enumerate(writers):
        if reach < w.invoke and _acknowledged(w):
            next_invoke = writers[p + 1].invoke if p + 1 < len(writers) else INF
            for j in range(bisect.bisect_right(read_invokes, w.complete), len(reads)):
                r = reads[j]
                if r.invoke >= next_invoke:
                    break
                if r.complete < next_invoke and r.result != w.value:
                    lost.append((w, r))
                    break
        reach = max(reach, w.complete if w.status == "ok" else INF)
    return lost


def _may_write(op: Op) -> bool:
    if op.f == "get":
        return False
    if op.status != "ok" or not op.observed:
        return True
    return not (op.f == "put_if_absent" and op.result is not None
                or op.f == "replace" and op.result is None)


def _acknowledged(op: Op) -> bool:
    if op.status != "ok":
        return False
    return op.f == "put" or op.observed and (op.f == "put_if_absent" and op.result is None
                                             or op.f == "replace" and op.result is not None)
