"""The policy contract: batched token-level generation.

A :class:`Policy` takes token-id prompts and returns, per prompt, the sampled ids *exactly as
sampled*, their log-probabilities, the decoded text and why generation stopped. The rollout engine
builds trajectories from these without ever re-tokenizing a policy's text.

A :class:`ChatPolicy` (e.g. a hosted model behind an OpenAI-compatible API) only exchanges
messages; it can be evaluated but not trained, since its tokens are not ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

__all__ = ["SamplingParams", "Generation", "Policy", "ChatPolicy", "cut_at_stop", "weight_name_mismatch"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one ``generate`` call.

    ``logprobs`` returned by policies are log-softmax of ``logits / temperature`` (before top-p /
    top-k filtering) — the same quantity a learner recomputes for importance ratios.
    ``stop``: generation of a sequence ends at the token that completes any of these strings;
    that token is kept.
    """
    max_new_tokens: int = field(default=256, metadata={"help": "most tokens sampled per turn (>= 1)"})
    temperature: float = field(default=1.0, metadata={
        "help": "softmax temperature (> 0); the learner recomputes log-probs at this temperature"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass in (0, 1]; 1 = off"})
    top_k: int = field(default=0, metadata={"help": "sample among the k likeliest tokens; 0 = off"})
    greedy: bool = field(default=False, metadata={"help": "argmax decoding (log-probs then at temperature 1)"})
    stop: tuple[str, ...] = field(default=(), metadata={
        "help": "strings that end a turn at the token completing them (that token is kept)"})
    seed: int | None = field(default=None, metadata={
        "help": "seed of each generate call (replayable sampling); null = unseeded"})

    def __post_init__(self) -> None:
        import math
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not math.isfinite(self.temperature) or (not self.greedy and self.temperature <= 0):
            raise ValueError(f"temperature must be a finite number > 0 when sampling (use greedy=True for argmax), "
                             f"got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the returned log-probs: ``temperature``, or 1 for greedy decoding."""
        return 1.0 if self.greedy else float(self.temperature)

    def replace(self, **changes: Any) -> "SamplingParams":
        from dataclasses import replace
        return replace(self, **changes)


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (stop string), "eos", "length"
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """Token-level policy. ``tokenizer`` is a Hugging Face tokenizer."""
    tokenizer: Any

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]: ...


@runtime_checkable
class ChatPolicy(Protocol):
    """Message-level policy (evaluation only): one reply text per conversation."""

    def respond(self, conversations: Sequence[Sequence[dict[str, str]]], sampling: SamplingParams,
                tools: Sequence[dict[str, Any]] | None = None) -> list[Generation]: ...


def weight_name_mismatch(expected: Iterable[str], given: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(missing, unexpected)`` weight names of ``given`` against a model's ``expected`` names, sorted.

    A tied ``lm_head.weight`` may be absent (it is the embedding). The one check that weight loads
    (engine syncs, checkpoint loads) run *before* loading anything, so a mismatch never half-loads."""
    expected, given = set(expected), set(given)
    missing = sorted(k for k in expected - given if not k.endswith("lm_head.weight"))
    return missing, sorted(given - expected)


def cut_at_stop(token_ids: Sequence[int], decode: Any, stop: Sequence[str], eos_ids: Sequence[int] = (),
                window: int = 32) -> tuple[int, str]:
    """Index just past the token that ends generation, and the finish reason.

    Scans tokens in order: an EOS id ends it ("eos"); otherwise the first token whose decoded
    suffix window contains a stop string ends it ("stop"); else everything is kept ("length").
    ``decode`` maps a list of ids to text. Stop strings longer than ``window`` tokens are not
    supported (none in practice).
    """
    eos = set(eos_ids)
    for i, t in enumerate(token_ids):
        if t in eos:
            return i + 1, "eos"
        if stop:
            piece = decode(list(token_ids[max(0, i - window + 1): i + 1]))
            if any(s in piece for s in stop):  # scanning in order: token i completes it
                return i + 1, "stop"
    return len(token_ids), "length"
