"""Negative controls: learners that sample, update and are scored like every other, but whose
advantages say nothing about their own actions. Whatever such a learner "gains" is the noise floor a
real learner must clear in a comparison (``agentgym compare --algos grpo,...,grpo-shuffled``).

``grpo-shuffled`` computes GRPO's advantages (each episode's return normalised within its group)
and then hands every episode the advantage of a random episode of *another* group: the groups are
rotated by a random non-zero offset and, inside the receiving group, the donors are drawn in a random
order. The update therefore has GRPO's exact size and distribution of advantages, but because a donor
answered a different task, its advantage is independent of the receiver's action: the expected
advantage of every action is the donor group's mean, 0. (A plain permutation of the whole batch would
leave an episode its own advantage with chance 1/B, i.e. 1/B of the real signal; a derangement inside
one group would push the other way. Rotating across groups avoids both.) It therefore needs at least
two groups per batch (``groups_per_step >= 2``).

The shuffle is seeded by the batch's content, so a rerun with the same seeds shuffles the same way.
The other built-in control is any learner at ``lr=0`` (``grpo:lr=0``): it samples and steps the
optimizer but cannot move the weights.
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np
import torch

from agentgym.algorithms.maths.advantages import ADVANTAGES, AdvantageInputs, GroupSettings, ReturnSettings, register_advantage
from agentgym.algorithms.catalog import GRPOConfig, learner_estimator, register_learner
from agentgym.algorithms.maths.returns import episode_returns, group_normalize

__all__ = ["shuffled_group_advantage", "donor_indices", "is_negative_control_learner"]


def _batch_seed(inputs: AdvantageInputs) -> int:
    """A seed from the batch's tokens: the same batch is shuffled the same way in every rerun."""
    h = 0
    for t in inputs.trajectories:
        h = zlib.crc32(np.asarray(t.token_ids, dtype=np.int64).tobytes(), h)
    return h


def donor_indices(group_ids: Sequence[Any], rng: np.random.Generator) -> list[int]:
    """For each episode, the index of the episode (in another group) whose advantage it receives."""
    order = list(dict.fromkeys(group_ids))
    if len(order) < 2:
        raise ValueError("the shuffled-advantage control needs at least 2 groups per batch "
                         "(groups_per_step >= 2): with one group, every donor would share the receiver's task")
    members = {g: [i for i, gid in enumerate(group_ids) if gid == g] for g in order}
    shift = int(rng.integers(1, len(order)))
    donors = [0] * len(group_ids)
    for k, g in enumerate(order):
        source = members[order[(k + shift) % len(order)]]
        receivers = members[g]
        if len(source) >= len(receivers):
            picked = rng.permutation(source)[:len(receivers)]
        else:
            picked = rng.choice(source, size=len(receivers), replace=True)
        for i, j in zip(receivers, picked):
            donors[i] = int(j)
    return donors


@register_advantage("shuffled-group", credits=("episode",), settings=(ReturnSettings, GroupSettings),
                    needs_groups=True)
def shuffled_group_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's episode advantages, each handed to an episode of another group (the module says why)."""
    rewards = inputs.turn_rewards()
    episode = [episode_returns(r, config.gamma) for r in rewards]
    firsts = [e[0] if e else 0.0 for e in episode]
    adv = group_normalize(firsts, inputs.group_ids, scale=config.group_scale, eps=config.adv_eps)
    donors = donor_indices(inputs.group_ids, np.random.default_rng(_batch_seed(inputs)))
    shuffled = [[float(adv[d])] * len(e) for d, e in zip(donors, episode)]
    return inputs.to_tokens(shuffled), inputs.to_tokens(episode)


ADVANTAGES["shuffled-group"].negative_control = True   # read by is_negative_control_learner
register_learner("grpo-shuffled", advantage="shuffled-group", objective="clip", config=GRPOConfig)


def is_negative_control_learner(name: str) -> bool:
    """Whether the registered learner ``name`` is a negative control (its estimator says so)."""
    return bool(getattr(learner_estimator(name), "negative_control", False))
