"""Search-R1 in a box v2, the sampled re-scores read together: per arm, per seed and over its seeds.

``rescore_sampled.sh`` writes one ``agentgym eval --json`` file per model (``sft.json``,
``ppo_masked_seed0.json``, ...): each question's success as the mean of 4 sampled episodes, on the same
90 questions and the same draws. This script reads every such file in a folder and prints, as markdown:

* per model: its success, its difference from the baseline model (``sft``) paired over the questions
  (95 % bootstrap), the success per question type (single_hop / multi_hop / no_search) and pass@k;
* per arm (``NAME_seedK`` files grouped by ``NAME``): the arm minus the baseline, over the questions (each
  question's mean over the arm's seeds, bootstrap) and over seeds (Student's t over the per-seed differences);
* for each ``--pair A B`` (for example ``grpo_masked grpo_unmasked``): A − B, over the questions (each
  question's mean over each arm's seeds, bootstrap) and over seeds (the seeds both arms have, paired by seed
  number, t; Welch's interval over all their seeds where they share fewer than two).

  python benchmarks/search_r1/rescore_summary.py --dir runs/search_r1_v2/rescore \\
      --records runs/search_r1_v2/progress.json --pair ppo_masked grpo_masked --json summary.json \\
      --png summary.png

``--records`` (the study's ``progress.json``, or the committed ``heldout_records.json``) names each question's
type; without it the per-type column is left out. Trains and evaluates nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from agentgym.stats import (diff_ci, format_ci, mean_ci, paired_bootstrap_ci, paired_count, paired_diff_ci,
                                undefined_reason)

HERE = Path(__file__).resolve().parent
SEEDED = re.compile(r"^(?P<arm>.+)_seed(?P<seed>\d+)$")
TYPES = ("single_hop", "multi_hop", "no_search")


def load_scores(folder: Path) -> dict[str, dict[str, Any]]:
    """Every ``agentgym eval --json`` file in ``folder``, by file stem: per-question success and pass@k."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        try:
            d = json.loads(path.read_text())
            per_task = {int(t["task_index"]): float(t["success"]) for t in d["per_task"]}
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"{path}: not an `agentgym eval --json` file with per-task results ({e})") from None
        summary = d.get("task_summary", {})
        out[path.stem] = {"per_task": per_task, "pass": {k: v for k, v in summary.items() if k.startswith("pass@")}}
    return out


def load_types(records_path: Path | None) -> dict[int, str]:
    """Question index -> type, from the study's records (``progress.json`` or ``heldout_records.json``)."""
    if records_path is None:
        return {}
    records = json.loads(records_path.read_text())["records"]
    for phase in records.values():
        rows = phase[0] if phase and isinstance(phase[0], list) else phase
        if rows:
            return {int(r["task_index"]): r["type"] for r in rows}
    return {}


def arms_of(names: Sequence[str]) -> dict[str, dict[int, str]]:
    """``NAME_seedK`` stems grouped by ``NAME``: {arm: {seed: stem}}; a stem without a seed is its own arm."""
    arms: dict[str, dict[int, str]] = {}
    for name in names:
        m = SEEDED.match(name)
        arm, seed = (m["arm"], int(m["seed"])) if m else (name, 0)
        arms.setdefault(arm, {})[seed] = name
    return arms


def _on(tasks: Sequence[int], scores: Mapping[int, float]) -> list[float]:
    return [scores.get(k, math.nan) for k in tasks]


def _seed_mean(stems: Sequence[str], scores: Mapping[str, Mapping[str, Any]], tasks: Sequence[int]) -> list[float]:
    """Each question's success averaged over ``stems`` (the arm's seeds); NaN where no seed scored it."""
    rows = np.asarray([_on(tasks, scores[s]["per_task"]) for s in stems], dtype=float)
    with np.errstate(all="ignore"):
        counts = np.isfinite(rows).sum(axis=0)
        means = np.where(counts > 0, np.nansum(rows, axis=0) / np.maximum(counts, 1), np.nan)
    return means.tolist()


def _mean(values: Sequence[float]) -> float:
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan


def _by_type(tasks: Sequence[int], values: Sequence[float], types: Mapping[int, str]) -> dict[str, float]:
    """The mean of ``values`` (one per task) within each question type; empty without types."""
    return {t: _mean([v for k, v in zip(tasks, values) if types.get(k) == t]) for t in TYPES} if types else {}


def _interval(ci: tuple[float, float, float], n: int, unit: str) -> dict[str, Any]:
    why = undefined_reason(ci, n, unit)
    return {"diff": ci[0], "low": None if why else ci[1], "high": None if why else ci[2], "n": n, "undefined": why}


def summarize(scores: Mapping[str, Mapping[str, Any]], types: Mapping[int, str], baseline: str = "sft",
              pairs: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Everything the markdown says, as a dict (``--json``)."""
    if baseline not in scores:
        raise SystemExit(f"no {baseline}.json among the re-scores ({', '.join(sorted(scores)) or 'none'}): "
                         "every arm is read against it")
    tasks = sorted(scores[baseline]["per_task"])
    base = _on(tasks, scores[baseline]["per_task"])
    models = {}
    for name, s in sorted(scores.items(), key=lambda kv: (kv[0] != baseline, kv[0])):   # the baseline first
        mine = _on(tasks, s["per_task"])
        row = {"success": _mean(mine), "by_type": _by_type(tasks, mine, types), "pass": s["pass"]}
        if name != baseline:
            row["minus_baseline"] = _interval(paired_bootstrap_ci(mine, base), paired_count(mine, base), "question")
        models[name] = row
    arms, per_question = {}, {}   # per_question: each arm's success per question, averaged over its seeds
    grouped = arms_of([n for n in scores if n != baseline])
    for arm, seeds in sorted(grouped.items()):
        stems = [seeds[k] for k in sorted(seeds)]
        avg = per_question[arm] = _seed_mean(stems, scores, tasks)
        per_seed = [models[s]["minus_baseline"]["diff"] for s in stems]
        arms[arm] = {"seeds": sorted(seeds), "success": _mean(avg),
                     "over_questions": _interval(paired_bootstrap_ci(avg, base), paired_count(avg, base), "question"),
                     "over_seeds": _interval(mean_ci(per_seed), len(per_seed), "seed"),
                     "by_type": _by_type(tasks, avg, types)}
    compared = []
    for a, b in pairs:
        missing = [x for x in (a, b) if x not in grouped]
        if missing:
            raise SystemExit(f"--pair {a} {b}: no re-scores of {', '.join(missing)} (arms: {', '.join(sorted(grouped))})")
        sa, sb = grouped[a], grouped[b]
        xa, xb = per_question[a], per_question[b]
        shared = sorted(set(sa) & set(sb))
        paired = len(shared) >= 2   # same seed number: same SFT start and training seed, so pair by seed
        da = [models[sa[k]]["success"] for k in (shared if paired else sorted(sa))]
        db = [models[sb[k]]["success"] for k in (shared if paired else sorted(sb))]
        seeds_ci, how = ((paired_diff_ci(da, db), f"paired over {len(shared)} shared seeds") if paired
                         else (diff_ci(da, db), "Welch, all seeds"))
        compared.append({"a": a, "b": b, "over_questions": _interval(paired_bootstrap_ci(xa, xb), paired_count(xa, xb), "question"),
                         "over_seeds": {**_interval(seeds_ci, min(len(da), len(db)), "seed"), "how": how}})
    return {"baseline": baseline, "questions": len(tasks), "models": models, "arms": arms, "pairs": compared}


def _ci(iv: Mapping[str, Any]) -> str:
    if iv["undefined"]:
        return f"{iv['diff']:+.3f}, n/a ({iv['undefined']})"
    return f"{iv['diff']:+.3f} {format_ci((iv['diff'], iv['low'], iv['high']))}"


def _types(by_type: Mapping[str, float]) -> str:
    return " / ".join(f"{by_type[t]:.3f}" for t in TYPES) if by_type else "n/a"


def markdown(summary: Mapping[str, Any]) -> str:
    base = summary["baseline"]
    lines = [f"Sampled re-scores on {summary['questions']} questions; differences are against `{base}` "
             f"({summary['models'][base]['success']:.3f}), 95 % intervals.", "",
             f"| model | success | − {base}, over questions | {' / '.join(TYPES)} | pass@k |", "|---|---:|---|---|---|"]
    for name, m in summary["models"].items():
        diff = "—" if name == base else _ci(m["minus_baseline"])
        passes = ", ".join(f"{k} {v:.3f}" for k, v in m["pass"].items()) or "n/a"
        lines.append(f"| `{name}` | {m['success']:.3f} | {diff} | {_types(m['by_type'])} | {passes} |")
    if summary["arms"]:
        lines += ["", f"| arm | seeds | success | − {base}, over questions (seed-mean per question) | − {base}, over seeds (t) | "
                      f"{' / '.join(TYPES)} |", "|---|---|---:|---|---|---|"]
        for arm, a in summary["arms"].items():
            lines.append(f"| `{arm}` | {a['seeds']} | {a['success']:.3f} | {_ci(a['over_questions'])} | "
                         f"{_ci(a['over_seeds'])} | {_types(a['by_type'])} |")
    if summary["pairs"]:
        lines += ["", "| A − B | over questions (seed-mean per question) | over seeds |", "|---|---|---|"]
        for p in summary["pairs"]:
            lines.append(f"| `{p['a']}` − `{p['b']}` | {_ci(p['over_questions'])} | "
                         f"{_ci(p['over_seeds'])} ({p['over_seeds']['how']}) |")
    return "\n".join(lines) + "\n"


def plot(summary: Mapping[str, Any], path: Path) -> None:
    """The intervals as a forest plot: each arm minus the baseline (left) and each ``--pair`` (right), the
    95 % interval over the questions (thick) and over the seeds (thin, where it exists), 0 marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = summary["baseline"]
    panels = [(f"arm − {base} ({summary['models'][base]['success']:.3f})",
               [(f"{arm} ({a['success']:.3f}, seeds {','.join(map(str, a['seeds']))})", a["over_questions"],
                 a["over_seeds"]) for arm, a in summary["arms"].items()]),
              ("A − B", [(f"{q['a']} − {q['b']}", q["over_questions"], q["over_seeds"]) for q in summary["pairs"]])]
    panels = [(title, rows) for title, rows in panels if rows]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 0.6 + 0.55 * max(len(r) for _, r in panels)),
                             squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels):
        named: set[str] = set()   # each kind of interval in the legend once
        for i, (label, questions, seeds) in enumerate(reversed(rows)):
            for iv, y, width, colour, name in ((questions, i + 0.12, 4, "tab:blue", "over questions"),
                                               (seeds, i - 0.12, 1.5, "tab:orange", "over seeds")):
                if iv["low"] is not None:
                    ax.plot([iv["low"], iv["high"]], [y, y], color=colour, lw=width,
                            label=None if name in named else name)
                    named.add(name)
                ax.plot([iv["diff"]], [y], "o", color=colour, ms=4)
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), [label for label, _, _ in reversed(rows)], fontsize=8)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_title(f"{title}: sampled success, 95 % intervals", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"Sampled re-scores on {summary['questions']} questions", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="runs/search_r1_v2/rescore", help="the folder rescore_sampled.sh wrote (default %(default)s)")
    p.add_argument("--records", default=None,
                   help="the study's progress.json or heldout_records.json, for each question's type "
                        "(default: whichever of the two lies beside --dir)")
    p.add_argument("--baseline", default="sft", help="the model every arm is read against (default %(default)s)")
    p.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"),
                   help="also report arm A − arm B (repeatable)")
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    p.add_argument("--png", default=None, help="also draw the intervals (a forest plot) to this PNG")
    args = p.parse_args(argv)
    folder = Path(args.dir)
    if not folder.is_dir():
        p.error(f"--dir {folder}: no such folder (run rescore_sampled.sh first)")
    if args.records:
        records = Path(args.records)
        if not records.is_file():
            p.error(f"--records {records}: no such file")
    else:   # the study's runs folder, or the committed copy of its records; neither: no per-type column
        records = next((f for f in (folder.parent / "progress.json", folder.parent / "heldout_records.json")
                        if f.is_file()), None)
    scores = load_scores(folder)
    summary = summarize(scores, load_types(records), args.baseline, [tuple(x) for x in args.pair])
    sys.stdout.write(markdown(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if args.png and (summary["arms"] or summary["pairs"]):
        plot(summary, Path(args.png))
    elif args.png:
        print(f"--png: nothing to draw (no re-score beside {args.baseline}.json); no PNG written",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
