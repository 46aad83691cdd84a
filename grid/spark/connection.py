"""One grid client per Python worker process, reused across Spark tasks.

Readers and writers are pickled to the executors, so they cannot hold a live client (it owns
sockets and locks). PySpark reuses its Python workers across tasks and jobs, so a module-level
cache keyed by the connection options pays for the connection once per worker.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Callable
from typing import Any

from grid.spark.options import SourceOptions

__all__ = ["client_for", "drop_client", "close_all_clients", "factory_env_var"]

# For tests and embedding: "module:callable", called with the SourceOptions instead of
# grid.connect. Workers inherit the environment of the process that started Spark.
factory_env_var = "SHMGRID_SPARK_CLIENT_FACTORY"

_lock = threading.Lock()
_clients: dict[tuple, Any] = {}
_clients_pid = os.getpid()


def _default_factory(options: SourceOptions) -> Any:
    import grid

    return grid.connect(
        options.address,
        cluster_name=options.cluster_name,
        registry_path=options.registry_path,
        invocation_timeout=options.invocation_timeout_s,
    )


def _factory() -> Callable[[SourceOptions], Any]:
    spec = os.environ.get(factory_env_var, "").strip()
    if not spec:
        return _default_factory
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{factory_env_var} must look like 'module:callable', got {spec!r}")
    return getattr(importlib.import_module(module_name), attribute)


def client_for(options: SourceOptions) -> Any:
    """The cached client for these connection options, connecting on first use.

    A forked process does not inherit its parent's clients (their sockets belong to the
    parent); it starts with an empty cache.
    """
    global _clients_pid
    cache_key = (os.environ.get(factory_env_var, ""), *options.connect_args())
    with _lock:
        if _clients_pid != os.getpid():
            _clients.clear()
            _clients_pid = os.getpid()
        client = _clients.get(cache_key)
        if client is None:
            client = _factory()(options)
            _clients[cache_key] = client
        return client


def drop_client(options: SourceOptions) -> None:
    """Forget (and close) the cached client, after an error that may have broken it."""
    cache_key = (os.environ.get(factory_env_var, ""), *options.connect_args())
    with _lock:
        client = _clients.pop(cache_key, None) if _clients_pid == os.getpid() else None
    if client is not None:
        # Closing a broken client must not hide the error that made us drop it.
        with contextlib.suppress(Exception):
            client.close()


def close_all_clients() -> None:
    """Close every cached client of this process (tests; a long-lived driver before exit)."""
    with _lock:
        clients = list(_clients.values()) if _clients_pid == os.getpid() else []
        _clients.clear()
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()
