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
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["mean_ci", "diff_ci", "bootstrap_ci", "paired_bootstrap_ci", "t_quantile", "verdict"]


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
    """(mean, low, high): Student's t interval over independent runs (seeds). One value: (v, nan, nan)."""
    a = _clean(values)
    if a.size == 0:
        return math.nan, math.nan, math.nan
    m = float(a.mean())
    if a.size < 2:
        return m, math.nan, math.nan
    half = t_quantile(0.5 + level / 2, a.size - 1) * float(a.std(ddof=1)) / math.sqrt(a.size)
    return m, m - half, m + half


def diff_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) − mean(b), low, high): Welch's interval for independent groups of runs."""
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


def verdict(ci: tuple[float, float, float]) -> str:
    """"significant" when the interval excludes 0, else "noise" (or "n/a" without an interval)."""
    _, lo, hi = ci
    if math.isnan(lo) or math.isnan(hi):
        return "n/a"
    return "significant" if lo > 0 or hi < 0 else "noise"
