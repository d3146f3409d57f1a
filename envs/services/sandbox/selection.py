"""Pick a sandbox backend, share it, and refuse to run code when nothing isolates it.

Order of strength: ``docker`` (cgroups, seccomp, read-only image, containers verified clean
between jobs) >
``bwrap`` (namespaces + rlimits) > ``subprocess`` (rlimits only: **not a security boundary**).

Fail closed. Model-written code is untrusted, so the default (``"auto"``) considers only the two
isolating backends. When neither works, :class:`SandboxRefusedError` says why each failed, how
to fix that and how to opt in to the unsafe backend. ``subprocess`` runs only when it is named
*and* opted in to: ``allow_unsafe=True`` or ``AGENTGYM_ALLOW_UNSAFE_SANDBOX=1``. Naming it in
``AGENTGYM_SANDBOX`` is not an opt-in, and ``"auto"`` never falls back to it, opt-in or not, so
a machine that loses Docker never starts running code on the host silently.

Environments ask this module for their sandbox (:func:`resolve_sandbox`); they never build one
themselves nor import each other for it. Named sandboxes are created once per process and
shared, so a pool of many envs starts one Docker pool, not one each.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Sequence

from .base import DEFAULT_MAX_OUTPUT_BYTES, Sandbox, SandboxError
from .image import DEFAULT_IMAGE

log = logging.getLogger("agentgym.sandbox")

BACKENDS: tuple[str, ...] = ("docker", "bwrap", "subprocess")
#: The backends that are a security boundary; ``"auto"`` chooses among these only.
ISOLATING_BACKENDS: tuple[str, ...] = ("docker", "bwrap")
#: What an env's ``sandbox=`` argument may name (besides a ``Sandbox`` instance).
SANDBOX_SPECS: tuple[str, ...] = ("auto", *BACKENDS)
#: Comma-separated backend preference that ``"auto"`` follows (e.g. ``"bwrap,docker"``).
ENV_VAR = "AGENTGYM_SANDBOX"
#: Set to 1 to allow the ``subprocess`` backend wherever it is named (same as ``allow_unsafe=True``).
ALLOW_UNSAFE_ENV_VAR = "AGENTGYM_ALLOW_UNSAFE_SANDBOX"
#: Environment variables that change what a probe finds; part of every cache key.
_PROBE_ENV = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "AGENTGYM_BWRAP")


class SandboxRefusedError(SandboxError):
    """No acceptable backend: nothing isolating works here, or ``subprocess`` lacks the opt-in.

    Raised before any code runs. ``reasons`` maps each backend considered to why it was not used.
    """

    def __init__(self, message: str, reasons: dict[str, str]) -> None:
        super().__init__(message)
        self.reasons = dict(reasons)


def unsafe_allowed(allow_unsafe: bool = False) -> bool:
    """The explicit opt-in to the ``subprocess`` backend: the argument or the environment variable.

    Only a real ``True`` counts: a string such as ``"False"`` from a config file is an error, not a
    truthy opt-in.
    """
    if not isinstance(allow_unsafe, bool):
        raise TypeError(f"allow_unsafe must be True or False, got {allow_unsafe!r}")
    flag = os.environ.get(ALLOW_UNSAFE_ENV_VAR, "").strip().lower()
    return allow_unsafe or flag in ("1", "true", "yes", "on")


_NOT_OPTED_IN = (f"not a security boundary; used only with allow_unsafe=True or "
                 f"{ALLOW_UNSAFE_ENV_VAR}=1")
FIX_HINT = ("Fix: `bash scripts/setup_docker.sh` (installs and starts Docker, builds the sandbox "
            "image) or `apt-get install bubblewrap`; `agentgym sandbox status` shows what works.")
UNSAFE_HINT = ("Only for trusted code, run it on this host WITHOUT isolation by opting in "
               f"explicitly: sandbox=\"subprocess\" together with allow_unsafe=True or "
               f"{ALLOW_UNSAFE_ENV_VAR}=1.")


def refusal_message(reasons: dict[str, str], *, unsafe_requested: bool = False) -> str:
    """The one message users see when no code will run: why, how to fix it, how to opt in."""
    if unsafe_requested:
        head = ("refusing the \"subprocess\" sandbox: it runs model-written code on this host "
                "with no isolation, and the unsafe opt-in was not given.")
    else:
        head = ("no isolating sandbox works here, so no model-written code will run "
                "(agentgym sandboxes fail closed).")
    lines = [head] + [f"  {name}: {why}" for name, why in reasons.items()]
    working = [b for b in ISOLATING_BACKENDS if reasons.get(b) == "ok"]
    fix = (f"Fix: use sandbox=\"auto\" (the default); isolating backends that work here: {', '.join(working)}."
           if working else FIX_HINT)
    return "\n".join(lines + [fix, UNSAFE_HINT])


# --------------------------------------------------------------------------- probes
def _check_docker(image: str) -> str:
    from .docker_sandbox import connect, require_image
    try:
        client = connect(timeout_s=10)
        try:
            require_image(client, image)
        finally:
            client.close()
    except SandboxError as e:
        return str(e)
    return "ok"


def _check_bwrap() -> str:
    from .bwrap_sandbox import BwrapSandbox
    try:
        with BwrapSandbox() as sb:
            r = sb.run("print('ok')", time_limit_s=10)
    except SandboxError as e:
        return str(e)
    if r.exit_code != 0 or r.stdout.strip() != "ok":
        return f"bwrap probe failed: exit {r.exit_code}: {r.stderr.strip()[-300:]}"
    return "ok"


def _check_subprocess() -> str:
    from .subprocess_sandbox import SubprocessSandbox
    try:
        SubprocessSandbox()
    except SandboxError as e:
        return str(e)
    return "ok"


def _probe(backend: str, image: str) -> str:
    if backend == "docker":
        return _check_docker(image)
    return _check_bwrap() if backend == "bwrap" else _check_subprocess()


_PROBED_OK: set[tuple[Any, ...]] = set()  # successful probes only: a failure may be transient
_LOCK = threading.RLock()


def _probe_key(backend: str, image: str) -> tuple[Any, ...]:
    return (backend, image, *(os.environ.get(v) for v in _PROBE_ENV))


def _probe_cached(backend: str, image: str) -> str:
    key = _probe_key(backend, image)
    if key in _PROBED_OK:
        return "ok"
    status = _probe(backend, image)
    if status == "ok":
        _PROBED_OK.add(key)
    return status


def available_backends(image: str = DEFAULT_IMAGE) -> dict[str, str]:
    """Backend name -> "ok", or the reason it cannot be used here (checked live, no cache).

    This is about whether a backend *works*; whether it may be used is :func:`default_backend`'s
    question (``subprocess`` works almost everywhere and still needs the opt-in).
    """
    found = {backend: _probe(backend, image) for backend in BACKENDS}
    _PROBED_OK.update(_probe_key(b, image) for b, status in found.items() if status == "ok")
    return found


def preference(spec: str = "auto") -> list[str]:
    """The backends ``spec`` may use, in order: ``"auto"`` = ``$AGENTGYM_SANDBOX`` or the
    isolating ones; a backend name = just that one."""
    env = os.environ.get(ENV_VAR, "").strip() if spec == "auto" else ""
    if env:
        return _normalise([b.strip() for b in env.split(",") if b.strip()], f" (from ${ENV_VAR})")
    return list(ISOLATING_BACKENDS) if spec == "auto" else _normalise(spec)


def _normalise(prefer: Sequence[str] | str | None, where: str = "") -> list[str]:
    if prefer is None:
        return preference("auto")
    out = [prefer] if isinstance(prefer, str) else list(prefer)
    for b in out:
        if b not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {b!r}{where}; choose from {BACKENDS}")
    if not out:
        raise ValueError(f"an empty list of sandbox backends{where}")
    return out


def _first_usable(prefer: list[str], allow_unsafe: bool, image: str,
                  reasons: dict[str, str]) -> str | None:
    """The first backend of ``prefer`` that may be used and works; fills ``reasons`` for the rest."""
    for backend in prefer:
        if backend == "subprocess" and not unsafe_allowed(allow_unsafe):
            reasons[backend] = _NOT_OPTED_IN
            continue
        status = _probe_cached(backend, image)
        if status == "ok":
            return backend
        reasons[backend] = status
    return None


def _refuse(prefer: list[str], reasons: dict[str, str], image: str) -> SandboxRefusedError:
    """The error for "nothing in ``prefer`` may run code"; names every isolating backend's state."""
    unsafe_requested = "subprocess" in prefer and reasons.get("subprocess") == _NOT_OPTED_IN
    for backend in ISOLATING_BACKENDS:  # say what is missing even when they were not asked for
        if backend not in reasons:
            reasons[backend] = _probe_cached(backend, image)
    ordered = {b: reasons[b] for b in BACKENDS if b in reasons}
    return SandboxRefusedError(refusal_message(ordered, unsafe_requested=unsafe_requested), ordered)


def select_backend(prefer: Sequence[str] | str | None = None, *, allow_unsafe: bool = False,
                   image: str = DEFAULT_IMAGE) -> str:
    """The backend :func:`best_sandbox` would use, without starting it (probes are cached).

    Raises :class:`SandboxRefusedError` when there is none (``TypeError`` for a non-bool
    ``allow_unsafe``). Cheap enough for env constructors, so a run fails before it loads a model
    rather than at its first code execution.
    """
    unsafe_allowed(allow_unsafe)  # a bad flag fails here, whichever backend is chosen
    prefer = _normalise(prefer)
    reasons: dict[str, str] = {}
    with _LOCK:
        backend = _first_usable(prefer, allow_unsafe, image, reasons)
        if backend is None:
            raise _refuse(prefer, reasons, image)
    return backend


def default_backend(image: str = DEFAULT_IMAGE) -> tuple[str | None, dict[str, str]]:
    """What ``sandbox="auto"`` would use here (honouring ``$AGENTGYM_SANDBOX`` and the opt-in
    variable) and, if nothing, the reasons. For ``agentgym sandbox status``."""
    try:
        return select_backend(None, image=image), {}
    except SandboxRefusedError as e:
        return None, e.reasons


def make_sandbox(backend: str, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 image: str = DEFAULT_IMAGE, pool_size: int = 2, allow_unsafe: bool = False,
                 warm: bool = True, **options: Any) -> Sandbox:
    """Construct one named backend (``options`` go to its constructor).

    ``warm=True`` (the default): docker and bwrap keep long-lived sandboxes that run job after
    job and are verified clean between jobs (``warm.py``, ``runner.py``); ``warm=False``: the
    older one-container / one-bwrap-per-job backends. ``"subprocess"`` needs the opt-in
    (``allow_unsafe=True`` or the environment variable).
    """
    unsafe_allowed(allow_unsafe)
    if backend == "docker":
        if warm:
            from .docker_warm import WarmDockerSandbox
            return WarmDockerSandbox(image, pool_size=pool_size, max_output_bytes=max_output_bytes,
                                     **options)
        from .docker_sandbox import DockerSandbox
        return DockerSandbox(image, pool_size=pool_size, max_output_bytes=max_output_bytes,
                             **options)
    if backend == "bwrap":
        if warm:
            from .bwrap_warm import WarmBwrapSandbox
            return WarmBwrapSandbox(pool_size=pool_size, max_output_bytes=max_output_bytes,
                                    **options)
        from .bwrap_sandbox import BwrapSandbox
        return BwrapSandbox(max_output_bytes=max_output_bytes, **options)
    if backend == "subprocess":
        if not unsafe_allowed(allow_unsafe):
            raise _refuse(["subprocess"], {"subprocess": _NOT_OPTED_IN}, image)
        from .subprocess_sandbox import SubprocessSandbox
        return SubprocessSandbox(max_output_bytes=max_output_bytes, **options)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose from {BACKENDS}")


def best_sandbox(prefer: Sequence[str] | str | None = None, *,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, image: str = DEFAULT_IMAGE,
                 pool_size: int = 2, allow_unsafe: bool = False) -> Sandbox:
    """A new sandbox of the first usable backend in ``prefer`` order, logged (and in ``.name``).

    ``prefer=None`` means ``$AGENTGYM_SANDBOX`` or docker then bwrap. Only the listed backends
    are tried, so asking for ``["docker"]`` never yields a weaker sandbox; ``"subprocess"`` is
    skipped unless opted in. Nothing usable: :class:`SandboxRefusedError` with every reason.
    """
    unsafe_allowed(allow_unsafe)
    prefer = _normalise(prefer)
    reasons: dict[str, str] = {}
    remaining = list(prefer)
    while remaining:
        backend = _first_usable(remaining, allow_unsafe, image, reasons)
        if backend is None:
            break
        remaining = remaining[remaining.index(backend) + 1:]
        try:
            sandbox = make_sandbox(backend, max_output_bytes=max_output_bytes, image=image,
                                   pool_size=pool_size, allow_unsafe=True)  # opt-in checked above
        except SandboxError as e:
            reasons[backend] = str(e)
            continue
        skipped = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        if backend == "subprocess":
            log.warning("agentgym sandbox: using the subprocess backend (opted in), which is NOT "
                        "a security boundary%s", f" (not used: {skipped})" if skipped else "")
        else:
            log.info("agentgym sandbox: using the %s backend%s", backend,
                     f" (not used: {skipped})" if skipped else "")
        return sandbox
    raise _refuse(prefer, reasons, image)


# --------------------------------------------------------------------------- shared sandboxes
_SHARED: dict[tuple[Any, ...], Sandbox] = {}
#: When set (``set_sandbox_provider``), named specs resolve through it instead of starting a
#: sandbox in this process. Env actors on Ray use their node's one sandbox service without it
#: (``_provider``, ray_service.py).
_PROVIDER: list[Callable[[str, bool], Any]] = []


def set_sandbox_provider(provider: Callable[[str, bool], Any] | None) -> None:
    """Make :func:`resolve_sandbox` return ``provider(spec, allow_unsafe)`` for named specs (cached
    per spec and opt-in) instead of a sandbox of this process; ``None`` restores the default."""
    with _LOCK:
        _PROVIDER[:] = [provider] if provider is not None else []
        for key in [k for k in _SHARED if k and k[0] == "provided"]:
            del _SHARED[key]


def _provider() -> Callable[[str, bool], Any] | None:
    """The provider named specs resolve through: the one set, else (in a Ray env actor that wants node
    services) the node's sandbox service, else None (a sandbox of this process)."""
    if _PROVIDER:
        return _PROVIDER[0]
    from agentgym.ray_envs import node_services_wanted
    if node_services_wanted():
        from .ray_service import NodeSandbox
        return NodeSandbox
    return None


def _check_spec(spec: Any) -> None:
    if isinstance(spec, str):
        if spec not in SANDBOX_SPECS:
            raise ValueError(f"unknown sandbox {spec!r}; use one of {SANDBOX_SPECS} or a Sandbox instance")
    elif not callable(getattr(spec, "run", None)):
        raise TypeError(f"sandbox must be a name {SANDBOX_SPECS} or an object with run(code, ...), "
                        f"got {spec!r}")


def sandbox_backend_name(spec: Any = "auto", *, allow_unsafe: bool = False) -> str:
    """The backend ``resolve_sandbox(spec, allow_unsafe=...)`` gives, without starting it.

    Env constructors call this so that a refusal comes at construction, before any code runs.
    A ``Sandbox`` instance is the caller's own choice and is taken as it is.
    """
    _check_spec(spec)
    unsafe_allowed(allow_unsafe)
    if not isinstance(spec, str):
        return str(getattr(spec, "name", type(spec).__name__))
    return select_backend(preference(spec), allow_unsafe=allow_unsafe)


def resolve_sandbox(spec: Any = "auto", *, allow_unsafe: bool = False) -> Any:
    """The process-wide sandbox for ``spec``: ``"auto"``, a backend name, or a ``Sandbox`` instance
    (returned as it is). Created on first request and shared by every env asking for the same
    backend (each ``run`` is independent); refused as :func:`best_sandbox` refuses."""
    _check_spec(spec)
    if not isinstance(spec, str):
        return spec
    prefer = preference(spec)
    provider = _provider()
    with _LOCK:
        if provider is not None:
            key = ("provided", spec, allow_unsafe)
            if key not in _SHARED:
                _SHARED[key] = provider(spec, allow_unsafe)
            return _SHARED[key]
        backend = select_backend(prefer, allow_unsafe=allow_unsafe)
        key = (backend, *(os.environ.get(v) for v in _PROBE_ENV))
        shared = _SHARED.get(key)
        if shared is None or getattr(shared, "_closed", False):
            # select_backend vetted the opt-in; best_sandbox still falls through to a later
            # backend of ``prefer`` should this one fail to start.
            shared = best_sandbox(prefer[prefer.index(backend):], allow_unsafe=allow_unsafe)
            _SHARED[key] = shared
        return shared


class LazySandbox:
    """An env's handle on a code sandbox: the backend is chosen (and refused, failing closed) when the
    handle is made, before any code runs or a model loads; the sandbox itself starts on first use and is
    the node's shared one (:func:`resolve_sandbox`). CodeExec-v0 and HumanEval-v0 hold one each."""

    def __init__(self, spec: Any = "auto", allow_unsafe: bool = False):
        self.spec, self.allow_unsafe = spec, allow_unsafe
        # no isolating backend and no explicit unsafe opt-in -> SandboxRefusedError here, saying why
        self._backend = sandbox_backend_name(spec, allow_unsafe=allow_unsafe)
        self._sandbox: Any = None

    def get(self) -> Any:
        """The sandbox, started on first use."""
        if self._sandbox is None:
            self._sandbox = resolve_sandbox(self.spec, allow_unsafe=self.allow_unsafe)
        return self._sandbox

    @property
    def started(self) -> bool:
        return self._sandbox is not None

    @property
    def backend(self) -> str:
        """The backend code runs in (``docker``, ``bwrap`` or, opted in, ``subprocess``)."""
        return self._sandbox.name if self._sandbox is not None else self._backend

