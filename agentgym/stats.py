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
           "paired_min_detectable", "pass_at_k",
           "hierarchical_bootstrap_diff"]


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


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` samples of which ``c`` are correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1): ``1 - C(n-c, k) / C(n, k)``, the chance
    that ``k`` of the ``n`` samples, drawn without replacement, hold at least one correct one.

    The ratio of binomial coefficients is computed as the product ``prod_{i<k} (n-c-i) / (n-i)``, whose
    factors all lie in [0, 1]: no huge intermediate numbers, so it stays exact enough for any ``n``.
    Averaged over tasks it estimates pass@k with less variance than drawing k samples once.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"pass_at_k: {name} must be an int, got {v!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k holds a correct sample
        return 1.0
    all_wrong = 1.0
    for i in range(k):
        all_wrong *= (n - c - i) / (n - i)
    return 1.0 - all_wrong


def _score_matrix(scores: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """seeds × questions; a third axis (k samples per question) is averaged: the samples are nested in their
    question, so resampling questions already carries their noise (resampling them again would count it
    twice); one row of questions is a run scored once."""
    m = np.asarray(scores, dtype=float)
    if m.ndim == 3:
        m = m.mean(axis=2)
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2:
        raise ValueError(f"scores must be seeds × questions (× samples), got shape {m.shape}")
    return m


def _cell_mean_square(m: np.ndarray) -> float:
    """The residual mean square of a seeds × questions table (two-way ANOVA without replication): an
    unbiased estimate of one cell's noise around its seed and question effects; 0 for one row."""
    s, q = m.shape
    if s < 2 or q < 2:
        return 0.0
    r = m - m.mean(axis=1, keepdims=True) - m.mean(axis=0, keepdims=True) + m.mean()
    return float((r ** 2).sum() / ((s - 1) * (q - 1)))


def hierarchical_bootstrap_diff(a: Sequence[Sequence[float]] | np.ndarray, b: Sequence[Sequence[float]] | np.ndarray,
                                *, paired: bool | None = None, level: float = 0.95, n_boot: int = 4000,
                                seed: int = 0) -> tuple[float, float, float]:
    """(mean(a) − mean(b), low, high): the interval of a difference that holds over new seeds *and* new
    questions, the headline of a comparison.

    ``a``, ``b``: per-(seed, question) scores, seeds × questions (× k samples, averaged per question), on
    the same questions (columns; a question unscored, NaN, in any row of either arm is left out). Seeds
    are paired by row when ``paired`` (default: both arms have the same number of rows); otherwise each
    arm's seeds are resampled on their own. ``b`` with one row is a baseline scored once (an SFT or RAG
    model, no seeds): its question noise enters through the questions, its training noise is unknown and
    not in the interval (the difference is to *that* model).

    Seeds and questions are crossed (every seed answers every question), so one bootstrap draw resamples
    the seeds and, shared by them, the questions. A plain crossed resample counts each cell's noise three
    times (in the seed means, the question means and the cells; McCullagh 2000), so the question part is
    shrunk and the seed part inflated by the two-way ANOVA moment estimates: the draws' variance is then
    unbiased for σ²_seed/S + σ²_question/Q + σ²_cell/(S·Q). The interval is the estimate ± Student's t
    (Satterthwaite degrees of freedom of the seed and question parts) × the draws' standard deviation,
    not their percentiles: with 3-5 seeds a percentile interval is falsely narrow (84 % and 90 % coverage
    of a nominal 95 % in tests/test_hierarchical_ci.py's simulation). NaN bounds when ``a`` has fewer
    than two seeds (no training variance to estimate) or fewer than two questions remain.
    """
    x, y = _score_matrix(a), _score_matrix(b)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"both arms must score the same questions: {x.shape[1]} vs {y.shape[1]}")
    keep = np.isfinite(x).all(axis=0) & np.isfinite(y).all(axis=0)
    x, y = x[:, keep], y[:, keep]
    paired = x.shape[0] == y.shape[0] if paired is None else paired
    if paired and x.shape[0] != y.shape[0]:
        raise ValueError(f"paired seeds need as many rows in both arms: {x.shape[0]} vs {y.shape[0]}")
    q = x.shape[1]
    diff = float(x.mean() - y.mean()) if q else math.nan
    if q < 2 or x.shape[0] < 2:
        return diff, math.nan, math.nan
    if paired:
        seed_parts, cols, cell = [(x - y).mean(axis=1)], (x - y).mean(axis=0), _cell_mean_square(x - y) / x.shape[0]
    else:
        seed_parts = [sign * m.mean(axis=1) for m, sign in ((x, 1.0), (y, -1.0)) if m.shape[0] > 1]
        cols = x.mean(axis=0) - y.mean(axis=0)
        cell = sum(_cell_mean_square(m) / m.shape[0] for m in (x, y) if m.shape[0] > 1)
    rng = np.random.default_rng(seed)
    draws = np.full(n_boot, diff)
    parts: list[tuple[float, int]] = []     # (variance of the part, its degrees of freedom)
    for r in seed_parts:
        s = r.size
        draws += (r[rng.integers(0, s, (n_boot, s))].mean(axis=1) - r.mean()) * math.sqrt(s / (s - 1))
        parts.append((float(r.var(ddof=1)) / s, s - 1))
    spread = float(cols.var(ddof=1))
    question_var = max(0.0, spread - cell)   # the question part without the cell noise the seed part holds
    shrink = math.sqrt(question_var / (spread * (q - 1) / q)) if spread > 0 else 0.0
    draws += (cols[rng.integers(0, q, (n_boot, q))].mean(axis=1) - cols.mean()) * shrink
    parts.append((question_var / q, q - 1))
    total = sum(v for v, _ in parts)
    if total <= 0:
        return diff, diff, diff              # every seed and question agreed: no interval (undefined_reason)
    df = total ** 2 / sum(v ** 2 / k for v, k in parts if v > 0)
    half = t_quantile(0.5 + level / 2, df) * float(draws.std(ddof=1))
    return diff, diff - half, diff + half
