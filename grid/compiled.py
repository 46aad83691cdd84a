"""The hot path compiled: which modules ``setup.py`` builds with mypyc, and the guard that
keeps a stale build from running.

A message through a member or the client spends much of its time in a few modules: the
member's loop, the link's framing, the protocol's headers, the busy-poll policy, the member's
poller, a backup's parts and (for a map published for local reads) the shared index's
loops. mypyc compiles them to C extensions from the same source (no second implementation;
the source stays the reference, and runs as it is where no build was made).
``tools/bench_ab.py HEAD --pure-base`` measures what it gives.

An editable install (``pip install -e .``) puts each compiled module next to its source, and
Python prefers the compiled one. A source edited since the build would then not run: so the
build records each module's source hash (``_compiled.json``), and ``install_guard``, run
when ``grid`` (or ``workers``) is first imported, sends the imports of every compiled module
to its source once any source changed (all or none: the compiled modules import each other
inside their shared library, past the guard). ``SHMGRID_PURE_PYTHON=1`` does the same (for
comparisons, and for debugging with the source's tracebacks). ``pip install -e .`` rebuilds.

This file is read by ``setup.py`` before anything is installed: it imports the standard
library only.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

# The modules compiled, as module names; each one's source is its path under the project.
# The map service, the record store and the invocation records are on every write's path:
# the simulation watches them, and its broken-protocol tests break them, through Python
# subclasses (a compiled class's methods cannot be replaced, but it may allow subclasses).
# Those tests also replace the reply order's tickets' readiness and the chain's rules
# (grid/cluster/reply_order.py, chain.py), which stay Python: compiled code would call them
# directly. The member's request dispatch (workers/node.py) stays Python: the simulation's
# nodes derive from it, and compiled as a plain class it ran no faster. So does the shared
# index of local reads (workers/local_reads.py, whose methods those tests replace); its probe
# loops are compiled apart (workers/shared_table.py).
COMPILED_MODULES = (
    "grid.link",
    "grid.protocol",
    "grid.busy_poll",
    "workers.poller",
    "workers.backup_parts",
    "workers.member",
    "workers.map_service",
    "workers.record_store",
    "workers.shared_table",
    "grid.cluster.invocations",
    "grid.cluster.replication",
)
RECORD_NAME = "_compiled.json"  # beside this file: {module: sha256 of its source at build}
PURE_ENV = "SHMGRID_PURE_PYTHON"
ROOT = Path(__file__).resolve().parent.parent


def source_path(module: str, root: Path = ROOT) -> Path:
    """Where ``module``'s source lies under the project (or installed) root."""
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_record(root: Path = ROOT) -> dict[str, str]:
    """Record the compiled modules' source hashes, as a build compiles them."""
    record = {module: source_hash(source_path(module, root)) for module in COMPILED_MODULES}
    (root / "grid" / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n")
    return record


def read_record(root: Path = ROOT) -> dict[str, str] | None:
    """The hashes the last build recorded, or None where no build compiled anything."""
    try:
        return json.loads((root / "grid" / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None


def sources_to_run(record: dict[str, str] | None, root: Path = ROOT,
                   pure: bool = False) -> dict[str, Path]:
    """The compiled modules that must run from source: all of them, or none. A compiled
    module imports the others from their shared library, past any import finder, so one
    changed source would still run compiled wherever a compiled module imports it. All run
    from source when any source is not the one compiled (edited since, or no record of a
    build), and with ``pure``."""
    sources = {module: source_path(module, root) for module in COMPILED_MODULES}
    sources = {module: path for module, path in sources.items() if path.exists()}
    if pure or record is None or any(record.get(module) != source_hash(path)
                                     for module, path in sources.items()):
        return sources
    return {}


class SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the given modules' sources, ahead of the compiled modules beside them."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(self, name: str, path: Any, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(name)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(name, source)


_guard: SourceFirst | None = None


def pure_python() -> bool:
    """Whether ``SHMGRID_PURE_PYTHON`` asks for every compiled module to run from source."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def install_guard(root: Path = ROOT, record: dict[str, str] | None = None) -> SourceFirst:
    """Once per process: run from source every compiled module that must (``sources_to_run``).
    The record defaults to the build's."""
    global _guard
    if _guard is None:
        _guard = SourceFirst(sources_to_run(record if record is not None else read_record(root),
                                            root, pure_python()))
        sys.meta_path.insert(0, _guard)
    return _guard


def status() -> dict[str, str]:
    """Each compiled module's state in this process: "compiled", "changed" (its source
    changed since the build: every compiled module then runs from source, and ``pip install
    -e .`` rebuilds), or "source" (no build, ``SHMGRID_PURE_PYTHON``, or another module
    changed). Imports them."""
    record = read_record() or {}
    out = {}
    for module in COMPILED_MODULES:
        origin = importlib.import_module(module).__file__ or ""
        if not origin.endswith(".py"):
            out[module] = "compiled"
        elif module in record and record[module] != source_hash(Path(origin)):
            out[module] = "changed"
        else:
            out[module] = "source"
    return out


def summary() -> str:
    """One line for benchmark output: how much of the hot path runs compiled."""
    states = status()
    compiled = sum(state == "compiled" for state in states.values())
    changed = [module for module, state in states.items() if state == "changed"]
    line = f"hot path: {compiled} of {len(states)} modules compiled"
    if changed:
        line += (f" ({', '.join(changed)} changed since the build, so all run from source: "
                 "pip install -e . rebuilds)")
    elif not compiled:
        line += (f" ({PURE_ENV} is set)" if pure_python()
                 else " (no compiled build: pip install -e . makes one)")
    return line
