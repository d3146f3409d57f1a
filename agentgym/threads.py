"""Torch CPU threads that follow the load while a run goes on.

On a 2-core machine, torch threads that outnumber the free cores spin waiting for a busy one: two
threads next to another job made SmolLM2 2.4–5× *slower* than one, and a run whose thread count was
chosen once, at a quiet moment, took 185–190 s a step where one thread took about 30 s
(benchmarks/RESULTS.md). So the command line chooses a count at start (:func:`choose_threads`)
and installs a :class:`ThreadGovernor`; the trainer and the evaluations call :func:`recheck` between
steps and as episodes finish, and the governor moves ``torch.set_num_threads`` to the cores that
*other* work leaves free, measured over the time since the last check:

    others = (non-idle CPU time of the whole machine − this process's CPU time) / elapsed

(``/proc/stat`` and :func:`time.process_time`). Subtracting our own time is what makes a mid-run
measure possible at all: the machine is busy with *us* while we train. Each change is logged. An
explicit ``--threads N`` or ``OMP_NUM_THREADS`` is never changed. Without a governor (library use)
:func:`recheck` does nothing: the caller owns the thread count.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

__all__ = ["ThreadGovernor", "install", "recheck", "current", "machine_cpu_times", "busy_cores_now", "choose_threads"]


def machine_cpu_times() -> tuple[float, float] | None:
    """(total, idle) CPU seconds of the whole machine since boot, from ``/proc/stat``; None without it."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 4:   # not the kernel's "cpu user nice system idle ..." line
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)        # idle + iowait
    return sum(fields[:8]) / hz, idle / hz


def busy_cores_now(window_s: float = 0.3) -> float | None:
    """Cores busy with other work right now: the non-idle share of ``/proc/stat``'s CPU time over
    ``window_s`` (this process sleeps meanwhile) × the core count; None where there is no /proc/stat."""
    a = machine_cpu_times()
    if a is None:
        return None
    time.sleep(window_s)
    b = machine_cpu_times()
    if b is None or b[0] <= a[0]:
        return None
    busy_share = 1.0 - (b[1] - a[1]) / (b[0] - a[0])
    return max(0.0, busy_share) * (os.cpu_count() or 1)


def choose_threads(requested: int | None = None) -> tuple[int, str]:
    """Torch CPU threads for this process, and why.

    Measured on a 2-core machine (see benchmarks/RESULTS.md): with other work on the cores, two torch
    threads made SmolLM2 2.4–5× *slower* than one (threads spin waiting for a busy core). So the default
    is the cores not already busy, at least 1. "Busy" is the smaller of the 1-minute load average and the
    cores busy right now (``/proc/stat`` over 0.3 s): the load average alone lags by a minute, so right
    after ``scripts/setup.sh`` (the README's main command runs the two back to back) it read 0.7 on an
    otherwise idle machine and cost the default job 364 s with one thread instead of 220 s with two
    (benchmarks/RESULTS.md). An explicit ``--threads N`` or ``OMP_NUM_THREADS`` always wins.
    """
    if requested is not None:
        return max(1, requested), "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    cores = _cores()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    now = busy_cores_now()
    busy = load if now is None else min(load, now)
    why = f"{cores} cores, load {load:.1f}" + ("" if now is None else f", {now:.1f} busy now")
    return max(1, min(cores, cores - int(round(busy)))), why


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class ThreadGovernor:
    """Holds torch's thread count at the cores other work leaves free (see the module docstring).

    ``fixed``: the count was chosen by the user and is never changed. ``min_interval_s``: the shortest
    window a re-check measures over (shorter calls return at once), so a check costs two small file
    reads and happens at most every few seconds whatever calls it."""

    def __init__(self, threads: int, *, fixed: bool = False, log: Callable[[str], None] = print,
                 min_interval_s: float = 5.0) -> None:
        import torch
        self.threads, self.fixed, self.log, self.min_interval_s = threads, fixed, log, min_interval_s
        self.cores = _cores()
        self.changes: list[tuple[int, int, float]] = []   # (old, new, other cores busy) per change
        self.lanes = 1   # computations this process runs at once (2 while generation overlaps the update)
        # the trainer and the background sampler (algorithms/loop/overlap.py) both recheck: one at a time
        self._lock = threading.Lock()
        torch.set_num_threads(threads)
        self._mark = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float, float] | None:
        times = machine_cpu_times()
        if times is None:
            return None
        return time.monotonic(), times[0], times[1], time.process_time()

    def busy_since_mark(self) -> tuple[float, float] | None:
        """(machine, this process) busy cores since the last mark, and a new mark; None when the window
        is shorter than ``min_interval_s`` or there is no ``/proc/stat``."""
        now = self._sample()
        if now is None or self._mark is None or now[0] - self._mark[0] < self.min_interval_s:
            return None
        (t0, tot0, idle0, own0), (t1, tot1, idle1, own1) = self._mark, now
        self._mark = now
        if tot1 <= tot0 or t1 <= t0:
            return None
        # the machine's non-idle share of its CPU time, in cores (all CPUs, like the load average)
        machine = (1.0 - (idle1 - idle0) / (tot1 - tot0)) * (os.cpu_count() or 1)
        return machine, (own1 - own0) / (t1 - t0)

    def others_busy(self) -> float | None:
        """Cores busy with other processes since the last mark (None: window too short or no /proc)."""
        busy = self.busy_since_mark()
        return None if busy is None else max(0.0, busy[0] - busy[1])

    def recheck(self) -> int:
        """Re-measure and move the thread count if other work changed; returns the count in force.
        A call while another thread is re-checking returns at once (one measure per window, one log line)."""
        if self.fixed or not self._lock.acquire(blocking=False):
            return self.threads
        try:
            return self._recheck()
        finally:
            self._lock.release()

    def _recheck(self) -> int:
        others = self.others_busy()
        if others is None:
            return self.threads
        want = max(1, min(self.cores, self.cores - int(round(others))))
        if want != self.threads:
            import torch
            torch.set_num_threads(self.per_lane(want))
            self.changes.append((self.threads, want, others))
            self.log(f"[agentgym] torch threads {self.threads} -> {want} (other work kept {others:.1f} of "
                     f"{self.cores} cores busy; --threads N or OMP_NUM_THREADS to fix the count)")
            self.threads = want
        return self.threads

    def per_lane(self, threads: int) -> int:
        """Torch threads for each of the :attr:`lanes` running at once out of a budget of ``threads``."""
        return max(1, threads // self.lanes)

    def set_lanes(self, lanes: int) -> None:
        """Share the thread budget between ``lanes`` computations that run at once in this process (torch's
        thread count is one per process: two lanes with the whole budget each would oversubscribe the cores
        and spin). An explicit ``--threads N`` is shared the same way."""
        import torch
        lanes = max(1, int(lanes))
        with self._lock:
            if lanes == self.lanes:
                return
            self.lanes = lanes
            torch.set_num_threads(self.per_lane(self.threads))
        if lanes > 1:
            self.log(f"[agentgym] {lanes} computations at once (generation overlaps the update): "
                     f"{self.per_lane(self.threads)} torch thread(s) each out of {self.threads}")


_current: ThreadGovernor | None = None


def install(governor: ThreadGovernor | None) -> None:
    """Make ``governor`` the one :func:`recheck` consults (None: none)."""
    global _current
    _current = governor


def current() -> ThreadGovernor | None:
    return _current


def recheck() -> None:
    """Between steps and eval batches: let the installed governor follow the load (no-op without one)."""
    if _current is not None:
        _current.recheck()
