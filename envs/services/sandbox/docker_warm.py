"""Warm, reused Docker sandboxes: one long-lived container per runner, many jobs per container.

Each container runs ``runner.py`` as its pid 1 (``python3 -c``: nothing is written into the
image) and talks to the host over its own stdin/stdout, attached once when it is created
(Docker's attach stream: 8-byte headers multiplex stdout and stderr); no ``docker exec`` per job.
Per job the runner forks a fresh child that drops to uid 65534 with no capabilities (the
runner itself is root with only SETUID, SETGID, KILL, CHOWN, DAC_OVERRIDE and FOWNER: what it
needs to start, kill and clean up after jobs of another uid), and after the job kills every
process but itself, wipes /work, /tmp, /dev/shm and /dev/mqueue and checks the container is
clean (see runner.py). The host recycles a container after ``max_jobs`` jobs, on any taint, on
an OOM kill or on reaching the pids limit, and whenever the channel fails.

Lock-down as for the single-use containers (``docker_sandbox.py``): no network, read-only root,
private tmpfs mounts, ``no-new-privileges``, Docker's default seccomp profile, memory (no swap),
CPU and pids limits. The memory limit is the job's ``memory_mb`` plus :data:`RUNNER_MB` for the
runner; a job asking for another limit updates the container's cgroup first. The job gets
``oom_score_adj`` 1000, so the OOM killer takes the job, not the runner; the cgroup's
``oom_kill`` counter (read by the runner before and after each job) gives the OOM verdict.
"""
from __future__ import annotations

import socket
import struct
import time
import weakref
from typing import Any

from .base import DEFAULT_MAX_OUTPUT_BYTES, Job, SandboxError
from .docker_sandbox import (LABEL, OWNER_LABEL, _docker_errors, _owner_tag, _raw_socket, _remove_ids, connect,
                             ping, reap_stale, require_image)
from .image import DEFAULT_IMAGE
from .warm import JOB_ENV, Channel, Runner, WarmSandbox, runner_argv

#: Memory the runner itself (zygote + handler) may use on top of the job's ``memory_mb``.
RUNNER_MB = 48
RUNNER_CAPS = ["SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"]
JOB_UID = 65534


class AttachChannel(Channel):
    """A container's attached stdin/stdout/stderr (one hijacked HTTP connection)."""

    def __init__(self, sock: Any) -> None:
        self._holder = sock
        self.sock = _raw_socket(sock)
        self._out = bytearray()
        self._err = bytearray()
        self._raw = bytearray()

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise SandboxError(f"container channel closed ({e})") from e

    def recv(self, n: int, deadline: float) -> bytes:
        while len(self._out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError("the container's runner did not answer in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError as e:
                raise SandboxError(f"container channel failed ({e})") from e
            if not chunk:
                raise SandboxError("the container's runner exited (channel closed)")
            self._raw += chunk
            self._demux()
        data = bytes(self._out[:n])
        del self._out[:n]
        return data

    def _demux(self) -> None:
        while len(self._raw) >= 8:
            stream, size = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
            if len(self._raw) < 8 + size:
                return
            (self._out if stream == 1 else self._err).extend(self._raw[8:8 + size])
            del self._raw[:8 + size]

    def diagnostics(self) -> str:
        return self._err.decode("utf-8", "replace").strip()[-1000:]

    def close(self) -> None:
        for obj in (self.sock, self._holder):
            try:
                obj.close()
            except OSError:
                pass


class WarmDockerSandbox(WarmSandbox):
    """Locked-down containers that each run many jobs (see the module docstring)."""

    name = "docker"
    is_security_boundary = True
    kill_means_oom = True

    def __init__(self, image: str = DEFAULT_IMAGE, *, pool_size: int = 2, max_jobs: int = 1000,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, cpus: float = 1.0, pids_limit: int = 64,
                 memory_mb: int = 256, work_dir_mb: int = 64, python: str = "python3",
                 client: Any = None) -> None:
        self.image, self.cpus, self.pids_limit = image, cpus, pids_limit
        self.memory_mb, self.work_dir_mb, self.python = memory_mb, work_dir_mb, python
        self._client = client if client is not None else connect()
        require_image(self._client, image)
        reap_stale(self._client)
        self.live: set[str] = set()  # ids of every container we created and not yet removed
        self._finalizer = weakref.finalize(self, _remove_ids, self._client, self.live)
        super().__init__(pool_size=pool_size, max_jobs=max_jobs, max_output_bytes=max_output_bytes)
        self._pool.fill()

    def _start_runner(self) -> Runner:
        from docker.types import Ulimit
        api = self._client.api
        cfg = {"work": "/work", "wipe": ["/tmp", "/dev/shm", "/dev/mqueue"], "job_uid": JOB_UID,
               "oom_score_adj": True, "rlimit_memory": False, "env": JOB_ENV}
        mem = self.memory_mb
        host_config = api.create_host_config(
            network_mode="none", read_only=True,
            tmpfs={"/work": f"size={self.work_dir_mb}m,mode=755", "/tmp": f"size={self.work_dir_mb}m,mode=1777"},
            cap_drop=["ALL"], cap_add=RUNNER_CAPS, security_opt=["no-new-privileges"],
            mem_limit=f"{mem + RUNNER_MB}m", memswap_limit=f"{mem + RUNNER_MB}m",
            nano_cpus=int(self.cpus * 1e9), pids_limit=self.pids_limit,
            ulimits=[Ulimit(name="nofile", soft=1024, hard=1024), Ulimit(name="core", soft=0, hard=0)])
        try:
            cid = api.create_container(
                self.image, command=runner_argv(self.python, cfg), user="0:0", stdin_open=True, tty=False,
                environment={"LANG": "C.UTF-8", "PATH": JOB_ENV["PATH"]}, hostname="sandbox",
                labels={LABEL: "1", OWNER_LABEL: _owner_tag()}, host_config=host_config)["Id"]
        except _docker_errors() as e:
            raise SandboxError(f"could not create a sandbox container: {e}") from e
        self.live.add(cid)

        def stop() -> None:
            try:
                api.remove_container(cid, force=True)
            except _docker_errors():
                pass
            self.live.discard(cid)

        try:
            sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            api.start(cid)
            runner = Runner(AttachChannel(sock), stop, startup_timeout_s=60)
        except BaseException as e:
            stop()
            if isinstance(e, _docker_errors()):
                raise SandboxError(f"could not start a sandbox container: {e}") from e
            raise
        runner.container_id, runner.memory_mb = cid, mem  # type: ignore[attr-defined]
        return runner

    def _before_request(self, runner: Runner, jobs: list[Job]) -> None:
        need = max(j.memory_mb for j in jobs)
        if need != getattr(runner, "memory_mb", need):
            limit = f"{need + RUNNER_MB}m"
            try:
                self._client.api.update_container(runner.container_id,  # type: ignore[attr-defined]
                                                  mem_limit=limit, memswap_limit=limit)
            except _docker_errors() as e:
                raise SandboxError(f"could not set the container's memory limit: {e}") from e
            runner.memory_mb = need  # type: ignore[attr-defined]
            self.memory_mb = need  # new containers start with the limit last asked for

    def _recover(self, error: SandboxError) -> None:
        ping(self._client)
        super()._recover(error)

    def close(self) -> None:
        super().close()  # idempotent: stops the pool, closing the ready runners' containers
        _remove_ids(self._client, self.live)  # and whatever a busy or failed runner left
