"""The one optimizer config, for RL, SFT and DPO, and the optimisation machinery the learner uses.

:class:`OptimConfig` holds what every training command shares, under one path, ``optim.*``, in
``agentgym train``, ``sft`` and ``dpo``: AdamW (``lr``, ``betas``, ``weight_decay``), the
learning-rate schedule (``schedule`` after a linear warmup of ``warmup_steps``, or ``warmup_ratio`` of
the run), gradient clipping (``max_grad_norm``) and activation checkpointing. RL's ``optim:`` section
is this class (the learner's own settings are ``learner:``, :mod:`.learner_config`); SFT and DPO
extend it with the data loop of a Hugging Face ``Trainer``
(:class:`~agentgym.algorithms.offline.sft.TrainerOptimConfig`). A command whose defaults differ (SFT's
lr 2e-5 and cosine schedule) sets them in its run config's ``default_factory``, not in a field of
its own.

Also here: :class:`LoraSettings` (the top-level ``lora:`` of every training command), :func:`lr_factor`
(the RL schedule), AdamW with the fused kernel, LoRA through ``peft`` and activation checkpointing.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

__all__ = ["SCHEDULES", "LoraSettings", "OptimConfig", "lr_factor", "adamw", "is_peft", "apply_lora",
           "enable_checkpointing"]

SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class LoraSettings:
    """LoRA adapter (``peft``). ``target_modules="all-linear"`` = every linear layer but the output head."""
    r: int = field(default=8, metadata={"help": "rank of the adapter matrices"})
    alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator (the update is scaled by alpha / r)"})
    dropout: float = field(default=0.0, metadata={"help": "dropout on the adapter's input, in [0, 1)"})
    target_modules: str | tuple[str, ...] = field(default="all-linear", metadata={
        "help": "module names to adapt, or all-linear (every linear layer but the output head)"})

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):   # YAML gives a list
            self.target_modules = tuple(self.target_modules)


@dataclass
class OptimConfig:
    """AdamW and its schedule, for every training command.

    ``lr``, ``betas``, ``weight_decay`` (AdamW; no decay on biases and norms); a linear warmup over
    ``warmup_steps`` optimizer steps (None: ``warmup_ratio`` × the run's steps), then ``schedule``
    (``constant``, ``linear`` or ``cosine`` decay to 0); ``max_grad_norm`` (None = no clipping);
    ``gradient_checkpointing`` (recompute activations in the backward pass).
    """
    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate after warmup (>= 0)"})
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata={"help": "AdamW's (beta1, beta2)"})
    weight_decay: float = field(default=0.0, metadata={
        "help": "AdamW decoupled weight decay (not on biases and norms)"})
    warmup_ratio: float = field(default=0.0, metadata={
        "help": "linear warmup over this share of the run's steps, in [0, 1] (when warmup_steps is null)"})
    warmup_steps: int | None = field(default=None, metadata={
        "help": "linear warmup over this many optimizer steps; null = warmup_ratio"})
    schedule: str = field(default="constant", metadata={
        "help": "lr after the warmup: constant, or linear / cosine decay to 0 at the last step"})
    max_grad_norm: float | None = field(default=1.0, metadata={
        "help": "clip the gradient's global norm to this (> 0); null = no clipping"})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "recompute activations in the backward pass (less memory, slower)"})

    #: the accepted ``schedule`` names (None: any the training library knows)
    schedules: ClassVar[tuple[str, ...] | None] = SCHEDULES

    def __post_init__(self) -> None:
        check_optim(self)


def check_optim(cfg: OptimConfig) -> None:
    """Check (and normalise, for YAML's lists) the optimizer settings."""
    if cfg.schedules is not None and cfg.schedule not in cfg.schedules:
        raise ValueError(f"schedule must be one of {cfg.schedules}, got {cfg.schedule!r}")
    if not math.isfinite(cfg.lr) or cfg.lr < 0:
        raise ValueError(f"lr must be a finite number >= 0, got {cfg.lr}")
    if not 0 <= cfg.warmup_ratio <= 1:
        raise ValueError(f"warmup_ratio must be in [0, 1], got {cfg.warmup_ratio}")
    if cfg.warmup_steps is not None and cfg.warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0 or None, got {cfg.warmup_steps}")
    if cfg.max_grad_norm is not None and cfg.max_grad_norm <= 0:
        raise ValueError(f"max_grad_norm must be > 0 or None, got {cfg.max_grad_norm}")
    cfg.betas = tuple(float(b) for b in cfg.betas)  # YAML gives a list


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


def adamw(param_groups: list[dict[str, Any]], **kwargs: Any) -> torch.optim.AdamW:
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


def is_peft(model: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, PeftModel)


def peft_lora_config(lora: LoraSettings) -> Any:
    """``peft.LoraConfig`` for ``lora`` (causal LM)."""
    from peft import LoraConfig
    target = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=target,
                      task_type="CAUSAL_LM")


def apply_lora(model: nn.Module, lora: LoraSettings, seed: int = 0) -> nn.Module:
    """Wrap ``model`` in a ``peft`` LoRA model; the adapter's random init is seeded by ``seed``
    (without disturbing the global RNG)."""
    from peft import get_peft_model
    config = peft_lora_config(lora)
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), warnings.catch_warnings():
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


def enable_checkpointing(model: nn.Module) -> None:
    """Non-reentrant activation checkpointing (works with frozen LoRA bases without input-grad hooks)."""
    enable = getattr(model, "activation_checkpointing_enable", None)   # transformers >= 5.x
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
