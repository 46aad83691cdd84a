"""The compiled hot path (grid/compiled.py): a build compiles it, and a source edited since
the build, or SHMGRID_PURE_PYTHON, runs every compiled module from its source instead."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import psutil
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
    return compiled.read_record() is not None and not compiled.pure_python()


def test_a_build_compiles_every_hot_module() -> None:
    """``pip install -e .`` (the README's set-up, and CI's) runs the hot path compiled: in
    this process, and in a fresh one (a member's)."""
    if compiled.pure_python():
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
    """All compiled modules run from source, or none: all when the build recorded another
    source for any of them, or none, or with ``pure``."""
    record = {module: compiled.source_hash(compiled.source_path(module))
              for module in compiled.COMPILED_MODULES}
    everything = {module: compiled.source_path(module) for module in compiled.COMPILED_MODULES}
    assert compiled.sources_to_run(record) == {}
    assert compiled.sources_to_run(dict(record, **{"grid.link": "0" * 64})) == everything
    missing = {k: v for k, v in record.items() if k != "grid.protocol"}
    assert compiled.sources_to_run(missing) == everything
    assert compiled.sources_to_run(None) == everything
    assert compiled.sources_to_run(record, pure=True) == everything


@pytest.mark.parametrize("first", ["grid.link", "workers.member"])
def test_a_module_edited_since_the_build_runs_from_source(first: str) -> None:
    """The guard, installed before ``grid`` is imported with a record that says one source
    (the link's) changed, loads every source, also where a compiled module would import the
    link first (the member's loop: compiled modules import each other past import finders);
    the same child with the build's record loads the compiled ones, so the guard is what made
    the difference."""
    if not _built():
        pytest.skip("no compiled build to guard against (see test_a_build_...)")
    code = f"""
        import importlib, runpy, sys
        guard = runpy.run_path("grid/compiled.py")
        guard["install_guard"](record={{RECORD}})
        importlib.import_module({first!r})
        for module in guard["COMPILED_MODULES"]:
            print(module, sys.modules[module].__file__ if module in sys.modules
                  else importlib.import_module(module).__file__)
        """
    edited = dict(compiled.read_record(), **{"grid.link": "0" * 64})
    stale = _import_in_child(code.replace("{RECORD}", repr(edited)))
    assert all(origin.endswith(".py") for origin in stale[1::2]), stale
    fresh = _import_in_child(code.replace("{RECORD}", repr(compiled.read_record())))
    assert not any(origin.endswith(".py") for origin in fresh[1::2]), fresh


def _maps_compiled_code(pid: int) -> bool:
    """Whether a process has loaded the compiled modules' shared library (mypyc's
    ``<hash>__mypyc`` beside the packages), from its memory map."""
    return any(Path(mapping.path).name.split(".")[0].endswith("__mypyc")
               and Path(mapping.path).parent == ROOT
               for mapping in psutil.Process(pid).memory_maps())


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "source"])
def test_members_run_the_build_or_the_source_and_serve_either_way(cluster_factory, monkeypatch,
                                                                   pure):
    """Members started by ``shmgrid start`` run the compiled modules, or with
    SHMGRID_PURE_PYTHON=1 their sources (the compiled code not even loaded), and serve the
    same."""
    if pure:
        monkeypatch.setenv(compiled.PURE_ENV, "1")
    elif not _built():
        pytest.skip("no compiled build (see test_a_build_...)")
    else:
        monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    cluster = cluster_factory(members=2)
    with cluster.connect() as client:
        pids = [member.pid for member in client.cluster.members]
        assert [_maps_compiled_code(pid) for pid in pids] == [not pure] * len(pids)
        m = client.get_map("either-way")
        m.put_all({f"k{i}": bytes([i]) * 100 for i in range(200)})
        assert m.get_all([f"k{i}" for i in range(200)]) == {f"k{i}": bytes([i]) * 100
                                                            for i in range(200)}
        assert m.put("k1", b"new") == b"\x01" * 100 and m.get("k1") == b"new"
        assert m.remove("k2") == b"\x02" * 100 and m.get("k2") is None


@pytest.mark.parametrize("why", ["pure", "no mypyc"])
def test_an_install_that_compiles_nothing_removes_an_earlier_build(tmp_path: Path,
                                                                    why: str) -> None:
    """An install that compiles nothing (``SHMGRID_PURE_PYTHON=1``, or no mypyc) runs no
    build step, so ``setup.py`` removes what an earlier in-place build left: its record, the
    shared library and every compiled module, also of a module since taken out of the
    compiled set. Left in place, they loaded, and the editable install of such a tree maps
    only the packages, not the shared library: ``import grid.link`` failed."""
    (tmp_path / "grid").mkdir()
    (tmp_path / "workers").mkdir()
    for name in ("setup.py", "grid/compiled.py"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    planted = [tmp_path / f"39977ae0e400a45ff21a__mypyc{suffix}", tmp_path / f"grid/link{suffix}",
               tmp_path / f"grid/chain{suffix}", tmp_path / f"workers/member{suffix}",
               tmp_path / "grid" / compiled.RECORD_NAME]
    for path in planted:
        path.write_bytes(b"")
    env = {key: value for key, value in os.environ.items() if key != compiled.PURE_ENV}
    if why == "pure":
        env[compiled.PURE_ENV] = "1"
    else:  # mypyc cannot be imported
        (tmp_path / "mypyc").mkdir()
        (tmp_path / "mypyc" / "__init__.py").write_text("raise ImportError('no mypyc')\n")
        env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run([sys.executable, "setup.py", "--version"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert [path.name for path in planted if path.exists()] == []


def test_an_in_place_build_removes_what_an_earlier_one_compiled_and_no_longer_does(
        tmp_path: Path) -> None:
    """``pip install -e .`` builds in place; a module taken out of the compiled set since an
    earlier build would still load its compiled file (Python prefers it to the source, and
    no guard looks at a module outside the set), as would an old shared library. The build
    removes them and keeps what it compiles. A scratch tree whose compiled set is one small
    module stands for the project (the whole hot path takes a minute to compile)."""
    if importlib.util.find_spec("mypyc") is None:
        pytest.skip("mypyc is not installed (pip install -e '.[test]' installs it)")
    if shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) is None:
        pytest.skip("no C compiler: nothing compiles here, the project's hot path neither")
    (tmp_path / "grid").mkdir()
    (tmp_path / "workers").mkdir()
    (tmp_path / "grid" / "__init__.py").write_text("")
    (tmp_path / "grid" / "tiny.py").write_text("def double(n: int) -> int:\n    return 2 * n\n")
    (tmp_path / "setup.py").write_text((ROOT / "setup.py").read_text())
    source = (ROOT / "grid" / "compiled.py").read_text()
    start = source.index("COMPILED_MODULES = (")
    end = source.index(")\n", start) + 2
    (tmp_path / "grid" / "compiled.py").write_text(
        source[:start] + 'COMPILED_MODULES = ("grid.tiny",)\n' + source[end:])
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    stale = [tmp_path / f"39977ae0e400a45ff21a__mypyc{suffix}", tmp_path / f"grid/link{suffix}",
             tmp_path / f"workers/member{suffix}"]
    for path in stale:
        path.write_bytes(b"")
    env = {key: value for key, value in os.environ.items() if key != compiled.PURE_ENV}
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [path.name for path in stale if path.exists()] == []
    assert (tmp_path / "grid" / f"tiny{suffix}").exists()
    assert compiled.read_record(tmp_path) == {
        "grid.tiny": compiled.source_hash(tmp_path / "grid" / "tiny.py")}
    ran = subprocess.run([sys.executable, "-c", "import grid.tiny as t; print(t.__file__, "
                          "t.double(21))"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=30)
    assert ran.stdout.split() == [str(tmp_path / "grid" / f"tiny{suffix}"), "42"], ran.stderr
