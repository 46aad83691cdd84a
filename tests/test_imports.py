"""The pure core imports alone: `grid.partition` and `grid.cluster` (and every module under them)
load nothing but the stdlib, mmh3 and each other, while `import grid` still offers the client API.

Each check runs in a fresh interpreter, since this test process has long since imported the
client and its dependencies.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Third-party packages that the client, the members, the CLI or the Spark connector use, and
# that the pure core must not pull in.
FORBIDDEN = ["zmq", "msgpack", "psutil", "multiprocess", "rich", "pyarrow", "pyspark"]

_IMPORT_CORE = """
import importlib, json, pkgutil, sys
import grid.partition, grid.cluster
imported = []
for package in (grid.partition, grid.cluster):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
        imported.append(info.name)
print(json.dumps({"imported": imported, "modules": sorted(sys.modules)}))
"""

_IMPORT_API = """
import grid
print(grid.connect.__module__, grid.Client.__name__, grid.GridConfig.__name__,
      grid.GridError.__name__)
from grid import Client, GridConfig, GridError, connect
assert issubclass(GridError, Exception)
assert connect is grid.connect and Client is grid.Client and GridConfig is grid.GridConfig
try:
    grid.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError("grid.no_such_name resolved")
"""


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_core_packages_import_without_client_dependencies():
    result = json.loads(_run(_IMPORT_CORE))
    # the walk found the modules (so an empty walk cannot pass the check vacuously)
    assert "grid.partition.table" in result["imported"]
    assert "grid.cluster.membership" in result["imported"]
    loaded = {name.split(".")[0] for name in result["modules"]}
    assert sorted(loaded & set(FORBIDDEN)) == []
    # nor any other part of grid outside the core but the compiled build's guard (the
    # standard library only), which `import grid` installs
    outside = [
        name
        for name in result["modules"]
        if name.startswith("grid.")
        and not name.startswith(("grid.partition", "grid.cluster"))
        and name != "grid.compiled"
    ]
    assert outside == []


def test_public_api_still_resolves_from_grid():
    out = _run(_IMPORT_API).split()
    assert out == ["grid.client.client", "Client", "GridConfig", "GridError"]
