"""REINFORCE, PPO and GRPO learners on token-level trajectories.

Usage (the trainer loop's whole contact with this module)::

    learner = make_learner("grpo", policy, LearnerConfig(lr=1e-6, kl_coef=0.04))
    batch = engine.collect("agentgym/SearchQA-v0", num_groups=8, group_size=5, seed=step)
    metrics = learner.update(batch.trajectories)      # the policy's own module is trained in place

One update: collate the trajectories (:mod:`.batch`); with no gradient, compute what the
advantages need (reference log-probs when ``kl_coef > 0``, value estimates for PPO); turn the
token rewards (minus ``kl_coef · KL`` when ``kl_in="reward"``) into per-token advantages — the
only step where the three learners differ — then run ``epochs`` passes over minibatches, each one
optimizer step accumulated over micro-batches, with the shared loss
(:func:`~agentgym.algorithms.losses.ppo_objective`).

Shared machinery: AdamW (no weight decay on biases and norms), warmup + constant/linear/cosine
schedule stepped once per ``update`` (so ``total_steps`` counts updates, as verl does), gradient
clipping, gradient accumulation, LoRA through ``peft`` (the reference model is then the same
network with the adapter disabled), gradient checkpointing, bf16 autocast on CUDA (fp32 on CPU).
A minibatch whose loss or gradient norm is not finite is skipped: no optimizer step, weights and
optimizer state untouched, counted in ``metrics["skipped"]``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from agentgym.trajectory import Trajectory

from agentgym.algorithms.advantages import (broadcast_to_tokens, discounted_returns, gae, group_normalize,
                                            make_baseline, rebn)
from agentgym.algorithms.batch import Batch, collate, pad_token_lists
from agentgym.algorithms.losses import (KL_ESTIMATORS, LOSS_AGG_MODES, LossSettings, kl_penalty, masked_mean,
                                        masked_whiten, ppo_objective, token_logprobs)

__all__ = ["LoraSettings", "LearnerConfig", "lr_factor", "Learner", "ReinforceLearner", "PPOLearner", "GRPOLearner",
           "ValueModel", "LEARNERS", "make_learner"]

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


@dataclass
class LearnerConfig:
    """Every learner setting (one dataclass, loadable from YAML through :meth:`from_dict`).

    Optimisation: ``lr``, ``betas``, ``weight_decay`` (AdamW); ``warmup_steps`` or
    ``warmup_ratio`` × ``total_steps`` (Search-R1: 0.285), then ``schedule``; ``total_steps`` counts
    ``update`` calls. ``max_grad_norm`` (None = no clipping). ``micro_batch_size``: rows per
    forward/backward (gradient accumulation); ``minibatch_size``: trajectories per optimizer step
    (None = the whole batch); ``epochs``: passes over the batch (PPO epochs, GRPO iterations;
    REINFORCE always makes one on-policy step).

    Loss: ``clip_eps`` / ``clip_eps_high`` (clip-higher; None = symmetric); ``loss_agg`` (see
    :func:`~agentgym.algorithms.losses.aggregate`); ``max_response_tokens``: the constant of
    ``seq-mean-token-sum`` (None: the longest response of the update's batch); ``kl_coef`` with
    ``kl_estimator`` (k1, k2, k3, low_var_kl) either in the loss or subtracted from the rewards
    (``kl_in``); ``entropy_coef``; ``temperature``: None (default) = the temperature the trajectories
    were sampled at (``Trajectory.temperature``, set by the rollout engine from its one
    ``RolloutConfig``); a number is only a check — an update on trajectories sampled at another
    temperature is refused, since ratios against their log-probs would be biased;
    ``mask_env_tokens`` (False: the ablation where environment tokens carry loss too).

    Advantages: ``gamma``, ``lam`` (PPO's GAE); REINFORCE's ``baseline`` (none, mean, ema, rebn)
    and ``baseline_momentum``; GRPO's ``group_scale`` (False = Dr.GRPO, no std division); PPO's
    ``whiten_advantages``; ``adv_eps``.

    PPO critic: ``critic="head"`` (a linear head on the policy's last hidden state, attached as
    owned by the learner) or ``"model"`` (a separate copy of the network with its own head);
    ``critic_lr`` (None = ``lr``), ``critic_warmup_ratio`` (the critic's own warmup share of
    ``total_steps``; None = the actor's warmup; Search-R1: 0.015 against the actor's 0.285),
    ``value_coef``, ``value_clip_eps`` (None = no clipping).

    Off-policy safety: ``old_logprobs`` — ``sampler`` (the ratio's old log-probs are the sampling-time
    ones: exact when the policy samples with the module being trained), ``recompute`` (a no-grad pass
    of the training model before the update, as verl does), or ``auto`` (recompute exactly when the
    sampler is a separate engine such as vLLM, whose kernels and dtypes differ). When recomputing,
    ``tis_cap`` (None = off) multiplies each token's policy-gradient term by
    ``min(exp(logp_learner − logp_sampler), tis_cap)`` (truncated importance sampling), and every update
    logs the sampler-vs-learner divergence: ``sampler_logp_diff_mean`` / ``_max`` (|Δlogp|) and
    ``sampler_logp_diff_frac`` (share of tokens over ``divergence_threshold``).

    System: ``lora`` (None = full fine-tuning), ``gradient_checkpointing``, ``bf16`` (autocast on
    CUDA; CPU always runs fp32), ``seed`` (minibatch shuffling).
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
    epochs: int = 1
    minibatch_size: int | None = None
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    loss_agg: str = "token-mean"
    max_response_tokens: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in: str = "loss"
    entropy_coef: float = 0.0
    temperature: float | None = None
    gamma: float = 1.0
    lam: float = 1.0
    baseline: str = "rebn"
    baseline_momentum: float = 0.9
    group_scale: bool = True
    whiten_advantages: bool = True
    adv_eps: float = 1e-6
    mask_env_tokens: bool = True
    critic: str = "head"
    critic_lr: float | None = None
    critic_warmup_ratio: float | None = None
    value_coef: float = 0.5
    value_clip_eps: float | None = 0.2
    old_logprobs: str = "auto"
    tis_cap: float | None = None
    divergence_threshold: float = 0.1
    lora: LoraSettings | None = None
    gradient_checkpointing: bool = False
    bf16: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        choices = {"schedule": SCHEDULES, "loss_agg": LOSS_AGG_MODES, "kl_estimator": KL_ESTIMATORS,
                   "kl_in": ("loss", "reward"), "baseline": BASELINES, "critic": ("head", "model"),
                   "old_logprobs": ("auto", "sampler", "recompute")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("micro_batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1 or None, got {self.minibatch_size}")
        if not math.isfinite(self.lr) or self.lr < 0:
            raise ValueError(f"lr must be a finite number >= 0, got {self.lr}")
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be > 0 or None (the rollouts'), got {self.temperature}")
        if not 0 <= self.warmup_ratio <= 1:
            raise ValueError(f"warmup_ratio must be in [0, 1], got {self.warmup_ratio}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0 or None, got {self.warmup_steps}")
        if self.clip_eps <= 0 or (self.clip_eps_high is not None and self.clip_eps_high <= 0):
            raise ValueError("clip_eps and clip_eps_high must be > 0")
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            raise ValueError(f"gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.tis_cap is not None and not self.tis_cap >= 1:
            raise ValueError(f"tis_cap must be >= 1 or None (off), got {self.tis_cap}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if not 0 <= self.baseline_momentum < 1:
            raise ValueError(f"baseline_momentum must be in [0, 1), got {self.baseline_momentum}")
        if self.critic_warmup_ratio is not None and not 0 <= self.critic_warmup_ratio <= 1:
            raise ValueError(f"critic_warmup_ratio must be in [0, 1] or None, got {self.critic_warmup_ratio}")
        self.betas = tuple(float(b) for b in self.betas)  # YAML gives a list
        if isinstance(self.lora, Mapping):
            self.lora = LoraSettings(**self.lora)
        if self.lora is not None and isinstance(self.lora.target_modules, list):
            self.lora.target_modules = tuple(self.lora.target_modules)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LearnerConfig":
        """From a plain mapping (a YAML section); unknown keys are an error that lists the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown learner settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


# --------------------------------------------------------------------------- the base learner

_SUMMED_STATS = ("policy_loss", "value_loss", "loss")  # already normalised by the minibatch totals


class Learner:
    """Trains ``policy.model`` (a ``transformers`` causal LM) in place from token-level trajectories.

    Subclasses set :attr:`surrogate` and implement :meth:`compute_advantages`; PPO adds a critic.
    The policy's ``generate`` keeps working on the same module, so the next rollout samples from
    the updated weights. With LoRA, ``policy.model`` becomes the ``peft`` model wrapping it (the
    injected adapters live in the original module too).

    :meth:`state_dict` holds the learner's own state (optimizer, scheduler, step, baseline, critic,
    RNG); the policy's weights are the policy's to save.
    """

    name = "learner"
    surrogate = "clip"       # "clip" (ratio clipping) or "reinforce" (-A log p)
    uses_values = False

    def __init__(self, policy: Any, config: LearnerConfig | None = None, *, separate_sampler: bool = False,
                 fsdp: bool = False):
        self.policy = policy
        self.config = cfg = config or LearnerConfig()
        # data-parallel under torchrun (see algorithms/distributed.py): every rank gets the same global
        # batch and computes its share of the micro-batches; None in one process
        from agentgym.algorithms.distributed import current
        self.dist = current()
        self.fsdp = fsdp and self.dist is not None
        # True when another engine (vLLM) samples the rollouts: see ``LearnerConfig.old_logprobs``
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
        self._build_critic(model)
        if cfg.lora is not None and not _is_peft(model):
            # the learner owns the PEFT wrapper; the adapters are injected into the policy's own module,
            # so a colocated policy samples through them without any attribute written onto it
            model = _apply_lora(model, cfg.lora, seed=cfg.seed)
        self.model = model
        self.ref_model = None
        if base_copy is not None:
            self.ref_model = base_copy.eval().requires_grad_(False)
        if cfg.gradient_checkpointing:
            _enable_checkpointing(self.model)
        self.device = next(self.model.parameters()).device
        self.optimizer = _adamw(self._param_groups(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(cfg.warmup_ratio * (cfg.total_steps or 0))
        self.warmup_steps = int(warmup)
        self.critic_warmup_steps = (self.warmup_steps if cfg.critic_warmup_ratio is None
                                    else int(round(cfg.critic_warmup_ratio * (cfg.total_steps or 0))))
        factors = {role: functools.partial(lr_factor, warmup_steps=steps, total_steps=cfg.total_steps,
                                           schedule=cfg.schedule)
                   for role, steps in (("policy", self.warmup_steps), ("critic", self.critic_warmup_steps))}
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, [factors[g["role"]] for g in self.optimizer.param_groups])
        self.step = 0
        self._temperature = cfg.temperature or 1.0

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
        KL penalty included) over the training ``mask``."""
        raise NotImplementedError

    def _build_critic(self, model: nn.Module) -> None:
        """PPO: create the value head / critic model (before LoRA wraps ``model``)."""

    def critic_parameters(self) -> list[nn.Parameter]:
        return []

    def _values(self, micro: Batch, outputs: Any) -> torch.Tensor:
        raise NotImplementedError

    def _epochs_and_minibatch(self, n: int) -> tuple[int, int, bool]:
        """(epochs, minibatch size, shuffle)."""
        return self.config.epochs, self.config.minibatch_size or n, True

    # ------------------------------------------------------------------ public API
    def update(self, trajectories: Sequence[Trajectory] | Any) -> dict[str, float]:
        """One learning step on a batch of trajectories (a list, or anything with ``.trajectories``).

        Metrics: ``loss``, ``policy_loss``, ``kl``, ``entropy``, ``clip_frac``, ``approx_kl``,
        ``grad_norm``, ``lr``, ``tokens`` (loss tokens), ``skipped`` (minibatches skipped for a
        non-finite loss or gradient), ``value_loss`` (PPO), plus ``reward_mean``,
        ``advantage_mean``/``_std``, ``optimizer_steps``, ``dropped`` (trajectories without
        policy tokens) and ``time_s``.
        """
        t0 = time.perf_counter()
        cfg = self.config
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
        mask = batch.train_mask(cfg.mask_env_tokens)
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
        metrics["time_s"] = time.perf_counter() - t0
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "step": self.step, "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": self._rng.get_state(), **self._extra_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("name", self.name) != self.name:
            raise ValueError(f"state of a {state['name']!r} learner cannot load into {self.name!r}")
        self.step = int(state["step"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._rng.set_state(state["rng"])
        self._load_extra_state(state)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        pass

    # ------------------------------------------------------------------ internals
    def _param_groups(self) -> list[dict[str, Any]]:
        cfg = self.config
        groups = []
        for role, params, lr in (("policy", self.policy_parameters(), cfg.lr),
                                 ("critic", self.critic_parameters(), cfg.critic_lr or cfg.lr)):
            decay = [p for p in params if p.ndim >= 2]
            no_decay = [p for p in params if p.ndim < 2]
            # "role" picks the group's warmup (the critic may have its own, ``critic_warmup_ratio``)
            groups += [{"params": decay, "lr": lr, "role": role},
                       {"params": no_decay, "lr": lr, "weight_decay": 0.0, "role": role}]
        return [g for g in groups if g["params"]]

    def _set_training(self, mode: bool) -> None:
        """Train mode while optimising (gradient checkpointing needs it), eval for the no-grad passes."""
        self.model.train(mode)

    def policy_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.device.type == "cuda" and self.config.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

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
        for start in range(0, len(batch), cfg.micro_batch_size):
            rows = range(start, min(start + cfg.micro_batch_size, len(batch)))
            micro = batch.select(rows)
            with self._autocast():
                logp, _ = self._logprobs(self._model_outputs(self.model, micro), micro)
            batch.old_logprobs[start:start + len(rows), :micro.width] = logp.float() * micro.loss_mask
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
        for start in range(0, len(batch), cfg.micro_batch_size):
            rows = range(start, min(start + cfg.micro_batch_size, len(batch)))
            micro = batch.select(rows)
            w = micro.width
            with self._autocast():
                if self._has_reference:
                    out = self._reference_outputs(micro)
                    ref, _ = self._logprobs(out, micro)
                    batch.ref_logprobs[start:start + len(rows), :w] = ref * micro.attention_mask
                if self.uses_values:
                    values = self._values(micro, None)
                    batch.old_values[start:start + len(rows), :w] = values.float() * micro.response_mask

    def _loss_settings(self, batch: Batch) -> LossSettings:
        cfg = self.config
        max_len = cfg.max_response_tokens or float(batch.train_mask(cfg.mask_env_tokens).sum(1).max())
        return LossSettings(surrogate=self.surrogate, clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high,
                            loss_agg=cfg.loss_agg, max_len=max_len,
                            kl_coef=cfg.kl_coef if cfg.kl_in == "loss" else 0.0, kl_estimator=cfg.kl_estimator,
                            entropy_coef=cfg.entropy_coef, value_coef=cfg.value_coef,
                            value_clip_eps=cfg.value_clip_eps)

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
        mb_mask = mb.train_mask(cfg.mask_env_tokens)
        num_tokens, num_seqs = float(mb_mask.sum()), float(len(mb))
        losses: dict[str, float] = {}
        token_stats: dict[str, float] = {}
        micros: list[Batch | None] = list(mb.micro_batches(cfg.micro_batch_size))
        scale = 1.0
        if self.dist is not None:  # this rank's share (round-robin); the loss is normalised globally
            micros = micros[self.dist.rank::self.dist.world_size]
            if self.fsdp:  # FSDP averages gradients and needs the same number of passes on every rank
                rounds = -(-len(list(mb.micro_batches(cfg.micro_batch_size))) // self.dist.world_size)
                micros = micros + [None] * (rounds - len(micros))
                scale = float(self.dist.world_size)
        finite = True
        self.optimizer.zero_grad(set_to_none=True)
        try:
            for micro in micros:
                if micro is None:  # FSDP padding: a zero-weight pass on the first rows
                    pad = mb.select([0])
                    with self._autocast():
                        out = self._model_outputs(self.model, pad)
                    (out.logits.sum() * 0.0).backward()
                    continue
                mask = micro.train_mask(cfg.mask_env_tokens)
                with self._autocast():
                    out = self._model_outputs(self.model, micro, hidden=self.uses_values and cfg.critic == "head")
                    logp, entropy = self._logprobs(out, micro, entropy=True)
                    values = self._values(micro, out).float() if self.uses_values else None
                loss, st = ppo_objective(
                    logp, micro.old_logprobs, micro.advantages, mask, settings, sampled_mask=micro.loss_mask,
                    entropy=entropy, ref_logp=micro.ref_logprobs if self._has_reference else None,
                    values=values, old_values=micro.old_values if values is not None else None,
                    returns=micro.returns if values is not None else None, num_tokens=num_tokens, num_seqs=num_seqs,
                    is_weights=micro.is_weights if cfg.tis_cap is not None else None)
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
                managed = {id(p) for p in self.model.parameters()} if self.fsdp else set()
                all_reduce_gradients([p for p in self.policy_parameters() + self.critic_parameters()
                                      if id(p) not in managed], self.dist)
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
                norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm)))
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


# --------------------------------------------------------------------------- REINFORCE

class ReinforceLearner(Learner):
    """REINFORCE on transitions: each turn's discounted return-to-go minus a baseline (none, batch
    mean, moving average) or normalised over the batch (ReBN, GEM's default), on that turn's tokens.

    One on-policy optimizer step per batch with the plain ``-A · log p`` loss (``epochs`` and
    ``minibatch_size`` do not apply; micro-batching does).
    """

    name = "reinforce"
    surrogate = "reinforce"

    def __init__(self, policy: Any, config: LearnerConfig | None = None, **kwargs: Any):
        super().__init__(policy, config, **kwargs)
        self.baseline = None if self.config.baseline == "rebn" else make_baseline(self.config.baseline,
                                                                                 self.config.baseline_momentum)

    def _epochs_and_minibatch(self, n: int) -> tuple[int, int, bool]:
        return 1, n, False

    def compute_advantages(self, trajectories: Sequence[Trajectory], batch: Batch, rewards: torch.Tensor,
                           mask: torch.Tensor) -> None:
        cfg = self.config
        rows = rewards.detach().cpu().tolist()
        returns: list[list[float]] = []
        for traj, row in zip(trajectories, rows):
            # a turn's reward: its tokens' rewards and those of the env tokens after it (KL in reward)
            starts = [s for s, _ in traj.turn_spans] + [len(traj.token_ids)]
            turn_rewards = [sum(row[starts[k]:starts[k + 1]]) for k in range(len(traj.turn_spans))]
            returns.append(discounted_returns(turn_rewards, cfg.gamma))
        flat = [g for r in returns for g in r]
        if self.baseline is None:
            flat_adv = rebn(flat, cfg.adv_eps)
        else:
            b = self.baseline(flat)
            flat_adv = [g - b for g in flat]
        adv_rows, ret_rows, i = [], [], 0
        for traj, r in zip(trajectories, returns):
            adv = flat_adv[i:i + len(r)]
            i += len(r)
            n = len(traj.token_ids)
            adv_rows.append(broadcast_to_tokens(traj.turn_spans, adv, n, fill_env=not cfg.mask_env_tokens))
            ret_rows.append(broadcast_to_tokens(traj.turn_spans, r, n, fill_env=not cfg.mask_env_tokens))
        batch.advantages = pad_token_lists(adv_rows, batch.width).to(batch.input_ids.device) * mask
        batch.returns = pad_token_lists(ret_rows, batch.width).to(batch.input_ids.device) * mask

    def _extra_state(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict() if self.baseline is not None else {}}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        if self.baseline is not None:
            self.baseline.load_state_dict(state.get("baseline", {}))


# --------------------------------------------------------------------------- GRPO

class GRPOLearner(Learner):
    """GRPO: each trajectory's total reward normalised within its group (``group_id``: same task),
    the same advantage on all its policy tokens; clipped ratio loss, ``epochs`` inner iterations,
    KL to the reference in the loss (k3 by default; set ``kl_coef`` > 0 to use it). Dr.GRPO:
    ``group_scale=False`` with ``loss_agg="seq-mean-token-sum"``.
    """

    name = "grpo"

    def compute_advantages(self, trajectories: Sequence[Trajectory], batch: Batch, rewards: torch.Tensor,
                           mask: torch.Tensor) -> None:
        groups = [t.group_id for t in trajectories]
        counts: dict[Any, int] = {}
        for g in groups:
            if g is not None:
                counts[g] = counts.get(g, 0) + 1
        if not any(c > 1 for c in counts.values()):
            raise ValueError("GRPO needs groups of trajectories on the same task: collect with group_size > 1")
        totals = rewards.sum(1).detach().cpu().tolist()
        adv = group_normalize(totals, groups, scale=self.config.group_scale, eps=self.config.adv_eps)
        dev = batch.input_ids.device
        batch.advantages = torch.tensor(adv, dtype=torch.float32, device=dev)[:, None] * mask
        batch.returns = torch.tensor(totals, dtype=torch.float32, device=dev)[:, None] * mask


# --------------------------------------------------------------------------- PPO

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


class PPOLearner(Learner):
    """PPO with a learned value function and token-level GAE over the policy tokens (env tokens skipped).

    Critic: a linear head on the policy's last hidden state (``policy.value_head``; the value loss
    also trains the shared body) or a separate copy of the network (``critic="model"``), with its
    own lr (``critic_lr``). ``epochs`` passes over shuffled minibatches, clipped policy and value
    losses, advantages whitened over the batch (``whiten_advantages``).
    """

    name = "ppo"
    uses_values = True

    def _build_critic(self, model: nn.Module) -> None:
        device = next(model.parameters()).device
        self.critic: ValueModel | None = None
        if self.config.critic == "model":
            self.critic = ValueModel(copy.deepcopy(model)).to(device)
            self.critic.requires_grad_(True)
            self.value_head = self.critic.head
        else:
            self.value_head = _value_head(model.config.hidden_size).to(device)

    def _set_training(self, mode: bool) -> None:
        super()._set_training(mode)
        if self.critic is not None:
            self.critic.train(mode)

    def critic_parameters(self) -> list[nn.Parameter]:
        module = self.critic if self.critic is not None else self.value_head
        return [p for p in module.parameters() if p.requires_grad]

    def _values(self, micro: Batch, outputs: Any) -> torch.Tensor:
        if self.critic is not None:
            return self.critic(micro.input_ids, micro.attention_mask, micro.position_ids)
        if outputs is None:
            outputs = self._model_outputs(self.model, micro, hidden=True, logits=False)
        return _aligned_values(self.value_head, outputs.hidden_states[-1])

    def compute_advantages(self, trajectories: Sequence[Trajectory], batch: Batch, rewards: torch.Tensor,
                           mask: torch.Tensor) -> None:
        cfg = self.config
        adv, ret = gae(rewards, batch.old_values, mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            adv = masked_whiten(adv, mask)
        batch.advantages, batch.returns = adv * mask, ret * mask

    def _extra_state(self) -> dict[str, Any]:
        module = self.critic if self.critic is not None else self.value_head
        return {"critic": {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        module = self.critic if self.critic is not None else self.value_head
        module.load_state_dict(state["critic"])


# --------------------------------------------------------------------------- factory

LEARNERS: dict[str, type[Learner]] = {"reinforce": ReinforceLearner, "ppo": PPOLearner, "grpo": GRPOLearner}


def make_learner(name: str, policy: Any, config: LearnerConfig | None = None, *,
                 separate_sampler: bool = False, fsdp: bool = False) -> Learner:
    """``reinforce`` | ``ppo`` | ``grpo`` learner for a trainable policy (``.model``, ``.tokenizer``).
    ``separate_sampler``: another engine samples the rollouts (see ``LearnerConfig.old_logprobs``)."""
    try:
        cls = LEARNERS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown learner {name!r}; choose one of {sorted(LEARNERS)}") from None
    return cls(policy, config, separate_sampler=separate_sampler, fsdp=fsdp)
