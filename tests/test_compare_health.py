"""``agentgym compare``'s signal per episode (issue 47): per arm, the share of generated GRPO groups with
reward variance and the episodes the run generated, beside each other in the "Training health" table and
per seed in compare.json / compare.csv, so ``group_filter.dynamic=true`` is compared with its cost in view.

The runs are fake: finished run directories (``compare_run.json``) with hand-written histories, reported
with ``--report-only`` as a study's interim report would be, so the numbers can be checked by hand and
nothing trains. A file of its own because tests/test_compare.py is already past the 500-line limit."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import pytest

from agentgym.algorithms.compare import harness as cmp
from agentgym.algorithms.compare import report as compare_report
from agentgym.algorithms.compare.arms import RunRecord, parse_variants
from agentgym.config import to_dict

OVERRIDES = ["model=tiny-random", "groups_per_step=2", "group_size=2", "eval.episodes=2", "tensorboard=false"]
DYNAMIC = "grpo:group_filter.dynamic=true"

#: (arm, seed) -> per step (rollout/signal_share, rollout/episodes_generated_total); None: an older run
#: that predates the columns. 2 groups × 2 episodes = 4 episodes a step without the filter.
LOGGED = {("grpo", 0): [(0.5, 4.0), (0.25, 8.0)], ("grpo", 1): [(0.75, 4.0), (0.5, 8.0)],
          (DYNAMIC, 0): [(0.4, 8.0), (0.6, 20.0)], (DYNAMIC, 1): [(0.2, 12.0), (0.4, 16.0)],
          ("reinforce", 0): None, ("reinforce", 1): None}


def _history(logged: list[tuple[float, float]] | None) -> list[dict[str, float]]:
    """Two steps of a train log; the group filter's columns only where the run logged them."""
    rows = [{"step": float(i + 1), "rollout/reward_mean": 0.1 * i, "rollout/success_rate": 0.0,
             "rollout/generated_tokens": 10.0, "time/step_s": 1.0} for i in range(2)]
    for row, (share, total) in zip(rows, logged or []):
        row.update({"rollout/signal_share": share, "rollout/episodes_generated_total": total})
    return rows


def _fake_study(out, arms: str) -> None:
    """A finished run directory per planned (arm, seed), as ``agentgym compare`` leaves it."""
    for variant, cfg in cmp._plan_runs(parse_variants(arms), [0, 1], 2, "Arithmetic-v0", None, OVERRIDES, out):
        rec = RunRecord(variant.label, variant.algo, cfg.seed, cfg.output_dir, to_dict(cfg),
                        history=_history(LOGGED[(variant.label, cfg.seed)]),
                        before={"eval/success_rate": 0.0}, after={"eval/success_rate": 0.5}, wall_s=3.0)
        (out / variant.dirname / f"seed{cfg.seed}").mkdir(parents=True)
        (out / variant.dirname / f"seed{cfg.seed}" / "compare_run.json").write_text(json.dumps(dataclasses.asdict(rec)))


def _report(tmp_path, monkeypatch) -> dict:
    monkeypatch.setattr(compare_report, "plot_comparison", lambda *a, **k: None)   # matplotlib: not what is tested
    out = tmp_path / "study"
    _fake_study(out, f"grpo,{DYNAMIC},reinforce")
    return cmp.compare(f"grpo,{DYNAMIC},reinforce", [0, 1], 2, env="Arithmetic-v0", overrides=OVERRIDES,
                       out_dir=out, report_only=True, log=lambda _: None)


def test_signal_share_and_episodes_generated_per_arm_by_hand(tmp_path, monkeypatch):
    """Per arm: the seed mean of each seed's mean signal share over the steps, and of each seed's last
    episodes_generated_total; per seed in compare.json; side by side in compare.md."""
    result = _report(tmp_path, monkeypatch)
    health = result["summary"]["_health"]
    assert health["grpo"]["signal_share"] == pytest.approx(((0.5 + 0.25) / 2 + (0.75 + 0.5) / 2) / 2)   # 0.5
    assert health["grpo"]["episodes_generated"] == 8.0
    assert health[DYNAMIC]["signal_share"] == pytest.approx((0.5 + 0.3) / 2)
    assert health[DYNAMIC]["episodes_generated"] == (20.0 + 16.0) / 2
    saved = json.loads((tmp_path / "study" / "compare.json").read_text())["summary"]["_health"][DYNAMIC]["per_seed"]
    assert saved["seeds"] == [0, 1] and saved["episodes_generated"] == [20.0, 16.0]
    assert saved["signal_share"] == pytest.approx([0.5, 0.3])
    md = (tmp_path / "study" / "compare.md").read_text()
    assert "| generated groups with signal (mean over steps) | episodes generated (whole run) |" in md
    assert "| `grpo` | — | 0.50 | 8 | " in md
    assert f"| `{DYNAMIC}` | — | 0.40 | 18 | " in md


def test_runs_without_the_columns_show_n_a_and_the_csv_has_them_per_step(tmp_path, monkeypatch):
    """Runs that predate the group filter's columns: n/a in the table, NaN per seed, empty-valued (nan)
    cells in the CSV; the other arms' train rows carry each step's values."""
    result = _report(tmp_path, monkeypatch)
    old = result["summary"]["_health"]["reinforce"]
    assert math.isnan(old["signal_share"]) and math.isnan(old["episodes_generated"])
    assert all(math.isnan(v) for v in old["per_seed"]["signal_share"] + old["per_seed"]["episodes_generated"])
    assert "| `reinforce` | — | n/a | n/a | " in (tmp_path / "study" / "compare.md").read_text()
    with (tmp_path / "study" / "compare.csv").open() as f:
        train = [r for r in csv.DictReader(f) if r["phase"] == "train"]
    dyn0 = [(float(r["signal_share"]), float(r["episodes_generated_total"]))
            for r in train if r["algo"] == DYNAMIC and r["seed"] == "0"]
    assert dyn0 == [(0.4, 8.0), (0.6, 20.0)]
    assert all(math.isnan(float(r["signal_share"])) for r in train if r["algo"] == "reinforce")


def test_an_arm_with_one_older_seed_averages_the_seeds_that_logged_it():
    """A study resumed across the change: the arm's mean is over the seeds that logged the columns, and
    the per-seed list keeps the older seed's place (NaN)."""
    from agentgym.algorithms.compare.health import health_summary
    runs = [RunRecord("grpo", "grpo", 0, "", {}, history=_history([(0.5, 4.0), (1.0, 8.0)])),
            RunRecord("grpo", "grpo", 1, "", {}, history=_history(None))]
    h = health_summary(runs, ["grpo"])["grpo"]
    assert h["signal_share"] == 0.75 and h["episodes_generated"] == 8.0
    assert h["per_seed"]["episodes_generated"][0] == 8.0 and math.isnan(h["per_seed"]["episodes_generated"][1])
