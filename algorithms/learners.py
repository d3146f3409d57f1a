"""Learners composed from parts: an advantage estimator, a policy objective and an optional critic.

Usage (the trainer loop's whole contact with this module)::

    learner = make_learner("grpo", policy, LearnerConfig(lr=1e-6, kl_coef=0.04))
    batch = engine.collect("agentgym/SearchQA-v0", num_groups=8, group_size=5, seed=step)
    metrics = learner.update(batch.trajectories)      # the policy's own module is trained in place

**Parts.** A learner is a name bound to a registered *advantage estimator* (per-token rewards →
per-token advantages and returns; it decides whether a critic is needed) and a registered *policy
objective* (the per-token policy-gradient term), on one shared optimisation loop (:class:`Learner`).

=================  ===================  ==============  ====================================================
learner            advantage            objective       what it is
=================  ===================  ==============  ====================================================
``reinforce``      ``returns``          ``reinforce``   per-turn returns-to-go, batch baseline / ReBN (GEM)
``grpo``           ``group``            ``clip``        group-normalised returns (Shao et al., 2024)
``rloo``           ``rloo``             ``clip``        leave-one-out group baseline (Ahmadian et al., 2024)
``gspo``           ``group``            ``gspo``        sequence-level ratio (Zheng et al., 2025)
``cispo``          ``group``            ``cispo``       clipped detached IS weight × REINFORCE (MiniMax, 2025)
``ppo``            ``gae``              ``clip``        critic + GAE (Schulman et al., 2017)
``dual-clip-ppo``  ``gae``              ``dual-clip``   PPO, loss bounded by ``-c·A`` for ``A < 0`` (Ye et al., 2020)
=================  ===================  ==============  ====================================================

A user module adds parts and learners with :func:`register_advantage`, :func:`register_objective`
and :func:`register_learner`; ``agentgym --import mymod train algo=myalgo`` and ``agentgym compare
--algos myalgo`` then accept them (README: "Add an algorithm").

**Configs.** :class:`OptimConfig` holds what every learner shares (optimiser, schedule, batching,
loss aggregation, KL, entropy, masking, off-policy safety, system). Each part declares the settings
it reads as small dataclasses (:class:`ReturnSettings`, :class:`ClipSettings`, …) with its own
defaults; a learner's typed config (:class:`GRPOConfig`, :class:`GSPOConfig`, …) is
``OptimConfig`` + its parts' settings (:func:`compose_config`). Users keep writing one flat
``learner:`` section: :class:`LearnerConfig` has every built-in key, and :func:`resolve_config` turns
it into the algorithm's typed config — a key left at ``None`` where documented as "the algorithm's
default" takes the typed config's default (GSPO's clip range is 3e-4 / 4e-4, PPO's 0.2); settings of
parts registered by user modules go under ``learner.extra``.

**One update.** Collate the trajectories (:mod:`.batch`); with no gradient, compute what the
advantages need (reference log-probs when ``kl_coef > 0``, value estimates with a critic, old
log-probs recomputed when a separate engine sampled); turn the token rewards (minus ``kl_coef · KL``
when ``kl_in="reward"``) into per-token advantages with the estimator; then ``epochs`` passes over
minibatches, each one optimizer step accumulated over micro-batches, with the shared loss
(:func:`~agentgym.algorithms.losses.ppo_objective`) around the objective's term.

Shared machinery: AdamW (no weight decay on biases and norms), warmup + constant/linear/cosine
schedule stepped once per ``update`` (so ``total_steps`` counts updates, as verl does), gradient
clipping, gradient accumulation, LoRA through ``peft`` (the reference model is then the same
network with the adapter disabled), gradient checkpointing, the run's precision (:mod:`agentgym.precision`: bf16 autocast over fp32
master weights where it is faster),
data parallelism under ``torchrun`` (:mod:`.distributed`). A minibatch whose loss or gradient norm
is not finite is skipped: no optimizer step, weights and optimizer state untouched, counted in
``metrics["skipped"]``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch
from torch import nn

from agentgym.policy import weight_name_mismatch
from agentgym.trajectory import Trajectory

from agentgym.algorithms.advantages import (CREDITS, broadcast_to_tokens, discounted_returns, episode_returns, gae,
                                            group_normalize, leave_one_out, make_baseline, observation_history_keys,
                                            rebn, turn_gae, turn_group_normalize, turn_rewards)
from agentgym.algorithms.batch import Batch, collate, pad_token_lists
from agentgym.algorithms.losses import (KL_ESTIMATORS, LOSS_AGG_MODES, LossSettings, cispo_surrogate,
                                        clipped_surrogate, dual_clip_surrogate, gspo_surrogate, kl_penalty,
                                        masked_mean, masked_whiten, ppo_objective, reinforce_surrogate,
                                        token_logprobs)

__all__ = [
    "LoraSettings", "OptimConfig", "ReturnSettings", "BaselineSettings", "GroupSettings", "GAESettings",
    "CriticSettings", "ClipSettings", "LearnerConfig", "ReinforceConfig", "GRPOConfig", "RLOOConfig", "GSPOConfig",
    "CISPOConfig", "PPOConfig", "DualClipPPOConfig", "compose_config", "resolve_config", "lr_factor",
    "AdvantageInputs", "AdvantageEstimator", "ReturnsAdvantage", "GroupAdvantage", "LeaveOneOutAdvantage",
    "GAEAdvantage", "PolicyObjective", "ClipObjective", "DualClipObjective", "ReinforceObjective", "GSPOObjective",
    "CISPOObjective", "Critic", "ValueModel", "Learner", "ReinforceLearner", "PPOLearner", "GRPOLearner",
    "ADVANTAGES", "OBJECTIVES", "LEARNERS", "register_advantage", "register_objective", "register_learner",
    "make_learner", "learner_needs_groups",
]

SCHEDULES = ("constant", "linear", "cosine")
BASELINES = ("none", "mean", "ema", "rebn")


# --------------------------------------------------------------------------- configuration

@dataclass
class LoraSettings:
    """LoRA adapter (``peft``). ``target_modules="all-linear"`` = every linear layer but the output head."""
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"


#: Settings whose ``None`` in :class:`LearnerConfig` means "the algorithm's default" (the typed
#: config's), because built-in algorithms default them differently.
ALGORITHM_DEFAULTS = frozenset({"clip_eps", "clip_eps_high", "dual_clip_c", "loss_agg", "credit"})


@dataclass
class OptimConfig:
    """What every learner shares; a learner's typed config adds its parts' settings to these.

    Optimisation: ``lr``, ``betas``, ``weight_decay`` (AdamW); ``warmup_steps`` or
    ``warmup_ratio`` × ``total_steps`` (Search-R1: 0.285), then ``schedule``; ``total_steps`` counts
    ``update`` calls. ``max_grad_norm`` (None = no clipping). ``micro_batch_size``: rows per
    forward/backward (gradient accumulation); ``micro_batch_tokens`` (None = off): also a budget of padded
    positions (rows × longest) per micro-batch, rows grouped by length so the passes compute little
    padding (veRL's dynamic batch size; ``pad_frac`` in the metrics is the share of padding computed); ``minibatch_size``: trajectories per optimizer step
    (None = the whole batch); ``epochs``: passes over the batch (PPO epochs, GRPO iterations; an
    on-policy objective such as REINFORCE's always makes one step).

    Loss: ``loss_agg`` (see :func:`~agentgym.algorithms.losses.aggregate`); ``max_response_tokens``:
    the constant of ``seq-mean-token-sum`` (None: the longest response of the update's batch);
    ``kl_coef`` with ``kl_estimator`` (k1, k2, k3, low_var_kl) either in the loss or subtracted from
    the rewards (``kl_in``); ``entropy_coef``; ``temperature``: None (default) = the temperature the
    trajectories were sampled at (``Trajectory.temperature``, set by the rollout engine from its one
    ``RolloutConfig``); a number is only a check — an update on trajectories sampled at another
    temperature is refused, since ratios against their log-probs would be biased.

    Masking: ``mask_env_tokens`` (False: the ablation where environment tokens carry loss too);
    ``loss_token_kinds`` (None = by ``mask_env_tokens``): train only on tokens of these provenance
    kinds (``Batch.train_mask(..., kinds=...)``, typed token provenance).

    Off-policy safety: ``old_logprobs`` — ``sampler`` (the ratio's old log-probs are the sampling-time
    ones: exact when the policy samples with the module being trained), ``recompute`` (a no-grad pass
    of the training model before the update, as verl does), or ``auto`` (recompute exactly when the
    sampler is a separate engine such as vLLM, whose kernels and dtypes differ). When recomputing,
    ``tis_cap`` (None = off) multiplies each token's policy-gradient term by
    ``min(exp(logp_learner − logp_sampler), tis_cap)`` (truncated importance sampling), and every update
    logs the sampler-vs-learner divergence: ``sampler_logp_diff_mean`` / ``_max`` (|Δlogp|) and
    ``sampler_logp_diff_frac`` (share of tokens over ``divergence_threshold``).

    System: ``lora`` (None = full fine-tuning), ``gradient_checkpointing``, ``seed`` (minibatch
    shuffling). Precision is not a learner setting but the run's (``TrainConfig.precision``), handed to
    :func:`make_learner` as ``precision=``.
    """
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    warmup_steps: int | None = None
    total_steps: int | None = None
    schedule: str = "constant"
    max_grad_norm: float | None = 1.0
    micro_batch_size: int = 8
    micro_batch_tokens: int | None = None
    epochs: int = 1
    minibatch_size: int | None = None
    loss_agg: str = "token-mean"
    max_response_tokens: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in: str = "loss"
    entropy_coef: float = 0.0
    temperature: float | None = None
    mask_env_tokens: bool = True
    loss_token_kinds: tuple[str, ...] | None = None
    old_logprobs: str = "auto"
    tis_cap: float | None = None
    divergence_threshold: float = 0.1
    lora: LoraSettings | None = None
    gradient_checkpointing: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        _validate(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OptimConfig":
        """From a plain mapping (a YAML section); unknown keys are an error that lists the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown learner settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Part settings: small dataclasses mixed into a learner's typed config (all fields have defaults).

@dataclass
class ReturnSettings:
    """Every advantage estimator: ``credit`` — how step rewards reach each turn's tokens (``episode``,
    ``turn``, ``gigpo`` or ``token``; see :mod:`.advantages`), ``gamma`` (the per-turn discount; GAE's
    per-token one for ``token``), ``adv_eps`` (added to a std before dividing)."""
    credit: str = "episode"
    gamma: float = 1.0
    adv_eps: float = 1e-6


@dataclass
class BaselineSettings:
    """REINFORCE's batch baseline: ``none``, ``mean``, ``ema`` (``baseline_momentum``) or ``rebn``."""
    baseline: str = "rebn"
    baseline_momentum: float = 0.9


@dataclass
class GroupSettings:
    """Group estimators: ``group_scale`` (False = Dr.GRPO, no std division); ``turn_adv_weight``: GiGPO's
    ω, the weight of the turn-level term under ``credit="gigpo"``."""
    group_scale: bool = True
    turn_adv_weight: float = 1.0


@dataclass
class GAESettings:
    """GAE: ``lam``; ``whiten_advantages`` over the batch (PPO)."""
    lam: float = 1.0
    whiten_advantages: bool = True


@dataclass
class CriticSettings:
    """The critic: ``critic="head"`` (a linear head on the policy's last hidden state, owned by the
    learner) or ``"model"`` (a separate copy of the network with its own head); ``critic_lr`` (None =
    ``lr``), ``critic_warmup_ratio`` (its own warmup share of ``total_steps``; None = the actor's;
    Search-R1: 0.015 against the actor's 0.285), ``value_coef``, ``value_clip_eps`` (None = no clipping)."""
    critic: str = "head"
    critic_lr: float | None = None
    critic_warmup_ratio: float | None = None
    value_coef: float = 0.5
    value_clip_eps: float | None = 0.2


@dataclass
class ClipSettings:
    """Ratio objectives: ``clip_eps`` / ``clip_eps_high`` (clip-higher; None = symmetric);
    ``dual_clip_c`` (None = off): dual-clip's lower bound ``c·A`` for negative advantages."""
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip_c: float | None = None


@dataclass
class LearnerConfig(ReturnSettings, BaselineSettings, GroupSettings, GAESettings, CriticSettings, ClipSettings,
                    OptimConfig):
    """Every learner setting in one flat dataclass — the ``learner:`` section of a YAML config.

    :class:`OptimConfig`'s fields, plus those of every built-in part: :class:`ClipSettings`
    (``clip_eps``, ``clip_eps_high``, ``dual_clip_c``), :class:`ReturnSettings` (``credit``, ``gamma``,
    ``adv_eps``), :class:`BaselineSettings` (``baseline``, ``baseline_momentum``),
    :class:`GroupSettings` (``group_scale``, ``turn_adv_weight``), :class:`GAESettings` (``lam``,
    ``whiten_advantages``), :class:`CriticSettings` (``critic``, ``critic_lr``,
    ``critic_warmup_ratio``, ``value_coef``, ``value_clip_eps``). A learner reads the keys of its
    parts (:func:`resolve_config`) and ignores the rest.

    ``None`` = the algorithm's default for ``clip_eps`` (0.2; GSPO 3e-4; CISPO 1.0, i.e. no lower
    bound), ``clip_eps_high`` (symmetric; GSPO 4e-4; CISPO 0.28), ``dual_clip_c`` (off; dual-clip-ppo
    3.0), ``loss_agg`` (token-mean; GSPO seq-mean-token-mean) and ``credit`` (reinforce: turn;
    grpo / rloo / gspo / cispo: episode; ppo: token).

    ``extra``: settings of parts registered by user modules (``learner.extra.my_coef=0.5``), checked
    against the algorithm's typed config.
    """
    credit: str | None = None
    clip_eps: float | None = None
    loss_agg: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_CHOICES: dict[str, tuple[str, ...]] = {
    "schedule": SCHEDULES, "loss_agg": LOSS_AGG_MODES, "kl_estimator": KL_ESTIMATORS, "kl_in": ("loss", "reward"),
    "baseline": BASELINES, "critic": ("head", "model"), "old_logprobs": ("auto", "sampler", "recompute"),
    "credit": CREDITS,
}


def _validate(cfg: Any) -> None:
    """Check (and normalise, for YAML's lists) whichever settings ``cfg`` has."""
    has = {f.name for f in dataclasses.fields(cfg)}
    flat = isinstance(cfg, LearnerConfig)

    def value(name: str) -> Any:
        return getattr(cfg, name) if name in has else None

    for name, allowed in _CHOICES.items():
        if name in has and not (value(name) is None and flat and name in ALGORITHM_DEFAULTS):
            if value(name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value(name)!r}")
    for name in ("micro_batch_size", "epochs"):
        if value(name) is not None and value(name) < 1:
            raise ValueError(f"{name} must be >= 1, got {value(name)}")
    if value("micro_batch_tokens") is not None and value("micro_batch_tokens") < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1 or None, got {value('micro_batch_tokens')}")
    if value("minibatch_size") is not None and value("minibatch_size") < 1:
        raise ValueError(f"minibatch_size must be >= 1 or None, got {value('minibatch_size')}")
    if "lr" in has and (not math.isfinite(cfg.lr) or cfg.lr < 0):
        raise ValueError(f"lr must be a finite number >= 0, got {cfg.lr}")
    t = value("temperature")
    if t is not None and not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be > 0 or None (the rollouts'), got {t}")
    if value("warmup_ratio") is not None and not 0 <= cfg.warmup_ratio <= 1:
        raise ValueError(f"warmup_ratio must be in [0, 1], got {cfg.warmup_ratio}")
    if value("warmup_steps") is not None and cfg.warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0 or None, got {cfg.warmup_steps}")
    if "clip_eps" in has and value("clip_eps") is None and not flat:
        raise ValueError("clip_eps must be a number")
    if (value("clip_eps") is not None and value("clip_eps") <= 0) or \
            (value("clip_eps_high") is not None and value("clip_eps_high") <= 0):
        raise ValueError("clip_eps and clip_eps_high must be > 0")
    if value("dual_clip_c") is not None and not value("dual_clip_c") > 1:
        raise ValueError(f"dual_clip_c must be > 1 or None (off), got {value('dual_clip_c')}")
    for name in ("gamma", "lam"):
        if value(name) is not None and not 0 <= value(name) <= 1:
            raise ValueError(f"gamma and lam must be in [0, 1], got {name}={value(name)}")
    if value("kl_coef") is not None and cfg.kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {cfg.kl_coef}")
    if value("tis_cap") is not None and not cfg.tis_cap >= 1:
        raise ValueError(f"tis_cap must be >= 1 or None (off), got {cfg.tis_cap}")
    if value("max_grad_norm") is not None and cfg.max_grad_norm <= 0:
        raise ValueError(f"max_grad_norm must be > 0 or None, got {cfg.max_grad_norm}")
    if value("baseline_momentum") is not None and not 0 <= cfg.baseline_momentum < 1:
        raise ValueError(f"baseline_momentum must be in [0, 1), got {cfg.baseline_momentum}")
    if value("critic_warmup_ratio") is not None and not 0 <= cfg.critic_warmup_ratio <= 1:
        raise ValueError(f"critic_warmup_ratio must be in [0, 1] or None, got {cfg.critic_warmup_ratio}")
    if value("turn_adv_weight") is not None and not (math.isfinite(cfg.turn_adv_weight) and cfg.turn_adv_weight >= 0):
        raise ValueError(f"turn_adv_weight must be a finite number >= 0, got {cfg.turn_adv_weight}")
    if "betas" in has:
        cfg.betas = tuple(float(b) for b in cfg.betas)  # YAML gives a list
    if isinstance(value("lora"), Mapping):
        cfg.lora = LoraSettings(**cfg.lora)
    if value("lora") is not None and isinstance(cfg.lora.target_modules, list):
        cfg.lora.target_modules = tuple(cfg.lora.target_modules)
    kinds = value("loss_token_kinds")
    if kinds is not None:
        kinds = (kinds,) if isinstance(kinds, str) else tuple(str(k) for k in kinds)
        if not kinds:
            raise ValueError("loss_token_kinds must name at least one token kind, or be None")
        cfg.loss_token_kinds = kinds
    if flat and cfg.extra is None:
        cfg.extra = {}


def compose_config(name: str, *parts: type, doc: str | None = None) -> type[OptimConfig]:
    """A typed config class: :class:`OptimConfig` plus the settings the ``parts`` declare
    (``part.settings``), with the parts' defaults (``part.defaults``; later parts win)."""
    bases: list[type] = []
    defaults: dict[str, Any] = {}
    for part in parts:
        for s in getattr(part, "settings", ()):
            if s not in bases:
                bases.append(s)
        defaults.update(getattr(part, "defaults", {}))
    bases.append(OptimConfig)
    types = {f.name: f.type for b in bases for f in dataclasses.fields(b)}
    unknown = set(defaults) - set(types)
    if unknown:
        raise ValueError(f"{name}: defaults for {sorted(unknown)}, which no part's settings declare")
    extra_fields = [(k, types[k], field(default=v)) for k, v in defaults.items()]
    cls = dataclasses.make_dataclass(name, extra_fields, bases=tuple(bases),
                                     namespace={"__doc__": doc or f"{name}: OptimConfig + its parts' settings."})
    cls.__module__ = __name__
    return cls


def resolve_config(config_class: type, source: Any = None) -> Any:
    """``config_class`` built from ``source``: None (the defaults), an instance of it (as is), or any
    other learner config — typically the flat :class:`LearnerConfig` — whose keys the class has are
    copied (``None`` for :data:`ALGORITHM_DEFAULTS` keeps the class's default) and whose ``extra``
    mapping supplies settings only ``config_class`` knows."""
    if source is None:
        return config_class()
    if type(source) is config_class:
        return source
    names = {f.name for f in dataclasses.fields(config_class) if f.init}
    flat = isinstance(source, LearnerConfig)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(source):
        if f.name == "extra" or f.name not in names:
            continue
        v = getattr(source, f.name)
        if v is None and flat and f.name in ALGORITHM_DEFAULTS:
            continue
        kwargs[f.name] = v
    flat_names = {f.name for f in dataclasses.fields(LearnerConfig)}
    for k, v in (getattr(source, "extra", None) or {}).items():
        if k in flat_names:
            raise ValueError(f"learner.extra.{k}: {k} is a learner setting; set learner.{k}")
        if k not in names:
            own = sorted(names - flat_names)
            raise ValueError(f"learner.extra.{k}: not a setting of {config_class.__name__} "
                             f"(its own settings: {', '.join(own) or 'none'})")
        kwargs[k] = v
    return config_class(**kwargs)


def lr_factor(step: int, *, warmup_steps: int = 0, total_steps: int | None = None,
              schedule: str = "constant") -> float:
    """Multiplier of the base lr at update ``step`` (0-based): linear warmup to 1 over
    ``warmup_steps`` updates (``(step + 1) / warmup_steps``, so the first update already learns),
    then constant, or a linear / cosine decay reaching 0 at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"the {schedule!r} schedule needs total_steps")
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")


# --------------------------------------------------------------------------- parts: advantage estimators

@dataclass
class AdvantageInputs:
    """What an advantage estimator sees: the batch's trajectories and its ``(B, T)`` token tensors.

    ``rewards``: each step reward on its turn's last policy token, minus ``kl_coef · KL`` per token when
    the KL is in the reward; ``mask``: the training mask; ``values``: the critic's values at collection
    (``values[:, t]`` = the value of the state in which token ``t`` is chosen; None without a critic);
    ``fill_env``: the ``mask_env_tokens=False`` ablation (environment tokens take the value of the
    turn they follow). Helpers give per-turn views and map per-turn numbers back to tokens.
    """
    trajectories: Sequence[Trajectory]
    rewards: torch.Tensor
    mask: torch.Tensor
    values: torch.Tensor | None = None
    fill_env: bool = False

    @property
    def group_ids(self) -> list[Any]:
        return [t.group_id for t in self.trajectories]

    def turn_rewards(self) -> list[list[float]]:
        """Per trajectory, each turn's reward (:func:`~agentgym.algorithms.advantages.turn_rewards`)."""
        rows = self.rewards.detach().cpu().tolist()
        return [turn_rewards(row[:len(t.token_ids)], t.turn_spans) for t, row in zip(self.trajectories, rows)]

    def turn_values(self) -> list[list[float]]:
        """Per trajectory, the critic's value at each turn's first token."""
        if self.values is None:
            raise ValueError("this estimator needs a critic's values")
        rows = self.values.detach().cpu().tolist()
        return [[row[s] for s, _ in t.turn_spans] for t, row in zip(self.trajectories, rows)]

    def state_keys(self) -> list[list[tuple[int, ...]]]:
        """Per trajectory, each turn's observation history (what two turns must share to share a baseline)."""
        return [observation_history_keys(t.token_ids, t.loss_mask, t.turn_spans) for t in self.trajectories]

    def to_tokens(self, per_turn: Sequence[Sequence[float]]) -> torch.Tensor:
        """``(B, T)``: each turn's number on its policy tokens (and, with ``fill_env``, on the environment
        tokens after it; those between the prompt and the first turn take the first turn's)."""
        rows = []
        for t, values in zip(self.trajectories, per_turn):
            row = broadcast_to_tokens(t.turn_spans, values, len(t.token_ids), fill_env=self.fill_env)
            if self.fill_env and t.turn_spans and len(values):
                first = t.turn_spans[0][0]
                row[t.prompt_length:first] = [float(values[0])] * (first - t.prompt_length)
            rows.append(row)
        return pad_token_lists(rows, self.rewards.shape[1]).to(self.rewards.device)


class AdvantageEstimator:
    """Per-token rewards → per-token advantages and returns (the value targets of a critic).

    Subclasses set ``credits`` (the ``credit`` choices they support; the first is the default),
    ``settings`` (the config dataclasses they read) and ``defaults`` (their values for those
    settings); ``critic = True`` when they need value estimates (the learner then owns a critic);
    ``needs_groups`` when they compare trajectories of a group. ``__call__`` returns ``(advantages,
    returns)``, ``(B, T)``; the learner multiplies both by the training mask.
    """
    name: ClassVar[str] = ""
    settings: ClassVar[tuple[type, ...]] = (ReturnSettings,)
    defaults: ClassVar[dict[str, Any]] = {}
    credits: ClassVar[tuple[str, ...] | None] = ("episode",)
    critic: ClassVar[bool] = False
    needs_groups: ClassVar[bool] = False

    def __init__(self, config: Any):
        self.config = config
        credit = getattr(config, "credit", None)
        if self.credits is not None:
            credit = credit or self.credits[0]
            if credit not in self.credits:
                raise ValueError(f"credit={credit!r} is not supported by the {self.name!r} advantage estimator; "
                                 f"choose one of {', '.join(self.credits)}")
        self.credit = credit

    def __call__(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


def _check_groups(groups: Sequence[Any], name: str) -> None:
    counts: dict[Any, int] = {}
    for g in groups:
        if g is not None:
            counts[g] = counts.get(g, 0) + 1
    if not any(c > 1 for c in counts.values()):
        raise ValueError(f"{name} needs groups of trajectories on the same task: collect with group_size > 1")


def _returns_to_go(turn_rewards_: Sequence[Sequence[float]], gamma: float) -> list[list[float]]:
    return [discounted_returns(r, gamma) for r in turn_rewards_]


class ReturnsAdvantage(AdvantageEstimator):
    """REINFORCE's: each turn's target (``turn``: its discounted return-to-go; ``episode``: the
    episode's return) minus a batch baseline (none, batch mean, moving average) or normalised over
    the batch (ReBN, GEM's default). With ``turn`` credit the baseline pools every transition of the
    batch, as GEM; with ``episode`` credit one value per trajectory (a long episode does not weigh more)."""
    name = "returns"
    settings = (ReturnSettings, BaselineSettings)
    credits = ("turn", "episode")
    defaults = {"credit": "turn"}

    def __init__(self, config: Any):
        super().__init__(config)
        self.baseline = None if config.baseline == "rebn" else make_baseline(config.baseline, config.baseline_momentum)

    def __call__(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        rewards = inputs.turn_rewards()
        if self.credit == "turn":
            targets = _returns_to_go(rewards, cfg.gamma)
            pool = [g for r in targets for g in r]
        else:
            targets = [episode_returns(r, cfg.gamma) for r in rewards]
            pool = [r[0] if r else 0.0 for r in targets]
        if self.baseline is None:
            adv_pool = rebn(pool, cfg.adv_eps)
        else:
            b = self.baseline(pool)
            adv_pool = [g - b for g in pool]
        if self.credit == "turn":
            adv, i = [], 0
            for r in targets:
                adv.append(adv_pool[i:i + len(r)])
                i += len(r)
        else:
            adv = [[a] * len(r) for a, r in zip(adv_pool, targets)]
        return inputs.to_tokens(adv), inputs.to_tokens(targets)

    def state_dict(self) -> dict[str, Any]:
        return self.baseline.state_dict() if self.baseline is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.baseline is not None:
            self.baseline.load_state_dict(dict(state))


class GroupAdvantage(AdvantageEstimator):
    """GRPO's: returns compared within the group of trajectories on the same task (``group_id``).

    * ``episode`` (default): each trajectory's return, normalised within its group (``(G - mean) /
      (std + eps)``; Dr.GRPO without the std: ``group_scale=False``), on all its turns.
    * ``turn``: each turn's return-to-go against turn-level baselines — the group's turns with the
      same observation history, else the group's turns at the same index
      (:func:`~agentgym.algorithms.advantages.turn_group_normalize`).
    * ``gigpo``: GiGPO (Feng et al., 2025, arXiv:2505.10978): the episode advantage plus
      ``turn_adv_weight`` × the turn advantage within groups of equal observation history (0 for a turn
      without a peer).
    """
    name = "group"
    settings = (ReturnSettings, GroupSettings)
    credits = ("episode", "turn", "gigpo")
    needs_groups = True
    leave_one_out = False

    def _episode(self, values: Sequence[float], groups: Sequence[Any]) -> list[float]:
        if self.leave_one_out:
            return leave_one_out(values, groups)
        return group_normalize(values, groups, scale=self.config.group_scale, eps=self.config.adv_eps)

    def _turns(self, values: Sequence[Sequence[float]], groups: Sequence[Any], keys: Any,
               index_fallback: bool) -> list[list[float]]:
        return turn_group_normalize(values, groups, keys, scale=self.config.group_scale, eps=self.config.adv_eps,
                                    leave_one_out_baseline=self.leave_one_out, index_fallback=index_fallback)

    def __call__(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        groups = inputs.group_ids
        _check_groups(groups, f"the {self.name!r} advantage estimator (GRPO, RLOO, …)")
        rewards = inputs.turn_rewards()
        rtg = _returns_to_go(rewards, self.config.gamma)
        if self.credit == "turn":
            adv = self._turns(rtg, groups, inputs.state_keys(), index_fallback=True)
            return inputs.to_tokens(adv), inputs.to_tokens(rtg)
        episode = [episode_returns(r, self.config.gamma) for r in rewards]
        adv_episode = self._episode([e[0] if e else 0.0 for e in episode], groups)
        adv = [[a] * len(e) for a, e in zip(adv_episode, episode)]
        if self.credit == "episode":
            return inputs.to_tokens(adv), inputs.to_tokens(episode)
        turn = self._turns(rtg, groups, inputs.state_keys(), index_fallback=False)   # gigpo
        w = self.config.turn_adv_weight
        adv = [[a + w * b for a, b in zip(ea, ta)] for ea, ta in zip(adv, turn)]
        return inputs.to_tokens(adv), inputs.to_tokens(rtg)


class LeaveOneOutAdvantage(GroupAdvantage):
    """RLOO's: like :class:`GroupAdvantage`, but each return is compared with the mean of the *other*
    members of its pool (Kool et al., 2019; Ahmadian et al., 2024, arXiv:2402.14740) — an unbiased
    baseline, no std scaling (``group_scale`` is not read)."""
    name = "rloo"
    leave_one_out = True


class GAEAdvantage(AdvantageEstimator):
    """PPO's: generalised advantage estimation with a critic; advantages whitened over the batch
    (``whiten_advantages``).

    * ``token`` (default): over the sequence of policy tokens (env tokens skipped), ``gamma`` and
      ``lam`` per token (:func:`~agentgym.algorithms.advantages.gae`).
    * ``turn``: one step per turn, the value read at each turn's first token, every token of a turn
      sharing its advantage and return (:func:`~agentgym.algorithms.advantages.turn_gae`).
    """
    name = "gae"
    settings = (ReturnSettings, GAESettings)
    credits = ("token", "turn")
    defaults = {"credit": "token"}
    critic = True

    def __call__(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        if self.credit == "token":
            adv, ret = gae(inputs.rewards, inputs.values, inputs.mask, cfg.gamma, cfg.lam)
        else:
            pairs = [turn_gae(r, v, cfg.gamma, cfg.lam) for r, v in zip(inputs.turn_rewards(), inputs.turn_values())]
            adv, ret = inputs.to_tokens([a for a, _ in pairs]), inputs.to_tokens([r for _, r in pairs])
        if cfg.whiten_advantages:
            adv = masked_whiten(adv, inputs.mask)
        return adv, ret


# --------------------------------------------------------------------------- parts: policy objectives

class PolicyObjective:
    """The per-token policy-gradient term: ``(logp, old_logp, advantages, ratio_mask) -> (loss,
    ratio, clipped)``, all ``(B, T)`` (see :data:`~agentgym.algorithms.losses.PolicyTerm`). The shared
    loss aggregates it and adds entropy, KL and value terms. ``on_policy_only``: the term has no
    importance ratio, so the learner makes one step per batch."""
    name: ClassVar[str] = ""
    settings: ClassVar[tuple[type, ...]] = ()
    defaults: ClassVar[dict[str, Any]] = {}
    on_policy_only: ClassVar[bool] = False

    def __init__(self, config: Any):
        self.config = config

    def __call__(self, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                 ratio_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class ClipObjective(PolicyObjective):
    """PPO's clipped ratio (Schulman et al., 2017), clip-higher with ``clip_eps_high`` (DAPO), dual-clip
    with ``dual_clip_c``."""
    name = "clip"
    settings = (ClipSettings,)

    def __call__(self, logp, old_logp, advantages, ratio_mask):
        c = self.config
        if c.dual_clip_c is not None:
            return dual_clip_surrogate(logp, old_logp, advantages, c.clip_eps, c.clip_eps_high, c.dual_clip_c)
        return clipped_surrogate(logp, old_logp, advantages, c.clip_eps, c.clip_eps_high)


class DualClipObjective(ClipObjective):
    """Dual-clip PPO (Ye et al., 2020, arXiv:1912.09729): ``c = 3`` by default, the paper's value."""
    name = "dual-clip"
    defaults = {"dual_clip_c": 3.0}


class ReinforceObjective(PolicyObjective):
    """``-A · log p`` (Williams, 1992): on-policy only."""
    name = "reinforce"
    on_policy_only = True

    def __call__(self, logp, old_logp, advantages, ratio_mask):
        return reinforce_surrogate(logp, advantages), torch.exp(logp - old_logp), torch.zeros_like(logp)


class GSPOObjective(PolicyObjective):
    """GSPO's sequence-level, length-normalised ratio with sequence clipping (Zheng et al., 2025,
    arXiv:2507.18071; :func:`~agentgym.algorithms.losses.gspo_surrogate`). In a multi-turn episode the
    sequence is the trajectory's policy tokens. Defaults: the paper's clip range 3e-4 / 4e-4 and its
    sequence-mean aggregation."""
    name = "gspo"
    settings = (ClipSettings,)
    defaults = {"clip_eps": 3e-4, "clip_eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"}

    def __call__(self, logp, old_logp, advantages, ratio_mask):
        return gspo_surrogate(logp, old_logp, advantages, ratio_mask, self.config.clip_eps, self.config.clip_eps_high)


class CISPOObjective(PolicyObjective):
    """CISPO (MiniMax-M1, arXiv:2506.13585; :func:`~agentgym.algorithms.losses.cispo_surrogate`): the
    clipped importance weight, detached, times ``-A log p``. Defaults: no lower bound (``clip_eps=1``),
    ``clip_eps_high=0.28``."""
    name = "cispo"
    settings = (ClipSettings,)
    defaults = {"clip_eps": 1.0, "clip_eps_high": 0.28}

    def __call__(self, logp, old_logp, advantages, ratio_mask):
        return cispo_surrogate(logp, old_logp, advantages, self.config.clip_eps, self.config.clip_eps_high)



# --------------------------------------------------------------------------- parts: the critic

class ValueModel(nn.Module):
    """A separate critic: the body of a causal LM (its ``base_model``) and a linear value head."""

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        self.body = causal_lm.base_model
        self.head = _value_head(causal_lm.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        h = self.body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state
        return _aligned_values(self.head, h)


def _value_head(hidden: int) -> nn.Linear:
    head = nn.Linear(hidden, 1)
    nn.init.zeros_(head.weight)  # V = 0 at the start: the first advantages are the returns
    nn.init.zeros_(head.bias)
    return head


def _aligned_values(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``V[:, t]`` = value of the state in which token ``t`` is chosen = head(hidden at ``t - 1``)."""
    v = head(hidden.to(head.weight.dtype)).squeeze(-1)
    return torch.cat([v.new_zeros(v.shape[0], 1), v[:, :-1]], dim=1)


class Critic:
    """The optional value function, owned by the learner (never written onto the policy).

    ``critic="head"``: a linear head on the policy's last hidden state (the value loss also trains the
    shared body); ``"model"``: a separate copy of the network with its own head (:class:`ValueModel`).
    Built before LoRA wraps the policy, so a separate critic copies the plain network.
    """
    settings = (CriticSettings,)

    def __init__(self, config: Any, model: nn.Module):
        device = next(model.parameters()).device
        self.model: ValueModel | None = None
        if config.critic == "model":
            self.model = ValueModel(copy.deepcopy(model)).to(device)
            self.model.requires_grad_(True)
            self.head = self.model.head
        else:
            self.head = _value_head(model.config.hidden_size).to(device)

    @property
    def module(self) -> nn.Module:
        return self.model if self.model is not None else self.head

    @property
    def on_policy_hidden(self) -> bool:
        """True when values come from the policy's own forward pass (the head)."""
        return self.model is None

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def train(self, mode: bool) -> None:
        if self.model is not None:
            self.model.train(mode)

    def values(self, micro: Batch, policy_hidden: torch.Tensor | None) -> torch.Tensor:
        if self.model is not None:
            return self.model(micro.input_ids, micro.attention_mask, micro.position_ids)
        return _aligned_values(self.head, policy_hidden)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state)



# --------------------------------------------------------------------------- the learner

_SUMMED_STATS = ("policy_loss", "value_loss", "loss")  # already normalised by the minibatch totals


class Learner:
    """Trains ``policy.model`` (a ``transformers`` causal LM) in place from token-level trajectories.

    A learner class names its parts (``advantage_name``, ``objective_name``: keys of
    :data:`ADVANTAGES` and :data:`OBJECTIVES`) and its typed config (``config_class``; None = composed
    from the parts' settings); build one with :func:`register_learner`, or subclass and override
    :meth:`compute_advantages` for full control.
    The instance holds the parts as ``advantage`` and ``objective``, and the critic when the
    estimator needs values (``value_head``; ``critic`` for a separate critic network).

    The policy's ``generate`` keeps working on the same module, so the next rollout samples from the
    updated weights. With LoRA the learner owns the ``peft`` wrapper (``learner.model``); the adapters
    are injected into the policy's own module. :meth:`state_dict` holds the learner's own state
    (optimizer, scheduler, step, advantage-estimator state, critic, RNG); the policy's weights are the
    policy's to save.
    """

    name: ClassVar[str] = "learner"
    advantage_name: ClassVar[str] = "group"
    objective_name: ClassVar[str] = "clip"
    config_class: ClassVar[type | None] = None

    def __init__(self, policy: Any, config: Any = None, *, separate_sampler: bool = False, fsdp: bool = False,
                 precision: Any = None):
        self.policy = policy
        cls = type(self)
        if cls.config_class is None:
            cls.config_class = _composed_config(cls)
        self.config = cfg = resolve_config(cls.config_class, config)
        self.advantage: AdvantageEstimator = _part(ADVANTAGES, self.advantage_name, "advantage estimator")(cfg)
        self.objective: PolicyObjective = _part(OBJECTIVES, self.objective_name, "objective")(cfg)
        self.uses_values = bool(self.advantage.critic)
        if cfg.loss_token_kinds is not None:
            _check_token_kinds(cfg.loss_token_kinds)
        # data-parallel under torchrun (see algorithms/distributed.py): every rank gets the same global
        # batch and computes its share of the micro-batches; None in one process
        from agentgym.algorithms.distributed import current
        self.dist = current()
        self.fsdp = fsdp and self.dist is not None
        # True when another engine (vLLM) samples the rollouts: see ``OptimConfig.old_logprobs``
        self.separate_sampler = separate_sampler
        if cfg.schedule != "constant" and cfg.total_steps is None:
            raise ValueError(f"schedule {cfg.schedule!r} needs total_steps (the number of update calls)")
        tok = getattr(policy, "tokenizer", None)
        self.pad_id = int(getattr(tok, "pad_token_id", None) or 0)
        self._rng = torch.Generator().manual_seed(cfg.seed)
        model = policy.model
        base_copy = None
        if cfg.kl_coef > 0 and cfg.lora is None and not _is_peft(model):
            base_copy = copy.deepcopy(model)  # the frozen reference: the policy as it starts
        self._critic = Critic(cfg, model) if self.uses_values else None
        if cfg.lora is not None and not _is_peft(model):
            # the learner owns the PEFT wrapper; the adapters are injected into the policy's own module,
            # so a colocated policy samples through them without any attribute written onto it
            model = _apply_lora(model, cfg.lora, seed=cfg.seed)
        self.model = model
        self.ref_model = None
        if base_copy is not None:
            self.ref_model = base_copy.eval().requires_grad_(False)
        self._sharded: list[nn.Module] = []   # the FSDP2-sharded modules (empty without fsdp)
        if self.fsdp:
            self._shard()
        if cfg.gradient_checkpointing:
            _enable_checkpointing(self.model)
        self.device = next(self.model.parameters()).device
        self.precision = learner_precision(precision, self.device)
        self.optimizer = _adamw(self._param_groups(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(cfg.warmup_ratio * (cfg.total_steps or 0))
        self.warmup_steps = int(warmup)
        critic_warmup = getattr(cfg, "critic_warmup_ratio", None)
        self.critic_warmup_steps = (self.warmup_steps if critic_warmup is None
                                    else int(round(critic_warmup * (cfg.total_steps or 0))))
        factors = {role: functools.partial(lr_factor, warmup_steps=steps, total_steps=cfg.total_steps,
                                           schedule=cfg.schedule)
                   for role, steps in (("policy", self.warmup_steps), ("critic", self.critic_warmup_steps))}
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, [factors[g["role"]] for g in self.optimizer.param_groups])
        self.step = 0
        self._temperature = cfg.temperature or 1.0

    def _shard(self) -> None:
        """FSDP2: shard the trained policy, the frozen reference and a separate critic the same way
        (``fully_shard`` per decoder layer, then the root), before the optimizer sees their parameters.
        The reference and critic were copied from the unsharded policy, so every rank starts equal. A
        value head on the policy's body (``critic="head"``) stays replicated: its gradients are averaged
        with one all-reduce. LoRA under FSDP is not supported yet (refused with the reason)."""
        if self.config.lora is not None or _is_peft(self.model):
            raise ValueError("fsdp=true with learner.lora is not supported yet: sharding the PEFT wrapper and "
                             "merging adapters across shards is not built; use LoRA without fsdp, or fsdp without LoRA")
        from agentgym.algorithms.distributed import apply_fsdp2
        self._sharded.append(apply_fsdp2(self.model))
        if self.ref_model is not None:
            self._sharded.append(apply_fsdp2(self.ref_model))
        if self._critic is not None and self._critic.model is not None:
            self._sharded.append(apply_fsdp2(self._critic.model))

    def _fsdp_managed(self) -> set[int]:
        """ids of the parameters whose gradients FSDP reduces itself."""
        return {id(p) for m in self._sharded for p in m.parameters()}

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The trained policy's full (unsharded) weights. Under FSDP every rank must call this (it
        gathers the shards); otherwise it is the module's state dict."""
        if not self.fsdp:
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))

    # ------------------------------------------------------------------ parts, as attributes
    @property
    def critic(self) -> ValueModel | None:
        """The separate critic network (``critic="model"``), else None."""
        return self._critic.model if self._critic is not None else None

    @property
    def value_head(self) -> nn.Module | None:
        """The critic's value head (None for learners without a critic)."""
        return self._critic.head if self._critic is not None else None

    @property
    def baseline(self) -> Any:
        """The advantage estimator's stateful baseline, if it has one (REINFORCE's mean / EMA)."""
        return getattr(self.advantage, "baseline", None)

    def _batch_temperature(self, trajectories: Sequence[Trajectory]) -> float:
        """The temperature the batch was sampled at (one per update), checked against the config."""
        temps = {t.temperature for t in trajectories if t.temperature is not None}
        if len(temps) > 1:
            raise ValueError(f"one update mixes trajectories sampled at temperatures {sorted(temps)}; "
                             "log-prob ratios need one sampling temperature per batch")
        if not temps:
            return self.config.temperature or 1.0
        t = float(temps.pop())
        if self.config.temperature is not None and abs(self.config.temperature - t) > 1e-9:
            raise ValueError(f"learner.temperature={self.config.temperature} but the trajectories were sampled at "
                             f"temperature {t}; leave learner.temperature unset (it follows the rollouts)")
        return t

    def policy_weights(self) -> nn.Module | list[tuple[str, torch.Tensor]]:
        """What a separate sampler loads after an update (``policy.sync_weights``): the trained module
        itself, or with LoRA the base weights with the adapter merged in, under the base model's names
        (an inference engine then needs no LoRA support and samples exactly the trained policy)."""
        if self.fsdp:   # collective: every rank syncs its own sampler after the same update
            return list(self.full_model_state().items())
        if not _is_peft(self.model):
            return self.model
        self.model.merge_adapter()
        try:
            base = self.model.get_base_model()
            return [(k.replace(".base_layer", ""), v.detach().clone()) for k, v in base.state_dict().items()
                    if "lora_" not in k]
        finally:
            self.model.unmerge_adapter()

    # ------------------------------------------------------------------ subclass API
    def compute_advantages(self, trajectories: Sequence[Trajectory], batch: Batch, rewards: torch.Tensor,
                           mask: torch.Tensor) -> None:
        """Fill ``batch.advantages`` and ``batch.returns`` from per-token ``rewards`` (``(B, T)``,
        KL penalty included) over the training ``mask``, with the advantage estimator."""
        inputs = AdvantageInputs(trajectories, rewards, mask, batch.old_values if self.uses_values else None,
                                 fill_env=not self.config.mask_env_tokens)
        adv, ret = self.advantage(inputs)
        batch.advantages, batch.returns = adv.to(mask.dtype) * mask, ret.to(mask.dtype) * mask

    def critic_parameters(self) -> list[nn.Parameter]:
        return self._critic.parameters() if self._critic is not None else []

    def _values(self, micro: Batch, outputs: Any) -> torch.Tensor:
        if self._critic.on_policy_hidden and outputs is None:
            outputs = self._model_outputs(self.model, micro, hidden=True, logits=False)
        return self._critic.values(micro, outputs.hidden_states[-1] if self._critic.on_policy_hidden else None)

    def _epochs_and_minibatch(self, n: int) -> tuple[int, int, bool]:
        """(epochs, minibatch size, shuffle); an on-policy objective makes one step on the whole batch."""
        if self.objective.on_policy_only:
            return 1, n, False
        return self.config.epochs, self.config.minibatch_size or n, True

    def _train_mask(self, batch: Batch) -> torch.Tensor:
        """The tokens that carry loss: ``mask_env_tokens``, narrowed to ``loss_token_kinds`` when set."""
        kinds = self.config.loss_token_kinds
        if kinds is None:
            return batch.train_mask(self.config.mask_env_tokens)
        return batch.train_mask(self.config.mask_env_tokens, kinds=kinds)

    # ------------------------------------------------------------------ public API
    def update(self, trajectories: Sequence[Trajectory] | Any) -> dict[str, float]:
        """One learning step on a batch of trajectories (a list, or anything with ``.trajectories``).

        Metrics: ``loss``, ``policy_loss``, ``kl``, ``entropy``, ``clip_frac``, ``approx_kl``,
        ``grad_norm``, ``lr``, ``tokens`` (loss tokens), ``skipped`` (minibatches skipped for a
        non-finite loss or gradient), ``value_loss`` (with a critic), plus ``reward_mean``,
        ``advantage_mean``/``_std``, ``optimizer_steps``, ``dropped`` (trajectories without
        policy tokens) and ``time_s``.
        """
        t0 = time.perf_counter()
        cfg = self.config
        self._positions = [0, 0]   # positions the training passes computed, real tokens among them
        trajs = list(getattr(trajectories, "trajectories", trajectories))
        usable = [t for t in trajs if t.num_policy_tokens > 0]
        metrics: dict[str, float] = {
            "reward_mean": float(sum(t.total_reward for t in trajs) / len(trajs)) if trajs else 0.0,
            "dropped": float(len(trajs) - len(usable)), "lr": float(self.optimizer.param_groups[0]["lr"]),
        }
        if not usable:
            metrics.update(tokens=0.0, skipped=0.0, optimizer_steps=0.0, time_s=time.perf_counter() - t0)
            return metrics
        self._temperature = self._batch_temperature(usable)
        metrics["temperature"] = self._temperature
        batch = collate(usable, pad_id=self.pad_id).to(self.device)
        mask = self._train_mask(batch)
        was_training = self.model.training
        try:
            self._set_training(False)
            if self.recomputes_old_logprobs:
                metrics.update(self._recompute_old_logprobs(batch))
            self._precompute(batch)
            rewards = batch.token_rewards.clone()
            if cfg.kl_coef > 0 and cfg.kl_in == "reward":
                # KL of the sampling policy to the reference, on the tokens it sampled (env tokens
                # have no sampling-time log-prob, even when the ablation trains on them)
                kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, cfg.kl_estimator) * batch.loss_mask
                rewards = rewards - cfg.kl_coef * kl
                metrics["kl_reward"] = float(masked_mean(kl, batch.loss_mask))
            self.compute_advantages(usable, batch, rewards, mask)
            metrics["advantage_mean"] = float(masked_mean(batch.advantages, mask))
            centred = batch.advantages - metrics["advantage_mean"]
            metrics["advantage_std"] = float(masked_mean(centred ** 2, mask).sqrt())
            self._set_training(True)
            metrics.update(self._optimize(batch))
        finally:
            self._set_training(was_training)
        if metrics["optimizer_steps"] > 0:
            self.scheduler.step()
            self.step += 1
        metrics["tokens"] = float(mask.sum())
        computed, real = self._positions
        # the share of the training passes' positions that were padding (FLOPs that change nothing)
        metrics["pad_frac"] = 1.0 - real / computed if computed else 0.0
        metrics["time_s"] = time.perf_counter() - t0
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler, RNG, advantage and critic state for a checkpoint. Under FSDP every rank
        must call it: the optimizer state and a sharded critic are gathered in full (collectives), so a
        checkpoint does not depend on the number of processes that wrote it."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                                 get_optimizer_state_dict)
            full = StateDictOptions(full_state_dict=True)
            optim = get_optimizer_state_dict(self._optimized_modules(), self.optimizer, options=full)
        else:
            optim = self.optimizer.state_dict()
        state = {"name": self.name, "step": self.step, "optimizer": optim,
                 "scheduler": self.scheduler.state_dict(), "rng": self._rng.get_state(),
                 "advantage": self.advantage.state_dict()}
        if self._critic is not None:
            if self.fsdp and self._critic.model is not None:
                state["critic"] = {k: v.detach().cpu().clone()
                                   for k, v in get_model_state_dict(self._critic.model, options=full).items()}
            else:
                state["critic"] = self._critic.state_dict()
        return state

    def _optimized_modules(self) -> nn.Module:
        """Every module whose parameters the optimizer updates, under one root (FSDP's state-dict helpers
        map optimizer state to parameter names through it)."""
        mods = nn.ModuleDict({"policy": self.model})
        if self._critic is not None:
            mods["critic"] = self._critic.module
        return mods

    def load_full_model_state(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load full (unsharded) policy weights, e.g. from a checkpoint; under FSDP into each rank's
        shards (every rank calls it with the same weights). A tied ``lm_head.weight`` may be absent; any
        other missing or unexpected name is refused (RuntimeError) before anything is loaded."""
        missing, unexpected = weight_name_mismatch(self.model.state_dict(), weights)
        if missing or unexpected:
            raise RuntimeError(f"missing {missing[:3]}, unexpected {unexpected[:3]}")
        if not self.fsdp:
            self.model.load_state_dict(dict(weights), strict=False)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(self.model, dict(weights), options=StateDictOptions(full_state_dict=True, strict=False))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("name", self.name) != self.name:
            raise ValueError(f"state of a {state['name']!r} learner cannot load into {self.name!r}")
        self.step = int(state["step"])
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                                 set_optimizer_state_dict)
            full = StateDictOptions(full_state_dict=True)
            # the sharded critic first: the optimizer state is mapped through the modules' parameters
            if self._critic is not None and self._critic.model is not None:
                set_model_state_dict(self._critic.model, dict(state["critic"]), options=full)
            elif self._critic is not None:
                self._critic.load_state_dict(state["critic"])
            set_optimizer_state_dict(self._optimized_modules(), self.optimizer, optim_state_dict=state["optimizer"],
                                     options=full)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
            if self._critic is not None:
                self._critic.load_state_dict(state["critic"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._rng.set_state(state["rng"])
        # "baseline": REINFORCE checkpoints written before the learners were split into parts
        self.advantage.load_state_dict(state.get("advantage", state.get("baseline", {})))

    # ------------------------------------------------------------------ internals
    def _param_groups(self) -> list[dict[str, Any]]:
        cfg = self.config
        groups = []
        critic_lr = getattr(cfg, "critic_lr", None) or cfg.lr
        for role, params, lr in (("policy", self.policy_parameters(), cfg.lr),
                                 ("critic", self.critic_parameters(), critic_lr)):
            decay = [p for p in params if p.ndim >= 2]
            no_decay = [p for p in params if p.ndim < 2]
            # "role" picks the group's warmup (the critic may have its own, ``critic_warmup_ratio``)
            groups += [{"params": decay, "lr": lr, "role": role},
                       {"params": no_decay, "lr": lr, "weight_decay": 0.0, "role": role}]
        return [g for g in groups if g["params"]]

    def _set_training(self, mode: bool) -> None:
        """Train mode while optimising (gradient checkpointing needs it), eval for the no-grad passes."""
        self.model.train(mode)
        if self._critic is not None:
            self._critic.train(mode)

    def policy_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]
    def _autocast(self) -> contextlib.AbstractContextManager:
        """Policy, reference and critic forwards run in the run's precision (loss and log-softmax in fp32)."""
        return self.precision.autocast()

    def _model_outputs(self, model: nn.Module, micro: Batch, hidden: bool = False, logits: bool = True) -> Any:
        # logits only from the last prompt token on: the prompt's vocabulary projections are the
        # bulk of the work for short responses, and no loss needs them (none at all for values only)
        return model(input_ids=micro.input_ids, attention_mask=micro.attention_mask,
                     position_ids=micro.position_ids, use_cache=False, output_hidden_states=hidden,
                     logits_to_keep=micro.width - micro.logits_offset if logits else 1)

    def _logprobs(self, outputs: Any, micro: Batch, *,
                  entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        return token_logprobs(outputs.logits, micro.input_ids, self._temperature, offset=micro.logits_offset,
                              with_entropy=entropy, entropy_grad=self.config.entropy_coef != 0)

    def _reference_outputs(self, micro: Batch) -> Any:
        if self.ref_model is not None:
            return self._model_outputs(self.ref_model, micro)
        with self.model.disable_adapter():  # LoRA: the reference is the base network
            return self._model_outputs(self.model, micro)

    @property
    def _has_reference(self) -> bool:
        return self.config.kl_coef > 0

    @property
    def recomputes_old_logprobs(self) -> bool:
        mode = self.config.old_logprobs
        return mode == "recompute" or (mode == "auto" and self.separate_sampler)

    @torch.no_grad()
    def _recompute_old_logprobs(self, batch: Batch) -> dict[str, float]:
        """The ratio's old log-probs from the training model (no grad), the sampler-vs-learner
        divergence, and (with ``tis_cap``) the truncated importance weights."""
        cfg = self.config
        for rows in batch.micro_rows(cfg.micro_batch_size, cfg.micro_batch_tokens):
            micro = batch.select(rows)
            with self._autocast():
                logp, _ = self._logprobs(self._model_outputs(self.model, micro), micro)
            batch.old_logprobs[rows, :micro.width] = logp.float() * micro.loss_mask
        m = batch.loss_mask
        diff = (batch.old_logprobs - batch.sampler_logprobs).abs() * m
        n = float(m.sum())
        stats = {"sampler_logp_diff_mean": float(diff.sum()) / max(n, 1.0),
                 "sampler_logp_diff_max": float(diff.max()) if n else 0.0,
                 "sampler_logp_diff_frac": float(((diff > cfg.divergence_threshold).float() * m).sum()) / max(n, 1.0)}
        if cfg.tis_cap is not None:
            w = torch.exp(batch.old_logprobs - batch.sampler_logprobs).clamp(max=cfg.tis_cap)
            batch.is_weights = torch.where(m.bool(), w, torch.ones_like(w))
            stats["tis_weight_mean"] = float((batch.is_weights * m).sum()) / max(n, 1.0)
        return stats

    @torch.no_grad()
    def _precompute(self, batch: Batch) -> None:
        """Reference log-probs (KL) and value estimates at collection (PPO), without gradients."""
        if not (self._has_reference or self.uses_values):
            return
        cfg = self.config
        for rows in batch.micro_rows(cfg.micro_batch_size, cfg.micro_batch_tokens):
            micro = batch.select(rows)
            w = micro.width
            with self._autocast():
                if self._has_reference:
                    out = self._reference_outputs(micro)
                    ref, _ = self._logprobs(out, micro)
                    batch.ref_logprobs[rows, :w] = ref * micro.attention_mask
                if self.uses_values:
                    values = self._values(micro, None)
                    batch.old_values[rows, :w] = values.float() * micro.response_mask

    def _loss_settings(self, batch: Batch) -> LossSettings:
        """Aggregation, KL, entropy and value settings of the shared loss (the objective supplies the
        policy term itself)."""
        cfg = self.config
        max_len = cfg.max_response_tokens or float(self._train_mask(batch).sum(1).max())
        return LossSettings(loss_agg=cfg.loss_agg, max_len=max_len,
                            kl_coef=cfg.kl_coef if cfg.kl_in == "loss" else 0.0, kl_estimator=cfg.kl_estimator,
                            entropy_coef=cfg.entropy_coef, value_coef=getattr(cfg, "value_coef", 0.5),
                            value_clip_eps=getattr(cfg, "value_clip_eps", None))

    def _optimize(self, batch: Batch) -> dict[str, float]:
        """``epochs`` passes over minibatches; averages the statistics of the steps taken."""
        settings = self._loss_settings(batch)
        epochs, mb_size, shuffle = self._epochs_and_minibatch(len(batch))
        totals: dict[str, list[float]] = {}   # name -> [weighted sum, weight]
        grad_norms: list[float] = []
        skipped = 0
        for _ in range(epochs):
            # one minibatch: the order does not matter; keep the rows as given
            shuffle_now = shuffle and mb_size < len(batch)
            order = torch.randperm(len(batch), generator=self._rng) if shuffle_now else torch.arange(len(batch))
            for start in range(0, len(batch), mb_size):
                stats = self._minibatch_step(batch.select(order[start:start + mb_size]), settings)
                if stats is None:
                    skipped += 1
                    continue
                grad_norms.append(stats.pop("grad_norm")[0])
                for k, (v, w) in stats.items():
                    acc = totals.setdefault(k, [0.0, 0.0])
                    acc[0] += v * w
                    acc[1] += w
        out = {k: s / w for k, (s, w) in totals.items() if w > 0}
        out.setdefault("kl", 0.0)
        out.update(grad_norm=sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
                   optimizer_steps=float(len(grad_norms)), skipped=float(skipped))
        return out

    def _minibatch_step(self, mb: Batch, settings: LossSettings) -> dict[str, tuple[float, float]] | None:
        """Accumulate gradients over micro-batches, clip, step.

        Returns ``{stat: (value, weight)}`` (loss terms: the minibatch's value, weight 1; token
        statistics: their mean, weighted by tokens), or None when the step was skipped because the
        loss or the gradient norm is not finite.
        """
        cfg = self.config
        mb_mask = self._train_mask(mb)
        num_tokens, num_seqs = float(mb_mask.sum()), float(len(mb))
        losses: dict[str, float] = {}
        token_stats: dict[str, float] = {}
        micros: list[Batch | None] = list(mb.micro_batches(cfg.micro_batch_size, cfg.micro_batch_tokens))
        self._positions[0] += sum(m.padded_tokens for m in micros if m is not None)
        self._positions[1] += int(mb.lengths.sum())
        total = len(micros)
        scale = 1.0
        if self.dist is not None:  # this rank's share (round-robin); the loss is normalised globally
            micros = micros[self.dist.rank::self.dist.world_size]
            if self.fsdp:  # FSDP averages gradients and needs the same number of passes on every rank
                rounds = -(-total // self.dist.world_size)
                micros = micros + [None] * (rounds - len(micros))
                scale = float(self.dist.world_size)
        finite = True
        hidden = self.uses_values and self._critic.on_policy_hidden   # the value head reads the policy's pass
        self.optimizer.zero_grad(set_to_none=True)
        try:
            for micro in micros:
                if micro is None:  # FSDP padding: a zero-weight pass on the first rows
                    pad = mb.select([0])
                    with self._autocast():
                        out = self._model_outputs(self.model, pad)
                    (out.logits.sum() * 0.0).backward()
                    continue
                mask = self._train_mask(micro)
                with self._autocast():
                    out = self._model_outputs(self.model, micro, hidden=hidden)
                    logp, entropy = self._logprobs(out, micro, entropy=True)
                    values = self._values(micro, out).float() if self.uses_values else None
                loss, st = ppo_objective(
                    logp, micro.old_logprobs, micro.advantages, mask, settings, sampled_mask=micro.loss_mask,
                    entropy=entropy, ref_logp=micro.ref_logprobs if self._has_reference else None,
                    values=values, old_values=micro.old_values if values is not None else None,
                    returns=micro.returns if values is not None else None, num_tokens=num_tokens, num_seqs=num_seqs,
                    is_weights=micro.is_weights if cfg.tis_cap is not None else None, policy_term=self.objective)
                if not torch.isfinite(loss):
                    finite = False
                    if self.dist is None:
                        return None
                    continue
                (loss * scale).backward()
                st["loss"] = loss.detach()
                tokens = float(mask.sum())
                for k, v in st.items():
                    if k in _SUMMED_STATS:  # already divided by the minibatch totals: the parts add up
                        losses[k] = losses.get(k, 0.0) + float(v)
                    else:
                        token_stats[k] = token_stats.get(k, 0.0) + float(v) * tokens
            if self.dist is not None:
                from agentgym.algorithms.distributed import all_reduce_gradients, gather_lists
                parts = gather_lists([(finite, losses, token_stats)], self.dist)
                if not all(f for f, _, _ in parts):
                    return None
                losses, token_stats = {}, {}
                for _, ls, ts in parts:
                    for k, v in ls.items():
                        losses[k] = losses.get(k, 0.0) + v
                    for k, v in ts.items():
                        token_stats[k] = token_stats.get(k, 0.0) + v
                managed = self._fsdp_managed()
                # under FSDP the loss was scaled by N for FSDP's average: the replicated rest is averaged too
                all_reduce_gradients([p for p in self.policy_parameters() + self.critic_parameters()
                                      if id(p) not in managed], self.dist, average=self.fsdp)
            norm = self._clip_gradients()
            if not math.isfinite(norm):
                return None
            self.optimizer.step()
        finally:
            self.optimizer.zero_grad(set_to_none=True)
        stats = {k: (v, 1.0) for k, v in losses.items()}
        stats.update({k: (v / max(num_tokens, 1.0), num_tokens) for k, v in token_stats.items()})
        stats["grad_norm"] = (norm, 1.0)
        return stats

    def _clip_gradients(self) -> float:
        """Clip the policy's and the critic's gradients separately; return the policy's pre-clip norm
        (non-finite if either is)."""
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else float("inf")
        norms = []
        for params in (self.policy_parameters(), self.critic_parameters()):
            params = [p for p in params if p.grad is not None]
            if params:
                norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
                if hasattr(norm, "full_tensor"):   # FSDP2: a DTensor (the norm over every rank's shards)
                    norm = norm.full_tensor()
                norms.append(float(norm))
        if not norms:
            return 0.0
        return norms[0] if all(math.isfinite(n) for n in norms) else float("nan")



def _adamw(param_groups: list[dict[str, Any]], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel when every parameter is a CPU or CUDA float tensor (one kernel per
    step instead of a Python loop over the tensors: the optimizer step of a 135M-parameter model on CPU
    took ~40 % less time, see benchmarks/RESULTS.md), else torch's default implementation."""
    params = [p for g in param_groups for p in g["params"]]
    if params and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params):
        try:
            return torch.optim.AdamW(param_groups, fused=True, **kwargs)
        except (RuntimeError, ValueError):  # a torch without the fused kernel for this device/dtype
            pass
    return torch.optim.AdamW(param_groups, **kwargs)


def _is_peft(model: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, PeftModel)


def _apply_lora(model: nn.Module, lora: LoraSettings, seed: int = 0) -> nn.Module:
    """Wrap ``model`` in a ``peft`` LoRA model; the adapter's random init is seeded by ``seed``
    (without disturbing the global RNG)."""
    from peft import LoraConfig, get_peft_model
    target = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=target,
                        task_type="CAUSAL_LM")
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), warnings.catch_warnings():
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


def _enable_checkpointing(model: nn.Module) -> None:
    """Non-reentrant activation checkpointing (works with frozen LoRA bases without input-grad hooks)."""
    enable = getattr(model, "activation_checkpointing_enable", None)   # transformers >= 5.x
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})



def _check_token_kinds(kinds: Sequence[str]) -> None:
    """``loss_token_kinds`` needs the batch's typed token provenance and names known kinds (the batch
    checks the masking rule itself: with ``mask_env_tokens`` only sampled kinds)."""
    if "kinds" not in inspect.signature(Batch.train_mask).parameters:
        raise ValueError("learner.loss_token_kinds needs typed token provenance (Batch.train_mask(kinds=...)), "
                         "which this installation's batch format does not have")
    try:
        from agentgym.trajectory import TOKEN_KINDS
    except ImportError:  # pragma: no cover - an older kernel: the batch will say what is wrong
        return
    unknown = sorted(set(kinds) - set(TOKEN_KINDS))
    if unknown:
        raise ValueError(f"learner.loss_token_kinds: unknown token kinds {unknown}; known: {', '.join(TOKEN_KINDS)}")


# --------------------------------------------------------------------------- registries

#: name -> advantage estimator class (:func:`register_advantage`)
ADVANTAGES: dict[str, type[AdvantageEstimator]] = {}
#: name -> policy objective class (:func:`register_objective`)
OBJECTIVES: dict[str, type[PolicyObjective]] = {}
#: name -> learner class (:func:`register_learner`); ``agentgym train algo=NAME`` looks names up here
LEARNERS: dict[str, type[Learner]] = {}


def _key(name: str) -> str:
    key = str(name).strip().lower()
    if not key or ":" in key or "," in key or "=" in key:
        raise ValueError(f"a registered name must be non-empty and free of ':', ',' and '=', got {name!r}")
    return key


def _part(registry: Mapping[str, type], name: str, what: str) -> type:
    try:
        return registry[_key(name)]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; registered: {', '.join(sorted(registry))}") from None


def _add(registry: dict[str, Any], name: str, obj: Any, what: str, replace: bool) -> None:
    key = _key(name)
    if key in registry and registry[key] is not obj and not replace:
        raise ValueError(f"{what} {key!r} is already registered (pass replace=True to override it)")
    registry[key] = obj


def _register_part(registry: dict[str, Any], name: str, obj: Any, base: type, wrap: Callable[[Callable], type],
                   what: str, replace: bool) -> Any:
    """Register ``obj`` — a ``base`` subclass, or a function that ``wrap`` turns into one — under
    ``name``; with ``obj=None``, a decorator that does so."""
    def add(o: Any) -> Any:
        if isinstance(o, type) and issubclass(o, base):
            cls = o
        elif callable(o):
            cls = wrap(o)
        else:
            raise TypeError(f"registering {what} {name!r} needs a subclass of {base.__name__} or a function")
        cls.name = _key(name)
        _add(registry, name, cls, what, replace)
        return o
    return add if obj is None else add(obj)


def register_advantage(name: str, estimator: type[AdvantageEstimator] | Callable | None = None, *,
                       credits: tuple[str, ...] | None = None, critic: bool = False, needs_groups: bool = False,
                       settings: tuple[type, ...] = (ReturnSettings,), defaults: Mapping[str, Any] | None = None,
                       replace: bool = False) -> Any:
    """Register an advantage estimator under ``name`` (also usable as a decorator).

    ``estimator``: an :class:`AdvantageEstimator` subclass, or a function ``fn(inputs, config)``
    returning advantages (or ``(advantages, returns)``) as ``(B, T)`` tensors — see
    :class:`AdvantageInputs` for per-turn helpers. For a function the keywords describe it: the
    ``credit`` choices it honours (None: it does not read ``config.credit``), whether it needs a critic's
    values (``inputs.values``) or groups, and the settings dataclasses it reads with their defaults.
    """
    def wrap(fn: Callable) -> type:
        def call(self: AdvantageEstimator, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
            out = fn(inputs, self.config)
            return out if isinstance(out, tuple) else (out, torch.zeros_like(out))
        return type(f"{fn.__name__}_advantage", (AdvantageEstimator,), {
            "__call__": call, "__doc__": fn.__doc__, "credits": credits, "critic": critic,
            "needs_groups": needs_groups, "settings": tuple(settings), "defaults": dict(defaults or {})})
    return _register_part(ADVANTAGES, name, estimator, AdvantageEstimator, wrap, "advantage estimator", replace)


def register_objective(name: str, objective: type[PolicyObjective] | Callable | None = None, *,
                       on_policy_only: bool = False, settings: tuple[type, ...] = (),
                       defaults: Mapping[str, Any] | None = None, replace: bool = False) -> Any:
    """Register a policy objective under ``name`` (also usable as a decorator).

    ``objective``: a :class:`PolicyObjective` subclass, or a function ``fn(logp, old_logp,
    advantages, mask, config)`` returning the per-token loss (or ``(loss, ratio, clipped)``), all
    ``(B, T)``; ``mask`` marks the trained tokens that have sampling-time log-probs.
    ``on_policy_only``: the term has no importance ratio (one step per batch).
    """
    def wrap(fn: Callable) -> type:
        def call(self: PolicyObjective, logp, old_logp, advantages, ratio_mask):
            out = fn(logp, old_logp, advantages, ratio_mask, self.config)
            if isinstance(out, tuple):
                return out
            return out, torch.exp(logp - old_logp).detach(), torch.zeros_like(logp)
        return type(f"{fn.__name__}_objective", (PolicyObjective,), {
            "__call__": call, "__doc__": fn.__doc__, "on_policy_only": on_policy_only,
            "settings": tuple(settings), "defaults": dict(defaults or {})})
    return _register_part(OBJECTIVES, name, objective, PolicyObjective, wrap, "objective", replace)


def register_learner(name: str, learner: type[Learner] | None = None, *, advantage: str | None = None,
                     objective: str | None = None, config: type | None = None,
                     replace: bool = False) -> Any:
    """Register a learner under ``name``: ``agentgym train algo=NAME`` and ``agentgym compare --algos
    NAME`` accept it (load the module with ``agentgym --import MODULE ...``).

    Either compose one from registered parts — ``register_learner("rloo", advantage="rloo",
    objective="clip")``; its typed config is ``config`` or, by default, :func:`compose_config` of the
    parts (plus :class:`CriticSettings` when the estimator needs a critic) — or register a
    :class:`Learner` subclass (also as a class decorator: ``@register_learner("mine")``).
    Returns the learner class.
    """
    def add(cls: type[Learner]) -> type[Learner]:
        if not (isinstance(cls, type) and issubclass(cls, Learner)):
            raise TypeError(f"register_learner({name!r}, ...) needs a Learner subclass")
        cls.name = _key(name)
        if cls.config_class is None:
            cls.config_class = _composed_config(cls)
        _add(LEARNERS, name, cls, "learner", replace)
        return cls

    if learner is not None or (advantage is None and objective is None):
        if learner is None:
            return add
        return add(learner)
    if advantage is None or objective is None:
        raise ValueError("register_learner needs both advantage= and objective= (or a Learner subclass)")
    adv_cls = _part(ADVANTAGES, advantage, "advantage estimator")
    obj_cls = _part(OBJECTIVES, objective, "objective")
    title = "".join(w.capitalize() for w in _key(name).replace("_", "-").split("-"))
    attrs = {"advantage_name": adv_cls.name, "objective_name": obj_cls.name, "config_class": config,
             "__doc__": f"The {_key(name)!r} learner: advantage {adv_cls.name!r}, objective {obj_cls.name!r}."}
    cls = type(f"{title}Learner", (Learner,), attrs)
    cls.__module__ = __name__
    return add(cls)


def _composed_config(cls: type[Learner]) -> type:
    """The typed config of a learner class that names its parts but no config: its parts' settings."""
    adv_cls = _part(ADVANTAGES, cls.advantage_name, "advantage estimator")
    obj_cls = _part(OBJECTIVES, cls.objective_name, "objective")
    parts = (adv_cls, obj_cls) + ((Critic,) if adv_cls.critic else ())
    return compose_config(f"{cls.__name__.removesuffix('Learner') or 'Learner'}Config", *parts)


def learner_precision(precision: Any, device: torch.device) -> Any:
    """A :class:`~agentgym.precision.Precision` from ``precision`` (one, or ``auto`` / ``fp32`` / ``bf16``);
    None = the library default: bf16 autocast on CUDA, fp32 elsewhere (no probe, so direct library use and
    the numeric parity tests stay fp32 on every CPU)."""
    from agentgym.precision import Precision, resolve_precision
    if isinstance(precision, Precision):
        return precision
    if precision is None:
        return Precision("bf16" if device.type == "cuda" else "fp32", device.type, "default", "library default")
    return resolve_precision(str(precision), device)


def make_learner(name: str, policy: Any, config: Any = None, *, separate_sampler: bool = False,
                 fsdp: bool = False, precision: Any = None) -> Learner:
    """A registered learner (:data:`LEARNERS`) for a trainable policy (``.model``, ``.tokenizer``).

    ``config``: a :class:`LearnerConfig` (the flat user-facing one), the learner's typed config, or
    None for its defaults. ``separate_sampler``: another engine samples the rollouts (see
    ``OptimConfig.old_logprobs``). ``precision``: see :func:`learner_precision`.
    """
    try:
        cls = LEARNERS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown learner {name!r}; choose one of {sorted(LEARNERS)}") from None
    return cls(policy, config, separate_sampler=separate_sampler, fsdp=fsdp, precision=precision)


def learner_needs_groups(name: str) -> bool:
    """Whether the learner ``name`` compares trajectories within groups (so needs ``group_size > 1``)."""
    cls = LEARNERS.get(str(name).lower())
    adv = ADVANTAGES.get(cls.advantage_name) if cls is not None else None
    return bool(adv is not None and adv.needs_groups)


# --------------------------------------------------------------------------- built-in parts and learners

for _cls in (ReturnsAdvantage, GroupAdvantage, LeaveOneOutAdvantage, GAEAdvantage):
    register_advantage(_cls.name, _cls)
for _cls in (ClipObjective, DualClipObjective, ReinforceObjective, GSPOObjective, CISPOObjective):
    register_objective(_cls.name, _cls)

ReinforceConfig = compose_config("ReinforceConfig", ReturnsAdvantage, ReinforceObjective,
                                 doc="REINFORCE: OptimConfig + ReturnSettings (credit turn) + BaselineSettings.")
GRPOConfig = compose_config("GRPOConfig", GroupAdvantage, ClipObjective,
                            doc="GRPO: OptimConfig + ReturnSettings (credit episode) + GroupSettings + ClipSettings.")
RLOOConfig = compose_config("RLOOConfig", LeaveOneOutAdvantage, ClipObjective,
                            doc="RLOO: like GRPOConfig (``group_scale`` is not read).")
GSPOConfig = compose_config("GSPOConfig", GroupAdvantage, GSPOObjective,
                            doc="GSPO: GRPOConfig's settings; clip 3e-4 / 4e-4, seq-mean-token-mean.")
CISPOConfig = compose_config("CISPOConfig", GroupAdvantage, CISPOObjective,
                             doc="CISPO: GRPOConfig's settings; no lower bound (clip_eps=1), clip_eps_high 0.28.")
PPOConfig = compose_config("PPOConfig", GAEAdvantage, ClipObjective, Critic,
                           doc="PPO: OptimConfig + ReturnSettings (credit token) + GAESettings + CriticSettings "
                               "+ ClipSettings.")
DualClipPPOConfig = compose_config("DualClipPPOConfig", GAEAdvantage, DualClipObjective, Critic,
                                   doc="Dual-clip PPO: PPOConfig's settings with dual_clip_c = 3.")


@register_learner("reinforce")
class ReinforceLearner(Learner):
    """REINFORCE on transitions: each turn's discounted return-to-go minus a baseline (none, batch
    mean, moving average) or normalised over the batch (ReBN, GEM's default), on that turn's tokens;
    one on-policy optimizer step per batch with ``-A · log p`` (``epochs`` and ``minibatch_size`` do
    not apply; micro-batching does)."""
    advantage_name, objective_name, config_class = "returns", "reinforce", ReinforceConfig


@register_learner("grpo")
class GRPOLearner(Learner):
    """GRPO: each trajectory's return normalised within its group (``group_id``: same task), the same
    advantage on all its policy tokens (``credit="turn"`` / ``"gigpo"``: per-turn credit); clipped ratio
    loss, ``epochs`` inner iterations, KL to the reference in the loss (``kl_coef`` > 0). Dr.GRPO:
    ``group_scale=False`` with ``loss_agg="seq-mean-token-sum"``."""
    advantage_name, objective_name, config_class = "group", "clip", GRPOConfig


@register_learner("ppo")
class PPOLearner(Learner):
    """PPO with a learned value function and GAE (token-level by default, ``credit="turn"`` for one step
    per turn); critic: a head on the policy's last hidden state or a separate network
    (``critic="model"``) with its own lr; ``epochs`` passes over shuffled minibatches, clipped policy
    and value losses, advantages whitened over the batch."""
    advantage_name, objective_name, config_class = "gae", "clip", PPOConfig


register_learner("rloo", advantage="rloo", objective="clip", config=RLOOConfig)
register_learner("gspo", advantage="group", objective="gspo", config=GSPOConfig)
register_learner("cispo", advantage="group", objective="cispo", config=CISPOConfig)
register_learner("dual-clip-ppo", advantage="gae", objective="dual-clip", config=DualClipPPOConfig)
