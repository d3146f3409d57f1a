"""Host side of the warm sandboxes: a pool of long-lived runners (``runner.py``) that execute
job after job over one persistent channel each, with no process or container start per job.

A backend (docker, bwrap) only says how to start one runner and give back its channel
(:class:`Channel`); everything else is here: the frame protocol, the pool, recycling, and the
mapping of the runner's answers to :class:`ExecResult`. A runner is recycled (closed, and a
fresh one started in the background) after ``max_jobs`` jobs, as soon as it reports taint
(anything its post-job check could not clean) or a resource breach (an OOM kill, the pids
limit reached), and on any channel failure. Channel failures are infrastructure failures
(:class:`SandboxError`, retried once on a fresh runner by :meth:`Sandbox.run`).
"""
from __future__ import annotations

import abc
import base64
import json
import logging
import os
import queue
import select
import signal
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from .runner import BOOT, RUNNER_PARTS
from .base import (ExecResult, Job, Sandbox, SandboxError, DEFAULT_MAX_OUTPUT_BYTES, batch_job_kwargs,
                   looks_like_oom, make_job)

log = logging.getLogger("agentgym.sandbox")

#: The runner program (runner_job.py, then runner.py): one ``-c`` source, since the sandbox has nothing to import.
RUNNER_SOURCE = "\n".join(Path(__file__).with_name(name).read_text(encoding="utf-8") for name in RUNNER_PARTS)
#: Standard-library modules the runners import once and every job inherits already imported (a
#: job's own module of the same name in its work dir does not shadow these, unlike a bare python).
PRELOAD = ("unittest", "json", "re", "collections", "math", "itertools", "functools", "heapq", "bisect",
           "string", "random", "typing", "dataclasses", "fractions", "decimal")
JOB_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8"}


def runner_argv(python: str, config: Mapping[str, Any]) -> list[str]:
    """The command that starts a runner with ``config`` (see runner.py's ``cfg`` keys)."""
    config = {"preload": list(PRELOAD), **config}
    return [python, "-u", "-B", "-E", "-s", "-c", BOOT, RUNNER_SOURCE, json.dumps(config)]


class Channel(abc.ABC):
    """A byte stream to one runner: the runner's stdin (``send``) and stdout (``recv``)."""

    @abc.abstractmethod
    def send(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def recv(self, n: int, deadline: float) -> bytes:
        """Exactly ``n`` bytes by ``deadline`` (monotonic), else SandboxError."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def diagnostics(self) -> str:
        """What the runner wrote on stderr, for error messages."""
        return ""


class PipeChannel(Channel):
    """The stdin/stdout pipes of a local runner process (``subprocess.Popen``)."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self._err = bytearray()
        os.set_blocking(proc.stdout.fileno(), False)
        if proc.stderr is not None:
            os.set_blocking(proc.stderr.fileno(), False)

    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (OSError, ValueError) as e:
            raise SandboxError(f"runner channel closed ({e})") from e

    def recv(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        fd = self.proc.stdout.fileno()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError("runner did not answer in time")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(fd, n - len(out))
            except BlockingIOError:
                continue
            if not chunk:
                raise SandboxError("runner exited (channel closed)")
            out += chunk
        return bytes(out)

    def diagnostics(self) -> str:
        if self.proc.stderr is not None:
            try:
                self._err += os.read(self.proc.stderr.fileno(), 65536)
            except (BlockingIOError, OSError, ValueError):
                pass
        return self._err.decode("utf-8", "replace").strip()[-1000:]

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


def send_frame(channel: Channel, obj: Any) -> None:
    data = json.dumps(obj).encode("utf-8")
    channel.send(struct.pack(">I", len(data)) + data)


def recv_frame(channel: Channel, deadline: float) -> dict:
    (size,) = struct.unpack(">I", channel.recv(4, deadline))
    if size > 1 << 30:
        raise SandboxError(f"runner sent a frame of {size} bytes")
    try:
        frame = json.loads(channel.recv(size, deadline).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SandboxError(f"runner sent a bad frame: {e}") from e
    if not isinstance(frame, dict):
        raise SandboxError(f"runner sent a frame that is not an object: {str(frame)[:200]}")
    return frame


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Runner:
    """One started runner: its channel, how many jobs it ran, and how to stop it."""

    def __init__(self, channel: Channel, stop: Any, *, startup_timeout_s: float = 60.0) -> None:
        self.channel, self._stop, self.jobs = channel, stop, 0
        hello = recv_frame(channel, time.monotonic() + startup_timeout_s)
        if not hello.get("ready"):
            raise SandboxError(f"runner did not start: {hello}")

    def request(self, jobs: list[dict], timeout_s: float) -> dict:
        send_frame(self.channel, {"jobs": jobs})
        answer = recv_frame(self.channel, time.monotonic() + timeout_s)
        results = answer.get("results", [])
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            raise SandboxError(f"runner sent malformed results: {str(results)[:200]}")
        self.jobs += len(results)
        return answer

    def close(self) -> None:
        try:
            self.channel.close()
        finally:
            self._stop()


class RunnerPool:
    """``size`` warm runners, started ahead of demand and replaced in the background.

    Never more than ``size`` live runners: callers beyond that wait for one to come free (on a
    small machine more runners only add contention, and starting one costs far more than a job).
    """

    def __init__(self, start: Any, size: int) -> None:
        self._start, self.size = start, size
        self._ready: "queue.Queue[Runner]" = queue.Queue()
        self._lock = threading.Lock()
        self._live = 0  # started or starting, not yet closed
        self._error: BaseException | None = None
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=max(2, size), thread_name_prefix="agentgym-warm")
        self.started = 0  # runners started so far (a test and benchmark figure)

    def fill(self) -> None:
        """Start runners until ``size`` are live."""
        with self._lock:
            if self._closed:
                return
            need = max(self.size - self._live, 0)
            self._live += need
        for _ in range(need):
            self._executor.submit(self._make)

    def _make(self) -> None:
        try:
            runner = self._start()
        except BaseException as e:  # noqa: BLE001 - reported by acquire()
            with self._lock:
                self._live -= 1
            self._error = e
            log.warning("warm sandbox: could not start a runner: %s", e)
            return
        with self._lock:
            self.started += 1
            closed = self._closed
        self._error = None
        if closed:
            runner.close()
        else:
            self._ready.put(runner)

    def acquire(self, timeout_s: float) -> Runner:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._ready.get(timeout=0.05)
            except queue.Empty:
                pass
            with self._lock:
                live, error, closed = self._live, self._error, self._closed
            if closed:   # closed by another thread: no runner will come
                raise SandboxError("the sandbox was closed while waiting for a runner")
            if error is not None and live == 0:
                self._error = None
                raise SandboxError(f"could not start a sandbox runner: {error}")
            if live < self.size:
                self.fill()
            if time.monotonic() > deadline:
                raise SandboxError(f"no sandbox runner ready after {timeout_s:.0f} s")

    def release(self, runner: Runner) -> None:
        with self._lock:
            closed = self._closed
        if closed:
            self._close(runner)
        else:
            self._ready.put(runner)

    def _close(self, runner: Runner) -> None:
        try:
            runner.close()
        finally:
            with self._lock:
                self._live -= 1

    def recycle(self, runner: Runner) -> None:
        """Close ``runner`` in the background and start its replacement."""
        with self._lock:
            self._live -= 1
        try:
            self._executor.submit(runner.close)
        except RuntimeError:  # shut down concurrently
            runner.close()
        self.fill()

    def recycle_idle(self) -> None:
        """Recycle every idle runner: after one channel failed the others may be dead too (a daemon
        restart, the host's OOM killer), and the single retry must not land on one of them."""
        while True:
            try:
                runner = self._ready.get_nowait()
            except queue.Empty:
                return
            self.recycle(runner)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True)
        while True:
            try:
                self._close(self._ready.get_nowait())
            except queue.Empty:
                return


class WarmSandbox(Sandbox):
    """A :class:`Sandbox` served by a :class:`RunnerPool`; backends implement :meth:`_start_runner`."""

    #: Whether the runner's SIGKILL of a job means an OOM kill when the cgroup counter is unreadable.
    kill_means_oom = False

    def __init__(self, *, pool_size: int = 2, max_jobs: int = 1000, request_grace_s: float = 15.0,
                 acquire_timeout_s: float = 120.0, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> None:
        super().__init__(max_output_bytes=max_output_bytes)
        if pool_size < 1 or max_jobs < 1:
            raise ValueError("pool_size and max_jobs must be >= 1")
        self.max_jobs = max_jobs
        self.request_grace_s = request_grace_s
        self.acquire_timeout_s = acquire_timeout_s
        self.recycled: dict[str, int] = {}  # why -> how often (taint, breach, max_jobs, error)
        self._pool = RunnerPool(self._start_runner, pool_size)

    @abc.abstractmethod
    def _start_runner(self) -> Runner:
        """Start one runner (blocking) and return it once it said it is ready."""

    def _job_extras(self, job: Job) -> dict:
        """Backend-specific job fields (``nproc`` ...)."""
        return {}

    def _encode(self, job: Job) -> dict:
        return {"code": _b64(job.code), "stdin": _b64(job.stdin), "argv": list(job.argv),
                "files": {k: _b64(v) for k, v in job.files.items()}, "time_limit_s": job.time_limit_s,
                "memory_mb": job.memory_mb, "max_output_bytes": self.max_output_bytes,
                "fsize_mb": self._fsize_mb(), **self._job_extras(job)}

    def _fsize_mb(self) -> int:
        return int(getattr(self, "work_dir_mb", 64))

    # -- running ------------------------------------------------------------------------
    def run_batch(self, jobs: Sequence[Mapping[str, Any]]) -> list[ExecResult]:
        """Run several programs in one round trip to one warm runner, one after the other, each
        in its own fresh child with its own limits and result (keys as :meth:`run`'s arguments)."""
        if self._closed:
            raise SandboxError(f"{self.name} sandbox is closed")
        made = [self._make(spec) for spec in jobs]
        done: list[ExecResult] = []
        retried = False
        while len(done) < len(made):
            try:
                done += self._execute_many(made[len(done):])
            except SandboxError as e:
                if retried:
                    raise SandboxError(f"{self.name} sandbox failed twice: {e}") from e
                log.warning("%s sandbox: infrastructure failure (%s); retrying once", self.name, e)
                retried = True
                self._recover(e)
        return done

    def _make(self, spec: Mapping[str, Any]) -> Job:
        kw = batch_job_kwargs(spec)
        return make_job(kw["code"], kw.get("stdin", ""), kw.get("files"), kw.get("time_limit_s", 5.0),
                        kw.get("memory_mb", 256), kw.get("argv", ()), self._reserved_names())

    def _execute(self, job: Job) -> ExecResult:
        return self._execute_many([job])[0]

    def _execute_many(self, jobs: list[Job]) -> list[ExecResult]:
        """As many of ``jobs`` as one runner finished cleanly (>= 1), in order."""
        runner = self._pool.acquire(self.acquire_timeout_s)
        try:
            self._before_request(runner, jobs)
            timeout = sum(j.time_limit_s for j in jobs) + self.request_grace_s * len(jobs)
            answer = runner.request([self._encode(j) for j in jobs], timeout)
            results = [self._result(j, r) for j, r in zip(jobs, answer.get("results", []))]
        except SandboxError as e:
            self._note("error")
            # read before recycling: the close runs in the background, and a read after it lands on a
            # reused descriptor (a fresh runner's pipe) and can block for good
            said = runner.channel.diagnostics()
            self._pool.recycle(runner)
            raise SandboxError(f"{e} {said}".strip()) from e
        except BaseException:
            self._pool.recycle(runner)
            raise
        return self._answer(runner, jobs, answer, results)

    def _before_request(self, runner: Runner, jobs: list[Job]) -> None:
        """Adjust the runner to the jobs (docker: the memory limit)."""

    def _recover(self, error: SandboxError) -> None:
        """Before the single retry: fresh runners only (see :meth:`RunnerPool.recycle_idle`)."""
        self._pool.recycle_idle()

    def _answer(self, runner: Runner, jobs: list[Job], answer: dict, results: list[ExecResult]) -> list[ExecResult]:
        why = ("taint" if answer.get("taint") else "breach" if answer.get("breach") or self._breach(answer)
               else "died" if "died" in answer else "max_jobs" if runner.jobs >= self.max_jobs else None)
        if answer.get("taint"):
            log.warning("%s sandbox: recycling a tainted runner: %s", self.name, answer["taint"])
        if why is None:
            self._pool.release(runner)
        else:
            self._note(why)
            self._pool.recycle(runner)
        if "died" in answer and len(jobs) > 1:
            # the handler's results are lost with it and we cannot tell which job killed it: run
            # the first job alone (the caller's loop sends the rest again), so verdicts stay exact
            return self._execute_many(jobs[:1])
        if "died" in answer:  # the job killed its handler: its verdict is "killed"
            results.append(ExecResult("", "sandbox: the program killed its supervisor", None, False, False,
                                      0.0, False, self.name))
        if not results:
            raise SandboxError(f"runner answered without results: {str(answer)[:300]}")
        return results

    def _breach(self, answer: dict) -> bool:
        return False

    def _note(self, why: str) -> None:
        self.recycled[why] = self.recycled.get(why, 0) + 1

    def _result(self, job: Job, r: dict) -> ExecResult:
        """One job's result from the runner's answer; SandboxError when it is not what runner.py sends."""
        try:
            stdout = base64.b64decode(r["stdout"], validate=True)
            stderr = base64.b64decode(r["stderr"], validate=True)
            rc, timed_out, duration = r["returncode"], bool(r["timed_out"]), float(r["duration_s"])
            overflow = bool(r["overflow"])
            if rc is not None and type(rc) is not int:
                raise TypeError(f"returncode {rc!r}")
        except (KeyError, TypeError, ValueError) as e:   # binascii.Error is a ValueError
            raise SandboxError(f"runner sent a malformed result ({type(e).__name__}: {e}): {str(r)[:200]}") from None
        timed_out = timed_out or rc == -signal.SIGXCPU
        killed = rc is not None and rc < 0
        counted = r.get("oom_kills")
        oom = not timed_out and ((rc not in (0, None) and looks_like_oom(stderr)) or bool(counted)
                                 or (self.kill_means_oom and counted is None and rc == -signal.SIGKILL))
        return ExecResult(stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"),
                          None if (killed or rc is None) else rc, timed_out, oom, duration,
                          overflow, self.name)

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        self._pool.close()
