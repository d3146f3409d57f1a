"""Loading what agentgym writes back as a policy, so every stage's output feeds the next stage.

A *model spec* names a causal LM everywhere a command takes one (``agentgym train model=…``,
``agentgym sft model=…``, ``agentgym dpo model=…``, ``agentgym eval --policy …``):

* ``tiny-random`` — the 2-layer random Llama (tests, smoke runs); seeded by the run's seed;
* a trainer **run directory** (``runs/train``: its latest checkpoint), a **checkpoint directory**
  (``runs/train/checkpoints/step_000006``) or that checkpoint's ``model/`` folder. Checkpoints hold
  only weights (all of them, or only the LoRA adapter), so the run's ``config.yaml`` names the base
  model that gives the tokenizer (and, for LoRA, the frozen weights the adapter is merged into);
* an SFT / DPO **output directory** (``runs/sft``: its ``model/`` folder is a plain Hugging Face
  model directory with the tokenizer, or with ``merge_lora=false`` an adapter that is merged into
  the base named by the run's ``config.yaml`` on load), or any plain model directory itself;
* anything :func:`agentgym.policies.models.resolve_model` knows: ``smollm2``, a ``.gguf`` file, a
  hub id.

Chains resolve recursively: a GRPO run started from an SFT output names that output as its base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["trainer_checkpoint", "load_trained_policy", "load_tokenizer_for", "export_model", "load_policy",
           "check_model_spec", "model_directory"]

from agentgym.policies.backends import (backend_class, names_own_backend, require_registered, resolve_backend,
                                       spec_backend)

TINY_RANDOM = "tiny-random"


def _latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = sorted((run_dir / "checkpoints").glob("step_*[0-9]"))
    return ckpts[-1] if ckpts else None


def trainer_checkpoint(path: str | Path) -> Path | None:
    """The trainer checkpoint directory ``path`` designates (run dir → latest), or None if it is none."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return None
    if p.name == "model" and (p.parent / "state.pt").exists():
        return p.parent
    if (p / "state.pt").exists() and (p / "model").is_dir():
        return p
    if (p / "checkpoints").is_dir():
        ckpt = _latest_checkpoint(p)
        if ckpt is None:
            raise FileNotFoundError(f"{p} is a training run without checkpoints (it was stopped before the first one)")
        return ckpt
    return None


def _run_base(cfg_path: Path) -> tuple[str, int]:
    """(base model spec, seed) from a run's resolved ``config.yaml``."""
    import yaml
    if not cfg_path.exists():
        raise FileNotFoundError(f"no run config at {cfg_path}; it names the base model of these weights")
    cfg = yaml.safe_load(cfg_path.read_text()) or {}
    base = str(cfg.get("model", ""))
    if not base:
        raise FileNotFoundError(f"{cfg_path} does not name a model")
    return base, int(cfg.get("seed", 0))


def _output_model_dir(p: Path) -> Path:
    """An SFT / DPO output directory's ``model/`` folder, else ``p`` itself."""
    inner = p / "model"
    if (inner / "config.json").exists() or (inner / "adapter_config.json").exists():
        return inner
    return p


def load_tokenizer_for(spec: str) -> Any:
    """The tokenizer of a model spec (see the module docstring), without loading any weights."""
    from agentgym.policies.models import load_tokenizer
    if spec == TINY_RANDOM:
        return load_tokenizer()
    ckpt = trainer_checkpoint(spec)
    if ckpt is not None:
        return load_tokenizer_for(_run_base(ckpt.parent.parent / "config.yaml")[0])
    p = Path(spec).expanduser()
    return load_tokenizer(str(_output_model_dir(p)) if p.is_dir() else spec)  # outputs hold their tokenizer


def load_trained_policy(spec: str, *, device: str | None = None, dtype: Any = None, seed: int = 0,
                        **options: Any) -> Any:
    """A :class:`~agentgym.policies.transformers_policy.TransformersPolicy` from any model spec.

    LoRA checkpoints come back merged into their base (a plain model: the next stage may add its
    own adapter). ``seed`` only matters for ``tiny-random``. ``options`` go to the policy
    (``max_batch_size``, ``reuse_kv``, ``kv_cache_tokens``, ``attn_implementation``).
    """
    from agentgym.policies.models import load_model
    from agentgym.policies.transformers_policy import TransformersPolicy
    if spec == TINY_RANDOM:
        policy = TransformersPolicy.tiny_random(seed=seed, device=device, **options)
        if dtype is not None:          # as every other spec: the weights in the dtype asked for
            import torch
            policy.model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        return policy
    ckpt = trainer_checkpoint(spec)
    if ckpt is not None:
        base, base_seed = _run_base(ckpt.parent.parent / "config.yaml")
        model_dir = ckpt / "model"
        if (model_dir / "adapter_config.json").exists():
            return _merged_adapter(model_dir, base, base_seed, spec, device, dtype, options)
        attn = options.pop("attn_implementation", None)
        return TransformersPolicy(load_model(str(model_dir), device=device, dtype=dtype, attn_implementation=attn),
                                  load_tokenizer_for(base), name=spec, **options)
    p = Path(spec).expanduser()
    if p.is_dir():
        model_dir = _output_model_dir(p)
        if (model_dir / "adapter_config.json").exists() and not (model_dir / "config.json").exists():
            # an SFT / DPO output kept as an adapter (merge_lora=false): its run config names the base
            base, base_seed = _run_base(model_dir.parent / "config.yaml")
            return _merged_adapter(model_dir, base, base_seed, spec, device, dtype, options)
        if not (model_dir / "config.json").exists():
            raise FileNotFoundError(f"{p} holds no model (no config.json, no model/ folder, no checkpoints/); "
                                    "did the run that writes it finish?")
        return TransformersPolicy.from_pretrained(str(model_dir), device=device, dtype=dtype, **options)
    try:
        return TransformersPolicy.from_pretrained(spec, device=device, dtype=dtype, **options)
    except OSError as e:
        if p.exists() or isinstance(e, FileNotFoundError):
            raise
        raise _not_on_hub(spec, e) from None


def _not_on_hub(spec: str, e: BaseException) -> FileNotFoundError:
    """A hub id (org/name) that is not a local path either, and the Hub (or its cache, offline) has not got
    it: most often a mistyped run or model directory. The one message for every engine."""
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return FileNotFoundError(f"model {spec!r}: no local directory of that name, and the Hugging Face Hub did "
                             f"not give it ({reason})")


def _check_hub_id(spec: str) -> None:
    """Before an engine that loads from disk (vLLM) is handed a hub id: its ``config.json`` comes from the Hub,
    or from the cache when offline, or the load fails here with the same message as the transformers path."""
    from huggingface_hub import hf_hub_download
    try:
        hf_hub_download(spec, "config.json")
    except Exception as e:   # RepositoryNotFoundError, LocalEntryNotFoundError (offline), network errors
        raise _not_on_hub(spec, e) from None


def _merged_adapter(adapter_dir: Path, base: str, base_seed: int, name: str, device: str | None, dtype: Any,
                    options: dict[str, Any]) -> Any:
    """The base model spec's policy with the LoRA adapter in ``adapter_dir`` merged in."""
    from peft import PeftModel

    from agentgym.policies.transformers_policy import TransformersPolicy
    options = dict(options)
    attn = options.pop("attn_implementation", None)
    policy = load_trained_policy(base, device=device, dtype=dtype, seed=base_seed, attn_implementation=attn)
    merged = PeftModel.from_pretrained(policy.model, str(adapter_dir)).merge_and_unload()
    return TransformersPolicy(merged.eval(), policy.tokenizer, name=name, **options)


def export_model(model: Any, tokenizer: Any, out_dir: str | Path, *, merge_lora: bool = True) -> Path:
    """Save a trained model as a plain Hugging Face directory (weights + tokenizer) that
    :func:`load_trained_policy`, ``transformers`` and other tools load directly.

    A ``peft`` model is merged into its base first unless ``merge_lora`` is False (then only the
    adapter is written, for users who keep adapters separate).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover
        PeftModel = ()  # type: ignore[assignment]
    if isinstance(model, PeftModel) and merge_lora:
        model = model.merge_and_unload()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# --------------------------------------------------------------------------- one loader for every command

def check_model_spec(spec: str) -> None:
    """Fail fast (before anything loads) when ``spec`` names no model: FileNotFoundError with the reason."""
    from agentgym.policies.models import resolve_model
    if spec == TINY_RANDOM or names_own_backend(spec):
        return
    if trainer_checkpoint(spec) is not None:
        return
    p = Path(spec).expanduser()
    if p.is_dir():
        model_dir = _output_model_dir(p)
        if not ((model_dir / "config.json").exists() or (model_dir / "adapter_config.json").exists()):
            raise FileNotFoundError(f"{p} holds no model (no config.json, no model/ folder, no checkpoints/)")
        return
    resolve_model(spec)


def model_directory(spec: str, *, seed: int = 0) -> Path | str:
    """A plain Hugging Face model directory (config.json + weights) for ``spec``, for engines that load
    from disk (vLLM). LoRA checkpoints and ``tiny-random`` are materialised once into the cache;
    a hub id is returned as is (the engine downloads it where a hub is reachable)."""
    import hashlib

    from agentgym.policies.models import _ensure_plain_copy, cache_dir, resolve_model
    if spec == TINY_RANDOM:
        target = cache_dir() / f"tiny-random-seed{seed}"
        if not (target / "config.json").exists():
            policy = load_trained_policy(spec, seed=seed)
            export_model(policy.model, policy.tokenizer, target)
        return target
    ckpt = trainer_checkpoint(spec)
    p = Path(spec).expanduser()
    if ckpt is not None:
        source = ckpt / "model"
    elif p.is_dir():
        source = _output_model_dir(p)
    else:
        src = resolve_model(spec)
        if src.path == spec and not Path(spec).exists():   # a hub id, not a local folder
            _check_hub_id(spec)
        plain = _ensure_plain_copy(src) if src.gguf_file else None
        return plain if plain is not None else src.path
    if (source / "config.json").exists() and not (source / "adapter_config.json").exists():
        return source
    # weights that need their base (a LoRA adapter): merge once into the cache
    key = hashlib.sha1(str(source.resolve()).encode()).hexdigest()[:12]
    target = cache_dir() / f"merged-{key}"
    if not (target / "config.json").exists():
        policy = load_trained_policy(spec, seed=seed)
        export_model(policy.model, policy.tokenizer, target)
    return target


def load_policy(spec: str, backend: str | None = None, *, env_id: str | None = None, device: str | None = None,
                dtype: Any = None, seed: int = 0, notice: Any = None, **options: Any) -> Any:
    """The one policy loader: every command (eval, train, compare, sft, dpo, the TRL adapter) uses it.

    ``spec``: a model spec (see the module docstring), ``oracle`` (the env's scripted reference policy,
    needs ``env_id``) or ``openai:MODEL@BASE_URL`` (a hosted chat endpoint; evaluation only).
    ``backend``: a name from :data:`~agentgym.policies.backends.POLICY_BACKENDS` (``hf``: transformers,
    trainable in place; ``vllm``), or None for :func:`default_backend`. When the requested backend is
    not installed, ``notice`` (default: print to stderr) gets one line and the fallback is used.
    """
    if backend is not None:
        require_registered(backend)   # a wrong name is an error whatever the spec, even one that ignores it
    own = spec_backend(spec)
    if own is not None:   # the spec names its backend (oracle, openai:…)
        return own.from_spec(spec, env_id=env_id)
    backend = resolve_backend(backend, notice=notice)
    cls = backend_class(backend)
    cls.check_options(options)   # the one check of a load's options (backends' from_spec do not repeat it)
    return cls.from_spec(spec, device=device, dtype=dtype, seed=seed, **options)
