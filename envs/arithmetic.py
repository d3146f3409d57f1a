"""``agentgym/Arithmetic-v0``: the search-vs-reason decision in miniature.

Some questions are easy enough to answer directly (small operands); others have large operands
where calling the ``calculator`` tool pays. A tool call costs a little (step-wise), a correct final
answer pays at the end, and a well-formed final answer earns a small format term.

The splits ``train``, ``validation`` and ``test`` are disjoint: a question belongs to the split a hash
of its text names (:func:`agentgym.splits.split_of`), and within a split index ``i`` never repeats an
earlier index's question (:class:`agentgym.splits.DistinctDraws`). Whether task ``i`` is easy or hard is
drawn per index, so ``hard_fraction`` holds exactly; there are only 432 easy questions (operands 1..12),
about 80 in the test split and 96 in validation, and a held-out index past them is an error (a training
split repeats them instead).

Written only against the public ``agentgym`` API, as a user's own env would be.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Mapping

import numpy as np

from agentgym import AgentEnv, EnvConfig, Reward, ToolSet, Transition, shaper
from agentgym.parsing import first_tag, parse_tool_calls
from agentgym.rewards import CallCost, InvalidActionPenalty, StepEvent
from agentgym.splits import DistinctDraws, check_split, normalise_task_text, split_of
from agentgym.envs.calculator import calculate, calculator

__all__ = ["ArithmeticEnv", "ArithmeticConfig", "numeric_equal", "SYSTEM_PROMPT"]

SYSTEM_PROMPT = (
    "You solve arithmetic questions. You may call a calculator tool by writing exactly\n"
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>\n'
    "and you will get the result back. Calling the tool has a small cost, so answer easy questions "
    "directly. Give the final answer as a plain integer inside <answer> and </answer>, "
    "for example <answer>408</answer>."
)

_SPLIT_SEEDS = {"train": 0, "test": 1, "validation": 2}  # split -> seed of its candidate stream


def _parse_number(text: str | None) -> Fraction | None:
    if text is None:
        return None
    t = text.strip().replace(",", "").replace(" ", "").rstrip(".")
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def numeric_equal(prediction: str | None, gold: str) -> bool:
    """Exact numeric equality (``1,234`` == ``1234``; signs matter, unlike text normalisation)."""
    p, g = _parse_number(prediction), _parse_number(gold)
    return p is not None and p == g


@shaper("correct", terminal=True)
def correct(event: StepEvent) -> float:
    """1 if the final answer equals the gold number."""
    return float(any(numeric_equal(event.final_answer, g) for g in event.gold))


@shaper("format", terminal=True)
def well_formed_answer(event: StepEvent) -> float:
    """1 if the episode ended with <answer>N</answer> where N parses as a number."""
    return float(event.action_type == "answer" and _parse_number(event.answer) is not None)


def _difficulty(split: str, hard_fraction: float, index: int) -> str:
    """``"hard"`` or ``"easy"`` for task ``index`` (drawn per index, so ``hard_fraction`` holds exactly)."""
    return "hard" if np.random.default_rng([_SPLIT_SEEDS[split], index]).random() < hard_fraction else "easy"


def _candidate(split: str, hard_fraction: float, index: int, attempt: int) -> dict[str, Any]:
    """Candidate ``attempt`` for task ``index`` (attempt 0 continues the stream that picked the difficulty)."""
    rng = np.random.default_rng([_SPLIT_SEEDS[split], index] + ([attempt] if attempt else []))
    first = bool(rng.random() < hard_fraction)
    hard = first if attempt == 0 else _difficulty(split, hard_fraction, index) == "hard"
    if hard:
        a, b = int(rng.integers(1_000, 100_000)), int(rng.integers(100, 10_000))
        op = str(rng.choice(["*", "+", "-", "*"]))
    else:
        a, b = int(rng.integers(1, 13)), int(rng.integers(1, 13))
        op = str(rng.choice(["+", "-", "*"]))
    expression = f"{a} {op} {b}"
    return {"question": f"What is {expression}?", "expression": expression, "answers": None,
            "difficulty": "hard" if hard else "easy"}


def _answered(task: dict[str, Any]) -> dict[str, Any]:
    """A copy of a drawn task with its gold answer (computed only for the tasks handed out)."""
    return {**task, "answers": [str(calculate(task["expression"]))]}


@functools.lru_cache(maxsize=32)
def _draws(split: str, hard_fraction: float) -> DistinctDraws:
    """The task sequence of one (split, hard_fraction), shared by every env of the process."""
    return DistinctDraws(split, functools.partial(_candidate, split, hard_fraction),
                         key=lambda t: normalise_task_text(t["question"]),
                         in_split=lambda t: split_of(normalise_task_text(t["question"])) == split,
                         pool=functools.partial(_difficulty, split, hard_fraction), what="questions")


@dataclass
class ArithmeticConfig(EnvConfig):
    """The settings of ``Arithmetic-v0``."""
    split: str = field(default="train", metadata={
        "help": "train, validation or test: disjoint procedural task streams"})
    hard_fraction: float = field(default=0.5, metadata={"help": "share of questions with large operands, in [0, 1]"})
    tool_cost: float = field(default=0.05, metadata={
        "help": "weight of the per-call cost term (each calculator call gives -tool_cost)"})
    max_turns: int = field(default=4, metadata={"help": "turns before the episode is truncated"})

    def __post_init__(self) -> None:
        check_split(self.split)
        if not 0.0 <= self.hard_fraction <= 1.0:
            raise ValueError(f"hard_fraction must be in [0, 1], got {self.hard_fraction}")


class ArithmeticEnv(AgentEnv):
    """Arithmetic QA with an optional calculator tool; settings: :class:`ArithmeticConfig`.

    Reward terms (``reward={"name": weight}`` reweights them): ``correct`` 1.0, ``format`` 0.1, ``tool_cost``
    (weight: the ``tool_cost`` setting, 0.05), ``invalid`` 0.1.
    """

    stop_strings = ("</tool_call>", "</answer>")
    config_class = ArithmeticConfig

    def __init__(self, config: ArithmeticConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        self.split, self.hard_fraction, self.tool_cost = c.split, c.hard_fraction, c.tool_cost
        self.tools = ToolSet([calculator], timeout_s=2.0)
        super().__init__(reward=c.reward, max_turns=c.max_turns, max_action_chars=c.max_action_chars,
                         render_mode=c.render_mode, group_reward=c.group_reward)

    def default_reward(self) -> Reward:
        return Reward([correct, (well_formed_answer, 0.1), (CallCost("tool_call", name="tool_cost"), self.tool_cost),
                       (InvalidActionPenalty(), 0.1)])

    def get_task(self, index: int) -> dict[str, Any]:
        return _answered(_draws(self.split, self.hard_fraction).get(index))

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task["question"]}]

    def tool_specs(self) -> list[dict[str, Any]]:
        return self.tools.specs()

    def transition(self, action: str) -> Transition:
        tag = first_tag(action, ("tool_call", "answer"))
        if tag is None:
            parsed = parse_tool_calls(action)  # an unclosed <tool_call> gets its own message
            why = parsed.errors[0] if parsed.errors else "no <tool_call> or <answer> found"
            return self.invalid(f"Invalid action: {why}. Call the calculator with <tool_call>{{...}}</tool_call> "
                                "or give the final answer as <answer>NUMBER</answer>.")
        if tag.tag == "answer":
            return Transition([], "answer", parsed=tag, terminated=True, answer=tag.content)
        parsed = parse_tool_calls(action[tag.start:tag.end])
        if parsed.errors:
            return self.invalid(f"Invalid tool call: {parsed.errors[0]}", parsed=parsed)
        call = parsed.calls[0]
        result = self.tools.call(call.name, call.arguments)
        return Transition([result.as_message()], "tool_call", parsed=call,
                          info={"tool": call.name, "tool_ok": result.ok})

    def episode_success(self) -> bool:
        answer = next((r.info.get("answer") for r in reversed(self._history) if "answer" in r.info), None)
        return any(numeric_equal(answer, g) for g in self.task["answers"])

    def episode_metrics(self) -> dict[str, Any]:
        return {"difficulty": self.task.get("difficulty")}

    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        """Reference behaviour from privileged task info: calculator for hard questions, then answer."""
        task = context["task"]
        if context.get("turn", 0) == 0 and task["difficulty"] == "hard":
            return ('<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'
                    % task["expression"])
        return f"<answer>{task['answers'][0]}</answer>"

    def close(self) -> None:
        self.tools.close()
