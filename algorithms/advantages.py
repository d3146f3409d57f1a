"""Advantage estimators: pure functions on lists and tensors (plus one tiny stateful baseline).

Vocabulary. A trajectory has *turns*: each policy turn is a span of sampled tokens, and each env
step gives one reward, which belongs to the turn's last policy token (``Trajectory.token_rewards``).
A *transition* is one (turn, step reward) pair. Estimators work either per transition (returns,
baselines, ReBN, group normalisation), after which :func:`broadcast_to_tokens` spreads the value
over the turn's tokens, or per token (GAE), on the sequence of policy-token positions.

Conventions worth knowing:

* ReBN and the batch baselines use the *population* std (GEM's ReBN computes
  ``sqrt(E[G²] - E[G]²)``); group normalisation uses the *sample* std, like TRL's GRPO.
* An episode that ends by truncation is treated as terminal (V after the last token = 0), as
  LLM RL frameworks (verl, TRL, Search-R1) do: the turn limit is part of the task.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

__all__ = [
    "discounted_returns", "broadcast_to_tokens", "NoBaseline", "BatchMeanBaseline", "MovingAverageBaseline",
    "make_baseline", "rebn", "gae", "group_normalize",
]


# --------------------------------------------------------------------------- returns

def discounted_returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """Returns-to-go per step: ``G_t = r_t + gamma * G_{t+1}``, ``G_T = 0``."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def broadcast_to_tokens(turn_spans: Sequence[tuple[int, int]], values: Sequence[float], length: int, *,
                        fill_env: bool = False) -> list[float]:
    """Per-token list of ``length``: each turn's value on that turn's policy tokens, 0 elsewhere.

    ``fill_env=True`` (the ``mask_env_tokens=False`` ablation) also gives the environment tokens
    after turn ``k`` (up to the next turn, or the end) turn ``k``'s value: they "follow" it.
    Turns without a value (an episode cut before its step reward) get 0.
    """
    out = [0.0] * length
    for k, (start, end) in enumerate(turn_spans):
        v = float(values[k]) if k < len(values) else 0.0
        stop = (turn_spans[k + 1][0] if k + 1 < len(turn_spans) else length) if fill_env else end
        out[start:stop] = [v] * (stop - start)
    return out


# --------------------------------------------------------------------------- baselines

class NoBaseline:
    """``b = 0``: plain REINFORCE."""
    name = "none"

    def __call__(self, returns: Sequence[float]) -> float:
        return 0.0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class BatchMeanBaseline(NoBaseline):
    """``b = mean of the batch's transition returns``."""
    name = "mean"

    def __call__(self, returns: Sequence[float]) -> float:
        return float(sum(returns) / len(returns)) if len(returns) else 0.0


@dataclass
class MovingAverageBaseline:
    """Exponential moving average of batch-mean returns: ``b ← momentum·b + (1 - momentum)·mean``.

    Calling it returns the baseline for this batch — the average of *earlier* batches, so a batch's
    own returns do not enter its baseline; the first batch (nothing seen yet) uses its own mean —
    then folds this batch's mean in. A batch with a non-finite mean leaves the average alone.
    """
    momentum: float = 0.9
    value: float | None = None
    name: str = "ema"

    def __call__(self, returns: Sequence[float]) -> float:
        mean = float(sum(returns) / len(returns)) if len(returns) else 0.0
        if not math.isfinite(mean):  # a broken batch (its update will be skipped) must not poison the average
            return mean
        baseline = mean if self.value is None else self.value
        self.value = mean if self.value is None else self.momentum * self.value + (1 - self.momentum) * mean
        return baseline

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momentum, self.value = float(state["momentum"]), state["value"]


def make_baseline(name: str, momentum: float = 0.9) -> NoBaseline | MovingAverageBaseline:
    """``none`` | ``mean`` | ``ema`` (ReBN is not a baseline but a normalisation: see :func:`rebn`)."""
    if name == "none":
        return NoBaseline()
    if name == "mean":
        return BatchMeanBaseline()
    if name == "ema":
        return MovingAverageBaseline(momentum)
    raise ValueError(f"unknown baseline {name!r}; choose none, mean, ema (or rebn for the learner)")


def rebn(returns: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Return batch normalisation (GEM): ``(G - mean) / (std + eps)`` over all transitions of the batch."""
    if not len(returns):
        return []
    g = torch.tensor([float(x) for x in returns], dtype=torch.float64)
    std = g.std(unbiased=False)
    centred = g - g.mean()
    return (centred / (std + eps) if std > 0 else centred).tolist()


# --------------------------------------------------------------------------- GAE

def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the positions where ``mask`` is 1.

    ``rewards``, ``values``, ``mask``: ``(T,)`` or ``(B, T)``. The recursion runs on the sequence of
    masked positions only — environment tokens (mask 0) are skipped, so the "next state" of a
    turn's last token is the first token of the next policy turn. For consecutive kept positions
    ``t < t'``::

        delta_t = r_t + gamma * V_{t'} - V_t          (V after the last kept position = 0)
        A_t     = delta_t + gamma * lam * A_{t'}

    Returns ``(advantages, returns = advantages + values)``, both 0 where ``mask`` is 0. Rewards at
    masked positions are ignored (``Trajectory.token_rewards`` puts none there). Search-R1 uses
    ``gamma = lam = 1``, where ``A_t = (sum of later rewards) - V_t``.
    """
    squeeze = rewards.dim() == 1
    if squeeze:
        rewards, values, mask = rewards[None], values[None], mask[None]
    device = rewards.device
    # a sequential loop of tiny ops: cheaper on the CPU than as thousands of GPU kernel launches
    rewards, values = rewards.detach().double().cpu(), values.detach().double().cpu()
    keep = mask.detach().cpu().bool()
    adv = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0], dtype=torch.float64)
    next_adv = torch.zeros_like(next_value)
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        k = keep[:, t]
        adv[:, t] = torch.where(k, a, torch.zeros_like(a))
        next_value = torch.where(k, values[:, t], next_value)
        next_adv = torch.where(k, a, next_adv)
    ret = torch.where(keep, adv + values, torch.zeros_like(adv))
    adv, ret = adv.float().to(device), ret.float().to(device)
    return (adv[0], ret[0]) if squeeze else (adv, ret)


# --------------------------------------------------------------------------- groups (GRPO)

def group_normalize(rewards: Sequence[float], group_ids: Sequence[Hashable | None], *, scale: bool = True,
                    eps: float = 1e-6) -> list[float]:
    """GRPO advantages: ``(r - mean_group) / (std_group + eps)``; ``scale=False`` is Dr.GRPO's ``r - mean_group``.

    The std is the sample std (as TRL). A ``None`` group id is a group of its own, whose advantage
    is 0 (nothing to compare with); so is every member of a group with a single member.
    """
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[("solo", i) if g is None else ("group", g)].append(i)
    out = [0.0] * len(rewards)
    for members in groups.values():
        if len(members) < 2:
            continue
        r = torch.tensor([float(rewards[i]) for i in members], dtype=torch.float64)
        a = r - r.mean()
        std = r.std(unbiased=True)
        if scale and std > 0:  # equal rewards: advantage 0 (not 0/0)
            a = a / (std + eps)
        for i, v in zip(members, a.tolist()):
            out[i] = v
    return out
