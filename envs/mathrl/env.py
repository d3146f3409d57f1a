r"""``agentgym/Math-v0``: procedurally generated math problems with exact answers (RLVR-style).

The policy reasons and ends with a final answer, ideally ``<think>...</think>`` then ``\boxed{...}``.
The answer is extracted (boxed, then an "answer is" phrase, then the last number; see
``answers.py``) and compared with the gold answer as an exact rational. Single-turn by default: the
first response with an answer ends the episode; a response with no number at all gets one retry.

With ``tools=True`` the policy may run Python (tool-integrated reasoning, ToRA-style): a response
with a ```python block and no ``\boxed`` answer is run in the sandbox and its output comes back as
an ```output block; the episode continues until an answer (at most ``max_tool_calls`` runs).

Reward terms (weights: ``reward={"name": w}``):

* ``correct`` 0.9 (terminal): the final answer equals the gold answer.
* ``format`` 0.1 (terminal): the final response is ``<think>`` non-empty reasoning ``</think>``
  followed by a ``\boxed{}`` answer.
* ``invalid`` 0.1: -1 for a response without any answer (or an over-budget code run).
* ``tool_cost`` 0.0 (tools mode only): -1 per code run.
* Reward-hacking detectors, weight 0 by default: their raw values are still computed and reported
  in ``info["raw_reward_terms"]`` every episode, so hacking can be *monitored* without changing the
  paper-style 0.9/0.1 reward; give a weight to turn one into a penalty.

  - ``guessing`` (terminal): -(shortfall) in [-1, 0] when the reasoning *before* the answer has fewer
    distinct calculation steps than ``guess_step_ratio`` × the problem's worked-solution steps.
  - ``repetition`` (terminal): -1..0 for repeated filler: the share of repeated word 4-grams or lines
    in the episode's text above ``repetition_tolerance``, rescaled.
  - ``length`` (per step): the kernel's ``LengthPenalty``: -(excess / budget) beyond
    ``length_budget`` characters, capped at -1.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from agentgym import AgentEnv, EnvConfig, Reward, Transition, shaper
from agentgym.parsing import extract_code_blocks
from agentgym.rewards import CallCost, InvalidActionPenalty, LengthPenalty, StepEvent
from agentgym.splits import check_split
from agentgym.envs.mathrl.answers import _last_box, answers_equal, extract_answer, latex_fraction, parse_number
from agentgym.envs.mathrl.problems import KINDS, SPLITS, make_problem
from agentgym.envs.services.sandbox.selection import SANDBOX_SPECS, LazySandbox

__all__ = ["MathEnv", "MathConfig",
           "SYSTEM_PROMPT", "TOOLS_PROMPT", "AnswerGuessing", "RepeatedFiller", "think_format_ok",
           "count_reasoning_steps", "repetition_score", "correct", "think_format"]

SYSTEM_PROMPT = (
    "Solve the math problem. First reason step by step inside <think> and </think>, writing out each "
    "calculation. Then give the final answer in \\boxed{}, for example \\boxed{42} or \\boxed{\\frac{3}{4}}."
)
TOOLS_PROMPT = (
    " You may run Python to help: write code in a ```python block and end your reply there; its printed "
    "output comes back in an ```output block. Each block runs on its own (variables do not carry over), so "
    "print what you need. You can run code up to {n} times."
)
PYTHON_LANGS = ("python", "py", "python3")


# --------------------------------------------------------------------------- reward terms
@shaper("correct", terminal=True)
def correct(event: StepEvent) -> float:
    """1 if the final answer equals a gold answer as an exact rational."""
    return float(any(answers_equal(event.final_answer, g) for g in event.gold))


_THINK = re.compile(r"\s*<think>(.*?)</think>(.*)", re.DOTALL)


def think_format_ok(text: str) -> bool:
    """``<think>`` non-empty reasoning ``</think>`` (once, at the start) and then a ``\\boxed{}`` answer."""
    m = _THINK.fullmatch(text)
    return bool(m and m.group(1).strip() and text.count("<think>") == 1 and text.count("</think>") == 1
                and _last_box(m.group(2)) is not None)


@shaper("format", terminal=True)
def think_format(event: StepEvent) -> float:
    """1 if the episode ended with an answer written as <think>...</think> then \\boxed{...}."""
    return float(event.action_type == "answer" and think_format_ok(event.action))


_SEGMENT_SPLIT = re.compile(r"\n+|(?<=[.!?;])\s+")
_CALC = re.compile(
    r"\d\s*(?:[-+*/×÷^=<>]|\\times|\\div|\\cdot|\\frac)\s*[-(\d\\]"      # 3 + 4, 12 × 5, 7 = 7
    r"|=\s*[-(]?\s*\d"                                                   # x = 5
    r"|\b(?:plus|minus|times|divided|multiply|multiplied|add|subtract|product|sum|difference|quotient)\b[^\n]*\d",
    re.IGNORECASE)


def count_reasoning_steps(text: str) -> int:
    """Distinct lines/sentences that state a calculation (repeating one step counts once)."""
    seen = set()
    for seg in _SEGMENT_SPLIT.split(text):
        norm = " ".join(seg.split())
        if norm and _CALC.search(norm):
            seen.add(norm)
    return len(seen)


_TOKEN = re.compile(r"\w+|[^\w\s]+")


def repetition_score(text: str, n: int = 4, min_tokens: int = 24) -> float:
    """Share of repeated content in [0, 1]: the larger of the repeated word-n-gram share and the
    repeated-line share (filler such as "Let me think." × 40 scores close to 1)."""
    tokens = _TOKEN.findall(text)
    gram_share = 0.0
    if len(tokens) >= min_tokens:
        grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
        gram_share = 1.0 - len(set(grams)) / len(grams)
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    line_share = 1.0 - len(set(lines)) / len(lines) if len(lines) >= 4 else 0.0
    return max(gram_share, line_share)


def _episode_text(event: StepEvent) -> str:
    return "\n".join([r.action for r in event.history] + [event.action])


class AnswerGuessing:
    """Terminal: -(1 - steps / required), when the reasoning before the final answer shows fewer distinct
    calculation steps than ``ratio`` × the worked solution's steps (``task["min_steps"]``). A bare
    guess scores -1; an honest derivation 0."""

    def __init__(self, ratio: float = 0.5, name: str = "guessing"):
        if ratio <= 0:
            raise ValueError("ratio must be positive")
        self.ratio, self.name = ratio, name

    def __call__(self, event: StepEvent) -> float:
        if not event.done or event.action_type != "answer":
            return 0.0
        start = event.parsed.start if getattr(event.parsed, "start", None) is not None else len(event.action)
        reasoning = "\n".join([r.action for r in event.history] + [event.action[:start]])
        required = max(1, math.ceil(float(event.task.get("min_steps", 1)) * self.ratio))
        steps = count_reasoning_steps(reasoning)
        return -max(0.0, 1.0 - steps / required)


class RepeatedFiller:
    """Terminal: -(score - tolerance) / (1 - tolerance), clipped to [-1, 0], where score is
    :func:`repetition_score` of all of the episode's responses (format gaming by repeating a pattern)."""

    def __init__(self, tolerance: float = 0.3, name: str = "repetition"):
        if not 0 <= tolerance < 1:
            raise ValueError("tolerance must be in [0, 1)")
        self.tolerance, self.name = tolerance, name

    def __call__(self, event: StepEvent) -> float:
        if not event.done:
            return 0.0
        score = repetition_score(_episode_text(event))
        return -min(1.0, max(0.0, (score - self.tolerance) / (1 - self.tolerance)))


# --------------------------------------------------------------------------- env
@dataclass
class MathConfig(EnvConfig):
    """The settings of ``Math-v0``."""
    split: str = field(default="train", metadata={
        "help": "train, validation or test: disjoint question sets, no question twice in one"})
    kinds: Sequence[str] = field(default=KINDS, metadata={
        "help": "problem families to draw from (arithmetic, fractions, linear, word)"})
    difficulty: int | Sequence[int] = field(default=(1, 3), metadata={
        "help": "an int >= 0, or an inclusive range [lo, hi] drawn per task; 0 is the warm-up level for very "
                "small models (one operation on numbers up to 20)"})
    tools: bool = field(default=False, metadata={
        "help": "allow ```python blocks, run in the sandbox (tool-integrated reasoning)"})
    sandbox: Any = field(default="auto", metadata={
        "help": "tools mode: auto (docker, else bwrap; refused at construction when nothing isolating works), a "
                "backend name or a Sandbox; subprocess is no security boundary and needs allow_unsafe"})
    allow_unsafe: bool = field(default=False, metadata={
        "help": "allow sandbox=subprocess (or set AGENTGYM_ALLOW_UNSAFE_SANDBOX=1)"})
    max_tool_calls: int = field(default=3, metadata={"help": "code runs per episode (tools mode)"})
    tool_time_limit_s: float = field(default=5.0, metadata={"help": "wall time of one code run"})
    memory_mb: int = field(default=256, metadata={"help": "memory of one code run"})
    max_output_chars: int = field(default=2000, metadata={"help": "a longer code output is cut in the middle"})
    guess_step_ratio: float = field(default=0.5, metadata={
        "help": "the guessing detector: required share of the worked solution's calculation steps"})
    repetition_tolerance: float = field(default=0.3, metadata={
        "help": "the repetition detector: share of repeated text tolerated, in [0, 1)"})
    length_budget: int = field(default=4000, metadata={"help": "the length detector: characters before a penalty"})
    observation_style: str = field(default="chat", metadata={
        "help": "chat or continuation (how a rollout appends code output)"})
    max_turns: int | None = field(default=None, metadata={
        "help": "null: 2 (one retry after a reply without an answer), max_tool_calls + 2 with tools"})

    def __post_init__(self) -> None:
        check_split(self.split, SPLITS)
        self.kinds = tuple(self.kinds)
        if not self.kinds or any(k not in KINDS for k in self.kinds):
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {self.kinds!r}")
        if isinstance(self.difficulty, int):
            if self.difficulty < 0:
                raise ValueError(f"difficulty must be >= 0, got {self.difficulty}")
        else:
            lo, hi = (int(v) for v in self.difficulty)
            if not 0 <= lo <= hi:
                raise ValueError(f"difficulty range must satisfy 0 <= lo <= hi, got {self.difficulty!r}")
            self.difficulty = (lo, hi)
        if self.observation_style not in ("chat", "continuation"):
            raise ValueError(f"observation_style must be 'chat' or 'continuation', got {self.observation_style!r}")
        if self.max_tool_calls < 0:
            raise ValueError("max_tool_calls must be >= 0")
        if isinstance(self.sandbox, str) and self.sandbox not in SANDBOX_SPECS:
            raise ValueError(f"unknown sandbox {self.sandbox!r}; use one of {SANDBOX_SPECS} or a Sandbox instance")


class MathEnv(AgentEnv):
    """Math word/arithmetic/fraction/equation problems with exact answers; settings: :class:`MathConfig`
    (the reward terms and detectors: the module docstring)."""

    num_tasks = None  # procedural: every non-negative index is a task
    config_class = MathConfig

    def __init__(self, config: MathConfig | None = None, **settings: Any):
        c = self.config = self.config_class.build(config, settings)
        self.split, self.kinds, self.difficulty, self.tools = c.split, c.kinds, c.difficulty, bool(c.tools)
        self.sandbox_spec, self.allow_unsafe = c.sandbox, c.allow_unsafe
        # fails closed here, before any code runs: no isolating backend and no unsafe opt-in -> refused
        self._code_sandbox = LazySandbox(c.sandbox, c.allow_unsafe) if self.tools else None
        self.max_tool_calls, self.tool_time_limit_s = int(c.max_tool_calls), float(c.tool_time_limit_s)
        self.memory_mb, self.max_output_chars = int(c.memory_mb), int(c.max_output_chars)
        self.guess_step_ratio, self.repetition_tolerance = c.guess_step_ratio, c.repetition_tolerance
        self.length_budget = int(c.length_budget)
        self.observation_style = c.observation_style
        self.stop_strings = ("```output",) if self.tools else ()
        self._code_runs = 0
        max_turns = c.max_turns
        if max_turns is None:
            max_turns = self.max_tool_calls + 2 if self.tools else 2
        super().__init__(reward=c.reward, max_turns=max_turns, max_action_chars=c.max_action_chars,
                         render_mode=c.render_mode, group_reward=c.group_reward)

    def default_reward(self) -> Reward:
        terms: list[Any] = [(correct, 0.9), (think_format, 0.1), (InvalidActionPenalty(), 0.1)]
        if self.tools:
            terms.append((CallCost("code", name="tool_cost"), 0.0))
        terms += [(AnswerGuessing(self.guess_step_ratio), 0.0), (RepeatedFiller(self.repetition_tolerance), 0.0),
                  (LengthPenalty(self.length_budget, name="length"), 0.0)]
        return Reward(terms)

    @property
    def sandbox(self) -> Any:
        """The sandbox code runs in (tools mode), started on first use and shared with other envs."""
        if self._code_sandbox is None:
            raise RuntimeError("Math-v0 runs no code without tools=True")
        return self._code_sandbox.get()

    @property
    def sandbox_backend(self) -> str | None:
        """The backend code runs in (``docker``, ``bwrap``, opted-in ``subprocess``); None without tools."""
        return self._code_sandbox.backend if self._code_sandbox is not None else None

    # ------------------------------------------------------------------ tasks
    def get_task(self, index: int) -> dict[str, Any]:
        return make_problem(self.split, index, self.kinds, self.difficulty)

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        system = SYSTEM_PROMPT + (TOOLS_PROMPT.format(n=self.max_tool_calls) if self.tools else "")
        return [{"role": "system", "content": system}, {"role": "user", "content": str(task["question"])}]

    def on_reset(self, task: Mapping[str, Any]) -> None:
        gold = task.get("answers") or ([task["answer"]] if "answer" in task else [])
        gold = [gold] if isinstance(gold, (str, int, float)) else list(gold)
        if not isinstance(task.get("question"), str) or not gold or any(parse_number(str(g)) is None for g in gold):
            raise ValueError("a Math-v0 task needs a 'question' string and a numeric 'answer' (or 'answers')")
        self.task["answers"] = [str(g) for g in gold]
        self.task.setdefault("answer", self.task["answers"][0])
        self._code_runs = 0

    # ------------------------------------------------------------------ one step
    def transition(self, action: str) -> Transition:
        if self.tools:
            blocks = extract_code_blocks(action, PYTHON_LANGS)
            if blocks and _last_box(action) is None:
                return self._run_code(action, blocks[-1].code)
        found = extract_answer(action)
        if found is None:
            return self.invalid("No final answer found in your reply. Reason step by step, then give the final "
                                "answer as a number in \\boxed{}, for example \\boxed{42}.")
        return Transition([], "answer", parsed=found, terminated=True, answer=found.text,
                          info={"answer_method": found.method})

    def _run_code(self, action: str, code: str) -> Transition:
        if self._code_runs >= self.max_tool_calls:
            return self.invalid(f"You have used all {self.max_tool_calls} code runs. "
                                "Give the final answer in \\boxed{}.")
        if not code.strip():
            return self.invalid("Your ```python block is empty.")
        self._code_runs += 1
        res = self.sandbox.run(code, time_limit_s=self.tool_time_limit_s, memory_mb=self.memory_mb)
        out = res.stdout
        if res.timed_out:
            out += f"\n[the code did not finish within {self.tool_time_limit_s:g}s]"
        elif res.oom:
            out += f"\n[the code ran out of memory ({self.memory_mb} MB)]"
        elif res.exit_code:
            out += ("\n" if out and not out.endswith("\n") else "") + res.stderr[-800:]
        if len(out) > self.max_output_chars:
            half = self.max_output_chars // 2
            out = out[:half] + f"\n... [{len(out) - 2 * half} characters cut] ...\n" + out[-half:]
        body = out.strip("\n") or "[no output: print the values you need]"
        if self.observation_style == "continuation" and action.rstrip().endswith("```output"):
            content = f"\n{body}\n```\n"  # the policy already opened the block (the stop string)
        else:
            content = f"```output\n{body}\n```"
        return Transition([{"role": "user", "content": content}], "code", parsed=code,
                          info={"exit_code": res.exit_code, "timed_out": res.timed_out, "backend": res.backend})

    # ------------------------------------------------------------------ summaries
    def episode_success(self) -> bool:
        answer = next((r.info.get("answer") for r in reversed(self._history) if r.info.get("answer") is not None), None)
        return any(answers_equal(answer, g) for g in self.task.get("answers", []))

    def episode_metrics(self) -> dict[str, Any]:
        method = next((r.info.get("answer_method") for r in reversed(self._history) if "answer_method" in r.info), None)
        return {"kind": self.task.get("kind"), "difficulty": self.task.get("difficulty"), "answer_method": method,
                "code_runs": self._code_runs}

    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        """An honest worked answer: the solution steps in <think>, then the boxed answer. In tools mode
        (a system prompt offering Python) the first turn checks the answer with code."""
        task = context["task"]
        messages = context.get("messages") or []
        tools = any("```python" in m.get("content", "") for m in messages if m.get("role") == "system")
        if tools and context.get("turn", 0) == 0 and task.get("python"):
            return ("<think>\nLet me compute this exactly with Python first.\n</think>\n```python\n"
                    f"from fractions import Fraction as F\nprint({task['python']})\n```")
        gold = str(task.get("answer", (task.get("answers") or [""])[0]))
        answer = parse_number(gold)
        boxed = latex_fraction(answer) if answer is not None else gold
        steps = "\n".join(task.get("steps") or [f"Working it through gives {gold}."])
        return f"<think>\n{steps}\n</think>\nThe answer is \\boxed{{{boxed}}}."
