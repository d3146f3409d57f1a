"""The bodies of the ``agentgym`` commands that act on one env: ``list``, ``play``, ``check`` and ``eval``,
and the service commands ``sandbox`` and ``retriever``. Each ``cmd_*`` takes the parsed arguments and
returns the exit code; the arguments themselves are declared in :mod:`agentgym.app.parser`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Sequence

from agentgym.app.cli_support import (check_env_arguments, check_model, load_policy, parse_kv, print_metrics,
                                      require_env, set_threads, split_kv)

__all__ = ["cmd_list", "cmd_serve", "cmd_play", "cmd_check", "cmd_eval", "cmd_sandbox", "cmd_retriever_build",
           "cmd_retriever_serve", "cmd_retriever_prep"]


def cmd_list(args: argparse.Namespace) -> int:
    import agentgym
    for env_id in agentgym.list_envs():
        spec = agentgym.spec(env_id)
        entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__qualname__", "?")
        print(f"{env_id:32s} {entry}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from agentgym.app.knobs import describe_configs, describe_env
    if args.which == "env":
        if not args.env_id:
            raise ValueError("agentgym config env needs an env id, e.g. agentgym config env SearchQA-v0")
        print(describe_env(args.env_id))
        return 0
    if args.env_id:
        raise ValueError(f"agentgym config {args.which} takes no env id (agentgym config env {args.env_id})")
    print(describe_configs(args.which))
    return 0


def _print_messages(console: Any, messages: Sequence[dict[str, str]]) -> None:
    from rich.panel import Panel
    from rich.text import Text
    colours = {"system": "magenta", "user": "cyan", "tool": "yellow", "assistant": "green"}
    for m in messages:
        console.print(Panel(Text(m["content"]), title=m["role"], title_align="left",
                            border_style=colours.get(m["role"], "white")))


def _read_action(console: Any) -> str | None:
    console.print("[bold]Your action[/] (end with an empty line; Ctrl-D quits):")
    lines: list[str] = []
    while True:
        try:
            line = input()
        except EOFError:
            return "\n".join(lines) if lines else None
        if line == "" and lines:
            return "\n".join(lines)
        lines.append(line)


def cmd_play(args: argparse.Namespace) -> int:
    import agentgym
    from rich.console import Console
    from rich.table import Table
    console = Console()
    env = agentgym.make(require_env(args.env_id), **parse_kv(args.env_kwarg))
    for ep in range(args.episodes):
        obs, info = env.reset(seed=None if args.seed is None else args.seed + ep)
        console.rule(f"{args.env_id} — episode {ep + 1}")
        _print_messages(console, obs)
        done = False
        while not done:
            action = _read_action(console)
            if action is None:
                console.print("bye")
                env.close()
                return 0
            obs, reward, terminated, truncated, info = env.step(action)
            _print_messages(console, obs)
            table = Table(title=f"turn {info['turn']}: {info['action_type']}, reward {reward:+.3f}")
            table.add_column("term")
            table.add_column("value", justify="right")
            for k, v in info["reward_terms"].items():
                table.add_row(k, f"{v:+.3f}")
            console.print(table)
            done = terminated or truncated
        summary = info["episode_summary"]
        console.print(f"[bold]episode over[/] ({'terminated' if terminated else 'truncated'}): "
                      f"success={summary['success']} return={summary['return']:+.3f} turns={summary['turns']}")
    env.close()
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import agentgym  # noqa: F401  (registers the built-ins)
    from agentgym.app.checking import fuzz_env, run_check_env
    from agentgym.config import ConfigError
    env_id = require_env(args.env_id)
    if args.actions < 0:
        raise ConfigError(f"--actions must be >= 0, got {args.actions}")
    kwargs = parse_kv(args.env_kwarg)
    err = run_check_env(env_id, kwargs)
    print(f"check_env: {'passed' if err is None else 'FAILED'}")
    if err:
        print(err)
    report = fuzz_env(env_id, n=args.actions, seed=args.seed, env_kwargs=kwargs)
    print(report.summary())
    for f in report.failures[:10]:
        print("  -", f)
    return 0 if err is None and report.ok else 1


def _run_layout(policy_spec: str) -> dict[str, Any]:
    """The rollout layout a train / sft / dpo run was made with (its ``config.yaml``), for evaluating it
    the same way; {} when ``policy_spec`` is not such a run."""
    from pathlib import Path

    import yaml

    from agentgym.policies.loading import trainer_checkpoint
    try:
        ckpt = trainer_checkpoint(policy_spec)
    except FileNotFoundError:
        return {}
    run = ckpt.parent.parent if ckpt is not None else Path(policy_spec).expanduser()
    if run.name == "model":
        run = run.parent
    cfg_path = run / "config.yaml"
    if not cfg_path.is_file():
        return {}
    try:
        saved = yaml.safe_load(cfg_path.read_text()) or {}
    except yaml.YAMLError:
        return {}
    rollout = saved.get("rollout") if isinstance(saved, dict) else None
    if not isinstance(rollout, dict):
        return {}
    layout = {k: rollout[k] for k in ("style", "max_obs_tokens", "max_context_tokens") if k in rollout}
    sampling = rollout.get("sampling") or {}
    if isinstance(sampling, dict) and "max_new_tokens" in sampling:
        layout["sampling"] = {"max_new_tokens": sampling["max_new_tokens"]}
    return {"rollout": layout} if layout else {}


#: ``agentgym eval`` flags that set the EvalRunConfig field of the same name (only when given).
_EVAL_FLAGS = ("model", "split", "episodes", "group_size", "batch_size", "first_task", "seed", "max_new_tokens",
               "temperature", "top_p", "greedy", "style", "max_obs_tokens", "max_context_tokens", "device",
               "backend", "debug_checks", "html", "json", "paired_with")


def _eval_config(args: argparse.Namespace) -> Any:
    """Defaults < ``--config`` file < flags and ``-e`` env kwargs < ``key=value`` overrides.

    Flags travel as JSON-encoded overrides, so they get the config's type checks and a string such
    as ``--model yes`` stays a string."""
    from agentgym.config import ConfigError, load_config
    from agentgym.app.eval_run import EvalRunConfig
    overrides = list(args.overrides or [])
    env_id = args.env_id
    if env_id is not None and "=" in env_id:  # no env id given: the first positional is an override
        overrides.insert(0, env_id)
        env_id = None
    pre = [f"env={json.dumps(env_id)}"] if env_id else []
    flags = {k: getattr(args, k) for k in _EVAL_FLAGS if hasattr(args, k)}
    if flags.get("split") == "null":  # `--split null`: no split passed (the help's word for None)
        flags["split"] = None
    pre += [f"{k}={json.dumps(v)}" for k, v in flags.items()]
    # -e values as typed: the config reads them with the one value parser, as it reads train's overrides
    pre += [f"env_kwargs.{k}={v}" for k, v in split_kv(getattr(args, "env_kwarg", None))]
    cfg = load_config(EvalRunConfig, args.config, pre + overrides)
    layout = _run_layout(cfg.model)  # a run directory: evaluate with the layout it was trained with
    if layout:
        cfg = load_config(EvalRunConfig, args.config, pre + overrides, base=layout)
        r = cfg.rollout
        print(f"[eval] layout of {cfg.model} (override with flags): style={r.style} max_obs_tokens={r.max_obs_tokens} "
              f"max_context_tokens={r.max_context_tokens} max_new_tokens={r.sampling.max_new_tokens}")
    if not cfg.env:
        raise ConfigError("no env to evaluate: give ENV_ID or env=... (in the config or as an override)")
    return cfg


def _eval_baseline(cfg: Any, env_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The ``paired_with`` eval, checked to be of the same env and env settings (so of the same tasks)."""
    if not cfg.paired_with:
        return None
    from agentgym.config import ConfigError
    from agentgym.app.eval_run import eval_env_kwargs, load_eval_tasks
    from agentgym.registry import full_id
    try:
        head, tasks = load_eval_tasks(cfg.paired_with)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if full_id(str(head["env"])) != full_id(env_id):
        raise ConfigError(f"paired_with: {cfg.paired_with} evaluated {head['env']}, not {env_id}")
    mine = eval_env_kwargs(cfg, env_id)
    if head["env_kwargs"] != mine:
        raise ConfigError(f"paired_with: {cfg.paired_with} ran the env with {head['env_kwargs']}, this eval with "
                          f"{mine}: not the same tasks")
    return head, tasks


def _ci_text(low: float, high: float, note: str | None, signed: bool) -> str:
    """The interval as the comparison reports write it; ``note`` (why there is none) comes from the record,
    whose bounds are then NaN (:func:`agentgym.stats.without_undefined`)."""
    from agentgym.stats import format_ci
    return f"n/a ({note})" if note else format_ci((math.nan, low, high), signed=signed)


def _task_line(t: dict[str, Any], group_size: int) -> str:
    each = "one episode each" if group_size == 1 else f"mean of {group_size} episodes each"
    ci = _ci_text(t["task_success_ci_low"], t["task_success_ci_high"], t["ci_note"], signed=False)
    line = f"per task ({t['tasks']:.0f} tasks, {each}): success {t['task_success']:.3f}, 95 % bootstrap CI {ci}"
    from agentgym.app.eval_run import pass_at_k_text
    return line + (f"; {pass_at_k_text(t)} (unbiased estimator)" if group_size > 1 else "")


def _paired_line(p: dict[str, Any], path: str, head: dict[str, Any]) -> str:
    reading = ("no interval" if p["ci_note"] else "higher" if p["ci_low"] > 0 else "lower" if p["ci_high"] < 0
               else "no difference shown: the CI includes 0")
    return (f"paired with {path} (policy {head.get('policy')}, {p['tasks']:.0f} tasks): {p['success']:.3f} - "
            f"{p['baseline_success']:.3f} = {p['difference']:+.3f}, 95 % bootstrap CI "
            f"{_ci_text(p['ci_low'], p['ci_high'], p['ci_note'], signed=True)}; {p['tasks_up']:.0f} tasks up, "
            f"{p['tasks_down']:.0f} down; {reading}")


def _prepare_outputs(cfg: Any) -> None:
    """The folders of ``--json`` / ``--html``, made before the eval: a path that cannot be written is said at
    once, not after the episodes ran."""
    from pathlib import Path

    from agentgym.config import ConfigError
    for name in ("json", "html"):
        path = getattr(cfg, name)
        if not path:
            continue
        if Path(path).is_dir():
            raise ConfigError(f"{name}: {path} is a directory; give a file name")
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{name}: cannot make the folder of {path} ({e.strerror or e})") from None
        existed = Path(path).exists()
        try:                          # a probe: opened for appending, so an existing file is left as it is
            with open(path, "a"):
                pass
        except OSError as e:
            raise ConfigError(f"{name}: cannot write {path} ({e.strerror or e})") from None
        if not existed:
            Path(path).unlink()


def _evaluate_with_bar(policy: Any, cfg: Any, env_id: str) -> Any:
    """:func:`~agentgym.app.eval_run.evaluate` under a live bar: episodes done, the running success, and
    while a batch generates its sequences and tokens."""
    from tqdm import tqdm

    from agentgym.app.eval_run import evaluate
    from agentgym.progress import GeneratingPostfix
    from agentgym.rollout_metrics import summarize
    with tqdm(total=cfg.episodes * cfg.group_size, desc=f"eval {env_id}", unit="ep") as bar:
        postfix = GeneratingPostfix(bar)

        def progress(new: int, so_far: list[Any]) -> None:
            bar.update(len(so_far) - bar.n)
            if so_far:
                bar.set_postfix(success=f"{summarize(so_far)['success_rate']:.2f}")

        def on_turn(done: int, tokens: int, generating: tuple[int, int] | None = None) -> None:
            bar.update(done - bar.n)                  # live: every turn, and every decode step with hf
            postfix(tokens, generating)
        return evaluate(policy, cfg, env_id, progress=progress, on_turn=on_turn)


def cmd_eval(args: argparse.Namespace) -> int:
    from agentgym.config import to_dict
    from agentgym.app.eval_run import check_eval_env
    from agentgym.evaluation import paired_difference, task_summary
    cfg = _eval_config(args)
    env_id = require_env(cfg.env)
    check_env_arguments(env_id, cfg.env_kwargs)   # names, types, and a reward given as data resolves
    check_eval_env(cfg, env_id)                   # the split passed, and first_task / tasks within the env's tasks
    check_model(cfg.model, "model")             # a mistyped folder or hub id: at once, before torch imports
    baseline = _eval_baseline(cfg, env_id)  # before the eval: a wrong file is said at once, not after it
    _prepare_outputs(cfg)
    set_threads(getattr(args, "threads", None), verbose=True)
    policy = load_policy(cfg.model, env_id, device=cfg.device, backend=cfg.backend)
    result = _evaluate_with_bar(policy, cfg, env_id)
    split = result.env_kwargs.get("split", "-")
    title = f"{env_id} (split {split}) · policy {cfg.model} · {len(result.trajectories)} episodes"
    if result.sandbox:
        title += f" · sandbox {result.sandbox}"
    print_metrics(result.metrics, title, std=result.std)
    infra = [t.episode["infra_error"] for t in result.trajectories if (t.episode or {}).get("infra_error")]
    if infra:
        print(f"[eval] {len(infra)} of {len(result.trajectories)} episodes ended on an infrastructure error, not on the "
              f"policy's action, and are left out of every score (first: {str(infra[0])[:300]})", file=sys.stderr)
    unplayed = [t for t in result.trajectories if (t.episode or {}).get("end_reason") == "context_limit" and not t.actions]
    if unplayed:   # scored as failures, but the model never acted: say so rather than report a silent 0
        r = cfg.rollout
        print(f"[eval] warning: {len(unplayed)} of {len(result.trajectories)} episodes ended at the context limit "
              f"before the model's first turn (their prompt + max_new_tokens {r.sampling.max_new_tokens} > "
              f"max_context_tokens {r.max_context_tokens}); they count as failures. Raise --max-context-tokens "
              "(up to the model's window) or lower --max-new-tokens.", file=sys.stderr)
    tasks = task_summary(result.tasks, cfg.group_size)
    print(_task_line(tasks, cfg.group_size))
    paired = None
    if baseline is not None:
        head, base_tasks = baseline
        try:
            paired = paired_difference(result.tasks, base_tasks)
        except ValueError as e:   # the eval is still written below: nothing is lost
            print(f"error: {e}", file=sys.stderr)
        else:
            print(_paired_line(paired, cfg.paired_with, head))
    if cfg.json:
        from pathlib import Path
        Path(cfg.json).write_text(json.dumps({
            "env": env_id, "policy": cfg.model, "config": to_dict(cfg), "env_kwargs": result.env_kwargs,
            "metrics": result.metrics, "metrics_std": result.std, "task_summary": tasks, "per_task": result.tasks,
            **({"paired": {"with": cfg.paired_with, **paired}} if paired else {}),
            "trajectories": [t.to_dict() for t in result.trajectories]}, indent=1))
        print(f"wrote {cfg.json}")
    if cfg.html:
        from agentgym.backend import tokenizer_of
        from agentgym.app.report import write_html_report
        path = write_html_report(cfg.html, result.trajectories, tokenizer=tokenizer_of(policy),
                                 metrics=result.metrics, title=f"{env_id} · {cfg.model}")
        print(f"wrote {path}")
    if infra and len(infra) == len(result.trajectories):
        print("error: no episode could be scored: every one ended on an infrastructure error (above)", file=sys.stderr)
        return 1
    return 1 if baseline is not None and paired is None else 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    """``agentgym sandbox ...``: the sandbox package owns its sub-commands (also ``python -m agentgym.envs.services.sandbox``)."""
    from agentgym.envs.services.sandbox.__main__ import main as sandbox_main
    return sandbox_main(args.sandbox_args)


def cmd_retriever_build(args: argparse.Namespace) -> int:
    from agentgym.envs.services.retrieval import build_index
    if args.corpus == "bundled":
        from agentgym.envs.searchqa.data import bundled_dataset
        corpus: Any = bundled_dataset(seed=args.world_seed, size=args.world_size)[0]
    else:
        corpus = args.corpus
    r = build_index(corpus, args.out, kind=args.kind, model=args.model, index_type=args.index_type,
                    query_prefix=args.query_prefix, passage_prefix=args.passage_prefix, device=args.device,
                    batch_size=args.batch_size, overwrite=args.overwrite, show_progress=True)
    print(f"built {args.kind} index over {r.num_docs} passages in {args.out}")
    return 0


def cmd_retriever_serve(args: argparse.Namespace) -> int:
    from agentgym.envs.services.retrieval import DEFAULT_TOPK, load_retriever, serve
    from agentgym.http_server import ServerBindError, bind_socket
    if args.max_request_bytes < 1:
        raise ValueError(f"--max-request-bytes must be >= 1, got {args.max_request_bytes}")
    if args.max_topk < 1:
        raise ValueError(f"--max-topk must be >= 1, got {args.max_topk}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    try:  # the port first: "in use" is then the only thing printed, before a long index load
        sock = bind_socket(args.host, args.port)
    except ServerBindError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.index == "bundled":
        from agentgym.envs.services.retrieval import DenseRetriever
        from agentgym.envs.searchqa.data import bundled_dataset
        retriever: Any = DenseRetriever().build(bundled_dataset(seed=args.world_seed, size=args.world_size)[0])
    else:
        retriever = load_retriever(args.index)
    port = sock.getsockname()[1]
    print(f"serving {args.index} on http://{args.host}:{port}/retrieve (Search-R1 protocol)", flush=True)
    serve(retriever, max_topk=args.max_topk, default_topk=min(DEFAULT_TOPK, args.max_topk),
          max_request_bytes=args.max_request_bytes, sock=sock)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """``agentgym serve ENV_ID``: the env over OpenEnv's protocol until Ctrl-C / SIGTERM; the first stdout
    line names the URL (``--port 0`` binds a free port)."""
    from agentgym.adapters.openenv_server import ServeLimits, create_app, serve
    from agentgym.app.cli import _load_plugins
    from agentgym.http_server import ServerBindError, bind_socket
    if args.serve_imports:
        _load_plugins(args.serve_imports)   # `serve ENV --import mypkg.envs`, as `--import` before the command
    env_id = require_env(args.env_id)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    if args.max_sessions < 1:
        raise ValueError(f"--max-sessions must be >= 1, got {args.max_sessions}")
    kwargs = {**parse_kv(args.overrides), **parse_kv(args.env_kwarg)}
    limits = ServeLimits(max_sessions=args.max_sessions, max_message_bytes=max(1024, args.max_message_bytes))
    try:  # the port first: "in use" is then the only thing printed
        sock = bind_socket(args.host, args.port)
    except ServerBindError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    app = create_app(env_id, kwargs, limits)
    print(f"serving {env_id} on http://{args.host}:{sock.getsockname()[1]} (OpenEnv protocol: /ws, /reset, /step, "
          f"/schema, /health; up to {args.max_sessions} sessions)", flush=True)
    serve(app, sock, limits)
    return 0


def cmd_retriever_prep(args: argparse.Namespace) -> int:
    from agentgym.envs.searchqa.data import SEARCH_R1_TEST_DATASETS, prepare_flashrag
    from agentgym.envs.searchqa.env import make_search_r1_prompt
    datasets = [d.strip() for d in args.datasets.split(",")] if args.datasets else SEARCH_R1_TEST_DATASETS
    out = prepare_flashrag(args.source, args.out, datasets, make_prompt=make_search_r1_prompt, limit=args.limit,
                           overwrite=args.overwrite)
    for split, path in out.items():
        print(f"wrote {split}: {path}")
    return 0

