"""Confidence intervals for learning results: what separates from noise and what does not.

Two situations, two tools (pure functions, numpy only):

* **Across seeds** (a handful of runs per algorithm): :func:`mean_ci` is Student's t interval of the
  mean. A percentile bootstrap over 3 seeds has only 10 distinct resamples and its interval is far too
  narrow, so for seeds we assume roughly normal run-to-run variation and say so. :func:`diff_ci` is
  Welch's interval for the difference of two independent means (unequal variances).
* **Across tasks or episodes** (tens of held-out questions): :func:`bootstrap_ci` resamples the
  items (percentile bootstrap, seeded), and :func:`paired_bootstrap_ci` resamples items of a paired
  design — the same held-out tasks before and after training — for the mean difference.

A difference is called significant when its 95 % interval excludes 0; everything else is reported as
"not separable from noise" with the interval, never as a win.

**Undefined intervals.** With one seed (or one item) there is no spread to estimate, and when every
value agrees (all seeds reach the same reward; every task changes the same way) the interval has zero
width: ``[+0.250, +0.250]`` says the samples agreed, not that the value is known exactly. The
functions still return the numbers they compute (NaN bounds for one value, equal bounds for no
spread); :func:`undefined_reason` names either case, :func:`format_ci` prints it as
``n/a (1 seed)`` / ``n/a (seeds agree: no spread)``, and :func:`verdict` never calls such an interval
significant (``"n/a"``).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["mean_ci", "diff_ci", "bootstrap_ci", "paired_bootstrap_ci", "t_quantile", "verdict",
           "undefined_reason", "format_ci", "without_undefined", "min_detectable_difference", "paired_diff_ci",
           "paired_min_detectable"]


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t (scipy when present; else a Cornish-Fisher expansion, accurate to ~1e-3
    for df >= 2)."""
    try:
        from scipy import stats
        return float(stats.t.ppf(p, df))
    except ImportError:  # pragma: no cover - scipy ships with the test environment
        from statistics import NormalDist
        z = NormalDist().inv_cdf(p)
        g1 = (z ** 3 + z) / 4
        g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
        g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
        return z + g1 / df + g2 / df ** 2 + g3 / df ** 3


def _clean(values: Sequence[float]) -> np.ndarray:
    a = np.asarray([v for v in values if v is not None], dtype=float)
    return a[np.isfinite(a)]


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval over independent runs (seeds). One value: (v, nan, nan);
    equal values: equal bounds (no interval, see :func:`undefined_reason`)."""
    a = _clean(values)
    if a.size == 0:
        return math.nan, math.nan, math.nan
    m = float(a.mean())
    if a.size < 2:
        return m, math.nan, math.nan
    half = t_quantile(0.5 + level / 2, a.size - 1) * float(a.std(ddof=1)) / math.sqrt(a.size)
    return m, m - half, m + half


def diff_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) − mean(b), low, high): Welch's interval for independent groups of runs. Fewer than two
    runs in a group: NaN bounds; no spread in both groups: (d, d, d) (no interval either)."""
    x, y = _clean(a), _clean(b)
    if x.size < 2 or y.size < 2:
        d = float(x.mean() - y.mean()) if x.size and y.size else math.nan
        return d, math.nan, math.nan
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    d = float(x.mean() - y.mean())
    se = math.sqrt(vx + vy)
    if se == 0:
        return d, d, d
    df = (vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1))
    half = t_quantile(0.5 + level / 2, df) * se
    return d, d - half, d + half


def min_detectable_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95,
                              power: float = 0.8) -> float:
    """The smallest true difference of means that a Welch test at ``level`` would detect with probability
    ``power``, given the spread the two groups of runs show: (t_{1−α/2} + t_{power}) × SE, with Welch's SE
    and degrees of freedom. A budget's resolution — a difference below it is expected to read as noise.
    NaN with fewer than two runs in a group, or when neither group has any spread (nothing to estimate it
    from: seeds that agree say nothing about how much they could differ)."""
    x, y = _clean(a), _clean(b)
    if x.size < 2 or y.size < 2:
        return math.nan
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(vx + vy)
    if se == 0:
        return math.nan
    df = (vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1))
    return _detectable(se, df, level, power)


def _detectable(se: float, df: float, level: float, power: float) -> float:
    """(t_{1−α/2} + t_{power}) × SE with ``df`` degrees of freedom: the smallest detectable difference."""
    return (t_quantile(0.5 + level / 2, df) + t_quantile(power, df)) * se


def paired_diff_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a − b), low, high): Student's t interval of the per-pair differences, for runs paired by seed
    (the same seed: the same training tasks, initial model and eval tasks). Where seeds share difficulty,
    it is narrower than Welch's :func:`diff_ci` on the same runs. NaN pairs are dropped."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired samples need the same pairs: {x.shape} vs {y.shape}")
    return mean_ci(list(x - y), level)


def paired_min_detectable(a: Sequence[float], b: Sequence[float], level: float = 0.95, power: float = 0.8) -> float:
    """:func:`min_detectable_difference` for the paired t test of :func:`paired_diff_ci`:
    (t_{1−α/2} + t_{power}) × sd(differences)/√n, n − 1 degrees of freedom. NaN under two pairs or no spread."""
    d = _clean(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))
    if d.size < 2 or float(d.std(ddof=1)) == 0.0:
        return math.nan
    return _detectable(float(d.std(ddof=1)) / math.sqrt(d.size), d.size - 1, level, power)


def bootstrap_ci(values: Sequence[float], level: float = 0.95, n_boot: int = 10_000,
                 seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): percentile bootstrap of the mean over items (tasks, episodes)."""
    a = _clean(values)
    if a.size == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return float(a.mean()), float(lo), float(hi)


def paired_bootstrap_ci(after: Sequence[float], before: Sequence[float], level: float = 0.95, n_boot: int = 10_000,
                        seed: int = 0) -> tuple[float, float, float]:
    """(mean(after − before), low, high) over paired items (the same tasks measured twice)."""
    x, y = np.asarray(after, dtype=float), np.asarray(before, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired samples need the same items: {x.shape} vs {y.shape}")
    return bootstrap_ci(list(x - y), level, n_boot, seed)


def paired_count(after: Sequence[float], before: Sequence[float]) -> int:
    """How many pairs :func:`paired_bootstrap_ci` rests on: those both sides scored (NaN, e.g. a task that
    service failures left unscored, drops its pair)."""
    x, y = np.asarray(after, dtype=float), np.asarray(before, dtype=float)
    return int(np.isfinite(x - y).sum())


def undefined_reason(ci: tuple[float, float, float], n: int | None = None, unit: str = "seed") -> str | None:
    """Why ``ci`` is no interval, or None when it is one (finite bounds, positive width).

    ``n``: how many values it rests on (for a difference, the smaller group), when known; ``unit``
    names them (``"seed"``, ``"task"``, ``"question"``). Zero width is judged relative to the bounds'
    size, so float rounding of identical values (``0.1 * 3 / 3``) still counts as no spread.
    """
    _, lo, hi = ci
    if n is not None and n < 2:
        return "no data" if n < 1 else f"1 {unit}"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"fewer than 2 {unit}s"
    if hi - lo <= 1e-12 * max(1.0, abs(lo), abs(hi)):
        return f"{unit}s agree: no spread"
    return None


def format_ci(ci: tuple[float, float, float], n: int | None = None, unit: str = "seed", digits: int = 3,
              signed: bool = True) -> str:
    """``[low, high]``, or ``n/a (<reason>)`` where :func:`undefined_reason` finds no interval."""
    reason = undefined_reason(ci, n, unit)
    if reason is not None:
        return f"n/a ({reason})"
    sign = "+" if signed else ""
    return f"[{ci[1]:{sign}.{digits}f}, {ci[2]:{sign}.{digits}f}]"


def without_undefined(ci: tuple[float, float, float], n: int | None = None,
                      unit: str = "seed") -> tuple[tuple[float, float, float], str | None]:
    """``(ci with NaN bounds where it is undefined, the reason or None)``: for records (JSON) whose
    readers should find no bounds rather than a zero-width interval that looks exact."""
    reason = undefined_reason(ci, n, unit)
    return ((ci[0], math.nan, math.nan) if reason else tuple(ci)), reason  # type: ignore[return-value]


def verdict(ci: tuple[float, float, float]) -> str:
    """"significant" when the interval excludes 0, else "noise"; "n/a" without an interval (NaN bounds)
    or with a zero-width one (no spread: that is not evidence, see the module docstring)."""
    _, lo, hi = ci
    if undefined_reason(ci) is not None:
        return "n/a"
    return "significant" if lo > 0 or hi < 0 else "noise"
