"""Counting the Python bytecodes a process runs, by function.

On a small shared virtual machine a rate drifts 20–40% from one minute to the next, so a change
worth 5% cannot be seen by timing it. The bytecodes an operation runs do not drift: counted
once, they are the same the next time (``tools/count_bytecodes.py`` counts them in a client and
in every member, per operation). A bytecode is not a fixed cost (a call costs more than an
add), so the counts say where work is and whether a change removed some, not its time.

A member counts only when ``COUNT_BYTECODES_ENV`` names a folder: SIGUSR2 starts counting,
SIGUSR1 stops and writes ``bytecodes-PID.txt`` there. The tracer slows the process many
times over while it counts; nothing is traced otherwise.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

COUNT_BYTECODES_ENV = "SHMGRID_COUNT_BYTECODES"


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


class BytecodeCounter:
    """Bytecodes run per function ("name (file:line)") between ``start`` and ``stop``."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            self.counts[_where(frame)] += 1
        return self._trace

    def start(self, frame: FrameType | None = None) -> None:
        """Count from now on, also in ``frame`` and its callers (the frames already running:
        a signal arrives in the middle of the member's loop)."""
        sys.settrace(self._trace)
        while frame is not None:
            frame.f_trace, frame.f_trace_opcodes = self._trace, True
            frame = frame.f_back

    def stop(self, frame: FrameType | None = None) -> None:
        sys.settrace(None)
        while frame is not None:
            frame.f_trace = None
            frame = frame.f_back

    def write(self, path: Path) -> None:
        """One line per function: its count, a space, its name."""
        path.write_text("".join(f"{count} {name}\n" for name, count in self.counts.items()))


def count_on_signals(folder: str) -> None:
    """SIGUSR2 starts counting this process's bytecodes, SIGUSR1 stops and writes them to
    ``folder``/bytecodes-PID.txt (counting starts afresh on the next SIGUSR2)."""
    counter = BytecodeCounter()

    def start(signum: int, frame: FrameType | None) -> None:
        counter.counts.clear()
        counter.start(frame)

    def stop(signum: int, frame: FrameType | None) -> None:
        counter.stop(frame)
        counter.write(Path(folder) / f"bytecodes-{os.getpid()}.txt")

    signal.signal(signal.SIGUSR2, start)
    signal.signal(signal.SIGUSR1, stop)


def read_counts(path: Path) -> collections.Counter[str]:
    """What ``BytecodeCounter.write`` wrote."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        count, name = line.split(" ", 1)
        counts[name] += int(count)
    return counts
