"""The training-health part of a comparison's report: why an arm learned or did not.

A difference that reads as noise, or an arm that does not beat the negative control, has one of three
causes, and the report must say which with figures: **no signal** (most groups sampled equal rewards,
so group-relative advantages were zero), **collapse** (entropy or response length fell, or an action
kind such as searching died out) or **budget** (there was signal and no collapse, but too few steps or
seeds). Per arm, averaged over its seeds, from the logged diagnostics of :mod:`agentgym.algorithms.loop.health`
and each run's ``alarms.json``:

* *groups without signal*: mean of ``health/zero_var_groups`` over the steps;
* *entropy* and *response tokens*: the first and the last step (``train/entropy``, ``health/response_tokens``);
* *grad norm*: mean of ``train/grad_norm``;
* *infra-error episodes*: ``rollout/infra_errors`` summed (left out of the loss and the baselines);
* *generated groups with signal*: mean of ``rollout/signal_share`` over the steps, and *episodes generated*:
  the last step's ``rollout/episodes_generated_total`` (:mod:`agentgym.algorithms.loop.group_filter`). Side by
  side they give the price of signal: ``group_filter.dynamic`` trains only on groups with signal, and pays
  for it in episodes generated and dropped, which the nominal ``episodes`` of the summary table leave out.
  Runs that predate these columns show ``n/a``; ``per_seed`` holds each seed's value (NaN where missing);
* *alarms*: how many runs raised each rule (``no_signal``, ``entropy_drop``, ``length_drop``, ...).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["health_lines", "health_summary"]


def _series(run: Any, key: str) -> list[float]:
    out = []
    for row in run.history:
        v = row.get(key)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out.append(float(v))
    return out


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _alarm_rules(run: Any) -> set[str]:
    """The rules a run's ``alarms.json`` recorded (none when the run wrote no file)."""
    path = Path(run.output_dir) / "alarms.json" if run.output_dir else None
    if path is None or not path.is_file():
        return set()
    try:
        return {str(a.get("rule")) for a in json.loads(path.read_text()) if isinstance(a, dict)}
    except (OSError, ValueError):
        return set()


def _per_seed(runs: Sequence[Any], key: str, how: str) -> list[float]:
    """Each run's reduction (``mean``, ``first``, ``last``, ``sum``) of ``key`` over its steps; NaN for a run
    that never logged it (an older run, another trainer), so the list stays aligned with the seeds."""
    vals = []
    for r in runs:
        s = _series(r, key)
        vals.append({"mean": _mean(s), "first": s[0], "last": s[-1], "sum": float(sum(s))}[how] if s else math.nan)
    return vals


def _mean_logged(values: Sequence[float]) -> float:
    """The mean over the runs that logged the key; NaN when none did."""
    return _mean([v for v in values if not math.isnan(v)])


def health_summary(records: Sequence[Any], labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per label (variant), the diagnostics above averaged over its runs (seeds)."""
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        runs = [r for r in records if r.label == label]
        if not runs:
            continue

        def per_run(key: str, how: str) -> float:
            return _mean_logged(_per_seed(runs, key, how))

        signal = _per_seed(runs, "rollout/signal_share", "mean")
        generated = _per_seed(runs, "rollout/episodes_generated_total", "last")
        alarms = Counter(rule for r in runs for rule in _alarm_rules(r))
        out[label] = {
            "runs": len(runs),
            "zero_var_groups": per_run("health/zero_var_groups", "mean"),
            "entropy_first": per_run("train/entropy", "first"), "entropy_last": per_run("train/entropy", "last"),
            "response_tokens_first": per_run("health/response_tokens", "first"),
            "response_tokens_last": per_run("health/response_tokens", "last"),
            "grad_norm": per_run("train/grad_norm", "mean"),
            "infra_errors": per_run("rollout/infra_errors", "sum"),
            "signal_share": _mean_logged(signal), "episodes_generated": _mean_logged(generated),
            "alarms": dict(sorted(alarms.items())),
            "per_seed": {"seeds": [r.seed for r in runs], "signal_share": signal, "episodes_generated": generated},
        }
    return out


def _f(x: float, digits: int = 2, missing: str = "—") -> str:
    return missing if math.isnan(x) else f"{x:.{digits}f}"


def health_lines(health: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The "Training health" table of ``compare.md``."""
    if not health:
        return []
    lines = ["**Training health** (mean over each arm's seeds; what tells *no signal*, *collapse* and *budget* apart, "
             "see `agentgym.algorithms.compare.health`):", "",
             "| algo | groups without signal | generated groups with signal (mean over steps) "
             "| episodes generated (whole run) | entropy first → last | response tokens first → last | grad norm "
             "| infra-error episodes | alarms (runs raising each) |", "|---|---:|---:|---:|---|---|---:|---:|---|"]
    for label, h in health.items():
        alarms = ", ".join(f"{rule} {n}/{h['runs']}" for rule, n in h["alarms"].items()) or "none"
        signal = f"{_f(h['signal_share'], missing='n/a')} | {_f(h['episodes_generated'], 0, missing='n/a')}"
        lines.append(f"| `{label}` | {_f(h['zero_var_groups'])} | {signal} | "
                     f"{_f(h['entropy_first'])} → {_f(h['entropy_last'])} | "
                     f"{_f(h['response_tokens_first'], 1)} → {_f(h['response_tokens_last'], 1)} | {_f(h['grad_norm'])} | "
                     f"{_f(h['infra_errors'], 1)} | {alarms} |")
    return lines + ["", "*groups without signal* is measured on the batch trained on; *generated groups with signal* "
                    "and *episodes generated* on everything generated, dropped groups included "
                    "(`group_filter.dynamic`); n/a: the runs did not log it.", ""]
