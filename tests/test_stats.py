"""Confidence intervals (agentgym.stats) against hand computations, and how the harness reports them."""

from __future__ import annotations

import math

import pytest

from agentgym.stats import (bootstrap_ci, diff_ci, mean_ci, min_detectable_difference, paired_bootstrap_ci,
                                paired_count, paired_diff_ci, paired_min_detectable, t_quantile, verdict)


def test_t_interval_by_hand():
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    # mean 2, sd 1, n 3: half-width t(0.975, 2) * 1 / sqrt(3) = 4.3027 / 1.7321 = 2.4841
    assert m == 2.0 and hi - m == pytest.approx(2.48414, abs=1e-4) and m - lo == pytest.approx(2.48414, abs=1e-4)
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-5)
    assert math.isnan(mean_ci([5.0])[1]) and math.isnan(mean_ci([])[0])


def test_welch_difference_by_hand():
    d, lo, hi = diff_ci([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    # se = sqrt(1/3 + 1/3) = 0.8165, df = 4, t(0.975, 4) = 2.7764 -> half 2.2670
    assert d == -3.0 and hi == pytest.approx(-3 + 2.26696, abs=1e-4) and lo == pytest.approx(-3 - 2.26696, abs=1e-4)
    assert verdict((d, lo, hi)) == "significant"
    assert verdict(diff_ci([0.1, 0.5, 0.3], [0.2, 0.4, 0.35])) == "noise"
    assert diff_ci([1.0, 1.0], [1.0, 1.0]) == (0.0, 0.0, 0.0)


def test_min_detectable_difference_by_hand_and_by_simulation():
    # se = 0.8165, df = 4: (t(0.975, 4) + t(0.8, 4)) * se = (2.7764 + 0.9410) * 0.8165 = 3.0353
    assert min_detectable_difference([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(3.0353, abs=2e-3)
    assert math.isnan(min_detectable_difference([1.0], [2.0, 3.0]))
    assert math.isnan(min_detectable_difference([1.0, 1.0], [2.0, 2.0]))     # no spread: not estimable
    # a true difference equal to the (known-variance) resolution is detected about 80 % of the time
    import numpy as np
    rng = np.random.default_rng(0)
    n, sd = 8, 1.0
    ref = min_detectable_difference(rng.normal(0, sd, 4000), rng.normal(0, sd, 4000)) * math.sqrt(4000 / n)
    hits = sum(verdict(diff_ci(rng.normal(ref, sd, n), rng.normal(0, sd, n))) == "significant" for _ in range(2000))
    assert 0.72 <= hits / 2000 <= 0.86, hits / 2000


def test_bootstraps_are_seeded_and_cover_the_mean():
    vals = [0, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    a, b = bootstrap_ci(vals, seed=3), bootstrap_ci(vals, seed=3)
    assert a == b and a[1] < a[0] < a[2] and 0 <= a[1] and a[2] <= 1
    d, lo, hi = paired_bootstrap_ci([1, 1, 1, 1, 0, 1], [0, 0, 1, 0, 0, 1])
    assert d == pytest.approx(0.5) and lo > 0 and verdict((d, lo, hi)) == "significant"
    with pytest.raises(ValueError, match="same items"):
        paired_bootstrap_ci([1, 0], [1])


def test_a_pair_with_an_unscored_side_is_left_out_and_not_counted():
    after, before = [1.0, math.nan, 0.0, 1.0], [0.0, 1.0, math.nan, 1.0]   # NaN: a task no episode scored
    assert paired_count(after, before) == 2
    assert paired_bootstrap_ci(after, before)[0] == pytest.approx(0.5)   # the mean of (1 - 0) and (1 - 1)
    assert paired_count([], []) == 0


def test_compare_table_says_which_differences_are_significant():
    from agentgym.algorithms.compare.arms import RunRecord, parse_variants
    from agentgym.algorithms.compare.report import markdown_table, summarize_runs
    from agentgym.algorithms.loop.train_config import TrainConfig

    def run(label, seed, rewards):
        hist = [{"step": float(i + 1), "rollout/reward_mean": r, "rollout/success_rate": r, "time/step_s": 1.0,
                 "rollout/generated_tokens": 10.0} for i, r in enumerate(rewards)]
        return RunRecord(label, label.split(":")[0], seed, "", {}, hist, {"eval/success_rate": 0.0},
                         {"eval/success_rate": rewards[-1]})
    records = [run("grpo", s, [0.1, 0.5 + 0.01 * s]) for s in range(3)] + \
              [run("ppo", s, [0.1, 0.1 + 0.01 * s]) for s in range(3)] + \
              [run("reinforce", s, [0.1, [0.05, 0.6, 0.3][s]]) for s in range(3)]
    summary = summarize_runs(records, parse_variants("grpo,ppo,reinforce"), 4, 0.8)
    by = {(d["a"], d["b"], d["metric"]): d["verdict"] for d in summary["_differences"]}
    assert by[("grpo", "ppo", "final_reward")] == "significant"
    assert by[("ppo", "reinforce", "final_reward")] == "noise"
    md = markdown_table(summary, TrainConfig(), [0, 1, 2], 2, 4, 0.8, "yes")
    assert "Which differences are significant" in md and "| significant |" in md and "| noise |" in md
    assert "smallest detectable (80 % power)" in md and "Resolution of this budget" in md
    assert all(d["min_detectable"] > 0 for d in summary["_differences"] if d["metric"] == "final_reward")
    assert "negative control" not in md
    control = [run("grpo:lr=0", s, [0.1, 0.1 + 0.02 * s]) for s in range(3)]
    summary = summarize_runs(records[:3] + control, parse_variants("grpo,grpo:lr=0"), 4, 0.8)
    md = markdown_table(summary, TrainConfig(), [0, 1, 2], 2, 4, 0.8, "yes")
    assert "**Against the negative control**" in md
    assert "- `grpo` vs `grpo:lr=0`, final_reward: +0.390 — separated from the control" in md


def test_zero_width_and_one_value_intervals_are_undefined_not_exact():
    """All seeds agreeing gives a zero-width t interval; it says the seeds agreed, not that the value is
    exact, so it is reported as n/a and never called significant (it used to be, as [+0.250, +0.250])."""
    from agentgym.stats import format_ci, undefined_reason, without_undefined
    agree = mean_ci([0.25, 0.25, 0.25])
    assert agree[0] == 0.25 and agree[1] == agree[2]                       # the numbers are still returned
    assert undefined_reason(agree, 3) == "seeds agree: no spread" and format_ci(agree, 3) == "n/a (seeds agree: no spread)"
    assert undefined_reason(mean_ci([0.1, 0.1, 0.1])) == "seeds agree: no spread"    # float rounding is no spread
    assert format_ci(mean_ci([5.0]), n=1) == "n/a (1 seed)" and format_ci(mean_ci([5.0])) == "n/a (fewer than 2 seeds)"
    assert format_ci(mean_ci([1.0, 2.0, 3.0])) == "[-0.484, +4.484]" and undefined_reason(mean_ci([1.0, 2.0])) is None
    # a difference between two groups whose seeds each agree: was "significant" (0.25 excludes 0)
    d = diff_ci([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])
    assert d == (0.25, 0.25, 0.25) and verdict(d) == "n/a"
    assert verdict((0.25, math.nan, math.nan)) == "n/a" and verdict((0.0, 0.0, 0.0)) == "n/a"
    ci, reason = without_undefined(d, 3)
    assert ci[0] == 0.25 and math.isnan(ci[1]) and math.isnan(ci[2]) and reason == "seeds agree: no spread"
    assert without_undefined((1.0, 0.5, 1.5)) == ((1.0, 0.5, 1.5), None)
    # one group with spread and one without is a real Welch interval
    assert verdict(diff_ci([0.5, 0.5, 0.5], [0.1, 0.2, 0.3])) == "significant"
    # tasks: every task changed by the same amount (here +1 on all 4) -> the paired bootstrap has no spread
    paired = paired_bootstrap_ci([1, 1, 1, 1], [0, 0, 0, 0])
    assert paired == (1.0, 1.0, 1.0) and verdict(paired) == "n/a"
    assert format_ci(paired, 4, "task") == "n/a (tasks agree: no spread)"
    assert format_ci(bootstrap_ci([1.0]), 1, "question") == "n/a (1 question)"


def test_paired_over_seeds_by_hand_and_narrower_than_welch_when_seeds_differ():
    # differences 1, 2, 3: mean 2, sd 1, n 3 -> half-width t(0.975, 2) / sqrt(3) = 2.4841
    d, lo, hi = paired_diff_ci([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert d == 2.0 and lo == pytest.approx(2 - 2.48414, abs=1e-4) and hi == pytest.approx(2 + 2.48414, abs=1e-4)
    # (t(0.975, 2) + t(0.8, 2)) * 1 / sqrt(3) = (4.3027 + 1.0607) / 1.7321
    assert paired_min_detectable([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == pytest.approx(3.0966, abs=2e-3)
    # seeds of very different difficulty, one arm always 0.1 ahead of the other on the same seed:
    a, b = [0.30, 0.60, 0.91], [0.20, 0.50, 0.80]
    assert verdict(diff_ci(a, b)) == "noise" and verdict(paired_diff_ci(a, b)) == "significant"
    assert math.isnan(paired_min_detectable([1.0, 2.0], [0.0, 1.0]))       # equal differences: no spread
    assert math.isnan(paired_diff_ci([1.0], [0.0])[1])
    with pytest.raises(ValueError, match="same pairs"):
        paired_diff_ci([1.0, 2.0], [1.0])
