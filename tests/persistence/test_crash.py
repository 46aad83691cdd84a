"""Crash test: a child writing with fsync="always" is SIGKILLed at a random moment; recovery
must hold every record the child saw durable, and be exactly some prefix of its history."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from persistence import LogStore
from tests.persistence.crash_child import history, thread_count
from tests.persistence.helpers import Model, recovered

ROOT = Path(__file__).resolve().parents[2]


def run_crash(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    folder = tmp_path / "log"
    stderr_path = tmp_path / "child.stderr"
    lines: list[str] = []
    with open(stderr_path, "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.persistence.crash_child", str(seed), str(folder)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        reader = threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 30
            while "ready\n" not in lines[:1] and child.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            assert lines[:1] == ["ready\n"], stderr_path.read_text()
            time.sleep(rng.uniform(0.02, 0.5))
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=30)
            reader.join(timeout=30)
    assert child.returncode == -signal.SIGKILL, stderr_path.read_text()
    durable = [int(line) for line in lines[1:] if line.strip().isdigit()]
    durable_max = max(durable, default=0)
    items = recovered(str(folder))
    # Every issued op but at most one per thread has been printed, so the log holds ops
    # 1..k for some k between the highest durable one and that bound.
    ops = history(seed)
    model = Model()
    matched = None
    for number, op in enumerate(ops[:len(durable) + thread_count], start=1):
        model.apply(op)
        if number >= durable_max and model.items == items:
            matched = number
            break
    assert matched is not None, f"seed {seed}: no prefix >= {durable_max} matches recovery"
    with LogStore(str(folder), background_compaction=False) as store:
        store._check_index()
        store.put(1, b"after", b"restart")
    model.put(1, b"after", b"restart")
    assert recovered(str(folder)) == model.items


@pytest.mark.parametrize("seed", range(10))
def test_sigkill_loses_nothing_durable(tmp_path: Path, seed: int) -> None:
    run_crash(tmp_path, seed)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(1000, 1300))
def test_sigkill_loses_nothing_durable_soak(tmp_path: Path, seed: int) -> None:
    run_crash(tmp_path, seed)
