"""The member process's modules. Importing ``grid`` first installs its guard against a stale
compiled build (grid/compiled.py) before any compiled module here is found."""

import grid  # noqa: F401
