"""The RL learners' configs: :class:`UpdateConfig` (the shared optimizer config plus the update
loop's settings), each learner's typed config composed from its parts' settings, and the flat
:class:`LearnerConfig` users write as the ``learner:`` section.

Each registered part declares the settings it reads as a small dataclass beside it, with its own
defaults (:class:`~agentgym.algorithms.advantages.ReturnSettings`,
:class:`~agentgym.algorithms.objectives.ClipSettings`, :class:`~agentgym.algorithms.critic.CriticSettings`,
…); a learner's typed config (``GRPOConfig``, ``GSPOConfig``, …) is ``UpdateConfig`` + its parts'
settings (:func:`compose_config`). Users keep writing one flat ``learner:`` section:
:class:`LearnerConfig` has every built-in key, and :func:`resolve_config` turns it into the
algorithm's typed config — a key left at ``None`` where documented as "the algorithm's default" takes
the typed config's default (GSPO's clip range is 3e-4 / 4e-4, PPO's 0.2); settings of parts
registered by user modules go under ``learner.extra``. Every config is checked once, on construction.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from agentgym.algorithms.advantages import (ADVANTAGES, BASELINES, BaselineSettings, GAESettings, GroupSettings,
                                            ReturnSettings)
from agentgym.algorithms.batch import Batch
from agentgym.algorithms.critic import Critic, CriticSettings
from agentgym.algorithms.losses import KL_ESTIMATORS, LOSS_AGG_MODES, LossSettings
from agentgym.algorithms.objectives import OBJECTIVES, ClipSettings
from agentgym.algorithms.optim import LoraSettings, OptimConfig, check_optim
from agentgym.algorithms.returns import CREDITS

__all__ = ["ALGORITHM_DEFAULTS", "UpdateConfig", "LearnerConfig", "compose_config", "resolve_config",
           "composed_config", "check_token_kinds"]

#: Settings whose ``None`` in :class:`LearnerConfig` means "the algorithm's default" (the typed
#: config's), because built-in algorithms default them differently.
ALGORITHM_DEFAULTS = frozenset({"clip_eps", "clip_eps_high", "dual_clip_c", "loss_agg", "credit"})


@dataclass
class UpdateConfig(OptimConfig):
    """What every learner shares: :class:`~agentgym.algorithms.optim.OptimConfig` (AdamW, warmup,
    schedule, clipping) plus the update loop's settings; a learner's typed config adds its parts'.

    Schedule: ``total_steps`` counts ``update`` calls (the warmup ratio's and a decay's unit; Search-R1:
    ``warmup_ratio=0.285``). Batching: ``micro_batch_size``: rows per forward/backward (gradient
    accumulation); ``micro_batch_tokens`` (None = off): also a budget of padded positions (rows ×
    longest) per micro-batch, rows grouped by length so the passes compute little padding (veRL's
    dynamic batch size; ``pad_frac`` in the metrics is the share of padding computed);
    ``minibatch_size``: trajectories per optimizer step (None = the whole batch); ``epochs``: passes
    over each batch of rollouts (PPO epochs, GRPO iterations; an on-policy objective such as
    REINFORCE's always makes one step).

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
    :func:`~agentgym.algorithms.learner.make_learner` as ``precision=``.
    """
    total_steps: int | None = None
    micro_batch_size: int = 8
    micro_batch_tokens: int | None = None
    epochs: int = 1
    minibatch_size: int | None = None
    loss_agg: str = LossSettings.loss_agg
    max_response_tokens: int | None = None
    kl_coef: float = LossSettings.kl_coef
    kl_estimator: str = LossSettings.kl_estimator
    kl_in: str = "loss"
    entropy_coef: float = LossSettings.entropy_coef
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
        check_optim(self)
        _check_choices(self)
        _check_numbers(self)
        _normalise(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "UpdateConfig":
        """From a plain mapping (a YAML section) through the one config loader
        (:func:`agentgym.config.from_dict`); unknown keys are an error that lists the known ones."""
        from agentgym.config import from_dict
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown learner settings {sorted(unknown)}; known: {sorted(known)}")
        return from_dict(cls, d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class LearnerConfig(ReturnSettings, BaselineSettings, GroupSettings, GAESettings, CriticSettings, ClipSettings,
                    UpdateConfig):
    """Every learner setting in one flat dataclass — the ``learner:`` section of a YAML config.

    :class:`UpdateConfig`'s fields (:class:`~agentgym.algorithms.optim.OptimConfig`'s among them), plus
    those of every built-in part: :class:`ClipSettings` (``clip_eps``, ``clip_eps_high``, ``dual_clip_c``),
    :class:`ReturnSettings` (``credit``, ``gamma``, ``adv_eps``), :class:`BaselineSettings` (``baseline``, ``baseline_momentum``),
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
    "loss_agg": LOSS_AGG_MODES, "kl_estimator": KL_ESTIMATORS, "kl_in": ("loss", "reward"),
    "baseline": BASELINES, "critic": ("head", "model"), "old_logprobs": ("auto", "sampler", "recompute"),
    "credit": CREDITS,
}


def _flat(cfg: Any) -> bool:
    return isinstance(cfg, LearnerConfig)


def _value(cfg: Any, name: str) -> Any:
    return getattr(cfg, name, None)


def _check_choices(cfg: Any) -> None:
    """Named choices; in the flat config ``None`` for :data:`ALGORITHM_DEFAULTS` keys means "the algorithm's"."""
    has = {f.name for f in dataclasses.fields(cfg)}
    for name, allowed in _CHOICES.items():
        if name in has and not (_value(cfg, name) is None and _flat(cfg) and name in ALGORITHM_DEFAULTS):
            if _value(cfg, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {_value(cfg, name)!r}")
    if "clip_eps" in has and cfg.clip_eps is None and not _flat(cfg):
        raise ValueError("clip_eps must be a number")


def _check_numbers(cfg: Any) -> None:
    def v(name: str) -> Any:
        return _value(cfg, name)

    for name in ("micro_batch_size", "epochs"):
        if v(name) < 1:
            raise ValueError(f"{name} must be >= 1, got {v(name)}")
    for name in ("micro_batch_tokens", "minibatch_size"):
        if v(name) is not None and v(name) < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {v(name)}")
    t = v("temperature")
    if t is not None and not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be > 0 or None (the rollouts'), got {t}")
    if any(v(name) is not None and v(name) <= 0 for name in ("clip_eps", "clip_eps_high")):
        raise ValueError("clip_eps and clip_eps_high must be > 0")
    if v("dual_clip_c") is not None and not v("dual_clip_c") > 1:
        raise ValueError(f"dual_clip_c must be > 1 or None (off), got {v('dual_clip_c')}")
    for name in ("gamma", "lam"):
        if v(name) is not None and not 0 <= v(name) <= 1:
            raise ValueError(f"gamma and lam must be in [0, 1], got {name}={v(name)}")
    if cfg.kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {cfg.kl_coef}")
    if cfg.tis_cap is not None and not cfg.tis_cap >= 1:
        raise ValueError(f"tis_cap must be >= 1 or None (off), got {cfg.tis_cap}")
    if v("baseline_momentum") is not None and not 0 <= cfg.baseline_momentum < 1:
        raise ValueError(f"baseline_momentum must be in [0, 1), got {cfg.baseline_momentum}")
    if v("critic_warmup_ratio") is not None and not 0 <= cfg.critic_warmup_ratio <= 1:
        raise ValueError(f"critic_warmup_ratio must be in [0, 1] or None, got {cfg.critic_warmup_ratio}")
    if v("turn_adv_weight") is not None and not (math.isfinite(cfg.turn_adv_weight) and cfg.turn_adv_weight >= 0):
        raise ValueError(f"turn_adv_weight must be a finite number >= 0, got {cfg.turn_adv_weight}")


def _normalise(cfg: Any) -> None:
    """YAML gives lists: token kinds become a tuple; the flat config's ``extra`` a dict."""
    kinds = cfg.loss_token_kinds
    if kinds is not None:
        kinds = (kinds,) if isinstance(kinds, str) else tuple(str(k) for k in kinds)
        if not kinds:
            raise ValueError("loss_token_kinds must name at least one token kind, or be None")
        cfg.loss_token_kinds = kinds
    if _flat(cfg) and cfg.extra is None:
        cfg.extra = {}


def compose_config(name: str, *parts: type, doc: str | None = None) -> type[UpdateConfig]:
    """A typed config class: :class:`UpdateConfig` plus the settings the ``parts`` declare
    (``part.settings``), with the parts' defaults (``part.defaults``; later parts win)."""
    bases: list[type] = []
    defaults: dict[str, Any] = {}
    for part in parts:
        for s in getattr(part, "settings", ()):
            if s not in bases:
                bases.append(s)
        defaults.update(getattr(part, "defaults", {}))
    bases.append(UpdateConfig)
    types = {f.name: f.type for b in bases for f in dataclasses.fields(b)}
    unknown = set(defaults) - set(types)
    if unknown:
        raise ValueError(f"{name}: defaults for {sorted(unknown)}, which no part's settings declare")
    extra_fields = [(k, types[k], field(default=v)) for k, v in defaults.items()]
    cls = dataclasses.make_dataclass(name, extra_fields, bases=tuple(bases),
                                     namespace={"__doc__": doc or f"{name}: UpdateConfig + its parts' settings."})
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




def composed_config(learner_name: str, advantage: str, objective: str) -> type:
    """The typed config of a learner class that names its parts but no config: its parts' settings
    (plus the critic's when the estimator needs one)."""
    adv_cls = ADVANTAGES.lookup(advantage)
    obj_cls = OBJECTIVES.lookup(objective)
    parts = (adv_cls, obj_cls) + ((Critic,) if adv_cls.critic else ())
    return compose_config(f"{learner_name.removesuffix('Learner') or 'Learner'}Config", *parts)


def check_token_kinds(kinds: Sequence[str]) -> None:
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
