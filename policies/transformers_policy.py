"""A trainable policy backed by a Hugging Face causal LM."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import StopStringCriteria, StoppingCriteriaList

from agentgym.policy import Generation, SamplingParams, cut_at_stop

from agentgym.policies.models import DEFAULT_MODEL, load_model, load_tokenizer, tiny_random_model

__all__ = ["TransformersPolicy", "load"]


class TransformersPolicy:
    """Batched sampling from a causal LM, returning ids exactly as sampled with their log-probs.

    Prompts of different lengths are left-padded into one batch. Log-probs are log-softmax of
    ``logits / temperature`` at the sampled token (what a learner recomputes for ratios).
    ``model`` (the torch module) is what a colocated learner trains in place: then
    :meth:`sync_weights` has nothing to copy.

    Args:
        model: a ``transformers`` causal LM (already on its device).
        tokenizer: its tokenizer.
        max_batch_size: prompts per forward batch (longer lists are split).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 64, name: str | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.name = name or getattr(getattr(model, "config", None), "_name_or_path", "model")
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            eos.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            eos.update(gen_eos)
        self.eos_ids = sorted(e for e in eos if e is not None)
        # StopStringCriteria preprocesses the whole vocabulary (~1 s for 49k tokens) and transformers'
        # own cache misses (its key is the vocab dict's order, which varies): build one per stop tuple.
        self._stop_criteria: dict[tuple[str, ...], Any] = {}

    @classmethod
    def from_pretrained(cls, name: str = DEFAULT_MODEL, *, device: str | None = None, dtype: Any = None,
                        **kwargs: Any) -> "TransformersPolicy":
        """Load by short name (``smollm2``), GGUF file, local directory or hub id."""
        return cls(load_model(name, device=device, dtype=dtype), load_tokenizer(name), name=name, **kwargs)

    @classmethod
    def tiny_random(cls, tokenizer: str | Any = DEFAULT_MODEL, seed: int = 0, **kwargs: Any) -> "TransformersPolicy":
        """A 2-layer random Llama with a real tokenizer: for tests and benchmarks of the machinery."""
        tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        return cls(tiny_random_model(tok, seed=seed), tok, name="tiny-random", **kwargs)

    def sync_weights(self, weights: Any) -> float:
        """Load new weights (an ``nn.Module`` or ``(name, tensor)`` pairs); returns the seconds taken.

        A learner that trains this policy's own module (the default with the hf backend) passes that
        module, or a PEFT wrapper around it: the weights are already in place and nothing is copied."""
        import time
        t0 = time.perf_counter()
        if isinstance(weights, torch.nn.Module):
            mine = {id(p) for p in self.model.parameters()}
            if any(id(p) in mine for p in weights.parameters()):
                return 0.0
            weights = weights.state_dict().items()
        state = {k: v for k, v in weights}
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied embeddings
        if missing or unexpected:
            raise ValueError(f"sync_weights: weights do not match the model (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
        return time.perf_counter() - t0

    def close(self) -> None:
        """Nothing to release (the module is garbage-collected with the policy)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _stop_criterion(self, stop: tuple[str, ...]) -> StopStringCriteria:
        if stop not in self._stop_criteria:
            self._stop_criteria[stop] = StopStringCriteria(self.tokenizer, list(stop))
        return self._stop_criteria[stop]

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        out: list[Generation] = []
        for i in range(0, len(prompts), self.max_batch_size):
            out.extend(self._generate_batch(prompts[i:i + self.max_batch_size], sampling))
        return out

    def _generate_batch(self, prompts: Sequence[Sequence[int]], sp: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, p in enumerate(prompts):
            if len(p):
                input_ids[r, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
                attention[r, width - len(p):] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        if sp.seed is not None:
            torch.manual_seed(sp.seed)
        kwargs: dict[str, Any] = dict(max_new_tokens=sp.max_new_tokens, return_dict_in_generate=True,
                                      output_logits=True, pad_token_id=pad, eos_token_id=self.eos_ids)
        if sp.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k or None)
        if sp.stop:
            kwargs["stopping_criteria"] = StoppingCriteriaList([self._stop_criterion(tuple(sp.stop))])
        was_training = self.model.training
        self.model.eval()
        try:
            res = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        finally:
            self.model.train(was_training)
        new = res.sequences[:, width:].cpu()
        temperature = 1.0 if sp.greedy else sp.temperature
        # (batch, steps, vocab) -> log-prob of each sampled token
        logits = torch.stack(res.logits, dim=1).float()[:, : new.shape[1]]
        logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, new.to(logits.device).unsqueeze(-1)).squeeze(-1).cpu()
        gens = []
        for r in range(len(prompts)):
            ids = new[r].tolist()
            end, reason = cut_at_stop(ids, self._decode, sp.stop, self.eos_ids)
            ids = ids[:end]
            gens.append(Generation(ids, logp[r, :end].tolist(),
                                   self.tokenizer.decode(ids, skip_special_tokens=True), reason))
        return gens


def load(model_dir: str, *, tokenizer: Any = None, device: str | None = None, dtype: Any = None, seed: int = 0,
         **options: Any) -> TransformersPolicy:
    """The ``hf`` entry of :data:`agentgym.policies.loading.POLICY_BACKENDS`."""
    model = load_model(model_dir, device=device, dtype=dtype)
    return TransformersPolicy(model, tokenizer if tokenizer is not None else load_tokenizer(model_dir), **options)
