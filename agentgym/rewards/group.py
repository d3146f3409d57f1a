"""Group shapers: terms that see a whole GRPO group once its episodes have ended (see :mod:`agentgym.rewards`).

:class:`GroupReward` composes them with weights like :class:`~agentgym.rewards.Reward`;
:func:`apply_group_reward` adds each weighted term to the last step of each episode of a group.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from agentgym.parsing import last_tag_content
from agentgym.rewards.terms import _WeightedTerms, call_term, term_value
from agentgym.rewards.shapers import normalize_answer


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
            values = [term_value(n, v) for v in call_term(n, s, members)]
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
