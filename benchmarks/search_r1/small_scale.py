"""Small-scale Search-R1 comparison that runs on a CPU: SmolLM2-135M-Instruct on the bundled world.

Four measurements on the same held-out test questions, all greedy, EM as the success metric:

(a) ``no-search``: the model answers without retrieval (``SearchQA-v0`` with ``retrieval="none"``);
(b) ``RAG``: the top-3 passages retrieved for the question are in the prompt (``retrieval="rag"``);
(c) RL (GRPO) with Search-R1's protocol and retrieved-token masking, then evaluated;
(d) the same RL run without masking (``learner.mask_env_tokens=false``): same seed, same steps, same
    starting weights, same rollout seeds.

The RL settings come from ``configs/smollm2_small.yaml`` (the real config loader); the baselines use
its sizes too (sampling budget, context limits, eval questions) with one generation per question, as
Search-R1's baselines. The untrained agentic model is the RL runs' step-0 evaluation.

Writes ``OUT/small_scale.json`` (everything: config, sizes, machine, load, timings, metrics, curves),
``OUT/small_scale.md`` (the table) and ``OUT/small_scale_rl_curves.png``; the runs' own artifacts
(train_log.csv, curves.png, eval_trajectories.html, the final checkpoint) go under ``--runs-dir``.

    python benchmarks/search_r1/small_scale.py                     # defaults: see --help
    python benchmarks/search_r1/small_scale.py --eval-questions 8 --steps 2 --groups 2   # a smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default=str(HERE / "configs" / "smollm2_small.yaml"))
    p.add_argument("--out", default=str(HERE / "results"), help="JSON, markdown table and PNG")
    p.add_argument("--runs-dir", default="runs/search_r1_small", help="the RL runs' own artifacts")
    p.add_argument("--eval-questions", type=int, default=None, help="default: the config's eval.episodes")
    p.add_argument("--max-new-tokens", type=int, default=None, help="per turn; default: the config's")
    p.add_argument("--steps", type=int, default=None, help="RL steps; default: the config's")
    p.add_argument("--groups", type=int, default=None, help="prompts per RL step; default: the config's")
    p.add_argument("--group-size", type=int, default=None, help="samples per prompt; default: the config's")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's; 1 is faster on a machine other jobs load)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="more TrainConfig overrides, e.g. learner.lr=5e-6")
    return p.parse_args(argv)


def load_train_config(args: argparse.Namespace) -> Any:
    from agentgym.algorithms.trainer import TrainConfig
    from agentgym.config import load_config
    overrides = list(args.override)
    for flag, key in (("eval_questions", "eval.episodes"), ("max_new_tokens", "sampling.max_new_tokens"),
                      ("steps", "steps"), ("groups", "groups_per_step"), ("group_size", "group_size"),
                      ("seed", "seed")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    return load_config(TrainConfig, args.config, overrides)


def evaluate_baseline(policy: Any, cfg: Any, retrieval: str) -> tuple[dict[str, float], float]:
    """Greedy, one generation per question, on the RL runs' eval questions; (metrics, wall seconds)."""
    from agentgym.rollout import RolloutEngine
    engine = RolloutEngine(policy, cfg.rollout.greedy())  # the RL runs' layout, greedy
    kwargs = {**cfg.env_kwargs, **cfg.eval.env_kwargs, "retrieval": retrieval, "max_turns": 1, "forced_answer": False}
    first, n = cfg.eval.first_task, cfg.eval.episodes
    t0 = time.perf_counter()
    reported = [0]

    def progress(done: int, total: int) -> None:
        if done >= reported[0] + max(1, total // 4) or done == total:
            reported[0] = done
            log(f"  [{retrieval}] {done}/{total} episodes, {time.perf_counter() - t0:.0f} s")

    try:
        batch = engine.collect(cfg.env, task_indices=range(first, first + n), seed=cfg.seed, env_kwargs=kwargs,
                               progress=progress)
    finally:
        engine.close()
    return batch.metrics, time.perf_counter() - t0


def summary_row(name: str, m: dict[str, float], prefix: str = "") -> dict[str, Any]:
    """The table's columns from rollout metrics (``prefix`` "eval/" for the trainer's evals)."""
    g = lambda k: float(m.get(prefix + k, float("nan")))  # noqa: E731
    return {"method": name, "em": g("success_rate"), "answered": 1.0 - g("truncated_rate"),
            "searches": g("tool_calls_mean"), "invalid_actions": g("invalid_actions_mean"),
            "found_gold": g("episode/found_gold"), "response_tokens": g("response_tokens_mean")}


def run_rl(policy: Any, cfg: Any, mask: bool, runs_dir: Path, before: dict[str, Any] | None) -> tuple[dict, float]:
    """One GRPO run from the policy's current weights; ``before`` (the other run's step-0 eval of
    the same weights) skips re-evaluating them."""
    from dataclasses import replace

    from agentgym.algorithms.trainer import Trainer
    name = "masked" if mask else "unmasked"
    run_cfg = replace(cfg, learner=replace(cfg.learner, mask_env_tokens=mask), output_dir=str(runs_dir / name))
    trainer = Trainer(run_cfg, policy=policy, log=lambda s: log(f"  [{name}] {s}"))
    if before is not None:
        trainer.evals = [copy.deepcopy(before)]
    t0 = time.perf_counter()
    result = trainer.train(overwrite=True)   # this script owns --runs-dir: a rerun replaces its runs
    wall = time.perf_counter() - t0
    for row in result["history"]:
        log(f"  [{name}] step {int(row['step'])}: reward {row['rollout/reward_mean']:+.3f} "
            f"success {row['rollout/success_rate']:.3f} loss {row.get('train/loss', float('nan')):+.4f} "
            f"({row['time/step_s']:.0f} s)")
    return {"before": result["before"], "after": result["after"], "history": result["history"],
            "output_dir": result["output_dir"]}, wall


def plot_rl_curves(runs: dict[str, dict], path: Path, episodes_per_step: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("rollout/reward_mean", f"rollout reward (mean of {episodes_per_step} episodes)"),
              ("rollout/success_rate", "rollout EM"), ("train/entropy", "entropy (loss tokens)"),
              ("train/kl", "KL to the start (low_var_kl)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (key, title) in zip(axes, panels):
        for name, run in runs.items():
            h = run["history"]
            ax.plot([r["step"] for r in h], [r.get(key, float("nan")) for r in h], marker="o", label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M GRPO on SearchQA (bundled world): retrieved-token masking on vs off", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"Small-scale Search-R1 comparison ({meta['date']}): SmolLM2-135M-Instruct, bundled world, "
             f"{meta['eval_questions']} test questions, greedy, EM. Raw: small_scale.json.", "",
             "| method | EM | answered (`<answer>` given) | searches / episode | invalid actions / episode | "
             "gold passage seen | response tokens |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['em']:.3f} | {r['answered']:.3f} | {r['searches']:.2f} | "
                     f"{r['invalid_actions']:.2f} | {r['found_gold']:.3f} | {r['response_tokens']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    import torch

    from agentgym.config import to_dict
    from agentgym.policies.transformers_policy import TransformersPolicy
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_train_config(args)
    out, runs_dir = Path(args.out), Path(args.runs_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    log(f"config {args.config}: {cfg.eval.episodes} eval questions, {cfg.sampling.max_new_tokens} new tokens/turn, "
        f"RL {cfg.steps} steps x {cfg.groups_per_step}x{cfg.group_size} episodes; torch threads "
        f"{torch.get_num_threads()}; load average {load_start[0]:.1f}")

    policy = (TransformersPolicy.tiny_random(seed=cfg.seed) if cfg.model == "tiny-random"  # smoke runs
              else TransformersPolicy.from_pretrained(cfg.model, device=cfg.device))
    start_weights = copy.deepcopy(policy.model.state_dict())
    timings: dict[str, float] = {}
    metrics: dict[str, Any] = {}
    for retrieval in ("none", "rag"):
        log(f"baseline retrieval={retrieval!r}")
        metrics[retrieval], timings[retrieval] = evaluate_baseline(policy, cfg, retrieval)
        log(f"  EM {metrics[retrieval]['success_rate']:.3f} ({timings[retrieval]:.0f} s)")

    runs: dict[str, dict] = {}
    before = None
    for mask in (True, False):
        name = "masked" if mask else "unmasked"
        log(f"RL {name}: GRPO {cfg.steps} steps")
        policy.model.load_state_dict(start_weights)
        runs[name], timings[f"rl_{name}"] = run_rl(policy, cfg, mask, runs_dir, before)
        before = runs["masked"]["before"]   # the unmasked run starts from the same weights: reuse its step-0 eval
        log(f"  EM before {runs[name]['before']['eval/success_rate']:.3f} -> after "
            f"{runs[name]['after']['eval/success_rate']:.3f} ({timings[f'rl_{name}']:.0f} s)")

    rows = [summary_row("(a) no search (direct answer)", metrics["none"]),
            summary_row("(b) RAG (top-3 for the question in the prompt)", metrics["rag"]),
            summary_row("untrained, Search-R1 protocol (RL step 0)", runs["masked"]["before"], "eval/"),
            summary_row(f"(c) GRPO {cfg.steps} steps, retrieved-token masking", runs["masked"]["after"], "eval/"),
            summary_row(f"(d) GRPO {cfg.steps} steps, no masking", runs["unmasked"]["after"], "eval/")]
    em_c, em_d = rows[3]["em"], rows[4]["em"]
    n = cfg.eval.episodes
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "eval_questions": n,
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                        "load_average_start": load_start, "load_average_end": os.getloadavg()},
            "wall_s": {**timings, "total": time.perf_counter() - t_start}}
    result = {"meta": meta, "config": to_dict(cfg), "table": rows,
              "masked_minus_unmasked_em": em_c - em_d,
              # one question moves EM by 1/n; with n questions, a difference below ~2/sqrt(n) is within noise
              "em_resolution": 1.0 / n, "baselines": metrics,
              "rl": runs}
    (out / "small_scale.json").write_text(json.dumps(result, indent=1, default=float))
    (out / "small_scale.md").write_text(markdown_table(rows, meta))
    plot_rl_curves(runs, out / "small_scale_rl_curves.png", cfg.groups_per_step * cfg.group_size)
    log(f"wrote {out / 'small_scale.json'}, small_scale.md, small_scale_rl_curves.png "
        f"(total {meta['wall_s']['total'] / 60:.1f} min)")
    print(markdown_table(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
