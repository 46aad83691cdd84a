"""The chaos checker: hand-written histories with known verdicts, random small histories against
a brute-force oracle, and histories generated from a simulated atomic register (linearizable by
construction) with and without an injected impossible read."""

from __future__ import annotations

import dataclasses
import functools
import random
import time

import pytest

from grid.chaos.checker import check, check_key
from grid.chaos.history import FUNCTIONS, Op, apply, read_jsonl, write_jsonl

pytestmark = pytest.mark.timeout(120)


class History(list):
    """A hand-written history: each op gets the next index and a process of its own."""

    def op(self, f: str, value: int | None = None, result: int | None = None,
           at: tuple[float, float] = (0, 1), status: str = "ok", key: str = "k",
           observed: bool = True) -> Op:
        op = Op(len(self), len(self), f, key, value, result, status, at[0], at[1], observed)
        self.append(op)
        return op


def assert_caught(h: History, *offending: Op, culprit: Op) -> None:
    verdict = check(h)
    assert not verdict.valid, verdict.summary()
    failure = verdict.failures[culprit.key]
    assert failure.ok is False
    assert failure.culprit == culprit
    assert set(offending) | {culprit} <= set(failure.window), failure.window
    assert culprit.key in verdict.summary()


# --- linearizable histories ---------------------------------------------------------------

def test_a_sequential_history_is_valid() -> None:
    h = History()
    h.op("get", at=(0, 1))
    h.op("put", 1, None, (2, 3))
    h.op("get", None, 1, (4, 5))
    h.op("put", 2, 1, (6, 7))
    h.op("replace", 3, 2, (8, 9))
    h.op("put_if_absent", 4, 3, (10, 11))
    h.op("remove", None, 3, (12, 13))
    h.op("replace", 5, None, (14, 15))
    h.op("get", at=(16, 17))
    h.op("put_if_absent", 6, None, (18, 19))
    h.op("get", None, 6, (20, 21))
    verdict = check(h)
    assert verdict.valid, verdict.summary()
    assert verdict.keys_checked == 1
    assert verdict.summary().startswith("valid")


@pytest.mark.parametrize("first", [1, 2])
def test_overlapping_writes_may_take_effect_in_either_order(first: int) -> None:
    second = 3 - first
    h = History()
    results = {first: None, second: first}  # what each put returned, in that order
    h.op("put", 1, results[1], (0, 10))
    h.op("put", 2, results[2], (1, 11))
    h.op("get", None, second, (12, 13))
    assert check(h).valid


@pytest.mark.parametrize("seen", [1, 2])
def test_a_read_overlapping_a_write_sees_the_old_or_the_new_value(seen: int) -> None:
    h = History()
    h.op("put", 1, None, (0, 1))
    h.op("put", 2, 1, (2, 10))
    h.op("get", None, seen, (3, 4))
    assert check(h).valid


@pytest.mark.parametrize("reads", [[2], [1], [1, 2]], ids=["applied", "not-applied", "late"])
def test_an_info_write_may_have_taken_effect_or_not(reads: list[int]) -> None:
    h = History()
    h.op("put", 1, None, (0, 1))
    h.op("put", 2, 42, (2, 3), status="info")  # gave up at 3; its result is not checked
    for n, seen in enumerate(reads):
        h.op("get", None, seen, (5 + 2 * n, 6 + 2 * n))
    verdict = check(h)
    assert verdict.valid, verdict.summary()
    assert not verdict.lost_writes


def test_a_failed_write_did_not_take_effect() -> None:
    h = History()
    h.op("put", 1, None, (0, 1))
    refused = h.op("put", 2, None, (2, 3), status="fail")
    read = h.op("get", None, 2, (4, 5))
    assert_caught(h, refused, culprit=read)


@pytest.mark.parametrize("winner", [1, 2])
def test_put_if_absent_race_exactly_one_wins(winner: int) -> None:
    h = History()
    h.op("put_if_absent", 1, None if winner == 1 else 2, (0, 10))
    h.op("put_if_absent", 2, None if winner == 2 else 1, (1, 11))
    h.op("get", None, winner, (12, 13))
    assert check(h).valid


@pytest.mark.parametrize("read", [2, 1])
def test_an_unobserved_put_is_checked_by_its_effect(read: int) -> None:
    h = History()
    h.op("put", 1, None, (0, 1))
    put_all = h.op("put", 2, None, (2, 3), observed=False)
    get = h.op("get", None, read, (4, 5))
    if read == 2:
        assert check(h).valid
    else:
        assert_caught(h, put_all, culprit=get)


def test_keys_are_checked_separately() -> None:
    h = History()
    h.op("put", 1, None, (0, 1), key="a")
    h.op("put", 1, None, (0, 1), key="b")
    h.op("get", None, 1, (2, 3), key="a")
    bad = h.op("get", None, 2, (2, 3), key="b")
    verdict = check(h)
    assert verdict.keys_checked == 2
    assert list(verdict.failures) == ["b"]
    assert verdict.failures["b"].culprit == bad


# --- anomalies ----------------------------------------------------------------------------

def test_a_lost_write_is_caught_and_reported_as_such() -> None:
    h = History()
    old = h.op("put", 1, None, (0, 1))
    acked = h.op("put", 2, 1, (2, 3))
    read = h.op("get", None, 1, (4, 5))
    h.op("get", None, 1, (6, 7))
    assert_caught(h, old, acked, culprit=read)
    assert check(h).lost_writes == [(acked, read)]


def test_a_stale_read_after_an_acknowledged_write_is_caught() -> None:
    h = History()
    h.op("put", 1, None, (0, 1))
    acked = h.op("put", 2, 1, (2, 3))
    racing = h.op("put", 3, 2, (4, 10))  # may come before the read: not a lost write
    stale = h.op("get", None, 1, (5, 6))
    h.op("get", None, 3, (11, 12))
    assert_caught(h, acked, racing, culprit=stale)
    assert check(h).lost_writes == []


def test_a_value_never_written_is_caught() -> None:
    h = History()
    h.op("put", 1, None, (0, 1))
    read = h.op("get", None, 99, (2, 3))
    assert_caught(h, culprit=read)


@pytest.mark.parametrize("second_at", [(2, 3), (0.5, 1.5)], ids=["sequential", "overlapping"])
def test_put_if_absent_succeeding_twice_is_caught(second_at: tuple[float, float]) -> None:
    h = History()
    first = h.op("put_if_absent", 1, None, (0, 1))
    second = h.op("put_if_absent", 2, None, second_at)
    assert_caught(h, first, culprit=second)


@pytest.mark.parametrize("previous", [7, None, 2])
def test_an_impossible_previous_value_is_caught(previous: int | None) -> None:
    h = History()
    first = h.op("put", 1, None, (0, 1))
    second = h.op("put", 2, previous, (2, 3))
    assert_caught(h, first, culprit=second)


def test_the_window_is_the_neighbourhood_of_the_first_failure() -> None:
    h = History()
    t = 0.0
    for n in range(1, 101):
        h.op("put", n, n - 1 if n > 1 else None, (t, t + 1))
        h.op("get", None, n, (t + 2, t + 3))
        t += 4
    stale = h.op("get", None, 99, (t, t + 1))
    for n in range(101, 151):
        h.op("put", n, n - 1, (t + 2, t + 3))
        t += 4
    result = check_key(h)
    assert result.ok is False
    assert result.culprit == stale
    assert h[198] in result.window  # put 100: the write the read missed
    assert h[196] in result.window  # put 99: the write of the value it returned
    assert len(result.window) <= 6, result.window


def test_a_search_over_its_step_budget_is_unknown_not_a_failure() -> None:
    h = History()
    h.op("put", 1, None, (0, 10))
    h.op("put", 2, None, (1, 11))
    h.op("get", None, 3, (12, 13))
    assert check_key(h, max_steps=2).ok is None
    verdict = check(h, max_steps=2)
    assert verdict.unknown_keys == ["k"] and verdict.valid
    assert check_key(h).ok is False


def test_no_lost_write_when_an_indeterminate_remove_may_come_between() -> None:
    h = History()
    h.op("put", 1, None, (0, 1))
    h.op("put", 2, 1, (2, 3))
    h.op("remove", None, None, (2.5, 3.5), status="info")
    h.op("get", None, None, (4, 5))
    verdict = check(h)
    assert verdict.valid and not verdict.lost_writes, verdict.summary()


def test_verdict_to_json_names_the_failure() -> None:
    h = History()
    h.op("put", 1, None, (0, 1))
    acked = h.op("put", 2, 1, (2, 3))
    read = h.op("get", None, 1, (4, 5))
    report = check(h).to_json()
    assert report["valid"] is False
    assert report["failures"]["k"]["culprit"] == read.to_dict()
    assert report["lost_writes"] == [{"write": acked.to_dict(), "read": read.to_dict()}]


# --- the history file ---------------------------------------------------------------------

def test_jsonl_round_trips_exactly(tmp_path) -> None:
    ops = [Op(0, 3, "put", "k1", 10**12 + 7, None, "ok", 0.1 + 0.2, 1 / 3, observed=False),
           Op(1, 4, "get", "k1", None, 10**12 + 7, "ok", 123456.000000001, 123456.5),
           Op(2, 4, "remove", "k2", None, None, "info", 1e-9, 2e-9)]
    write_jsonl(tmp_path / "h.jsonl", ops)
    assert read_jsonl(tmp_path / "h.jsonl") == ops
    (tmp_path / "w.jsonl").write_text(  # a line as a worker writes it, without "observed"
        '{"index": 5, "process": 1, "f": "get", "key": "k", "value": null, "result": null, '
        '"status": "fail", "invoke": 1.5, "complete": 2.5}\n\n')
    assert read_jsonl(tmp_path / "w.jsonl") == [
        Op(5, 1, "get", "k", None, None, "fail", 1.5, 2.5, True)]


# --- random histories ---------------------------------------------------------------------

def brute_force(ops: list[Op]) -> bool:
    """Linearizable by the definition: some order of all the ok ops and some of the info ops,
    none before an op that completed before it was invoked, gives every ok op's result."""
    live = [op for op in ops if op.status != "fail"]

    @functools.cache
    def extends(placed: frozenset[Op], state: int | None) -> bool:
        if all(op in placed for op in live if op.status == "ok"):
            return True
        for op in live:
            if op in placed or any(other.status == "ok" and other not in placed
                                   and other.complete < op.invoke for other in live):
                continue
            result, after = apply(op.f, op.value, state)
            if op.status == "ok" and op.observed and result != op.result:
                continue
            if extends(placed | {op}, after):
                return True
        return False

    return extends(frozenset(), None)


def random_history(rng: random.Random, ties: bool) -> list[Op]:
    """Up to 10 ops on one key, a third of them info, values in {1, 2, 3, 4}; times are small
    integers (ties happen) or floats. Half the time the results come from a random order in
    which each info op took effect or not (often linearizable), else they are random."""
    ops = []
    n = rng.randint(1, 10)
    starts = [rng.randint(0, 8) if ties else rng.uniform(0, 10) for _ in range(n)]
    for i, at in enumerate(sorted(starts)):
        f = rng.choice(FUNCTIONS)
        status = rng.choices(["ok", "info", "fail"], [5, 3, 1])[0]
        ops.append(Op(i, i, f, "k", None if f in ("get", "remove") else rng.randint(1, 4),
                      rng.choice([None, 1, 2, 3, 4]), status, at,
                      at + (rng.randint(0, 4) if ties else rng.expovariate(0.5)),
                      f == "get" or rng.random() < 0.9))
    if rng.random() < 0.5:
        state = None
        for i in rng.sample(range(n), n):
            if ops[i].status == "ok" or rng.random() < 0.5:
                result, state = apply(ops[i].f, ops[i].value, state)
                ops[i] = dataclasses.replace(ops[i], result=result)
    return ops


def prefix_at(ops: list[Op], culprit: Op) -> tuple[list[Op], list[Op]]:
    """The history as it stood when ``culprit`` completed, and when the ok op completing just
    before it did: ok ops not completed by then count as info."""
    acked = sorted((op for op in ops if op.status == "ok"), key=lambda op: op.complete)
    prefixes = []
    for done in (acked[:acked.index(culprit) + 1], acked[:acked.index(culprit)]):
        until = done[-1].complete if done else -1
        prefixes.append([op if op in done else dataclasses.replace(op, status="info")
                         for op in ops if op.status != "fail" and op.invoke <= until])
    return prefixes[0], prefixes[1]


@pytest.mark.parametrize("ties", [True, False], ids=["integer-times", "float-times"])
def test_random_histories_agree_with_brute_force(ties: bool) -> None:
    rng = random.Random(20240601 + ties)
    verdicts = []
    for _ in range(2000):
        ops = random_history(rng, ties)
        expected = brute_force(ops)
        verdict = check(ops)
        assert (verdict.failures == {}) == expected, ops
        assert not (verdict.lost_writes and expected), ops
        verdicts.append(expected)
    assert 500 < sum(verdicts) < 1500  # both kinds were tried


def test_the_culprit_completes_the_shortest_failing_prefix() -> None:
    rng = random.Random(5)
    failing = 0
    while failing < 500:
        ops = random_history(rng, ties=False)
        result = check_key(ops)
        if result.ok is False:
            failing += 1
            at, before = prefix_at(ops, result.culprit)
            assert not brute_force(at) and brute_force(before), ops
            assert result.culprit in result.window


def simulated(rng: random.Random, n_ops: int, processes: int, keys: int,
              info: float = 0.08, fail: float = 0.04) -> list[Op]:
    """A history of an atomic register: each process runs ops one after another with random
    gaps and durations; each ok op takes effect at a random point inside its interval, an info
    op half of the time at a random point after its invoke (often after the client gave up),
    a failed op never. A few puts are unobserved, as a put_all's are."""
    rows = []
    written = 0
    for process in range(processes):
        t = rng.random()
        for _ in range(n_ops // processes):
            invoke = t + rng.expovariate(2.0)
            complete = invoke + rng.expovariate(0.7)
            f = rng.choice(FUNCTIONS)
            written += 1
            status = rng.choices(["ok", "info", "fail"], [1 - info - fail, info, fail])[0]
            if status == "ok":
                effect = rng.uniform(invoke, complete)
            elif status == "info" and rng.random() < 0.5:
                effect = invoke + rng.expovariate(0.5)
            else:
                effect = None
            rows.append({"effect": effect, "invoke": invoke, "complete": complete,
                         "process": process, "f": f, "key": f"k{rng.randrange(keys)}",
                         "value": None if f in ("get", "remove") else written,
                         "status": status, "result": None,
                         "observed": not (f == "put" and rng.random() < 0.1)})
            t = complete
    state: dict[str, int | None] = {}
    for row in sorted((r for r in rows if r["effect"] is not None), key=lambda r: r["effect"]):
        result, state[row["key"]] = apply(row["f"], row["value"], state.get(row["key"]))
        if row["status"] == "ok" and row["observed"]:
            row["result"] = result
    rows.sort(key=lambda r: r["invoke"])
    return [Op(i, r["process"], r["f"], r["key"], r["value"], r["result"], r["status"],
               r["invoke"], r["complete"], r["observed"]) for i, r in enumerate(rows)]


def with_impossible_read(rng: random.Random, ops: list[Op]) -> tuple[list[Op], Op]:
    """The history with one ok read's result swapped for a value never written."""
    reads = [i for i, op in enumerate(ops) if op.f == "get" and op.status == "ok"]
    i = rng.choice(reads)
    mutated = dataclasses.replace(ops[i], result=-1)
    return ops[:i] + [mutated] + ops[i + 1:], mutated


@pytest.mark.parametrize("seed", range(12))
def test_simulated_register_histories_are_valid_and_mutations_are_caught(seed: int) -> None:
    rng = random.Random(seed)
    ops = simulated(rng, n_ops=400, processes=rng.randint(2, 8), keys=rng.randint(1, 4))
    verdict = check(ops)
    assert verdict.valid and not verdict.unknown_keys, verdict.summary()
    broken, mutated = with_impossible_read(rng, ops)
    verdict = check(broken)
    assert not verdict.valid
    assert list(verdict.failures) == [mutated.key]
    assert verdict.failures[mutated.key].culprit == mutated
    assert mutated in verdict.failures[mutated.key].window


def test_a_long_busy_key_is_checked_without_recursion() -> None:
    rng = random.Random(7)
    ops = simulated(rng, n_ops=5000, processes=8, keys=1)
    started = time.perf_counter()
    result = check_key(ops)
    print(f"\n5000 ops on one key, 8 processes: {result.steps} steps, "
          f"{time.perf_counter() - started:.2f} s")
    assert result.ok is True
    broken, mutated = with_impossible_read(rng, ops)
    result = check_key(broken)
    assert result.ok is False and result.culprit == mutated


def test_200k_ops_over_10k_keys() -> None:
    ops = simulated(random.Random(1), n_ops=200_000, processes=50, keys=10_000)
    started = time.perf_counter()
    verdict = check(ops)
    print(f"\n200k ops over {verdict.keys_checked} keys checked in "
          f"{time.perf_counter() - started:.2f} s")
    assert verdict.valid and not verdict.unknown_keys, verdict.summary()
    assert verdict.keys_checked == len({op.key for op in ops})
