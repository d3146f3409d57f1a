"""The fallback backend: a plain child process. **Not a security boundary.**

It bounds what a *buggy* program can do to a trusted machine (time, memory, output, process
count, file size), runs in a fresh temp dir with an empty environment, and kills its process
group afterwards. It does not stop a *malicious* program: the network, the host file system
(wherever the run uid may write, e.g. ``/tmp``) and other processes' ``/proc`` entries stay
reachable, and a process that calls ``setsid()`` escapes the group kill. When the host process
is root the program runs as ``nobody`` (uid 65534), which at least keeps it away from root's
files and processes and makes RLIMIT_NPROC effective (root ignores it).

Use it for tests and trusted code; use ``docker`` or ``bwrap`` for model-written code.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile

from .base import (PROGRAM_NAME, PYTHON_FLAGS, DEFAULT_MAX_OUTPUT_BYTES, ExecResult, Job,
                   OutputCollector, Sandbox, SandboxError, looks_like_oom)
from ._local import (NOBODY, accessible_to_others, nproc_budget, rlimits_preexec,
                     run_process)

_FALLBACK_PYTHON = "/usr/bin/python3"


def _pick_python(python: str | None, drop: bool) -> str:
    """The interpreter the run uid can execute: ours if reachable, else the system one."""
    if python:
        return python
    if not drop or accessible_to_others(sys.executable):
        return sys.executable
    if os.path.exists(_FALLBACK_PYTHON) and accessible_to_others(_FALLBACK_PYTHON):
        return _FALLBACK_PYTHON
    raise SandboxError(f"no Python interpreter executable by uid {NOBODY}: {sys.executable} "
                       f"sits in a directory others cannot enter; pass python=...")


class SubprocessSandbox(Sandbox):
    """rlimits + process-group kill + temp dir + cleared env; NOT a security boundary."""

    name = "subprocess"
    is_security_boundary = False

    def __init__(self, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 python: str | None = None, run_as: int | None | str = "auto",
                 max_processes: int = 64, work_dir_mb: int = 64, max_open_files: int = 256,
                 tmp_root: str | None = None) -> None:
        """``run_as``: "auto" = uid 65534 when we are root, else our own uid; an int = that
        uid (needs root); None = never change uid."""
        super().__init__(max_output_bytes=max_output_bytes)
        if run_as == "auto":
            run_as = NOBODY if os.geteuid() == 0 else None
        if run_as is not None and os.geteuid() != 0:
            raise SandboxError("run_as needs the host process to be root")
        self.run_as: int | None = run_as  # type: ignore[assignment]
        self.python = _pick_python(python, self.run_as is not None)
        self.max_processes = max_processes
        self.work_dir_mb = work_dir_mb
        self.max_open_files = max_open_files
        self.tmp_root = tmp_root

    @property
    def drops_privileges(self) -> bool:
        """True when programs run under a different, unprivileged uid than the host process."""
        return self.run_as is not None

    def _execute(self, job: Job) -> ExecResult:
        uid = self.run_as if self.run_as is not None else os.getuid()
        try:
            work = tempfile.mkdtemp(prefix="agentgym-sbx-", dir=self.tmp_root)
        except OSError as e:
            raise SandboxError(f"cannot create a work dir: {e}") from e
        try:
            self._populate(work, job)
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work,
                   "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
            collector = OutputCollector(self.max_output_bytes)
            preexec = rlimits_preexec(
                memory_mb=job.memory_mb, time_limit_s=job.time_limit_s,
                nproc=nproc_budget(uid, self.max_processes), fsize_mb=self.work_dir_mb,
                nofile=self.max_open_files)
            outcome = run_process(
                [self.python, *PYTHON_FLAGS, PROGRAM_NAME, *job.argv], cwd=work, env=env,
                stdin=job.stdin, time_limit_s=job.time_limit_s, collector=collector,
                preexec_fn=preexec, user=self.run_as, group=self.run_as)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rc = outcome.returncode
        cpu_limit = rc == -signal.SIGXCPU  # the RLIMIT_CPU backstop fired
        stdout, stderr = collector.text()
        return ExecResult(
            stdout=stdout, stderr=stderr,
            exit_code=rc if rc is not None and rc >= 0 else None,
            timed_out=outcome.timed_out or cpu_limit,
            oom=not outcome.timed_out and rc != 0 and looks_like_oom(collector.stderr),
            duration_s=outcome.duration_s, output_truncated=collector.truncated,
            backend=self.name)

    def _populate(self, work: str, job: Job) -> None:
        paths = {PROGRAM_NAME: job.code, **job.files}
        for rel, data in paths.items():
            dest = os.path.join(work, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(data)
        if self.run_as is not None:
            for root, dirs, names in os.walk(work):
                for n in [*dirs, *names]:
                    os.chown(os.path.join(root, n), self.run_as, self.run_as)
            os.chown(work, self.run_as, self.run_as)
