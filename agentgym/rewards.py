"""Reward shapers: small named callables, composed with weights.

A shaper receives a :class:`StepEvent` and returns a float. A :class:`Reward` composes shapers
with weights; every step it reports each weighted term, so ``sum(info["reward_terms"].values())``
equals the step's reward. Terminal shapers return 0 until ``event.done``.

Writing a new shaper::

    from agentgym.rewards import shaper

    @shaper("politeness", terminal=True)
    def politeness(event):
        return 1.0 if "please" in event.action.lower() else 0.0
"""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

__all__ = [
    "StepEvent", "StepRecord", "RewardShaper", "shaper", "Reward",
    "normalize_answer", "exact_match", "token_f1",
    "ExactMatch", "TokenF1", "FormatCompliance", "CallCost", "InvalidActionPenalty",
    "LengthPenalty", "TurnLimitPenalty",
]


# --------------------------------------------------------------------------- events
@dataclass(frozen=True)
class StepRecord:
    """What happened on one earlier step of the episode."""
    turn: int
    action: str
    action_type: str
    parsed: Any = None
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepEvent:
    """Everything a shaper may look at for one step.

    ``task`` holds hidden state (gold answers, …): shapers may read it, observations never do.
    ``info`` is env-specific facts about this step (e.g. ``retrieved`` passages, a tool result);
    ``answer`` is the answer the env extracted on this step, if any.
    """
    task: Mapping[str, Any]
    action: str
    action_type: str
    parsed: Any
    observation: Sequence[Mapping[str, str]]
    turn: int
    history: Sequence[StepRecord]
    done: bool
    truncated: bool = False
    answer: str | None = None
    info: Mapping[str, Any] = field(default_factory=dict)

    def count(self, action_type: str, include_current: bool = True) -> int:
        """How many steps of this episode had ``action_type`` (this one included by default)."""
        n = sum(r.action_type == action_type for r in self.history)
        return n + (include_current and self.action_type == action_type)

    @property
    def final_answer(self) -> str | None:
        """The episode's answer: this step's, else the latest earlier one recorded in ``info``."""
        if self.answer is not None:
            return self.answer
        for r in reversed(self.history):
            if r.info.get("answer") is not None:
                return r.info["answer"]
        return None

    @property
    def gold(self) -> list[str]:
        g = self.task.get("answers", self.task.get("answer", []))
        if isinstance(g, (str, int, float)):
            return [str(g)]
        return [str(x) for x in g]


@runtime_checkable
class RewardShaper(Protocol):
    name: str

    def __call__(self, event: StepEvent) -> float: ...


class _FunctionShaper:
    def __init__(self, fn: Callable[[StepEvent], float], name: str, terminal: bool):
        self.fn, self.name, self.terminal = fn, name, terminal
        self.__doc__ = fn.__doc__

    def __call__(self, event: StepEvent) -> float:
        if self.terminal and not event.done:
            return 0.0
        return float(self.fn(event))

    def __repr__(self) -> str:
        return f"shaper({self.name!r}, terminal={self.terminal})"


def shaper(name: str | None = None, *, terminal: bool = False) -> Callable[[Callable[[StepEvent], float]], RewardShaper]:
    """Decorator turning ``fn(event) -> float`` into a named shaper (terminal: 0 until the last step)."""
    def wrap(fn: Callable[[StepEvent], float]) -> RewardShaper:
        return _FunctionShaper(fn, name or fn.__name__, terminal)
    return wrap


class Reward:
    """Weighted sum of shapers, reporting each weighted term.

    ``Reward({"em": ExactMatch(), "search_cost": CallCost("search")}, weights={"search_cost": 0.1})``
    or ``Reward([ExactMatch(), (CallCost("search"), 0.1)])``. Weights default to 1.
    A term name appears once; a weight of 0 keeps the term in the report (always 0).
    """

    def __init__(self, shapers: Mapping[str, RewardShaper] | Iterable[RewardShaper | tuple[RewardShaper, float]],
                 weights: Mapping[str, float] | None = None):
        items: list[tuple[str, RewardShaper, float]] = []
        if isinstance(shapers, Mapping):
            for name, s in shapers.items():
                items.append((name, s, 1.0))
        else:
            for entry in shapers:
                s, w = entry if isinstance(entry, tuple) else (entry, 1.0)
                items.append((getattr(s, "name", type(s).__name__), s, float(w)))
        weights = dict(weights or {})
        names = [n for n, _, _ in items]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate reward term names: {names}")
        unknown = set(weights) - set(names)
        if unknown:
            raise ValueError(f"weights given for unknown reward terms {sorted(unknown)}; terms are {names}")
        self.terms: list[tuple[str, RewardShaper, float]] = [
            (n, s, float(weights.get(n, w))) for n, s, w in items]

    @property
    def names(self) -> list[str]:
        return [n for n, _, _ in self.terms]

    @property
    def weights(self) -> dict[str, float]:
        return {n: w for n, _, w in self.terms}

    def with_weights(self, **weights: float) -> "Reward":
        """A copy with some weights changed (``reward.with_weights(f1=0.5)``)."""
        return Reward({n: s for n, s, _ in self.terms}, {**self.weights, **weights})

    def with_terms(self, *shapers: RewardShaper | tuple[RewardShaper, float]) -> "Reward":
        """A copy with more terms (``reward.with_terms((brevity, 0.2))``)."""
        return Reward([(s, w) for _, s, w in self.terms] + list(shapers))

    def evaluate(self, event: StepEvent) -> tuple[float, dict[str, float], dict[str, float]]:
        """``(reward, weighted terms, raw terms)``. Raw values are reported even for weight-0
        terms, so an opt-in term (or a penalty switched off to reproduce a paper) stays visible."""
        raw = {n: float(s(event)) for n, s, _ in self.terms}
        weighted = {n: w * raw[n] if w else 0.0 for n, _, w in self.terms}
        return float(sum(weighted.values())), weighted, raw

    def __call__(self, event: StepEvent) -> tuple[float, dict[str, float]]:
        total, weighted, _ = self.evaluate(event)
        return total, weighted

    def __repr__(self) -> str:
        return "Reward(" + ", ".join(f"{n}×{w:g}" for n, _, w in self.terms) + ")"


# --------------------------------------------------------------------------- answer matching
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DROP_PUNCT = str.maketrans("", "", string.punctuation)  # str.translate: one C pass, no per-char Python


@functools.lru_cache(maxsize=4096)
def normalize_answer(s: str) -> str:
    """Search-R1 / SQuAD normalisation: lowercase, drop punctuation, drop articles, collapse spaces.

    Order as in Search-R1's ``normalize_answer`` (lower → remove punctuation → remove articles →
    fix whitespace); source: Search-R1 repository, ``verl/utils/reward_score/qa_em.py``.
    Memoised (a pure str -> str function): one SearchQA episode normalises the same retrieved
    passages and gold answers several times (per-step shaper, format reward, episode summary).
    """
    s = s.lower()
    s = s.translate(_DROP_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str | None, golds: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer."""
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def token_f1(prediction: str | None, golds: Iterable[str]) -> float:
    """Max over gold answers of the SQuAD token-level F1 of normalised strings."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    best = 0.0
    for g in golds:
        gold = normalize_answer(g).split()
        common = Counter(pred) & Counter(gold)
        same = sum(common.values())
        if not pred or not gold:
            f = float(pred == gold)
        elif same == 0:
            f = 0.0
        else:
            p, r = same / len(pred), same / len(gold)
            f = 2 * p * r / (p + r)
        best = max(best, f)
    return best


# --------------------------------------------------------------------------- built-in shapers
class ExactMatch:
    """Terminal: 1 if the episode's final answer matches any gold answer (normalised)."""
    def __init__(self, name: str = "exact_match"):
        self.name = name

    def __call__(self, event: StepEvent) -> float:
        return exact_match(event.final_answer, event.gold) if event.done else 0.0


class TokenF1:
    """Terminal: token F1 between the final answer and the best gold answer."""
    def __init__(self, name: str = "f1"):
        self.name = name

    def __call__(self, event: StepEvent) -> float:
        return token_f1(event.final_answer, event.gold) if event.done else 0.0


class FormatCompliance:
    """1 when this step's action matches ``pattern`` (a regex, searched with DOTALL), else 0.

    Step-wise by default (every action is judged); ``terminal=True`` judges only the last action,
    ``penalty`` (e.g. -1) is returned instead of 0 for a non-compliant action.
    """
    def __init__(self, pattern: str, name: str = "format", terminal: bool = False, penalty: float = 0.0):
        self.name, self.terminal, self.penalty = name, terminal, penalty
        self.regex = re.compile(pattern, re.DOTALL)

    def __call__(self, event: StepEvent) -> float:
        if self.terminal and not event.done:
            return 0.0
        return 1.0 if self.regex.search(event.action) else self.penalty


class CallCost:
    """-1 on each step whose action type is one of ``action_types`` (weight it, e.g. 0.05).

    ``free`` calls per episode cost nothing (e.g. the first search).
    """
    def __init__(self, action_types: str | Sequence[str] = ("search", "tool_call"), name: str = "call_cost", free: int = 0):
        self.action_types = (action_types,) if isinstance(action_types, str) else tuple(action_types)
        self.name, self.free = name, free

    def __call__(self, event: StepEvent) -> float:
        if event.action_type not in self.action_types:
            return 0.0
        earlier = sum(r.action_type in self.action_types for r in event.history)
        return -1.0 if earlier >= self.free else 0.0


class InvalidActionPenalty:
    """-1 on each step whose action could not be parsed (``action_type == "invalid"``)."""
    def __init__(self, name: str = "invalid"):
        self.name = name

    def __call__(self, event: StepEvent) -> float:
        return -1.0 if event.action_type == "invalid" else 0.0


class LengthPenalty:
    """-(excess / budget) for the characters of this action beyond ``budget``, capped at -1."""
    def __init__(self, budget: int = 2000, name: str = "length"):
        if budget <= 0:
            raise ValueError("budget must be positive")
        self.budget, self.name = budget, name

    def __call__(self, event: StepEvent) -> float:
        excess = len(event.action) - self.budget
        return -min(1.0, excess / self.budget) if excess > 0 else 0.0


class TurnLimitPenalty:
    """-1 on the last step when the episode was cut by its turn limit (truncated, not terminated)."""
    def __init__(self, name: str = "timeout"):
        self.name = name

    def __call__(self, event: StepEvent) -> float:
        return -1.0 if event.done and event.truncated else 0.0
