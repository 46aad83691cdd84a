"""Builds shmgrid, compiling the hot path's modules with mypyc (grid/compiled.py says which
and why). Everything else about the package is in pyproject.toml.

The compiled modules are optional: with ``SHMGRID_PURE_PYTHON=1`` set for the install, or
where mypyc or a C compiler is missing, the same modules run from source.
"""

import os
import runpy
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def compiled_extensions() -> list:
    if os.environ.get("SHMGRID_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("shmgrid: mypyc is not installed; the hot path runs from source", file=sys.stderr)
        return []
    compiled = runpy.run_path(str(ROOT / "grid" / "compiled.py"))  # (the standard library only)
    compiled["write_record"](ROOT)
    # Only the compiled modules are type-checked, and what they import is taken as typed
    # where it is typed: the build must not depend on which stubs the machine has.
    extensions = mypycify(["--ignore-missing-imports", "--follow-imports=silent",
                           *(str(compiled["source_path"](module, Path(".")))
                             for module in compiled["COMPILED_MODULES"])], opt_level="3")
    for extension in extensions:
        extension.optional = True  # a failed compile leaves the source to run
    return extensions


setup(ext_modules=compiled_extensions())
