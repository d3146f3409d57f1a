"""Scripted policies: replies from a function or a list. For tests, oracles and demonstrations."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from agentgym.backend import TokenBackend
from agentgym.policy import Generation, SamplingParams

__all__ = ["ScriptedPolicy"]


class ScriptedPolicy(TokenBackend):
    """Replies chosen by ``script`` and tokenized with a real tokenizer.

    ``script`` is a list of replies (reply ``k`` on turn ``k``, the last one repeated) or a function
    ``context -> reply``. The rollout engine passes one context per prompt (``wants_context``):
    ``turn``, ``messages`` (the conversation so far), ``task`` (privileged: oracles may use it) and
    ``prompt_ids``. Without the engine, the context holds only ``prompt_ids`` and ``turn`` 0.

    Generated ids end with the tokenizer's EOS when ``add_eos`` (a chat model ending its turn).
    Log-probs are 0 (a deterministic policy): scripted trajectories seed SFT, not importance-weighted RL.
    """

    needs_context = True

    @classmethod
    def from_spec(cls, spec: str, *, env_id: str | None = None, **_: Any) -> "ScriptedPolicy":
        """``oracle``: the env's scripted reference policy (registered as that spec)."""
        import agentgym
        from agentgym.policies.models import load_tokenizer
        if env_id is None:
            raise ValueError("the oracle policy needs an env")
        env = agentgym.make(env_id)
        oracle = getattr(env.unwrapped, "oracle", None)
        env.close()
        if oracle is None:
            raise ValueError(f"{env_id} defines no oracle")
        return cls(load_tokenizer(), oracle)

    def __init__(self, tokenizer: Any, script: Sequence[str] | Callable[[Mapping[str, Any]], str], *,
                 add_eos: bool = True):
        if not callable(script) and not len(script):
            raise ValueError("a scripted policy needs at least one reply")
        self.tokenizer = tokenizer
        self.script = script
        self.add_eos = add_eos

    def reply(self, context: Mapping[str, Any]) -> str:
        if callable(self.script):
            return str(self.script(context))
        return self.script[min(int(context.get("turn", 0)), len(self.script) - 1)]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                 contexts: Sequence[Mapping[str, Any]] | None = None) -> list[Generation]:
        out = []
        for i, p in enumerate(prompts):
            ctx = dict(contexts[i]) if contexts is not None else {"turn": 0}
            ctx.setdefault("prompt_ids", list(p))
            full = list(self.tokenizer.encode(self.reply(ctx), add_special_tokens=False))
            ids = full[: sampling.max_new_tokens]
            if len(ids) < len(full) or (self.add_eos and len(ids) == sampling.max_new_tokens):
                reason = "length"  # the budget ran out before the reply (or its EOS) was complete
            elif self.add_eos:
                ids.append(self.tokenizer.eos_token_id)
                reason = "eos"
            else:
                reason = "stop"
            out.append(Generation(ids, [0.0] * len(ids), self.tokenizer.decode(ids, skip_special_tokens=True), reason))
        return out
