"""``agentgym eval``: its config (:class:`EvalRunConfig`: flags, or ``--config FILE`` plus ``key=value``
overrides, like ``agentgym train``) and how it calls the one evaluation path, :func:`agentgym.evaluation.run_eval`,
which the trainer's held-out evals run too; the printing and files are :func:`agentgym.app.commands.cmd_eval`'s.

Held-out by default: ``split="test"`` is passed to envs whose constructor takes a ``split`` (every built-in
env with a train/test split); others run as configured. Reported per episode (mean and std: success,
return, each reward term, turns, tool calls, the env's own ``episode/<key>`` metrics) and per task (a 95 %
bootstrap CI over tasks, pass@k with several samples per task); ``paired_with`` an earlier eval's JSON on
the same tasks (:func:`load_eval_tasks`) gives the paired difference per task with its CI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from agentgym.evaluation import EvalResult, per_task, run_eval
from agentgym.policy import SamplingParams
from agentgym.rollout import RolloutEngine
from agentgym.rollout_config import ROLLOUT_ALIASES, RolloutConfig, RolloutViews
from agentgym.trajectory import Trajectory

__all__ = ["EvalRunConfig", "evaluate", "env_takes_split", "eval_env_kwargs", "check_eval_env", "load_eval_tasks",
           "pass_at_k_text"]


@dataclass
class EvalRunConfig(RolloutViews):
    """One evaluation. ``episodes`` tasks (``first_task``, ``first_task``+1, …, or the listed ``tasks``, or
    when neither is given drawn from ``seed``), ``group_size`` samples each. Sampling and token layout are the one ``RolloutConfig``
    (``rollout``; short keys ``max_new_tokens``, ``temperature``, ``top_p``, ``greedy``, ``style``,
    ``max_obs_tokens``, ``max_context_tokens`` work too). ``agentgym eval RUN_DIR`` starts from the
    layout the run was trained with."""
    env: str | None = field(default=None, metadata={
        "help": "registered env id to evaluate on, e.g. Arithmetic-v0 (agentgym list shows them)"})
    config_renamed: ClassVar[dict[str, str]] = {"policy": "model"}   # one key for the model in every command
    model: str = field(default="smollm2", metadata={
        "help": "the model to evaluate (flag --policy or --model): smollm2 | MODEL_DIR | RUN_DIR (train/sft/dpo output) | FILE.gguf | HUB_ID | tiny-random | oracle "
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
        "help": "generation engine registered in agentgym.policies.backends (null: the registry's choice here)"})
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
        if self.seed < 0:  # numpy's generators, which draw the tasks, take no negative seed
            raise ValueError(f"seed must be >= 0, got {self.seed}")
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


def pass_at_k_text(summary: dict[str, Any]) -> str:
    """The pass@k entries of a :func:`~agentgym.evaluation.task_summary`, as one line: ``pass@1 0.412, pass@2 0.530, ...``."""
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


def eval_env_kwargs(cfg: EvalRunConfig, env_id: str) -> dict[str, Any]:
    """The arguments the eval builds the env with: ``cfg.env_kwargs``, and ``cfg.split`` where the env takes one."""
    env_kwargs = dict(cfg.env_kwargs)
    if cfg.split is not None and "split" not in env_kwargs and env_takes_split(env_id):
        env_kwargs["split"] = cfg.split
    return env_kwargs


def check_eval_env(cfg: EvalRunConfig, env_id: str) -> None:
    """What the eval would find only once it ran, checked before a model loads (``ConfigError``, one line): the
    split the eval passes is one the env has, and the tasks named by ``first_task`` / ``tasks`` exist (the env
    is built once for its ``num_tasks``; only when they are given)."""
    import agentgym
    from agentgym.config import ConfigError
    from agentgym.registry import check_env_kwargs
    env_kwargs = eval_env_kwargs(cfg, env_id)
    if "split" in env_kwargs and "split" not in cfg.env_kwargs:
        try:
            check_env_kwargs(env_id, env_kwargs)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"split: {e}") from None
    if cfg.first_task is None and cfg.tasks is None:
        return
    env = agentgym.make(env_id, **env_kwargs)
    try:
        n = env.unwrapped.num_tasks
    finally:
        env.close()
    if n is None:
        return
    name = env_id.split("/", 1)[-1]
    if cfg.tasks is not None:
        beyond = [i for i in cfg.tasks if i >= n]
        if beyond:
            raise ConfigError(f"tasks: {name} has {n} tasks (indices 0..{n - 1}); no task {beyond[0]}")
    elif cfg.first_task + cfg.episodes > n:
        room = n - cfg.first_task
        fix = f"at most {room} episodes from there" if room > 0 else f"first_task at most {n - 1}"
        raise ConfigError(f"first_task {cfg.first_task} with episodes {cfg.episodes} goes past the last task of {name} "
                          f"({n} tasks, indices 0..{n - 1}): give {fix}")


def evaluate(policy: Any, cfg: EvalRunConfig, env_id: str,
             progress: Callable[[int, list[Trajectory]], None] | None = None,
             on_turn: Callable[[int, int, tuple[int, int] | None], None] | None = None) -> EvalResult:
    """Run the episodes of ``cfg`` with ``policy`` (batched: ``batch_size`` episodes per rollout call)
    through :func:`~agentgym.evaluation.run_eval`: the env built with ``cfg.split`` where it takes one,
    sampling seeded with ``cfg.seed`` unless ``sampling.seed`` is set.

    ``progress(new_episodes, all_so_far)`` after each rollout call; ``on_turn(episodes_done,
    tokens_generated, generating)`` as the engine advances — every turn, and with an hf policy every decode
    step, when ``generating`` is (sequences done, sequences) of the call in flight — for a live bar."""
    env_kwargs = eval_env_kwargs(cfg, env_id)
    rollout = cfg.rollout
    if rollout.sampling.seed is None:  # the run's seed makes sampling reproducible
        rollout = rollout.replace(sampling=rollout.sampling.replace(seed=cfg.seed))
    if cfg.tasks is not None:
        indices: list[int] | None = list(cfg.tasks)
    else:
        indices = list(range(cfg.first_task, cfg.first_task + cfg.episodes)) if cfg.first_task is not None else None
    engine = RolloutEngine(policy, rollout)
    try:
        return run_eval(engine, env_id, episodes=cfg.episodes, group_size=cfg.group_size, seed=cfg.seed,
                        env_kwargs=env_kwargs, task_indices=indices,
                        groups_per_call=max(1, cfg.batch_size // cfg.group_size), call_done=progress,
                        progress=None if on_turn is None else lambda p: on_turn(p.finished, p.tokens, p.generating))
    finally:
        engine.close()
