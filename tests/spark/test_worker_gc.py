"""The freeze of long-lived objects in PySpark's workers (grid/spark/worker_gc.py): only in a
process forked by PySpark's daemon, and only once the oldest generation has grown."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

from grid.spark.worker_gc import UNFROZEN_MAX, freeze_in_pyspark_worker, in_pyspark_worker

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_that_is_not_a_pyspark_worker_keeps_its_collector() -> None:
    frozen = gc.get_freeze_count()
    keep = [[i] for i in range(2 * UNFROZEN_MAX)]
    gc.collect()  # the lists are now in the oldest generation
    assert not in_pyspark_worker()
    assert freeze_in_pyspark_worker() is False
    assert gc.get_freeze_count() == frozen
    del keep


def test_a_pyspark_worker_freezes_at_import_and_again_once_the_oldest_generation_grew() -> None:
    # A process whose __main__ is pyspark.daemon, as the workers PySpark's daemon forks.
    script = textwrap.dedent(f"""
        import gc, importlib.machinery, sys
        sys.path.insert(0, {str(ROOT)!r})
        sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec("pyspark.daemon", None)
        from grid.spark.worker_gc import UNFROZEN_MAX, freeze_in_pyspark_worker, in_pyspark_worker
        assert in_pyspark_worker()
        import grid.spark.source  # its import freezes what the imports made
        at_import = gc.get_freeze_count()
        assert at_import > UNFROZEN_MAX, at_import
        assert freeze_in_pyspark_worker() is False  # nothing new since
        assert gc.get_freeze_count() == at_import
        few = [[i] for i in range(UNFROZEN_MAX // 2)]
        gc.collect()
        assert freeze_in_pyspark_worker() is False, "under the limit: not frozen"
        many = [[i] for i in range(UNFROZEN_MAX)]
        gc.collect()
        assert freeze_in_pyspark_worker() is True
        assert gc.get_freeze_count() >= at_import + len(few) + len(many)
        assert len(gc.get_objects(generation=2)) == 0
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
