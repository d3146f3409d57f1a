"""A run's held-out eval, in one place for :class:`~agentgym.algorithms.loop.trainer.Trainer`, the comparison
harness and runs trained elsewhere (``trl-grpo``): the same tasks (``eval.first_task`` on, the eval
split), scored greedily or by the mean of ``eval.samples`` sampled episodes per task. The episodes run
and are scored by the one evaluation path, :func:`agentgym.evaluation.run_eval`, as in ``agentgym eval``;
this module says only which tasks and settings a run's config asks for."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from agentgym.evaluation import per_task, run_eval
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine, RolloutProgress

from agentgym.algorithms.loop.train_config import TrainConfig

__all__ = ["rollout_config", "eval_rollout_config", "scored_eval", "task_successes", "eval_line"]


def rollout_config(cfg: TrainConfig, greedy: bool = False) -> RolloutConfig:
    """The rollout settings of a run (``greedy`` for its evals): ``cfg.rollout``, nothing else."""
    return cfg.rollout.greedy() if greedy else cfg.rollout


def eval_rollout_config(cfg: TrainConfig) -> RolloutConfig:
    """The rollout settings of a run's held-out evals: greedy, or when ``eval.samples`` >= 1 the
    training sampling with a fixed seed (``sampling.seed``, else the run's ``seed``), so every eval of
    one seed, in every arm of a comparison, draws the same random numbers."""
    if cfg.eval.samples == 0:
        return rollout_config(cfg, greedy=True)
    sampling = cfg.rollout.sampling
    return cfg.rollout.replace(sampling=sampling.replace(seed=cfg.seed if sampling.seed is None else sampling.seed))


def task_successes(cfg: TrainConfig, trajectories: Sequence[Any]) -> list[float]:
    """Each held-out task's success, in task order, from :func:`scored_eval`'s trajectories: 0 or 1
    when greedy, the mean of its ``eval.samples`` episodes otherwise (for the paired CIs over tasks).
    As in ``eval/success_rate`` and ``agentgym eval``, an episode a service failure ended (``infra_error``)
    is neither a success nor a failure (:func:`~agentgym.rollout_metrics.task_success`): a task's mean
    is over its other episodes, NaN when failures ended them all (the paired CIs leave such tasks out)."""
    k = max(1, cfg.eval.samples)
    if len(trajectories) != k * cfg.eval.episodes:
        raise ValueError(f"{len(trajectories)} eval trajectories, expected eval.episodes x max(1, eval.samples) = "
                         f"{cfg.eval.episodes} x {k}")
    return [t["success"] for t in per_task(trajectories, k)]


def scored_eval(engine: RolloutEngine, cfg: TrainConfig,
                progress: Callable[[RolloutProgress], None] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """The eval of every run: the same held-out tasks (``eval.first_task`` on, the eval split), so runs and
    algorithms (including ones trained outside :class:`Trainer`) are compared on equal terms. ``engine`` runs
    :func:`eval_rollout_config`; with ``eval.samples`` = k >= 1 every task gets k sampled episodes, all in one
    ``collect`` call seeded with the run's ``seed``.

    Returns ``eval/``-prefixed metrics (``eval/success_rate``: over all episodes) plus ``successes``, each
    task's success in task order (see :func:`task_successes`), which the paired CIs over tasks read: the
    record every run keeps of an eval; and the trajectories, task by task."""
    e = cfg.eval
    result = run_eval(engine, cfg.env, episodes=e.episodes, group_size=max(1, e.samples), seed=cfg.seed,
                      env_kwargs={**cfg.env_kwargs, **e.env_kwargs},
                      task_indices=range(e.first_task, e.first_task + e.episodes), progress=progress)
    scores = {f"eval/{k}": v for k, v in result.metrics.items() if not k.startswith("time/")}   # not the timings
    return {**scores, "successes": [t["success"] for t in result.tasks]}, result.trajectories


def eval_line(tag: str, step: int, m: dict[str, Any], cfg: TrainConfig, source: str | None = None) -> str:
    """The log line of an eval (``source``: the run whose eval this run took instead of evaluating)."""
    line = (f"[eval {tag} @ step {step}] success {m['eval/success_rate']:.3f}  reward {m['eval/reward_mean']:+.3f}  "
            f"({cfg.eval.describe()})")
    return line + (f" (the same initial weights, tasks and draws as {source}: its eval, not run again)" if source else "")
