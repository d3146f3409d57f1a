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

Where each part lives: events, ``@shaper`` and :class:`Reward` in :mod:`agentgym.rewards.terms`; the
built-in shapers and answer matching in :mod:`agentgym.rewards.shapers`; group shapers in
:mod:`agentgym.rewards.group`; rewards from plain data in :mod:`agentgym.rewards.spec`. Import them from
here.
"""

from __future__ import annotations

from agentgym.rewards.group import (AnswerDiversity, GroupMember, GroupReward, GroupShaper, SharedWrongAnswer,
                                    apply_group_reward, group_shaper)
from agentgym.rewards.spec import load_shaper, resolve_reward
from agentgym.rewards.terms import (PotentialShaper, Reward, RewardShaper, StepEvent, StepRecord, gold_answers,
                                   potential_shaper, shaper)
from agentgym.rewards.shapers import (CallCost, ExactMatch, FormatCompliance, InvalidActionPenalty, LengthPenalty, TokenF1,
                              TurnLimitPenalty, exact_match, normalize_answer, token_f1)

__all__ = [
    "StepEvent", "StepRecord", "RewardShaper", "shaper", "Reward",
    "normalize_answer", "exact_match", "token_f1", "gold_answers",
    "ExactMatch", "TokenF1", "FormatCompliance", "CallCost", "InvalidActionPenalty",
    "LengthPenalty", "TurnLimitPenalty",
    "GroupMember", "GroupShaper", "group_shaper", "GroupReward", "apply_group_reward",
    "AnswerDiversity", "SharedWrongAnswer", "potential_shaper", "PotentialShaper",
    "load_shaper", "resolve_reward",
]
