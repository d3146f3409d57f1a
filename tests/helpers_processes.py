"""Processes in tests: waiting for one to really end (``ray.kill`` and actor clean-up are asynchronous),
and killing a run for real once it has written a file (a checkpoint) to test resuming."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Mapping, Sequence


def _tail(log: Path, chars: int = 4000) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return text[-chars:] or "(it printed nothing)"


class EndedEarly(AssertionError):
    """The run ended on its own before writing the file it was to be killed after."""


def _start_and_kill(cmd: Sequence[str], path: Path, env: Mapping[str, str], timeout_s: float) -> None:
    with tempfile.NamedTemporaryFile("w+b", prefix="killed_run_", suffix=".log", delete=False) as f:
        log = Path(f.name)
        proc = subprocess.Popen(list(cmd), stdout=f, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while not path.exists():
            code = proc.poll()
            if code is not None:
                raise EndedEarly(f"the run ended (exit code {code}) before writing {path.name}, which it was "
                                 f"to be killed after; it printed:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {path.name} within {timeout_s:g} s; the run printed:\n{_tail(log)}")
            time.sleep(0.05)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:     # the whole group has already ended (the error above says why)
            pass
        proc.wait(timeout=60)
        log.unlink(missing_ok=True)


def kill_once_written(cmd: Sequence[str], path: Path, env: Mapping[str, str], timeout_s: float = 900, *,
                      out_dir: Path | None = None) -> None:
    """Start ``cmd`` and SIGKILL its whole process group as soon as ``path`` exists (no clean-up runs).

    Its output goes to a log file, so that a run that ends on its own before ``path`` exists fails
    with the tail of what it printed (its error), not only with the fact that it ended. With
    ``out_dir`` (the run's output folder), such a run is started once more in an emptied folder,
    and the first one's output is a warning in the test report: a run that fails twice fails the
    test; one that failed once (a rare launcher hiccup; a torchrun run did once in CI, its output
    lost) is still reported."""
    try:
        _start_and_kill(cmd, path, env, timeout_s)
    except EndedEarly as first:
        if out_dir is None:
            raise
        warnings.warn(f"started again: {first}", RuntimeWarning, stacklevel=2)
        shutil.rmtree(out_dir, ignore_errors=True)
        _start_and_kill(cmd, path, env, timeout_s)


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
