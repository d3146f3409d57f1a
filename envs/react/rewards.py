"""ReAct-v0's reward terms beyond the kernel's (``correct`` and ``format_error`` are
:class:`~agentgym.rewards.ExactMatch` and :class:`~agentgym.rewards.InvalidActionPenalty`); see the
package docstring for each rule and why."""

from __future__ import annotations

from agentgym.parsing import parse_react
from agentgym.rewards import StepEvent, exact_match, normalize_answer

#: Action types that count as tool calls (for the efficiency terms and the episode summary).
TOOL_ACTION_TYPES: tuple[str, ...] = ("search", "lookup", "tool_call")

#: Default weights of the reward terms (see the package docstring for each rule).
DEFAULT_WEIGHTS: dict[str, float] = {"correct": 1.0, "wrong_answer": 0.5, "tool_efficiency": 0.2,
                                     "tool_overuse": 0.1, "thought_quality": 0.05, "format_error": 0.1}


def _tool_calls(event: StepEvent) -> int:
    return sum(r.action_type in TOOL_ACTION_TYPES for r in event.history) + (event.action_type in TOOL_ACTION_TYPES)


class WrongAnswer:
    """Terminal: −1 when the episode ends without a correct final answer (wrong or missing)."""
    name = "wrong_answer"

    def __call__(self, event: StepEvent) -> float:
        return -1.0 if event.done and not exact_match(event.final_answer, event.gold) else 0.0


class ToolEfficiency:
    """Terminal: 1 when the episode ends with a correct final answer after at most ``limit`` tool
    calls. Paid only on success, so a quick guess earns nothing over a careful wrong answer."""
    name = "tool_efficiency"

    def __init__(self, limit: int = 3):
        self.limit = limit

    def __call__(self, event: StepEvent) -> float:
        return float(event.done and _tool_calls(event) <= self.limit and exact_match(event.final_answer, event.gold))


class ToolOveruse:
    """Terminal: −1 when the episode made more than ``limit`` tool calls."""
    name = "tool_overuse"

    def __init__(self, limit: int = 5):
        self.limit = limit

    def __call__(self, event: StepEvent) -> float:
        return -1.0 if event.done and _tool_calls(event) > self.limit else 0.0


def _thought(action: str) -> str:
    return normalize_answer(parse_react(action).thought or "")


class ThoughtQuality:
    """Terminal: share of steps with a non-empty Thought that repeats no earlier step's Thought
    (compared after Search-R1 normalisation). A share, not a per-step bonus, so it cannot be farmed
    by taking more steps."""
    name = "thought_quality"

    def __call__(self, event: StepEvent) -> float:
        if not event.done:
            return 0.0
        seen: set[str] = set()
        good = 0
        actions = [r.action for r in event.history] + [event.action]
        for a in actions:
            t = _thought(a)
            good += bool(t) and t not in seen
            seen.add(t)
        return good / len(actions)
