"""shmgrid: an in-memory data grid for one host.

    import grid
    with grid.connect() as client:
        orders = client.get_map("orders")
        orders.put("o1", {"qty": 3})

The public names below are imported lazily (PEP 562), so that importing the pure core
(`grid.partition`, `grid.cluster`) does not load the client and its dependencies (zmq, msgpack,
psutil). `tests/test_imports.py` checks this.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from grid.compiled import install_guard

install_guard()  # a compiled module whose source changed since the build runs from source

if TYPE_CHECKING:
    from grid.client.client import Client, connect
    from grid.config import GridConfig
    from grid.errors import GridError

__all__ = ["Client", "GridConfig", "GridError", "connect"]
__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "Client": "grid.client.client",
    "connect": "grid.client.client",
    "GridConfig": "grid.config",
    "GridError": "grid.errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
