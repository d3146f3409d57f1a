"""Sandboxes that run model-written Python: one interface, three backends.

>>> from agentgym.envs.sandbox import best_sandbox
>>> with best_sandbox() as sb:                 # docker > bwrap > subprocess, logged
...     r = sb.run("print(input()[::-1])", stdin="abc", time_limit_s=2)
>>> r.stdout, r.exit_code, sb.name
('cba\\n', 0, 'docker')

``docker`` and ``bwrap`` are security boundaries for untrusted code; ``subprocess`` is not
(it only bounds time, memory, output and processes). Backends are imported lazily, so this
package imports without the Docker SDK or bwrap present.
"""
from .base import (DEFAULT_MAX_OUTPUT_BYTES, PROGRAM_NAME, ExecResult, Sandbox,
                   SandboxError)
from .image import DEFAULT_IMAGE, ImageBuildError, build_image
from .selection import BACKENDS, available_backends, best_sandbox, make_sandbox

__all__ = [
    "BACKENDS", "DEFAULT_IMAGE", "DEFAULT_MAX_OUTPUT_BYTES", "PROGRAM_NAME", "BwrapSandbox",
    "DockerSandbox", "ExecResult", "ImageBuildError", "Sandbox", "SandboxError",
    "SubprocessSandbox", "available_backends", "best_sandbox", "build_image", "make_sandbox",
]


def __getattr__(name: str):  # lazy backend classes: no docker import unless asked for
    if name == "DockerSandbox":
        from .docker_sandbox import DockerSandbox
        return DockerSandbox
    if name == "BwrapSandbox":
        from .bwrap_sandbox import BwrapSandbox
        return BwrapSandbox
    if name == "SubprocessSandbox":
        from .subprocess_sandbox import SubprocessSandbox
        return SubprocessSandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
