"""Processes in tests: waiting for one to really end (``ray.kill`` and actor clean-up are asynchronous),
and killing a run for real once it has written a file (a checkpoint) to test resuming."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence


def kill_once_written(cmd: Sequence[str], path: Path, env: Mapping[str, str], timeout_s: float = 900) -> None:
    """Start ``cmd`` and SIGKILL its whole process group as soon as ``path`` exists (no clean-up runs)."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(env),
                            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while not path.exists():
            assert proc.poll() is None, f"the run ended before writing {path.name}, which it was to be killed after"
            assert time.monotonic() < deadline, f"no {path.name} within {timeout_s:g} s"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


def wait_until_gone(pid: int, timeout_s: float = 30, what: str = "process") -> None:
    """Return once ``pid`` no longer exists; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} {pid} still alive after {timeout_s:g} s")
