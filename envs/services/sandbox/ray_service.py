"""One sandbox per node for env actors on Ray (``RolloutConfig(env_backend="ray")``).

Env actors do not start sandboxes (a Docker pool, bwrap runners) of their own. In an env actor
(:func:`agentgym.ray_envs.node_services_wanted`), :func:`~agentgym.envs.services.sandbox.resolve_sandbox` hands out
a :class:`NodeSandbox`: a proxy whose ``run`` / ``run_batch`` calls go to the node's
:class:`SandboxService`, a named detached actor pinned to that node (started by the first env actor
that runs code, through :func:`agentgym.ray_envs.node_service`). The service's one warm pool serves
every env actor of the node, from many threads. The driver stops the services when its last env
closes (:func:`agentgym.ray_envs.close_node_services`).
"""

from __future__ import annotations

import os
from typing import Any

from agentgym.ray_envs import close_node_services, node_service

__all__ = ["NodeSandbox", "SandboxService", "close_node_sandboxes", "service_name"]

_PREFIX = "sandbox"


class SandboxService:
    """The body of a node's sandbox actor: one sandbox (one warm pool) for every env actor of the node."""

    def __init__(self, spec: str, allow_unsafe: bool):
        from .selection import resolve_sandbox
        self.sandbox = resolve_sandbox(spec, allow_unsafe=allow_unsafe)

    def info(self) -> dict[str, Any]:
        pool = getattr(self.sandbox, "_pool", None)
        return {"name": self.sandbox.name, "pid": os.getpid(), "runners_started": getattr(pool, "started", None)}

    def run(self, code: str, kwargs: dict[str, Any]) -> Any:
        return self.sandbox.run(code, **kwargs)

    def run_batch(self, jobs: list[dict[str, Any]]) -> Any:
        return self.sandbox.run_batch(jobs)


def service_name(spec: str, node_id: str) -> str:
    """The actor name of ``spec``'s sandbox service on node ``node_id``."""
    return f"{_PREFIX}-{spec}-{node_id}"


def _node_service(spec: str, allow_unsafe: bool) -> Any:
    """The handle of this node's sandbox service for ``spec``, started if it does not exist yet."""
    return node_service(f"{_PREFIX}-{spec}", SandboxService, spec, allow_unsafe)


class NodeSandbox:
    """What an env actor holds instead of a sandbox: forwards ``run``/``run_batch`` to its node's service.

    A service that died (its node process crashed) is started again on the next call, once.
    """

    is_security_boundary = True

    def __init__(self, spec: str, allow_unsafe: bool = False):
        import ray
        self.spec, self.allow_unsafe = spec, allow_unsafe
        self._actor = _node_service(spec, allow_unsafe)
        self.name = ray.get(self._actor.info.remote())["name"]

    def _call(self, method: str, *args: Any) -> Any:
        import ray
        from ray.exceptions import RayActorError
        try:
            return ray.get(getattr(self._actor, method).remote(*args))
        except RayActorError:
            self._actor = _node_service(self.spec, self.allow_unsafe)
            return ray.get(getattr(self._actor, method).remote(*args))

    def run(self, code: str, **kwargs: Any) -> Any:
        return self._call("run", code, kwargs)

    def run_batch(self, jobs: list[dict[str, Any]]) -> Any:
        return self._call("run_batch", [dict(j) for j in jobs])

    def info(self) -> dict[str, Any]:
        return self._call("info")

    def close(self) -> None:
        """Nothing to release here: the node's service outlives env actors (see close_node_sandboxes)."""


def close_node_sandboxes(wait_s: float = 15.0) -> int:
    """Kill every sandbox service (all nodes); returns how many (see ``close_node_services``)."""
    return close_node_services(f"{_PREFIX}-", wait_s)
