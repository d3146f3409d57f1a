"""bubblewrap backend: Linux namespaces + rlimits, no daemon, ~ms of overhead per run.

Isolation: every namespace is unshared (user, pid, net, ipc, uts, cgroup, mount), so the
program sees no network but its own loopback, only its own processes in ``/proc``, and a root
file system holding just read-only ``/usr`` (+ the ``/bin``, ``/lib*`` links, the dynamic
linker cache) and two private tmpfs mounts (``/work``, ``/tmp``). The environment is cleared,
further user namespaces are disabled, all capabilities dropped, and ``--die-with-parent``
plus killing the process group (whose members include the namespace's init: when it dies
the kernel kills everything in the pid namespace) ends every process at the deadline.

Resources come from rlimits set in a ``preexec_fn``: RLIMIT_AS/DATA (memory), RLIMIT_CPU
(backstop for the wall clock), RLIMIT_NPROC (fork bombs), RLIMIT_FSIZE, RLIMIT_NOFILE.
RLIMIT_NPROC is ignored for real uid 0 -- even inside a user namespace -- so when the host
process is root, bwrap itself is started as ``nobody`` (unprivileged user-namespace mode);
``run_as=None`` keeps root's bwrap (then only the wall clock bounds a fork bomb).

Files reach the tmpfs through ``--file FD`` from memfds: nothing touches the host disk.
No seccomp filter is installed (bwrap needs a pre-compiled BPF program for that); the
docker backend has Docker's default seccomp profile.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys

from .base import (PROGRAM_NAME, PYTHON_FLAGS, DEFAULT_MAX_OUTPUT_BYTES, ExecResult, Job,
                   OutputCollector, Sandbox, SandboxError, looks_like_oom)
from ._local import (NOBODY, MiB, accessible_to_others, nproc_budget, rlimits_preexec,
                     run_process)

SANDBOX_UID = NOBODY
WORK_DIR = "/work"
#: Path of the bwrap binary to use instead of the one on PATH.
BWRAP_ENV_VAR = "AGENTGYM_BWRAP"


@functools.lru_cache(maxsize=4)
def _bwrap_options(bwrap: str) -> frozenset[str]:
    """The long options this bwrap build knows (``--disable-userns`` and ``--size`` are new)."""
    try:
        out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(w for w in (out.stdout + out.stderr).split() if w.startswith("--"))


def _default_python() -> str:
    """System Python under /usr (already bound, readable by nobody), else our interpreter."""
    for cand in ("/usr/bin/python3",):
        if os.path.exists(cand):
            return cand
    return sys.executable


def find_bwrap(bwrap: str | None = None) -> str:
    """The bwrap binary: ``bwrap`` if given, else ``$AGENTGYM_BWRAP``, else ``bwrap`` on PATH.

    The environment variable lets a deployment pin one bwrap build, and lets a test point the
    availability check at a missing binary to see what happens on a machine without bwrap.
    """
    chosen = bwrap or os.environ.get(BWRAP_ENV_VAR, "").strip() or None
    if chosen is None:
        found = shutil.which("bwrap")
        if not found:
            raise SandboxError("bwrap not found on PATH (apt-get install bubblewrap)")
        return found
    found = shutil.which(chosen)  # an absolute path is checked for being an executable file
    if not found:
        where = f" (from ${BWRAP_ENV_VAR})" if not bwrap else ""
        raise SandboxError(f"bwrap not found at {chosen!r}{where} (apt-get install bubblewrap)")
    return found


class BwrapSandbox(Sandbox):
    """Runs each program in a fresh bubblewrap sandbox (see the module docstring)."""

    name = "bwrap"
    is_security_boundary = True

    def __init__(self, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 bwrap: str | None = None, python: str | None = None,
                 run_as: int | None | str = "auto", max_processes: int = 64,
                 work_dir_mb: int = 64, max_open_files: int = 256) -> None:
        super().__init__(max_output_bytes=max_output_bytes)
        self.bwrap = find_bwrap(bwrap)
        if run_as == "auto":
            run_as = NOBODY if os.geteuid() == 0 else None
        if run_as is not None and os.geteuid() != 0:
            raise SandboxError("run_as needs the host process to be root")
        self.run_as: int | None = run_as  # type: ignore[assignment]
        self.python = python or _default_python()
        if self.run_as is not None and not accessible_to_others(self.python):
            raise SandboxError(f"{self.python} is not executable by uid {self.run_as}; "
                               f"pass python=... (e.g. /usr/bin/python3)")
        self.max_processes = max_processes
        self.work_dir_mb = work_dir_mb
        self.max_open_files = max_open_files
        self._options = _bwrap_options(self.bwrap)

    def _mounts(self) -> list[str]:
        """Read-only system dirs: /usr plus the merged-/usr links (or dirs) and the ld cache."""
        args = ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        py = os.path.realpath(self.python)
        if not py.startswith("/usr/"):  # e.g. a pyenv/conda interpreter: bind its prefix
            prefix = os.path.dirname(os.path.dirname(py))
            args += ["--ro-bind", prefix, prefix]
            base = os.path.realpath(sys.base_prefix)
            if self.python == sys.executable and base != prefix:
                args += ["--ro-bind", base, base]
        return args

    def namespace_args(self, *, as_pid_1: bool = False) -> list[str]:
        """bwrap's namespaces, identity and mounts (shared by the per-job and the warm backend)."""
        size = str(self.work_dir_mb * MiB)
        sized = (lambda: ["--size", size]) if "--size" in self._options else (lambda: [])
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent",
                "--new-session", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
                "--hostname", "sandbox", "--cap-drop", "ALL"]
        if as_pid_1:
            args.append("--as-pid-1")
        if "--disable-userns" in self._options:
            args.append("--disable-userns")
        args += self._mounts()
        return args + ["--proc", "/proc", "--dev", "/dev",
                       *sized(), "--tmpfs", "/tmp", *sized(), "--tmpfs", WORK_DIR]

    def command(self, job: Job, file_fds: dict[str, int], status_fd: int) -> list[str]:
        """The full bwrap command line for ``job`` (public for inspection and docs)."""
        args = self.namespace_args()
        for rel, fd in file_fds.items():
            args += ["--perms", "0644", "--file", str(fd), f"{WORK_DIR}/{rel}"]
        args += ["--chdir", WORK_DIR, "--clearenv",
                 "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
                 "--setenv", "HOME", WORK_DIR, "--setenv", "TMPDIR", "/tmp",
                 "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONIOENCODING", "utf-8",
                 "--json-status-fd", str(status_fd),
                 "--", self.python, *PYTHON_FLAGS, PROGRAM_NAME, *job.argv]
        return args

    def _execute(self, job: Job) -> ExecResult:
        fds: dict[str, int] = {}
        status_r, status_w = os.pipe()
        try:
            for rel, data in {PROGRAM_NAME: job.code, **job.files}.items():
                fd = os.memfd_create("agentgym-file")
                _write_all(fd, data)
                os.lseek(fd, 0, os.SEEK_SET)
                fds[rel] = fd
            uid = self.run_as if self.run_as is not None else os.getuid()
            preexec = rlimits_preexec(
                memory_mb=job.memory_mb, time_limit_s=job.time_limit_s,
                # + 2: the outer bwrap and the namespace's init are processes of the uid too
                nproc=nproc_budget(uid, self.max_processes + 2), fsize_mb=self.work_dir_mb,
                nofile=max(self.max_open_files, len(fds) + 32))
            collector = OutputCollector(self.max_output_bytes)
            outcome = run_process(
                self.command(job, fds, status_w), cwd="/", env={"PATH": "/usr/bin:/bin"},
                stdin=job.stdin, time_limit_s=job.time_limit_s, collector=collector,
                preexec_fn=preexec, pass_fds=[*fds.values(), status_w],
                user=self.run_as, group=self.run_as)
            os.close(status_w)
            status_w = -1
            status = _read_status(status_r)
        finally:
            for fd in fds.values():
                os.close(fd)
            os.close(status_r)
            if status_w >= 0:
                os.close(status_w)
        killed_by_us = outcome.timed_out or outcome.overflow
        if "exit-code" not in status and not killed_by_us:
            raise SandboxError("bwrap could not set up the sandbox: "
                               + collector.stderr.decode("utf-8", "replace").strip()[-2000:])
        code = status.get("exit-code")
        signo = code - 128 if isinstance(code, int) and 128 < code <= 128 + 64 else None
        stdout, stderr = collector.text()
        return ExecResult(
            stdout=stdout, stderr=stderr,
            exit_code=None if killed_by_us or signo is not None else code,
            timed_out=outcome.timed_out or signo == signal.SIGXCPU,
            oom=not outcome.timed_out and code != 0 and looks_like_oom(collector.stderr),
            duration_s=outcome.duration_s, output_truncated=collector.truncated,
            backend=self.name)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_status(fd: int) -> dict:
    """Merge bwrap's ``--json-status-fd`` documents (``child-pid``, then ``exit-code``)."""
    os.set_blocking(fd, False)
    raw = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        raw += chunk
    merged: dict = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line:
            try:
                merged.update(json.loads(line))
            except json.JSONDecodeError:
                pass
    return merged
