"""The trees a benchmark compares: the working tree, and a git revision checked out into a
temporary worktree for as long as the comparison runs (removed after it, also on failure)."""

from __future__ import annotations

import subprocess
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
            yield {revision: base, "tree": ROOT}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           capture_output=True)
