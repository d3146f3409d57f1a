"""The one evaluation path: run a policy's episodes over an env's tasks and score them, per episode and per
task. The trainer's held-out evals (:mod:`agentgym.algorithms.loop.held_out`) and ``agentgym eval``
(:mod:`agentgym.app.eval_run`, which adds only the command's config, printing and files) both call
:func:`run_eval`, so a run's eval and a later ``agentgym eval`` of the same tasks count alike.

Per episode: every metric of :func:`~agentgym.rollout_metrics.summarize` as mean and spread
(:func:`~agentgym.rollout_metrics.summarize_std`). Per task: each task's success is the mean over its
``group_size`` episodes (:func:`per_task`), summarized with a 95 % bootstrap CI over tasks and, with
n > 1 samples per task, pass@k for k = 1, 2, 4, ... (and 10, 100) up to n by the unbiased estimator of
Chen et al. 2021 (:func:`task_summary`, :func:`pass_at_k_values`); two evals of the same tasks give the
paired difference per task with its CI (:func:`paired_difference`). An episode a service failure ended
(``infra_error``) is neither a success nor a failure anywhere here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from agentgym.rollout import RolloutEngine, RolloutProgress
from agentgym.rollout_metrics import scored_episodes, summarize, summarize_std, task_groups, task_success
from agentgym.stats import bootstrap_ci, paired_bootstrap_ci, pass_at_k, without_undefined
from agentgym.trajectory import Trajectory

__all__ = ["EvalResult", "run_eval", "per_task", "task_summary", "pass_at_k_values", "paired_difference"]


@dataclass
class EvalResult:
    trajectories: list[Trajectory]     # task by task, each task's group_size episodes together
    metrics: dict[str, float]          # summarize() means over all episodes + the summed time/*_s timings
    std: dict[str, float]              # summarize_std(): spread over episodes, same keys
    env_kwargs: dict[str, Any]         # what the env was built with (the split included)
    sandbox: str | None = None         # the code sandbox backend the env used, if it runs code
    tasks: list[dict[str, Any]] = field(default_factory=list)  # per_task(): each task's success


def run_eval(engine: RolloutEngine, env_id: str, *, episodes: int, group_size: int = 1, seed: int = 0,
             env_kwargs: dict[str, Any] | None = None, task_indices: Sequence[int] | None = None,
             groups_per_call: int | None = None, progress: Callable[[RolloutProgress], None] | None = None,
             call_done: Callable[[int, list[Trajectory]], None] | None = None) -> EvalResult:
    """``episodes`` tasks × ``group_size`` episodes with ``engine`` (its sampling settings: greedy, or seeded).

    Tasks are ``task_indices`` (one per task, in order), else drawn from ``seed``. ``groups_per_call`` tasks
    go into one ``collect`` call (default: all of them), the call starting at task ``s`` with seed
    ``seed + s``. ``progress(p)`` sees the eval's episodes and tokens so far (across calls) as the engine
    advances; ``call_done(new_episodes, all_so_far)`` runs after each call. The engine stays open."""
    env_kwargs = dict(env_kwargs or {})
    if task_indices is not None and len(task_indices) != episodes:
        raise ValueError(f"{len(task_indices)} task indices for {episodes} tasks")
    per_call = groups_per_call or episodes
    trajectories: list[Trajectory] = []
    timing: dict[str, float] = {}
    tokens = 0
    for start in range(0, episodes, per_call):
        k = min(per_call, episodes - start)
        indices = None if task_indices is None else list(task_indices[start:start + k])

        def turn(p: RolloutProgress, done: int = len(trajectories), before: int = tokens) -> None:
            if progress is not None:
                progress(RolloutProgress(done + p.finished, episodes * group_size, before + p.tokens, p.generating))
        batch = engine.collect(env_id, num_groups=k, group_size=group_size, task_indices=indices, seed=seed + start,
                               env_kwargs=env_kwargs, progress=turn)
        tokens += int(batch.metrics.get("generated_tokens", 0))
        trajectories.extend(batch.trajectories)
        for key, v in batch.metrics.items():
            if key.startswith("time/") and key.endswith("_s"):
                timing[key] = timing.get(key, 0.0) + v
        if call_done is not None:
            call_done(len(batch.trajectories), trajectories)
    return EvalResult(trajectories, {**summarize(trajectories), **timing}, summarize_std(trajectories), env_kwargs,
                      _sandbox_backend(engine), per_task(trajectories, group_size))


def _sandbox_backend(engine: RolloutEngine) -> str | None:
    """The sandbox backend the engine's envs ran code in (``sandbox_backend`` of envs that run code)."""
    for envs in getattr(engine, "_envs", {}).values():
        for env in envs:
            try:
                name = env.get_wrapper_attr("sandbox_backend")
            except AttributeError:
                return None
            if name:
                return str(name)
    return None


def per_task(trajectories: Sequence[Trajectory], group_size: int) -> list[dict[str, Any]]:
    """One record per task, in order: ``task_index``, ``episodes``, ``scored`` (those no service failure
    ended) and ``success``, the mean over the scored ones (0/1 from one episode; NaN when none is scored)."""
    return [{"task_index": g[0].task_index, "episodes": len(g), "scored": len(scored_episodes(g)),
             "success": task_success(g)} for g in task_groups(trajectories, group_size)]


def task_summary(tasks: list[dict[str, Any]], group_size: int) -> dict[str, Any]:
    """Success over tasks with its 95 % percentile-bootstrap CI (tasks resampled; each task's value is the
    mean of its episodes; NaN bounds where there is no interval, ``ci_note`` then says why: fewer than 2
    tasks, or all alike) and, with ``group_size`` = n > 1, ``pass@k`` for each k of :func:`pass_at_k_values`
    (pass@n is the share of tasks that any of their n episodes solved). Tasks without a scored episode are
    left out."""
    values = [t["success"] for t in tasks if not math.isnan(t["success"])]
    (mean, low, high), why = without_undefined(bootstrap_ci(values), len(values), "task")  # NaN bounds: no interval
    out: dict[str, Any] = {"tasks": float(len(values)), "task_success": mean, "task_success_ci_low": low,
                           "task_success_ci_high": high, "ci_note": why}
    if group_size > 1:
        out.update(pass_at_k_values(tasks, group_size))
    return out


def _k_values(n: int) -> list[int]:
    """The k reported for n samples per task: 1, 2, 4, 8, ..., HumanEval's usual 10 and 100, and n itself."""
    ks = {k for k in (10, 100) if k <= n} | {n}
    k = 1
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def pass_at_k_values(tasks: list[dict[str, Any]], n: int) -> dict[str, float]:
    """``{"pass@k": mean over tasks}`` for k in 1, 2, 4, ... (10, 100) up to ``n`` samples per task, each task's
    value the unbiased estimator :func:`agentgym.stats.pass_at_k` of its scored episodes (``c`` = its
    success times ``scored``). A task is in pass@k only when at least k of its episodes were scored (an
    outage does not count as a failed sample); NaN when no task is."""
    counts = [(int(t["scored"]), int(round(t["success"] * t["scored"]))) for t in tasks
              if t["scored"] and not math.isnan(t["success"])]
    out = {}
    for k in _k_values(n):
        values = [pass_at_k(m, c, k) for m, c in counts if m >= k]
        out[f"pass@{k}"] = float(np.mean(values)) if values else math.nan
    return out


def paired_difference(tasks: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    """This eval minus the baseline, task by task (matched on ``task_index``): mean difference with its
    95 % bootstrap CI over tasks (NaN bounds where there is no interval, ``ci_note`` then says why: fewer
    than 2 tasks, or every task moved alike), and how many tasks went up and down. Both must hold the same tasks."""
    mine, theirs = ({t["task_index"]: t["success"] for t in ts} for ts in (tasks, baseline))
    if None in mine or None in theirs or len(mine) != len(tasks) or len(theirs) != len(baseline):
        raise ValueError("paired_with: tasks need distinct task indices to be paired (this env's have none)")
    if set(mine) != set(theirs):
        only = sorted(set(mine) ^ set(theirs))[:5]
        raise ValueError(f"paired_with: the two evals hold different tasks ({len(mine)} here, {len(theirs)} there; "
                         f"e.g. task {only[0]} is in one only); use the same --episodes, --first-task and --seed, or tasks=[...]")
    keys = [k for k in mine if not (math.isnan(mine[k]) or math.isnan(theirs[k]))]
    after, before = [mine[k] for k in keys], [theirs[k] for k in keys]
    (diff, low, high), why = without_undefined(paired_bootstrap_ci(after, before), len(keys), "task")
    return {"tasks": float(len(keys)), "success": float(np.mean(after)) if keys else math.nan,
            "baseline_success": float(np.mean(before)) if keys else math.nan, "difference": diff,
            "ci_low": low, "ci_high": high, "ci_note": why, "tasks_up": float(sum(a > b for a, b in zip(after, before))),
            "tasks_down": float(sum(a < b for a, b in zip(after, before)))}
