"""Env conformance checks: Gymnasium's ``check_env`` plus a fuzz of malformed actions.

Used by ``agentgym check`` and by the registry-wide tests, so every registered env (ours or a
user's) is held to the same rules: no exception escapes ``step`` for any text action, and an
invalid action yields an observation saying what was wrong plus a negative reward term.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.registry import make

__all__ = ["MALFORMED_ACTIONS", "FuzzReport", "fuzz_env", "check_invalid_step", "run_check_env"]

#: Hand-written nasty actions every env must survive (broken markup, JSON, huge, binary-ish).
MALFORMED_ACTIONS: tuple[str, ...] = (
    "", " ", "\n\n", "\x00", "\ud7ff\ue000", "😀" * 50,
    "<answer>", "</answer>", "<answer></answer>", "<answer><answer>1</answer>", "<search></search>",
    "<search>" + "x" * 5000 + "</search>",
    "<tool_call>", "<tool_call></tool_call>", "<tool_call>{</tool_call>", "<tool_call>[]</tool_call>",
    '<tool_call>{"name": 3}</tool_call>', '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": "{bad"}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": 5}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": "9**9**9**9"}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}</tool_call>',
    '<tool_call>' + "[" * 10_000 + '</tool_call>',
    "Action: search\nAction Input:", "Action:\nFinal Answer:", "Thought:", "Final Answer:",
    "```python\n", "```python\nwhile True: pass\n```", "\\boxed{", "\\boxed{}", "\\boxed{{{}",
    "a" * 100_000,
)


@dataclass
class FuzzReport:
    env_id: str
    steps: int = 0
    episodes: int = 0
    action_types: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        status = "OK" if self.ok else f"{len(self.failures)} FAILURES"
        kinds = ", ".join(f"{k}={v}" for k, v in self.action_types.most_common())
        return f"{self.env_id}: {self.steps} fuzzed actions over {self.episodes} episodes: {status} ({kinds})"


def check_invalid_step(obs: Any, info: dict[str, Any]) -> str | None:
    """If the step was judged invalid, it must say why and carry a negative penalty term (raw value:
    a paper-faithful default may weight the penalty 0, but the term must fire); else a problem."""
    if info.get("action_type") != "invalid":
        return None
    text = " ".join(m.get("content", "") for m in obs) if isinstance(obs, list) else str(obs)
    if not text.strip():
        return "invalid action produced an empty observation"
    terms = info.get("raw_reward_terms", info.get("reward_terms", {}))
    if not any(v < 0 for v in terms.values()):
        return f"invalid action carried no negative reward term: {terms}"
    return None


def fuzz_env(env_id: str, actions: list[str] | None = None, n: int = 200, seed: int = 0,
             env_kwargs: dict[str, Any] | None = None) -> FuzzReport:
    """Step ``env_id`` with ``actions`` (default: the malformed set then random text samples)."""
    env = make(env_id, **(env_kwargs or {}))
    report = FuzzReport(env_id)
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    if actions is None:
        actions = list(MALFORMED_ACTIONS) + [env.action_space.sample() for _ in range(max(0, n - len(MALFORMED_ACTIONS)))]
    try:
        obs, info = env.reset(seed=int(rng.integers(2**31)))
        report.episodes = 1
        for action in actions:
            try:
                obs, reward, terminated, truncated, info = env.step(action)
            except Exception:
                report.failures.append(f"step({action[:60]!r}) raised:\n{traceback.format_exc(limit=4)}")
                obs, info = env.reset(seed=int(rng.integers(2**31)))
                report.episodes += 1
                continue
            report.steps += 1
            report.action_types[info.get("action_type", "?")] += 1
            if not env.observation_space.contains(obs):
                report.failures.append(f"step({action[:60]!r}) returned an observation outside the space")
            problem = check_invalid_step(obs, info)
            if problem:
                report.failures.append(f"step({action[:60]!r}): {problem}")
            if not np.isfinite(reward):
                report.failures.append(f"step({action[:60]!r}) returned a non-finite reward {reward}")
            if terminated or truncated:
                obs, info = env.reset(seed=int(rng.integers(2**31)))
                report.episodes += 1
    finally:
        env.close()
    return report


def run_check_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> str | None:
    """Gymnasium's ``check_env`` on the unwrapped env; returns the error text or None."""
    from gymnasium.utils.env_checker import check_env
    env = make(env_id, **(env_kwargs or {}))  # a bad id / kwargs is the caller's error: raise
    try:
        check_env(env.unwrapped, skip_render_check=False)
    except Exception:
        return traceback.format_exc(limit=6)
    finally:
        env.close()
    return None
