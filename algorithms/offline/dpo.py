"""DPO on multi-turn agent episodes with ``trl.DPOTrainer``, token-faithfully.

``agentgym dpo`` runs :func:`run_dpo` with a :class:`DPORunConfig` (YAML + ``key=value`` overrides).
Steps: sample ``data.samples_per_task`` episodes per task from the model itself (``data.source=self``,
on-policy preference data) → per task, the highest-return episode is *chosen* and the lowest
*rejected*, when their returns differ by more than ``data.min_gap`` → ``DPOTrainer`` → ``output_dir/model``
(a plain model directory, loadable by every other command).

How a multi-turn episode becomes a pair. Both episodes of a task start from the same prompt ids
(the task prompt, checked equal); the rest of each episode — all its policy turns *and* the
observations between them, ids exactly as in the trajectory — is that side's completion, and the
trajectory's ``loss_mask`` is its completion mask. TRL sums per-token log-probabilities over the
completion mask only, so each side's log-ratio log π_θ(τ)/π_ref(τ) counts the policy's own tokens:
the environment's transition probabilities are the same under π_θ and π_ref and cancel, which makes
this the trajectory-level Bradley–Terry model of DPO (as in ETO-style agent DPO), not a model of
the tool outputs. Stock ``DPOTrainer`` would tokenize text columns and put every completion token
in the mask, env tokens included; :class:`TokenPreferenceCollator` and a ``_prepare_dataset``
override (the only TRL internals touched; written against trl 1.16) pass our ids and masks through.

Limitations, honestly: the preference is one scalar per *episode* — no per-turn credit, so a good
first tool call in a failed episode is pushed down with the rest; after the two episodes diverge
they are conditioned on different observations, and a noisy env can make the better return partly
luck; episodes longer than ``optim.max_length`` are cut (keep_start), which drops the late turns
from both sides. ``data.oracle_chosen`` adds the env's oracle episode to every task's group (expert
vs. own failure, as in ETO), useful when the model alone rarely produces return differences.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentgym.algorithms.offline.data import CollectConfig, collect_trajectories, dpo_dataset, preference_pairs, source_policy
from agentgym.algorithms.offline.sft import (OfflineRunConfig, TrainerOptimConfig, finish_run, gather_episodes,
                                             peft_config, prepare_run, trl_training_kwargs)

__all__ = ["DPOData", "DPORunConfig", "TokenPreferenceCollator", "build_dpo_trainer", "run_dpo"]


@dataclass
class DPOData(CollectConfig):
    """Episodes to compare: ``samples_per_task`` per task from ``source`` (default: the model itself).
    ``min_gap``: the returns of chosen and rejected must differ by more than this. ``oracle_chosen``:
    also run the env's oracle on every task and add its episode to the group."""
    source: str = field(default="self", metadata={
        "help": "who plays: self (the model trained), oracle, a model spec, or FILE.json from agentgym eval --json"})
    episodes: int = field(default=32, metadata={"help": "tasks to collect from (>= 1)"})
    samples_per_task: int = field(default=4, metadata={"help": "episodes per task, compared for a pair (>= 1)"})
    min_gap: float = field(default=0.0, metadata={
        "help": "chosen and rejected returns must differ by more than this"})
    oracle_chosen: bool = field(default=False, metadata={"help": "add the env's oracle episode to every task's group"})


@dataclass
class DPORunConfig(OfflineRunConfig):
    """One DPO run. ``loss_type`` is one TRL loss name or several joined by commas (``sigmoid,sft``,
    weighted by ``loss_weights``)."""
    data: DPOData = field(default_factory=DPOData, metadata={"help": "the episodes to pair"})
    optim: TrainerOptimConfig = field(
        default_factory=lambda: TrainerOptimConfig(lr=1e-6, schedule="cosine", epochs=1.0), metadata={
        "help": "optimizer, schedule and data loop"})
    beta: float = field(default=0.1, metadata={"help": "DPO's beta (> 0): strength of the pull to the reference"})
    loss_type: str = field(default="sigmoid", metadata={
        "help": "TRL DPO loss name, or several joined by commas (sigmoid,sft)"})
    loss_weights: list[float] | None = field(default=None, metadata={
        "help": "weights of the losses in loss_type; null = 1 each"})
    precompute_ref_log_probs: bool = field(default=False, metadata={
        "help": "compute the reference's log-probs once, before training, instead of every step"})
    output_dir: str = field(default="runs/dpo", metadata={
        "help": "where the run writes its resolved config, logs and model"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")


class TokenPreferenceCollator:
    """Batches rows of :func:`~agentgym.algorithms.offline.data.dpo_example` the way ``DPOTrainer``'s
    loss expects (chosen rows, then rejected rows; right-padded), except that ``completion_mask`` is
    the trajectory's loss mask — 0 on the prompt, the observations and the template glue."""

    def __init__(self, pad_token_id: int, max_length: int | None = None):
        self.pad_token_id, self.max_length = pad_token_id, max_length

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        seqs, masks = [], []
        for side in ("chosen", "rejected"):
            for r in rows:
                seqs.append(list(r["prompt_ids"]) + list(r[f"{side}_ids"]))
                masks.append([0] * len(r["prompt_ids"]) + list(r[f"{side}_mask"]))
        if self.max_length is not None:
            seqs = [s[: self.max_length] for s in seqs]
            masks = [m[: self.max_length] for m in masks]
        width = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(seqs), width), dtype=torch.long)
        completion = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (s, m) in enumerate(zip(seqs, masks)):
            input_ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            attention[i, : len(s)] = 1
            completion[i, : len(m)] = torch.tensor(m, dtype=torch.long)
        out = {"input_ids": input_ids, "attention_mask": attention, "completion_mask": completion}
        for key in ("ref_chosen_logps", "ref_rejected_logps"):  # set by precompute_ref_log_probs
            if key in rows[0]:
                out[key] = torch.tensor([r[key] for r in rows])
        return out


_COLUMNS = ("prompt_ids", "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask")


def _token_dpo_trainer_class() -> type:
    import trl
    from packaging.version import Version
    if Version(trl.__version__) < Version("1.16"):  # we override a private method and rely on its loss's masks
        raise ValueError(f"agentgym dpo needs trl >= 1.16 (its DPOTrainer internals); found {trl.__version__}")

    class TokenDPOTrainer(trl.DPOTrainer):
        """``DPOTrainer`` whose datasets are already token ids with per-token completion masks."""

        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            missing = [c for c in _COLUMNS if c not in dataset.column_names]
            if missing:
                raise ValueError(f"{dataset_name} dataset lacks {missing}; build it with agentgym.algorithms.offline.data.dpo_dataset")
            if args.max_length is not None:  # a prompt filling max_length leaves no completion to compare
                dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < args.max_length)
            return dataset

    return TokenDPOTrainer


def build_dpo_trainer(cfg: DPORunConfig, policy: Any, dataset: Any, out: Path) -> Any:
    """The DPO trainer. Full fine-tuning compares against a frozen copy of the starting model; with
    LoRA the reference is the base with the adapter disabled (no second copy in memory)."""
    import trl
    losses = [s.strip() for s in cfg.loss_type.split(",") if s.strip()]
    args = trl.DPOConfig(**trl_training_kwargs(cfg.optim, out, cfg.seed, cfg.device, cfg.precision), beta=cfg.beta,
                         loss_type=losses, loss_weights=cfg.loss_weights,
                         precompute_ref_log_probs=cfg.precompute_ref_log_probs,
                         remove_unused_columns=False)  # the mask columns must reach the collator
    tok = policy.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ref = None if cfg.lora is not None else copy.deepcopy(policy.model).eval()
    return _token_dpo_trainer_class()(model=policy.model, ref_model=ref, args=args, train_dataset=dataset,
                                      processing_class=tok, peft_config=peft_config(cfg.lora),
                                      data_collator=TokenPreferenceCollator(pad, cfg.optim.max_length))


def run_dpo(cfg: DPORunConfig, overwrite: bool = False) -> dict[str, Any]:
    """Sample → pair → DPO → export. Returns pair counts, first/last loss and reward accuracy."""
    from agentgym.registry import full_id
    out, policy = prepare_run(cfg, overwrite)
    episodes = gather_episodes(cfg, policy, desc=f"dpo samples ({cfg.data.source})")
    if cfg.data.oracle_chosen:
        oracle_data = dataclasses.replace(cfg.data, samples_per_task=1)
        env_id = full_id(cfg.env)
        episodes += collect_trajectories(source_policy("oracle", policy, env_id), env_id, cfg.env_kwargs,
                                         oracle_data, cfg.rollout, desc="dpo oracle episodes")
    pairs = preference_pairs(episodes, cfg.data.min_gap)
    tasks = len({(t.env_id, t.task_index) for t in episodes})
    summary = {"episodes": len(episodes), "tasks": tasks, "pairs": len(pairs),
               "mean_reward_gap": sum(c.total_reward - r.total_reward for c, r in pairs) / max(1, len(pairs))}
    (out / "data_summary.json").write_text(json.dumps(summary, indent=1))
    trainer = build_dpo_trainer(cfg, policy, dpo_dataset(pairs), out)
    trainer.train()
    history, model_dir = finish_run(trainer, policy.tokenizer, out, cfg.merge_lora)
    logged = [row for row in history if "loss" in row]
    first, last = (logged[0], logged[-1]) if logged else ({}, {})
    return {**summary, "loss_first": first.get("loss", float("nan")), "loss_last": last.get("loss", float("nan")),
            "reward_accuracy_last": last.get("rewards/accuracies", float("nan")),
            "steps": trainer.state.global_step, "model_dir": str(model_dir)}
