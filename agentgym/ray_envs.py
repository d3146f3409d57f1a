"""Environments in Ray actors: ``RolloutConfig(env_backend="ray")``.

Each env instance lives in its own Ray actor (``ray.remote``), so envs that are heavy or need their own
machines — a code sandbox, a retriever, a browser — run where the cluster puts them, e.g. on CPU nodes
(``env_resources={"num_cpus": 1, "resources": {"sandbox": 1}}``). The rollout engine talks to a
:class:`RayEnv` exactly as to a local env (``reset`` / ``step`` / ``get_wrapper_attr``), so trajectories
are the same as with the local thread pool for the same seeds.

A failed actor (killed, its node lost, the sandbox process crashed) never takes the batch down: the
step that hit the failure ends that episode as truncated with ``end_reason="env_actor_failed: …"`` in
its summary, and the proxy starts a fresh actor for the next ``reset``.

One service per node: env actors need not start heavy services (a Docker pool, bwrap runners) of
their own. This module offers the generic part: :func:`node_service` starts (or finds) a named detached
actor pinned to the node (``agentgym`` namespace), :func:`node_services_wanted` tells code running in
an env actor to use it, and the driver kills the node services when its last :class:`RayEnv` closes
(``node_services=False``: every actor process starts its own). The code sandbox is such a service
(its own package's ``ray_service`` module): the first env actor on a node that runs code starts the
node's sandbox service, and every env actor of the node sends its ``run`` / ``run_batch`` calls there;
the service's one warm pool serves them all, from many threads. The kernel never names the service.

Ray itself: :func:`ensure_ray` calls ``ray.init()`` for a local cluster unless one is running, or
connects to ``address`` (an existing cluster started with Ray's own CLI: ``ray start --head`` on one
machine, ``ray start --address=HEAD:6379`` on the others).
"""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any, Callable, Mapping

__all__ = ["RayEnv", "close_node_services", "ensure_ray", "make_ray_envs", "node_service", "node_services_wanted"]

ACTOR_FAILED = "env_actor_failed"
SERVICE_NAMESPACE = "agentgym"
# RayEnv proxies of this driver still open (weak: a proxy dropped without close() no longer counts, so an
# env leaked elsewhere in the process cannot keep the node services alive forever)
_OPEN_ENVS: "weakref.WeakSet[RayEnv]" = weakref.WeakSet()
# set in an env actor started with node_services=True (see node_services_wanted)
_NODE_SERVICES = [False]


def node_service(name: str, cls: type, *args: Any) -> Any:
    """The handle of this node's service actor ``name`` (``cls(*args)``), started if it does not exist yet.

    A node service is a named detached actor pinned to the node (namespace :data:`SERVICE_NAMESPACE`):
    every env actor of the node that asks for ``name`` gets the same one. A service package builds
    on this (the code sandbox does); the driver stops every node
    service when its last :class:`RayEnv` closes (:func:`close_node_services`)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    node = ray.get_runtime_context().get_node_id()
    return ray.remote(cls).options(
        name=f"{name}-{node}", namespace=SERVICE_NAMESPACE, get_if_exists=True, lifetime="detached",
        max_concurrency=64, num_cpus=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(*args)


def node_services_wanted() -> bool:
    """True in an env actor started with ``node_services=True``: services (a sandbox, …) should come
    from the node's one service actor (:func:`node_service`), not be started in this process."""
    return _NODE_SERVICES[0]


def _service_names(prefix: str = "") -> list[str]:
    from ray.util import list_named_actors
    return [entry["name"] for entry in list_named_actors(all_namespaces=True)
            if entry.get("namespace") == SERVICE_NAMESPACE and entry.get("name", "").startswith(prefix)]


def close_node_services(prefix: str = "", wait_s: float = 15.0) -> int:
    """Kill every node service (all nodes) whose name starts with ``prefix``; returns how many. Called
    when the driver's last env closes. ``ray.kill`` is asynchronous: this waits (up to ``wait_s``) until
    the services are gone from the cluster, so a caller that closes its last env and starts new ones
    never finds the old services."""
    import time

    import ray
    n = 0
    for name in _service_names(prefix):
        try:
            ray.kill(ray.get_actor(name, namespace=SERVICE_NAMESPACE))
            n += 1
        except ValueError:  # gone meanwhile
            pass
    deadline = time.monotonic() + wait_s
    while n and _service_names(prefix) and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start (or join) a Ray cluster once per process. ``address=None``: a local one with ``num_cpus``
    (default: this machine's cores)."""
    import ray
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, ignore_reinit_error=True, log_to_driver=False,
                 include_dashboard=False)


class _EnvHost:
    """The actor's body: one env, built from a picklable factory."""

    def __init__(self, factory: Callable[[], Any], node_services: bool = True):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        _NODE_SERVICES[0] = node_services  # e.g. sandboxes resolve to the node's one service, not a pool per actor
        self.env = factory()

    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> Any:
        return self.env.reset(seed=seed, options=dict(options) if options else None)

    def step(self, action: str) -> Any:
        return self.env.step(action)

    def attr(self, name: str) -> tuple[bool, Any]:
        """(is_callable, value): the env attribute ``name`` through its wrapper stack."""
        value = self.env.get_wrapper_attr(name)
        return (True, None) if callable(value) else (False, value)

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        return self.env.get_wrapper_attr(name)(*args, **kwargs)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.env.close()


class _Missing:
    """A cached "the env has no such attribute"."""

    def __init__(self, message: str):
        self.message = message


class RayEnv:
    """A local stand-in for an env living in a Ray actor (restarted after a failure)."""

    def __init__(self, factory: Callable[[], Any], *, resources: Mapping[str, Any] | None = None,
                 node_services: bool = True):
        import ray
        self._factory = factory
        self._node_services = node_services
        self._open = True
        _OPEN_ENVS.add(self)
        options = dict(resources or {"num_cpus": 0})
        self._cls = ray.remote(_EnvHost).options(**options)
        self._attrs: dict[str, Any] = {}
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        self.actor = self._cls.remote(self._factory, self._node_services)

    def _restart(self) -> None:
        import ray
        try:
            ray.kill(self.actor)
        except Exception:  # already dead
            pass
        self.restarts += 1
        self._start()

    @property
    def unwrapped(self) -> "RayEnv":
        return self

    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None) -> Any:
        import ray
        from ray.exceptions import RayActorError
        try:
            return ray.get(self.actor.reset.remote(seed, options))
        except RayActorError:  # died between episodes: a fresh actor, then reset
            self._restart()
            return ray.get(self.actor.reset.remote(seed, options))

    def step(self, action: str) -> Any:
        import ray
        from ray.exceptions import RayActorError, RaySystemError
        try:
            return ray.get(self.actor.step.remote(action))
        except (RayActorError, RaySystemError) as e:
            reason = f"{ACTOR_FAILED}: {type(e).__name__}"
            self._restart()   # the next reset starts from a fresh actor; this episode ends here
            info = {"reward_terms": {}, "action_type": "env_failure", "end_reason": reason,
                    "episode_summary": {"success": False, "end_reason": reason}}
            return [], 0.0, False, True, info

    def get_wrapper_attr(self, name: str) -> Any:
        import ray
        if name not in self._attrs:
            try:
                is_callable, value = ray.get(self.actor.attr.remote(name))
            except AttributeError as e:  # envs do not grow attributes: remember the miss (one round trip)
                self._attrs[name] = _Missing(str(e))
                raise
            self._attrs[name] = (lambda *a, **k: ray.get(self.actor.call.remote(name, a, k))) if is_callable else value
        found = self._attrs[name]
        if isinstance(found, _Missing):
            raise AttributeError(found.message)
        return found

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("actor",):
            raise AttributeError(name)
        try:
            return self.get_wrapper_attr(name)
        except AttributeError:
            raise
        except Exception as e:  # the remote lookup failed: say so as an AttributeError (hasattr works)
            raise AttributeError(f"{name}: {e}") from None

    def close(self) -> None:
        import ray
        try:
            ray.get(self.actor.close.remote(), timeout=30)
            ray.kill(self.actor)
        except Exception:
            pass
        if self._open:
            self._open = False
            _OPEN_ENVS.discard(self)
            if len(_OPEN_ENVS):
                gc.collect()   # proxies nobody references any more (never closed) are not users
            if not len(_OPEN_ENVS) and self._node_services:
                try:
                    close_node_services()
                except Exception:  # the cluster is already gone
                    pass


def make_ray_envs(env: Any, n: int, env_kwargs: Mapping[str, Any], *, address: str | None = None,
                  resources: Mapping[str, Any] | None = None, node_services: bool = True) -> list[RayEnv]:
    """``n`` envs in actors. ``env``: a registered id (its Gymnasium ``EnvSpec`` travels to the actor, so
    user envs registered in the driver work too) or a picklable factory. ``node_services``: services such as
    the code sandbox come from the node's one service actor (see the module docstring)."""
    import functools

    ensure_ray(address)
    if callable(env) and not isinstance(env, str):
        factory: Callable[[], Any] = env
    else:
        import gymnasium as gym

        from agentgym.registry import check_env_kwargs, full_id
        spec = gym.spec(full_id(env))
        check_env_kwargs(spec.id, dict(env_kwargs))  # a wrong name or type is said here, not in an actor
        factory = functools.partial(_make_from_spec, spec, dict(env_kwargs))
    return [RayEnv(factory, resources=resources, node_services=node_services) for _ in range(n)]


def _make_from_spec(spec: Any, kwargs: dict[str, Any]) -> Any:
    import gymnasium as gym

    import agentgym  # noqa: F401  (registers the built-ins in the actor's process)
    return gym.make(spec, **kwargs)
