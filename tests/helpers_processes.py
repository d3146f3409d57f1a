"""Waiting for a process to really end (``ray.kill`` and actor clean-up are asynchronous)."""

from __future__ import annotations

import os
import time


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
