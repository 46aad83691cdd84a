"""``shmgrid dashboard``: a live web view of a local cluster (grid/dashboard/server.py)."""
