"""The warm-sandbox runner: runs *inside* a long-lived container (or bwrap namespace) and executes
one job after another, each in a freshly forked child, and proves the sandbox clean after each.

Standard library only, Python >= 3.8, Linux. The host starts it as
``python3 -u -B -E -s -c BOOT <the runner's source> <config json>`` (see :data:`BOOT`) and talks to it
over the process's stdin/stdout: frames of a 4-byte big-endian length + UTF-8 JSON. Bytes
(code, files, stdin, output) travel base64-encoded.

Processes (three levels, so that no job's data outlives its job):

* **Z** (the zygote, pid 1 of the sandbox's pid namespace): imports everything once, never reads
  a job. For each request it forks **H** and waits for it, reaping orphans meanwhile. If H dies
  without answering (a job killed it: only possible where jobs share the runner's uid, i.e.
  bwrap), Z kills everything, wipes, and answers ``{"died": ...}`` itself; the host recycles.
* **H** (the handler, one per request): reads the request frame, and per job prepares an empty
  work dir, forks **C**, feeds its stdin, collects its output under the cap, kills it at the
  deadline, then cleans: ``kill(-1, SIGKILL)`` until no process but Z and H is left (setsid,
  double forks, daemons: all gone), wipes the work dir, /tmp, /dev/shm and /dev/mqueue, and
  checks what it cannot wipe (SysV IPC objects, mounts) -- anything left is reported as taint.
* **C** (the job): a fork of H turned into a fresh ``python main.py``: own session and process
  group, the job uid (docker: 65534, while Z/H are root with a few capabilities), rlimits, a
  clean environment, fresh ``__main__``, fresh stdio; the modules the runner imported beyond
  the interpreter's startup set and the configured ``preload`` list are dropped, so the job
  imports its own.

Frame formats: request ``{"jobs": [job, ...]}`` with job ``{"code", "files", "stdin", "argv",
"time_limit_s", "memory_mb", "max_output_bytes", "nproc", "fsize_mb"}``; answer
``{"results": [...], "taint": [...], "breach": [...]}``. A result holds ``stdout``, ``stderr``,
``returncode`` (negative: signal), ``timed_out``, ``overflow``, ``oom_kills``, ``duration_s``,
``killed`` (processes swept after the job).

One program in two files, one source text: the host ships the runner as the ``-c`` program of the
sandbox's pid 1 (``warm.py``'s ``RUNNER_SOURCE``), and the sandbox has no agentgym installed and no host
files to import from, so the files of :data:`RUNNER_PARTS` are joined, in order, into that one text and
share its globals. ``runner_job.py`` (first: it records a bare interpreter's modules) is the job process
C; this file is the rest: framing, cleanliness checks, the handler H, the zygote Z and ``main``.
"""
import base64
import json
import os
import selectors
import signal
import stat
import struct
import sys
import time

if __name__ != "__main__":  # on the host (tests, tools); in the sandbox runner_job.py ran just before
    from .runner_job import (PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, _BecomeJob, _prctl, _run_main, become_job,
                             preload)

#: The ``-c`` program that starts the runner: its frames are named, so tracebacks hide them.
BOOT = "import sys;exec(compile(sys.argv[1],'<agentgym-runner>','exec'))"
#: The files of the runner program, in the order the host joins them into the one ``-c`` source.
RUNNER_PARTS = ("runner_job.py", "runner.py")
_OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
_PIDS_FILES = ("/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events")


# ------------------------------------------------------------------ framing
def read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame(fd):
    head = read_exact(fd, 4)
    if head is None:
        return None
    body = read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body.decode("utf-8"))


def write_frame(fd, obj):
    data = json.dumps(obj).encode("utf-8")
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


# ------------------------------------------------------------------ cleanliness
def _other_pids():
    """Pids in our pid namespace other than pid 1 (Z) and ourselves."""
    me = os.getpid()
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) not in (1, me)]


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(timeout_s=3.0):
    """Kill every process but Z and us; return how many were seen, and whether any survived."""
    seen = set()
    deadline = time.monotonic() + timeout_s
    while True:
        left = _other_pids()
        if not left:
            return len(seen), False
        seen.update(left)
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        _reap()
        if time.monotonic() > deadline:
            return len(seen), True
        time.sleep(0.001)


def _remove_tree(path):
    """rm -rf that also enters directories a job made unreadable (mode 0)."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass
    try:
        names = os.listdir(path)
    except OSError:
        names = []
    for name in names:
        _remove_tree(os.path.join(path, name))
    try:
        os.rmdir(path)
    except OSError:
        pass


def wipe(path, mode=None):
    """Remove everything below ``path`` (not ``path`` itself, whose ``mode`` is restored first);
    return what could not be removed."""
    if mode is not None:
        try:
            os.chmod(path, mode)
        except OSError:
            pass
    try:
        for name in os.listdir(path):
            _remove_tree(os.path.join(path, name))
        left = os.listdir(path)
    except (OSError, RecursionError) as e:
        return ["%s: %r" % (path, e)]
    return ["%s/%s" % (path, n) for n in left]


def ipc_objects():
    """SysV IPC objects (they outlive processes; we cannot remove another uid's without caps)."""
    found = []
    for kind in ("shm", "msg", "sem"):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        found += ["sysv %s %s" % (kind, line.split()[1]) for line in lines if line.strip()]
    return found


def mounts():
    try:
        with open("/proc/self/mountinfo") as f:
            return sorted(" ".join(line.split()[3:6]) for line in f)
    except OSError:
        return []


def read_counter(paths, key):
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == key:
                        return int(v)
        except (OSError, ValueError):
            continue
    return None


# ------------------------------------------------------------------ the handler (H)
def _prepare_work(cfg, job):
    work = cfg["work"]
    uid = cfg.get("job_uid")
    files = dict(job.get("files") or {})
    files["main.py"] = job["code"]
    for rel, data in files.items():
        full = os.path.join(work, rel)
        parent = os.path.dirname(full)
        if not os.path.isdir(parent):
            os.makedirs(parent, exist_ok=True)
        with open(full, "wb") as f:
            f.write(base64.b64decode(data))
    if uid is not None and os.getuid() != uid:
        for root, dirs, names in os.walk(work):
            for name in dirs + names:
                os.chown(os.path.join(root, name), uid, uid)
        os.chown(work, uid, uid)
    os.chmod(work, 0o755)
    return work


def _pump(pid, stdin, out_r, err_r, deadline, cap):
    """Feed stdin, collect output until the job's leader exits, the deadline or the cap."""
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    outs = {out_r: bytearray(), err_r: bytearray()}
    for fd in outs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)
    stdin_fd, pending = stdin
    stdin_open = bool(pending)
    if pending:
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
    else:
        os.close(stdin_fd)
    how = None
    while how is None:
        left = deadline - time.monotonic()
        if left <= 0:
            how = "deadline"
            break
        for key, _ in sel.select(left if pidfd is not None else min(left, 0.01)):
            fd = key.fileobj
            if fd == pidfd:
                how = "exit"
            elif fd == stdin_fd:
                try:
                    pending = pending[os.write(stdin_fd, pending[:65536]):]
                except BlockingIOError:
                    pass
                except OSError:
                    pending = b""
                if not pending:
                    sel.unregister(stdin_fd)
                    os.close(stdin_fd)
                    stdin_open = False
            elif not _drain(fd, outs, cap):
                sel.unregister(fd)
            if sum(map(len, outs.values())) > cap:
                how = "overflow"
        if how is None and pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
            how = "exit"
    if how == "exit":  # what the leader wrote is in the pipes: take only what is there now
        for fd in list(outs):
            _drain(fd, outs, cap)
        if sum(map(len, outs.values())) > cap:
            how = "overflow"
    if stdin_open:
        os.close(stdin_fd)
    sel.close()
    if pidfd is not None:
        os.close(pidfd)
    return how, outs[out_r], outs[err_r]


def _drain(fd, outs, cap):
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not data:
            return False
        outs[fd].extend(data[:cap + 1])
        if sum(map(len, outs.values())) > cap:
            return True


def run_job(cfg, job):
    """Run one job in a fresh child and leave the sandbox clean; returns (result, taint)."""
    work = _prepare_work(cfg, job)
    oom_before = read_counter(_OOM_FILES, "oom_kill")
    pids_before = read_counter(_PIDS_FILES, "max")
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(stdin_w)
        os.close(out_r)
        os.close(err_r)
        become_job(cfg, job, work, (stdin_r, out_w, err_w))  # never returns
    for fd in (stdin_r, out_w, err_w):
        os.close(fd)
    cap = int(job["max_output_bytes"])
    how, out, err = _pump(pid, (stdin_w, base64.b64decode(job.get("stdin") or "")), out_r, err_r,
                          start + float(job["time_limit_s"]), cap)
    try:
        os.killpg(pid, signal.SIGKILL)  # leader not reaped yet: the group id is still its own
    except OSError:
        pass
    _, status = os.waitpid(pid, 0)
    duration = time.monotonic() - start
    t_swept = time.monotonic()
    killed, survivors = sweep()
    t_swept = time.monotonic() - t_swept
    os.close(out_r)
    os.close(err_r)
    taint = ["processes survived the kill"] if survivors else []
    for path in [work] + cfg["wipe"]:
        if os.path.isdir(path):
            taint += ["left: " + p for p in wipe(path, cfg["_modes"].get(path))[:5]]
    taint += ipc_objects()
    if mounts() != cfg["_mounts"]:
        taint.append("mount table changed")
    t_clean = time.monotonic() - start - duration
    oom_after = read_counter(_OOM_FILES, "oom_kill")
    pids_after = read_counter(_PIDS_FILES, "max")
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    total = len(out) + len(err)
    if total > cap:  # keep the first ``cap`` bytes, stdout first (as the host's collector)
        out = out[:cap]
        err = err[:max(0, cap - len(out))]
    result = {"stdout": base64.b64encode(bytes(out)).decode(), "stderr": base64.b64encode(bytes(err)).decode(),
              "returncode": None if how in ("deadline", "overflow") else rc, "signal_rc": rc,
              "timed_out": how == "deadline", "overflow": how == "overflow", "duration_s": duration,
              "oom_kills": None if oom_before is None or oom_after is None else oom_after - oom_before,
              "killed": killed, "clean_s": t_clean, "sweep_s": t_swept,
              "pids_max_hits": None if pids_before is None or pids_after is None else pids_after - pids_before}
    return result, taint


def handle(cfg):
    """H: one request frame in, one answer frame out."""
    request = read_frame(0)
    if request is None:
        os._exit(4)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    results, taint, breach = [], [], []
    for job in request["jobs"]:
        result, dirty = run_job(cfg, job)
        results.append(result)
        taint += dirty
        if result["oom_kills"]:
            breach.append("oom")
        if result["pids_max_hits"]:
            breach.append("pids")
        if dirty or breach:
            break  # the rest runs on a fresh sandbox (the host sends it again)
    write_frame(1, {"results": results, "taint": taint, "breach": breach})
    os._exit(0)


# ------------------------------------------------------------------ the zygote (Z)
def zygote(cfg):
    _prctl(PR_SET_DUMPABLE, 0)  # jobs of the same uid (bwrap) cannot ptrace or read us
    cfg["_mounts"] = mounts()
    cfg["_modes"] = {}
    for path in [cfg["work"]] + cfg["wipe"]:
        if os.path.isdir(path):
            cfg["_modes"][path] = stat.S_IMODE(os.stat(path).st_mode)
            wipe(path)
    write_frame(1, {"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
    while True:
        pid = os.fork()
        if pid == 0:
            handle(cfg)
        status = _wait_for(pid)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        if code == 4:
            os._exit(0)  # the host closed the channel
        if code != 0:
            killed, _ = sweep()
            for path in [cfg["work"]] + cfg["wipe"]:
                if os.path.isdir(path):
                    wipe(path, cfg["_modes"].get(path))
            write_frame(1, {"died": "the job handler died (status %r) after a job killed it" % status,
                            "killed": killed})
            os._exit(0)  # never serve again: the host starts a fresh sandbox


def _wait_for(pid):
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if got == pid:
            return status


def main():
    cfg = json.loads(sys.argv[2])
    preload(cfg.get("preload", ()))
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        zygote(cfg)
    except _BecomeJob as e:  # in a job's child: everything below main() is unwound now
        holder = e.args[0]
        e.__traceback__ = None
        return holder
    except BaseException as e:  # noqa: BLE001 - say why on stderr (the host logs it)
        sys.stderr.write("agentgym runner failed: %r\n" % (e,))
        os._exit(3)
    os._exit(3)


if __name__ == "__main__" and len(sys.argv) > 2:
    _run_main(main())
