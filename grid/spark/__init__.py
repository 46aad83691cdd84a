"""PySpark connector: read grid maps as DataFrames and write DataFrames into maps.

`import grid.spark` is cheap and imports neither pyspark nor pyarrow; the data source class is
loaded on first use. The format is also registered without any call when PySpark discovers
the `pyspark_shmgrid` module (see docs/spark.md).

    import grid.spark
    grid.spark.register(spark)
    df = spark.read.format("shmgrid").option("map", "orders").load()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register", "ShmgridDataSource", "FORMAT_NAME"]

FORMAT_NAME = "shmgrid"


def register(spark: SparkSession) -> None:
    """Register the `shmgrid` format with this session (registration is per session)."""
    from grid.spark.source import ShmgridDataSource

    spark.dataSource.register(ShmgridDataSource)


def __getattr__(name: str) -> Any:
    if name == "ShmgridDataSource":
        from grid.spark.source import ShmgridDataSource

        return ShmgridDataSource
    raise AttributeError(f"module 'grid.spark' has no attribute {name!r}")
