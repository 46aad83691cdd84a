"""Options of the `shmgrid` data source, parsed once into a frozen value.

Spark hands every option over as a string in a case-insensitive dict. This module turns them
into typed fields and says, naming the option, what is wrong with a bad one. It imports
neither pyspark nor pyarrow, so it is tested in plain Python.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SourceOptions", "parse_options", "FORMAT_NAME"]

FORMAT_NAME = "shmgrid"

batch_size_default = 50_000
batch_size_max = 1_000_000
sample_size_default = 1_000
sample_size_max = 100_000
num_partitions_max = 10_000
# Each read task costs about 40 ms of Spark's Python data source round trips: 2 a core
# read 500,000 rows 1.2-1.4x as fast as 3 a core (tools/bench_spark.py), still balanced.
tasks_per_core_default = 2
staging_ttl_s_default = 6 * 3600.0
invocation_timeout_s_default = 60.0

# Every option the source reads; anything else is ignored by Spark convention, but a misspelt
# option of ours is refused (see `parse_options`) because it would silently do nothing.
known_option_names = frozenset(
    {
        "map",
        "address",
        "cluster.name",
        "registry.path",
        "invocation.timeout",
        "key.column",
        "value.column",
        "batch.size",
        "sample.size",
        "num.partitions",
        "filter.pushdown",
        "local.reads",
        "staging.ttl",
        "path",  # .load(path) / .save(path): accepted as the map name
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceOptions:
    """The parsed options of one read or write."""

    map_name: str
    address: str | None = None
    cluster_name: str | None = None
    registry_path: str | None = None
    invocation_timeout_s: float = invocation_timeout_s_default
    key_column: str = "key"
    value_column: str | None = None
    batch_size: int = batch_size_default
    sample_size: int = sample_size_default
    num_partitions: int | None = None
    filter_pushdown: str = "auto"
    staging_ttl_s: float = staging_ttl_s_default
    local_reads: bool = True

    def connect_args(self) -> tuple[str | None, str | None, str | None, float]:
        """The arguments that identify a cluster connection (the client cache key)."""
        return (self.address, self.cluster_name, self.registry_path, self.invocation_timeout_s)


def _int_option(options: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"shmgrid option {name!r} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"shmgrid option {name!r} must be between {low} and {high}, got {value}")
    return value


def _float_option(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ValueError(f"shmgrid option {name!r} must be a number, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"shmgrid option {name!r} must be positive, got {value}")
    return value


def _str_option(options: Mapping[str, str], name: str) -> str | None:
    raw = options.get(name)
    if raw is None:
        return None
    value = str(raw).strip()
    return value or None


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Parse Spark's option dict (keys already lower-cased by Spark, or not: we lower them).

    Raises ValueError naming the option for a missing map, a non-numeric batch size, an
    unknown shmgrid-looking option, and so on.
    """
    lowered = {str(k).lower(): v for k, v in options.items()}
    unknown = sorted(
        k for k in lowered if k not in known_option_names and k.split(".")[0] in _our_prefixes
    )
    if unknown:
        raise ValueError(
            f"unknown shmgrid option(s) {unknown}; known options: {sorted(known_option_names)}"
        )
    map_name = _str_option(lowered, "map") or _str_option(lowered, "path")
    if map_name is None:
        raise ValueError(
            "shmgrid: the 'map' option is missing; say which map to use, for example "
            "spark.read.format('shmgrid').option('map', 'orders').load()"
        )
    key_column = _str_option(lowered, "key.column") or "key"
    value_column = _str_option(lowered, "value.column")
    if value_column is not None and value_column.lower() == key_column.lower():
        raise ValueError(
            f"shmgrid options 'key.column' and 'value.column' name the same column {key_column!r}"
        )
    pushdown = (_str_option(lowered, "filter.pushdown") or "auto").lower()
    if pushdown not in ("auto", "true", "false"):
        raise ValueError(
            f"shmgrid option 'filter.pushdown' must be auto, true or false, got {pushdown!r}"
        )
    local_reads = (_str_option(lowered, "local.reads") or "true").lower()
    if local_reads not in ("true", "false"):
        raise ValueError(
            f"shmgrid option 'local.reads' must be true or false, got {local_reads!r}"
        )
    num_partitions = None
    if _str_option(lowered, "num.partitions") is not None:
        num_partitions = _int_option(lowered, "num.partitions", 1, 1, num_partitions_max)
    return SourceOptions(
        map_name=map_name,
        address=_str_option(lowered, "address"),
        cluster_name=_str_option(lowered, "cluster.name"),
        registry_path=_str_option(lowered, "registry.path"),
        invocation_timeout_s=_float_option(
            lowered, "invocation.timeout", invocation_timeout_s_default
        ),
        key_column=key_column,
        value_column=value_column,
        batch_size=_int_option(lowered, "batch.size", batch_size_default, 1, batch_size_max),
        sample_size=_int_option(lowered, "sample.size", sample_size_default, 1, sample_size_max),
        num_partitions=num_partitions,
        filter_pushdown=pushdown,
        staging_ttl_s=_float_option(lowered, "staging.ttl", staging_ttl_s_default),
        local_reads=local_reads == "true",
    )


# Option-name prefixes that belong to us; a misspelling under them is refused.
_our_prefixes = frozenset(name.split(".")[0] for name in known_option_names)


def default_task_count(owner_count: int, cpu_count: int | None = None) -> int:
    """About `tasks_per_core_default` read tasks per core, at least one per owning member.

    The Python data source API does not tell the planner how many executor cores there are;
    the grid is a single-host store, so the host's cores stand in for them.
    """
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    assert cores >= 1
    return max(owner_count, tasks_per_core_default * cores)
