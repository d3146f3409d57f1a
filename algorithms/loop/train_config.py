"""The training run's config tree: :class:`TrainConfig`, every setting ``agentgym train`` takes, with
its sections.

Every knob has a default and a one-line help (``field(metadata={"help": ...})``, TRL's way);
:func:`agentgym.app.knobs.describe_configs` lists them (``agentgym config [train|sft|dpo|eval]``). Each
knob is declared once, in the part that reads it, and reached by one path in every command: the
optimizer is ``optim:`` (:class:`~agentgym.algorithms.loop.optim.OptimConfig`, as in ``agentgym sft`` and
``dpo``), a LoRA adapter ``lora:``, the model ``model``; the ``learner:`` section is the chosen
algorithm's typed config (``GRPOConfig`` for ``algo=grpo``, … in :mod:`..catalog`, a user-registered
learner's own class), checked against it key by key; the rollout settings are the kernel's one
:class:`~agentgym.rollout_config.RolloutConfig`. Every config is checked once, on construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import torch

from agentgym.config import from_dict
from agentgym.policy import SamplingParams
from agentgym.precision import check_precision
from agentgym.rollout_config import ROLLOUT_ALIASES, RolloutConfig, RolloutViews

from agentgym.algorithms.catalog import learner_config_class
from agentgym.algorithms.loop.group_filter import GroupFilterConfig
from agentgym.algorithms.loop.health import HealthConfig
from agentgym.algorithms.loop.learner_config import UpdateConfig, check_temperature
from agentgym.algorithms.loop.optim import LoraSettings, OptimConfig

__all__ = ["TrainConfig", "EvalConfig", "torch_dtype"]


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

    ``learner`` is the typed config of ``algo``'s learner (:func:`~agentgym.algorithms.catalog.learner_config_class`):
    from YAML or ``learner.KEY=VALUE`` each key is checked against that class (an unknown key lists the
    known ones); in Python pass an instance, or a mapping, built into that class here (the default
    ``{}``: the algorithm's defaults). ``optim`` (lr 1e-5 for the main job) and ``lora`` are the run's,
    as in ``agentgym sft`` and ``dpo``.
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
    learner: UpdateConfig = field(default_factory=lambda: {"micro_batch_size": 16}, metadata={
        "help": "the learner's settings: the update loop, the loss and its parts' (algo's typed config); "
                "the main job's: its 16 episodes in one micro-batch (bf16 on the CPU recasts the weights per "
                "micro-batch; 4 of 4 rows made the update 1.4x fp32, one of 16 about 2x)",
        "defaults_belong_to": "algo", "type_by_owner": learner_config_class})
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5), metadata={
        "help": "the optimizer: AdamW, lr schedule, gradient clipping (as in agentgym sft and dpo)"})
    lora: LoraSettings | None = field(default=None, metadata={
        "help": "a LoRA adapter {r, alpha, dropout, target_modules}; null = full fine-tuning"})
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
        self._build_learner()
        self._check_counts()
        if self.dtype is not None:
            torch_dtype(self.dtype)
        check_precision(self.precision)
        from agentgym.policies.backends import check_weight_transfer   # the registry module: no engine imported
        check_weight_transfer(self.weight_transfer)
        if not isinstance(self.backend_options, dict):
            raise ValueError(f"backend_options must be a mapping, got {self.backend_options!r}")
        from agentgym.policies.backends import check_backend
        check_backend(self.backend, self.backend_options)   # a registered name, and options it takes
        check_temperature(self.learner.temperature, self.rollout.sampling.logprob_temperature)

    def _build_learner(self) -> None:
        """``learner`` as ``algo``'s typed config: a mapping is built into it, an instance is checked."""
        expected = learner_config_class(self.algo)
        if isinstance(self.learner, Mapping):
            self.learner = from_dict(expected, self.learner, prefix="learner")
        if not isinstance(self.learner, expected):
            raise ValueError(f"learner: algo={self.algo} takes a {expected.__name__}, "
                             f"got {type(self.learner).__name__}")

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
