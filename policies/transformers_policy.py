"""A trainable policy backed by a Hugging Face causal LM."""

from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict
from typing import Any, Callable, Sequence

import torch
from transformers import (LogitsProcessor, LogitsProcessorList, StoppingCriteria, StopStringCriteria,
                          StoppingCriteriaList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from agentgym.policy import Generation, SamplingParams, cut_at_stop, weight_name_mismatch

from agentgym.backend import TokenBackend
from agentgym.policies.models import DEFAULT_MODEL, load_model, load_tokenizer, tiny_random_model

__all__ = ["TransformersPolicy", "load", "check_options", "OPTIONS"]

#: what ``load_policy(spec, "hf", **options)`` accepts (the constructor's keyword options)
OPTIONS = ("max_batch_size", "reuse_kv", "kv_cache_tokens", "attn_implementation", "precision")


@functools.cache
def generate_cache_name() -> str:
    """The name ``generate`` gives the KV cache, both as an argument and on its output.

    transformers renamed ``past_key_values`` to ``cache``; where it did, the old name still works but
    each ``generate(past_key_values=…)`` emits a FutureWarning and reading ``output.past_key_values``
    logs a deprecation line, on every run that reuses KV. The output class declares the name the
    installed version uses (the argument was renamed with it), so we ask it rather than a version.
    """
    from transformers.generation.utils import GenerateDecoderOnlyOutput
    fields = {f.name for f in dataclasses.fields(GenerateDecoderOnlyOutput)}
    return "cache" if "cache" in fields else "past_key_values"


def check_options(options: dict[str, Any]) -> None:
    """A clear error for an option the hf backend does not have (instead of silently ignoring it)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown hf backend option(s) {unknown}; the hf backend takes {list(OPTIONS)}")


class InverseCdfSampler(LogitsProcessor):
    """Draws each row's next token from ``softmax(scores)`` with one uniform number per row (inverse CDF:
    the first token whose cumulative probability exceeds it), and returns scores that make greedy
    decoding pick exactly that token (0 there, -inf elsewhere).

    The same categorical distribution ``torch.multinomial`` samples, from a different random stream
    (the global torch generator, seeded as before). Why: on the CPU ``multinomial`` draws an exponential
    for every vocabulary entry, 23 ms per decode step for 16 rows × 49 152 tokens at 2 threads, about a
    sixth of SmolLM2's whole decode step; this takes 2 ms (``benchmarks/notes/performance.md``, issue 49).
    A token of probability 0 (cut by top-k / top-p) is never drawn: its cumulative value equals its
    predecessor's, and the search takes the first entry strictly above ``u``.
    """

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        cdf = torch.softmax(scores.float(), dim=-1).cumsum_(-1)
        u = torch.rand((scores.shape[0], 1), device=scores.device) * cdf[:, -1:]
        token = torch.searchsorted(cdf, u, right=True).clamp_(max=scores.shape[-1] - 1)
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)


def sampling_processors(sp: SamplingParams) -> LogitsProcessorList:
    """Temperature, top-k and top-p (``transformers``' own warpers, in the order ``generate`` applies them),
    then :class:`InverseCdfSampler`: for ``generate(do_sample=False)``, which then takes the drawn token.
    The model's ``generation_config`` adds no sampling setting of its own on this path."""
    procs: list[LogitsProcessor] = []
    if sp.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(sp.temperature))
    if sp.top_k:
        procs.append(TopKLogitsWarper(sp.top_k))
    if sp.top_p < 1.0:
        procs.append(TopPLogitsWarper(sp.top_p))
    return LogitsProcessorList([*procs, InverseCdfSampler()])


class _ProgressCriterion(StoppingCriteria):
    """Reports, after every decode step of one ``generate`` call, how many sequences are done and how many
    tokens were generated, without stopping anything itself: a row is done once it emits an end-of-sequence
    id or once ``inner`` (the stop-string criteria, or none) says so — the same rule ``generate`` applies."""

    def __init__(self, inner: StoppingCriteriaList, eos_ids: Sequence[int], rows: int,
                 report: Callable[[int, int], None]) -> None:
        self.inner, self.report = inner, report
        self.eos = torch.tensor(list(eos_ids) or [-1])
        self.done = torch.zeros(rows, dtype=torch.bool)
        self.tokens = 0

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        stop = self.inner(input_ids, scores, **kwargs)   # all False when there are no stop strings
        active = int((~self.done).sum())
        self.tokens += active
        last = input_ids[:, -1].cpu()
        self.done |= stop.cpu() | torch.isin(last, self.eos)
        self.report(int(self.done.sum()), self.tokens)
        return stop


class TransformersPolicy(TokenBackend):
    """Batched sampling from a causal LM, returning ids exactly as sampled with their log-probs.

    Prompts of different lengths are left-padded into one batch. Log-probs are log-softmax of
    ``logits / temperature`` at the sampled token (what a learner recomputes for ratios).
    ``model`` (the torch module) is what a colocated learner trains in place: then
    :meth:`sync_weights` has nothing to copy.

    **KV reuse across turns.** An agent's next prompt extends its last one: prompt + the sampled ids +
    the env's new tokens. ``generate`` keeps the KV cache only within a call, so every turn would
    prefill the whole history again (on this CPU a 5-turn SearchQA episode spends most of its
    generate time there). After each call the policy keeps each sequence's keys/values (an
    LRU store bounded by ``kv_cache_tokens``); a later prompt that starts with a stored sequence
    reuses it, and only the new tokens are prefilled. Batches mix episodes: the stored caches are
    left-padded into one cache whose length is the shortest cached share over the batch (the rest is
    recomputed). Correctness guards: an entry is used once (the next turn stores a longer one); the
    store is dropped whenever any parameter changes in place (tensor version counters, so an
    optimizer step or ``load_state_dict`` can never leave stale keys, with or without
    :meth:`sync_weights`); only plain full-attention caches are reused. Log-probs match a
    recomputation from scratch to float rounding (tested).

    Args:
        model: a ``transformers`` causal LM (already on its device).
        tokenizer: its tokenizer.
        max_batch_size: prompts per forward batch (longer lists are split).
        reuse_kv: keep sequences' KV caches between calls (see above); False recomputes every prompt.
        kv_cache_tokens: the most tokens kept in the store (SmolLM2-135M: 46 KB per token in fp32).

    Registered as the ``hf`` backend: it samples with the module the learner trains (``trains_in_place``)
    or, as a separate copy, takes synced weights; it generates under the run's autocast.
    """

    supports_weight_sync = True
    trains_in_place = True
    follows_run_precision = True
    reports_progress = True

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 64, name: str | None = None,
                 reuse_kv: bool = True, kv_cache_tokens: int = 32768, precision: str = "fp32"):
        if kv_cache_tokens < 0:
            raise ValueError(f"kv_cache_tokens must be >= 0 (got {kv_cache_tokens})")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.reuse_kv = bool(reuse_kv)
        self.kv_cache_tokens = int(kv_cache_tokens)
        self._kv: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self._kv_tokens = 0
        self._kv_weights: tuple[int, ...] | None = None
        #: tokens whose keys/values came from the store instead of a prefill (for benchmarks and logs)
        self.kv_reused_tokens = 0
        #: generation runs under this autocast (bf16: the run's precision, see agentgym.precision)
        self.use_precision(precision)
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
                        attn_implementation: str | None = None, **kwargs: Any) -> "TransformersPolicy":
        """Load by short name (``smollm2``), GGUF file, local directory or hub id."""
        return cls(load_model(name, device=device, dtype=dtype, attn_implementation=attn_implementation),
                   load_tokenizer(name), name=name, **kwargs)

    @classmethod
    def tiny_random(cls, tokenizer: str | Any = DEFAULT_MODEL, seed: int = 0, *, device: str | None = None,
                    attn_implementation: str | None = None, **kwargs: Any) -> "TransformersPolicy":
        """A 2-layer random Llama with a real tokenizer: for tests and benchmarks of the machinery."""
        tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        model = tiny_random_model(tok, seed=seed, device=device or "cpu")
        if attn_implementation:
            model.set_attn_implementation(attn_implementation)
        return cls(model, tok, name="tiny-random", **kwargs)

    @classmethod
    def check_options(cls, options: Any) -> None:
        check_options(dict(options))

    @classmethod
    def from_spec(cls, spec: str, *, device: str | None = None, dtype: Any = None, seed: int = 0,
                  env_id: str | None = None, **options: Any) -> "TransformersPolicy":
        """Any model spec, LoRA checkpoints merged (:func:`~agentgym.policies.loading.load_trained_policy`).
        ``options`` were checked by the one loader (:func:`~agentgym.policies.loading.load_policy`)."""
        from agentgym.policies.loading import load_trained_policy
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        return load_trained_policy(spec, device=device, dtype=dtype, seed=seed, **options)

    def sync_weights(self, weights: Any) -> float:
        """Load new weights (an ``nn.Module`` or ``(name, tensor)`` pairs); returns the seconds taken.

        A learner that trains this policy's own module (the default with the hf backend) passes that
        module, or a PEFT wrapper around it: the weights are already in place and nothing is copied."""
        import time
        t0 = time.perf_counter()
        self.clear_kv_cache()
        if isinstance(weights, torch.nn.Module):
            mine = {id(p) for p in self.model.parameters()}
            if any(id(p) in mine for p in weights.parameters()):
                return 0.0
            weights = weights.state_dict().items()
        state = {k: v for k, v in weights}
        missing, unexpected = weight_name_mismatch(self.model.state_dict(), state)
        if missing or unexpected:   # checked before loading: a mismatch never half-loads the model
            raise ValueError(f"sync_weights: weights do not match the model (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
        self.model.load_state_dict(state, strict=False)
        return time.perf_counter() - t0

    def use_precision(self, precision: str) -> None:
        """Generate under ``precision`` (``fp32`` or ``bf16``) from now on. A trainer handed this policy to train
        in place calls it with the run's resolved precision, so that sampling and the learner agree (as when
        the trainer loads the model itself); the KV store, computed at the old precision, is dropped."""
        from agentgym.precision import Precision, check_precision
        if check_precision(precision) == "auto":
            raise ValueError("precision: the hf policy takes a resolved fp32 or bf16 (the trainer resolves auto)")
        self.precision = Precision(precision, self.device.type, precision)
        self.clear_kv_cache()

    def close(self) -> None:
        """Drops the KV store (the module is garbage-collected with the policy)."""
        self.clear_kv_cache()

    # --- KV reuse across turns -------------------------------------------------------------------------

    def clear_kv_cache(self) -> None:
        """Forget every stored sequence cache (done automatically when the weights change)."""
        self._kv.clear()
        self._kv_tokens = 0

    def _weights_version(self) -> tuple[int, ...]:
        # In-place updates (optimizer steps, load_state_dict, LoRA merges) bump a tensor's version counter.
        return tuple(p._version for p in self.model.parameters())

    def _take_cached(self, prompt: Sequence[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest stored prefix of ``prompt`` (shorter than it), removed from the store."""
        best, best_len = None, 0
        n = len(prompt)
        for key in self._kv:
            k = len(key)
            if best_len < k < n and tuple(prompt[:k]) == key:
                best, best_len = key, k
        if best is None:
            return 0, None
        self._kv_tokens -= best_len
        return best_len, self._kv.pop(best)

    def _store(self, key: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if not key or len(key) > self.kv_cache_tokens:
            return
        if key in self._kv:
            self._kv_tokens -= len(key)
            del self._kv[key]
        self._kv[key] = layers
        self._kv_tokens += len(key)
        while self._kv_tokens > self.kv_cache_tokens:
            old, _ = self._kv.popitem(last=False)
            self._kv_tokens -= len(old)

    def _merged_cache(self, prompts: Sequence[Sequence[int]], width: int) -> Any:
        """One left-padded cache for the batch from the stored per-sequence caches, or None.

        Row r is ``pad_r`` pads + its prompt; the batch cache covers the first ``P`` positions of every
        row, ``P = min_r(pad_r + cached_r)``: for row r that is ``P - pad_r`` cached tokens after the
        pads (zeros under a zero attention mask). Positions are taken from the attention mask, so a
        cached key computed at its token's real position stays valid under any padding."""
        from transformers import DynamicCache
        taken = [self._take_cached(p) for p in prompts]
        if not any(c for c, _ in taken):
            return None
        P = min(width - len(p) + c for p, (c, _) in zip(prompts, taken))
        if P <= 0:
            return None
        # (row, its pad, how many of its cached tokens the batch cache holds) for the rows that give any
        rows = [(r, width - len(p), P - (width - len(p))) for r, (p, (_, layers)) in enumerate(zip(prompts, taken))
                if layers is not None and P > width - len(p)]
        if not rows:        # every cached row starts after P (only padding would be cached): nothing to reuse
            return None
        ref = taken[rows[0][0]][1]
        merged = []
        for li, (k0, v0) in enumerate(ref):
            keys = k0.new_zeros((len(prompts), k0.shape[0], P, k0.shape[-1]))
            vals = v0.new_zeros((len(prompts), v0.shape[0], P, v0.shape[-1]))
            for r, pad, use in rows:
                keys[r, :, pad:P] = taken[r][1][li][0][:, :use]
                vals[r, :, pad:P] = taken[r][1][li][1][:, :use]
            merged.append((keys, vals))
        self.kv_reused_tokens += sum(use for _, _, use in rows)
        return DynamicCache(ddp_cache_data=merged)

    def _keep_caches(self, cache: Any, prompts: Sequence[Sequence[int]], width: int,
                     kept: Sequence[Sequence[int]]) -> None:
        """Store each row's keys/values for ``prompt + kept ids`` minus the last id (never forwarded)."""
        from transformers.cache_utils import DynamicLayer
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            return  # sliding-window / hybrid / quantized caches: not reused
        for r, (p, ids) in enumerate(zip(prompts, kept)):
            seq = list(p) + list(ids[:-1]) if ids else list(p)
            pad = width - len(p)
            end = pad + len(seq)
            if end > layers[0].keys.shape[-2]:
                continue
            self._store(tuple(seq), [(layer.keys[r, :, pad:end].clone(), layer.values[r, :, pad:end].clone())
                                     for layer in layers])

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
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                 on_progress: Callable[[int, int], None] | None = None) -> list[Generation]:
        """``on_progress(sequences_done, tokens_generated)`` after every decode step (for live progress
        bars: a batched call otherwise shows nothing until its slowest sequence ends)."""
        out: list[Generation] = []
        with self.precision.autocast():
            for i in range(0, len(prompts), self.max_batch_size):
                report = None
                if on_progress is not None:
                    done_before, tokens_before = len(out), sum(len(g.token_ids) for g in out)
                    report = (lambda d, t, d0=done_before, t0=tokens_before: on_progress(d0 + d, t0 + t))
                out.extend(self._generate_batch(prompts[i:i + self.max_batch_size], sampling, report))
        return out

    def _generate_batch(self, prompts: Sequence[Sequence[int]], sp: SamplingParams,
                        report: Callable[[int, int], None] | None = None) -> list[Generation]:
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
        past = None
        if self.reuse_kv:
            version = self._weights_version()
            if version != self._kv_weights:
                self.clear_kv_cache()
                self._kv_weights = version
            past = self._merged_cache(prompts, width)
        if sp.seed is not None:
            torch.manual_seed(sp.seed)
        kwargs: dict[str, Any] = dict(max_new_tokens=sp.max_new_tokens, return_dict_in_generate=True,
                                      output_logits=True, pad_token_id=pad, eos_token_id=self.eos_ids)
        # sampling is our logits processors + greedy's argmax (see InverseCdfSampler: multinomial is slow on the CPU)
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if not sp.greedy:
            kwargs["logits_processor"] = sampling_processors(sp)
        if past is not None:
            kwargs[generate_cache_name()] = past
        criteria = StoppingCriteriaList([self._stop_criterion(tuple(sp.stop))] if sp.stop else [])
        if report is not None:   # wraps the stop criteria: it sees which rows they end
            criteria = StoppingCriteriaList([_ProgressCriterion(criteria, self.eos_ids, len(prompts), report)])
        if criteria:
            kwargs["stopping_criteria"] = criteria
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
        if self.reuse_kv and self.kv_cache_tokens:
            self._keep_caches(getattr(res, generate_cache_name()), prompts, width, [g.token_ids for g in gens])
        return gens


def load(model_dir: str, *, tokenizer: Any = None, device: str | None = None, dtype: Any = None, seed: int = 0,
         **options: Any) -> TransformersPolicy:
    """An hf policy on a plain model directory (``from_spec`` takes any model spec)."""
    check_options(options)
    model = load_model(model_dir, device=device, dtype=dtype, attn_implementation=options.pop("attn_implementation", None))
    return TransformersPolicy(model, tokenizer if tokenizer is not None else load_tokenizer(model_dir), **options)
