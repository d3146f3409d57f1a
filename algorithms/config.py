"""The training run's config tree: :class:`TrainConfig` (every setting ``agentgym train`` takes) with
its sections, and the RL learners' configs — :class:`UpdateConfig` (the shared optimizer config plus
the update loop's settings), each learner's typed config composed from its parts' settings, and the
flat :class:`LearnerConfig` users write as the ``learner:`` section.

Every knob has a default and a one-line help (``field(metadata={"help": ...})``, TRL's way);
:func:`agentgym.app.knobs.describe_configs` lists them (``agentgym config [train|sft|dpo|eval]``). What lives elsewhere,
and why: a part's own settings block sits beside the part that reads it (below), the one
:class:`~agentgym.rollout_config.RolloutConfig` in the kernel (eval and SFT/DPO nest it too), the
optimizer in :mod:`.optim` (shared with SFT/DPO), and SFT/DPO's run configs in :mod:`.offline`.

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
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import torch

from agentgym.policy import SamplingParams
from agentgym.precision import check_precision
from agentgym.rollout_config import ROLLOUT_ALIASES, RolloutConfig, RolloutViews

from agentgym.algorithms.advantages import (ADVANTAGES, BASELINES, BaselineSettings, GAESettings, GroupSettings,
                                            ReturnSettings)
from agentgym.algorithms.critic import Critic, CriticSettings
from agentgym.algorithms.group_filter import GroupFilterConfig
from agentgym.algorithms.health import HealthConfig
from agentgym.algorithms.losses import KL_ESTIMATORS, LOSS_AGG_MODES, LossSettings
from agentgym.algorithms.objectives import OBJECTIVES, ClipSettings
from agentgym.algorithms.optim import LoraSettings, OptimConfig, check_optim
from agentgym.algorithms.returns import CREDITS

__all__ = ["ALGORITHM_DEFAULTS", "UpdateConfig", "LearnerConfig", "compose_config", "resolve_config",
           "composed_config", "check_token_kinds", "check_temperature", "TrainConfig", "EvalConfig", "torch_dtype"]

#: Settings whose ``None`` in :class:`LearnerConfig` means "the algorithm's default" (the typed
#: config's), because built-in algorithms default them differently.
ALGORITHM_DEFAULTS = frozenset({"clip_eps", "clip_eps_high", "dual_clip_c", "loss_agg", "credit"})


@dataclass
class UpdateConfig(OptimConfig):
    """What every learner shares: :class:`~agentgym.algorithms.optim.OptimConfig` (AdamW, warmup,
    schedule, clipping) plus the update loop's settings; a learner's typed config adds its parts'.
    Every field has a one-line help; three need more.

    ``temperature``: None (default) = the temperature the trajectories were sampled at
    (``Trajectory.temperature``, set by the rollout engine from its one ``RolloutConfig``); a number is
    only a check (:func:`check_temperature`), since ratios against log-probs of another temperature
    would be biased.

    ``old_logprobs``: ``sampler`` (the ratio's old log-probs are the sampling-time ones: exact when the
    policy samples with the module being trained), ``recompute`` (a no-grad pass of the training model
    before the update, as verl does), or ``auto`` (recompute exactly when the sampler is a separate
    engine such as vLLM, whose kernels and dtypes differ). When recomputing, ``tis_cap`` multiplies each
    token's policy-gradient term by ``min(exp(logp_learner − logp_sampler), tis_cap)`` (truncated
    importance sampling), and every update logs ``sampler_logp_diff_mean`` / ``_max`` / ``_frac``.

    ``micro_batch_tokens``: rows grouped by length so the passes compute little padding (veRL's dynamic
    batch size; ``pad_frac`` in the metrics is the share of padding computed). Precision is not a
    learner setting but the run's (``TrainConfig.precision``).
    """
    total_steps: int | None = field(default=None, metadata={
        "help": "update calls in the run: the unit of warmup_ratio and of a decay; null = the run's steps"})
    micro_batch_size: int = field(default=8, metadata={
        "help": "rows per forward/backward pass (gradient accumulation), >= 1"})
    micro_batch_tokens: int | None = field(default=None, metadata={
        "help": "also cap padded positions (rows x longest) per micro-batch, >= 1; null = off"})
    epochs: int = field(default=1, metadata={
        "help": "passes over each batch of rollouts (PPO epochs); on-policy objectives make one step"})
    minibatch_size: int | None = field(default=None, metadata={
        "help": "trajectories per optimizer step, >= 1; null = the whole batch"})
    loss_agg: str = field(default=LossSettings.loss_agg, metadata={
        "help": "how token losses become one: token-mean, seq-mean-token-mean, seq-mean-token-sum, "
                "seq-mean-token-sum-norm (veRL's modes) or dr-grpo (TRL's dr_grpo)"})
    max_response_tokens: int | None = field(default=None, metadata={
        "help": "the constant divisor of seq-mean-token-sum-norm and dr-grpo; null = the batch's longest response"})
    kl_coef: float = field(default=LossSettings.kl_coef, metadata={
        "help": "weight of the KL to the reference model (>= 0; 0 = no reference)"})
    kl_estimator: str = field(default=LossSettings.kl_estimator, metadata={
        "help": "KL estimator: k1, k2, k3 or low_var_kl"})
    kl_in: str = field(default="loss", metadata={
        "help": "where the KL goes: loss (a term) or reward (subtracted per token)"})
    entropy_coef: float = field(default=LossSettings.entropy_coef, metadata={
        "help": "weight of the entropy bonus"})
    skip_no_signal: bool = field(default=False, metadata={
        "help": "no optimizer step for an update whose advantages are all 0 (every group without signal): "
                "the KL and entropy terms alone would move the weights, and Adam's momentum repeats the last step"})
    temperature: float | None = field(default=None, metadata={
        "help": "log-prob temperature; null = the rollouts' (a number is only checked against it)"})
    mask_env_tokens: bool = field(default=True, metadata={
        "help": "no loss on environment tokens (false: the ablation where they carry loss too)"})
    loss_token_kinds: tuple[str, ...] | None = field(default=None, metadata={
        "help": "train only on tokens of these provenance kinds; null = by mask_env_tokens"})
    old_logprobs: str = field(default="auto", metadata={
        "help": "the ratio's old log-probs: sampler, recompute, or auto (recompute for a separate sampler)"})
    tis_cap: float | None = field(default=None, metadata={
        "help": "truncated importance-sampling cap (>= 1) when recomputing; null = off"})
    divergence_threshold: float = field(default=0.1, metadata={
        "help": "|sampler - learner| log-prob gap counted in sampler_logp_diff_frac"})
    lora: LoraSettings | None = field(default=None, metadata={
        "help": "a LoRA adapter {r, alpha, dropout, target_modules}; null = full fine-tuning"})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "recompute activations in the backward pass (less memory, slower)"})
    seed: int = field(default=0, metadata={"help": "seed of minibatch shuffling (and a LoRA adapter's init)"})

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
    credit: str | None = field(default=None, metadata={
        "help": "how step rewards reach each turn's tokens: episode, turn, gigpo or token; null = the algorithm's"})
    clip_eps: float | None = field(default=None, metadata={
        "help": "the ratio's lower clip 1 - clip_eps (> 0); null = the algorithm's (0.2; GSPO 3e-4)"})
    loss_agg: str | None = field(default=None, metadata={
        "help": "token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm or dr-grpo; "
                "null = the algorithm's (token-mean)"})
    extra: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "settings of parts registered by user modules (learner.extra.my_coef=0.5)"})


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
    helps = {f.name: f.metadata for b in bases for f in dataclasses.fields(b)}
    extra_fields = [(k, types[k], field(default=v, metadata=helps[k])) for k, v in defaults.items()]
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
    from agentgym.trajectory import TOKEN_KINDS
    unknown = sorted(set(kinds) - set(TOKEN_KINDS))
    if unknown:
        raise ValueError(f"learner.loss_token_kinds: unknown token kinds {unknown}; known: {', '.join(TOKEN_KINDS)}")


def check_temperature(learner_temperature: float | None, sampled_temperature: float) -> None:
    """The one check that the learner's log-probs are at the rollouts' temperature: run when a train
    config is built (against ``rollout.sampling``) and by the learner on every batch (against the
    trajectories'). Ratios against log-probs of another temperature would be biased."""
    if learner_temperature is not None and abs(learner_temperature - sampled_temperature) > 1e-9:
        raise ValueError(f"learner.temperature={learner_temperature} but the trajectories are sampled at temperature "
                         f"{sampled_temperature}; leave learner.temperature unset (it follows the rollouts)")


# --------------------------------------------------------------------------- the run's root config

def _train_rollout() -> RolloutConfig:
    """The main job's rollout settings: short answers, a 2k-token context."""
    return RolloutConfig(sampling=SamplingParams(max_new_tokens=48), max_obs_tokens=256, max_context_tokens=2048)


@dataclass
class EvalConfig:
    """The held-out evals of a training run (``eval.*``): greedy (or ``samples`` sampled episodes per
    task), with the run's token layout."""
    every: int = field(default=0, metadata={
        "help": "steps between evals, >= 0 (0: only before and after training)"})
    episodes: int = field(default=16, metadata={"help": "episodes per eval, >= 1"})
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "test"}, metadata={
        "help": "env arguments of the evals (the held-out split)"})
    first_task: int = field(default=0, metadata={
        "help": "index of the first eval task, >= 0: the same tasks at every eval"})
    samples: int = field(default=0, metadata={
        "help": "0: one greedy episode per task; k >= 1: k episodes per task sampled as in training "
                "(rollout.sampling), a task's success the mean of its k (mean@k: what RL optimizes, and "
                "finer per task than greedy's 0/1, which a gain below the argmax leaves unchanged)"})

    def describe(self) -> str:
        """How a held-out task is scored, for logs and reports: ``greedy`` or ``mean of k samples``."""
        return "greedy" if self.samples == 0 else f"mean of {self.samples} sample{'s' * (self.samples > 1)}"

@dataclass
class TrainConfig(RolloutViews):
    """Everything a run needs. Defaults: the README's main job (a short CPU run).

    The default task is ``Math-v0`` at its warm-up level (one operation on numbers up to 20,
    single turn, answer read from ``\\boxed{}``, an "answer is" phrase or the last number): the
    untrained SmolLM2-135M solves about a third of these when sampling, so the rewards inside a
    GRPO group differ and every step has a learning signal. (On ``Arithmetic-v0`` it never writes
    the ``<answer>`` tag, every reward in a group is equal and GRPO's advantages are exactly zero.)
    ``env_kwargs`` holds the default env's arguments: a config that picks another env starts from
    ``{}`` (:func:`~agentgym.config.load_config`). ``rollout``'s short keys (``sampling.*``, ``style``,
    ``max_obs_tokens``, ``max_context_tokens``) are accepted too.
    """
    env: str = field(default="Math-v0", metadata={"help": "registered env id to train on"})
    env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {"kinds": ["arithmetic"], "difficulty": 0, "max_turns": 1},
        metadata={"help": "keyword arguments of the env (the default env's; another env starts from {})",
                  "defaults_belong_to": "env"})
    model: str = field(default="smollm2", metadata={
        "help": "model to train: a catalog name, HF hub id or local path"})
    algo: str = field(default="grpo", metadata={
        "help": "registered learner: grpo, ppo, reinforce, rloo, gspo, cispo, dual-clip-ppo or your own"})
    steps: int = field(default=12, metadata={"help": "training steps (rollouts, then an update), >= 1"})
    groups_per_step: int = field(default=4, metadata={"help": "tasks per step, >= 1"})
    group_size: int = field(default=4, metadata={"help": "episodes per task (a GRPO group), >= 1"})
    seed: int = field(default=0, metadata={"help": "seed of the run (task choice, sampling, init)"})
    rollout: RolloutConfig = field(default_factory=_train_rollout, metadata={
        "help": "sampling and token layout of rollouts; evals use it greedily"})
    learner: LearnerConfig = field(default_factory=lambda: LearnerConfig(lr=1e-5, micro_batch_size=4), metadata={
        "help": "the learner: optimizer, update loop, loss and its parts' settings"})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "held-out evals during training"})
    checkpoint_every: int = field(default=4, metadata={
        "help": "steps between checkpoints, >= 0 (0: only the final); only the newest keeps --resume's state"})
    keep_checkpoints: int = field(default=1, metadata={"help": "checkpoints kept on disk, >= 1"})
    output_dir: str = field(default="runs/train", metadata={
        "help": "run directory; a run never overwrites another run's"})
    tensorboard: bool = field(default=True, metadata={"help": "also write TensorBoard event files"})
    device: str | None = field(default=None, metadata={"help": "torch device; null = cuda when available, else cpu"})
    backend: str | None = field(default=None, metadata={
        "help": "generation backend: hf (in place) or vllm (synced after every update); null = vllm on CUDA, else hf"})
    backend_options: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "options of that backend (hf: reuse_kv, attn_implementation, ...; vllm: vllm.LLM arguments)"})
    fsdp: bool = field(default=False, metadata={
        "help": "under torchrun on CUDA: shard the trained model with FSDP2 (needs backend=vllm)"})
    rollout_workers: int = field(default=0, metadata={
        "help": "generation engines as Ray actors (weights pushed after every update), >= 0; 0 = none"})
    weight_transfer: str = field(default="auto", metadata={
        "help": "how weights reach those workers: auto, collective or object_store"})
    dtype: str | None = field(default=None, metadata={
        "help": "weights' torch dtype (float32: fp32 master weights); null = bf16 on CUDA, fp32 on CPU"})
    precision: str = field(default="auto", metadata={
        "help": "compute precision: auto (bf16 on CUDA; on CPU a cached probe decides), fp32 or bf16"})
    max_staleness: int = field(default=0, metadata={
        "help": "updates the sampler's weights may lag (overlapped generation), >= 0; 0 = on-policy"})
    health: HealthConfig = field(default_factory=HealthConfig, metadata={
        "help": "training-health alarms (entropy / length / action-rate collapse, groups without signal)"})
    group_filter: GroupFilterConfig = field(default_factory=GroupFilterConfig, metadata={
        "help": "more signal per episode: DAPO dynamic sampling and difficulty filtering (docs/training.md); off"})

    config_aliases: ClassVar[dict[str, str]] = ROLLOUT_ALIASES
    #: keys that change how a run is computed or where it is written, not what it learns: a finished or
    #: checkpointed run recorded with other values is still this config's run (``compare --resume``, the
    #: Search-R1 study's ``--resume``), so that e.g. a smaller micro-batch after an out-of-memory, or a
    #: token budget that cuts the padding, continues a study. Micro-batching gives the same update up to
    #: the order of float sums: the loss is normalised by the whole minibatch (tests/test_micro_batches.py).
    RESULT_NEUTRAL: ClassVar[frozenset[str]] = frozenset({
        "output_dir", "tensorboard", "checkpoint_every", "keep_checkpoints",
        "learner.micro_batch_size", "learner.micro_batch_tokens"})

    def __post_init__(self) -> None:
        if isinstance(self.rollout, dict):
            self.rollout = RolloutConfig(**self.rollout)
        self._check_counts()
        if self.dtype is not None:
            torch_dtype(self.dtype)
        check_precision(self.precision)
        from agentgym.policies.ray_pool import check_weight_transfer
        check_weight_transfer(self.weight_transfer)
        if not isinstance(self.backend_options, dict):
            raise ValueError(f"backend_options must be a mapping, got {self.backend_options!r}")
        from agentgym.policies.registry import check_backend
        check_backend(self.backend, self.backend_options)   # a registered name, and options it takes
        check_temperature(self.learner.temperature, self.rollout.sampling.logprob_temperature)

    def _check_counts(self) -> None:
        for name in ("steps", "groups_per_step", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0: only the final checkpoint), got {self.checkpoint_every}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.eval.every < 0 or self.eval.first_task < 0 or self.eval.samples < 0 or self.eval.episodes < 1:
            raise ValueError("eval.every, eval.first_task and eval.samples must be >= 0, eval.episodes >= 1")
        if not self.output_dir:
            raise ValueError("output_dir must not be empty")
        if self.rollout_workers < 0:
            raise ValueError(f"rollout_workers must be >= 0, got {self.rollout_workers}")
        if not isinstance(self.max_staleness, int) or isinstance(self.max_staleness, bool) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0 (0: on-policy), got {self.max_staleness!r}")


def torch_dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must name a torch dtype (float32, bfloat16, float16), got {name!r}")
    return dtype
