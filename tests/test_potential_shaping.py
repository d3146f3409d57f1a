"""Potential-based shaping: the term is γΦ(s') − Φ(s), its episode sum telescopes to a constant, so the
ranking of policies (and the optimal one) is unchanged (Ng, Harada & Russell 1999)."""

from __future__ import annotations

import pytest

import agentgym
from agentgym.envs.arithmetic import ArithmeticEnv
from agentgym.rewards import StepEvent, StepRecord, potential_shaper


@potential_shaper("progress")
def progress(task, steps):
    """More potential after each tool call (a hint that calling the calculator is progress)."""
    return 0.5 + 0.3 * sum(s.action_type == "tool_call" for s in steps)


def _episode(env, actions):
    env.reset(seed=0, options={"task_index": 0})
    terms, total = [], 0.0
    for a in actions:
        _, r, term, trunc, info = env.step(a)
        terms.append(info["reward_terms"]["progress"])
        total += r
        if term or trunc:
            break
    return terms, total, info["episode_summary"]


def test_shaping_sums_to_the_same_constant_for_every_policy():
    env = agentgym.make("Arithmetic-v0", max_turns=4,
                        reward=ArithmeticEnv().default_reward().with_terms((progress, 1.0)))
    task = env.unwrapped.get_task(0)
    expr, answer = task["expression"], task["answers"][0]
    call = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call>'
    direct, _, _ = _episode(env, [f"<answer>{answer}</answer>"])
    with_tool, _, _ = _episode(env, [call, call, f"<answer>{answer}</answer>"])
    # γ = 1 and Φ(terminal) = 0: every episode's shaping sums to −Φ(s0) = −0.5
    assert sum(direct) == pytest.approx(-0.5) and sum(with_tool) == pytest.approx(-0.5)
    assert with_tool[:2] == pytest.approx([0.3, 0.3])          # each tool call: Φ rises by 0.3


def test_discounted_terms_by_hand():
    shaper = potential_shaper("p", gamma=0.9, terminal_zero=False)(lambda task, steps: float(len(steps)))
    rec = StepRecord(0, "a", "tool_call")
    event = StepEvent(task={}, action="b", action_type="answer", parsed=None, observation=[], turn=1,
                      history=[rec], done=True)
    assert shaper(event) == pytest.approx(0.9 * 2 - 1)
    with pytest.raises(ValueError, match="gamma"):
        potential_shaper("q", gamma=1.5)(lambda t, s: 0.0)
