"""The bodies of the ``agentgym`` commands that make a run directory: ``train``, ``sft``, ``dpo`` and
``compare``. Each checks what it can before the slow model load (env, model spec, output directory),
then runs; the arguments are declared in :mod:`agentgym.app.parser`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from agentgym.app.cli_support import print_metrics, set_threads, validate_run

__all__ = ["cmd_train", "cmd_sft", "cmd_dpo", "cmd_compare"]


def _versioned(cfg: Any, args: argparse.Namespace, command: str,
               resumable: Callable[[Path], bool] | None = None,
               interrupted: Callable[[Path], bool] | None = None) -> Any:
    """A run whose output_dir the user did not choose goes to the next free ``runs/<command>[-N]``
    (``--resume``: the newest one — with ``resumable``, the newest one it accepts), so repeating a command
    never collides; a chosen one is protected. ``interrupted`` tells a run that stopped half-way, for a
    hint on how to continue it."""
    import dataclasses

    from agentgym.algorithms.loop.distributed import env_rank
    from agentgym.runs import default_output_dir, output_dir_was_given
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


def _continue_command(args: argparse.Namespace, *where: str) -> str:
    """The command that continues a stopped run: what the user typed (without --resume / --overwrite), ``where``
    (the words that name its output folder, when the user did not), and --resume."""
    import shlex
    words = [w for w in getattr(args, "argv", []) if w not in ("--resume", "--overwrite")]
    return shlex.join(["agentgym", *words, *where, "--resume"])


def _resume_command(args: argparse.Namespace, output_dir: str) -> str:
    """The command that continues this run: what the user typed, with its output_dir and --resume."""
    from agentgym.runs import output_dir_was_given
    given = output_dir_was_given(args.config, list(args.overrides or []))
    return _continue_command(args, *([] if given else [f"output_dir={output_dir}"]))


def _say_outage(stop: Any, command: str) -> int:
    """A run stopped by :class:`ServiceOutage`: the error, its checkpoint and the command that goes on; exit 1."""
    where = f"checkpoint {stop.checkpoint}" if stop.checkpoint is not None else "no checkpoint"
    print(f"\nerror: {stop}; {where}. Once the service is back, continue with:\n  {command}", file=sys.stderr)
    return 1


def _say_finished(out: str, steps: int, evals: dict[str, Any]) -> None:
    b, a = evals["before"].get("eval/success_rate"), evals["after"].get("eval/success_rate")
    shown = f"; held-out success {b:.3f} -> {a:.3f}" if b is not None and a is not None else ""
    print(f"[train] {out} is finished ({steps} of {steps} steps{shown}); nothing was changed. To train it "
          f"further, raise steps (e.g. steps={2 * steps} --resume); to start again, --overwrite or another output_dir.")


def _interrupted_message(stop: Any, args: argparse.Namespace, out: str) -> str:
    """What Ctrl-C during ``train`` leaves, and the command that goes on (or starts over)."""
    if stop.checkpoint is None and stop.step == 0 and not args.resume:   # its folder was emptied
        return (f"\n[train] interrupted before the first step finished: nothing was kept. Run the same command "
                f"again to start it in {out}.")
    if stop.checkpoint is None:
        return (f"\n[train] interrupted at step {stop.step}, before the first checkpoint: nothing to continue "
                f"from. `{_resume_command(args, out)}` starts it over in {out}.")
    return (f"\n[train] interrupted at step {stop.step}; checkpoint {stop.checkpoint}. Continue with:\n"
            f"  {_resume_command(args, out)}")


def cmd_train(args: argparse.Namespace) -> int:
    from agentgym.algorithms.loop.run_control import ServiceOutage
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.algorithms.loop.run_control import TrainingInterrupted, finished_run, interrupted_run, latest_checkpoint
    from agentgym.app.run_reports import TrajectoryReport
    from agentgym.config import ConfigError, load_config
    from agentgym.runs import prepare_output_dir
    cfg = load_config(TrainConfig, args.config, args.overrides)
    cfg = _versioned(cfg, args, "train", resumable=lambda p: latest_checkpoint(p) is not None,
                     interrupted=interrupted_run)
    validate_run(cfg)
    if args.resume and not args.overwrite and (done := finished_run(cfg.output_dir, cfg.steps)) is not None:
        _say_finished(cfg.output_dir, cfg.steps, done)
        return 0
    from agentgym.algorithms.catalog import LEARNERS
    if cfg.algo.lower() not in LEARNERS:
        raise ConfigError(f"algo: unknown algorithm {cfg.algo!r} for `agentgym train`; choose from {', '.join(sorted(LEARNERS))}"
                          + (" (trl-grpo runs through `agentgym compare --algos trl-grpo`)" if cfg.algo == "trl-grpo" else ""))
    from agentgym.algorithms.loop.distributed import env_rank
    main_rank = env_rank() == 0           # under torchrun only rank 0 writes and prints
    # prepared here, before the slow model load, and only here: the Trainer is told it is done
    prepared = prepare_output_dir(cfg.output_dir, resume=args.resume, overwrite=args.overwrite,
                                  command="train") if main_rank else None
    set_threads(args.threads, verbose=main_rank)
    if main_rank:
        print(f"[train] {cfg.algo} on {cfg.env} with {cfg.model}: {cfg.steps} steps x "
              f"{cfg.groups_per_step}x{cfg.group_size} episodes -> {cfg.output_dir}")
    try:
        result = Trainer(cfg, events=[TrajectoryReport()]).train(resume=args.resume, prepared=prepared)
    except TrainingInterrupted as stop:
        print(_interrupted_message(stop, args, cfg.output_dir), file=sys.stderr)
        return 130
    except ServiceOutage as stop:
        return _say_outage(stop, _resume_command(args, cfg.output_dir))
    finally:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    if not main_rank:
        return 0
    b, a = result["before"], result["after"]
    print_metrics({"success before": b["eval/success_rate"], "success after": a["eval/success_rate"],
                    "reward before": b["eval/reward_mean"], "reward after": a["eval/reward_mean"]},
                   f"held-out eval on {cfg.eval.episodes} tasks ({cfg.eval.describe()})")
    g = result.get("gain")
    if g is not None:
        from agentgym.stats import format_ci
        ci = format_ci((g["success_gain"], g["ci_low"], g["ci_high"]), int(g["tasks"]), "task")
        print(f"held-out success gain {g['success_gain']:+.3f} (95 % CI {ci}, "
              f"paired bootstrap over {int(g['tasks'])} tasks, one seed): {g['verdict']}")
    print(f"wrote {cfg.output_dir}/curves.png, train_log.csv, eval_trajectories.html, config.yaml")
    return 0


def _int_list(text: str, what: str) -> int | list[int]:
    """``"3"`` → 3; ``"0,5"`` → [0, 5] (a comma makes it a list); a one-line error otherwise."""
    from agentgym.algorithms.compare.arms import CompareError
    try:
        return [int(x) for x in text.split(",") if x.strip()] if "," in text else int(text)
    except ValueError:
        raise CompareError(f"{what} must be an integer or a comma-separated list of integers, got {text!r}") from None


def cmd_compare(args: argparse.Namespace) -> int:
    from agentgym.algorithms.compare.harness import compare
    from agentgym.algorithms.compare.arms import CompareError
    steps = _int_list(args.steps, "--steps")
    if not isinstance(steps, int):
        raise CompareError(f"--steps must be one integer, got {args.steps!r}")
    if args.out is None:
        from agentgym.runs import default_output_dir
        args.out = str(default_output_dir("runs/compare", resume=args.resume or args.report_only,
                                          overwrite=args.overwrite))
    set_threads(args.threads, verbose=False)  # compare's own first line reports the setup
    from agentgym.algorithms.loop.run_control import ServiceOutage
    from agentgym.app.run_reports import TrajectoryReport
    try:
        result = compare(args.algos, _int_list(args.seeds, "--seeds"), steps, env=args.env, config=args.config,
                         overrides=args.overrides, out_dir=args.out, keep_checkpoints=args.keep_checkpoints,
                         resume=args.resume, threshold=args.threshold, overwrite=args.overwrite,
                         report_only=args.report_only, primary=args.primary,
                         exploratory=[m.strip() for m in args.exploratory.split(",") if m.strip()],
                         events=[TrajectoryReport()])
    except ServiceOutage as stop:   # the finished runs are kept; the stopped one goes on from its checkpoint
        typed = getattr(args, "argv", [])
        given = "--out" in typed or any(w.startswith("--out=") for w in typed)
        return _say_outage(stop, _continue_command(args, *([] if given else ["--out", str(args.out)])))
    from pathlib import Path
    print(Path(result["paths"]["md"]).read_text())
    return 0


def _offline_run_config(cls: type, args: argparse.Namespace, command: str) -> Any:
    """The config of an ``sft`` / ``dpo`` run, checked before the model loads: env, model spec, and the
    output directory, which ``run_sft`` / ``run_dpo`` then prepare (once, before their model load too)."""
    from agentgym.runs import check_output_dir
    from agentgym.config import load_config
    cfg = _versioned(load_config(cls, args.config, args.overrides), args, command)
    validate_run(cfg)
    check_output_dir(cfg.output_dir, overwrite=args.overwrite, command=command)
    set_threads(args.threads, verbose=True)
    return cfg


def cmd_sft(args: argparse.Namespace) -> int:
    from agentgym.algorithms.offline.sft import SFTRunConfig, run_sft
    cfg = _offline_run_config(SFTRunConfig, args, "sft")
    print(f"[sft] {cfg.model} on {cfg.env} episodes from {cfg.data.source} -> {cfg.output_dir}")
    r = run_sft(cfg, overwrite=args.overwrite)
    print_metrics({"episodes": r["episodes"], "kept (successful)": r["kept"], "steps": r["steps"],
                    "loss first": r["loss_first"], "loss last": r["loss_last"]}, "SFT")
    print(f"wrote {r['model_dir']} (use it as model=... / --policy ...), config.yaml, train_log.csv, data_summary.json")
    return 0


def cmd_dpo(args: argparse.Namespace) -> int:
    from agentgym.algorithms.offline.dpo import DPORunConfig, run_dpo
    cfg = _offline_run_config(DPORunConfig, args, "dpo")
    print(f"[dpo] {cfg.model} on {cfg.env}: {cfg.data.samples_per_task} samples x {cfg.data.episodes} tasks, "
          f"loss {cfg.loss_type}, beta {cfg.beta} -> {cfg.output_dir}")
    r = run_dpo(cfg, overwrite=args.overwrite)
    print_metrics({"episodes": r["episodes"], "pairs": r["pairs"], "mean reward gap": r["mean_reward_gap"],
                    "steps": r["steps"], "loss first": r["loss_first"], "loss last": r["loss_last"],
                    "reward accuracy (last)": r["reward_accuracy_last"]}, "DPO")
    print(f"wrote {r['model_dir']} (use it as model=... / --policy ...), config.yaml, train_log.csv, data_summary.json")
    return 0

