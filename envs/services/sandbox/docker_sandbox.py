"""Docker backend, per-job path (``make_sandbox("docker", warm=False)``): a warm pool of
locked-down, single-use containers. The default docker sandbox is ``docker_warm.py`` (containers
reused job after job, verified clean between jobs); this module also holds the docker helpers
both share (connect, image check, stale-container reaping).

Each container is created ahead of time (so a run pays for one ``exec``, not a container
start), serves exactly **one** program, and is then removed and replaced in the background:
nothing a program leaves behind (files, processes, ``/dev/shm`` segments) can reach the next.
Health checks: the first container of a sandbox proves the image can run us (``exec`` of
``command -v bash timeout tar python3``); every container is inspected (must be running) when
taken from the pool. Any docker failure during a run recycles the container and the run is
retried once on a fresh one (see :meth:`Sandbox.run`). The price of single use: container
churn (~0.5 s of daemon work each on a 2-core machine) bounds the rate at ~2 runs/s there.

Lock-down of every container: no network (``network_mode="none"``), read-only root with
private tmpfs mounts for ``/work`` and ``/tmp``, uid/gid 65534, all capabilities dropped,
``no-new-privileges``, Docker's default seccomp profile, a memory cgroup limit without swap,
``nano_cpus`` and ``pids_limit``, and small nofile/core ulimits. Its own pid namespace hides
every host process.

How a job gets in: ``put_archive`` is refused for read-only roots ("container rootfs is marked
read-only", verified on Docker 20.10), so the job travels as a tar stream on the ``exec``'s
stdin: ``bash`` unpacks it into ``/work``, makes the stdin file the program's stdin, writes a
ready marker, runs ``timeout -s KILL <limit> python3 main.py`` and then kills every process
the program left behind (``kill -1``; the container's init is exempt). The marker tells a
program's own output apart from a failed setup. docker-py's ``exec_run`` has no timeout, so
we talk to the hijacked exec socket ourselves with a host-side deadline (limit + grace) as a
second line of defence: a process that escapes ``timeout``'s process group and keeps stdout
open cannot hang the caller.

Time and memory verdicts: ``timeout -s KILL`` and the OOM killer both end the program with
SIGKILL (status 137). The container's memory cgroup ``oom_kill`` counter decides (read from
the host's cgroup fs when the daemon is local, else from inside the container); if neither is
readable, a SIGKILL before the time limit is taken to be an OOM kill.
"""
from __future__ import annotations

import io
import logging
import os
import queue
import select
import shlex
import signal
import socket
import tarfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .base import (PROGRAM_NAME, PYTHON_FLAGS, DEFAULT_MAX_OUTPUT_BYTES, ExecResult, Job,
                   OutputCollector, Sandbox, SandboxError, looks_like_oom)
from .image import DEFAULT_IMAGE

log = logging.getLogger("agentgym.sandbox")

LABEL = "org.agentgym.sandbox"
OWNER_LABEL = "org.agentgym.sandbox.owner"
STDIN_NAME = ".agentgym_stdin"
_READY = b"\x1eagentgym-ready\x1e"  # printed by the setup script just before exec


def _owner_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _docker_errors() -> tuple[type[BaseException], ...]:
    import docker.errors
    import requests.exceptions
    return (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def connect(timeout_s: float = 30.0) -> Any:
    """A docker-py client for the daemon in the environment, or SandboxError saying why not."""
    try:
        import docker
    except ImportError as e:  # pragma: no cover - docker is a dependency
        raise SandboxError("the `docker` Python package is not installed") from e
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure here means "no daemon"
        raise SandboxError(f"Docker daemon not reachable ({e}); start it with "
                           f"scripts/setup_docker.sh or `dockerd &`") from e
    return client


def require_image(client: Any, image: str) -> None:
    import docker.errors
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound as e:
        raise SandboxError(f"Docker image {image!r} not found; build it with "
                           f"`agentgym sandbox build-image` (or scripts/setup_docker.sh)") from e
    except _docker_errors() as e:
        raise SandboxError(f"cannot inspect Docker image {image!r}: {e}") from e


def _job_tar(job: Job) -> bytes:
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for rel, data in {PROGRAM_NAME: job.code, **job.files, STDIN_NAME: job.stdin}.items():
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _raw_socket(obj: Any) -> socket.socket:
    """docker-py hands back a SocketIO for unix sockets; we want the socket itself."""
    return getattr(obj, "_sock", obj)


def _pump(sock: socket.socket, deadline: float,
          collector: OutputCollector) -> tuple[str, bool, bytes]:
    """Demultiplex Docker's framed exec stream until EOF, the deadline or the output cap.

    Returns (how it ended: "eof" | "deadline" | "overflow", whether the ready marker was
    seen, whatever the setup wrote before the marker).
    """
    buf = bytearray()
    ready = False
    setup = bytearray()  # stdout before the marker: the setup's own messages
    early_err = bytearray()  # stderr before the marker: Docker copies the two pipes
    # independently, so the program's first stderr can overtake the marker on stdout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "deadline", ready, bytes(setup if ready else setup + early_err)
        readable, _, _ = select.select([sock], [], [], remaining)
        if not readable:
            continue
        chunk = sock.recv(65536)
        if not chunk:
            return "eof", ready, bytes(setup if ready else setup + early_err)
        buf += chunk
        while len(buf) >= 8:
            size = int.from_bytes(buf[4:8], "big")
            if len(buf) < 8 + size:
                break
            stream, payload = buf[0], bytes(buf[8:8 + size])
            del buf[:8 + size]
            if not ready:
                if stream != 1:
                    early_err += payload
                    del early_err[collector.cap + 1:]  # enough to trip the cap later
                    continue
                setup += payload
                if _READY not in setup:
                    continue
                before, _, payload = bytes(setup).partition(_READY)
                setup, ready = bytearray(before), True
                if early_err and not collector.add(2, bytes(early_err)):
                    return "overflow", ready, bytes(setup)
            if payload and not collector.add(2 if stream == 2 else 1, payload):
                return "overflow", ready, bytes(setup)


class _ContainerPool:
    """Keeps ``size`` started, health-checked containers ready; creation/removal run in threads."""

    def __init__(self, create: Callable[[int], Any], size: int, memory_mb: int) -> None:
        self._create = create
        self.size = size
        self.memory_mb = memory_mb
        self._ready: "queue.Queue[tuple[Any, int]]" = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0
        self._error: BaseException | None = None
        self.live: set[str] = set()  # ids of every container we created and not yet removed
        self._executor = ThreadPoolExecutor(max_workers=size + 1,
                                            thread_name_prefix="agentgym-docker-pool")
        self._closed = False

    def fill(self) -> None:
        with self._lock:
            if self._closed:
                return
            need = self.size - self._ready.qsize() - self._pending
            self._pending += max(need, 0)
        for _ in range(max(need, 0)):
            self._executor.submit(self._make)

    def _make(self) -> None:
        mem = self.memory_mb
        try:
            container = self._create(mem)
            self._ready.put((container, mem))
            self._error = None
        except BaseException as e:  # noqa: BLE001 - reported by acquire()
            self._error = e
            log.warning("docker sandbox: could not start a container: %s", e)
        finally:
            with self._lock:
                self._pending -= 1

    def acquire(self, timeout_s: float) -> tuple[Any, int]:
        """A ready container (and its memory limit), checked to be running."""
        deadline = time.monotonic() + timeout_s
        self.fill()
        while True:
            try:
                container, mem = self._ready.get(timeout=0.05)
            except queue.Empty:
                with self._lock:
                    pending, error = self._pending, self._error
                if error is not None and pending == 0:
                    self._error = None
                    raise SandboxError(f"could not start a sandbox container: {error}")
                if time.monotonic() > deadline:
                    raise SandboxError(f"no sandbox container ready after {timeout_s:.0f} s")
                if pending == 0:
                    self.fill()
                continue
            try:  # health check: it may have died while waiting in the pool
                container.reload()
                if container.status == "running":
                    return container, mem
            except _docker_errors():
                pass
            self.discard(container)

    def discard(self, container: Any) -> None:
        """Remove a used (or broken) container in the background and start its replacement."""
        with self._lock:
            closed = self._closed
        if not closed:
            try:
                self._executor.submit(self.remove, container)
            except RuntimeError:  # executor shut down concurrently
                self.remove(container)
        else:
            self.remove(container)
        self.fill()

    def remove(self, container: Any) -> None:
        try:
            container.remove(force=True)
        except _docker_errors() as e:
            if "No such container" not in str(e) and "is already in progress" not in str(e):
                log.warning("docker sandbox: could not remove container %s: %s",
                            container.short_id, e)
        self.live.discard(container.id)

    def close(self) -> list[Any]:
        """Stop creating; return the containers that were still ready (caller removes)."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True)
        left = []
        while True:
            try:
                left.append(self._ready.get_nowait()[0])
            except queue.Empty:
                return left


def ping(client: Any) -> None:
    """Before a retry: the daemon still answers, or SandboxError."""
    try:
        client.ping()
    except Exception as e:  # noqa: BLE001
        raise SandboxError(f"Docker daemon not reachable ({e})") from e


def reap_stale(client: Any) -> None:
    """Remove sandbox containers left by dead processes on this host (crash, SIGKILL)."""
    host = socket.gethostname()
    try:
        stale = client.containers.list(all=True, filters={"label": LABEL})
    except _docker_errors():
        return
    for c in stale:
        owner = c.labels.get(OWNER_LABEL, "")
        h, _, pid = owner.rpartition(":")
        if h == host and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                c.remove(force=True)
            except _docker_errors():
                pass


def _remove_ids(client: Any, ids: set[str]) -> None:
    """Finaliser: remove whatever containers a forgotten sandbox still owns."""
    for cid in list(ids):
        try:
            client.api.remove_container(cid, force=True)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
        ids.discard(cid)


class DockerSandbox(Sandbox):
    """Runs each program in its own fresh, locked-down container from a warm pool."""

    name = "docker"
    is_security_boundary = True

    def __init__(self, image: str = DEFAULT_IMAGE, *, pool_size: int = 2,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, cpus: float = 1.0,
                 pids_limit: int = 64, memory_mb: int = 256, work_dir_mb: int = 64,
                 user: str = "65534:65534", python: str = "python3",
                 startup_grace_s: float = 10.0, acquire_timeout_s: float = 120.0,
                 client: Any = None) -> None:
        """``pool_size`` containers are kept started; ``memory_mb`` is the limit they are
        created with (a run asking for another limit updates its container's cgroup first)."""
        super().__init__(max_output_bytes=max_output_bytes)
        if pool_size < 1:
            raise ValueError("pool_size must be >= 1")
        self.image = image
        self.cpus = cpus
        self.pids_limit = pids_limit
        self.work_dir_mb = work_dir_mb
        self.user = user
        self.python = python
        self.startup_grace_s = startup_grace_s
        self.acquire_timeout_s = acquire_timeout_s
        self._client = client if client is not None else connect()
        require_image(self._client, image)
        command = " ".join(shlex.quote(a) for a in (python, *PYTHON_FLAGS, PROGRAM_NAME))
        self._script = "\n".join([
            "cd /work && tar -xmf - 2>&1 || exit 1",
            # the program's stdin; the shell's own stderr (its "Killed" notes) goes to
            # /dev/null, the program's to the saved fd 3 (bash: dash ignores this for notes)
            f"exec 0<{STDIN_NAME} 3>&2 2>/dev/null && rm -f {STDIN_NAME} || exit 1",
            "printf '\\036agentgym-ready\\036'",
            't=$1; shift',
            f'timeout -s KILL "$t" {command} "$@" 2>&3 3>&-',
            "s=$?",
            # end whatever the program left running (as the local backends do), so a
            # background child holding stdout cannot keep the run open
            "kill -s KILL -- -1",
            "exit $s"])
        self._image_checked = False
        self._reap_stale()
        self._pool = _ContainerPool(self._create_container, pool_size, memory_mb)
        self._finalizer = weakref.finalize(self, _remove_ids, self._client, self._pool.live)
        self._pool.fill()

    # -- containers ---------------------------------------------------------------------
    def _create_container(self, memory_mb: int) -> Any:
        from docker.types import Ulimit
        container = self._client.containers.create(
            self.image, command=["sleep", "infinity"], detach=True,
            network_mode="none", read_only=True,
            tmpfs={"/work": f"size={self.work_dir_mb}m,mode=1777",
                   "/tmp": f"size={self.work_dir_mb}m,mode=1777"},
            user=self.user, cap_drop=["ALL"], security_opt=["no-new-privileges"],
            mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m",
            nano_cpus=int(self.cpus * 1e9), pids_limit=self.pids_limit,
            ulimits=[Ulimit(name="nofile", soft=256, hard=256),
                     Ulimit(name="core", soft=0, hard=0)],
            environment={"HOME": "/work", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
                         "PATH": "/usr/local/bin:/usr/bin:/bin"},
            hostname="sandbox", labels={LABEL: "1", OWNER_LABEL: _owner_tag()})
        self._pool.live.add(container.id)
        try:
            container.start()
            if not self._image_checked:  # once per sandbox: the image has what we exec
                check = container.exec_run(["sh", "-c", "command -v bash timeout tar "
                                            f"{shlex.quote(self.python)}"])
                if check.exit_code != 0:
                    raise SandboxError(f"image {self.image!r} lacks one of bash, timeout, "
                                       f"tar, {self.python}")
                self._image_checked = True
        except BaseException:
            self._pool.remove(container)
            raise
        return container

    def _reap_stale(self) -> None:
        reap_stale(self._client)

    # -- running ------------------------------------------------------------------------
    def _reserved_names(self) -> tuple[str, ...]:
        return (STDIN_NAME,)

    def _execute(self, job: Job) -> ExecResult:
        container, mem = self._pool.acquire(self.acquire_timeout_s)
        try:
            if mem != job.memory_mb:
                self._pool.memory_mb = job.memory_mb  # replacements get the new limit
                container.update(mem_limit=f"{job.memory_mb}m",
                                 memswap_limit=f"{job.memory_mb}m")
            return self._exec(container, job)
        except SandboxError:
            raise
        except _docker_errors() as e:
            raise SandboxError(f"docker error: {e}") from e
        finally:
            self._pool.discard(container)  # single use: recycled whatever happened

    def _exec(self, container: Any, job: Job) -> ExecResult:
        api = self._client.api
        payload = _job_tar(job)
        collector = OutputCollector(self.max_output_bytes)
        start = time.monotonic()
        exec_id = api.exec_create(
            container.id, ["bash", "-c", self._script, "agentgym", f"{job.time_limit_s:.3f}",
                           *job.argv], stdin=True, stdout=True, stderr=True)["Id"]
        response = api.exec_start(exec_id, socket=True)
        sock = _raw_socket(response)
        deadline = start + job.time_limit_s + self.startup_grace_s
        try:
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            how, ready, setup = _pump(sock, deadline, collector)
        finally:
            sock.close()
            if response is not sock:
                response.close()
        duration = time.monotonic() - start
        if not ready:
            raise SandboxError(f"job setup failed in container {container.short_id} ({how}): "
                               + setup.decode("utf-8", "replace").strip()[-2000:])
        stdout, stderr = collector.text()
        if how != "eof":  # host deadline or output cap: the container is killed by removal
            return ExecResult(stdout, stderr, None, how == "deadline", False, duration,
                              collector.truncated, self.name)
        code = self._exit_code(exec_id)
        signo = code - 128 if 128 < code <= 128 + 64 else None
        oom = looks_like_oom(collector.stderr) and code != 0
        timed_out = False
        if signo == signal.SIGKILL:
            counted = self._oom_kills(container)
            if counted is None and not self._alive(container):
                # no counter because the container is gone (removed, daemon restart): not an OOM of the
                # job — seen under load, where the removal won the race against reading the counter
                raise SandboxError(f"container {container.short_id} died during the run")
            oom = oom or (counted > 0 if counted is not None else duration < job.time_limit_s)
            timed_out = not oom and duration >= job.time_limit_s
        if signo is not None and not (oom or timed_out) and not self._alive(container):
            # An unexplained kill may be the container itself dying (removed, daemon
            # restart): then its init is gone and a new exec fails -> retried elsewhere.
            raise SandboxError(f"container {container.short_id} died during the run")
        return ExecResult(stdout, stderr, None if signo is not None else code, timed_out, oom,
                          duration, collector.truncated, self.name)

    def _exit_code(self, exec_id: str) -> int:
        api = self._client.api
        for _ in range(100):  # the stream can close a moment before the exec is reaped
            info = api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.01)
        raise SandboxError("exec did not finish after its output stream closed")

    @staticmethod
    def _alive(container: Any) -> bool:
        """Whether the container still runs commands (a removed one answers with a docker error)."""
        try:
            return container.exec_run(["true"]).exit_code == 0
        except _docker_errors():
            return False

    def _oom_kills(self, container: Any) -> int | None:
        """OOM kills in the container's memory cgroup; None if no counter is readable."""
        cid = container.id
        for path in (f"/sys/fs/cgroup/memory/docker/{cid}/memory.oom_control",
                     f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.events",
                     f"/sys/fs/cgroup/docker/{cid}/memory.events"):
            try:
                with open(path) as f:
                    return _parse_oom_kill(f.read())
            except (OSError, ValueError):
                continue
        try:  # remote daemon: ask inside the container (cgroup namespace shows its own)
            out = container.exec_run(["sh", "-c", "cat /sys/fs/cgroup/memory/memory.oom_control"
                                      " /sys/fs/cgroup/memory.events 2>/dev/null"]).output
            return _parse_oom_kill(out.decode())
        except (ValueError, *_docker_errors()):
            return None

    def _recover(self, error: SandboxError) -> None:
        ping(self._client)

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        pool = getattr(self, "_pool", None)
        if pool is None:
            return
        for container in pool.close():
            pool.remove(container)
        _remove_ids(self._client, pool.live)


def _parse_oom_kill(text: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    raise ValueError("no oom_kill counter")
