"""The warm-sandbox runner's job process (**C**; see ``runner.py`` for the whole program): a fork of the
handler turned into a fresh ``python main.py`` of the job, with nothing of the runner left for it to find.

This is the first part of the runner program; the host ships it with ``runner.py`` as one source text
(:data:`~.runner.RUNNER_PARTS`, joined in that order), because the sandbox has no agentgym installed and
no host files to import from. So it is standard library only, Python >= 3.8, and it starts by recording
the modules of a bare interpreter: a job starts with those, the configured ``preload`` modules and
nothing else. Its names are the program's globals; ``runner.py`` uses :func:`become_job`,
:class:`_BecomeJob`, :func:`_run_main`, :func:`preload`, :func:`_prctl` and the ``PR_*`` constants.
"""
import sys

_STARTUP_MODULES = set(sys.modules)  # what a bare interpreter has; C drops everything else

import base64  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402

RUNNER_FILE = "<agentgym-runner>"  # the name the runner's frames carry (BOOT compiles it so)
MiB = 1024 * 1024
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36


_LIBC = []


def _prctl(option, value):
    """prctl(2) through ctypes; libc is loaded once, in the zygote (a dlopen per job costs ms)."""
    try:
        if not _LIBC:
            import ctypes
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        _LIBC[0].prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def preload(names):
    """Import ``names`` once in the zygote (as multiprocessing's forkserver preload does); the jobs
    keep them and what they pulled in, so e.g. ``import unittest`` costs nothing per job."""
    before = set(sys.modules)
    for name in names:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - an optional module missing from the image
            pass
    prefixes = tuple(n + "." for n in names)
    _STARTUP_MODULES.update(n for n in sys.modules
                            if n not in before or n in names or n.startswith(prefixes))


def _exit_status(exc):
    """The exit code Python gives an uncaught SystemExit."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _excepthook(etype, value, tb):
    while tb is not None and tb.tb_frame.f_code.co_filename in (RUNNER_FILE, "<string>"):
        tb = tb.tb_next
    if isinstance(value, BaseException):
        value = value.with_traceback(tb)
    sys.__excepthook__(etype, value, tb)


def become_job(cfg, job, work, fds):
    """In the forked child: turn this process into ``python main.py`` of the job, run it, exit."""
    stdin_r, stdout_w, stderr_w = fds
    os.setsid()
    for target, fd in ((0, stdin_r), (1, stdout_w), (2, stderr_w)):
        os.dup2(fd, target)
    os.closerange(3, 65536)
    if cfg.get("oom_score_adj"):
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")  # the OOM killer takes the job, never the runner
        except OSError:
            pass
    cpu = int(job["time_limit_s"]) + 2
    limits = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_CORE, 0, 0),
              (resource.RLIMIT_NOFILE, 256, 256),
              (resource.RLIMIT_FSIZE, job["fsize_mb"] * MiB, job["fsize_mb"] * MiB)]
    if job.get("nproc"):
        limits.append((resource.RLIMIT_NPROC, job["nproc"], job["nproc"]))
    if cfg.get("rlimit_memory"):
        mem = job["memory_mb"] * MiB
        limits += [(resource.RLIMIT_AS, mem, mem), (resource.RLIMIT_DATA, mem, mem)]
    uid = cfg.get("job_uid")
    if uid is not None and os.getuid() != uid:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # from root: every capability is gone
    for res, soft, hard in limits:
        resource.setrlimit(res, (soft, hard))
    _prctl(PR_SET_DUMPABLE, 1)
    os.chdir(work)
    os.umask(0o022)
    os.environ.clear()
    os.environ.update(cfg["env"])
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it up
    # Unwind every runner frame (and with them the handler's copy of the request) before the
    # job's code runs: it must not find them on its stack. main() catches this.
    raise _BecomeJob([base64.b64decode(job["code"]), list(job["argv"]), work])


class _BecomeJob(BaseException):
    """Raised in the forked child to leave the runner's frames; carries [source, argv, work]."""


def _run_main(holder):
    """At the runner's top level, in the child: run the job's source as a fresh ``__main__``."""
    import io
    work = holder.pop()
    argv = holder.pop()
    for name in list(sys.modules):
        if name not in _STARTUP_MODULES and name != "__main__":
            del sys.modules[name]
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                                   write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", write_through=True)
    path = os.path.join(work, "main.py")
    sys.argv = ["main.py"] + argv
    sys.path[0] = work
    sys.excepthook = _excepthook
    main = type(sys)("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    status = 0
    try:
        exec(compile(holder.pop(), path, "exec"), main.__dict__)
    except SystemExit as e:
        status = _exit_status(e)
    except BaseException:  # noqa: BLE001 - printed like the interpreter does
        sys.excepthook(*sys.exc_info())
        status = 1
    status = _finalise(status)
    os._exit(status)


def _finalise(status):
    """What interpreter shutdown does: join non-daemon threads, atexit handlers, flush."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
    except SystemExit as e:
        status = _exit_status(e)
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            status = status or 120
    return status
