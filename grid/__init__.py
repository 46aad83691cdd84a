"""shmgrid: an in-memory data grid for one host.

    import grid
    with grid.connect() as client:
        orders = client.get_map("orders")
        orders.put("o1", {"qty": 3})
"""

from grid.client.client import Client, connect
from grid.config import GridConfig
from grid.errors import GridError

__all__ = ["Client", "GridConfig", "GridError", "connect"]
__version__ = "0.1.0"
