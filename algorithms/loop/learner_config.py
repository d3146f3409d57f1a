"""What every RL learner's config shares: :class:`UpdateConfig`, the update loop's settings and the loss
terms every learner has. Each built-in learner's config (``GRPOConfig``, ``PPOConfig``, … in
:mod:`..catalog`) is a dataclass written in source: ``UpdateConfig`` plus the settings blocks its parts
read (:class:`~agentgym.algorithms.maths.advantages.ReturnSettings`,
:class:`~agentgym.algorithms.maths.losses.ClipSettings`, :class:`~agentgym.algorithms.maths.critic.CriticSettings`,
…). Each knob is a field of exactly one block, with its type, default and help; the optimizer is not a
learner setting (``optim:``, :class:`~agentgym.algorithms.loop.optim.OptimConfig`), nor is LoRA (``lora:``).

**Per-algorithm defaults.** Some algorithms need another default for a knob they share: GSPO clips its
sequence ratio at 3e-4 / 4e-4 and averages per sequence, CISPO bounds its weight at 1.0 / 0.28,
dual-clip PPO turns ``dual_clip_c`` on (3.0), and each estimator has its own ``credit`` (REINFORCE
``turn``, PPO ``token``). Redeclaring the field in the algorithm's class would give the knob a second
declaration (and a second help to keep in step), and a ``None`` meaning "the algorithm's default"
would hide the value a run uses. Instead a learner config lists its own values in the class-level
table ``algorithm_defaults`` (merged along the class's bases), and constructing the class applies it
under the caller's values (:class:`AlgorithmDefaults`, the metaclass of ``UpdateConfig``):
``GSPOConfig()`` has ``clip_eps=3e-4``, ``GSPOConfig(clip_eps=1e-3)`` has 1e-3, and ``agentgym config
train`` lists, per algorithm, the values a run gets. (A dataclass field's own ``default`` stays the
block's: read defaults off an instance, as :func:`agentgym.config.config_fields` does.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from agentgym.algorithms.maths.losses import LossTermSettings

__all__ = ["AlgorithmDefaults", "UpdateConfig", "RENAMED_LEARNER_KEYS", "check_token_kinds", "check_temperature"]

#: ``learner.KEY`` settings that moved out of the learner's config: old key -> its one path now.
RENAMED_LEARNER_KEYS: dict[str, str] = {
    **{k: f"optim.{k}" for k in ("lr", "betas", "weight_decay", "warmup_ratio", "warmup_steps", "schedule",
                                 "max_grad_norm", "gradient_checkpointing")},
    "lora": "lora",
    "extra": "learner.KEY (a registered learner's own settings are fields of its config class)",
}


class AlgorithmDefaults(type):
    """Metaclass of the learner configs: ``Config(**values)`` is built with the class's
    ``algorithm_defaults`` table (merged from its bases, the most derived class winning) under
    ``values``, so that an algorithm's defaults for a shared knob are data of its class, not a second
    declaration of the knob (see the module docstring)."""

    def __call__(cls, *args: Any, **values: Any) -> Any:
        return super().__call__(*args, **{**cls.defaults_table(), **values})

    def defaults_table(cls) -> dict[str, Any]:
        """The class's ``algorithm_defaults``, merged along its bases (the most derived wins)."""
        table: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            table.update(vars(klass).get("algorithm_defaults", {}))
        return table


@dataclass
class UpdateConfig(LossTermSettings, metaclass=AlgorithmDefaults):
    """What every learner shares: the update loop's settings and the loss terms every learner has
    (:class:`~agentgym.algorithms.maths.losses.LossTermSettings`: ``loss_agg``, ``kl_coef``, ``kl_estimator``,
    ``entropy_coef``); a learner's config adds the blocks its parts read. Every field has a one-line
    help; three need more.

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
    micro_batch_size: int = field(default=4, metadata={
        "help": "rows per forward/backward pass (gradient accumulation), >= 1"})
    micro_batch_tokens: int | None = field(default=None, metadata={
        "help": "also cap padded positions (rows x longest) per micro-batch, >= 1; null = off"})
    epochs: int = field(default=1, metadata={
        "help": "passes over each batch of rollouts (PPO epochs); on-policy objectives make one step"})
    minibatch_size: int | None = field(default=None, metadata={
        "help": "trajectories per optimizer step, >= 1; null = the whole batch"})
    max_response_tokens: int | None = field(default=None, metadata={
        "help": "the constant divisor of seq-mean-token-sum-norm and dr-grpo; null = the batch's longest response"})
    kl_in: str = field(default="loss", metadata={
        "help": "where the KL goes: loss (a term) or reward (subtracted per token)"})
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
    seed: int = field(default=0, metadata={"help": "seed of minibatch shuffling (and a LoRA adapter's init)"})

    #: this algorithm's values for knobs declared in a shared block (see :class:`AlgorithmDefaults`)
    algorithm_defaults: ClassVar[Mapping[str, Any]] = {}
    #: former keys of the ``learner:`` section, refused with their new path (:func:`agentgym.config.from_dict`)
    config_renamed: ClassVar[Mapping[str, str]] = RENAMED_LEARNER_KEYS
    #: an unknown key's error names the class (which learner's settings were checked)
    config_named_in_errors: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("micro_batch_tokens", "minibatch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}")
        t = self.temperature
        if t is not None and not (math.isfinite(t) and t > 0):
            raise ValueError(f"temperature must be > 0 or None (the rollouts'), got {t}")
        for name, allowed in (("kl_in", ("loss", "reward")), ("old_logprobs", ("auto", "sampler", "recompute"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.tis_cap is not None and not self.tis_cap >= 1:
            raise ValueError(f"tis_cap must be >= 1 or None (off), got {self.tis_cap}")
        kinds = self.loss_token_kinds
        if kinds is not None:   # YAML gives a list
            kinds = (kinds,) if isinstance(kinds, str) else tuple(str(k) for k in kinds)
            if not kinds:
                raise ValueError("loss_token_kinds must name at least one token kind, or be None")
            self.loss_token_kinds = kinds
        super().__post_init__()


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
