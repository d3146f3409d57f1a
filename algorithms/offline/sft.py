"""SFT warm-up: behaviour cloning of successful episodes with ``trl.SFTTrainer``, token-faithfully.

``agentgym sft`` runs :func:`run_sft` with an :class:`SFTRunConfig` (YAML + ``key=value``
overrides, like ``agentgym train``). Steps: collect episodes from ``data.source`` (default: the env's
oracle) → keep the successful ones → one pre-tokenized row per episode (``input_ids`` = the
trajectory's ids, ``assistant_masks`` = its ``loss_mask``: see ``offline/data.py`` for why ids and
not re-rendered text) → ``SFTTrainer`` (labels -100 on every prompt, observation and template-glue
token) → ``output_dir/model``, a plain Hugging Face model directory with the tokenizer (LoRA merged
by default) that ``agentgym train model=…``, ``agentgym dpo model=…`` and ``agentgym eval --policy …``
load as is.

Weights are trained in fp32 (with bf16 autocast on CUDA): bf16 master weights lose small AdamW
updates. ``trl`` and ``peft`` are imported only when a run starts.
"""

from __future__ import annotations

import csv
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from agentgym.config import save_config
from agentgym.rollout_config import RolloutConfig, RolloutViews

from agentgym.algorithms.loop.optim import LoraSettings, OptimConfig, peft_lora_config
from agentgym.algorithms.offline.data import (OFFLINE_ROLLOUT_ALIASES, CollectConfig, collect_trajectories, offline_rollout, load_trajectories,
                                              sft_dataset, source_policy, successful)

__all__ = ["TrainerOptimConfig", "OfflineRunConfig", "SFTData", "SFTRunConfig", "build_sft_trainer", "run_sft", "trl_training_kwargs",
           "peft_config", "prepare_run", "gather_episodes", "finish_run"]


@dataclass
class TrainerOptimConfig(OptimConfig):
    """The ``optim:`` section of SFT and DPO: the one optimizer config
    (:class:`~agentgym.algorithms.loop.optim.OptimConfig`: ``lr``, ``betas``, ``weight_decay``,
    ``warmup_steps`` / ``warmup_ratio``, ``schedule``, ``max_grad_norm``) plus the data loop of a
    Hugging Face ``Trainer``.

    ``epochs``: passes over the data set (not RL's ``learner.epochs``, passes over each batch of
    rollouts), unless ``max_steps`` > 0; ``batch_size`` × ``grad_accum`` examples per optimizer step;
    ``schedule`` may also name another transformers scheduler, after the warmup; ``max_length`` cuts
    examples (None: no cut; episodes are already bounded by ``max_context_tokens``). SFT's and DPO's
    own defaults (lr, cosine schedule, DPO's one epoch) are set where their run configs build this
    section (``default_factory``).
    ``warmup`` (deprecated): the former single warmup key — steps, or a fraction of training when < 1;
    use ``warmup_steps`` or ``warmup_ratio``.
    """
    epochs: float = field(default=2.0, metadata={"help": "passes over the data set (> 0; fractions allowed)"})
    max_steps: int = field(default=-1, metadata={"help": "optimizer steps to run; -1 = as many as epochs take"})
    batch_size: int = field(default=4, metadata={"help": "examples per forward/backward (>= 1)"})
    grad_accum: int = field(default=1, metadata={"help": "forward/backward passes per optimizer step (>= 1)"})
    max_length: int | None = field(default=None, metadata={"help": "cut examples to this many tokens; null = no cut"})
    logging_steps: int = field(default=1, metadata={"help": "optimizer steps between logged losses (>= 1)"})
    warmup: float | None = field(default=None, metadata={
        "help": "deprecated: warmup steps, or a fraction of training when < 1; use warmup_steps / warmup_ratio"})

    schedules: ClassVar[tuple[str, ...] | None] = None   # transformers checks the name

    def __post_init__(self) -> None:
        if self.warmup is not None:
            warnings.warn("optim.warmup is deprecated: use optim.warmup_steps (steps) or optim.warmup_ratio "
                          "(a fraction of training)", DeprecationWarning, stacklevel=3)
            if self.warmup < 1:
                self.warmup_ratio = float(self.warmup)
            else:
                self.warmup_steps = int(self.warmup)
            self.warmup = None
        super().__post_init__()
        if not self.epochs > 0 or self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("optim: epochs must be > 0, batch_size and grad_accum >= 1")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"optim.max_steps must be >= 1, or -1 for epochs, got {self.max_steps}")
        if self.logging_steps < 1 or (self.max_length is not None and self.max_length < 2):
            raise ValueError("optim: logging_steps must be >= 1 and max_length >= 2 (or null)")
        if self.warmup_steps is None and self.warmup_ratio >= 1:
            raise ValueError("optim.warmup_ratio must be < 1 for SFT/DPO (a whole run of warmup: set warmup_steps)")

    @property
    def hf_warmup(self) -> float:
        """transformers' ``warmup_steps``: an integer is steps, a float in [0, 1) a ratio of training."""
        return self.warmup_steps if self.warmup_steps is not None else self.warmup_ratio

    @property
    def hf_schedule(self) -> str:
        """transformers' scheduler name: its ``constant`` ignores the warmup, ``constant_with_warmup`` does not."""
        return "constant_with_warmup" if self.schedule == "constant" and self.hf_warmup else self.schedule


@dataclass
class SFTData(CollectConfig):
    """Episodes to clone. ``only_success`` (default on): drop failed episodes; ``min_reward``: also
    drop episodes whose return is below it."""
    only_success: bool = field(default=True, metadata={"help": "drop the episodes the env judged failed"})
    min_reward: float | None = field(default=None, metadata={
        "help": "also drop episodes whose return is below this; null = no floor"})


@dataclass
class OfflineRunConfig(RolloutViews):
    """What an SFT and a DPO run share: the env, the model, the token layout (as RL's), LoRA (merged
    into the exported model unless ``merge_lora=false``), seed, device and compute precision
    (:mod:`agentgym.precision`: auto = bf16 on CUDA, on a CPU what a cached probe measures faster)."""
    env: str = field(default="Arithmetic-v0", metadata={"help": "registered env id the episodes come from"})
    env_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"help": "keyword arguments of that env"})
    model: str = field(default="smollm2", metadata={"help": "model to train: a catalog name, HF hub id or local path"})
    rollout: RolloutConfig = field(default_factory=offline_rollout, metadata={
        "help": "sampling and token layout of the collected episodes (as RL's)"})
    lora: LoraSettings | None = field(default=None, metadata={
        "help": "a LoRA adapter {r, alpha, dropout, target_modules}; null = full fine-tuning"})
    merge_lora: bool = field(default=True, metadata={"help": "merge the adapter into the exported model"})
    seed: int = field(default=0, metadata={"help": "seed of the trainer (data order, init) and of the run"})
    device: str | None = field(default=None, metadata={"help": "torch device; null = cuda when available, else cpu"})
    precision: str = field(default="auto", metadata={
        "help": "compute precision: auto (bf16 on CUDA; on CPU a cached probe decides), fp32 or bf16"})

    config_aliases: ClassVar[dict[str, str]] = OFFLINE_ROLLOUT_ALIASES

    def __post_init__(self) -> None:
        from agentgym.precision import check_precision
        check_precision(self.precision)


@dataclass
class SFTRunConfig(OfflineRunConfig):
    """One SFT run. Defaults: oracle episodes on Arithmetic-v0 into SmolLM2."""
    data: SFTData = field(default_factory=SFTData, metadata={"help": "the episodes to clone"})
    optim: TrainerOptimConfig = field(default_factory=lambda: TrainerOptimConfig(lr=2e-5, schedule="cosine"),
                                      metadata={"help": "optimizer, schedule and data loop"})
    output_dir: str = field(default="runs/sft", metadata={
        "help": "where the run writes its resolved config, logs and model"})


def trl_training_kwargs(optim: TrainerOptimConfig, out: Path, seed: int, device: str | None,
                        precision: str = "auto") -> dict[str, Any]:
    """Keyword arguments every TRL config (a ``TrainingArguments``) gets from our settings. ``precision``
    (:mod:`agentgym.precision`) becomes TrainingArguments' ``bf16`` (autocast over fp32 weights, on CPU too)."""
    import dataclasses

    import torch
    from transformers import TrainingArguments

    from agentgym.precision import resolve_precision
    cuda = torch.cuda.is_available() and (device is None or device.startswith("cuda"))
    bf16 = resolve_precision(precision, "cuda" if cuda else "cpu").bf16
    # transformers renamed gradient_checkpointing (kept as a deprecated alias) to activation_checkpointing
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    ckpt = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {"output_dir": str(out / "trainer"), "learning_rate": optim.lr, "num_train_epochs": optim.epochs,
            "max_steps": optim.max_steps, "per_device_train_batch_size": optim.batch_size,
            "gradient_accumulation_steps": optim.grad_accum, "lr_scheduler_type": optim.hf_schedule,
            "warmup_steps": optim.hf_warmup, "weight_decay": optim.weight_decay,
            "adam_beta1": optim.betas[0], "adam_beta2": optim.betas[1],
            "max_grad_norm": optim.max_grad_norm if optim.max_grad_norm is not None else 0.0,
            "max_length": optim.max_length, ckpt: optim.gradient_checkpointing,
            "logging_steps": optim.logging_steps, "logging_first_step": True, "save_strategy": "no",
            "report_to": [], "seed": seed, "data_seed": seed, "bf16": bf16, "use_cpu": not cuda,
            "dataset_num_proc": None}


def peft_config(lora: LoraSettings | None) -> Any:
    return None if lora is None else peft_lora_config(lora)


def prepare_run(cfg: Any, overwrite: bool = False) -> tuple[Path, Any]:
    """Output dir with the resolved config, seeds set, and the model as a policy (fp32 weights).
    A non-empty ``output_dir`` is refused unless ``overwrite`` (see :mod:`agentgym.runs`)."""
    import torch
    from transformers import set_seed

    from agentgym.policies.loading import load_policy
    from agentgym.policies.backends import trainable_backend
    from agentgym.runs import prepare_output_dir
    out = prepare_output_dir(cfg.output_dir, overwrite=overwrite, command=type(cfg).__name__[:3].lower())
    save_config(cfg, out / "config.yaml")
    set_seed(cfg.seed)
    # the one loader, with the backend whose module a learner trains in place
    return out, load_policy(cfg.model, trainable_backend(), device=cfg.device, dtype=torch.float32, seed=cfg.seed)


def gather_episodes(cfg: Any, policy: Any, desc: str) -> list[Any]:
    """The run's episodes: loaded from ``data.source`` when it is a ``.json`` file, else collected."""
    from agentgym.registry import full_id
    if cfg.data.source.endswith(".json"):
        return load_trajectories(cfg.data.source, policy.tokenizer)
    env_id = full_id(cfg.env)
    return collect_trajectories(source_policy(cfg.data.source, policy, env_id), env_id, cfg.env_kwargs,
                                cfg.data, cfg.rollout, desc=desc)


def finish_run(trainer: Any, tokenizer: Any, out: Path, merge_lora: bool) -> tuple[list[dict[str, Any]], Path]:
    """After ``trainer.train()``: TRL's ``log_history`` as ``train_log.csv`` (one row per logging step)
    and the model exported to ``out/model``. Returns the history and the model directory."""
    from agentgym.policies.loading import export_model
    history = list(trainer.state.log_history)
    keys = sorted({k for row in history for k in row})
    with (out / "train_log.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(history)
    try:
        (out / "trainer").rmdir()  # the HF Trainer's output dir stays empty: it saves no checkpoints
    except OSError:
        pass
    return history, export_model(trainer.model, tokenizer, out / "model", merge_lora=merge_lora)


def build_sft_trainer(cfg: SFTRunConfig, policy: Any, dataset: Any, out: Path) -> Any:
    """The ``trl.SFTTrainer`` for ``dataset`` (rows of :func:`~agentgym.algorithms.offline.data.sft_example`).

    ``assistant_only_loss`` stays off: it re-derives masks from a chat template's generation markers,
    whereas our ``assistant_masks`` column already says which ids the policy produced (including a
    sampled end-of-turn token, so the model learns to stop)."""
    import trl
    args = trl.SFTConfig(**trl_training_kwargs(cfg.optim, out, cfg.seed, cfg.device, cfg.precision),
                         assistant_only_loss=False, completion_only_loss=False, packing=False)
    return trl.SFTTrainer(model=policy.model, args=args, train_dataset=dataset, processing_class=policy.tokenizer,
                          peft_config=peft_config(cfg.lora))


def run_sft(cfg: SFTRunConfig, overwrite: bool = False) -> dict[str, Any]:
    """Collect → filter → SFT → export. Returns counts, first/last loss and the model directory."""
    out, policy = prepare_run(cfg, overwrite)
    episodes = gather_episodes(cfg, policy, desc=f"sft data ({cfg.data.source})")
    floor = cfg.data.min_reward
    kept = successful(episodes, floor) if cfg.data.only_success else \
        [t for t in episodes if t.num_policy_tokens > 0 and (floor is None or t.total_reward >= floor)]
    summary = {"episodes": len(episodes), "kept": len(kept),
               "source_success_rate": sum(bool(t.episode.get("success")) for t in episodes) / max(1, len(episodes)),
               "kept_tokens": sum(len(t.token_ids) for t in kept),
               "kept_policy_tokens": sum(t.num_policy_tokens for t in kept)}
    (out / "data_summary.json").write_text(json.dumps(summary, indent=1))
    if not kept:
        raise ValueError(f"none of the {len(episodes)} episodes from {cfg.data.source!r} passed the filter "
                         "(data.only_success, data.min_reward); nothing to clone")
    trainer = build_sft_trainer(cfg, policy, sft_dataset(kept), out)
    trainer.train()
    history, model_dir = finish_run(trainer, policy.tokenizer, out, cfg.merge_lora)
    losses = [row["loss"] for row in history if "loss" in row]
    return {**summary, "loss_first": losses[0] if losses else float("nan"),
            "loss_last": losses[-1] if losses else float("nan"), "steps": trainer.state.global_step,
            "model_dir": str(model_dir)}
