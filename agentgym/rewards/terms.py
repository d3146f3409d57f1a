"""Reward terms: the step event a shaper sees, the ``@shaper`` decorator, potential-based shaping, and
:class:`Reward`, which composes shapers with weights and reports each term (see :mod:`agentgym.rewards`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable



# --------------------------------------------------------------------------- events
@dataclass(frozen=True)
class StepRecord:
    """What happened on one earlier step of the episode."""
    turn: int
    action: str
    action_type: str
    parsed: Any = None
    info: Mapping[str, Any] = field(default_factory=dict)


def gold_answers(answers: Any) -> list[str]:
    """Gold answers as a list of strings: one answer given bare (``"Paris"``, ``1914``) is one answer,
    never the letters of a string."""
    if isinstance(answers, (str, int, float)):
        return [str(answers)]
    return [str(a) for a in answers]


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
        return gold_answers(self.task.get("answers", self.task.get("answer", [])))


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
        return term_value(self.name, self.fn(event))

    def __repr__(self) -> str:
        return f"shaper({self.name!r}, terminal={self.terminal})"


def shaper(name: str | None = None, *, terminal: bool = False) -> Callable[[Callable[[StepEvent], float]], RewardShaper]:
    """Decorator turning ``fn(event) -> float`` into a named shaper (terminal: 0 until the last step)."""
    def wrap(fn: Callable[[StepEvent], float]) -> RewardShaper:
        return _FunctionShaper(fn, name or fn.__name__, terminal)
    return wrap


class PotentialShaper:
    """Potential-based shaping (Ng, Harada & Russell, ICML 1999): the term is ``γ·Φ(s') − Φ(s)``.

    ``Φ`` maps a state — the task and the steps taken so far (``StepRecord`` list) — to a float.
    Such a term changes every policy's return by the same telescoping sum ``γ^T Φ(s_T) − Φ(s_0)``
    (exactly ``Φ(s_T) − Φ(s_0)`` with γ = 1), so it can speed learning without changing which policy
    is optimal. On the last step the terminal state's potential counts as 0 (``terminal_zero``, the
    condition of the theorem for episodic tasks): the sum is then ``−Φ(s_0)``, the same for every policy.
    """

    terminal = False

    def __init__(self, potential: Callable[[Mapping[str, Any], Sequence[StepRecord]], float], *, gamma: float = 1.0,
                 name: str | None = None, terminal_zero: bool = True):
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.potential, self.gamma, self.terminal_zero = potential, gamma, terminal_zero
        self.name = name or getattr(potential, "__name__", "potential")

    def __call__(self, event: StepEvent) -> float:
        before = list(event.history)
        after = before + [StepRecord(event.turn, event.action, event.action_type, event.parsed, dict(event.info))]
        phi_next = 0.0 if (event.done and self.terminal_zero) else float(self.potential(event.task, after))
        return self.gamma * phi_next - float(self.potential(event.task, before))


def potential_shaper(name: str | None = None, *, gamma: float = 1.0,
                     terminal_zero: bool = True) -> Callable[[Callable[..., float]], PotentialShaper]:
    """Decorator: ``@potential_shaper("progress")`` on ``phi(task, steps) -> float`` gives a shaper whose
    term is ``γ·Φ(s') − Φ(s)`` (see :class:`PotentialShaper`)."""
    def wrap(fn: Callable[..., float]) -> PotentialShaper:
        return PotentialShaper(fn, gamma=gamma, name=name or fn.__name__, terminal_zero=terminal_zero)
    return wrap


class RewardTermError(ValueError):
    """A shaper returned something that is not a finite number (the message names the term)."""


def term_value(name: str, value: Any) -> float:
    """A shaper's return value as a float, or a ``ValueError`` that names the term: a shaper returns a
    finite number (a bool or a 0-d tensor is fine), never a string, None or NaN — a NaN reward would reach
    the advantages and the loss unnoticed."""
    if isinstance(value, (str, bytes)) or value is None:
        raise RewardTermError(f"reward term {name!r} returned {value!r}; a shaper must return a finite number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise RewardTermError(f"reward term {name!r} returned {str(value)[:80]!r} ({type(value).__name__}); "
                         "a shaper must return a finite number") from None
    if not math.isfinite(out):
        raise RewardTermError(f"reward term {name!r} returned {out}; a shaper must return a finite number")
    return out


def _weight(name: str, w: Any) -> float:
    if isinstance(w, (str, bytes, bool)) or w is None:
        raise ValueError(f"the weight of reward term {name!r} must be a finite number, got {w!r}")
    try:
        out = float(w)
    except (TypeError, ValueError):
        raise ValueError(f"the weight of reward term {name!r} must be a finite number, got {w!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"the weight of reward term {name!r} must be a finite number, got {out}")
    return out


def call_term(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; an exception inside a shaper is re-raised with the term's name in front (a shaper is the
    user's code, so its bug is shown, not hidden, but it should say which term it was)."""
    try:
        return fn(*args)
    except RewardTermError:
        raise   # term_value inside an @shaper: it names the term already
    except Exception as e:
        if not _rewrappable(e):
            raise
        raise type(e)(f"reward term {name!r} raised {type(e).__name__}: {e}") from e


def _rewrappable(e: Exception) -> bool:
    """Whether ``type(e)(message)`` rebuilds the exception (built-in errors do; some custom ones take more)."""
    try:
        type(e)("x")
    except Exception:
        return False
    return True


class _WeightedTerms:
    """Named shapers with weights, each name once: the bookkeeping :class:`Reward` and
    :class:`GroupReward` share (what a term is evaluated on is theirs)."""

    def __init__(self, shapers: Mapping[str, Any] | Iterable[Any], weights: Mapping[str, float] | None = None):
        items: list[tuple[str, Any, float]] = []
        if isinstance(shapers, Mapping):
            for name, s in shapers.items():
                items.append((name, s, 1.0))
        else:
            for entry in shapers:
                s, w = entry if isinstance(entry, tuple) else (entry, 1.0)
                items.append((getattr(s, "name", type(s).__name__), s, w))
        weights = dict(weights or {})
        names = [n for n, _, _ in items]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate reward term names: {names}")
        unknown = set(weights) - set(names)
        if unknown:
            raise ValueError(f"weights given for unknown reward terms {sorted(unknown)}; terms are {names}")
        self.terms: list[tuple[str, Any, float]] = [(n, s, _weight(n, weights.get(n, w))) for n, s, w in items]

    @property
    def names(self) -> list[str]:
        return [n for n, _, _ in self.terms]

    @property
    def weights(self) -> dict[str, float]:
        return {n: w for n, _, w in self.terms}

    def with_weights(self, **weights: float):
        """A copy with some weights changed (``reward.with_weights(f1=0.5)``)."""
        return type(self)({n: s for n, s, _ in self.terms}, {**self.weights, **weights})

    def with_terms(self, *shapers: Any):
        """A copy with more terms (``reward.with_terms((brevity, 0.2))``)."""
        return type(self)([(s, w) for _, s, w in self.terms] + list(shapers))

    def _weighted(self, raw: Mapping[str, float]) -> tuple[float, dict[str, float]]:
        weighted = {n: w * raw[n] if w else 0.0 for n, _, w in self.terms}
        return float(sum(weighted.values())), weighted

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{n}×{w:g}" for n, _, w in self.terms) + ")"


class Reward(_WeightedTerms):
    """Weighted sum of shapers, reporting each weighted term.

    ``Reward({"em": ExactMatch(), "search_cost": CallCost("search")}, weights={"search_cost": 0.1})``
    or ``Reward([ExactMatch(), (CallCost("search"), 0.1)])``. Weights default to 1.
    A term name appears once; a weight of 0 keeps the term in the report (always 0).
    """

    def __init__(self, shapers: Mapping[str, RewardShaper] | Iterable[RewardShaper | tuple[RewardShaper, float]],
                 weights: Mapping[str, float] | None = None):
        super().__init__(shapers, weights)

    def evaluate(self, event: StepEvent) -> tuple[float, dict[str, float], dict[str, float]]:
        """``(reward, weighted terms, raw terms)``. Raw values are reported even for weight-0
        terms, so an opt-in term (or a penalty switched off to reproduce a paper) stays visible."""
        raw = {n: term_value(n, call_term(n, s, event)) for n, s, _ in self.terms}
        total, weighted = self._weighted(raw)
        return total, weighted, raw

    def __call__(self, event: StepEvent) -> tuple[float, dict[str, float]]:
        total, weighted, _ = self.evaluate(event)
        return total, weighted


# --------------------------------------------------------------------------- shapers from plain data
