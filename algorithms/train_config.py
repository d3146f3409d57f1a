"""The training run's config: :class:`TrainConfig` (every setting ``agentgym train`` takes) and :class:`EvalConfig`.

Defaults are the README's main job. Nested parts: ``rollout`` (the one :class:`~agentgym.rollout.RolloutConfig`),
``learner`` (:class:`~agentgym.algorithms.config.LearnerConfig`), ``eval`` and ``health``
(:class:`~agentgym.algorithms.health.HealthConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from agentgym.algorithms.config import LearnerConfig
from agentgym.algorithms.health import HealthConfig
from agentgym.policy import SamplingParams
from agentgym.precision import check_precision
from agentgym.rollout import ROLLOUT_ALIASES, RolloutConfig, RolloutViews

__all__ = ["TrainConfig", "EvalConfig", "torch_dtype"]


def _train_rollout() -> RolloutConfig:
    """The main job's rollout settings: short answers, a 2k-token context."""
    return RolloutConfig(sampling=SamplingParams(max_new_tokens=48), max_obs_tokens=256, max_context_tokens=2048)


@dataclass
class EvalConfig:
    every: int = 0                  # steps between evals (0: only before and after training)
    episodes: int = 16
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "test"})
    first_task: int = 0             # the same held-out tasks at every eval


@dataclass
class TrainConfig(RolloutViews):
    """Everything a run needs. Defaults: the README's main job (a short CPU run).

    The default task is ``Math-v0`` at its warm-up level (one operation on numbers up to 20,
    single turn, answer read from ``\\boxed{}``, an "answer is" phrase or the last number): the
    untrained SmolLM2-135M solves about a third of these when sampling, so the rewards inside a
    GRPO group differ and every step has a learning signal. (On ``Arithmetic-v0`` it never writes
    the ``<answer>`` tag, every reward in a group is equal and GRPO's advantages are exactly zero.)
    """
    env: str = "Math-v0"
    # the default env's arguments: a config that picks another env starts from {} (see load_config)
    env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {"kinds": ["arithmetic"], "difficulty": 0, "max_turns": 1},
        metadata={"defaults_belong_to": "env"})
    model: str = "smollm2"
    algo: str = "grpo"
    steps: int = 12
    groups_per_step: int = 4
    group_size: int = 4
    seed: int = 0
    # sampling and token layout: the one RolloutConfig (``sampling.*``, ``style``, ``max_obs_tokens``,
    # ``max_context_tokens`` are accepted as short keys); evals use the same layout, greedily
    rollout: RolloutConfig = field(default_factory=_train_rollout)
    learner: LearnerConfig = field(default_factory=lambda: LearnerConfig(lr=1e-5, micro_batch_size=4))
    eval: EvalConfig = field(default_factory=EvalConfig)
    # steps between checkpoints (0: only the final one). Only the newest checkpoint keeps the optimizer
    # and learner state that --resume needs (≈2× the weights with AdamW); older kept ones hold weights only.
    checkpoint_every: int = 4
    keep_checkpoints: int = 1
    output_dir: str = "runs/train"
    tensorboard: bool = True
    device: str | None = None
    # generation backend of rollouts and evals: hf (the trained module samples in place), vllm (a
    # separate engine, weights synced after every update), None = vllm on CUDA when installed, else hf
    backend: str | None = None
    # options of that backend's policy: hf — reuse_kv (KV reuse across turns, default true), attn_implementation,
    # kv_cache_tokens, max_batch_size; vllm — any vllm.LLM argument (gpu_memory_utilization, ...)
    backend_options: dict[str, Any] = field(default_factory=dict)
    # under torchrun on CUDA: shard the trained model with FSDP2 (needs backend=vllm for rollouts)
    fsdp: bool = False
    # > 0: that many generation engines as Ray actors (data-parallel over episodes), weights pushed
    # to all of them after every update (on the cluster of rollout.ray_address; None: a local one)
    rollout_workers: int = 0
    # how those pushes travel: auto, collective (gloo / NCCL broadcast) or object_store (see policies/ray_pool.py)
    weight_transfer: str = "auto"
    # weights' dtype: None = bf16 on CUDA, fp32 on CPU. "float32" keeps fp32 master weights (bf16
    # autocast still applies with precision bf16): at lr 1e-6 an AdamW step is far below bf16's resolution.
    dtype: str | None = None
    # compute precision of the learner (policy, reference, critic) and the samplers: auto (bf16 on CUDA; on a
    # CPU what a cached probe measures faster), fp32, or bf16 (autocast; fp32 master weights, optimizer, loss)
    precision: str = "auto"
    # overlap generation with the update (bounded staleness, as in AReaL / prime-rl): 0 = on-policy (generate,
    # then update); >= 1 = the batch of step k+1 is generated while step k updates, by a separate sampler
    # holding weights at most this many updates old (one sampler: the pipeline is one batch deep, so 1 in practice)
    max_staleness: int = 0
    # training-health alarms (entropy / length / action-rate collapse, groups without signal) and the opt-in
    # template-collapse MI; the health/* metrics are logged every step either way (algorithms/health.py)
    health: HealthConfig = field(default_factory=HealthConfig)

    config_aliases: ClassVar[dict[str, str]] = ROLLOUT_ALIASES

    def __post_init__(self) -> None:
        if isinstance(self.rollout, dict):
            self.rollout = RolloutConfig(**self.rollout)
        for name in ("steps", "groups_per_step", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0: only the final checkpoint), got {self.checkpoint_every}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.eval.every < 0 or self.eval.first_task < 0 or self.eval.episodes < 1:
            raise ValueError("eval.every and eval.first_task must be >= 0, eval.episodes >= 1")
        if not self.output_dir:
            raise ValueError("output_dir must not be empty")
        if self.dtype is not None:
            torch_dtype(self.dtype)
        check_precision(self.precision)
        if self.rollout_workers < 0:
            raise ValueError(f"rollout_workers must be >= 0, got {self.rollout_workers}")
        if not isinstance(self.max_staleness, int) or isinstance(self.max_staleness, bool) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0 (0: on-policy), got {self.max_staleness!r}")
        from agentgym.policies.ray_pool import check_weight_transfer
        check_weight_transfer(self.weight_transfer)
        if not isinstance(self.backend_options, dict):
            raise ValueError(f"backend_options must be a mapping, got {self.backend_options!r}")
        from agentgym.policies.registry import check_backend
        check_backend(self.backend, self.backend_options)   # a registered name, and options it takes
        lt = self.learner.temperature
        st = self.rollout.sampling.logprob_temperature
        if lt is not None and abs(lt - st) > 1e-9:
            raise ValueError(f"learner.temperature={lt} differs from sampling.temperature={st}: the learner must "
                             "recompute log-probs at the sampling temperature; remove learner.temperature")


def torch_dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must name a torch dtype (float32, bfloat16, float16), got {name!r}")
    return dtype
