"""Keep the full garbage collection PySpark runs after every task cheap in our workers.

PySpark's daemon forks the Python workers and reuses them, and after every task a worker
runs a full ``gc.collect()`` (pyspark/daemon.py). A worker that imported pyspark, pyarrow,
numpy and grid tracks about 80,000 objects (modules, functions, classes, our client), and a
full collection walks them all: 18-30 ms a task, half of a read worker's CPU on a small map
(py-spy). They live as long as the worker, so we move them out of the collector's sight
(``gc.freeze``): after our imports, and at the start of a later task whenever the oldest
generation holds more than ``UNFROZEN_MAX`` objects again (modules imported lazily during the
first tasks). Only in a worker forked by PySpark's daemon: a user's process (a driver, a
test) keeps its collector as it was.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["UNFROZEN_MAX", "freeze_in_pyspark_worker", "in_pyspark_worker"]

# Objects of the oldest generation that the per-task collection may walk (about 0.45 µs
# each) before we freeze them; counting them costs about 0.06 µs each.
UNFROZEN_MAX = 10_000


def in_pyspark_worker() -> bool:
    """True in a process forked by PySpark's daemon (its ``__main__`` is ``pyspark.daemon``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == "pyspark.daemon"


def freeze_in_pyspark_worker(unfrozen_max: int = UNFROZEN_MAX) -> bool:
    """In a PySpark worker whose oldest generation holds more than ``unfrozen_max`` objects,
    freeze every object tracked so far; True if it did.

    Frozen objects are still freed when their last reference goes; what a freeze costs is
    that a reference cycle already garbage, or becoming garbage later, is never collected.
    Freezes are rare (the long-lived objects grow only while modules are still imported), so
    that stays a few objects of the tasks that were running then.
    """
    if not in_pyspark_worker() or len(gc.get_objects(generation=2)) <= unfrozen_max:
        return False
    gc.freeze()
    return True
