"""Wrappers specific to message-list observations. Gymnasium's own wrappers (``TimeLimit``,
``RecordEpisodeStatistics``, …) work on agentgym envs unchanged."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym

__all__ = ["FullHistory"]


class FullHistory(gym.Wrapper):
    """Observation = the whole conversation so far (task prompt, every action and reply), for
    policies that re-read history each turn instead of keeping it themselves."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._messages: list[dict[str, str]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._messages = copy.deepcopy(list(obs))
        return copy.deepcopy(self._messages), info

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._messages.append({"role": "assistant", "content": action})
        self._messages.extend(copy.deepcopy(list(obs)))
        return copy.deepcopy(self._messages), reward, terminated, truncated, info
