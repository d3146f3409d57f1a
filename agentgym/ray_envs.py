"""Environments in Ray actors: ``RolloutConfig(env_backend="ray")``.

Each env instance lives in its own Ray actor (``ray.remote``), so envs that are heavy or need their own
machines — a code sandbox, a retriever, a browser — run where the cluster puts them, e.g. on CPU nodes
(``env_resources={"num_cpus": 1, "resources": {"sandbox": 1}}``). The rollout engine talks to a
:class:`RayEnv` exactly as to a local env (``reset`` / ``step`` / ``get_wrapper_attr``), so trajectories
are the same as with the local thread pool for the same seeds.

A failed actor (killed, its node lost, the sandbox process crashed) never takes the batch down: the
step that hit the failure ends that episode as truncated with ``end_reason="env_actor_failed: …"`` in
its summary, and the proxy starts a fresh actor for the next ``reset``.

Ray itself: :func:`ensure_ray` calls ``ray.init()`` for a local cluster unless one is running, or
connects to ``address`` (an existing cluster started with Ray's own CLI: ``ray start --head`` on one
machine, ``ray start --address=HEAD:6379`` on the others).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

__all__ = ["RayEnv", "ensure_ray", "make_ray_envs"]

ACTOR_FAILED = "env_actor_failed"


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

    def __init__(self, factory: Callable[[], Any]):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
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


class RayEnv:
    """A local stand-in for an env living in a Ray actor (restarted after a failure)."""

    def __init__(self, factory: Callable[[], Any], *, resources: Mapping[str, Any] | None = None):
        import ray
        self._factory = factory
        options = dict(resources or {"num_cpus": 0})
        self._cls = ray.remote(_EnvHost).options(**options)
        self._attrs: dict[str, Any] = {}
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        self.actor = self._cls.remote(self._factory)

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
            is_callable, value = ray.get(self.actor.attr.remote(name))
            self._attrs[name] = (lambda *a, **k: ray.get(self.actor.call.remote(name, a, k))) if is_callable else value
        return self._attrs[name]

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


def make_ray_envs(env: Any, n: int, env_kwargs: Mapping[str, Any], *, address: str | None = None,
                  resources: Mapping[str, Any] | None = None) -> list[RayEnv]:
    """``n`` envs in actors. ``env``: a registered id (its Gymnasium ``EnvSpec`` travels to the actor, so
    user envs registered in the driver work too) or a picklable factory."""
    import functools

    ensure_ray(address)
    if callable(env) and not isinstance(env, str):
        factory: Callable[[], Any] = env
    else:
        import gymnasium as gym

        from agentgym.registry import full_id
        spec = gym.spec(full_id(env))
        factory = functools.partial(_make_from_spec, spec, dict(env_kwargs))
    return [RayEnv(factory, resources=resources) for _ in range(n)]


def _make_from_spec(spec: Any, kwargs: dict[str, Any]) -> Any:
    import gymnasium as gym

    import agentgym  # noqa: F401  (registers the built-ins in the actor's process)
    return gym.make(spec, **kwargs)
