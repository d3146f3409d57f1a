"""Evaluation of a policy on an env's held-out tasks: every metric as mean and std over episodes.

``agentgym eval`` is the front end (flags, or ``--config FILE`` plus ``key=value`` overrides, like
``agentgym train``). Reported per episode, then averaged and spread: success, return, each reward
term, turns, tool calls, and the env's own episode metrics (ToolCall-v0's
``tool_selection_accuracy``, ``plan_success``, ``step_efficiency``, ``end_to_end_success``, … appear as
``episode/<key>``). Held-out by default: ``split="test"`` is passed to envs whose constructor takes a
``split`` (every built-in env with a train/test split); others run as configured.

Per task as well: each task's success is the mean over its ``group_size`` episodes (:func:`per_task`),
summarized with a 95 % bootstrap CI over tasks and, with ``group_size`` = n > 1 samples per task, pass@k
for k = 1, 2, 4, ... (and 10, 100) up to n by the unbiased estimator of Chen et al. 2021
(:func:`task_summary`, :func:`pass_at_k_values`); ``paired_with`` an
earlier eval's JSON on the same tasks gives the paired difference per task with its CI
(:func:`paired_difference`): is this checkpoint better than that one on these questions?
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np

from agentgym.policy import SamplingParams
from agentgym.rollout_config import ROLLOUT_ALIASES, RolloutConfig, RolloutViews
from agentgym.rollout import RolloutProgress
from agentgym.rollout_metrics import scored_episodes, task_groups, task_success
from agentgym.trajectory import Trajectory

__all__ = ["EvalRunConfig", "EvalResult", "evaluate", "env_takes_split", "per_task", "task_summary",
           "load_eval_tasks", "paired_difference", "pass_at_k_values", "pass_at_k_text"]


@dataclass
class EvalRunConfig(RolloutViews):
    """One evaluation. ``episodes`` tasks (``first_task``, ``first_task``+1, …, or the listed ``tasks``, or
    when neither is given drawn from ``seed``), ``group_size`` samples each. Sampling and token layout are the one ``RolloutConfig``
    (``rollout``; short keys ``max_new_tokens``, ``temperature``, ``top_p``, ``greedy``, ``style``,
    ``max_obs_tokens``, ``max_context_tokens`` work too). ``agentgym eval RUN_DIR`` starts from the
    layout the run was trained with."""
    env: str | None = field(default=None, metadata={
        "help": "registered env id to evaluate on, e.g. Arithmetic-v0 (agentgym list shows them)"})
    policy: str = field(default="smollm2", metadata={
        "help": "smollm2 | MODEL_DIR | RUN_DIR (train/sft/dpo output) | FILE.gguf | HUB_ID | tiny-random | oracle "
                "| openai:MODEL@URL"})
    env_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"help": "env constructor arguments"})
    split: str | None = field(default="test", metadata={
        "help": "env split, for envs that take one (null: none)"})
    episodes: int = field(default=16, metadata={"help": "number of tasks (groups) evaluated"})
    group_size: int = field(default=1, metadata={"help": "episodes per task"})
    batch_size: int = field(default=16, metadata={"help": "episodes collected together (one generate call per turn)"})
    first_task: int | None = field(default=None, metadata={
        "help": "evaluate tasks first_task, first_task+1, ... (null: drawn from seed)"})
    tasks: list[int] | None = field(default=None, metadata={
        "help": "evaluate exactly these task indices, e.g. tasks=[3,17,42] (episodes is then their number; "
                "not with first_task)"})
    seed: int = field(default=0, metadata={"help": "seed of task choice and sampling"})
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(sampling=SamplingParams(max_new_tokens=128)),
                                   metadata={"help": "sampling and token layout of the episodes"})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1 ... (null: cuda when there is one)"})
    backend: str | None = field(default=None, metadata={
        "help": "generation engine registered in agentgym.policies.registry (null: the registry's choice here)"})
    html: str | None = field(default=None, metadata={"help": "write the HTML trajectory report to this file"})
    json: str | None = field(default=None, metadata={
        "help": "write config, metrics (mean, std), per-task successes and trajectories as JSON to this file"})
    paired_with: str | None = field(default=None, metadata={
        "help": "the --json file of an earlier eval on the same env and tasks (another checkpoint, say): report "
                "the per-task difference in success with its 95 % bootstrap CI over tasks"})

    config_aliases: ClassVar[dict[str, str]] = {
        **ROLLOUT_ALIASES, **{k: f"rollout.sampling.{k}" for k in ("max_new_tokens", "temperature", "top_p",
                                                                  "top_k", "greedy")}}

    def __post_init__(self) -> None:
        if isinstance(self.rollout, dict):
            self.rollout = RolloutConfig(**self.rollout)
        if self.episodes < 1 or self.group_size < 1 or self.batch_size < 1:
            raise ValueError("episodes, group_size and batch_size must be >= 1")
        if self.first_task is not None and self.first_task < 0:
            raise ValueError(f"first_task must be >= 0, got {self.first_task}")
        if self.tasks is not None:
            if self.first_task is not None:
                raise ValueError("give tasks or first_task, not both")
            if not self.tasks or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in self.tasks):
                raise ValueError(f"tasks must be a non-empty list of task indices >= 0, got {self.tasks}")
            if len(set(self.tasks)) != len(self.tasks):
                raise ValueError("tasks lists a task twice (use group_size for several episodes per task)")
            self.episodes = len(self.tasks)

    @property
    def max_new_tokens(self) -> int:
        return self.rollout.sampling.max_new_tokens

    @property
    def temperature(self) -> float:
        return self.rollout.sampling.temperature

    @property
    def greedy(self) -> bool:
        return self.rollout.sampling.greedy


@dataclass
class EvalResult:
    trajectories: list[Trajectory]
    metrics: dict[str, float]          # summarize() means (+ summed timings)
    std: dict[str, float]              # summarize_std(): spread over episodes, same keys
    env_kwargs: dict[str, Any]         # what the env was built with (the split included)
    sandbox: str | None = None         # the code sandbox backend the env used, if it runs code
    tasks: list[dict[str, Any]] = field(default_factory=list)  # per_task(): each task's success


def per_task(trajectories: list[Trajectory], group_size: int) -> list[dict[str, Any]]:
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
    from agentgym.stats import bootstrap_ci, without_undefined
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
    from agentgym.stats import pass_at_k
    counts = [(int(t["scored"]), int(round(t["success"] * t["scored"]))) for t in tasks
              if t["scored"] and not math.isnan(t["success"])]
    out = {}
    for k in _k_values(n):
        values = [pass_at_k(m, c, k) for m, c in counts if m >= k]
        out[f"pass@{k}"] = float(np.mean(values)) if values else math.nan
    return out


def pass_at_k_text(summary: dict[str, Any]) -> str:
    """The pass@k entries of a :func:`task_summary`, as one line: ``pass@1 0.412, pass@2 0.530, ...``."""
    keys = sorted((k for k in summary if k.startswith("pass@")), key=lambda k: int(k[5:]))
    return ", ".join(f"{k} {summary[k]:.3f}" for k in keys)


def load_eval_tasks(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An ``agentgym eval --json`` file's header (env, env_kwargs, group_size) and per-task records (from
    its ``per_task``, or rebuilt from its trajectories; a file kept with ``per_task`` alone is enough). Raises ``ValueError`` with the reason when the
    file is missing or is not such a file."""
    from pathlib import Path
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"paired_with: {path} is not a file")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"paired_with: {path} is not JSON ({e})") from None
    # a file kept without its episodes (per_task only, e.g. committed next to a study) pairs as well
    if not isinstance(data, dict) or "env" not in data or not (
            isinstance(data.get("trajectories"), list) or isinstance(data.get("per_task"), list)):
        raise ValueError(f"paired_with: {path} is not an `agentgym eval --json` file (no env, or neither "
                         "per_task nor trajectories)")
    group_size = int((data.get("config") or {}).get("group_size", 1))
    tasks = data.get("per_task")
    if not isinstance(tasks, list):
        try:
            tasks = per_task([Trajectory.from_dict(t) for t in data["trajectories"]], group_size)
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"paired_with: cannot read the episodes of {path} ({e})") from None
    head = {"env": data["env"], "env_kwargs": data.get("env_kwargs") or {}, "group_size": group_size,
            "policy": data.get("policy")}
    return head, tasks


def paired_difference(tasks: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    """This eval minus the baseline, task by task (matched on ``task_index``): mean difference with its
    95 % bootstrap CI over tasks (NaN bounds where there is no interval, ``ci_note`` then says why: fewer
    than 2 tasks, or every task moved alike), and how many tasks went up and down. Both must hold the same tasks."""
    from agentgym.stats import paired_bootstrap_ci, without_undefined
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


def env_takes_split(env_id: str) -> bool:
    """Whether the registered env's constructor accepts a ``split`` argument."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator
    spec = gym.spec(env_id)
    if "split" in (spec.kwargs or {}):
        return True
    from agentgym.registry import entry_point_parameters
    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    try:
        params = entry_point_parameters(creator)
    except (TypeError, ValueError):
        return False
    return "split" in params


def evaluate(policy: Any, cfg: EvalRunConfig, env_id: str,
             progress: Callable[[int, list[Trajectory]], None] | None = None,
             on_turn: Callable[[int, int, tuple[int, int] | None], None] | None = None) -> EvalResult:
    """Run the episodes of ``cfg`` with ``policy`` (batched: ``batch_size`` episodes per rollout call).

    ``progress(new_episodes, all_so_far)`` after each rollout call; ``on_turn(episodes_done,
    tokens_generated, generating)`` as the engine advances — every turn, and with an hf policy every decode
    step, when ``generating`` is (sequences done, sequences) of the call in flight — for a live bar."""
    from agentgym.rollout import RolloutEngine
    from agentgym.rollout_metrics import summarize, summarize_std
    env_kwargs = dict(cfg.env_kwargs)
    if cfg.split is not None and "split" not in env_kwargs and env_takes_split(env_id):
        env_kwargs["split"] = cfg.split
    rollout = cfg.rollout
    if rollout.sampling.seed is None:  # the run's seed makes sampling reproducible
        rollout = rollout.replace(sampling=rollout.sampling.replace(seed=cfg.seed))
    engine = RolloutEngine(policy, rollout)
    trajectories: list[Trajectory] = []
    timing: dict[str, float] = {}
    groups_per_call = max(1, cfg.batch_size // cfg.group_size)
    tokens_before = [0]
    try:
        for start in range(0, cfg.episodes, groups_per_call):
            k = min(groups_per_call, cfg.episodes - start)
            if cfg.tasks is not None:
                indices = list(cfg.tasks[start:start + k])
            else:
                indices = [cfg.first_task + start + i for i in range(k)] if cfg.first_task is not None else None
            done_before = len(trajectories)

            def turn(p: RolloutProgress) -> None:
                if on_turn is not None:
                    on_turn(done_before + p.finished, tokens_before[0] + p.tokens, p.generating)
            batch = engine.collect(env_id, num_groups=k, group_size=cfg.group_size, task_indices=indices,
                                   seed=cfg.seed + start, env_kwargs=env_kwargs, progress=turn)
            tokens_before[0] += int(batch.metrics.get("generated_tokens", 0))
            trajectories.extend(batch.trajectories)
            for key, v in batch.metrics.items():
                if key.startswith("time/") and key.endswith("_s"):
                    timing[key] = timing.get(key, 0.0) + v
            if progress is not None:
                progress(len(batch.trajectories), trajectories)
        sandbox = _sandbox_backend(engine)
    finally:
        engine.close()
    return EvalResult(trajectories, {**summarize(trajectories), **timing}, summarize_std(trajectories), env_kwargs,
                      sandbox, per_task(trajectories, cfg.group_size))


def _sandbox_backend(engine: Any) -> str | None:
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
