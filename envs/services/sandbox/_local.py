"""Process plumbing shared by the two local backends (bwrap and subprocess).

Why not ``subprocess.run(timeout=...)``: it waits for the pipes to close, so a grandchild that
keeps stdout open stalls it; it buffers unbounded output; and it only kills the direct child.
Here one selector loop feeds stdin, reads both pipes under one output cap, watches the child
through a pidfd (which does not reap it), and kills the whole process group *before* reaping
the leader, so the group id cannot have been reused by an unrelated process.
"""
from __future__ import annotations

import errno
import math
import os
import resource
import selectors
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from .base import OutputCollector, SandboxError

MiB = 1024 * 1024
#: uid/gid the local backends run programs as when the host process is root ("nobody").
NOBODY = 65534


@dataclass
class ProcOutcome:
    returncode: int | None  # Popen convention: negative = killed by that signal
    timed_out: bool  # we killed it at the wall-clock deadline
    overflow: bool  # we killed it because the output cap was exceeded
    duration_s: float


def rlimits_preexec(*, memory_mb: int, time_limit_s: float, nproc: int, fsize_mb: int,
                    nofile: int) -> Callable[[], None]:
    """Build the ``preexec_fn`` that applies the rlimits in the child, just before exec.

    Hard limits equal soft limits so the program cannot raise them again. RLIMIT_CPU is only a
    backstop (the wall clock is the real limit): SIGXCPU a second after the wall limit, then
    SIGKILL. RLIMIT_NPROC is per real uid, which is why ``nproc`` already includes the uid's
    other processes (see :func:`nproc_budget`); root ignores it.
    """
    mem = memory_mb * MiB
    cpu = math.ceil(time_limit_s) + 1
    limits = [
        (resource.RLIMIT_AS, mem, mem),
        (resource.RLIMIT_DATA, mem, mem),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_FSIZE, fsize_mb * MiB, fsize_mb * MiB),
        (resource.RLIMIT_NOFILE, nofile, nofile),
        (resource.RLIMIT_CORE, 0, 0),
    ]

    def preexec() -> None:  # runs in the forked child: keep it to plain syscalls
        for res, soft, hard in limits:
            resource.setrlimit(res, (soft, hard))

    return preexec


def count_processes(uid: int) -> int:
    """About how many processes ``uid`` owns (RLIMIT_NPROC counts those of the real uid).

    The owner of ``/proc/<pid>`` is the effective uid (root for non-dumpable processes); a
    ``stat`` is ~10x cheaper than parsing ``status``, and an undercount only makes the budget
    tighter.
    """
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                n += entry.stat(follow_symlinks=False).st_uid == uid
            except OSError:
                pass
    return n


def nproc_budget(uid: int, extra: int) -> int:
    """RLIMIT_NPROC value that lets the sandboxed program start about ``extra`` processes.

    The limit is compared with *all* processes of the real uid, so a fixed small number would
    either forbid any fork (a desktop user owns hundreds of processes) or be shared across
    concurrent sandboxes; counting first makes the budget per run (up to races between
    concurrent runs of the same uid, which only make the limit tighter).
    """
    return count_processes(uid) + extra


def accessible_to_others(path: str) -> bool:
    """True if a different, unprivileged uid can execute ``path`` (o+x on it and every parent)."""
    real = os.path.realpath(path)
    try:
        if not os.stat(real).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(real)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _exited(pid: int) -> bool:
    """Has ``pid`` exited? Does not reap it (WNOWAIT), so its pid/pgid stay reserved."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_process(argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str], stdin: bytes,
                time_limit_s: float, collector: OutputCollector,
                preexec_fn: Callable[[], None] | None, pass_fds: Sequence[int] = (),
                user: int | None = None, group: int | None = None) -> ProcOutcome:
    """Run ``argv`` in a new session/process group under a wall-clock limit and an output cap."""
    drop = {} if user is None else {"user": user, "group": group, "extra_groups": []}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env=dict(env), close_fds=True, pass_fds=tuple(pass_fds),
            start_new_session=True, preexec_fn=preexec_fn, **drop)
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxError(f"could not start {argv[0]!r}: {e}") from e
    pipes = _Pipes(proc, stdin, collector, _pidfd(proc.pid))
    try:
        exited, timed_out, overflow = pipes.pump(start + time_limit_s)
        if exited:
            overflow = pipes.drain_open()
        kill_group(proc.pid)  # leader not reaped yet: the pgid is still ours
        returncode = proc.wait()
    finally:
        pipes.close()
        if proc.returncode is None:  # an exception escaped: never leave the group behind
            kill_group(proc.pid)
            proc.wait()
    duration = time.monotonic() - start
    return ProcOutcome(returncode=None if (timed_out or overflow) else returncode,
                       timed_out=timed_out, overflow=overflow, duration_s=duration)


class _Pipes:
    """One selector over a child's stdin, stdout, stderr and pidfd: feeds stdin, reads both outputs into
    the collector (non-blocking), and notices the child's exit."""

    def __init__(self, proc: subprocess.Popen, stdin: bytes, collector: OutputCollector, pidfd: int | None):
        self.proc, self.collector, self.pidfd = proc, collector, pidfd
        self.sel = selectors.DefaultSelector()
        self.streams = {proc.stdout: 1, proc.stderr: 2}
        for f in self.streams:
            os.set_blocking(f.fileno(), False)
            self.sel.register(f, selectors.EVENT_READ)
        self.pending = memoryview(stdin)
        assert proc.stdin is not None
        if self.pending:
            os.set_blocking(proc.stdin.fileno(), False)
            self.sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        if pidfd is not None:
            self.sel.register(pidfd, selectors.EVENT_READ)

    def pump(self, deadline: float) -> tuple[bool, bool, bool]:
        """Serve the pipes until the child exits, ``deadline`` passes or the output cap is hit:
        ``(exited, timed_out, overflow)``."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False, True, False
            # Without a pidfd, wake up regularly to poll the child's state.
            events = self.sel.select(remaining if self.pidfd is not None else min(remaining, 0.02))
            exited = False
            for key, _ in events:
                f = key.fileobj
                if f is self.pidfd:
                    exited = True
                elif f is self.proc.stdin:
                    self._write_stdin()
                elif not self.drain(f):
                    self.sel.unregister(f)
                if self.collector.truncated:
                    return exited, False, True
            if self.pidfd is None and _exited(self.proc.pid):
                exited = True
            if exited:
                return True, False, False

    def _write_stdin(self) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            n = os.write(stdin.fileno(), self.pending[:65536])
            self.pending = self.pending[n:]
        except BlockingIOError:
            pass
        except OSError as e:  # EPIPE: the program stopped reading; fine
            if e.errno not in (errno.EPIPE, errno.EINVAL):
                raise
            self.pending = self.pending[:0]
        if not self.pending:
            self.sel.unregister(stdin)
            stdin.close()

    def drain(self, f) -> bool:
        """Read what is there now; False on EOF."""
        while True:
            try:
                data = os.read(f.fileno(), 65536)
            except BlockingIOError:
                return True
            if not data:
                return False
            if not self.collector.add(self.streams[f], data):
                return True

    def drain_open(self) -> bool:
        """After the leader exited: everything it wrote is in the pipes now; a grandchild holding them
        open must not keep us waiting, so read only what is already there. Returns whether the output
        overflowed."""
        still_open = [k.fileobj for k in self.sel.get_map().values() if k.fileobj in self.streams]
        for f in still_open:
            self.drain(f)
        return self.collector.truncated

    def close(self) -> None:
        self.sel.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None and not f.closed:
                f.close()
