"""Small-scale Search-R1 study on a CPU ("Search-R1 in a box"): SmolLM2-135M-Instruct on the bundled world.

One command: SFT warm start on the env's oracle episodes, then six arms evaluated greedily with EM on
the SAME held-out test questions (balanced over single_hop / multi_hop / no_search), same retriever:

(a) ``no-search``: the base instruct model answers directly (``retrieval="none"``);
(b) ``RAG``: the base model with the top-k passages for the question in the prompt (``retrieval="rag"``);
(c) ``SFT only``: the warm-started model with Search-R1's protocol (it searches when it decides to);
(d) ``SFT→GRPO`` with retrieved-token masking;
(e) ``SFT→PPO`` with retrieved-token masking (value head critic);
(f) ``SFT→GRPO unmasked`` (``learner.mask_env_tokens=false``).

(a)/(b) can also be reported for the SFT model (``--sft-baselines``; off by default for the budget). The SFT model is
trained once and shared by all RL seeds; each RL arm runs ``--seeds`` seeds (seed = RL seed = rollout
seed). RL settings come from ``configs/smollm2_small.yaml`` (the real config loader), SFT settings
from the flags below. EM is the env's ``success``: Search-R1's normalisation (``normalize_answer``).

Statistics (``agentgym/stats.py``): per arm, EM per question is averaged over the arm's seeds and a
percentile bootstrap over questions (``bootstrap_ci``) gives the 95 % CI (seeds held fixed: the CI
covers question sampling, not seed-to-seed variation, which is reported separately as per-seed EM
and a t interval over seeds). Comparisons are paired bootstraps over questions (``paired_bootstrap_ci``).

Writes ``OUT/small_scale.json`` (config, machine, load, command, wall time per phase, every
per-question result), ``OUT/small_scale.md`` (the tables) and ``OUT/small_scale.png``; ``OUT`` is
``runs/search_r1_small/results`` unless ``--out`` says otherwise (the committed study in
``benchmarks/search_r1/results`` changes only when it is named). The runs' own artifacts go under
``--runs-dir`` (gitignored ``runs/``; RL checkpoints come every ``--checkpoint-every`` steps; after each run only the final
weights stay, ``RUN/checkpoints/step_N/model``, for ``agentgym eval --policy RUN``, unless ``--keep-checkpoints``), with ``progress.json``: every finished phase, so that Ctrl-C (one line, exit
130) or a killed session loses only the phase under way (an RL run: only the steps since its last
checkpoint) and ``--resume`` continues.

    python benchmarks/search_r1/small_scale.py --threads 1           # the default study
    python benchmarks/search_r1/small_scale.py --threads 1 --quick   # smoke run (minutes)
    python benchmarks/search_r1/small_scale.py --threads 1 --resume  # continue it after Ctrl-C
    python benchmarks/search_r1/small_scale.py --report-only --out DIR  # the table of what has finished so far
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
QTYPES = ("single_hop", "multi_hop", "no_search")
# (arm key, algo, mask) of the RL arms
RL_ARMS = (("grpo_masked", "grpo", True), ("ppo_masked", "ppo", True), ("grpo_unmasked", "grpo", False))
LABELS = {"none_base": "(a) no search, base model", "rag_base": "(b) RAG, base model",
          "sft": "(c) SFT only (Search-R1 protocol)", "grpo_masked": "(d) SFT→GRPO, masked",
          "ppo_masked": "(e) SFT→PPO, masked", "grpo_unmasked": "(f) SFT→GRPO, unmasked",
          "none_sft": "no search, SFT model", "rag_sft": "RAG, SFT model"}


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default=str(HERE / "configs" / "smollm2_small.yaml"))
    p.add_argument("--out", default="runs/search_r1_small/results",
                   help="JSON, markdown table and PNG (the committed study is benchmarks/search_r1/results: "
                        "pass that explicitly to refresh it)")
    p.add_argument("--runs-dir", default="runs/search_r1_small",
                   help="SFT and RL runs' own artifacts, and progress.json (the finished phases, for --resume)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted study with the same settings: reuse the finished evals, RL runs "
                        "and SFT model recorded in RUNS_DIR/progress.json")
    p.add_argument("--model", default=None, help="default: the config's (smollm2); tiny-random for tests")
    p.add_argument("--retriever", default=None, help="dense | bm25; default: the config's")
    p.add_argument("--eval-per-type", type=int, default=None,
                   help="held-out test questions per type (single_hop, multi_hop, no_search); default 20 (--quick 2)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="per turn; default: the config's")
    p.add_argument("--max-turns", type=int, default=None, help="search turns; default: the config's (4)")
    p.add_argument("--steps", type=int, default=None, help="RL steps; default: the config's")
    p.add_argument("--groups", type=int, default=None, help="prompts per RL step; default: the config's")
    p.add_argument("--group-size", type=int, default=None, help="samples per prompt; default: the config's")
    p.add_argument("--seeds", type=int, default=None, help="seeds per RL arm (0, 1, ...); default 3 (--quick 1)")
    p.add_argument("--arms", default=",".join(a for a, _, _ in RL_ARMS), help="RL arms to run")
    p.add_argument("--sft-episodes", type=int, default=None,
                   help="oracle episodes (train split) to clone; default 96 (--quick 8)")
    p.add_argument("--sft-epochs", type=float, default=None, help="default 2 (--quick 1)")
    p.add_argument("--sft-lr", type=float, default=1e-4)
    p.add_argument("--sft-batch-size", type=int, default=4)
    p.add_argument("--sft-model", default=None,
                   help="reuse a finished SFT run's directory (its model/ and data_summary.json) instead of training")
    p.add_argument("--sft-baselines", action="store_true", help="also (a)/(b) with the SFT model (~2 evals more)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 2 questions per type, 8 SFT episodes, 1 seed, 1 RL step of 1x2")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep the RL runs' final checkpoints whole (default: only their weights, not the optimizer "
                        "state that resuming needs)")
    p.add_argument("--retrain", default=None, metavar="RUN[,RUN...]",
                   help="with --resume: train finished RL runs again (e.g. grpo_masked_seed0) into their folders with "
                        "the same settings, for runs whose weights are gone and that a sampled re-score needs; the "
                        "recorded results stay, the new greedy eval goes to RUN/retrained.json beside them; then stop")
    p.add_argument("--checkpoint-every", type=int, default=5, metavar="N",
                   help="RL runs checkpoint every N steps, so that --resume continues a run a killed session "
                        "stopped from its last checkpoint instead of from step 0 (0: no periodic checkpoint)")
    p.add_argument("--replot", default=None, metavar="JSON",
                   help="recompute statistics, table and PNG from a finished run's small_scale.json (no training)")
    p.add_argument("--report-only", action="store_true",
                   help="the table and PNG of the phases RUNS_DIR/progress.json has finished so far (an interim "
                        "report of a study under way; trains and evaluates nothing; the same study flags)")
    p.add_argument("--n-boot", type=int, default=10_000)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's; 1 on a machine other jobs load)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="more TrainConfig overrides, e.g. optim.lr=5e-6")
    args = p.parse_args(argv)
    defaults = {"eval_per_type": (20, 2), "sft_episodes": (64, 8), "seeds": (3, 1), "sft_epochs": (1.0, 1.0)}
    for k, (full, quick) in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, quick if args.quick else full)
    if args.quick:
        args.steps, args.groups, args.group_size = args.steps or 1, args.groups or 1, args.group_size or 2
    return args


def load_train_config(args: argparse.Namespace, algo: str | None = None) -> Any:
    """The study's TrainConfig; with ``algo``, that arm's (the one ``learner:`` section of the file read as
    the algorithm's typed learner config)."""
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.config import load_config
    overrides = list(args.override) + ([f"algo={algo}"] if algo else [])
    for flag, key in (("model", "model"), ("retriever", "env_kwargs.retriever"),
                      ("max_new_tokens", "sampling.max_new_tokens"), ("max_turns", "env_kwargs.max_turns"),
                      ("steps", "steps"), ("groups", "groups_per_step"), ("group_size", "group_size")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    return load_config(TrainConfig, args.config, overrides)


def eval_indices(cfg: Any, per_type: int) -> list[int]:
    """The first ``per_type`` test questions of each type (fixed for the bundled world)."""
    import agentgym
    env = agentgym.make(cfg.env, **{**cfg.env_kwargs, **cfg.eval.env_kwargs, "retrieval": "none"})
    try:
        qs = env.unwrapped.questions
    finally:
        env.close()
    picked: list[int] = []
    for qt in QTYPES:
        idx = [i for i, q in enumerate(qs) if q.get("type") == qt][:per_type]
        if len(idx) < per_type:
            raise ValueError(f"only {len(idx)} test questions of type {qt}")
        picked += idx
    return sorted(picked)


def evaluate(policy: Any, cfg: Any, indices: list[int], retrieval: str, label: str) -> tuple[list[dict], float]:
    """Greedy episodes on ``indices``; per-question records and wall seconds. Baselines (retrieval
    none / rag) get one generation, as Search-R1's baselines."""
    from agentgym.rollout import RolloutEngine
    engine = RolloutEngine(policy, cfg.rollout.greedy())
    kwargs = {**cfg.env_kwargs, **cfg.eval.env_kwargs, "retrieval": retrieval}
    if retrieval != "agentic":
        kwargs.update(max_turns=1, forced_answer=False)
    t0 = time.perf_counter()
    reported = [0]

    def progress(p: Any) -> None:   # an agentgym.rollout.RolloutProgress
        if p.finished >= reported[0] + max(1, p.total // 3) or (p.finished == p.total and reported[0] < p.total):
            reported[0] = p.finished
            log(f"  [{label}] {p.finished}/{p.total} episodes, {time.perf_counter() - t0:.0f} s")

    try:
        batch = engine.collect(cfg.env, task_indices=indices, seed=cfg.seed, env_kwargs=kwargs, progress=progress)
    finally:
        engine.close()
    tok = policy.tokenizer
    records = []
    for t in batch.trajectories:
        ep = t.episode
        response = tok.decode([i for i, m in zip(t.token_ids, t.loss_mask) if m][-120:])
        records.append({"task_index": int(t.task_index), "type": ep.get("question_type"),
                        "em": float(bool(ep.get("success"))), "searches": float(ep.get("searches", 0)),
                        "invalid": float(ep.get("invalid_actions", 0)), "answered": float(not t.truncated),
                        "found_gold": float(bool(ep.get("found_gold"))), "turns": float(t.num_turns),
                        "response_tokens": float(t.num_policy_tokens), "response_tail": response})
    records.sort(key=lambda r: r["task_index"])
    return records, time.perf_counter() - t0


def run_sft(args: argparse.Namespace, cfg: Any, runs_dir: Path) -> tuple[dict, Any]:
    from agentgym.algorithms.offline.sft import SFTData, SFTRunConfig, TrainerOptimConfig as OptimSettings, run_sft as _run_sft
    sft_cfg = SFTRunConfig(env=cfg.env, env_kwargs=dict(cfg.env_kwargs), model=cfg.model,
                           data=SFTData(source="oracle", episodes=args.sft_episodes, seed=0),
                           rollout=cfg.rollout,   # the RL runs' token layout
                           optim=OptimSettings(lr=args.sft_lr, epochs=args.sft_epochs, batch_size=args.sft_batch_size,
                                               warmup_ratio=0.1, logging_steps=1),
                           seed=0, device=cfg.device, output_dir=str(runs_dir / "sft"))
    return _run_sft(sft_cfg, overwrite=True), sft_cfg


def run_rl(policy: Any, cfg: Any, algo: str, mask: bool, seed: int, out_dir: Path, keep_ckpt: bool,
           checkpoint_every: int = 0, resume: bool = False) -> dict:
    """One RL run from the policy's current weights (trained in place); its held-out eval is ours.

    ``resume``: continue the run in ``out_dir`` from its last checkpoint (a session killed mid-run), if it
    has one; otherwise (and without ``resume``) the run starts from step 0 and replaces what is there."""
    from agentgym.algorithms.loop.trainer import Trainer
    learner = replace(cfg.learner, mask_env_tokens=mask, seed=seed)
    if algo == "ppo":   # Search-R1 PPO: KL in the reward, k1 estimator; GAE gamma = lam = 1 (the defaults)
        learner = replace(learner, kl_in="reward", kl_estimator="k1")
    run_cfg = replace(cfg, algo=algo, seed=seed, learner=learner, output_dir=str(out_dir),
                      eval=replace(cfg.eval, episodes=1), checkpoint_every=checkpoint_every, keep_checkpoints=1)
    name = out_dir.name
    trainer = Trainer(run_cfg, policy=policy, log=lambda s: log(f"  [{name}] {s}"))
    trainer.evals = [{"tag": "before", "step": 0.0}]   # no step-0 eval: the SFT-only arm is that eval
    ckpt = trainer.latest_checkpoint() if resume else None
    if ckpt is not None:
        log(f"  [{name}] continuing from {ckpt}")
    result = trainer.train(resume=ckpt is not None, overwrite=ckpt is None)
    for row in result["history"]:
        log(f"  [{name}] step {int(row['step'])}: reward {row['rollout/reward_mean']:+.3f} "
            f"success {row['rollout/success_rate']:.3f} searches {row['rollout/tool_calls_mean']:.2f} "
            f"loss {row.get('train/loss', float('nan')):+.4f} ({row['time/step_s']:.0f} s)")
    if not keep_ckpt:  # keep the final weights (0.5 GB for SmolLM2-135M; a re-score needs them), not the state
        for state in (out_dir / "checkpoints").glob("step_*/state.pt"):
            state.unlink()
    del trainer   # its learner holds a reference model and optimizer state: free them before the next run
    gc.collect()
    return {"history": result["history"], "output_dir": result["output_dir"]}


# ----------------------------------------------------------------------------- statistics
def per_question(runs: list[list[dict]], key: str, qtype: str | None = None) -> list[float]:
    """``key`` per question, averaged over the runs (seeds) of an arm; ``qtype`` filters questions."""
    rows = [r for r in runs[0] if qtype in (None, r["type"])]
    ids = [r["task_index"] for r in rows]
    by_run = [{r["task_index"]: r[key] for r in run} for run in runs]
    return [sum(b[i] for b in by_run) / len(by_run) for i in ids]


def arm_stats(runs: list[list[dict]], n_boot: int) -> dict[str, Any]:
    """One arm's EM (overall and per type) with bootstrap CIs over questions, and its per-seed EMs.

    ``ci_undefined``: the EM intervals that do not exist and why, e.g. every question scored the same
    (``questions agree: no spread``): their bounds stay the bootstrap's (equal) numbers, but the table
    prints n/a. ``em_seed_t_ci`` has NaN bounds when there is no interval over seeds."""
    from agentgym.stats import bootstrap_ci, mean_ci, undefined_reason, without_undefined
    s: dict[str, Any] = {"seeds": len(runs), "questions": len(runs[0]), "ci_undefined": {}}
    for qt in (None, *QTYPES):
        key, vals = f"em_{qt or 'overall'}", per_question(runs, "em", qt)
        s[key] = bootstrap_ci(vals, n_boot=n_boot) if vals else (math.nan,) * 3
        reason = undefined_reason(s[key], len(vals), "question")
        if reason:
            s["ci_undefined"][key] = reason
    for key in ("searches", "invalid", "answered", "found_gold", "response_tokens"):
        s[key] = bootstrap_ci(per_question(runs, key), n_boot=n_boot)
    s["em_per_seed"] = [sum(r["em"] for r in run) / len(run) for run in runs]
    s["em_seed_t_ci"] = None
    if len(runs) > 1:
        s["em_seed_t_ci"], reason = without_undefined(mean_ci(s["em_per_seed"]), len(runs))
        if reason:
            s["ci_undefined"]["em_seed_t_ci"] = reason
    return s


def _difference(raw: tuple[float, float, float], n: int, unit: str) -> dict[str, Any]:
    """A difference's record: NaN bounds and the reason (``undefined``) where there is no interval, e.g.
    every question changed by the same amount, so a zero-width interval is never read as exact; the
    verdict is then ``n/a``, never significant."""
    from agentgym.stats import verdict, without_undefined
    ci, reason = without_undefined(raw, n, unit)
    return {"diff": ci[0], "ci_low": ci[1], "ci_high": ci[2], "verdict": verdict(raw), "undefined": reason}


def compare(a: list[list[dict]], b: list[list[dict]], sa: dict, sb: dict, n_boot: int) -> dict[str, Any]:
    from agentgym.stats import diff_ci, mean_ci, paired_bootstrap_ci, paired_diff_ci
    out: dict[str, Any] = {}
    # seed-to-seed variation, which the question bootstrap (seeds held fixed) does not cover
    (na, ea), (nb, eb) = (sa["seeds"], sa["em_per_seed"]), (sb["seeds"], sb["em_per_seed"])
    if na > 1 and nb > 1:   # two RL arms: Welch's interval, and paired by seed (the same tasks, sampling seed, start)
        out["seed_welch"] = _difference(diff_ci(ea, eb), min(na, nb), "seed")
        if na == nb:
            out["seed_paired"] = _difference(paired_diff_ci(ea, eb), na, "seed")
    elif na > 1 or nb > 1:  # an RL arm against a one-run greedy baseline, whose EM is a constant: t over the seeds
        diffs = [v - eb[0] for v in ea] if na > 1 else [ea[0] - v for v in eb]
        out["seed_t"] = _difference(mean_ci(diffs), max(na, nb), "seed")
    for qt in (None, *QTYPES):
        k = qt or "overall"
        x, y = per_question(a, "em", qt), per_question(b, "em", qt)
        (_, lo_a, hi_a), (_, lo_b, hi_b) = sa[f"em_{k}"], sb[f"em_{k}"]
        out[k] = {**_difference(paired_bootstrap_ci(x, y, n_boot=n_boot), len(x), "question"),
                  "marginal_cis_overlap": bool(lo_a <= hi_b and lo_b <= hi_a)}
    return out


# ----------------------------------------------------------------------------- outputs
def fmt_ci(c: Any, undefined: str | None = None) -> str:
    """``EM [low, high]``; ``EM, CI n/a (<why>)`` where the interval does not exist (``undefined``)."""
    m, lo, hi = c
    if m is None or math.isnan(m):
        return "n/a"
    return f"{m:.3f}, CI n/a ({undefined})" if undefined else f"{m:.3f} [{lo:.2f}, {hi:.2f}]"


def fmt_diff(d: dict[str, Any]) -> str:
    """A difference's table cell: ``Δ [low, high]``, or ``Δ, CI n/a (<why>)``."""
    if d.get("undefined") or math.isnan(d["ci_low"]):
        return f"{d['diff']:+.3f}, CI n/a ({d.get('undefined') or 'no interval'})"
    return f"{d['diff']:+.3f} [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]"


def over_seeds(c: dict[str, Any]) -> str:
    """A comparison's interval over seeds as a table cell (``—`` where no arm has several seeds)."""
    if "seed_t" in c:
        return f"{fmt_diff(c['seed_t'])} (t)"
    if "seed_welch" not in c:
        return "—"
    cell = f"Welch {fmt_diff(c['seed_welch'])}"
    return cell + (f"; paired {fmt_diff(c['seed_paired'])}" if "seed_paired" in c else "")


def markdown(result: dict[str, Any]) -> str:
    meta, stats, comps = result["meta"], result["stats"], result["comparisons"]
    la, lb = meta["machine"]["load_average_start"], meta["machine"]["load_average_end"]
    lines = [f"# Small-scale Search-R1 study ({meta['date']})", "",
             f"Model `{meta['model']}` (smollm2 = SmolLM2-135M-Instruct) on the bundled SearchQA world, retriever `{meta['retriever']}` "
             f"(top-{meta['topk']}), {meta['eval_questions']} held-out test questions ({meta['eval_per_type']} per type), "
             "greedy, EM with Search-R1's normalisation. EM [95 % CI]: percentile bootstrap over questions "
             "(10k resamples) of the per-question EM averaged over the arm's seeds (seeds held fixed); "
             "deterministic greedy baselines have one run. Raw: `small_scale.json`.", "",
             *([f"**Interim report** (`--report-only`) of a study under way; not finished: "
                f"{'; '.join(meta['interim'])}.", ""] if meta.get("interim") else []),
             "| arm | seeds | EM overall | single_hop | multi_hop | no_search | searches / ep | invalid / ep | "
             "answered | EM per seed |",
             "|---|---:|---|---|---|---|---:|---:|---:|---|"]
    for key, s in stats.items():
        seeds = ", ".join(f"{v:.3f}" for v in s["em_per_seed"]) if s["seeds"] > 1 else ""
        em = {c: fmt_ci(s[f"em_{c}"], s.get("ci_undefined", {}).get(f"em_{c}")) for c in ("overall", *QTYPES)}
        lines.append(f"| {LABELS.get(key, key)} | {s['seeds']} | {em['overall']} | {em['single_hop']} | "
                     f"{em['multi_hop']} | {em['no_search']} | {s['searches'][0]:.2f} | "
                     f"{s['invalid'][0]:.2f} | {s['answered'][0]:.2f} | {seeds} |")
    lines += ["", "*CI n/a (questions agree: no spread)*: every question scored the same (or, for a difference, "
              "changed by the same amount), so the bootstrap interval has zero width: the questions agreed, the "
              "value is not known exactly. No such interval is counted as excluding 0 ('n/a' below).", "",
              "Comparisons (paired bootstrap over questions of the EM difference; 'excludes 0' = the 95 % CI of "
              "the difference excludes 0; 'CIs overlap' = the two arms' own CIs overlap):", "",
              "| comparison | Δ EM overall [95 % CI] | excludes 0 | CIs overlap | Δ single_hop | Δ multi_hop | Δ no_search | "
              "Δ over seeds [95 % CI] |",
              "|---|---|---|---|---|---|---|---|"]
    for name, c in comps.items():
        o = c["overall"]
        excludes = {"significant": "yes", "noise": "no"}.get(o["verdict"], "n/a")
        lines.append(f"| {name} | {fmt_diff(o)} | {excludes} | "
                     f"{'yes' if o['marginal_cis_overlap'] else 'no'} | {fmt_diff(c['single_hop'])} | "
                     f"{fmt_diff(c['multi_hop'])} | {fmt_diff(c['no_search'])} | {over_seeds(c)} |")
    lines += ["", "Δ over seeds: against a one-run greedy baseline, Student's t over the RL arm's per-seed EMs minus "
              "the baseline's; between two RL arms, Welch's interval and the interval paired by seed (seed s of "
              "both arms: the same training tasks, sampling seed and starting model)."]
    sft = result["sft"]
    lines += ["", f"SFT warm start: {sft['kept']} oracle episodes (train split) kept of {sft['episodes']}, "
              f"{sft['steps']} optimizer steps, loss {sft['loss_first']:.3f} → {sft['loss_last']:.3f}; "
              "shared by all RL seeds. RL per run: "
              f"{meta['rl']['steps']} steps × {meta['rl']['groups']} prompts × {meta['rl']['group_size']} samples, "
              f"lr {meta['rl']['lr']}, {meta['rl']['max_new_tokens']} new tokens per turn, {meta['rl']['max_turns']} "
              "search turns + forced answer.", "",
              f"Machine: {meta['machine']['platform']}, {meta['machine']['cpus']} CPUs, torch threads "
              f"{meta['machine']['torch_threads']}; load average at start {la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f}, "
              f"at end {lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f}. Command: `{meta['command']}`.", "",
              "Wall time per phase (s): " + ", ".join(f"{k} {v:.0f}" for k, v in meta["wall_s"].items()) + ".", "",
              "**What this can and cannot show.** It can show, on a synthetic world whose facts the model cannot "
              "know, whether a 135M model warm-started on oracle search traces and then trained a few RL steps "
              "answers more held-out questions than answering directly or with one-shot RAG, per question type, "
              "with intervals over the question sample. It cannot show what Search-R1 shows at scale: the RL "
              f"runs are {meta['rl']['steps']} steps of {meta['rl']['groups'] * meta['rl']['group_size']} episodes "
              "(Search-R1: ~1000 steps of 512 prompts), so most of any gain over the baselines is the SFT warm "
              "start's, and masked vs unmasked or GRPO vs PPO differences this small are within what "
              f"{meta['eval_questions']} questions × {meta['seeds']} seeds can resolve only if large. The CIs cover "
              "question sampling with the seeds held fixed; the last column covers the seed-to-seed spread, over "
              f"{meta['seeds']} seeds."]
    weak = [LABELS.get(k, k) for k in ("none_base", "rag_base") if k in stats and stats[k]["answered"][0] < 0.5]
    if weak:
        lines += ["", f"Note: {', '.join(weak)} gave an `<answer>` in under half of the episodes "
                  f"(answered column): the base model's baseline EM here measures mostly whether it follows the "
                  "answer format, not what it knows or reads; an SFT'd model's no-search / RAG rows "
                  "(`--sft-baselines`) separate format from retrieval."]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    stats = result["stats"]
    keys = list(stats)
    cats = ["overall", *QTYPES]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 4.8), gridspec_kw={"width_ratios": [2.2, 1]})
    width = 0.8 / len(keys)
    x = np.arange(len(cats))
    for i, k in enumerate(keys):
        m = np.array([stats[k][f"em_{c}"][0] for c in cats])
        lo = np.array([stats[k][f"em_{c}"][1] for c in cats])
        hi = np.array([stats[k][f"em_{c}"][2] for c in cats])
        ax.bar(x + (i - (len(keys) - 1) / 2) * width, m, width, yerr=[m - lo, hi - m], capsize=2,
               label=LABELS.get(k, k))
    ax.set_xticks(x, cats)
    ax.set_ylabel("held-out EM (greedy)")
    ax.set_ylim(0, 1)
    ax.set_title(f"EM per arm and question type, 95 % bootstrap CI ({result['meta']['eval_questions']} questions)",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    for arm, runs in result["rl"].items():
        hs = [r["history"] for r in runs]
        steps = [int(row["step"]) for row in hs[0]]
        for h in hs:
            ax2.plot(steps, [row["rollout/success_rate"] for row in h], alpha=0.25,
                     color=f"C{keys.index(arm) if arm in keys else 0}")
        mean = np.mean([[row["rollout/success_rate"] for row in h] for h in hs], axis=0)
        ax2.plot(steps, mean, marker="o", label=f"{LABELS.get(arm, arm)} (mean of {len(hs)})",
                 color=f"C{keys.index(arm) if arm in keys else 0}")
    ax2.set_title("RL: rollout EM per step (sampled, train split)", fontsize=9)
    ax2.set_xlabel("step")
    ax2.set_ylim(0, 1)
    ax2.grid(alpha=0.3)
    if result["rl"]:
        ax2.legend(fontsize=7)
    else:   # an interim report before the first RL run finished
        ax2.text(0.5, 0.5, "no RL run finished yet", ha="center", va="center", transform=ax2.transAxes)
    fig.suptitle("Search-R1 small scale: SmolLM2-135M on the bundled SearchQA world (CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def analyse(records: dict[str, list[list[dict]]], n_boot: int) -> tuple[dict, dict]:
    """Per-arm statistics and the comparisons, from the per-question records."""
    order = ["none_base", "rag_base", "sft", *[a for a, _, _ in RL_ARMS], "none_sft", "rag_sft"]
    stats = {k: arm_stats(records[k], n_boot) for k in order if k in records}
    comps: dict[str, Any] = {}
    rl_keys = [a for a, _, _ in RL_ARMS if a in records]
    # the baselines, format-matched ones (the same SFT model, no search or one-shot RAG) included
    pairs = [(key, other) for key in rl_keys for other in ("none_base", "rag_base", "sft", "none_sft", "rag_sft")]
    pairs += [("grpo_masked", "grpo_unmasked"), ("grpo_masked", "ppo_masked")]
    pairs += [("sft", other) for other in ("none_base", "rag_base", "none_sft", "rag_sft")]
    for x, y in pairs:
        if x in records and y in records:
            comps[f"{LABELS[x]} − {LABELS[y]}"] = compare(records[x], records[y], stats[x], stats[y], n_boot)
    return stats, comps


def replot(path: Path, out: Path, n_boot: int) -> int:
    result = json.loads(path.read_text())
    result["stats"], result["comparisons"] = analyse(result["records"], n_boot)
    out.mkdir(parents=True, exist_ok=True)
    (out / "small_scale.json").write_text(json.dumps(result, indent=1, default=float))
    md = markdown(result)
    (out / "small_scale.md").write_text(md)
    plot(result, out / "small_scale.png")
    print(md)
    return 0


class Progress:
    """The study's finished phases, saved in ``RUNS_DIR/progress.json`` after each one.

    An interrupted study (Ctrl-C, a killed session) keeps every finished eval, RL run and the SFT model,
    so ``--resume`` continues it instead of redoing up to an hour of work. The file is taken over only
    by a run with the same settings (``fingerprint``: the resolved config and the study's flags), and an
    RL run counts as finished only once its held-out eval is recorded.
    """

    def __init__(self, path: Path, fingerprint: dict[str, Any]):
        self.path = path
        self.fingerprint = json.loads(json.dumps(fingerprint, default=str))
        self.records: dict[str, list[list[dict]]] = {}
        self.rl: dict[str, list[dict]] = {}
        self.timings: dict[str, float] = {}
        self.sft: dict[str, Any] | None = None
        self.sft_config: dict[str, Any] | None = None
        self.reused: list[str] = []
        self._started, self._elapsed_before = time.perf_counter(), 0.0

    def load(self) -> None:
        """Take over an earlier run's finished phases (``--resume``); a file from other settings is an error."""
        if not self.path.exists():
            return
        old = json.loads(self.path.read_text())
        if not _same_fingerprint(old.get("fingerprint") or {}, self.fingerprint):
            raise ValueError(f"--resume: {self.path} is from a study with other settings; "
                             "run without --resume to start again")
        moved = self.path.parent / "sft" / "model"   # the study folder was moved or named differently
        if old["sft"] and not Path(old["sft"]["model_dir"]).is_dir() and moved.is_dir():
            old["sft"]["model_dir"] = str(moved)
        if old["sft"] and not Path(old["sft"]["model_dir"]).is_dir():
            raise ValueError(f"--resume: the SFT model {old['sft']['model_dir']} the finished phases used is gone; "
                             "run without --resume to start again")
        self.records, self.rl, self.timings = old["records"], old["rl"], old["timings"]
        self.sft, self.sft_config = old["sft"], old["sft_config"]
        self._elapsed_before = float(old.get("elapsed_s", 0.0))
        self.reused = self.finished()

    def elapsed(self) -> float:
        """Wall seconds of the study so far, over every process that worked on it."""
        return self._elapsed_before + time.perf_counter() - self._started

    def save(self) -> None:
        """Write atomically: a Ctrl-C during the write leaves the previous file."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "records": self.records, "rl": self.rl,
                                   "timings": self.timings, "sft": self.sft, "sft_config": self.sft_config,
                                   "elapsed_s": self.elapsed()}, default=float))
        os.replace(tmp, self.path)

    def finished(self) -> list[str]:
        rl_arms = {a for a, _, _ in RL_ARMS}
        done = ["SFT"] if self.sft else []
        for key, runs in self.records.items():
            done += [f"{key}_seed{i}" for i in range(len(runs))] if key in rl_arms else [key]
        return done

    def interrupted(self) -> str:
        """The one line printed on Ctrl-C: what was kept and how to go on."""
        done = self.finished()
        if not done:
            return "no phase had finished, nothing to keep; run the same command again"
        return (f"kept {len(done)} finished phase(s) ({', '.join(done)}) in {self.path}; run the same "
                "command with --resume to continue (an RL run under way goes on from its last checkpoint; "
                "any other phase under way starts again)")


def _same_fingerprint(recorded: dict[str, Any], current: dict[str, Any]) -> bool:
    """The same study: the same flags, and the same config up to knobs added since, left at their default,
    and up to knobs that do not change what a run learns (``TrainConfig.RESULT_NEUTRAL``: micro-batching,
    checkpoint keeping, where it is written)."""
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.config import same_config, to_dict
    defaults = json.loads(json.dumps(to_dict(TrainConfig()), default=str))
    args = {k: v for k, v in (recorded.get("args") or {}).items() if k not in _FREE}   # recorded before runs_dir was free
    return args == current.get("args") and same_config(recorded.get("config") or {}, current.get("config") or {},
                                                       defaults, TrainConfig.RESULT_NEUTRAL)


#: flags that do not shape the study: where the outputs go (a relative or absolute name of the same folder,
#: or a moved one), threads, bootstrap resamples, checkpoint keeping; override is in the config
_FREE = {"out", "runs_dir", "resume", "replot", "report_only", "threads", "keep_checkpoints", "checkpoint_every", "n_boot", "override",
         "retrain"}


def fingerprint(args: argparse.Namespace, cfg: Any) -> dict[str, Any]:
    """What ``--resume`` requires to be unchanged: the resolved config and the flags that shape the study
    (not where the outputs go, threads, bootstrap resamples or checkpoint keeping)."""
    from agentgym.config import to_dict
    return {"config": to_dict(cfg), "args": {k: v for k, v in vars(args).items() if k not in _FREE}}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = parse_args(argv)
    if args.replot:
        return replot(Path(args.replot), Path(args.out), args.n_boot)
    if args.threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_train_config(args)
    runs_dir = Path(args.runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress(runs_dir / "progress.json", fingerprint(args, cfg))
    if args.retrain and not args.resume:
        print("error: --retrain trains finished runs of a study again: give it with --resume and the study's flags",
              file=sys.stderr)
        return 2
    if args.report_only:
        return report_only(args, argv, cfg, progress)
    if args.resume:
        try:
            progress.load()
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    try:
        return run_study(args, argv, cfg, progress)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(progress.interrupted()) from None


def run_study(args: argparse.Namespace, argv: list[str] | None, cfg: Any, progress: Progress) -> int:
    """The study itself; each finished phase is recorded in ``progress`` (and skipped if it already is)."""
    import torch

    from agentgym.config import to_dict
    from agentgym.policies.loading import load_policy
    from agentgym.policies.backends import trainable_backend
    out, runs_dir = Path(args.out), Path(args.runs_dir)
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    indices = eval_indices(cfg, args.eval_per_type)
    arms = [a for a in RL_ARMS if a[0] in args.arms.split(",")]
    log(f"model {cfg.model}, retriever {cfg.env_kwargs.get('retriever')}; {len(indices)} eval questions; SFT "
        f"{args.sft_episodes} oracle episodes x {args.sft_epochs} epochs; RL {[a[0] for a in arms]} x {args.seeds} "
        f"seeds, {cfg.steps} steps x {cfg.groups_per_step}x{cfg.group_size}; {cfg.sampling.max_new_tokens} new "
        f"tokens/turn; torch threads {torch.get_num_threads()}; load average {load_start[0]:.2f}")
    if progress.reused:
        log(f"--resume: reusing {', '.join(progress.reused)} from {progress.path}")
    timings, records, rl = progress.timings, progress.records, progress.rl

    def timed_eval(policy: Any, key: str, retrieval: str) -> list[dict]:
        log(f"eval {LABELS.get(key, key)} (retrieval={retrieval})")
        recs, timings[f"eval_{key}"] = evaluate(policy, cfg, indices, retrieval, key)
        log(f"  EM {sum(r['em'] for r in recs) / len(recs):.3f}, searches/ep "
            f"{sum(r['searches'] for r in recs) / len(recs):.2f} ({timings[f'eval_{key}']:.0f} s)")
        return recs

    def baselines(policy: Any, keys: tuple[str, str]) -> None:
        """(a) no search and (b) RAG with ``policy``, unless already recorded."""
        for key, retrieval in zip(keys, ("none", "rag")):
            if key not in records:
                records[key] = [timed_eval(policy, key, retrieval)]
                progress.save()

    # (a), (b): the base model
    if not {"none_base", "rag_base"} <= set(records):
        t0 = time.perf_counter()
        base = load_policy(cfg.model, trainable_backend(), device=cfg.device, seed=cfg.seed)
        timings["load_base"] = time.perf_counter() - t0
        baselines(base, ("none_base", "rag_base"))
        del base

    # SFT warm start on oracle episodes
    if progress.sft is None:
        log(f"SFT: {args.sft_episodes} oracle episodes (train split), {args.sft_epochs} epochs, lr {args.sft_lr}")
        t0 = time.perf_counter()
        if args.sft_model:   # reuse: the summary of that run (its losses are in its train_log.csv)
            sft_dir = Path(args.sft_model)
            progress.sft = {**json.loads((sft_dir / "data_summary.json").read_text()),
                            "model_dir": str(sft_dir / "model"), "reused": True, "steps": float("nan"),
                            "loss_first": float("nan"), "loss_last": float("nan")}
        else:
            progress.sft, sft_cfg = run_sft(args, cfg, runs_dir)
            progress.sft_config = to_dict(sft_cfg)
        timings["sft"] = time.perf_counter() - t0
        progress.save()
    sft_summary = progress.sft
    log(f"  SFT: kept {sft_summary['kept']}/{sft_summary['episodes']}, {sft_summary['steps']} steps, loss "
        f"{sft_summary['loss_first']:.3f} -> {sft_summary['loss_last']:.3f} ({timings['sft']:.0f} s)")
    policy = load_policy(sft_summary["model_dir"], trainable_backend(), device=cfg.device, dtype=torch.float32)
    sft_state = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    if "sft" not in records:
        records["sft"] = [timed_eval(policy, "sft", "agentic")]
        progress.save()
    if args.sft_baselines:
        baselines(policy, ("none_sft", "rag_sft"))
    if args.retrain:
        return retrain(args, cfg, records, policy, sft_state, runs_dir, timed_eval)

    # RL arms from the SFT weights
    for key, algo, mask in arms:
        records.setdefault(key, [])
        rl.setdefault(key, [])
        for seed in range(len(records[key]), args.seeds):
            name = f"{key}_seed{seed}"
            log(f"RL {name}: {algo}, mask_env_tokens={mask}, {cfg.steps} steps")
            policy.model.load_state_dict(sft_state)
            t0 = time.perf_counter()
            arm_cfg = load_train_config(args, algo)     # the study's learner: section, as the arm's typed config
            run = run_rl(policy, arm_cfg, algo, mask, seed, runs_dir / name, args.keep_checkpoints,
                         checkpoint_every=args.checkpoint_every, resume=args.resume)
            timings[f"rl_{name}"] = time.perf_counter() - t0
            from agentgym.algorithms.loop.run_control import release_memory
            before, after = release_memory()
            log(f"  {name}: {timings[f'rl_{name}']:.0f} s" + (
                f", process RSS {before / 2**30:.1f} -> {after / 2**30:.1f} GiB once the run's memory was released"
                if before is not None and after is not None else ""))
            recs = timed_eval(policy, name, "agentic")
            rl[key].append(run)       # finished only with its eval: both or neither are kept
            records[key].append(recs)
            progress.save()

    return write_report(args, argv, cfg, progress, load_start)


def retrain(args: argparse.Namespace, cfg: Any, records: dict[str, list], policy: Any, sft_state: dict,
            runs_dir: Path, timed_eval: Any) -> int:
    """``--retrain``: each named finished RL run trained again from the SFT weights with its own settings (arm,
    seed, config), into its folder, so that its final weights exist; its recorded eval is not replaced. The
    new run's greedy eval is written to ``RUN/retrained.json`` with how many questions it scores otherwise
    than the record (CPUs differ in float order, so a run is the same study, not the same bits)."""
    arms = {key: (algo, mask) for key, algo, mask in RL_ARMS}
    for name in (n.strip() for n in args.retrain.split(",") if n.strip()):
        key, _, seed_text = name.rpartition("_seed")
        if key not in arms or not seed_text.isdigit():
            print(f"error: --retrain {name}: not an RL run name (ARM_seedN, ARM one of {', '.join(arms)})", file=sys.stderr)
            return 2
        seed = int(seed_text)
        if seed >= len(records.get(key, [])):
            print(f"error: --retrain {name}: that run has not finished in this study; run the study with --resume "
                  "instead", file=sys.stderr)
            return 2
        out_dir = runs_dir / name
        if (out_dir / "retrained.json").is_file():
            log(f"--retrain {name}: done before ({out_dir / 'retrained.json'})")
            continue
        if (out_dir / "checkpoints" / f"step_{cfg.steps:06d}" / "model").is_dir():
            log(f"--retrain {name}: its final weights are here ({out_dir}/checkpoints): nothing to train again")
            continue
        algo, mask = arms[key]
        log(f"RL {name} again: {algo}, mask_env_tokens={mask}, {cfg.steps} steps (--retrain)")
        policy.model.load_state_dict(sft_state)
        t0 = time.perf_counter()
        run_rl(policy, load_train_config(args, algo), algo, mask, seed, out_dir, args.keep_checkpoints,
               checkpoint_every=args.checkpoint_every, resume=args.resume)
        train_s = time.perf_counter() - t0
        recs = timed_eval(policy, f"{name}_retrained", "agentic")
        recorded = records[key][seed]
        by_task = {r["task_index"]: r["em"] for r in recorded}
        differ = sum(r["em"] != by_task.get(r["task_index"]) for r in recs)
        em, em_recorded = (sum(r["em"] for r in rs) / len(rs) for rs in (recs, recorded))
        (out_dir / "retrained.json").write_text(json.dumps(
            {"run": name, "em": em, "recorded_em": em_recorded, "questions_differing": differ,
             "questions": len(recs), "train_s": train_s, "records": recs}, indent=1))
        log(f"  {name} again: EM {em:.3f} (recorded {em_recorded:.3f}); {differ} of {len(recs)} questions differ")
    return 0


def report_only(args: argparse.Namespace, argv: list[str] | None, cfg: Any, progress: Progress) -> int:
    """``--report-only``: the report of the finished phases, training nothing (needs the SFT phase done)."""
    if not progress.path.exists():
        print(f"error: --report-only: no {progress.path}: nothing has finished in this runs dir", file=sys.stderr)
        return 2
    try:
        progress.load()
    except ValueError as e:
        print(f"error: {str(e).replace('--resume', '--report-only')}", file=sys.stderr)
        return 2
    if progress.sft is None or "sft" not in progress.records:
        print("error: --report-only: the SFT phase has not finished yet: there is nothing to compare", file=sys.stderr)
        return 2
    Path(args.out).mkdir(parents=True, exist_ok=True)
    planned = {a for a in args.arms.split(",")}
    left = [f"{a}: {len(progress.records.get(a, []))} of {args.seeds} seeds" for a, _, _ in RL_ARMS
            if a in planned and len(progress.records.get(a, [])) < args.seeds]
    if left:
        log("--report-only: an interim report; not finished: " + "; ".join(left))
    return write_report(args, argv, cfg, progress, os.getloadavg(), interim=left)


def write_report(args: argparse.Namespace, argv: list[str] | None, cfg: Any, progress: Progress,
                 load_start: tuple[float, ...], interim: list[str] | None = None) -> int:
    """``small_scale.json``, ``.md`` and ``.png`` in ``--out`` from the phases ``progress`` holds."""
    import torch

    from agentgym.config import to_dict
    out, timings, records, rl, sft_summary = Path(args.out), progress.timings, progress.records, progress.rl, progress.sft
    indices = eval_indices(cfg, args.eval_per_type)
    stats, comps = analyse(records, args.n_boot)
    timings["total"] = progress.elapsed()   # a resumed study: every process's wall
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "model": cfg.model,
            "retriever": cfg.env_kwargs.get("retriever"), "topk": cfg.env_kwargs.get("topk"),
            "eval_questions": len(indices), "eval_per_type": args.eval_per_type, "eval_task_indices": indices,
            "seeds": args.seeds,
            "rl": {"steps": cfg.steps, "groups": cfg.groups_per_step, "group_size": cfg.group_size, "lr": cfg.optim.lr,
                   "max_new_tokens": cfg.sampling.max_new_tokens, "max_turns": cfg.env_kwargs.get("max_turns")},
            "command": " ".join(["OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", ""), "python",
                                 *(sys.argv if argv is None else ["benchmarks/search_r1/small_scale.py", *argv])]),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                        "load_average_start": list(load_start), "load_average_end": list(os.getloadavg())},
            "wall_s": timings, "resumed": progress.reused, "interim": interim or [],
            "stats_method": "per-question EM averaged over the arm's seeds; percentile bootstrap over questions "
                            "(agentgym.stats.bootstrap_ci); comparisons: paired bootstrap over questions "
                            "(paired_bootstrap_ci); seeds held fixed. em_seed_t_ci: Student t over per-seed EM."}
    result = {"meta": meta, "args": vars(args), "config": to_dict(cfg), "sft_config": progress.sft_config,
              "sft": sft_summary, "stats": stats, "comparisons": comps, "records": records, "rl": rl}
    (out / "small_scale.json").write_text(json.dumps(result, indent=1, default=float))
    md = markdown(result)
    (out / "small_scale.md").write_text(md)
    plot(result, out / "small_scale.png")
    log(f"wrote {out / 'small_scale.json'}, small_scale.md, small_scale.png (total {timings['total'] / 60:.1f} min)")
    print(md)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))   # benchmarks/: the scripts' shared helpers (not a package)
    from _common import run_interruptible
    sys.exit(run_interruptible(main))
