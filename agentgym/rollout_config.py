"""The rollout settings: one :class:`RolloutConfig`, nested by every config that runs episodes.

``TrainConfig.rollout``, ``EvalRunConfig.rollout``, the SFT / DPO data collection (``rollout``) and
``agentgym compare`` all nest this class; nothing else stores a temperature. Learners read the
temperature from the trajectories (``Trajectory.temperature``), so the log-probs they recompute are
always at the temperature the episodes were sampled at. The engine that uses it is
:class:`agentgym.rollout.RolloutEngine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from agentgym.policy import SamplingParams

__all__ = ["ROLLOUT_ALIASES", "ROLLOUT_MODES", "RolloutConfig", "RolloutViews"]

ROLLOUT_MODES = ("async", "lockstep")


@dataclass
class RolloutConfig:
    """Settings of the rollout engine — the one place sampling and token layout live.

    Every field has a one-line help (``field(metadata={"help": ...})``, as TRL's configs do); two need
    more:

    ``mode``: ``async`` is the default because, measured (``benchmarks/rollout_async.py``, RESULTS.md),
    it gives the lockstep's trajectories for deterministic policies (greedy, scripted; every row of the
    benchmark) and is not slower: when ``generate`` dominates (HF on a CPU) it forms the lockstep's
    batches exactly, so the work is the same; when env steps dominate (sandbox runs on CodeExec) a slow
    step holds up only its own episode (1.5-1.7x faster there). Greedy log-probs agree to float rounding
    (an episode may share a padded batch with other episodes than in lockstep). *Sampling* with
    ``sampling.seed`` replays exactly in lockstep mode (the seed applies per ``generate`` call, and the
    calls are the same every run). In async mode it replays whenever the env steps return within the
    batching window (then the batches are the lockstep's; always so on a one-turn env with every episode
    running at once); when they don't, the composition of a batch depends on timing, and so do the
    sampled tokens — every episode is still a correct sample from the policy, but not the same one run
    to run. Use ``lockstep`` to debug or to replay.

    ``batch_wait_s``: ``None`` (default) = adaptive: half the duration of the last ``generate`` call, at
    least 10 ms; the first batch of a ``collect`` waits for every reset. Waiting costs at most that
    fraction of a generate call, while splitting a batch costs a whole extra call, so fast env steps
    always join (the lockstep's batches) and only slow ones are left for the next batch. ``0`` = never
    wait (pure continuous batching).
    """
    sampling: SamplingParams = field(default_factory=SamplingParams, metadata={
        "help": "sampling parameters; the env's stop_strings are added to sampling.stop"})
    style: str | None = field(default=None, metadata={
        "help": "token layout: chat or continuation; null = the env's observation_style"})
    max_obs_tokens: int | None = field(default=512, metadata={
        "help": "per-step observation budget (longer ones are cut, visibly); the task prompt is never cut"})
    max_context_tokens: int = field(default=4096, metadata={
        "help": "an episode whose next turn would not fit this many tokens ends as truncated"})
    env_workers: int = field(default=8, metadata={"help": "threads stepping envs concurrently"})
    debug_checks: bool = field(default=False, metadata={
        "help": "assert the token-faithfulness invariants after every episode"})
    mode: str = field(default="async", metadata={
        "help": "schedule: async (episodes advance independently) or lockstep (turn by turn; replays)"})
    max_concurrent_episodes: int | None = field(default=None, metadata={
        "help": "at most this many episodes at once (each holds an env and KV cache); null = all of a collect"})
    batch_wait_s: float | None = field(default=None, metadata={
        "help": "async: how long ready episodes wait for env calls in flight to join a batch; null = adaptive"})
    on_template_drift: str = field(default="keep", metadata={
        "help": "a chat template rewriting earlier turns: keep the sampled history verbatim, or error"})
    env_backend: str = field(default="thread", metadata={
        "help": "thread (envs in this process) or ray (each env in a Ray actor, agentgym.ray_envs)"})
    env_resources: dict[str, Any] | None = field(default=None, metadata={
        "help": "Ray resource requests of each env actor, e.g. {num_cpus: 1}; null = none"})
    ray_address: str | None = field(default=None, metadata={
        "help": "an existing Ray cluster (HEAD:6379); null = a local one, started on demand"})

    def __post_init__(self) -> None:
        if isinstance(self.sampling, Mapping):
            self.sampling = SamplingParams(**self.sampling)
        if self.style not in (None, "chat", "continuation"):
            raise ValueError(f"style must be chat, continuation or null (the env's), got {self.style!r}")
        if self.max_obs_tokens is not None and self.max_obs_tokens < 1:
            raise ValueError(f"max_obs_tokens must be >= 1 or null (no cut), got {self.max_obs_tokens}")
        if self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2, got {self.max_context_tokens}")
        if self.env_workers < 1:
            raise ValueError(f"env_workers must be >= 1, got {self.env_workers}")
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {self.mode!r}")
        if self.max_concurrent_episodes is not None and self.max_concurrent_episodes < 1:
            raise ValueError(f"max_concurrent_episodes must be >= 1 or null (all at once), got {self.max_concurrent_episodes}")
        if self.on_template_drift not in ("keep", "error", "segment"):
            raise ValueError(f"on_template_drift must be keep or error, got {self.on_template_drift!r}")
        if self.env_backend not in ("thread", "ray"):
            raise ValueError(f"env_backend must be thread or ray, got {self.env_backend!r}")
        if self.batch_wait_s is not None and not self.batch_wait_s >= 0:
            raise ValueError(f"batch_wait_s must be >= 0 or null (adaptive), got {self.batch_wait_s}")

    def replace(self, **changes: Any) -> "RolloutConfig":
        from dataclasses import replace
        return replace(self, **changes)

    def greedy(self) -> "RolloutConfig":
        """The same layout, greedy decoding (evaluations)."""
        return self.replace(sampling=self.sampling.replace(greedy=True))


#: Short spellings of the rollout settings, accepted by every config that nests a ``RolloutConfig``
#: as ``rollout`` (``sampling.temperature=0.7`` means ``rollout.sampling.temperature=0.7``).
ROLLOUT_ALIASES = {"sampling": "rollout.sampling", "style": "rollout.style",
                   "max_obs_tokens": "rollout.max_obs_tokens", "max_context_tokens": "rollout.max_context_tokens",
                   "debug_checks": "rollout.debug_checks", "env_workers": "rollout.env_workers",
                   "max_concurrent_episodes": "rollout.max_concurrent_episodes"}


class RolloutViews:
    """Read-only views of a config's nested ``rollout`` under the short names users type
    (``cfg.sampling``, ``cfg.style``, …). Views, not copies: the values live in ``cfg.rollout`` only."""
    rollout: RolloutConfig

    @property
    def sampling(self) -> SamplingParams:
        return self.rollout.sampling

    @property
    def style(self) -> str | None:
        return self.rollout.style

    @property
    def max_obs_tokens(self) -> int | None:
        return self.rollout.max_obs_tokens

    @property
    def max_context_tokens(self) -> int:
        return self.rollout.max_context_tokens

    @property
    def debug_checks(self) -> bool:
        return self.rollout.debug_checks


