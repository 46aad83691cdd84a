"""The bytecode counter that tools/count_bytecodes.py reads members with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from grid.bytecode_count import BytecodeCounter, count_on_signals, read_counts
from grid.compiled import PURE_ENV

ROOT = Path(__file__).resolve().parent.parent


def loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def test_counts_grow_with_the_work_and_stop_when_stopped():
    counter = BytecodeCounter()
    counter.start()
    loop(10)
    counter.stop()
    ten = sum(n for name, n in counter.counts.items() if name.startswith("loop "))
    counter.counts.clear()
    counter.start()
    loop(110)
    counter.stop()
    hundred_ten = sum(n for name, n in counter.counts.items() if name.startswith("loop "))
    assert hundred_ten > ten > 0
    # Each more turn of the loop runs the same few bytecodes.
    assert (hundred_ten - ten) % 100 == 0
    loop(1000)
    assert sum(n for name, n in counter.counts.items() if name.startswith("loop ")) \
        == hundred_ten


def test_signals_start_and_stop_counting_and_write_the_counts(tmp_path):
    old = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2)
    try:
        count_on_signals(str(tmp_path))
        os.kill(os.getpid(), signal.SIGUSR2)
        loop(50)
        os.kill(os.getpid(), signal.SIGUSR1)
        loop(5000)  # after the stop: not counted
    finally:
        signal.signal(signal.SIGUSR1, old[0])
        signal.signal(signal.SIGUSR2, old[1])
        sys.settrace(None)
    counts = read_counts(tmp_path / f"bytecodes-{os.getpid()}.txt")
    looped = [n for name, n in counts.items() if name.startswith("loop (")]
    assert looped and 50 < looped[0] < 1000


@pytest.mark.timeout(120)
def test_the_tool_counts_with_a_compiled_build_only_where_there_is_one():
    """``--compiled`` counts the Python left around the working tree's compiled build: a
    revision's worktree has no build, and a run from source would count something else."""
    tool = [sys.executable, str(ROOT / "tools" / "count_bytecodes.py"), "get", "--compiled"]
    with_base = subprocess.run([*tool, "--base", "HEAD"], capture_output=True, text=True,
                               timeout=60)
    assert with_base.returncode == 2 and "leave out --base" in with_base.stderr
    from_source = subprocess.run(tool, capture_output=True, text=True, timeout=60,
                                 env={**os.environ, PURE_ENV: "1"})
    assert from_source.returncode == 2 and "needs the compiled build" in from_source.stderr
