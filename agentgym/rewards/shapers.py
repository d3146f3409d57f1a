"""The built-in shapers and the answer matching they share (SQuAD-style normalisation, exact match, token F1)."""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from typing import Iterable, Sequence

from agentgym.rewards.terms import StepEvent


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
