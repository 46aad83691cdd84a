"""The compiled hot path (grid/compiled.py): a build compiles it, and a source edited since
the build, or SHMGRID_PURE_PYTHON, runs the source instead of the stale compiled module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from grid import compiled

pytestmark = pytest.mark.timeout(60)

ROOT = compiled.ROOT


def _import_in_child(code: str, **env: str) -> list[str]:
    """Run ``code`` in a fresh interpreter (cwd: the project); its output's lines."""
    child_env = {key: value for key, value in os.environ.items() if key != compiled.PURE_ENV}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          env={**child_env, **env}, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _origins(**env: str) -> dict[str, str]:
    lines = _import_in_child(f"""
        import importlib
        for module in {compiled.COMPILED_MODULES!r}:
            print(module, importlib.import_module(module).__file__)
        """, **env)
    return dict(zip(lines[0::2], lines[1::2], strict=True))


def _built() -> bool:
    return compiled.read_record() is not None and not compiled._pure()


def test_a_build_compiles_every_hot_module() -> None:
    """``pip install -e .`` (the README's set-up, and CI's) runs the hot path compiled: in
    this process, and in a fresh one (a member's)."""
    if compiled._pure():
        pytest.skip(f"{compiled.PURE_ENV} is set: the hot path runs from source on purpose")
    assert compiled.read_record() is not None, \
        "no compiled build (grid/_compiled.json is missing): pip install -e . makes one"
    assert set(compiled.status().values()) == {"compiled"}, compiled.summary()
    origins = _origins()
    assert not [o for o in origins.values() if o.endswith(".py")], origins


def test_pure_python_runs_every_hot_module_from_source() -> None:
    origins = _origins(**{compiled.PURE_ENV: "1"})
    assert sorted(origins) == sorted(compiled.COMPILED_MODULES)
    assert all(origin.endswith(".py") for origin in origins.values()), origins


def test_which_sources_run_follows_the_record() -> None:
    """A module runs from source when the build recorded another source, or none."""
    record = {module: compiled.source_hash(compiled.source_path(module))
              for module in compiled.COMPILED_MODULES}
    assert compiled.sources_to_run(record) == {}
    edited = dict(record, **{"grid.link": "0" * 64})
    assert compiled.sources_to_run(edited) == {"grid.link": compiled.source_path("grid.link")}
    missing = {k: v for k, v in record.items() if k != "grid.protocol"}
    assert list(compiled.sources_to_run(missing)) == ["grid.protocol"]
    assert list(compiled.sources_to_run(None)) == list(compiled.COMPILED_MODULES)
    assert list(compiled.sources_to_run(record, pure=True)) == list(compiled.COMPILED_MODULES)


def test_a_module_edited_since_the_build_runs_from_source() -> None:
    """The guard, installed before ``grid`` is imported with a record that says every source
    changed, loads each source; the same child with the build's record loads the compiled
    ones (so the guard is what made the difference)."""
    if not _built():
        pytest.skip("no compiled build to guard against (see test_a_build_...)")
    code = """
        import importlib, runpy
        guard = runpy.run_path("grid/compiled.py")
        guard["install_guard"](record={RECORD})
        for module in guard["COMPILED_MODULES"]:
            print(module, importlib.import_module(module).__file__)
        """
    stale = _import_in_child(code.replace(
        "{RECORD}", repr(dict.fromkeys(compiled.COMPILED_MODULES, "0" * 64))))
    assert all(origin.endswith(".py") for origin in stale[1::2]), stale
    fresh = _import_in_child(code.replace("{RECORD}", repr(compiled.read_record())))
    assert not any(origin.endswith(".py") for origin in fresh[1::2]), fresh
