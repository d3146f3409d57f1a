"""Any agentgym env as a SkyRL-gym environment, for training with SkyRL-train.

SkyRL-train's generator builds one environment per trajectory with
``skyrl_gym.make(env_class, env_config=..., extras=...)``, where ``extras`` holds the dataset row's columns
other than ``prompt`` and ``env_class`` (plus ``max_turns``, set from ``generator.max_turns``), then calls
``init(prompt) -> (messages, metadata)`` once and ``step(action) -> {observations, reward, done, metadata}``
until ``done`` (skyrl-gym's ``BaseTextEnv`` interface, read from ``skyrl_gym/envs/base_text_env.py`` and
SkyRL's ``skyrl_gym_generator.py``). :class:`SkyRLEnv` maps that onto one agentgym episode:

* ``init`` resets the env on the task the row names (``task_index``, ``seed`` or a whole ``task``, taken
  from ``extras`` or from ``extras["extra_info"]``, SkyRL's usual place for per-row data) and returns the
  env's first messages, which replace the row's prompt: the env owns its prompt, as in agentgym;
* ``step`` passes the assistant's text through; the observation is the env's new chat messages as they
  are (tool results stay ``role: tool``), the reward is the env's step reward (SkyRL sums turn-level
  rewards, as our returns do), ``done`` is terminated or truncated, and ``metadata`` carries the reward
  terms, the action type, an ``infra_error`` if the infrastructure failed, and the episode summary on the
  last step;
* ``get_metrics`` gives the numeric parts of the episode summary (success, turns, tool calls, ...).

:func:`register_skyrl` puts an env in skyrl-gym's registry under its agentgym id; SkyRL-train registers
environments inside its entrypoint task, so call it there (see ``docs/protocols.md``).
"""

from __future__ import annotations

from typing import Any, Mapping

import agentgym
from agentgym.registry import check_env_kwargs, full_id

try:
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("agentgym.adapters.skyrl needs skyrl-gym: pip install skyrl-gym") from e

__all__ = ["SkyRLEnv", "register_skyrl", "dataset_row"]

#: ``info`` keys passed on in each step's metadata
_STEP_KEYS = ("action_type", "reward_terms", "turn", "answer", "infra_error")
#: where a dataset row names its task, looked up in ``extras`` and then in ``extras["extra_info"]``
_TASK_KEYS = ("task", "task_index", "seed")


def _plain(config: Any) -> dict[str, Any]:
    """A SkyRL ``env_config`` (an omegaconf ``DictConfig``, a mapping or None) as a plain dict."""
    if config is None:
        return {}
    try:
        from omegaconf import OmegaConf  # skyrl-gym depends on omegaconf
        if OmegaConf.is_config(config):
            config = OmegaConf.to_container(config, resolve=True)
    except ImportError:  # pragma: no cover - skyrl-gym brings omegaconf
        pass
    return dict(config)


def _task_selection(extras: Mapping[str, Any]) -> tuple[int | None, dict[str, Any]]:
    """``(seed, reset options)`` from a row's ``extras``: top-level keys win over ``extra_info``'s."""
    info = extras.get("extra_info")
    found = {k: info[k] for k in _TASK_KEYS if isinstance(info, Mapping) and info.get(k) is not None}
    found.update({k: extras[k] for k in _TASK_KEYS if extras.get(k) is not None})
    options: dict[str, Any] = {}
    if "task" in found:
        options["task"] = dict(found["task"])
    if "task_index" in found:
        options["task_index"] = int(found["task_index"])
    seed = found.get("seed")
    return (None if seed is None else int(seed)), options


def _numeric(summary: Mapping[str, Any]) -> dict[str, float]:
    """The numbers (and booleans, as 0/1) of an episode summary: what SkyRL can average across episodes."""
    return {k: float(v) for k, v in summary.items() if isinstance(v, (bool, int, float))}


class SkyRLEnv(BaseTextEnv):
    """One agentgym episode behind skyrl-gym's ``BaseTextEnv`` interface.

    Args:
        env_config: SkyRL's per-env-class config (``environment.skyrl_gym.<env_class>``); its entries are
            constructor arguments of the env, over ``env_kwargs``.
        extras: the dataset row's other columns; ``task_index`` / ``seed`` / ``task`` choose the task
            (else a task is sampled), ``max_turns`` is SkyRL's turn cap (``generator.max_turns``).
        env_id: the agentgym env id (``"Arithmetic-v0"`` or ``"agentgym/Arithmetic-v0"``).
        env_kwargs: constructor arguments fixed at registration.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None, *, env_id: str,
                 env_kwargs: Mapping[str, Any] | None = None):
        super().__init__()
        self.env_id = full_id(env_id)
        self.env = agentgym.make(self.env_id, **{**dict(env_kwargs or {}), **_plain(env_config)})
        self.extras = dict(extras or {})
        self.seed, self.options = _task_selection(self.extras)
        self.max_turns = int(self.extras.get("max_turns") or self.env.unwrapped.max_turns)
        self.summary: dict[str, Any] | None = None

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Reset on the row's task; the env's first messages replace the row's ``prompt``."""
        obs, info = self.env.reset(seed=self.seed, options=self.options or None)
        self.turns, self.summary = 0, None
        return [dict(m) for m in obs], {"env_id": self.env_id, "task_index": info.get("task_index")}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One turn: the env's new messages, its step reward, and whether the episode ended."""
        self.turns += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        done = bool(terminated or truncated)
        metadata = {k: info[k] for k in _STEP_KEYS if k in info}
        metadata.update(terminated=bool(terminated), truncated=bool(truncated))
        if done:
            self.summary = dict(info["episode_summary"])
            metadata["episode_summary"] = self.summary
        return BaseTextEnvStepOutput(observations=[dict(m) for m in obs], reward=float(reward), done=done,
                                     metadata=metadata)

    def get_metrics(self) -> dict[str, Any]:
        """The finished episode's numeric summary (empty before the episode ends)."""
        return _numeric(self.summary) if self.summary is not None else {}

    def close(self) -> None:
        self.env.close()


def register_skyrl(env_id: str, skyrl_id: str | None = None, **env_kwargs: Any) -> str:
    """Register an agentgym env in skyrl-gym's registry and return the id to use as SkyRL's ``env_class``.

    Args:
        env_id: the agentgym env id; a user's own env must be registered with agentgym first (in the same
            process: SkyRL-train's entrypoint task).
        skyrl_id: the id in skyrl-gym's registry (default: the full agentgym id, e.g.
            ``agentgym/Arithmetic-v0``). Registering an id again replaces the earlier entry.
        **env_kwargs: constructor arguments of every env made; plain data (skyrl-gym copies them for each
            episode), checked against the constructor now.
    """
    gym_id = full_id(env_id)
    check_env_kwargs(gym_id, dict(env_kwargs))
    name = skyrl_id or gym_id
    if name in skyrl_gym.registry:
        skyrl_gym.envs.registration.deregister(name)
    skyrl_gym.register(id=name, entry_point="agentgym.adapters.skyrl:SkyRLEnv",
                       kwargs={"env_id": gym_id, "env_kwargs": dict(env_kwargs)})
    return name


def dataset_row(env_id: str, task_index: int, skyrl_id: str | None = None, **env_kwargs: Any) -> dict[str, Any]:
    """A SkyRL-train dataset row for one task: ``prompt`` (the env's first messages, so SkyRL's prompt-length
    filter measures the real prompt), ``env_class`` and ``extra_info.task_index``."""
    env = agentgym.make(full_id(env_id), **env_kwargs)
    try:
        obs, _ = env.reset(options={"task_index": int(task_index)})
    finally:
        env.close()
    return {"prompt": [dict(m) for m in obs], "env_class": skyrl_id or full_id(env_id),
            "extra_info": {"task_index": int(task_index)}}
