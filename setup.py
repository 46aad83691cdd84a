"""Builds shmgrid, compiling the hot path's modules with mypyc (grid/compiled.py says which
and why). Everything else about the package is in pyproject.toml.

The compiled modules are optional: with ``SHMGRID_PURE_PYTHON=1`` set for the install, or
where mypyc or a C compiler is missing, or any of them fails to compile, they all run from
source.
"""

import importlib.machinery
import os
import runpy
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
COMPILED = runpy.run_path(str(ROOT / "grid" / "compiled.py"))  # (the standard library only)
RECORD = ROOT / "grid" / COMPILED["RECORD_NAME"]


class BuildAllOrNone(build_ext):
    """Builds the compiled modules, and records their sources' hashes (which lets them run)
    only if every one was built: mypyc puts their code in one shared library beside a small
    module each, and a module without it would fail to import."""

    def run(self) -> None:
        RECORD.unlink(missing_ok=True)
        if self.inplace:
            # A module taken out of the compiled set would otherwise still load compiled.
            remove_compiled(keep={ext.name for ext in self.extensions})
        super().run()
        built = [Path(self.get_ext_fullpath(ext.name)) for ext in self.extensions]
        if all(path.exists() for path in built):
            COMPILED["write_record"](ROOT)
            if not self.inplace:  # a wheel: the record goes with the modules
                shutil.copy(RECORD, Path(self.build_lib) / "grid" / RECORD.name)
            return
        for path in built:
            path.unlink(missing_ok=True)
        print("shmgrid: the hot path did not compile; it runs from source", file=sys.stderr)


def remove_compiled(keep: set[str]) -> None:
    """Remove the compiled modules an earlier in-place build left in this tree, but those
    named in ``keep``: Python prefers a compiled module to the source beside it, no guard
    looks at a module outside the compiled set, and its shared library may be gone or not
    importable (an editable install that compiles nothing maps only the packages)."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES  # the most specific first
    for path in [*ROOT.glob("*.so"), *ROOT.glob("grid/**/*.so"),
                 *ROOT.glob("workers/**/*.so")]:
        suffix = next((s for s in suffixes if path.name.endswith(s)), None)
        if suffix is None:
            continue
        module = ".".join([*path.parent.relative_to(ROOT).parts, path.name[:-len(suffix)]])
        if module not in keep:
            path.unlink()


def no_extensions() -> list:
    """Nothing to compile, so no build step will run: what an earlier build compiled in this
    tree goes now, or it would still load."""
    RECORD.unlink(missing_ok=True)
    remove_compiled(keep=set())
    return []


def compiled_extensions() -> list:
    if os.environ.get(COMPILED["PURE_ENV"], "") not in ("", "0"):
        return no_extensions()
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("shmgrid: mypyc is not installed; the hot path runs from source", file=sys.stderr)
        return no_extensions()
    # Only the compiled modules are type-checked, and what they import is taken as typed
    # where it is typed: the build must not depend on which stubs the machine has.
    extensions = mypycify(["--ignore-missing-imports", "--follow-imports=silent",
                           *(str(COMPILED["source_path"](module, Path(".")))
                             for module in COMPILED["COMPILED_MODULES"])], opt_level="3")
    for extension in extensions:
        extension.optional = True  # a failed compile leaves the source to run
    return extensions


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": BuildAllOrNone})
