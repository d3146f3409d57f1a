"""bwrap at the speed of a fork: long-lived bubblewrap sandboxes, each running ``runner.py``.

Each runner is one ``bwrap`` with the same namespaces, mounts and identity as the per-job
backend (``BwrapSandbox.namespace_args``), started with ``--as-pid-1`` so that the runner's
zygote is the namespace's init: a job cannot kill it (the kernel drops signals from inside a pid
namespace to its init that it has no handler for) and orphans are reaped by it. A job is a
``fork`` of the pre-started interpreter (no bwrap, no exec, no interpreter start), under the
same rlimits as before (address space, processes, file size, open files, CPU backstop).

Jobs share the runner's uid here (an unprivileged user namespace maps one uid), so a job can
signal its handler; the zygote then answers for it ("the program killed its supervisor") and the
runner is recycled. The handler and zygote are non-dumpable, so a job cannot ptrace them or read
their memory or descriptors.
"""
from __future__ import annotations

import os
import subprocess

from ._local import nproc_budget
from .base import DEFAULT_MAX_OUTPUT_BYTES, Job
from .bwrap_sandbox import WORK_DIR, BwrapSandbox
from .warm import JOB_ENV, PipeChannel, Runner, WarmSandbox, runner_argv


class WarmBwrapSandbox(WarmSandbox):
    """Warm bubblewrap runners (see the module docstring); same isolation as ``BwrapSandbox``."""

    name = "bwrap"
    is_security_boundary = True

    def __init__(self, *, pool_size: int = 2, max_jobs: int = 1000,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, bwrap: str | None = None,
                 python: str | None = None, run_as: int | None | str = "auto", max_processes: int = 64,
                 work_dir_mb: int = 64, max_open_files: int = 256) -> None:
        # the per-job backend validates the binary, the interpreter and run_as, and owns the mounts
        self.base = BwrapSandbox(bwrap=bwrap, python=python, run_as=run_as, max_processes=max_processes,
                                 work_dir_mb=work_dir_mb, max_open_files=max_open_files)
        self.work_dir_mb = work_dir_mb
        self.max_processes = max_processes
        super().__init__(pool_size=pool_size, max_jobs=max_jobs, max_output_bytes=max_output_bytes)
        self._pool.fill()

    def _start_runner(self) -> Runner:
        cfg = {"work": WORK_DIR, "wipe": ["/tmp", "/dev/shm"], "job_uid": None,
               "oom_score_adj": False, "rlimit_memory": True, "env": JOB_ENV}
        argv = self.base.namespace_args(as_pid_1=True) + [
            "--chdir", WORK_DIR, "--clearenv", "--setenv", "PATH", JOB_ENV["PATH"],
            "--setenv", "LANG", "C.UTF-8", "--", *runner_argv(self.base.python, cfg)]
        run_as = self.base.run_as
        drop = {} if run_as is None else {"user": run_as, "group": run_as, "extra_groups": []}
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd="/", env={"PATH": "/usr/bin:/bin"}, start_new_session=True,
                                close_fds=True, **drop)

        def stop() -> None:
            try:
                os.killpg(proc.pid, 9)
            except OSError:
                pass
            proc.wait()

        try:
            return Runner(PipeChannel(proc), stop, startup_timeout_s=30)
        except BaseException:
            stop()
            raise

    def _job_extras(self, job: Job) -> dict:
        uid = self.base.run_as if self.base.run_as is not None else os.getuid()
        # RLIMIT_NPROC counts every process of the uid on the host (see _local.nproc_budget)
        return {"nproc": nproc_budget(uid, self.max_processes)}

    def _breach(self, answer: dict) -> bool:
        # a job that needed a sweep of half its process budget was at least close to the limit
        killed = (r.get("killed", 0) for r in answer.get("results", []))
        return any(isinstance(k, int) and k >= self.max_processes // 2 for k in killed)

    def close(self) -> None:
        super().close()
        self.base.close()


__all__ = ["WarmBwrapSandbox"]
