"""The arms of a comparison: which variants run (``--algos``), each run's resolved config, and the policy
each run starts from. See :mod:`agentgym.algorithms.compare` for the harness and its guarantees."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from agentgym.config import load_config

from agentgym.algorithms.catalog import LEARNERS
from agentgym.algorithms.config import LearnerConfig
from agentgym.algorithms.trainer import TrainConfig

__all__ = ["CompareError", "EXTERNAL_ALGOS", "EXTERNAL_SETTINGS", "HARNESS_KEYS", "SHARED_KEYS", "RunRecord",
           "Variant", "parse_variants"]

#: Learners trained outside :class:`Trainer`: name -> ``module:function`` imported on first use. The
#: function is ``train_with_trl(env, policy, *, steps, num_generations, prompts_per_step, …) -> dict``
#: whose ``history`` has the trainer's row format (``step``, ``rollout/reward_mean``, …).
EXTERNAL_ALGOS = {"trl-grpo": "agentgym.algorithms.offline.trl_adapter:train_with_trl"}
#: The learner settings an external learner takes (see the module docstring).
EXTERNAL_SETTINGS = frozenset({"learner.lr", "learner.kl_coef", "learner.micro_batch_size"})

#: Settings every variant shares: they define the tasks and the rollout budget.
SHARED_KEYS = frozenset({"env", "env_kwargs", "steps", "seed", "algo", "output_dir", "groups_per_step",
                         "group_size", "model", "rollout", "sampling", "eval", "style", "max_obs_tokens",
                         "max_context_tokens"})
#: Keys the harness itself sets (from --env/--algos/--seeds/--steps/--out).
HARNESS_KEYS = {"algo": "--algos", "seed": "--seeds", "steps": "--steps", "output_dir": "--out", "env": "--env"}


class CompareError(ValueError):
    """A bad harness argument (reported in one line by the CLI)."""


@dataclass(frozen=True)
class Variant:
    """One compared configuration: a learner plus its own overrides (``grpo:mask_env_tokens=false``)."""
    label: str
    algo: str
    overrides: tuple[str, ...] = ()

    @property
    def dirname(self) -> str:
        """A filesystem-safe name for the run directory."""
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in self.label.replace("=", "-"))


@dataclass
class RunRecord:
    """What one (variant, seed) run produced; ``tasks[i]`` is step i+1's prompt digest."""
    label: str
    algo: str
    seed: int
    output_dir: str
    config: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    tasks: list[str] = field(default_factory=list)
    task_indices: list[list[int | None]] = field(default_factory=list)
    wall_s: float = 0.0


def _variant_key(key: str, algo: str | None = None) -> str:
    """``lr`` → ``learner.lr``; a setting only ``algo``'s own typed config has (a part registered by a
    user module) → ``learner.extra.<key>``; TrainConfig fields and dotted keys stay as they are."""
    top = {f.name for f in dataclasses.fields(TrainConfig)}
    if "." in key or key in top:
        return key
    if key in {f.name for f in dataclasses.fields(LearnerConfig)}:
        return f"learner.{key}"
    learner = LEARNERS.get((algo or "").lower())
    if learner is not None and key in {f.name for f in dataclasses.fields(learner.config_class)}:
        return f"learner.extra.{key}"
    raise CompareError(f"variant setting {key!r} is neither a TrainConfig nor a LearnerConfig field"
                       + (f" nor a setting of {algo}" if learner is not None else ""))


def parse_variants(text: str | Sequence[str]) -> list[Variant]:
    """``"reinforce,ppo,grpo:mask_env_tokens=false"`` → variants (labels must be unique). Any registered
    learner (:data:`~agentgym.algorithms.catalog.LEARNERS`, including ones a ``--import`` module added)
    or external one is accepted."""
    items = text.split(",") if isinstance(text, str) else list(text)
    known = sorted(LEARNERS) + sorted(EXTERNAL_ALGOS)
    out: list[Variant] = []
    for item in (s.strip() for s in items):
        if not item:
            continue
        algo, *settings = item.split(":")
        algo = algo.strip()
        if algo.lower() in LEARNERS:
            algo = algo.lower()
        if algo not in known:
            raise CompareError(f"unknown algo {algo!r} in --algos; choose from {', '.join(known)}")
        overrides = []
        for s in settings:
            if "=" not in s:
                raise CompareError(f"variant {item!r}: {s!r} is not key=value")
            key, value = s.split("=", 1)
            key = _variant_key(key.strip(), algo)
            if key.split(".")[0] in SHARED_KEYS:
                raise CompareError(f"variant {item!r}: {key} must be the same for every algo "
                                   "(set it for all runs as a key=value override)")
            if algo in EXTERNAL_ALGOS and key not in EXTERNAL_SETTINGS:
                raise CompareError(f"variant {item!r}: {algo} takes only {', '.join(sorted(EXTERNAL_SETTINGS))}")
            overrides.append(f"{key}={value}")
        out.append(Variant(item, algo, tuple(overrides)))
    if not out:
        raise CompareError("--algos is empty")
    labels = [v.label for v in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise CompareError(f"--algos lists {', '.join(dup)} twice")
    dirs = [v.dirname for v in out]
    if len(set(dirs)) != len(dirs):
        raise CompareError("two variants map to the same run directory; make their labels differ")
    return out


def _resolve(env: str | None, variant: Variant, seed: int, steps: int, config: str | Path | None,
             overrides: Sequence[str], out_dir: Path) -> TrainConfig:
    """The run's TrainConfig: defaults < config file < harness defaults < user overrides < run identity."""
    harness_defaults = ["checkpoint_every=0"]  # curves are the product; the final checkpoint is removed
    identity = [f"algo={variant.algo}", f"seed={seed}", f"steps={steps}",
                f"output_dir={out_dir / variant.dirname / f'seed{seed}'}"]
    if env is not None:
        identity.append(f"env={env}")
    cfg = load_config(TrainConfig, config, [*harness_defaults, *overrides, *variant.overrides, *identity])
    return cfg


def _check_env(env_id: str, env_kwargs: Any = None, eval_env_kwargs: Any = None) -> None:
    """The env is registered and takes these constructor arguments (said before any model loads)."""
    import gymnasium as gym

    import agentgym  # noqa: F401  (registers the built-in envs)
    from agentgym.config import ConfigError
    from agentgym.registry import check_run_env_kwargs, full_id
    if full_id(env_id) not in gym.registry:
        raise CompareError(f"no env {env_id!r}; registered: {', '.join(agentgym.list_envs())}")
    try:
        check_run_env_kwargs(full_id(env_id), env_kwargs, eval_env_kwargs)
    except ConfigError as e:
        raise CompareError(str(e)) from None


class _PolicySource:
    """Loads a pretrained model once, through the one loader (:func:`~agentgym.policies.loading.load_policy`,
    with the backend learners train), and hands every run a fresh deep copy (a load costs ~15 s on CPU;
    every run must start from the same weights anyway). ``tiny-random`` is left to the trainer, which
    initialises it from the run's seed."""

    def __init__(self) -> None:
        self._base: dict[tuple[str, str | None, str | None], Any] = {}

    def fresh(self, cfg: TrainConfig) -> Any | None:
        if cfg.model == "tiny-random":
            return None
        from agentgym.policies.loading import load_policy
        from agentgym.policies.registry import trainable_backend
        dtype = getattr(cfg, "dtype", None)
        key = (cfg.model, cfg.device, dtype)
        if key not in self._base:
            self._base[key] = load_policy(cfg.model, trainable_backend(), device=cfg.device, dtype=dtype)
        base = self._base[key]
        return type(base)(copy.deepcopy(base.model), base.tokenizer, max_batch_size=base.max_batch_size,
                          name=base.name)
