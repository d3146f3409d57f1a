"""The rollout engine: many episodes at once, one batched ``generate`` per turn.

Per turn, every active episode's ids go to the policy in one call; env steps then run
concurrently in a thread pool (tools and retrievers are I/O-bound); finished episodes drop out
while the others continue. Groups repeat one task ``group_size`` times (GRPO).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from agentgym.formatting import Formatter, make_formatter
from agentgym.policy import SamplingParams
from agentgym.trajectory import Trajectory, TrajectoryBuilder, check_trajectory

__all__ = ["RolloutConfig", "RolloutBatch", "RolloutEngine", "summarize", "summarize_std", "episode_values"]


@dataclass
class RolloutConfig:
    """Settings of the rollout engine.

    Attributes:
        sampling: sampling parameters; the env's ``stop_strings`` are added to ``sampling.stop``.
        style: ``chat`` or ``continuation``; ``None`` = the env's ``observation_style``.
        max_obs_tokens: per-step observation budget (longer observations are cut, visibly); the task
            prompt (the reset observation) is not cut.
        max_context_tokens: an episode whose next turn would not fit ends as truncated.
        env_workers: threads stepping envs concurrently.
        debug_checks: assert the token-faithfulness invariants after every episode.
    """
    sampling: SamplingParams = field(default_factory=SamplingParams)
    style: str | None = None
    max_obs_tokens: int | None = 512
    max_context_tokens: int = 4096
    env_workers: int = 8
    debug_checks: bool = False


@dataclass
class RolloutBatch:
    trajectories: list[Trajectory]
    metrics: dict[str, float]


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


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Batch metrics: success, reward and each reward term, turns, tool calls, tokens, mask coverage."""
    if not trajectories:
        return {}
    values = episode_values(trajectories)
    m: dict[str, float] = {"episodes": float(len(trajectories))}
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
    if not trajectories:
        return {}
    return {k: float(np.std(v)) for k, v in episode_values(trajectories).items()}


class _Episode:
    def __init__(self, slot: int, env: gym.Env, builder: TrajectoryBuilder | None, task: Mapping[str, Any],
                 task_index: int | None, group_id: int | None):
        self.slot, self.env, self.builder = slot, env, builder
        self.task, self.task_index, self.group_id = task, task_index, group_id
        self.turn = 0
        self.done = False
        self.traj: Trajectory | None = None
        self.messages: list[dict[str, str]] = []
        self.reward_log: list[tuple[float, dict[str, float]]] = []  # chat-only policies
        self.finish_reasons: list[str] = []


class RolloutEngine:
    """Collects trajectories from an env id (or env factory) with a token-level policy.

    A policy with ``generate`` yields token-faithful trajectories; a chat-only policy (``respond``,
    e.g. a hosted model) yields trajectories with messages and rewards but no token data.
    """

    def __init__(self, policy: Any, config: RolloutConfig | None = None):
        self.policy = policy
        self.config = config or RolloutConfig()
        self.tokenizer = getattr(policy, "tokenizer", None)
        self._token_level = hasattr(policy, "generate") and self.tokenizer is not None
        if not self._token_level and not hasattr(policy, "respond"):
            raise TypeError("the policy needs generate(prompts, sampling) with a tokenizer, or respond(conversations, sampling)")
        self._envs: dict[Any, list[gym.Env]] = {}
        self._pool = cf.ThreadPoolExecutor(max_workers=max(1, self.config.env_workers), thread_name_prefix="agentgym-env")

    # ------------------------------------------------------------------ envs
    def _get_envs(self, env: str | Callable[[], gym.Env], n: int, env_kwargs: Mapping[str, Any]) -> list[gym.Env]:
        key = (env, tuple(sorted((k, repr(v)) for k, v in env_kwargs.items())))
        pool = self._envs.setdefault(key, [])
        while len(pool) < n:
            if callable(env):
                pool.append(env())
            else:
                from agentgym.registry import make
                pool.append(make(env, **env_kwargs))
        return pool[:n]

    def close(self) -> None:
        for envs in self._envs.values():
            for e in envs:
                e.close()
        self._envs.clear()
        self._pool.shutdown(wait=False)

    def formatter_for(self, env: gym.Env) -> Formatter:
        style = self.config.style or getattr(env.unwrapped, "observation_style", "chat")
        return make_formatter(style, self.tokenizer, max_obs_tokens=self.config.max_obs_tokens)

    # ------------------------------------------------------------------ collection
    def collect(self, env: str | Callable[[], gym.Env], *, num_groups: int = 1, group_size: int = 1,
                task_indices: Sequence[int] | None = None, tasks: Sequence[Mapping[str, Any]] | None = None,
                seed: int = 0, env_kwargs: Mapping[str, Any] | None = None,
                progress: Callable[[int, int], None] | None = None) -> RolloutBatch:
        """Run ``num_groups × group_size`` episodes (each group shares one task).

        Tasks: ``tasks`` (explicit task dicts), else ``task_indices``, else indices drawn from
        ``seed``. ``progress(finished, total)`` is called as episodes end.
        """
        t_start = time.perf_counter()
        timing = defaultdict(float)
        if tasks is not None:
            num_groups = len(tasks)
        elif task_indices is not None:
            num_groups = len(task_indices)
        n = num_groups * group_size
        envs = self._get_envs(env, n, dict(env_kwargs or {}))
        rng = np.random.default_rng(seed)
        base = envs[0].unwrapped
        stop = tuple(dict.fromkeys(tuple(self.config.sampling.stop) + tuple(getattr(base, "stop_strings", ()))))
        sampling = self.config.sampling.replace(stop=stop)
        formatter = self.formatter_for(envs[0]) if self._token_level else None
        tools = base.tool_specs() if hasattr(base, "tool_specs") else None

        # reset: one task per group
        episodes: list[_Episode] = []
        for g in range(num_groups):
            if tasks is not None:
                options: dict[str, Any] = {"task": dict(tasks[g])}
            else:
                if task_indices is not None:
                    idx = int(task_indices[g])
                else:
                    high = base.num_tasks if getattr(base, "num_tasks", None) else 2**31 - 1
                    idx = int(rng.integers(high))
                options = {"task_index": idx}
            for k in range(group_size):
                slot = g * group_size + k
                e = envs[slot]
                t0 = time.perf_counter()
                obs, info = e.reset(seed=int(rng.integers(2**31)), options=options)
                timing["env_s"] += time.perf_counter() - t0
                task = info.get("privileged", {}).get("task", options.get("task", {}))
                builder = None
                if formatter is not None:
                    t0 = time.perf_counter()
                    # the task prompt is never cut (max_context_tokens bounds it); only step observations are
                    builder = TrajectoryBuilder(formatter.prompt_ids(obs, tools), obs)
                    timing["format_s"] += time.perf_counter() - t0
                ep = _Episode(slot, e, builder, task, info.get("task_index"), g if group_size > 1 else None)
                ep.messages = [dict(m) for m in obs]
                episodes.append(ep)

        finished = 0
        while True:
            active = [ep for ep in episodes if not ep.done]
            if not active:
                break
            if self._token_level:
                fits = []
                for ep in active:
                    if len(ep.builder) + sampling.max_new_tokens > self.config.max_context_tokens:
                        self._finish(ep, env, terminated=False, truncated=True, reason="context_limit")
                        finished += 1
                    else:
                        fits.append(ep)
                active = fits
                if not active:
                    continue
                # copies: a policy (or a script keeping its context) must not alias the growing trajectory
                prompts = [list(ep.builder.token_ids) for ep in active]
                t0 = time.perf_counter()
                if getattr(self.policy, "wants_context", False):
                    ctx = [{"turn": ep.turn, "messages": list(ep.messages), "task": ep.task, "prompt_ids": p}
                           for ep, p in zip(active, prompts)]
                    gens = self.policy.generate(prompts, sampling, contexts=ctx)
                else:
                    gens = self.policy.generate(prompts, sampling)
                timing["generate_s"] += time.perf_counter() - t0
            else:
                t0 = time.perf_counter()
                gens = self.policy.respond([ep.messages for ep in active], sampling, tools=tools)
                timing["generate_s"] += time.perf_counter() - t0
            if len(gens) != len(active):
                raise RuntimeError(f"the policy returned {len(gens)} generations for {len(active)} prompts")

            t0 = time.perf_counter()
            results = list(self._pool.map(lambda pair: pair[0].env.step(pair[1].text), zip(active, gens)))
            timing["env_s"] += time.perf_counter() - t0

            t0 = time.perf_counter()
            for ep, gen, (obs, reward, terminated, truncated, info) in zip(active, gens, results):
                ep.turn += 1
                ep.messages.append({"role": "assistant", "content": gen.text})
                if ep.builder is not None:
                    ep.builder.add_policy(gen.token_ids, gen.logprobs, gen.text, gen.finish_reason)
                    ep.builder.add_step(reward, info.get("reward_terms", {}))
                else:
                    ep.reward_log.append((reward, info.get("reward_terms", {})))
                    ep.finish_reasons.append(gen.finish_reason)
                if terminated or truncated:
                    self._finish(ep, env, terminated, truncated, info=info)
                    finished += 1
                    continue
                if formatter is not None:
                    obs, _ = formatter.truncate(obs)
                    ep.builder.add_env(formatter.observation_ids(gen.token_ids, obs, tools), obs)
                ep.messages.extend(dict(m) for m in obs)
            timing["format_s"] += time.perf_counter() - t0
            if progress is not None:
                progress(finished, n)

        trajs = [ep.traj for ep in episodes]
        if self.config.debug_checks and self._token_level:
            for t in trajs:
                problems = check_trajectory(t, self.tokenizer)
                if problems:
                    raise AssertionError("trajectory invariants violated: " + "; ".join(problems))
        metrics = summarize(trajs)
        wall = time.perf_counter() - t_start
        metrics.update({f"time/{k}": v for k, v in timing.items()})
        metrics["time/wall_s"] = wall
        metrics["time/outside_generate_frac"] = float(1 - timing["generate_s"] / wall) if wall else 0.0
        return RolloutBatch(trajs, metrics)

    def _finish(self, ep: _Episode, env_id: Any, terminated: bool, truncated: bool,
                info: Mapping[str, Any] | None = None, reason: str | None = None) -> None:
        ep.done = True
        summary = dict((info or {}).get("episode_summary", {}))
        if reason is not None:
            summary.setdefault("success", False)
            summary["end_reason"] = reason
            summary.setdefault("turns", ep.turn)
        env_name = env_id if isinstance(env_id, str) else getattr(env_id, "__name__", None)
        if ep.builder is not None:
            ep.traj = ep.builder.build(episode=summary, terminated=terminated, truncated=truncated,
                                       group_id=ep.group_id, task_index=ep.task_index, env_id=env_name)
        else:
            rewards = ep.reward_log
            ep.traj = Trajectory([], [], [], 0, [], [m["content"] for m in ep.messages if m["role"] == "assistant"],
                                 list(ep.finish_reasons),
                                 [r for r, _ in rewards], [t for _, t in rewards], list(ep.messages), summary,
                                 terminated, truncated, ep.group_id, ep.task_index, env_name)
