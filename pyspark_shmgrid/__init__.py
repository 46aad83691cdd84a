"""Auto-registration of the `shmgrid` format with PySpark 4.

PySpark's data source lookup (pyspark/sql/worker/lookup_data_sources.py) imports every
top-level module on the Python path whose name starts with `pyspark_` and registers its
`DefaultSource` under `DefaultSource.name()`, here "shmgrid". Installing shmgrid with the
`spark` extra is therefore enough: `spark.read.format("shmgrid")` works without a
`grid.spark.register(spark)` call.
"""

from grid.spark.source import ShmgridDataSource as DefaultSource

__all__ = ["DefaultSource"]
