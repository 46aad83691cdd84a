"""The simulation's record check sees what its watches note: every method of the record
store and of the invocation records is a watched rewrite or known to change nothing that is
not watched (tests/cluster/sim.py)."""

from __future__ import annotations

import inspect

import pytest

from grid.cluster.invocations import InvocationRecords
from tests.cluster import sim
from workers.record_store import RecordStore

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("cls", "rewrites", "others"), [
    (RecordStore, sim.STORE_REWRITES, sim.STORE_UNWATCHED),
    (InvocationRecords, sim.RECORDS_REWRITES, sim.RECORDS_UNWATCHED),
], ids=["record store", "invocation records"])
def test_every_way_to_change_a_partition_is_watched_by_the_record_check(cls, rewrites, others):
    """The record check sees only the changes that the simulation's watches note: a method
    of the record store or the invocation records must be a watched rewrite or known to
    change nothing unwatched (the private helpers run inside those), or the check would miss
    what it does."""
    # (Compiled, a method is a routine and a property a getset descriptor that is none of
    # the class's data attributes.)
    attributes = set(getattr(cls, "__mypyc_attrs__", ()))
    methods = {name for name, value in vars(cls).items() if not name.startswith("__") and
               (inspect.isroutine(value) or isinstance(value, property)
                or inspect.isgetsetdescriptor(value) and name not in attributes)}
    public = {name for name in methods if not name.startswith("_")}
    assert public - rewrites - others == set(), "classify it in tests/cluster/sim.py"
    assert (rewrites | others) - methods == set(), "gone from the class: drop it there"
    assert not rewrites & others
