"""The client's retry policy (grid/client/invocation.py) on a refusal that is not retryable:
a clean refusal only when nothing of the write can have been applied."""

from __future__ import annotations

import time

import pytest

from grid import protocol as p
from grid.client.invocation import Invoker
from grid.errors import (
    ClusterStateError,
    IndeterminateOperationStateError,
    OperationTimeoutError,
    PartlyAppliedError,
)
from grid.partition.table import PartitionTable

pytestmark = pytest.mark.timeout(30)

OK = ({"ok": True}, [])
PASSIVE = ({"ok": False, "code": p.STATE, "op": "put_all", "state": "PASSIVE"}, [])


class ScriptedInvoker(Invoker):
    """Partitions 0-1 live on member "a", 2-3 on "b"; each attempt gets the next replies."""

    def __init__(self, attempts: list[list[tuple[dict, list] | None]]) -> None:
        super().__init__([], "test", invocation_timeout=5.0, attempt_timeout=0.1)
        self.attempts = attempts
        self.handled: list[int] = []
        self.sent: list[list[tuple[str, dict, list]]] = []
        table = PartitionTable(4)  # not None: no refresh before the first attempt
        for pid in range(4):
            table.set_replicas(pid, ["member-a" if pid < 2 else "member-b"])
        self.table = table
        self.endpoints = {"member-a": "a", "member-b": "b"}

    def exchange(self, requests, timeout, replicas=1):
        self.sent.append([(endpoint, fields, frames) for endpoint, _, fields, frames
                          in requests])
        return self.attempts.pop(0)[:len(requests)]

    def refresh(self, prefer_master: bool = True) -> None:
        pass

    def run(self, op: str, pids: list[int]) -> None:
        self.invoke_partitions(op, pids, lambda group: ({}, []),
                               lambda group, header, frames: self.handled.extend(group))


def test_a_refusal_before_anything_was_applied_is_a_clean_refusal():
    invoker = ScriptedInvoker([[PASSIVE, PASSIVE]])
    with pytest.raises(ClusterStateError) as caught:
        invoker.run(p.PUT_ALL, [0, 2])
    assert not isinstance(caught.value, PartlyAppliedError)


def test_a_refusal_after_another_member_applied_its_part_is_not():
    invoker = ScriptedInvoker([[PASSIVE, OK]])
    with pytest.raises(PartlyAppliedError) as caught:
        invoker.run(p.PUT_ALL, [0, 2])
    assert isinstance(caught.value.refusal, ClusterStateError)
    assert "read the keys" in str(caught.value)


def test_a_refusal_after_an_earlier_attempt_went_unanswered_is_not():
    invoker = ScriptedInvoker([[None], [PASSIVE]])
    with pytest.raises(PartlyAppliedError):
        invoker.run(p.PUT, [1])


def test_a_refusal_after_an_earlier_attempt_applied_a_part_is_not():
    moved = ({"ok": False, "code": p.MIGRATING, "msg": "migrating"}, [])
    invoker = ScriptedInvoker([[OK, moved], [PASSIVE]])
    with pytest.raises(PartlyAppliedError):
        invoker.run(p.PUT_ALL, [0, 2])
    assert invoker.handled == [0]


def test_reads_are_refused_as_they_are():
    invoker = ScriptedInvoker([[None], [PASSIVE]])
    with pytest.raises(ClusterStateError) as caught:
        invoker.run(p.GET_ALL, [1])
    assert not isinstance(caught.value, PartlyAppliedError)


def test_a_first_attempt_made_by_invoke_key_counts_as_the_invocations_first():
    """invoke_key hands what its first attempt brought to invoke_partitions: a write that
    went unanswered there may have been applied, so a refusal after it is not clean."""
    invoker = ScriptedInvoker([[PASSIVE]])
    with pytest.raises(PartlyAppliedError):
        invoker.invoke_partitions(p.PUT, [1], lambda group: ({}, []),
                                  lambda group, header, frames: None,
                                  (time.monotonic() + 5.0, [[1]], [None]))
    assert invoker.attempts == [], "one attempt after the first, not two"
    invoker = ScriptedInvoker([])
    with pytest.raises(ClusterStateError) as caught:  # refused at once: nothing applied
        invoker.invoke_partitions(p.PUT, [1], lambda group: ({}, []),
                                  lambda group, header, frames: None,
                                  (time.monotonic() + 5.0, [[1]], [PASSIVE]))
    assert not isinstance(caught.value, PartlyAppliedError)


@pytest.mark.parametrize("indeterminate", [True, False])
def test_partitions_that_moved_away_after_they_were_applied_leave_the_write_indeterminate(
        indeterminate):
    """An owner that lost some partitions of a batch while their backups applied them answers
    them "wrong" and "indeterminate" (workers/map_service.py): if the invocation then runs out
    of time, they may have been applied, and the client says so."""
    moved = ({"ok": True, "wrong": [1], **({"indeterminate": True} if indeterminate else {})},
             [])
    migrating = ({"ok": False, "code": p.MIGRATING, "msg": "migrating"}, [])
    invoker = ScriptedInvoker([[moved], *([[migrating]] * 100)])
    invoker.invocation_timeout = 0.3
    with pytest.raises(IndeterminateOperationStateError if indeterminate
                       else OperationTimeoutError) as caught:
        invoker.run(p.PUT_ALL, [0, 1])
    assert invoker.handled == [0]
    assert not isinstance(caught.value, IndeterminateOperationStateError) or indeterminate


def test_invoke_keys_sends_each_owner_its_keys_and_retries_the_failed_partitions_keys():
    """A read of keys goes to each owner with its keys in their order and each key's
    partition; the keys of a partition that was refused go again (and only they), as
    invoke_partitions retries its partitions."""
    moved = ({"ok": True, "wrong": [3]}, [])
    invoker = ScriptedInvoker([[moved, OK], [OK]])  # b answers first: its 3 moved
    handled = []
    invoker.invoke_keys(p.GET_ALL, [2, 0, 3, 0, 1, 3], [b"k2", b"k0", b"k3", b"j0", b"k1",
                                                         b"j3"],
                        {"ns": "m"}, lambda group, header, frames: handled.append(group))
    first, second = invoker.sent
    assert [(endpoint, fields) for endpoint, fields, _ in first] == [
        ("b", {"ns": "m", "pids": [2, 3, 3]}), ("a", {"ns": "m", "pids": [0, 0, 1]})]
    assert [p.unpack_items(frames[0]) for _, _, frames in first] == [
        [b"k2", b"k3", b"j3"], [b"k0", b"j0", b"k1"]]
    assert [(endpoint, fields) for endpoint, fields, _ in second] == [
        ("b", {"ns": "m", "pids": [3, 3]})]
    assert p.unpack_items(second[0][2][0]) == [b"k3", b"j3"]
    # (A group of the first attempt names a partition once a key: get_all's handler does
    # not look at it, and building each group again without repeats cost microseconds.)
    assert sorted(map(sorted, handled)) == [[0, 0, 1], [2], [3]]
    invoker = ScriptedInvoker([[OK]])
    invoker.invoke_keys(p.GET_ALL, [1, 1, 1], [b"a", b"b", b"c"], {"ns": "m"},
                        lambda group, header, frames: None)
    [[(endpoint, fields, frames)]] = invoker.sent
    assert (endpoint, fields) == ("a", {"ns": "m", "pids": [1]})  # one id for all the keys
    assert p.unpack_items(frames[0]) == [b"a", b"b", b"c"]


def test_a_read_of_keys_that_runs_out_of_time_names_its_one_partition():
    """invoke_keys's first attempt names a partition once a key; when only that partition's
    keys go unanswered, the timeout names it (its keys are one partition, not one each)."""
    invoker = ScriptedInvoker([[None, OK]] + [[None]] * 100)  # a never answers, b does
    invoker.invocation_timeout = 0.3
    with pytest.raises(OperationTimeoutError) as raised:
        invoker.invoke_keys(p.GET_ALL, [1, 2, 1], [b"a", b"b", b"c"], {"ns": "m"},
                            lambda group, header, frames: None)
    assert raised.value.partition_id == 1
    assert [fields["pids"] for attempt in invoker.sent[1:] for _, fields, _ in attempt] \
        == [[1, 1]] * (len(invoker.sent) - 1)  # each retry asks for both of its keys
