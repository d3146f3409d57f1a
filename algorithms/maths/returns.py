"""Returns, baselines and normalisations: the pure math under the advantage estimators
(:mod:`.advantages`), on lists and tensors (plus one tiny stateful baseline).

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

Per-turn credit (``learner.credit``, :class:`~agentgym.algorithms.maths.advantages.ReturnSettings`). How step-wise rewards reach each turn's tokens:

* ``episode`` — every turn gets the episode's return (:func:`episode_returns`; discounted from the
  first turn when ``γ < 1``); the baseline is computed over episodes, one value per trajectory (so a
  long trajectory does not weigh more in it).
* ``turn`` — turn ``k`` gets its return-to-go ``G_k = Σ_{j≥k} γ^{j-k} r_j``
  (:func:`discounted_returns`): a turn is credited only with what follows it. Group learners then
  compare ``G_k`` with *turn-level baselines* (:func:`turn_group_normalize`): turns of the same group
  whose observation history is identical share a baseline (GiGPO's grouping of equal env states,
  Feng et al., 2025, arXiv:2505.10978); a turn whose history no other group member shares is
  compared with the group's turns at the same turn index.
* ``gigpo`` — GiGPO's sum: the episode-level group advantage plus ``ω`` × the state-grouped turn
  advantage (turns without a peer add 0).
* turn-level GAE with a critic (:func:`turn_gae`): one TD step per turn, ``V`` read at each turn's
  first token; ``token`` keeps PPO's token-level :func:`gae`.

Why not normalise each turn index's *rewards* and sum them. verl issue #7244 ("Per-turn reward
support for multi-turn RL: a turn-level baseline that stays unbiased under variable turn counts")
shows that the natural construction — normalise turn ``k``'s reward against the group's turn-``k``
rewards and give turn ``t`` the sum of normalised rewards from ``t`` to the trajectory's *own* last
turn — subtracts a baseline with one term per remaining turn of the trajectory itself. That
baseline depends on the trajectory's own stopping decision, so the gradient is biased: every "take
another turn" pays the group's mean reward of the extra turn. Here each turn has exactly one baseline,
computed from its return-to-go and other trajectories' data; which pool it comes from depends only
on what happened before the turn. ``tests/test_credit.py`` builds #7244's case and checks both by
exact expectation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

__all__ = [
    "discounted_returns", "broadcast_to_tokens", "NoBaseline", "BatchMeanBaseline", "MovingAverageBaseline",
    "make_baseline", "rebn", "gae", "group_normalize", "leave_one_out", "CREDITS", "episode_returns",
    "turn_rewards", "observation_history_keys", "turn_group_normalize", "turn_gae", "pad_token_lists",
]

#: Every credit-assignment choice an estimator may support (see the module docstring).
CREDITS = ("episode", "turn", "gigpo", "token")


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

def _group_key(i: int, group_id: Hashable | None) -> tuple:
    """Trajectory ``i``'s group: its ``group_id``, or a group of its own when that is None."""
    return ("solo", i) if group_id is None else ("group", group_id)


def _groups(group_ids: Sequence[Hashable | None]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[_group_key(i, g)].append(i)
    return groups


def group_normalize(rewards: Sequence[float], group_ids: Sequence[Hashable | None], *, scale: bool = True,
                    eps: float = 1e-6) -> list[float]:
    """GRPO advantages: ``(r - mean_group) / (std_group + eps)``; ``scale=False`` is Dr.GRPO's ``r - mean_group``.

    The std is the sample std (as TRL and veRL; ``eps`` 1e-6 is veRL's, TRL adds 1e-4). A ``None`` group
    id is a group of its own, whose advantage is 0 (nothing to compare with); so is every member of a group
    with a single member (veRL instead passes a lone member's reward through as its advantage).
    """
    groups = _groups(group_ids)
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


def leave_one_out(rewards: Sequence[float], group_ids: Sequence[Hashable | None]) -> list[float]:
    """RLOO advantages: ``r_i - mean_{j≠i} r_j`` within each group (Kool et al., 2019, "Buy 4 REINFORCE
    samples, get a baseline for free!"; Ahmadian et al., 2024, arXiv:2402.14740).

    The baseline leaves the sample itself out, so it is independent of the sample's own action and the
    gradient estimate is unbiased — unlike the in-group mean, which shrinks it by ``(n - 1) / n``.
    Equal to ``n / (n - 1) · (r_i - mean_group)``. Singletons (and ``None`` groups) get 0.
    """
    out = [0.0] * len(rewards)
    for members in _groups(group_ids).values():
        n = len(members)
        if n < 2:
            continue
        total = math.fsum(float(rewards[i]) for i in members)
        for i in members:
            out[i] = float(rewards[i]) - (total - float(rewards[i])) / (n - 1)
    return out


# --------------------------------------------------------------------------- per-turn credit

def turn_rewards(token_rewards: Sequence[float], turn_spans: Sequence[tuple[int, int]]) -> list[float]:
    """Each turn's reward: the token rewards from the turn's first token up to the next turn's first
    token (the step reward on its last policy token, plus any per-token terms such as a KL penalty)."""
    starts = [s for s, _ in turn_spans] + [len(token_rewards)]
    return [math.fsum(float(r) for r in token_rewards[starts[k]:starts[k + 1]]) for k in range(len(turn_spans))]


def episode_returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """Episode-level credit: the episode's return (discounted from its first turn, ``G_0``) on every turn."""
    g0 = discounted_returns(rewards, gamma)[0] if len(rewards) else 0.0
    return [g0] * len(rewards)


def observation_history_keys(token_ids: Sequence[int], loss_mask: Sequence[int],
                             turn_spans: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
    """For each turn, the environment-side ids before it (prompt, observations, template glue: every
    token the policy did not sample). Two turns with equal keys saw the same observations in the same
    order — the same env state for a POMDP whose state is its observation history."""
    keys = []
    for start, _ in turn_spans:
        keys.append(tuple(int(t) for t, m in zip(token_ids[:start], loss_mask[:start]) if not m))
    return keys


def turn_group_normalize(turn_values: Sequence[Sequence[float]], group_ids: Sequence[Hashable | None],
                         state_keys: Sequence[Sequence[Hashable]] | None = None, *, scale: bool = True,
                         eps: float = 1e-6, leave_one_out_baseline: bool = False,
                         index_fallback: bool = True) -> list[list[float]]:
    """Per-turn advantages with turn-level baselines.

    ``turn_values[i][k]`` (e.g. the return-to-go of trajectory ``i``'s turn ``k``) is compared with a
    pool of turns from the same group: those with the same state key (``state_keys[i][k]``, e.g.
    :func:`observation_history_keys`) when at least one other member shares it; else — with
    ``index_fallback`` — every turn of the group at the same index ``k``; without it (or with no peer
    at all) the turn's advantage is 0, as for a GRPO group of one. Within the pool: ``v - mean``
    divided by the pool's sample std (``scale``, as :func:`group_normalize`; equal values give 0), or
    ``v - mean of the others`` (``leave_one_out_baseline``: RLOO, no scaling).

    Unbiasedness: the pool of turn ``(i, k)`` is decided by histories before turn ``k`` and its other
    members are independent samples, so its baseline does not depend on trajectory ``i``'s action at
    ``k`` or later (leave-one-out makes it exact; the in-pool mean carries GRPO's usual ``(n-1)/n``
    shrinkage). Exactly one baseline per turn — never one per *remaining* turn (verl #7244).
    """
    by_state: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    by_index: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for i, values in enumerate(turn_values):
        g = _group_key(i, group_ids[i])
        for k in range(len(values)):
            by_index[(g, k)].append((i, k))
            if state_keys is not None:
                by_state[(g, state_keys[i][k])].append((i, k))
    out = [[0.0] * len(v) for v in turn_values]
    for i, values in enumerate(turn_values):
        g = _group_key(i, group_ids[i])
        for k, v in enumerate(values):
            pool = by_state[(g, state_keys[i][k])] if state_keys is not None else []
            if len(pool) < 2:
                pool = by_index[(g, k)] if index_fallback else []
            if len(pool) < 2:
                continue
            pv = torch.tensor([float(turn_values[j][m]) for j, m in pool], dtype=torch.float64)
            if leave_one_out_baseline:
                out[i][k] = float(v) - (float(pv.sum()) - float(v)) / (len(pool) - 1)
                continue
            a = float(v) - float(pv.mean())
            std = float(pv.std(unbiased=True))
            out[i][k] = a / (std + eps) if scale and std > 0 else a
    return out


def turn_gae(rewards: Sequence[float], values: Sequence[float], gamma: float = 1.0,
             lam: float = 1.0) -> tuple[list[float], list[float]]:
    """GAE with one time step per turn (Schulman et al., 2016, arXiv:1506.02438, applied at turn level).

    ``rewards[k]``: turn ``k``'s reward; ``values[k]``: the critic's value of the state in which turn
    ``k`` is chosen (its first token). ``δ_k = r_k + γ V_{k+1} - V_k`` (``V`` after the last turn = 0),
    ``A_k = δ_k + γ λ A_{k+1}``. Returns ``(advantages, returns = advantages + values)``. Unlike
    token-level :func:`gae`, the discount counts turns, not tokens.
    """
    n = len(rewards)
    adv = [0.0] * n
    next_value, next_adv = 0.0, 0.0
    for k in range(n - 1, -1, -1):
        delta = float(rewards[k]) + gamma * next_value - float(values[k])
        next_adv = delta + gamma * lam * next_adv
        adv[k] = next_adv
        next_value = float(values[k])
    return adv, [a + float(v) for a, v in zip(adv, values)]


def pad_token_lists(rows: Sequence[Sequence[float]], width: int | None = None, *, value: float = 0.0,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Right-pad lists of per-token numbers into a ``(len(rows), width)`` tensor."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.as_tensor(list(r), dtype=dtype)
    return out
