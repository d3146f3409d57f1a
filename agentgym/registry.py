"""Registration in Gymnasium's registry under the ``agentgym/`` namespace.

Built-in envs are registered by *string* entry points, so ``import agentgym`` imports no concrete
env (the kernel stays independent of ``agentgym.envs``); the module loads on first ``make``.
A user's env registers exactly the same way.
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym

__all__ = ["NAMESPACE", "register", "make", "list_envs", "spec", "full_id"]

NAMESPACE = "agentgym"
_REGISTER_OPTIONS = {"reward_threshold", "nondeterministic", "max_episode_steps", "order_enforce",
                     "disable_env_checker", "additional_wrappers", "vector_entry_point"}

# id -> entry point of the envs shipped with agentgym
BUILTIN_ENVS: dict[str, str] = {
    "Arithmetic-v0": "agentgym.envs.arithmetic:ArithmeticEnv",
    "SearchQA-v0": "agentgym.envs.searchqa.env:SearchQAEnv",
    "ToolCall-v0": "agentgym.envs.toolcall:ToolCallEnv",
    "CodeExec-v0": "agentgym.envs.codeexec.env:CodeExecEnv",
    "Math-v0": "agentgym.envs.mathrl.env:MathEnv",
    "ReAct-v0": "agentgym.envs.react:ReActEnv",
}


def full_id(env_id: str) -> str:
    """``"Foo-v0"`` → ``"agentgym/Foo-v0"``; ids with another namespace are left alone."""
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def register(id: str, entry_point: str | Callable[..., gym.Env], **kwargs: Any) -> str:
    """Register an env under ``agentgym/``.

    Keyword arguments named like :func:`gymnasium.register`'s options (``max_episode_steps``,
    ``order_enforce``, …) go there; everything else (and a ``kwargs=`` dict) becomes default
    constructor arguments of the env. Returns the full id. Registering an id again replaces it
    (Gymnasium warns).
    """
    if "/" in id and not id.startswith(NAMESPACE + "/"):
        raise ValueError(f"agentgym.register puts envs in the {NAMESPACE!r} namespace; got {id!r}")
    env_kwargs = dict(kwargs.pop("kwargs", None) or {})
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in _REGISTER_OPTIONS}
    env_kwargs.update(kwargs)
    fid = full_id(id)
    gym.register(id=fid, entry_point=entry_point, kwargs=env_kwargs, **options)
    return fid


def make(id: str, **kwargs: Any) -> gym.Env:
    """:func:`gymnasium.make` with the ``agentgym/`` namespace optional and a helpful error."""
    fid = full_id(id)
    if fid not in gym.registry:
        raise gym.error.NameNotFound(f"no env {fid!r}; registered agentgym envs: {', '.join(list_envs()) or 'none'}")
    return gym.make(fid, **kwargs)


def list_envs() -> list[str]:
    """All registered ids in the ``agentgym/`` namespace (built-in and user-registered)."""
    return sorted(k for k in gym.registry if k.startswith(NAMESPACE + "/"))


def spec(id: str) -> gym.envs.registration.EnvSpec:
    return gym.spec(full_id(id))


def _register_builtins() -> None:
    for env_id, entry in BUILTIN_ENVS.items():
        if full_id(env_id) not in gym.registry:
            register(env_id, entry)
