"""The one interface every code-execution backend implements.

Environments (CodeExec, Math, ...) only ever see :class:`Sandbox` and :class:`ExecResult`, so
the isolation technology (Docker, bubblewrap, plain subprocess) is a deployment choice, not a
code change. Contract:

* ``run`` executes one Python program and **never raises because of what the program does**
  (crash, timeout, memory bomb, output flood, fork bomb, ...): all of that is described by the
  returned :class:`ExecResult`.
* ``run`` raises :class:`SandboxError` only when the *infrastructure* fails (daemon gone, image
  missing, bwrap broken), and only after recycling the backend and retrying once.
* Inputs the *caller* gets wrong (a file name escaping the work dir, a negative time limit)
  raise ``ValueError`` at once: that is a bug in the environment, not in the model's code.
"""
from __future__ import annotations

import abc
import logging
import posixpath
import re
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Mapping, Sequence

from agentgym.errors import InfraError

log = logging.getLogger("agentgym.sandbox")

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
#: Name of the program file in the work dir; ``files`` may not use it.
PROGRAM_NAME = "main.py"
#: Flags every backend passes to the interpreter, so a program behaves the same everywhere:
#: unbuffered output (what was printed before a timeout kill is still seen), no .pyc writes,
#: PYTHON* variables and the user site ignored. The script's directory stays on ``sys.path``
#: (``-I``/``-P`` would drop it), so ``import solution`` finds a file passed in ``files``.
PYTHON_FLAGS: tuple[str, ...] = ("-u", "-B", "-E", "-s")

_MEMORY_MARKERS = re.compile(
    rb"MemoryError|Cannot allocate memory|out of memory|std::bad_alloc", re.IGNORECASE)


class SandboxError(InfraError):
    """The sandbox infrastructure failed (not the program): daemon down, image missing, ..."""


@dataclass(frozen=True)
class ExecResult:
    """What happened to one program run.

    ``exit_code`` is None when the program did not exit by itself (killed by a signal, by the
    time limit, by the memory limit or because its output overflowed ``max_output_bytes``).
    ``oom`` covers both an out-of-memory kill and a ``MemoryError`` the program died of.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    oom: bool
    duration_s: float
    output_truncated: bool
    backend: str

    @property
    def ok(self) -> bool:
        """True when the program ran to completion and exited with status 0."""
        return self.exit_code == 0 and not self.timed_out and not self.oom


@dataclass(frozen=True)
class Job:
    """A validated, normalised ``run`` request (bytes everywhere, safe relative file names)."""

    code: bytes
    stdin: bytes
    files: Mapping[str, bytes]
    time_limit_s: float
    memory_mb: int
    argv: tuple[str, ...]
    reserved_names: frozenset[str] = field(default=frozenset())


def _to_bytes(value: str | bytes, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"{what} must be str or bytes, not {type(value).__name__}")


def normalise_file_name(name: str) -> str:
    """Return ``name`` as a clean relative POSIX path inside the work dir, or raise ValueError."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"invalid sandbox file name {name!r}")
    clean = posixpath.normpath(name)
    if clean.startswith("/") or clean == "." or clean.split("/")[0] == "..":
        raise ValueError(f"sandbox file name {name!r} must stay inside the work dir")
    return clean


def make_job(code: str, stdin: str | bytes, files: Mapping[str, str | bytes] | None,
             time_limit_s: float, memory_mb: int, argv: Sequence[str],
             reserved: Sequence[str] = ()) -> Job:
    """Validate the caller's arguments once, for every backend alike."""
    if not isinstance(code, (str, bytes)):
        raise TypeError(f"code must be str, not {type(code).__name__}")
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s!r}")
    if int(memory_mb) < 16:
        raise ValueError(f"memory_mb must be >= 16, got {memory_mb!r}")
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a sequence of strings, not a single string")
    taken = {PROGRAM_NAME, *reserved}
    norm: dict[str, bytes] = {}
    for name, content in (files or {}).items():
        clean = normalise_file_name(name)
        if clean in taken or clean in norm:
            raise ValueError(f"sandbox file name {name!r} is reserved or given twice")
        norm[clean] = _to_bytes(content, f"files[{name!r}]")
    return Job(code=_to_bytes(code, "code"), stdin=_to_bytes(stdin, "stdin"), files=norm,
               time_limit_s=float(time_limit_s), memory_mb=int(memory_mb),
               argv=tuple(str(a) for a in argv), reserved_names=frozenset(taken))


BATCH_KEYS = frozenset({"code", "stdin", "files", "time_limit_s", "memory_mb", "argv"})


def batch_job_kwargs(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Check one ``run_batch`` job mapping: ``code`` and only :meth:`Sandbox.run`'s arguments."""
    if not isinstance(spec, Mapping) or "code" not in spec or set(spec) - BATCH_KEYS:
        keys = sorted(spec) if isinstance(spec, Mapping) else type(spec).__name__
        raise ValueError(f"a batch job needs 'code' and may have {sorted(BATCH_KEYS)}; got {keys}")
    return dict(spec)


class OutputCollector:
    """Keeps the first ``cap`` bytes of stdout+stderr (together) and notes any overflow."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.truncated = False

    @property
    def room(self) -> int:
        return self.cap - len(self.stdout) - len(self.stderr)

    def add(self, stream: int, data: bytes) -> bool:
        """Append ``data`` to stream 1 (stdout) or 2 (stderr); False once the cap is exceeded."""
        room = self.room
        if len(data) > room:
            data = data[:room]
            self.truncated = True
        (self.stdout if stream == 1 else self.stderr).extend(data)
        return not self.truncated

    def text(self) -> tuple[str, str]:
        return (self.stdout.decode("utf-8", "replace"), self.stderr.decode("utf-8", "replace"))


def looks_like_oom(stderr: bytes | bytearray) -> bool:
    """Heuristic for rlimit-based backends: the program died of an allocation failure.

    Under RLIMIT_AS an allocation fails instead of the kernel OOM-killing the process, so
    Python raises ``MemoryError`` (or a C extension reports ENOMEM / bad_alloc).
    """
    return bool(_MEMORY_MARKERS.search(bytes(stderr[-4096:])))


class Sandbox(abc.ABC):
    """Runs untrusted Python programs; see the module docstring for the contract."""

    #: Backend name, also written into every :class:`ExecResult` (``docker``, ``bwrap``, ...).
    name: str = "abstract"

    def __init__(self, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> None:
        if max_output_bytes <= 0:
            raise ValueError("max_output_bytes must be > 0")
        self.max_output_bytes = int(max_output_bytes)
        self._closed = False

    # -- public API ---------------------------------------------------------------------
    def run(self, code: str, *, stdin: str = "", files: Mapping[str, str] | None = None,
            time_limit_s: float = 5.0, memory_mb: int = 256,
            argv: Sequence[str] = ()) -> ExecResult:
        """Run ``code`` as ``main.py`` in a fresh work dir holding ``files``.

        ``time_limit_s`` is wall-clock time; ``memory_mb`` bounds the program's memory; output
        beyond ``max_output_bytes`` (stdout and stderr together) is cut off and the program is
        killed, like an "output limit exceeded" verdict. Infrastructure failures are retried
        once on a recycled backend, then raised as :class:`SandboxError`.
        """
        if self._closed:
            raise SandboxError(f"{self.name} sandbox is closed")
        job = make_job(code, stdin, files, time_limit_s, memory_mb, argv, self._reserved_names())
        try:
            return self._execute(job)
        except SandboxError as first:
            log.warning("%s sandbox: infrastructure failure (%s); recycling and retrying once",
                        self.name, first)
            try:
                self._recover(first)
                return self._execute(job)
            except SandboxError as second:
                raise SandboxError(f"{self.name} sandbox failed twice: {second}") from second

    def run_batch(self, jobs: Sequence[Mapping[str, Any]]) -> list[ExecResult]:
        """Run several programs (e.g. the test programs of one candidate), one result each.

        Each job is a mapping of :meth:`run`'s arguments (``code`` required; ``stdin``,
        ``files``, ``time_limit_s``, ``memory_mb``, ``argv``), so each has its own limits and
        its own fresh work dir. Warm backends send the whole batch to one runner in one round
        trip; this default runs them one after the other.
        """
        return [self.run(**batch_job_kwargs(spec)) for spec in jobs]

    def close(self) -> None:
        """Release every resource (containers, threads). Idempotent."""
        self._closed = True

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"

    # -- backend hooks ------------------------------------------------------------------
    @abc.abstractmethod
    def _execute(self, job: Job) -> ExecResult:
        """Run one job; raise SandboxError only for infrastructure failures."""

    def _recover(self, error: SandboxError) -> None:
        """Reset whatever failed before the single retry (default: nothing to reset)."""

    def _reserved_names(self) -> Sequence[str]:
        """File names the backend uses itself in the work dir."""
        return ()
