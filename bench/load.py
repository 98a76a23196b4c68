"""A controlled CPU load for the benchmarks: N busy processes beside the measured one, the same
for every backend in a run (a serving box is never idle), and the load average to report."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


class Neighbours:
    """N busy-looping processes (`python -c 'while True: pass'`), each in its own session,
    stopped by PID; also a context manager."""

    def __init__(self, count: int):
        self.procs: list[subprocess.Popen] = []
        for _ in range(count):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs = []

    def __enter__(self) -> Neighbours:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
