"""The trees a benchmark compares: the working tree, and a git revision checked out into a
temporary worktree for as long as the comparison runs (removed after it, also on failure),
its hot path compiled as the working tree's is (grid/compiled.py)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def compared_trees(revision: str | None) -> Iterator[dict[str, Path]]:
    """``{"tree": the working tree}``, with ``revision``'s worktree first when one is given."""
    if revision is None:
        yield {"tree": ROOT}
        return
    with tempfile.TemporaryDirectory(prefix="shmgrid-base-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), revision], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            build(base)
            yield {revision: base, "tree": ROOT}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           capture_output=True)


def build(tree: Path) -> None:
    """Compile a checked-out revision's hot path in place, as ``pip install -e .`` does for
    the working tree, so that both sides run compiled (a revision older than the compiled
    build has no setup.py: it runs from source, and the output says so)."""
    if not (tree / "setup.py").exists():
        print(f"{tree.name}: no compiled build in this revision; it runs from source",
              file=sys.stderr)
        return
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=tree, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"building {tree}'s compiled modules failed:\n{done.stderr[-3000:]}")
