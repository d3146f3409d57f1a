"""The one typed interface the rollout engine and the trainer know a generation backend by.

It lives in the kernel so that the rollout engine can talk to any policy without importing a concrete
backend (the kernel imports nothing from ``agentgym.policies``); the backends themselves, their
registry and the loader live in :mod:`agentgym.policies`, which imports this module.

A :class:`Backend` generates (a :class:`TokenBackend`: ``generate`` with a tokenizer; a
:class:`ChatBackend`: ``respond``, for a chat-only endpoint),
may take new weights (``sync_weights``), may hold caches (``clear_kv_cache``) and resources
(``close``), and *declares* what it can do in class attributes, so callers branch on a capability,
never on a backend's name or on whether an attribute happens to exist:

* ``token_level`` — ``generate`` returns the sampled ids with their log-probs (trainable
  trajectories); False: chat-only, evaluation only.
* ``answers_chat`` — ``respond(conversations, sampling, tools)`` answers chat messages.
* ``supports_weight_sync`` — ``sync_weights`` loads a learner's weights into it.
* ``separate_engine`` — it holds its own copy of the weights (an engine, actors): a trainer must
  sync it after every update.
* ``trains_in_place`` — it can sample with the very module the learner trains (colocated: nothing
  to copy).
* ``follows_run_precision`` — it generates under the run's autocast (it takes ``precision=``).
* ``engine_bf16_with_run`` — as a separate engine it runs in bf16 when the run's precision is bf16.
* ``reports_progress`` — ``generate`` takes ``on_progress=fn`` and calls ``fn(sequences_done, tokens)``
  after every decode step (live progress bars).
* ``needs_context`` — ``generate`` takes ``contexts=`` (turn, messages, privileged task), as a
  scripted policy does; ``wants_context`` is the same flag under the name the engine has always read.

The user-facing :class:`~agentgym.policy.Policy` protocol stays what it is (``tokenizer`` and
``generate``): :func:`as_backend` gives such an object the rest of the interface, with no-op caches
and ``close``, and ``sync_weights`` only where the object has one.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from agentgym.policy import Generation, SamplingParams

__all__ = ["Backend", "TokenBackend", "ChatBackend", "ProtocolBackend", "as_backend", "tokenizer_of"]


class Backend:
    """Base class of generation backends (see the module docstring for the capability flags).

    Subclass :class:`TokenBackend` (``tokenizer`` and ``generate``: trainable) or :class:`ChatBackend`
    (``respond``: a chat endpoint, evaluation only); this base holds what both share."""

    token_level: bool = False
    answers_chat: bool = False
    supports_weight_sync: bool = False
    separate_engine: bool = False
    trains_in_place: bool = False
    follows_run_precision: bool = False
    engine_bf16_with_run: bool = False
    needs_context: bool = False
    reports_progress: bool = False

    @property
    def wants_context(self) -> bool:
        return self.needs_context

    # ------------------------------------------------------------------ weights, caches, resources
    def sync_weights(self, weights: Any) -> float:
        """Load a learner's weights (an ``nn.Module`` or ``(name, tensor)`` pairs); seconds taken."""
        raise NotImplementedError(f"{type(self).__name__} cannot take new weights (supports_weight_sync=False)")

    def clear_kv_cache(self) -> None:
        """Drop per-sequence caches (called when a collection has ended); none by default."""

    def close(self) -> None:
        """Release engines, actors, connections; nothing by default."""

    # ------------------------------------------------------------------ the registry's side
    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """A clear error for an option this backend does not take (default: any option is passed on)."""

    @classmethod
    def available(cls) -> str | None:
        """None when this backend can run here, else why not (checked cheaply, without loading it)."""
        return None

    @classmethod
    def preferred_here(cls) -> bool:
        """Whether this backend should be the default on this machine (the registry's first such wins)."""
        return False

    @classmethod
    def from_spec(cls, spec: str, *, device: str | None = None, dtype: Any = None, seed: int = 0,
                  env_id: str | None = None, **options: Any) -> "Backend":
        """This backend serving the model ``spec`` names (see :mod:`agentgym.policies.loading`)."""
        raise NotImplementedError(f"{cls.__name__} cannot be loaded from a model spec")


class TokenBackend(Backend):
    """A token-level backend: the :class:`~agentgym.policy.Policy` protocol (``tokenizer``, ``generate``
    returning ids exactly as sampled with their log-probs)."""

    token_level = True
    #: a Hugging Face tokenizer
    tokenizer: Any = None

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        raise NotImplementedError


class ChatBackend(Backend):
    """A chat-only backend: the :class:`~agentgym.policy.ChatPolicy` protocol (``respond``). It has no
    ``tokenizer`` and no ``generate``, so the engine takes its chat path (evaluation only)."""

    answers_chat = True

    def respond(self, conversations: Sequence[Sequence[dict[str, str]]], sampling: SamplingParams,
                tools: Sequence[dict[str, Any]] | None = None) -> list[Generation]:
        raise NotImplementedError


class ProtocolBackend(Backend):
    """A user's object that implements only the :class:`~agentgym.policy.Policy` protocol (``tokenizer``
    and ``generate``) or :class:`~agentgym.policy.ChatPolicy` (``respond``), seen as a :class:`Backend`.

    What the object has is used (``sync_weights``, ``clear_kv_cache``, ``close``, ``wants_context``);
    what it lacks, the base class provides. This is the one place that looks at which methods a
    policy object happens to have."""

    tokenizer: Any = None

    def __init__(self, inner: Any):
        self.inner = inner
        self.tokenizer = getattr(inner, "tokenizer", None)
        self.token_level = callable(getattr(inner, "generate", None)) and self.tokenizer is not None
        self.needs_context = bool(getattr(inner, "wants_context", False))
        self.reports_progress = bool(getattr(inner, "reports_progress", False))
        self.supports_weight_sync = callable(getattr(inner, "sync_weights", None))
        self.separate_engine = bool(getattr(inner, "separate_engine", False))
        self.answers_chat = callable(getattr(inner, "respond", None))

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, **kwargs: Any) -> list[Generation]:
        return self.inner.generate(prompts, sampling, **kwargs)

    def respond(self, conversations: Sequence[Sequence[dict[str, str]]], sampling: SamplingParams,
                tools: Sequence[dict[str, Any]] | None = None) -> list[Generation]:
        if not self.answers_chat:
            raise NotImplementedError(f"{type(self.inner).__name__} has no respond(conversations, sampling)")
        return self.inner.respond(conversations, sampling, tools=tools)

    def sync_weights(self, weights: Any) -> float:
        if not self.supports_weight_sync:
            return super().sync_weights(weights)
        return self.inner.sync_weights(weights)

    def clear_kv_cache(self) -> None:
        release = getattr(self.inner, "clear_kv_cache", None)
        if callable(release):
            release()

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()



def tokenizer_of(policy: Any) -> Any | None:
    """The tokenizer of a policy or backend; None for a chat-only one."""
    backend = as_backend(policy)
    return backend.tokenizer if isinstance(backend, (TokenBackend, ProtocolBackend)) else None


def as_backend(policy: Any) -> Backend:
    """``policy`` itself when it is a :class:`Backend`, else a :class:`ProtocolBackend` around it."""
    return policy if isinstance(policy, Backend) else ProtocolBackend(policy)
