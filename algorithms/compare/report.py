"""The comparison's report: per-variant summary with intervals over seeds, pairwise differences, and the
artifacts (``compare.csv``, ``compare.png``, ``compare.md``, ``compare.json``). The definitions of the
metrics are in :mod:`agentgym.algorithms.compare.harness`'s docstring."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import math
import os
import platform
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from agentgym.stats import (diff_ci, format_ci, hierarchical_bootstrap_diff, mean_ci, min_detectable_difference,
                                paired_bootstrap_ci, paired_count, paired_diff_ci, paired_min_detectable, verdict,
                                without_undefined)

from agentgym.algorithms.compare.arms import (RunRecord, Variant, metric_role, primary_lines, provenance_lines,
                                              run_commits)
from agentgym.algorithms.compare.health import health_lines, health_summary
from agentgym.algorithms.loop.train_config import TrainConfig

__all__ = ["CSV_COLUMNS", "is_negative_control", "markdown_table", "plot_comparison", "summarize_runs",
           "write_artifacts", "write_csv"]

#: the metrics every comparison's table of differences has (the declared and exploratory ones are added)
DIFFERENCE_METRICS = ("final_reward", "auc_reward", "eval_success_after")

CSV_COLUMNS = ["phase", "algo", "learner", "seed", "step", "episodes", "reward", "reward_std", "success",
               "tokens", "tokens_cumulative", "step_s", "wall_s", "run_wall_s", "kl", "entropy", "loss", "tasks",
               "signal_share", "episodes_generated_total"]


def _g(row: Mapping[str, Any], key: str) -> float:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) else float("nan")


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return str(x)


def _check_same_tasks(records: Sequence[RunRecord]) -> str:
    """``"yes"`` when every run of a seed saw the same prompts at every step (runs that record no
    digests, e.g. an external trainer, are left out of the check and named)."""
    by_seed: dict[int, dict[str, list[str]]] = {}
    unchecked = sorted({r.label for r in records if not r.tasks})
    for r in records:
        if r.tasks:
            by_seed.setdefault(r.seed, {})[r.label] = r.tasks
    for seed, runs in by_seed.items():
        if len({tuple(t) for t in runs.values()}) > 1:
            return f"NO (seed {seed} differs between {', '.join(runs)})"
    return "yes" + (f" (not recorded for {', '.join(unchecked)})" if unchecked else "")


def _curve(records: Sequence[RunRecord], key: str) -> np.ndarray:
    """seeds × steps array of a history key (NaN where missing)."""
    steps = max(len(r.history) for r in records)
    arr = np.full((len(records), steps), np.nan)
    for i, r in enumerate(records):
        for j, row in enumerate(r.history):
            arr[i, j] = _g(row, key)
    return arr


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (ddof 1; 0 for a single seed), ignoring NaN."""
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0


def summarize_runs(records: Sequence[RunRecord], variants: Sequence[Variant], per_step: int,
                   threshold: float, metrics: Sequence[str] = DIFFERENCE_METRICS) -> dict[str, dict[str, Any]]:
    """Per variant: the table's numbers (see the module docstring for the definitions); ``metrics``: those
    whose pairwise differences are tabled (:data:`~agentgym.algorithms.compare.arms.METRICS`)."""
    groups = {v.label: [r for r in records if r.label == v.label] for v in variants}
    groups = {k: g for k, g in groups.items() if g}
    r0 = float(np.nanmean([_g(r.history[0], "rollout/reward_mean") for r in records if r.history]))
    mean_curves = {k: np.nanmean(_curve(g, "rollout/reward_mean"), axis=0) for k, g in groups.items()}
    best = max(float(c[-1]) for c in mean_curves.values())
    target = r0 + threshold * (best - r0)
    out: dict[str, dict[str, Any]] = {}
    for label, runs in groups.items():
        rewards = _curve(runs, "rollout/reward_mean")
        success = _curve(runs, "rollout/success_rate")
        tokens = _curve(runs, "rollout/generated_tokens")
        step_s = _curve(runs, "time/step_s")
        reach = None
        if best > r0:
            hits = np.nonzero(mean_curves[label] >= target - 1e-12)[0]
            reach = int((hits[0] + 1) * per_step) if hits.size else None
        out[label] = {
            "seeds": [r.seed for r in runs],
            "final_reward": _mean_std(rewards[:, -1]),
            "final_success": _mean_std(success[:, -1]),
            "auc_reward": _mean_std(np.nanmean(rewards, axis=1)),
            "episodes_to_threshold": reach,
            "eval_success_before": _mean_std([_g(r.before, "eval/success_rate") for r in runs]),
            "eval_success_after": _mean_std([_g(r.after, "eval/success_rate") for r in runs]),
            "eval_reward_after": _mean_std([_g(r.after, "eval/reward_mean") for r in runs]),
            "train_s": _mean_std(np.nansum(step_s, axis=1)),
            "run_wall_s": _mean_std([r.wall_s for r in runs]),
            "tokens": _mean_std(np.nansum(tokens, axis=1)),
            # 95 % t intervals over seeds (agentgym.stats.mean_ci), and the per-seed values they rest on
            **_seed_intervals({"final_reward": rewards[:, -1], "final_success": success[:, -1],
                               "auc_reward": np.nanmean(rewards, axis=1),
                               "eval_success_after": [_g(r.after, "eval/success_rate") for r in runs]}),
            "per_seed": {"final_reward": rewards[:, -1].tolist(), "auc_reward": np.nanmean(rewards, axis=1).tolist(),
                         "final_success": success[:, -1].tolist(),
                         "eval_success_after": [_g(r.after, "eval/success_rate") for r in runs],
                         "eval_reward_after": [_g(r.after, "eval/reward_mean") for r in runs]},
            # per seed, each held-out task's success after training (the paired analysis pairs seeds and tasks)
            "eval_successes_after": {str(r.seed): list(r.after.get("successes", [])) for r in runs},
        }
    out["_reference"] = {"r0": r0, "best_final": best, "target": target}
    out["_differences"] = _pairwise_differences(out, metrics)
    out["_paired"] = _paired_differences(out)
    out["_health"] = health_summary(records, list(groups))
    return out


def _finite_count(values: Sequence[float]) -> int:
    return int(np.isfinite(np.asarray(values, dtype=float)).sum())


def _seed_intervals(per_metric: Mapping[str, Sequence[float]]) -> dict[str, dict[str, Any]]:
    """``ci``: metric -> (mean, low, high) over seeds, NaN bounds where no interval exists (one seed, or
    every seed gave the same value); ``ci_undefined``: metric -> why not (``"1 seed"``, ``"seeds agree:
    no spread"``), only for those. A zero-width interval is kept out of the record because a reader
    of ``compare.json`` would take it for an exact value."""
    cis: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    for metric, values in per_metric.items():
        cis[metric], reason = without_undefined(mean_ci(values), _finite_count(values))
        if reason:
            reasons[metric] = reason
    return {"ci": cis, "ci_undefined": reasons}


def _pairwise_differences(summary: Mapping[str, Any], metrics: Sequence[str] = DIFFERENCE_METRICS) -> list[dict[str, Any]]:
    """Every pair of variants, per metric: Welch's 95 % interval of the difference of seed means and
    whether it excludes 0 (:func:`agentgym.stats.verdict`). Where it does not exist (a variant with one
    seed; both variants' seeds agreeing among themselves) ``low``/``high`` are NaN, ``undefined`` says
    why and the verdict is ``n/a``: such a difference is never called significant."""
    labels = [k for k in summary if not k.startswith("_")]
    rows = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            for metric in metrics:
                xa, xb = summary[a]["per_seed"][metric], summary[b]["per_seed"][metric]
                raw = diff_ci(xa, xb)
                ci, reason = without_undefined(raw, min(_finite_count(xa), _finite_count(xb)))
                rows.append({"a": a, "b": b, "metric": metric, "diff": ci[0], "low": ci[1], "high": ci[2],
                             "verdict": verdict(raw), "undefined": reason,
                             "min_detectable": min_detectable_difference(xa, xb)})
    return rows


def _paired_differences(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Held-out success after training, every pair of variants (the arms share seeds and eval tasks: a seed
    fixes the training tasks, the initial model and the eval tasks):

    - ``headline``: the interval over seeds *and* questions
      (:func:`~agentgym.stats.hierarchical_bootstrap_diff`, seeds paired): what a new set of seeds on new
      questions from the same split would give; its ``verdict`` (significant / noise / n/a) is the pair's;
    - *over seeds*: Student's t interval of the per-seed differences, on the seeds both variants ran
      (:func:`~agentgym.stats.paired_diff_ci`), with its smallest detectable difference;
    - *over tasks*: percentile bootstrap over the eval tasks of each task's success averaged over those
      seeds (:func:`~agentgym.stats.paired_bootstrap_ci`), the seeds held fixed: *conditional on these
      runs*, it speaks of the trained models at hand, not of the learners, and judges nothing."""
    labels = [k for k in summary if not k.startswith("_")]
    rows = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            sa, sb = summary[a]["eval_successes_after"], summary[b]["eval_successes_after"]
            seeds = [k for k in sa if k in sb and sa[k] and len(sa[k]) == len(sb[k])]
            if not seeds:
                continue
            xa, xb, ta, tb = _paired_means([sa[k] for k in seeds], [sb[k] for k in seeds])
            raw_seeds = paired_diff_ci(xa, xb)
            seeds_ci, seeds_why = without_undefined(raw_seeds, len(seeds))
            raw_tasks = paired_bootstrap_ci(ta, tb)
            n_tasks = paired_count(ta, tb)   # the tasks both variants scored
            tasks_ci, tasks_why = without_undefined(raw_tasks, n_tasks, unit="task")
            raw_head = hierarchical_bootstrap_diff([sa[k] for k in seeds], [sb[k] for k in seeds], paired=True)
            head_ci, head_why = without_undefined(raw_head, min(len(seeds), n_tasks),
                                                  unit="seed" if len(seeds) < 2 else "task")
            rows.append({"a": a, "b": b, "metric": "eval_success_after", "diff": raw_seeds[0],
                         "headline": list(head_ci), "headline_undefined": head_why, "verdict": verdict(raw_head),
                         "seeds": [int(k) for k in seeds], "tasks": n_tasks,
                         "over_seeds": list(seeds_ci), "over_seeds_undefined": seeds_why,
                         "over_seeds_min_detectable": paired_min_detectable(xa, xb),
                         "over_tasks": list(tasks_ci), "over_tasks_undefined": tasks_why})
    return rows


def _paired_means(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]
                  ) -> tuple[list[float], list[float], np.ndarray, np.ndarray]:
    """Per-seed and per-task means of two variants' task successes (rows: seeds, columns: tasks), each on
    the (seed, task) cells both variants scored: a task whose episodes service failures all ended is NaN
    (:func:`~agentgym.algorithms.loop.held_out.task_successes`) and is left out of both sides of that seed, so
    the two are still compared on the same tasks. A seed or task with no such cell is NaN, which the
    intervals drop."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    both = np.isfinite(xa) & np.isfinite(xb)
    xa, xb = np.where(both, xa, np.nan), np.where(both, xb, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # the mean of no cells: NaN, said above
        return (np.nanmean(xa, axis=1).tolist(), np.nanmean(xb, axis=1).tolist(),
                np.nanmean(xa, axis=0), np.nanmean(xb, axis=0))


def _plural(n: int, unit: str) -> str:
    """``"1 seed"``, ``"3 seeds"``."""
    return f"{n} {unit}{'' if n == 1 else 's'}"


def _count(n: int, unit: str, undefined: str | None) -> str:
    """`` (n units)`` after an interval, unless the reason it is undefined already says so ("1 seed")."""
    said = _plural(n, unit)
    return "" if undefined and undefined.startswith(said) else f" ({said})"


def _paired_lines(paired: Sequence[Mapping[str, Any]]) -> list[str]:
    """The paired table of :func:`_paired_differences`."""
    if not paired:
        return []
    lines = ["**Held-out success after training, paired** (the arms share seeds and eval tasks). *over seeds and "
             "questions* (the headline, and the verdict): hierarchical bootstrap, seeds paired, so both training "
             "and question variance are in it; *over seeds*: t interval of the per-seed differences; *over "
             "questions, conditional on these runs*: bootstrap over tasks of the seed-averaged success with the "
             "trained runs held fixed, which says how sure we are about these models, not about the learners:", "",
             "| a − b | difference | over seeds and questions, 95 % CI | over seeds, 95 % CI | smallest detectable "
             "over seeds (80 % power) | over questions, conditional on these runs | verdict |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for d in paired:
        mdd = d["over_seeds_min_detectable"]
        lines.append(f"| `{d['a']}` − `{d['b']}` | {d['diff']:+.3f} | "
                     f"{_fmt_ci(tuple(d['headline']), d['headline_undefined'])} | "
                     f"{_fmt_ci((d['diff'], *d['over_seeds'][1:]), d['over_seeds_undefined'])}{_count(len(d['seeds']), 'seed', d['over_seeds_undefined'])} | "
                     f"{'n/a' if math.isnan(mdd) else f'{mdd:.3f}'} | "
                     f"{_fmt_ci(tuple(d['over_tasks']), d['over_tasks_undefined'])}{_count(d['tasks'], 'task', d['over_tasks_undefined'])} | {d['verdict']} |")
    return lines + [""]


def write_csv(records: Sequence[RunRecord], per_step: int, path: Path) -> None:
    """The long-format CSV (columns :data:`CSV_COLUMNS`).

    ``reward`` / ``success``: the step's sampled batch means (train) or the held-out eval's (greedy, or
    the mean of ``eval.samples`` per task) (eval); ``tokens``: generated tokens; ``wall_s``: cumulative seconds of the training loop so far;
    ``run_wall_s`` (last eval row): the whole run including model copy and evals; ``tasks``: the
    digest of the step's prompts (equal across algos at each (seed, step)); ``signal_share``, ``episodes_generated_total``:
    the group filter's counters, which count groups dynamic sampling dropped (NaN in runs that predate them)."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in records:
            base = {"algo": r.label, "learner": r.algo, "seed": r.seed}
            w.writerow({**base, "phase": "eval", "step": 0, "episodes": 0, "wall_s": 0.0,
                        "reward": _g(r.before, "eval/reward_mean"),
                        "success": _g(r.before, "eval/success_rate"), "tokens": _g(r.before, "eval/generated_tokens")})
            wall = cum_tokens = 0.0
            for j, row in enumerate(r.history):
                wall += _g(row, "time/step_s") if not math.isnan(_g(row, "time/step_s")) else 0.0
                tok = _g(row, "rollout/generated_tokens")
                cum_tokens += 0.0 if math.isnan(tok) else tok
                w.writerow({**base, "phase": "train", "step": int(_g(row, "step")), "episodes": (j + 1) * per_step,
                            "reward": _g(row, "rollout/reward_mean"), "reward_std": _g(row, "rollout/reward_std"),
                            "success": _g(row, "rollout/success_rate"), "tokens": tok, "tokens_cumulative": cum_tokens,
                            "step_s": _g(row, "time/step_s"), "wall_s": round(wall, 3), "kl": _g(row, "train/kl"),
                            "entropy": _g(row, "train/entropy"), "loss": _g(row, "train/loss"),
                            "tasks": r.tasks[j] if j < len(r.tasks) else "", "signal_share": _g(row, "rollout/signal_share"),
                            "episodes_generated_total": _g(row, "rollout/episodes_generated_total")})
            w.writerow({**base, "phase": "eval", "step": len(r.history), "episodes": len(r.history) * per_step,
                        "reward": _g(r.after, "eval/reward_mean"), "success": _g(r.after, "eval/success_rate"),
                        "tokens": _g(r.after, "eval/generated_tokens"), "wall_s": round(wall, 3),
                        "run_wall_s": round(r.wall_s, 3)})


def plot_comparison(records: Sequence[RunRecord], variants: Sequence[Variant], per_step: int, path: Path,
                    title: str, scored: str = "greedy") -> None:
    """Mean ± std over seeds of training reward and success against episodes, and the held-out eval
    (``scored``: how a held-out task is scored, :meth:`EvalConfig.describe`)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for k, v in enumerate(variants):
        runs = [r for r in records if r.label == v.label]
        if not runs:
            continue
        colour = f"C{k % 10}"
        for ax, key in zip(axes[:2], ("rollout/reward_mean", "rollout/success_rate")):
            arr = _curve(runs, key)
            x = np.arange(1, arr.shape[1] + 1) * per_step
            m = np.nanmean(arr, axis=0)
            band = np.array([mean_ci(arr[:, j])[1:] for j in range(arr.shape[1])]) if len(runs) > 1 else None
            ax.plot(x, m, marker=".", color=colour, label=f"{v.label} (n={len(runs)})")
            if band is not None:
                ax.fill_between(x, band[:, 0], band[:, 1], color=colour, alpha=0.2)
        before = _mean_std([_g(r.before, "eval/success_rate") for r in runs])
        after = _mean_std([_g(r.after, "eval/success_rate") for r in runs])
        steps = max(len(r.history) for r in runs)
        axes[2].errorbar([0, steps * per_step], [before[0], after[0]], yerr=[before[1], after[1]], marker="o",
                         capsize=4, color=colour, label=v.label)
    for ax, name in zip(axes, ("training reward (sampled)", "training success (sampled)",
                               f"held-out success ({scored}) before / after")):
        ax.set_title(name)
        ax.set_xlabel("training episodes")
        if "success" in name:
            ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{title} · mean over seeds, bands: 95 % t interval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(ms: tuple[float, float], digits: int = 3, signed: bool = False) -> str:
    m, s = ms
    if math.isnan(m):
        return "—"
    return f"{m:+.{digits}f} ± {s:.{digits}f}" if signed else f"{m:.{digits}f} ± {s:.{digits}f}"


def _legend_lines(base: TrainConfig, n_seeds: int, ref: Mapping[str, float], threshold: float) -> list[str]:
    """The definitions under the summary table."""
    pct = round(threshold * 100)
    split = base.eval.env_kwargs.get("split") or "held-out"
    return ["",
            f"mean ± sample std over {n_seeds} seed(s). *final*: the last step's sampled batch. *AUC*: mean training "
            f"reward over all steps. *episodes to {pct} %*: first training episode count at which the seed-mean reward "
            f"reaches r0 + {threshold:g}·(r* − r0), r0 = {ref['r0']:+.3f} (mean first-step reward, all runs), "
            f"r* = {ref['best_final']:+.3f} (best final seed-mean), target {ref['target']:+.3f}; — = never, or no "
            f"algo improved on r0. *held-out*: {base.eval.describe()} per task, on the same "
            f"{base.eval.episodes} `{split}` tasks before and after. *train s*: the training loop (rollouts + updates); "
            "*run wall*: also model copy and both evals. *95 % CI*: Student's t interval over seeds (with few "
            "seeds it is wide; a bootstrap over 3 seeds would be falsely narrow). *n/a (1 seed)*: one seed has "
            "no spread to estimate; *n/a (seeds agree: no spread)*: every seed gave the same value, so the "
            "interval would have zero width, which means the seeds agreed, not that the value is exact. "
            "Neither is an interval, and a difference without one is never called significant.", ""]


def markdown_table(summary: Mapping[str, Any], base: TrainConfig, seeds: Sequence[int], steps: int, per_step: int,
                   threshold: float, same_tasks: str, declared: Mapping[str, Any] | None = None,
                   provenance: Mapping[str, Any] | None = None, commits: Mapping[str, Sequence[str]] | None = None) -> str:
    """The comparison table plus the definitions a reader needs to interpret it. It leads with the declared
    primary metric (``declared``, :func:`~agentgym.algorithms.compare.arms.declare_metrics`; default held-out
    success) and ends with the provenance block when ``provenance`` is given."""
    ref = summary["_reference"]
    pct = round(threshold * 100)
    split = base.eval.env_kwargs.get("split") or "the env's default"
    lines = [*primary_lines(summary, declared, base.eval.describe(), split), f"Env `{base.env}` (env_kwargs `{json.dumps(base.env_kwargs)}`), model `{base.model}`, seeds {list(seeds)}, "
             f"{steps} steps × {per_step} episodes ({base.groups_per_step} groups × {base.group_size}), "
             f"max_new_tokens {base.sampling.max_new_tokens}; same tasks across algos: {same_tasks}.",
             "",
             f"| algo | final train reward | final train success | AUC (mean train reward) | episodes to {pct} % "
             f"| held-out (`{split}`) success before → after | held-out reward after | train s / run | run wall s "
             "| gen. tokens / run |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, s in summary.items():
        if label.startswith("_"):
            continue
        reach = "—" if s["episodes_to_threshold"] is None else str(s["episodes_to_threshold"])
        if "ci" in s:
            ci = {k: _fmt_ci(s["ci"][k], s.get("ci_undefined", {}).get(k)) for k in s["ci"]}
            lines.append(f"| `{label}` (95 % CI) | {ci['final_reward']} | {ci['final_success']} | "
                         f"{ci['auc_reward']} | | → {ci['eval_success_after']} | | | | |")
        lines.append(f"| `{label}` | {_fmt(s['final_reward'], signed=True)} | {_fmt(s['final_success'], 2)} | "
                     f"{_fmt(s['auc_reward'], signed=True)} | {reach} | {_fmt(s['eval_success_before'], 2)} → "
                     f"{_fmt(s['eval_success_after'], 2)} | {_fmt(s['eval_reward_after'], signed=True)} | "
                     f"{_fmt(s['train_s'], 0)} | {_fmt(s['run_wall_s'], 0)} | {_fmt(s['tokens'], 0)} |")
    lines += _legend_lines(base, len(seeds), ref, threshold)
    lines += health_lines(summary.get("_health", {}))
    diffs = summary.get("_differences", [])
    if diffs:
        lines += ["**Which differences are significant** (difference of seed means, Welch 95 % interval; "
                  "*significant* = the interval excludes 0, *noise* = it does not, *n/a* = there is no interval: "
                  "a variant has one seed, or each variant's seeds agree exactly, see above):", "",
                  "| a − b | metric | difference | 95 % CI | verdict | smallest detectable (80 % power) |",
                  "|---|---|---:|---:|---|---:|"]
        for d in diffs:
            ci = _fmt_ci((d["diff"], d["low"], d["high"]), d.get("undefined"))
            mdd = d.get("min_detectable", math.nan)
            lines.append(f"| `{d['a']}` − `{d['b']}` | {d['metric']} ({metric_role(d['metric'], declared)}) | "
                         f"{d['diff']:+.3f} | {ci} | {d['verdict']} | "
                         f"{'n/a' if math.isnan(mdd) else f'{mdd:.3f}'} |")
        sig = sum(d["verdict"] == "significant" for d in diffs)
        undefined = sum(d["verdict"] == "n/a" for d in diffs)
        rest = len(diffs) - sig - undefined
        lines += ["", f"{sig} of {len(diffs)} differences are significant at 95 %"
                  + (f"; {undefined} have no interval (n/a) and are not judged" if undefined else "")
                  + ("; the rest cannot be told apart from seed noise with this budget." if rest
                     else "." if undefined else "; all separate from seed noise."), ""]
        lines += _power_lines(diffs, len(seeds)) + _paired_lines(summary.get("_paired", []))
        lines += _control_lines(diffs, summary.get("_paired", []))
    if provenance is not None:
        lines += provenance_lines(provenance, commits or {})
    return "\n".join(lines)


def is_negative_control(label: str) -> bool:
    """A negative control: a variant trained with lr 0 (``grpo:lr=0``), or a learner registered as one
    (``grpo-shuffled``: advantages from another group's episodes). It samples and updates like the
    others but cannot learn from its own actions, so whatever it gains is the noise floor every learner
    must clear."""
    from agentgym.algorithms.compare.controls import is_negative_control_learner
    algo, *settings = label.split(":")
    for setting in settings:
        key, _, value = setting.partition("=")
        if key.strip() in ("lr", "optim.lr"):
            try:
                if float(value) == 0.0:
                    return True
            except ValueError:
                pass
    return is_negative_control_learner(algo.strip())


def _control_lines(diffs: Sequence[Mapping[str, Any]], paired: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """Every learner against the negative control(s): separated (CI excluding 0) or not; for held-out
    success, also the paired verdict (:func:`_paired_differences`)."""
    rows = [d for d in diffs if is_negative_control(d["a"]) != is_negative_control(d["b"])]
    if not rows:
        return []
    by_pair = {(p["a"], p["b"]): p for p in paired}
    out = ["**Against the negative control** (samples and updates, cannot learn from its own actions):", ""]
    for d in rows:
        learner, control = (d["b"], d["a"]) if is_negative_control(d["a"]) else (d["a"], d["b"])
        sign = -1.0 if is_negative_control(d["a"]) else 1.0
        line = (f"- `{learner}` vs `{control}`, {d['metric']}: {sign * d['diff'] + 0.0:+.3f} — "
                + {"significant": "separated from the control", "noise": "not separated (noise)",
                   "n/a": "no interval"}[d["verdict"]] + " (Welch)")
        p = by_pair.get((d["a"], d["b"])) if d["metric"] == "eval_success_after" else None
        if p is not None:
            line += f"; paired over seeds and tasks: {p['verdict']} (the headline interval)"
        out.append(line)
    return out + [""]


def _power_lines(diffs: Sequence[Mapping[str, Any]], n_seeds: int) -> list[str]:
    """What this budget can resolve: per metric, the median smallest detectable difference over the pairs."""
    out = []
    for metric in dict.fromkeys(d["metric"] for d in diffs):
        mdds = [d["min_detectable"] for d in diffs if d["metric"] == metric and not math.isnan(d.get("min_detectable", math.nan))]
        if mdds:
            out.append(f"- *{metric}*: with {n_seeds} seeds, a true difference smaller than "
                       f"**{float(np.median(mdds)):.3f}** (median over the pairs) is more likely than not to read "
                       "as noise: the smallest detectable difference at 95 % and 80 % power, from the spread over "
                       "seeds (each seed's value averages its questions, so question variance is in it too). "
                       "Halving it takes about 4× the seeds.")
    return (["**Resolution of this budget:**", "", *out, ""] if out else [])


def _fmt_ci(ci: tuple[float, float, float], reason: str | None = None) -> str:
    """``[low, high]``, or ``n/a (<reason>)`` for a recorded undefined interval (its bounds are NaN)."""
    if reason is not None:
        return f"n/a ({reason})"
    return format_ci(ci)


def write_artifacts(out: Path, records: Sequence[RunRecord], variants: Sequence[Variant], summary: Mapping[str, Any],
                    base: TrainConfig, seeds: Sequence[int], steps: int, threshold: float,
                    same_tasks: str, declared: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """``compare.{csv,png,md,json}`` in ``out``; returns their paths by extension. Both the markdown and the
    JSON lead with the declared primary metric and carry a provenance block (this process's code, packages
    and machine; every run's commit)."""
    import torch

    from agentgym.provenance import collect_provenance
    per_step = base.groups_per_step * base.group_size
    provenance = {**collect_provenance(base.precision, torch.get_num_threads()), "runs": run_commits(records)}
    paths = {ext: out / f"compare.{ext}" for ext in ("csv", "png", "md", "json")}
    write_csv(records, per_step, paths["csv"])
    plot_comparison(records, variants, per_step, paths["png"], title=f"{base.env} · {base.model} · {_plural(len(seeds), 'seed')}",
                    scored=base.eval.describe())
    paths["md"].write_text(markdown_table(summary, base, seeds, steps, per_step, threshold, same_tasks, declared,
                                          provenance, provenance["runs"]))
    paths["json"].write_text(json.dumps({
        "primary": {**(declared or {"primary": "eval_success_after"}), "eval_split": base.eval.env_kwargs.get("split"),
                    "differences": [d for d in summary.get("_paired", []) + summary.get("_differences", [])
                                    if d["metric"] == (declared or {}).get("primary", "eval_success_after")]},
        "provenance": provenance, "date": datetime.date.today().isoformat(), "env": base.env, "model": base.model, "seeds": list(seeds),
        "steps": steps, "episodes_per_step": per_step, "threshold": threshold, "same_tasks": same_tasks,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "variants": [dataclasses.asdict(v) for v in variants], "summary": summary,
        "runs": [dataclasses.asdict(r) for r in records]}, indent=1, default=_json_default))
    return paths
