"""Reward shapers: small named callables, composed with weights.

A shaper receives a :class:`StepEvent` and returns a float. A :class:`Reward` composes shapers
with weights; every step it reports each weighted term, so ``sum(info["reward_terms"].values())``
equals the step's reward. Terminal shapers return 0 until ``event.done``.

Writing a new shaper::

    from agentgym.rewards import shaper

    @shaper("politeness", terminal=True)
    def politeness(event):
        return 1.0 if "please" in event.action.lower() else 0.0

**Group shapers** see a whole GRPO group once its episodes have ended: a group shaper receives the
group's :class:`GroupMember` views and returns one value per member (a diversity bonus, a penalty
for a wrong answer the whole group shares). :class:`GroupReward` composes them with weights like
:class:`Reward`; an env carries one as its ``group_reward`` attribute, and the rollout engine calls
:func:`apply_group_reward` on each finished group, which adds each weighted term to the episode's
last step (its reward and ``reward_terms``) and to its episode totals, so returns, advantages and
metrics (``reward/<term>``) include it.

**From plain data** (config files, ``agentgym train env_kwargs.reward=...``): :func:`resolve_reward`
reads ``reward=`` as a mapping of weights in which a key ``"module.path:attr"`` imports a shaper and
adds it as a new term (``{"mypkg.shapers:brevity": 0.2, "format": 0.5}``), or as one such string
(weight 1). The env imports it, so the config itself stays strings and numbers.
"""

from __future__ import annotations

import functools
import importlib
import math
import numbers
import os
import re
import string
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from agentgym.parsing import last_tag_content

__all__ = [
    "StepEvent", "StepRecord", "RewardShaper", "shaper", "Reward",
    "normalize_answer", "exact_match", "token_f1",
    "ExactMatch", "TokenF1", "FormatCompliance", "CallCost", "InvalidActionPenalty",
    "LengthPenalty", "TurnLimitPenalty",
    "GroupMember", "GroupShaper", "group_shaper", "GroupReward", "apply_group_reward",
    "AnswerDiversity", "SharedWrongAnswer", "potential_shaper", "PotentialShaper",
    "load_shaper", "resolve_reward",
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
                items.append((getattr(s, "name", type(s).__name__), s, float(w)))
        weights = dict(weights or {})
        names = [n for n, _, _ in items]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate reward term names: {names}")
        unknown = set(weights) - set(names)
        if unknown:
            raise ValueError(f"weights given for unknown reward terms {sorted(unknown)}; terms are {names}")
        self.terms: list[tuple[str, Any, float]] = [(n, s, float(weights.get(n, w))) for n, s, w in items]

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
        raw = {n: float(s(event)) for n, s, _ in self.terms}
        total, weighted = self._weighted(raw)
        return total, weighted, raw

    def __call__(self, event: StepEvent) -> tuple[float, dict[str, float]]:
        total, weighted, _ = self.evaluate(event)
        return total, weighted


# --------------------------------------------------------------------------- shapers from plain data
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _is_import_path(key: Any) -> bool:
    """``"module.path:attr"``: a shaper named by where it lives. Default term names never hold a colon."""
    return isinstance(key, str) and ":" in key


def load_shaper(path: str) -> RewardShaper:
    """The shaper at import path ``"module.path:attr"`` (``attr`` may be dotted: ``"mod:Class.attr"``).

    Lets a config or a command line — plain strings — name a user's shaper without a registry or an
    ``--import``. ``attr`` may be a shaper object (``@shaper``, a :class:`PotentialShaper`, any callable
    with a ``name``), a class (instantiated with no arguments, as the built-ins can be) or a plain
    function ``StepEvent -> float``, which becomes a step-wise shaper named ``attr``. The current
    directory is importable first, as with ``python -m`` and ``agentgym --import``, so ``mypkg/`` next
    to the user works from the ``agentgym`` script too. A typo is a one-line ``ValueError`` /
    ``TypeError`` (the CLI prints those without a traceback).
    """
    if not _IMPORT_PATH.fullmatch(path.strip()):
        hint = (" — a mapping typed after -e/--env-kwarg must be JSON, keys quoted: "
                "'{\"mypkg.shapers:brevity\": 0.2}'" if path.lstrip().startswith("{") else "")
        raise ValueError(f"reward shaper {path!r}: expected an import path 'module.path:attr' "
                         f"(e.g. 'mypkg.shapers:brevity'){hint}")
    module_name, _, attr = path.strip().partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:  # one line either way; the cause stays chained for AGENTGYM_DEBUG
        missing = getattr(e, "name", None)
        if isinstance(e, ModuleNotFoundError) and missing and (module_name + ".").startswith(missing + "."):
            raise ValueError(f"reward shaper {path!r}: no module named {missing!r} "
                             f"(not in the current directory {os.getcwd()} nor on the Python path)") from e
        raise ValueError(f"reward shaper {path!r}: importing {module_name!r} failed: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"reward shaper {path!r}: {getattr(obj, '__name__', module_name)!r} has no attribute "
                             f"{part!r}" + _candidates(obj))
        obj = getattr(obj, part)
    name = attr.rsplit(".", 1)[-1]
    if isinstance(obj, _FunctionGroupShaper):
        raise TypeError(f"reward shaper {path!r} is a group shaper; pass it as group_reward, not reward")
    if isinstance(obj, type):
        try:
            obj = obj()
        except TypeError as e:
            raise TypeError(f"reward shaper {path!r} is a class that cannot be built without arguments ({e}); "
                            f"point at an instance instead (e.g. 'module.path:my_instance')") from None
    if not callable(obj):
        raise TypeError(f"reward shaper {path!r} is not callable (type {type(obj).__name__}): expected an @shaper "
                        f"function, a shaper class, or a function StepEvent -> float")
    own = getattr(obj, "name", None)
    if own is None:   # a plain function: the attribute's name is the term's name
        return _FunctionShaper(obj, name, terminal=False)
    if not isinstance(own, str) or not own:
        raise TypeError(f"reward shaper {path!r} has name {own!r}; a shaper's name must be a non-empty string")
    return obj


def _candidates(where: Any) -> str:
    """``"; shapers there: a, b"`` — what a misspelt attribute probably meant (shaper objects and the
    functions and classes defined in that module), or ``""``."""
    home = getattr(where, "__name__", None)
    names = sorted(n for n, v in getattr(where, "__dict__", {}).items()
                   if not n.startswith("_") and callable(v)
                   and (isinstance(getattr(v, "name", None), str) or getattr(v, "__module__", None) == home))
    return f"; shapers there: {', '.join(names)}" if names else ""


def _weight(key: str, value: Any) -> float:
    """A finite number. A numeric string counts (YAML reads ``1e-3`` as a string: it wants ``1.0e-3``);
    a bool (YAML's ``yes`` / ``on``) is a typo, not a weight."""
    w = None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        w = float(value)
    elif isinstance(value, str):
        try:
            w = float(value)
        except ValueError:
            pass
    if w is None or not math.isfinite(w):
        raise ValueError(f"reward weight for {key!r} must be a finite number, got {value!r}")
    return w


def resolve_reward(spec: Any, default: Callable[[], Reward]) -> Any:
    """What an env's ``reward=`` argument means, given the env's ``default`` reward (called only if needed).

    * ``None``: the default reward.
    * a mapping ``{name: weight}``: plain names re-weight default terms; ``"module.path:attr"`` keys
      add that shaper (:func:`load_shaper`) as a new term, reported under the shaper's ``name``.
      ``{"mypkg.shapers:brevity": 0.2, "format": 0.5}`` does both.
    * a string ``"module.path:attr"``: that shaper added with weight 1.
    * anything else (a :class:`Reward`, …): used as given.

    Only plain data reaches here from the CLI and config files, so the saved ``config.yaml`` holds the
    strings while the env holds the imported shapers.
    """
    if spec is None:
        return default()
    if isinstance(spec, str):
        if not _is_import_path(spec):
            raise ValueError(f"reward={spec!r}: a string reward names a shaper by import path 'module.path:attr' "
                             f"(e.g. 'mypkg.shapers:brevity'); re-weight default terms with a mapping "
                             f"{{name: weight}}")
        spec = {spec: 1.0}
    if not isinstance(spec, Mapping):
        return spec
    bad = [k for k in spec if not isinstance(k, str)]
    if bad:
        raise ValueError(f"reward mapping keys must be term names or 'module.path:attr' strings, got {bad!r}")
    weights = {k: _weight(k, v) for k, v in spec.items()}
    reward = default()
    plain = {k: w for k, w in weights.items() if not _is_import_path(k)}
    try:
        reward = reward.with_weights(**plain)
    except ValueError as e:   # keep the usual message, and say how a custom shaper is named
        raise ValueError(f"{e} (a custom shaper is named by import path, 'module.path:attr')") from None
    added: dict[str, str] = {}
    for path, w in weights.items():
        if not _is_import_path(path):
            continue
        s = load_shaper(path)
        if s.name in reward.names:
            raise ValueError(f"reward shaper {path!r} is named {s.name!r}, which "
                             + (f"{added[s.name]!r} already uses" if s.name in added else
                                f"a default term already uses (terms are {reward.names})")
                             + "; give the shaper another name")
        added[s.name] = path
        reward = reward.with_terms((s, w))
    return reward


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



# --------------------------------------------------------------------------- group shapers
@dataclass(frozen=True)
class GroupMember:
    """One finished episode of a group, as a group shaper sees it.

    ``reward`` is the episode's return from its step shapers (before any group term); ``answer``
    is its final answer: the env's (``episode["answer"]``) when the episode summary has one, else
    the content of the last ``<answer>…</answer>`` of its last action, else None. ``trajectory``
    gives everything else (messages, tokens, per-step reward terms).
    """
    index: int
    actions: tuple[str, ...]
    answer: str | None
    success: bool
    reward: float
    truncated: bool
    episode: Mapping[str, Any]
    trajectory: Any = None

    @classmethod
    def of(cls, index: int, trajectory: Any) -> "GroupMember":
        episode = dict(getattr(trajectory, "episode", None) or {})
        actions = tuple(trajectory.actions)
        answer = episode.get("answer")
        if answer is None and actions:
            answer = last_tag_content(actions[-1], "answer")
        return cls(index, actions, None if answer is None else str(answer), bool(episode.get("success")),
                   float(sum(trajectory.step_rewards)), bool(trajectory.truncated), episode, trajectory)


@runtime_checkable
class GroupShaper(Protocol):
    name: str

    def __call__(self, members: Sequence[GroupMember]) -> Sequence[float]: ...


class _FunctionGroupShaper:
    def __init__(self, fn: Callable[[Sequence[GroupMember]], Sequence[float]], name: str):
        self.fn, self.name = fn, name
        self.__doc__ = fn.__doc__

    def __call__(self, members: Sequence[GroupMember]) -> list[float]:
        return [float(v) for v in self.fn(members)]

    def __repr__(self) -> str:
        return f"group_shaper({self.name!r})"


def group_shaper(name: str | None = None) -> Callable[[Callable[[Sequence[GroupMember]], Sequence[float]]], GroupShaper]:
    """Decorator turning ``fn(members) -> one float per member`` into a named group shaper."""
    def wrap(fn: Callable[[Sequence[GroupMember]], Sequence[float]]) -> GroupShaper:
        return _FunctionGroupShaper(fn, name or fn.__name__)
    return wrap


class GroupReward(_WeightedTerms):
    """Weighted group shapers, reporting each weighted term per member — :class:`Reward` for groups.

    ``GroupReward([AnswerDiversity(), (SharedWrongAnswer(), 0.5)])``. Not callable on purpose: an
    env attribute that is callable reads as a method through remote env proxies (Ray).
    """

    def __init__(self, shapers: Mapping[str, GroupShaper] | Iterable[GroupShaper | tuple[GroupShaper, float]],
                 weights: Mapping[str, float] | None = None):
        super().__init__(shapers, weights)

    def evaluate(self, members: Sequence[GroupMember]) -> list[tuple[float, dict[str, float], dict[str, float]]]:
        """Per member, ``(group reward, weighted terms, raw terms)``."""
        raw_by_term = {}
        for n, s, _ in self.terms:
            values = [float(v) for v in s(members)]
            if len(values) != len(members):
                raise ValueError(f"group shaper {n!r} returned {len(values)} values for {len(members)} members")
            raw_by_term[n] = values
        out = []
        for i in range(len(members)):
            raw = {n: raw_by_term[n][i] for n in raw_by_term}
            total, weighted = self._weighted(raw)
            out.append((total, weighted, raw))
        return out


def apply_group_reward(trajectories: Sequence[Any], group_reward: GroupReward | Iterable[Any] | None) -> None:
    """Add the group terms to the trajectories of one finished group, in place.

    For each episode, each weighted term goes onto its last step: added to ``step_rewards[-1]``
    (so it reaches the last policy token and every return / advantage estimator), recorded under
    the term's name in ``reward_terms[-1]``, and added to the episode summary's ``return`` and
    ``reward_terms`` totals — so ``reward_mean`` and ``reward/<term>`` metrics report it.
    ``group_reward`` may also be a list of group shapers (weights as in :class:`Reward`); None
    does nothing. An episode that ended before its first turn has no step to carry a term and gets
    none (it still counts as a member the others are compared with). A term name that the
    trajectory already reports (a step term of that name, or the group reward applied twice)
    raises ``ValueError``: call this once per group.
    """
    if group_reward is None or not trajectories:
        return
    if not isinstance(group_reward, GroupReward):
        group_reward = GroupReward([group_reward] if callable(group_reward) else group_reward)
    for t in trajectories:
        clash = sorted({n for step in t.reward_terms for n in step} & set(group_reward.names))
        if clash:
            raise ValueError(f"group reward terms {clash} are already reported by this trajectory (a step term of the "
                             f"same name, or the group reward applied twice)")
    members = [GroupMember.of(i, t) for i, t in enumerate(trajectories)]
    for t, (total, weighted, _) in zip(trajectories, group_reward.evaluate(members)):
        if not t.step_rewards:
            continue
        t.step_rewards[-1] += total
        if len(t.reward_terms) < len(t.step_rewards):
            t.reward_terms.extend({} for _ in range(len(t.step_rewards) - len(t.reward_terms)))
        t.reward_terms[-1].update(weighted)
        totals = t.episode.setdefault("reward_terms", {})
        for n, v in weighted.items():
            totals[n] = totals.get(n, 0.0) + v
        if "return" in t.episode:
            t.episode["return"] = float(t.episode["return"]) + total


class AnswerDiversity:
    """Diversity bonus: the share of the *other* members whose final answer differs from this one's
    (normalised as :func:`normalize_answer`); 0 for a member without an answer and in a group of one.
    Rewards exploring different answers, not being right: pair it with a correctness term."""

    def __init__(self, name: str = "diversity"):
        self.name = name

    def __call__(self, members: Sequence[GroupMember]) -> list[float]:
        answers = [None if m.answer is None else normalize_answer(m.answer) for m in members]
        n = len(members)
        return [0.0 if a is None or n < 2 else sum(b != a for b in answers) / (n - 1) for a in answers]


class SharedWrongAnswer:
    """-1 for a member whose wrong answer at least ``min_share`` of the group gave too (answers
    normalised as :func:`normalize_answer`; wrong = the episode did not succeed; 0 in a group of one).

    ``min_share=1`` (default): only when every member answers the same wrong thing — a collapsed
    group. Every member then gets the same penalty, a shift of the whole group that group-normalised
    advantages (GRPO) cancel; it matters to estimators without a group baseline. A lower share (e.g.
    0.5) penalises a wrong majority answer inside a group that also holds other answers, which GRPO
    does see.
    """

    def __init__(self, min_share: float = 1.0, name: str = "shared_wrong"):
        if not 0.0 < min_share <= 1.0:
            raise ValueError(f"min_share must be in (0, 1], got {min_share}")
        self.min_share, self.name = min_share, name

    def __call__(self, members: Sequence[GroupMember]) -> list[float]:
        answers = [None if m.answer is None else normalize_answer(m.answer) for m in members]
        counts = Counter(a for a in answers if a is not None)
        need = self.min_share * len(members) - 1e-9
        return [-1.0 if len(members) > 1 and a is not None and not m.success and counts[a] >= need else 0.0
                for a, m in zip(answers, members)]
