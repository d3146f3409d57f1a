"""The learner: one update loop around a registered advantage estimator and policy objective.

Usage (the trainer loop's whole contact with this module)::

    learner = make_learner("grpo", policy, GRPOConfig(kl_coef=0.04), optim=OptimConfig(lr=1e-6))
    batch = engine.collect("agentgym/SearchQA-v0", num_groups=8, group_size=5, seed=step)
    metrics = learner.update(batch.trajectories)      # the policy's own module is trained in place

**One update** (:meth:`Learner.update`, top to bottom): collate the trajectories (:mod:`.batch`);
with no gradient, compute what the advantages need (old log-probs recomputed when a separate engine
sampled, reference log-probs when ``kl_coef > 0``, value estimates with a critic); turn the token
rewards (minus ``kl_coef · KL`` when ``kl_in="reward"``) into per-token advantages with the estimator
(:mod:`..maths.advantages`); then ``epochs`` passes over minibatches, each one optimizer step accumulated
over micro-batches, with the shared loss (:func:`~agentgym.algorithms.maths.losses.ppo_objective`) around the
objective's term (:mod:`..maths.objectives`). A minibatch whose loss or gradient norm is not finite is
skipped: no optimizer step, weights and optimizer state untouched, counted in ``metrics["skipped"]``.

Shared machinery (:mod:`.optim`): AdamW (no weight decay on biases and norms), warmup +
constant/linear/cosine schedule stepped once per ``update`` (so ``total_steps`` counts updates, as verl
does), gradient clipping, LoRA through ``peft`` (the reference model is then the same network with the
adapter disabled), gradient checkpointing; the run's precision (:mod:`agentgym.precision`: bf16
autocast over fp32 master weights where it is faster); data parallelism under ``torchrun``
(:mod:`.parallel`). The registry of learners and the built-ins are in :mod:`..catalog`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
from typing import Any, ClassVar, Sequence

import torch
from torch import nn

from agentgym.precision import learner_precision
from agentgym.trajectory import Trajectory

from agentgym.algorithms.loop import distributed
from agentgym.algorithms.maths.advantages import ADVANTAGES, AdvantageEstimator, AdvantageInputs
from agentgym.algorithms.loop.batch import Batch, collate
from agentgym.algorithms.maths.critic import Critic, CriticSettings, ValueModel
from agentgym.algorithms.loop.learner_config import check_temperature, check_token_kinds
from agentgym.algorithms.maths.losses import LossSettings, kl_penalty, masked_mean, ppo_objective, token_logprobs
from agentgym.algorithms.maths.objectives import OBJECTIVES, PolicyObjective
from agentgym.algorithms.loop.optim import (LoraSettings, OptimConfig, adamw, apply_lora, enable_checkpointing, is_peft,
                                       lr_factor)
from agentgym.algorithms.loop.parallel import Parallel
from agentgym.algorithms.loop.learner_state import LearnerState

__all__ = ["Learner"]

_SUMMED_STATS = ("policy_loss", "value_loss", "loss")  # already normalised by the minibatch totals


class Learner(LearnerState):
    """Trains ``policy.model`` (a ``transformers`` causal LM) in place from token-level trajectories.

    A learner class names its parts (``advantage_name``, ``objective_name``: keys of
    :data:`~agentgym.algorithms.maths.advantages.ADVANTAGES` and :data:`~agentgym.algorithms.maths.objectives.OBJECTIVES`)
    and its typed config (``config_class``: ``UpdateConfig`` plus its parts' settings blocks); the
    optimizer (``optim``) and a LoRA adapter (``lora``) are the run's, not the learner config's. Build one with
    :func:`~agentgym.algorithms.catalog.register_learner`, or subclass and override
    :meth:`compute_advantages` for full control. The instance holds the parts as ``advantage`` and
    ``objective``, and the critic when the estimator needs values (``value_head``; ``critic`` for a
    separate critic network).

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

    def __init__(self, policy: Any, config: Any = None, *, optim: OptimConfig | None = None,
                 lora: LoraSettings | None = None, separate_sampler: bool = False, fsdp: bool = False,
                 precision: Any = None):
        self.policy = policy
        expected = type(self).config_class
        self.config = cfg = expected() if config is None else config
        if not isinstance(cfg, expected):
            raise TypeError(f"the {self.name!r} learner takes a {expected.__name__}, got {type(cfg).__name__}")
        self.optim = optim if optim is not None else OptimConfig()
        self.lora = lora
        self.advantage: AdvantageEstimator = ADVANTAGES.lookup(self.advantage_name)(cfg)
        self.objective: PolicyObjective = OBJECTIVES.lookup(self.objective_name)(cfg)
        self.uses_values = bool(self.advantage.critic)
        if cfg.loss_token_kinds is not None:
            check_token_kinds(cfg.loss_token_kinds)
        # data-parallel under torchrun: every rank gets the same global batch (see .parallel)
        self.parallel = Parallel(distributed.current(), fsdp)
        self.dist, self.fsdp = self.parallel.ctx, self.parallel.fsdp
        # True when another engine (vLLM) samples the rollouts: see ``UpdateConfig.old_logprobs``
        self.separate_sampler = separate_sampler
        if self.optim.schedule != "constant" and cfg.total_steps is None:
            raise ValueError(f"schedule {self.optim.schedule!r} needs total_steps (the number of update calls)")
        from agentgym.backend import tokenizer_of
        tok = tokenizer_of(policy)
        self.pad_id = int(getattr(tok, "pad_token_id", None) or 0)
        self._rng = torch.Generator().manual_seed(cfg.seed)
        self._build_models(policy.model)
        self.device = next(self.model.parameters()).device
        self.precision = learner_precision(precision, self.device)
        self._build_optimizer()
        self.step = 0
        self._temperature = cfg.temperature or 1.0
        self._positions_of, self._positions_at = None, None   # _logit_positions' last micro-batch, its positions

    def _build_models(self, model: nn.Module) -> None:
        """The trained module (LoRA-wrapped when asked), the frozen reference, the critic; sharded under FSDP."""
        cfg, lora = self.config, self.lora
        base_copy = None
        if cfg.kl_coef > 0 and lora is None and not is_peft(model):
            base_copy = copy.deepcopy(model)  # the frozen reference: the policy as it starts
        self._critic = Critic(cfg, model) if self.uses_values else None
        if lora is not None and not is_peft(model):
            # the learner owns the PEFT wrapper; the adapters are injected into the policy's own module,
            # so a colocated policy samples through them without any attribute written onto it
            model = apply_lora(model, lora, seed=cfg.seed)
        self.model = model
        self.ref_model = base_copy.eval().requires_grad_(False) if base_copy is not None else None
        if self.fsdp:
            if lora is not None or is_peft(self.model):
                raise ValueError("fsdp=true with lora is not supported yet: sharding the PEFT wrapper and "
                                 "merging adapters across shards is not built; use LoRA without fsdp, or fsdp "
                                 "without LoRA")
            # a value head on the policy's body stays replicated: its gradients are all-reduced
            self.parallel.shard([self.model, self.ref_model, self.critic])
        if self.optim.gradient_checkpointing:
            enable_checkpointing(self.model)

    def _build_optimizer(self) -> None:
        """AdamW over the policy's and the critic's parameter groups, each role with its own warmup."""
        opt, total = self.optim, self.config.total_steps
        self.optimizer = adamw(self._param_groups(), lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay)
        warmup = opt.warmup_steps if opt.warmup_steps is not None else round(opt.warmup_ratio * (total or 0))
        self.warmup_steps = int(warmup)
        critic_warmup = self._critic_setting("critic_warmup_ratio")
        self.critic_warmup_steps = (self.warmup_steps if critic_warmup is None
                                    else int(round(critic_warmup * (total or 0))))
        factors = {role: functools.partial(lr_factor, warmup_steps=steps, total_steps=total, schedule=opt.schedule)
                   for role, steps in (("policy", self.warmup_steps), ("critic", self.critic_warmup_steps))}
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, [factors[g["role"]] for g in self.optimizer.param_groups])

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
        """The advantage estimator's state across updates, if it has one (REINFORCE's mean / EMA baseline)."""
        return self.advantage.state

    # ------------------------------------------------------------------ one update, top to bottom
    def update(self, trajectories: Sequence[Trajectory] | Any) -> dict[str, float]:
        """One learning step on a batch of trajectories (a list, or anything with ``.trajectories``).

        Metrics: ``loss``, ``policy_loss``, ``kl``, ``entropy``, ``clip_frac``, ``approx_kl``,
        ``grad_norm``, ``lr``, ``tokens`` (loss tokens), ``skipped`` (minibatches skipped for a
        non-finite loss or gradient), ``value_loss`` (with a critic), plus ``reward_mean``,
        ``advantage_mean``/``_std``, ``optimizer_steps``, ``dropped`` (trajectories without
        policy tokens), ``pad_frac`` and ``time_s``.
        """
        t0 = time.perf_counter()
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
        self._temperature = metrics["temperature"] = self._batch_temperature(usable)
        batch = collate(usable, pad_id=self.pad_id).to(self.device)
        mask = self._train_mask(batch)
        was_training = self.model.training
        try:
            self._set_training(False)
            if self.recomputes_old_logprobs:
                metrics.update(self._recompute_old_logprobs(batch))
            self._precompute(batch)
            metrics.update(self._advantages(usable, batch, mask))
            if self.config.skip_no_signal and not bool((batch.advantages * mask).ne(0).any()):
                # no group had signal: the step would be the KL/entropy terms and Adam's momentum alone
                metrics.update(no_signal_skip=1.0, skipped=0.0, optimizer_steps=0.0, kl=0.0, grad_norm=float("nan"))
            else:
                self._set_training(True)
                metrics.update(self._optimize(batch), no_signal_skip=0.0)
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

    def _advantages(self, trajectories: Sequence[Trajectory], batch: Batch, mask: torch.Tensor) -> dict[str, float]:
        """Token rewards (minus the KL when it is in the reward) → ``batch.advantages`` / ``returns``."""
        cfg, metrics = self.config, {}
        rewards = batch.token_rewards.clone()
        if cfg.kl_coef > 0 and cfg.kl_in == "reward":
            # KL of the sampling policy to the reference, on the tokens it sampled (env tokens
            # have no sampling-time log-prob, even when the ablation trains on them)
            kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, cfg.kl_estimator) * batch.loss_mask
            rewards = rewards - cfg.kl_coef * kl
            metrics["kl_reward"] = float(masked_mean(kl, batch.loss_mask))
        self.compute_advantages(trajectories, batch, rewards, mask)
        metrics["advantage_mean"] = float(masked_mean(batch.advantages, mask))
        centred = batch.advantages - metrics["advantage_mean"]
        metrics["advantage_std"] = float(masked_mean(centred ** 2, mask).sqrt())
        return metrics

    def compute_advantages(self, trajectories: Sequence[Trajectory], batch: Batch, rewards: torch.Tensor,
                           mask: torch.Tensor) -> None:
        """Fill ``batch.advantages`` and ``batch.returns`` from per-token ``rewards`` (``(B, T)``,
        KL penalty included) over the training ``mask``, with the advantage estimator."""
        inputs = AdvantageInputs(trajectories, rewards, mask, batch.old_values if self.uses_values else None,
                                 fill_env=not self.config.mask_env_tokens)
        adv, ret = self.advantage(inputs)
        batch.advantages, batch.returns = adv.to(mask.dtype) * mask, ret.to(mask.dtype) * mask

    def _batch_temperature(self, trajectories: Sequence[Trajectory]) -> float:
        """The temperature the batch was sampled at (one per update), checked against the config."""
        temps = {t.temperature for t in trajectories if t.temperature is not None}
        if len(temps) > 1:
            raise ValueError(f"one update mixes trajectories sampled at temperatures {sorted(temps)}; "
                             "log-prob ratios need one sampling temperature per batch")
        if not temps:
            return self.config.temperature or 1.0
        t = float(temps.pop())
        check_temperature(self.config.temperature, t)
        return t

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
                    ref, _ = self._logprobs(self._reference_outputs(micro), micro)
                    batch.ref_logprobs[rows, :w] = ref * micro.attention_mask
                if self.uses_values:
                    values = self._values(micro, None)
                    batch.old_values[rows, :w] = values.float() * micro.response_mask

    def _loss_settings(self, batch: Batch) -> LossSettings:
        """The shared loss's settings from the config's blocks (:meth:`LossSettings.of`); the KL is in
        the loss only with ``kl_in="loss"``."""
        cfg = self.config
        max_len = cfg.max_response_tokens or float(self._train_mask(batch).sum(1).max())
        return LossSettings.of(cfg, max_len, **({} if cfg.kl_in == "loss" else {"kl_coef": 0.0}))

    # ------------------------------------------------------------------ the optimisation
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

    def _epochs_and_minibatch(self, n: int) -> tuple[int, int, bool]:
        """(epochs, minibatch size, shuffle); an on-policy objective makes one step on the whole batch."""
        if self.objective.on_policy_only:
            return 1, n, False
        return self.config.epochs, self.config.minibatch_size or n, True

    def _minibatch_step(self, mb: Batch, settings: LossSettings) -> dict[str, tuple[float, float]] | None:
        """Accumulate gradients over this rank's micro-batches, reduce across ranks, clip, step.

        Returns ``{stat: (value, weight)}`` (loss terms: the minibatch's value, weight 1; token
        statistics: their mean, weighted by tokens), or None when the step was skipped because the
        loss or the gradient norm is not finite.
        """
        cfg = self.config
        train_mask = self._train_mask(mb)
        num_tokens = float(train_mask.sum())
        micros = list(mb.micro_batches(cfg.micro_batch_size, cfg.micro_batch_tokens))
        self._positions[0] += sum(m.padded_tokens for m in micros)
        self._positions[1] += int(mb.lengths.sum())
        mine, scale = self.parallel.share(micros)   # the loss is normalised by the global minibatch totals
        totals = (num_tokens, float((train_mask.sum(1) > 0).sum()))   # sequences with a loss token
        self.optimizer.zero_grad(set_to_none=True)
        try:
            finite, losses, token_stats = True, {}, {}
            for micro in mine:
                if micro is None:
                    with self._autocast():
                        self.parallel.padding_pass(self.model, self._model_outputs, mb)
                    continue
                st = self._micro_backward(micro, settings, totals, scale)
                if st is None:
                    finite = False
                    if self.dist is None:
                        return None
                    continue
                tokens = float(self._train_mask(micro).sum())
                for k, v in st.items():
                    if k in _SUMMED_STATS:  # already divided by the minibatch totals: the parts add up
                        losses[k] = losses.get(k, 0.0) + float(v)
                    else:
                        token_stats[k] = token_stats.get(k, 0.0) + float(v) * tokens
            finite, losses, token_stats = self.parallel.reduce_stats(finite, losses, token_stats)
            if not finite:
                return None
            self.parallel.reduce_gradients(self.policy_parameters() + self.critic_parameters())
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

    def _micro_backward(self, micro: Batch, settings: LossSettings, totals: tuple[float, float],
                        scale: float) -> dict[str, torch.Tensor] | None:
        """One micro-batch's forward pass, shared loss and backward; its statistics, or None (and no
        backward) when the loss is not finite. ``totals``: the minibatch's tokens and sequences."""
        hidden = self.uses_values and self._critic.on_policy_hidden   # the value head reads the policy's pass
        with self._autocast():
            out = self._model_outputs(self.model, micro, hidden=hidden)
            logp, entropy = self._logprobs(out, micro, entropy=True)
            values = self._values(micro, out).float() if self.uses_values else None
        loss, st = ppo_objective(
            logp, micro.old_logprobs, micro.advantages, self._train_mask(micro), settings,
            sampled_mask=micro.loss_mask, entropy=entropy, ref_logp=micro.ref_logprobs if self._has_reference else None,
            values=values, old_values=micro.old_values if values is not None else None,
            returns=micro.returns if values is not None else None, num_tokens=totals[0], num_seqs=totals[1],
            is_weights=micro.is_weights if self.config.tis_cap is not None else None, policy_term=self.objective)
        if not torch.isfinite(loss):
            return None
        (loss * scale).backward()
        st["loss"] = loss.detach()
        return st

    def _clip_gradients(self) -> float:
        """Clip the policy's and the critic's gradients separately; return the policy's pre-clip norm
        (non-finite if either is)."""
        max_norm = self.optim.max_grad_norm if self.optim.max_grad_norm is not None else float("inf")
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

    # ------------------------------------------------------------------ passes and parameters
    def _train_mask(self, batch: Batch) -> torch.Tensor:
        """The tokens that carry loss: ``mask_env_tokens``, narrowed to ``loss_token_kinds`` when set."""
        kinds = self.config.loss_token_kinds
        if kinds is None:
            return batch.train_mask(self.config.mask_env_tokens)
        return batch.train_mask(self.config.mask_env_tokens, kinds=kinds)

    def _autocast(self) -> contextlib.AbstractContextManager:
        """Policy, reference and critic forwards run in the run's precision (loss and log-softmax in fp32)."""
        return self.precision.autocast()

    def _logit_positions(self, micro: Batch) -> torch.Tensor:
        """Where a loss, ratio, KL or divergence reads a log-prob (``Batch.logit_positions``); kept for the
        last micro-batch (its forward and log-probs read them; a ``nonzero`` waits for the device)."""
        if self._positions_of is not micro:
            self._positions_of = micro
            self._positions_at = micro.logit_positions(self._train_mask(micro) + micro.loss_mask)
        return self._positions_at

    def _model_outputs(self, model: nn.Module, micro: Batch, hidden: bool = False, logits: bool = True) -> Any:
        return model(input_ids=micro.input_ids, attention_mask=micro.attention_mask, position_ids=micro.position_ids,
                     use_cache=False, output_hidden_states=hidden,   # no logits at all for values only
                     logits_to_keep=self._logit_positions(micro) if logits else 1)

    def _logprobs(self, outputs: Any, micro: Batch, *,
                  entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        return token_logprobs(outputs.logits, micro.input_ids, self._temperature, with_entropy=entropy,
                              positions=self._logit_positions(micro), entropy_grad=self.config.entropy_coef != 0)

    def _reference_outputs(self, micro: Batch) -> Any:
        if self.ref_model is not None:
            return self._model_outputs(self.ref_model, micro)
        with self.model.disable_adapter():  # LoRA: the reference is the base network
            return self._model_outputs(self.model, micro)

    @property
    def _has_reference(self) -> bool:
        return self.config.kl_coef > 0

    def _values(self, micro: Batch, outputs: Any) -> torch.Tensor:
        if self._critic.on_policy_hidden and outputs is None:
            outputs = self._model_outputs(self.model, micro, hidden=True, logits=False)
        return self._critic.values(micro, outputs.hidden_states[-1] if self._critic.on_policy_hidden else None)

    def _set_training(self, mode: bool) -> None:
        """Train mode while optimising (gradient checkpointing needs it), eval for the no-grad passes."""
        self.model.train(mode)
        if self._critic is not None:
            self._critic.train(mode)

    def policy_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def critic_parameters(self) -> list[nn.Parameter]:
        return self._critic.parameters() if self._critic is not None else []

    def _critic_setting(self, name: str) -> Any:
        """A :class:`CriticSettings` knob; None for a learner without a critic."""
        return getattr(self.config, name) if isinstance(self.config, CriticSettings) else None

    def _param_groups(self) -> list[dict[str, Any]]:
        groups, lr = [], self.optim.lr
        for role, params, lr in (("policy", self.policy_parameters(), lr),
                                 ("critic", self.critic_parameters(), self._critic_setting("critic_lr") or lr)):
            decay = [p for p in params if p.ndim >= 2]
            no_decay = [p for p in params if p.ndim < 2]
            # "role" picks the group's warmup (the critic may have its own, ``critic_warmup_ratio``)
            groups += [{"params": decay, "lr": lr, "role": role},
                       {"params": no_decay, "lr": lr, "weight_decay": 0.0, "role": role}]
        return [g for g in groups if g["params"]]
