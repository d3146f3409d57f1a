"""Batch metrics over trajectories: what an episode contributes, their means and their spreads.

:func:`summarize` is what every ``collect`` reports and what evaluation and the report show;
:func:`summarize_std` gives the spreads over the same numbers (:func:`episode_values`); :func:`task_groups`
and :func:`task_success` give a per-task view (k episodes of one task -> one number) for CIs over tasks.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

import numpy as np

from agentgym.trajectory import Trajectory

__all__ = ["episode_values", "scored_episodes", "summarize", "summarize_std", "task_groups", "task_success"]


#: Episode-summary keys every env reports; the others (numeric ones) become ``episode/<key>`` metrics.
_STANDARD_EPISODE_KEYS = frozenset({"success", "return", "turns", "terminated", "truncated", "tool_calls",
                                    "invalid_actions", "task_index"})


def episode_values(trajectories: Sequence[Trajectory]) -> dict[str, list[float]]:
    """Each per-episode metric's values, named as :func:`summarize` names their mean.

    One place defines what an episode contributes (success, return, each reward term's total, the
    env's own numeric episode metrics such as ToolCall's ``tool_selection_accuracy``), so means
    and spreads (:func:`summarize_std`) are always computed over the same numbers. Reward terms
    missing from an episode count as 0; ``episode/<key>`` lists hold only the episodes reporting it.
    """
    trajs = list(trajectories)
    values: dict[str, list[float]] = {
        "success_rate": [float(bool(t.episode.get("success"))) for t in trajs],
        "reward_mean": [t.total_reward for t in trajs],
        "turns_mean": [float(t.num_turns) for t in trajs],
        "tool_calls_mean": [float(t.episode.get("tool_calls", 0)) for t in trajs],
        "invalid_actions_mean": [float(t.episode.get("invalid_actions", 0)) for t in trajs],
        "truncated_rate": [float(t.truncated) for t in trajs],
        "response_tokens_mean": [float(t.num_policy_tokens) for t in trajs],
    }
    term_names = {k for t in trajs for step in t.reward_terms for k in step}
    for t in trajs:
        totals: dict[str, float] = defaultdict(float)
        for step in t.reward_terms:
            for k, v in step.items():
                totals[k] += v
        for k in term_names:
            values.setdefault(f"reward/{k}", []).append(totals.get(k, 0.0))
    extra: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        for k, v in t.episode.items():
            if k not in _STANDARD_EPISODE_KEYS and isinstance(v, (int, float, bool, np.number)):
                extra[k].append(float(v))
    for k, vals in sorted(extra.items()):
        values[f"episode/{k}"] = vals
    return values


def scored_episodes(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The episodes that say something about the policy: all but those a service failure ended
    (``infra_error`` in the episode summary; agentgym.errors). A sandbox or retriever outage is not a
    wrong answer, so it is neither a success nor a failure in any rate."""
    return [t for t in trajectories if not (t.episode or {}).get("infra_error")]


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Batch metrics: success, reward and each reward term, turns, tool calls, tokens, mask coverage.

    ``episodes`` counts every episode and ``infra_errors`` those a service failure ended; every other
    metric is over the rest (:func:`scored_episodes`), NaN for the rates when nothing is left."""
    if not trajectories:
        return {}
    scored = scored_episodes(trajectories)
    head = {"episodes": float(len(trajectories)), "infra_errors": float(len(trajectories) - len(scored))}
    if not scored:
        return {**head, "success_rate": math.nan, "reward_mean": math.nan}
    trajectories = scored
    values = episode_values(trajectories)
    m: dict[str, float] = dict(head)
    for k in ("success_rate", "reward_mean"):
        m[k] = float(np.mean(values[k]))
    m["reward_std"] = float(np.std(values["reward_mean"]))
    for k in ("turns_mean", "tool_calls_mean", "invalid_actions_mean", "truncated_rate"):
        m[k] = float(np.mean(values[k]))
    m["generated_tokens"] = float(sum(values["response_tokens_mean"]))
    m["response_tokens_mean"] = float(np.mean(values["response_tokens_mean"]))
    total_after_prompt = sum(len(t.token_ids) - t.prompt_length for t in trajectories)
    # masked-token coverage: share of the non-prompt tokens that are environment tokens (loss_mask 0)
    m["masked_token_fraction"] = float(1 - m["generated_tokens"] / total_after_prompt) if total_after_prompt else 0.0
    # each reward term, then the env's own episode metrics (averaged over the episodes reporting them)
    for k, vals in values.items():
        if k.startswith(("reward/", "episode/")):
            m[k] = float(np.mean(vals))
    return m


def summarize_std(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Population std over episodes of every per-episode metric, keyed like :func:`summarize`'s means
    (``success_rate`` → spread of the success indicator). Aggregates (``episodes``,
    ``generated_tokens``, ``masked_token_fraction``) have no spread and are absent."""
    scored = scored_episodes(trajectories)
    if not scored:
        return {}
    return {k: float(np.std(v)) for k, v in episode_values(scored).items()}


def task_groups(trajectories: Sequence[Trajectory], group_size: int) -> list[list[Trajectory]]:
    """The episodes task by task: ``collect`` returns a group's ``group_size`` episodes (one task)
    together, so these are consecutive runs of ``group_size``; refused when they are not."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if len(trajectories) % group_size:
        raise ValueError(f"{len(trajectories)} episodes do not split into groups of {group_size}")
    groups = [list(trajectories[i:i + group_size]) for i in range(0, len(trajectories), group_size)]
    if any(len({getattr(t, "task_index", None) for t in g}) > 1 for g in groups):
        raise ValueError("episodes are not task by task (collect returns them group by group)")
    return groups


def task_success(group: Sequence[Trajectory]) -> float:
    """One task's success: the mean over its scored episodes (:func:`scored_episodes`): 0 or 1 from
    one episode, the share of k sampled ones that succeeded from k; NaN when service failures ended all."""
    scored = scored_episodes(group)
    if not scored:
        return math.nan
    return float(np.mean([float(bool((t.episode or {}).get("success"))) for t in scored]))
