"""The backup's replica sync decisions (grid/cluster/replica_sync.py): when it asks, and when
an answer may be installed."""

from __future__ import annotations

import random

from grid.cluster.replica_sync import GRACE_S, RETRY_S, SyncRequests, WindowOp, plan_install


def known_zero(pid: int, ns: str) -> int:
    return 0


def test_one_request_per_partition_and_a_member_wide_limit():
    requests = SyncRequests(limit=2, interval=30.0)
    requests.want(1, ["a"])
    requests.want(1, ["b"])
    requests.want(2, ["a"])
    requests.want(3, ["a"])
    assert requests.due(0.0, known_zero) == [(1, ["a", "b"]), (2, ["a"])]
    requests.want(1, ["c"])  # wanted while one is out: waits for the next request
    assert requests.due(1.0, known_zero) == []
    assert requests.in_flight == 2 and requests.waiting == 2
    requests.installed(2)
    assert requests.due(1.0, known_zero) == [(3, ["a"])]
    assert requests.due(1.0, known_zero) == []  # the limit: 1 and 3 are out
    requests.installed(1)
    assert requests.due(1.0, known_zero) == [(1, ["c"])]  # wanted after its request left


def test_installed_answers_only_the_namespaces_it_asked_for():
    requests = SyncRequests(limit=5, interval=30.0)
    requests.want(1, ["a"])
    assert requests.due(0.0, known_zero) == [(1, ["a"])]
    requests.want(1, ["a", "b"])  # "a" again (a dirty replica asks with every op), and "b"
    requests.installed(1)
    assert requests.due(0.1, known_zero) == [(1, ["b"])]


def test_no_answer_within_the_interval_allows_a_new_request():
    requests = SyncRequests(limit=5, interval=30.0)
    requests.want(4, ["m"])
    assert requests.due(0.0, known_zero) == [(4, ["m"])]
    assert requests.due(29.9, known_zero) == []
    assert requests.due(30.0, known_zero) == []  # expired now, asked again after RETRY_S
    assert requests.due(30.0 + RETRY_S, known_zero) == [(4, ["m"])]


def test_a_failed_answer_asks_again_after_a_pause():
    requests = SyncRequests(limit=5, interval=30.0)
    requests.want(4, ["m"])
    requests.due(0.0, known_zero)
    requests.failed(4, 1.0)
    assert requests.due(1.0, known_zero) == []
    assert requests.due(1.0 + RETRY_S, known_zero) == [(4, ["m"])]


def test_a_suspect_is_wanted_only_if_still_behind_after_the_grace():
    requests = SyncRequests(limit=5, interval=30.0)
    requests.suspect(1, "m", 10, 0.0)
    requests.suspect(2, "m", 10, 0.0)
    known = {(1, "m"): 9, (2, "m"): 10}
    assert requests.due(GRACE_S / 2, lambda pid, ns: known[(pid, ns)]) == []
    # 2 caught up (its operations were on their way); 1 did not: one was lost.
    assert requests.due(GRACE_S, lambda pid, ns: known[(pid, ns)]) == [(1, ["m"])]


def test_forget_ends_everything_about_a_partition():
    requests = SyncRequests(limit=5, interval=30.0)
    requests.want(1, ["a"])
    requests.due(0.0, known_zero)
    requests.want(1, ["b"])
    requests.suspect(1, "c", 5, 0.0)
    requests.forget(1)
    requests.record(1, WindowOp("a", "put", 1, [b"k"]))  # no request: nothing kept
    assert requests.due(GRACE_S + 1, known_zero) == []
    assert requests.in_flight == 0 and requests.waiting == 0


def test_the_window_is_kept_while_a_request_is_out():
    requests = SyncRequests(limit=5, interval=30.0)
    requests.record(1, WindowOp("a", "put", 1, [b"k"]))
    requests.want(1, ["a"])
    requests.due(0.0, known_zero)
    op = WindowOp("a", "put", 2, [b"k"])
    requests.record(1, op)
    assert requests.pending[1].window == [op]


# -- plan_install --------------------------------------------------------------------------

def leaf(key: bytes) -> int:
    return key[0] % 8


def test_newer_operations_are_applied_again_in_order():
    window = [WindowOp("m", "put", 5, [b"\x01"]), WindowOp("m", "put", 7, [b"\x02"]),
              WindowOp("m", "remove", 8, [b"\x01"]), WindowOp("m", "clear", 9, None)]
    ok, again = plan_install(window, {"m": 6}, {"m": None}, leaf)
    assert ok
    assert again == window[1:]


def test_older_operations_are_in_a_whole_fragment_snapshot():
    window = [WindowOp("m", "put", 3, [b"\x01"]), WindowOp("m", "clear", 4, None)]
    assert plan_install(window, {"m": 6}, {"m": None}, leaf) == (True, [])


def test_an_older_operation_outside_the_replaced_leaves_refuses_the_answer():
    """x=1, x=2, x=1 on the owner while the request was out: its leaf compared equal, yet the
    backup applied x=2 meanwhile. Installing the other leaves would leave x=2 here."""
    inside = WindowOp("m", "put", 3, [b"\x01"])
    outside = WindowOp("m", "put", 4, [b"\x02"])
    assert plan_install([inside], {"m": 6}, {"m": {1}}, leaf) == (True, [])
    assert plan_install([inside, outside], {"m": 6}, {"m": {1}}, leaf) == (False, [])
    clear = WindowOp("m", "clear", 5, None)
    assert plan_install([clear], {"m": 6}, {"m": {1}}, leaf) == (False, [])
    # Newer than the snapshot, anywhere: applied again, whatever the leaves.
    assert plan_install([outside], {"m": 3}, {"m": {1}}, leaf) == (True, [outside])


def test_a_moved_fragment_refuses_the_answer_and_other_namespaces_do_not_count():
    moved = WindowOp("m", "replace_contents", 9, None)
    assert plan_install([moved], {"m": 6}, {"m": None}, leaf) == (False, [])
    other = WindowOp("n", "replace_contents", 9, None)
    assert plan_install([other], {"m": 6}, {"m": None}, leaf) == (True, [])


def test_replaying_newer_operations_on_the_snapshot_gives_the_owners_state():
    """A model check: a random history of puts, removes and clears on the owner; the backup
    takes a random prefix before the request, then some operations during the window; the
    owner's snapshot is a later prefix. Snapshot plus replayed operations equals the owner's
    state after everything the backup applied."""
    rng = random.Random(7)
    for _ in range(500):
        history = []
        for version in range(1, 30):
            kind = rng.choice(["put", "put", "put", "remove", "clear"])
            key = bytes([rng.randrange(6)])
            history.append((version, kind, key, rng.randrange(100)))

        def state_after(ops):
            return _applied({}, [(kind, key, value) for _, kind, key, value in ops])
        sent = rng.randrange(len(history))  # what the backup had when it asked
        applied = rng.randrange(sent, len(history) + 1)  # what it applied before the answer
        snapshot = rng.randrange(sent, len(history) + 1)  # the owner's answer
        window = [WindowOp("m", kind, version, None if kind == "clear" else [key],
                           (kind, key, value))
                  for version, kind, key, value in history[sent:applied]]
        ok, again = plan_install(window, {"m": snapshot}, {"m": None}, leaf)
        assert ok
        state = _applied(state_after(history[:snapshot]), [op.request for op in again])
        assert state == state_after(history[:max(snapshot, applied)])


def _applied(state: dict, ops: list[tuple]) -> dict:
    """``state`` after (kind, key, value) operations."""
    state = dict(state)
    for kind, key, value in ops:
        if kind == "put":
            state[key] = value
        elif kind == "remove":
            state.pop(key, None)
        else:
            state.clear()
    return state
