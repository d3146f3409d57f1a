"""Pick the strongest sandbox this machine offers, and say which one was picked.

Order of strength: ``docker`` (cgroups, seccomp, read-only image, single-use containers) >
``bwrap`` (namespaces + rlimits) > ``subprocess`` (rlimits only: **not a security boundary**).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Sequence

from .base import DEFAULT_MAX_OUTPUT_BYTES, Sandbox, SandboxError
from .image import DEFAULT_IMAGE

log = logging.getLogger("agentgym.sandbox")

BACKENDS: tuple[str, ...] = ("docker", "bwrap", "subprocess")
#: Comma-separated backend preference used when ``best_sandbox(prefer=None)``.
ENV_VAR = "AGENTGYM_SANDBOX"


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


def available_backends(image: str = DEFAULT_IMAGE) -> dict[str, str]:
    """Backend name -> "ok", or the reason it cannot be used here (checked live)."""
    return {"docker": _check_docker(image), "bwrap": _check_bwrap(),
            "subprocess": _check_subprocess()}


def make_sandbox(backend: str, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 image: str = DEFAULT_IMAGE, pool_size: int = 2, **options: Any) -> Sandbox:
    """Construct one named backend (``options`` go to its constructor)."""
    if backend == "docker":
        from .docker_sandbox import DockerSandbox
        return DockerSandbox(image, pool_size=pool_size, max_output_bytes=max_output_bytes,
                             **options)
    if backend == "bwrap":
        from .bwrap_sandbox import BwrapSandbox
        return BwrapSandbox(max_output_bytes=max_output_bytes, **options)
    if backend == "subprocess":
        from .subprocess_sandbox import SubprocessSandbox
        return SubprocessSandbox(max_output_bytes=max_output_bytes, **options)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose from {BACKENDS}")


def best_sandbox(prefer: Sequence[str] | None = None, *,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, image: str = DEFAULT_IMAGE,
                 pool_size: int = 2) -> Sandbox:
    """The first usable backend in ``prefer`` order, logged at INFO (and in ``.name``).

    ``prefer=None`` means ``$AGENTGYM_SANDBOX`` (e.g. ``"bwrap,subprocess"``) or all three,
    strongest first. Only the listed backends are tried: asking for ``["docker"]`` never
    silently yields a weaker sandbox; SandboxError lists every reason instead.
    """
    if prefer is None:
        env = os.environ.get(ENV_VAR, "").strip()
        prefer = [b.strip() for b in env.split(",") if b.strip()] if env else list(BACKENDS)
    if isinstance(prefer, str):
        prefer = [prefer]
    for b in prefer:
        if b not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {b!r}; choose from {BACKENDS}")
    reasons: dict[str, str] = {}
    for backend in prefer:
        status = {"docker": lambda: _check_docker(image), "bwrap": _check_bwrap,
                  "subprocess": _check_subprocess}[backend]()
        if status != "ok":
            reasons[backend] = status
            continue
        try:
            sandbox = make_sandbox(backend, max_output_bytes=max_output_bytes, image=image,
                                   pool_size=pool_size)
        except SandboxError as e:
            reasons[backend] = str(e)
            continue
        skipped = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        if backend == "subprocess":
            log.warning("agentgym sandbox: using the subprocess backend, which is NOT a "
                        "security boundary%s", f" (unavailable: {skipped})" if skipped else "")
        else:
            log.info("agentgym sandbox: using the %s backend%s", backend,
                     f" (unavailable: {skipped})" if skipped else "")
        return sandbox
    raise SandboxError("no sandbox backend available: "
                       + "; ".join(f"{k}: {v}" for k, v in reasons.items()))
