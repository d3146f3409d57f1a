"""Sandboxes that run model-written Python: one interface, three backends, fail closed.

>>> from agentgym.envs.services.sandbox import best_sandbox
>>> with best_sandbox() as sb:                 # docker, else bwrap; logged
...     r = sb.run("print(input()[::-1])", stdin="abc", time_limit_s=2)
>>> r.stdout, r.exit_code, sb.name
('cba\\n', 0, 'docker')

``docker`` and ``bwrap`` are security boundaries for untrusted code; ``subprocess`` is not
(it only bounds time, memory, output and processes), so it is never chosen automatically and
runs only when named with the opt-in (``allow_unsafe=True`` or
``AGENTGYM_ALLOW_UNSAFE_SANDBOX=1``). With no isolating backend, selection raises
:class:`SandboxRefusedError` before any code runs (see ``selection.py``). Backends are imported
lazily, so this package imports without the Docker SDK or bwrap present.
"""
from .base import (DEFAULT_MAX_OUTPUT_BYTES, PROGRAM_NAME, ExecResult, Sandbox,
                   SandboxError)
from .image import DEFAULT_IMAGE, ImageBuildError, build_image
from .selection import (ALLOW_UNSAFE_ENV_VAR, BACKENDS, ISOLATING_BACKENDS, SANDBOX_SPECS,
                        SandboxRefusedError, available_backends, best_sandbox, default_backend,
                        make_sandbox, resolve_sandbox, sandbox_backend_name, select_backend,
                        unsafe_allowed)

__all__ = [
    "ALLOW_UNSAFE_ENV_VAR", "BACKENDS", "DEFAULT_IMAGE", "DEFAULT_MAX_OUTPUT_BYTES",
    "ISOLATING_BACKENDS", "PROGRAM_NAME", "SANDBOX_SPECS", "BwrapSandbox", "DockerSandbox",
    "ExecResult", "ImageBuildError", "Sandbox", "SandboxError", "SandboxRefusedError",
    "SubprocessSandbox", "WarmBwrapSandbox", "WarmDockerSandbox", "available_backends", "best_sandbox", "build_image", "default_backend",
    "make_sandbox", "resolve_sandbox", "sandbox_backend_name", "select_backend", "unsafe_allowed",
]


def __getattr__(name: str):  # lazy backend classes: no docker import unless asked for
    if name == "DockerSandbox":
        from .docker_sandbox import DockerSandbox
        return DockerSandbox
    if name == "WarmDockerSandbox":
        from .docker_warm import WarmDockerSandbox
        return WarmDockerSandbox
    if name == "WarmBwrapSandbox":
        from .bwrap_warm import WarmBwrapSandbox
        return WarmBwrapSandbox
    if name == "BwrapSandbox":
        from .bwrap_sandbox import BwrapSandbox
        return BwrapSandbox
    if name == "SubprocessSandbox":
        from .subprocess_sandbox import SubprocessSandbox
        return SubprocessSandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
