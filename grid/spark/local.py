"""A quiet local SparkSession on loopback, for tests, tools and local development.

It applies the settings shared/reference/pyspark-datasource.md found necessary on one host:
workers run this interpreter (PYSPARK_PYTHON), everything binds to 127.0.0.1, log4j only
reports errors, no UI, and the project root is on the workers' path so they import `grid`
even when shmgrid is not installed. `stop_local_session` also ends the JVM, which
`SparkSession.stop()` leaves running until the Python process exits.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session", "stop_local_session"]

_quiet_log4j = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.nativeloader.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeloader.level = error
"""

jvm_stop_timeout_s = 30.0
_project_root = str(Path(__file__).resolve().parents[2])


def _log4j_file() -> str:
    path = Path(tempfile.gettempdir()) / "shmgrid-spark-log4j2-quiet.properties"
    if not path.exists() or path.read_text() != _quiet_log4j:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_quiet_log4j)
        tmp.replace(path)
    return str(path)


def local_session(
    app_name: str = "shmgrid",
    master: str = "local[2]",
    *,
    driver_memory: str = "2g",
    filter_pushdown: bool = True,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Build (or get) a local session with the loopback, interpreter and quiet settings.

    `master` "local[N,F]" lets a failed task be retried F-1 times, as on a cluster.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    python_path = os.environ.get("PYTHONPATH", "")
    if _project_root not in python_path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_project_root, python_path) if p)

    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_log4j_file()}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.python.filterPushdown.enabled", str(filter_pushdown).lower())
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_local_session(spark: SparkSession | None) -> None:
    """Stop the session and end its JVM (closing its stdin makes it exit), waiting for it."""
    from pyspark import SparkContext

    if spark is not None:
        spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    # The JVM may already be gone; it is ended below in any case.
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=jvm_stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=jvm_stop_timeout_s)
    SparkContext._gateway = None
    SparkContext._jvm = None
