"""The algorithm comparison harness (``agentgym compare``): artifacts, same tasks, budget, errors."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from agentgym.algorithms.compare import harness as cmp
from agentgym.algorithms.compare import report as compare_report
from agentgym.algorithms.compare.arms import CompareError, RunRecord, Variant, parse_variants
from agentgym.algorithms.compare.report import summarize_runs
from agentgym.app.cli import main
from fixtures_llm import one_torch_thread  # noqa: F401  (autouse: a 64-wide model is faster on one thread)

TINY = ["model=tiny-random", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4", "eval.episodes=2",
        "optim.lr=1e-3", "learner.micro_batch_size=4", "tensorboard=false",
        "env_kwargs={hard_fraction: 0.0, max_turns: 1}"]


def test_two_algos_two_seeds_artifacts_rows_and_same_tasks(tmp_path, capsys):
    out = tmp_path / "cmp"
    # a learner and a variant of another (the masking ablation's syntax) in one run
    rc = main(["compare", "--env", "Arithmetic-v0", "--algos", "reinforce,grpo:mask_env_tokens=false",
               "--seeds", "2", "--steps", "2", "--out", str(out), *TINY])
    assert rc == 0
    printed = capsys.readouterr()
    assert [f"[compare {i}/4]" in printed.out for i in range(1, 5)] == [True] * 4  # one line per run
    assert "same tasks across algos: yes" in printed.out

    for name in ("compare.csv", "compare.png", "compare.md", "compare.json"):
        assert (out / name).stat().st_size > 0, name
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image
    with Image.open(out / "compare.png") as im:
        im.verify()
        assert im.size[0] > 500 and im.size[1] > 200

    with (out / "compare.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == compare_report.CSV_COLUMNS
    train = [r for r in rows if r["phase"] == "train"]
    evals = [r for r in rows if r["phase"] == "eval"]
    labels = ["reinforce", "grpo:mask_env_tokens=false"]
    assert sorted((r["algo"], r["seed"], r["step"]) for r in train) == sorted(
        (a, s, st) for a in labels for s in ("0", "1") for st in ("1", "2"))
    assert sorted((r["algo"], r["seed"], r["step"]) for r in evals) == sorted(
        (a, s, st) for a in labels for s in ("0", "1") for st in ("0", "2"))
    assert {r["episodes"] for r in train if r["step"] == "2"} == {"8"}  # same budget: 2 groups x 2 per step
    assert all(float(r["tokens"]) > 0 and r["tasks"] for r in train)

    # the same tasks at every (seed, step) for both algos, and different tasks for different seeds
    tasks: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in train:
        tasks[(r["seed"], r["step"])].add(r["tasks"])
    assert all(len(v) == 1 for v in tasks.values()), tasks
    assert tasks[("0", "1")] != tasks[("1", "1")]
    raw = json.loads((out / "compare.json").read_text())
    by_seed = defaultdict(list)
    for run in raw["runs"]:
        by_seed[run["seed"]].append(run["task_indices"])
        assert len(run["task_indices"]) == 2 and all(len(step) == 4 for step in run["task_indices"])
    assert all(a == b for a, b in by_seed.values())

    # the variant's override reached its runs only
    variant_cfg = (out / "grpo_mask_env_tokens-false" / "seed0" / "config.yaml").read_text()
    assert "mask_env_tokens: false" in variant_cfg and "algo: grpo" in variant_cfg
    assert "mask_env_tokens: true" in (out / "reinforce" / "seed1" / "config.yaml").read_text()
    assert not (out / "reinforce" / "seed0" / "checkpoints").exists()  # removed unless --keep-checkpoints

    table = (out / "compare.md").read_text()
    assert "| `reinforce` |" in table and "| `grpo:mask_env_tokens=false` |" in table and "episodes to 80 %" in table


@pytest.mark.parametrize("argv, message", [
    (["--algos", "reinforce,nope"], "unknown algo 'nope'"),
    (["--algos", "ppo,ppo"], "twice"),
    (["--algos", "grpo:group_size=8"], "must be the same for every algo"),
    (["--algos", "grpo:no_such_setting=1"], "neither a TrainConfig, an optim nor a GRPOConfig field"),
    (["--algos", "grpo:critic=model"], "neither a TrainConfig, an optim nor a GRPOConfig field"),
    (["--algos", "trl-grpo:clip_eps=0.1"], "takes only"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--seeds", "two"], "--seeds must be an integer"),
    (["--seeds", "3,3"], "--seeds must list distinct seeds"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--env", "Nope-v0"], "no env 'Nope-v0'"),
    (["--algos", "grpo", "group_size=1"], "needs group_size >= 2"),
    (["algo=ppo"], "set algo with --algos"),
    (["optim.lr=fast"], "optim.lr"),
    (["--primary", "speed"], "--primary 'speed' is not a comparison metric; choose from eval_success_after"),
    (["--exploratory", "auc_reward,luck"], "--exploratory 'luck' is not a comparison metric"),
    (["--exploratory", "eval_success_after"], "--exploratory eval_success_after is this comparison's primary metric"),
])
def test_bad_arguments_are_one_line_errors(argv, message, tmp_path, capsys):
    assert main(["compare", "--out", str(tmp_path / "x"), *argv, "model=tiny-random"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()  # nothing ran


def test_bad_arguments_in_a_real_process_exit_2_with_one_line():
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "compare", "--algos", "reinforce,sarsa"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "unknown algo 'sarsa'" in r.stderr


def test_missing_external_learner_module_is_named(monkeypatch, tmp_path):
    monkeypatch.setitem(cmp.EXTERNAL_ALGOS, "trl-grpo", "agentgym.algorithms.no_such_adapter:train_with_trl")
    with pytest.raises(CompareError, match=r"trl-grpo needs algorithms/no_such_adapter\.py"):
        cmp.compare("grpo,trl-grpo", 1, 1, overrides=["model=tiny-random"], out_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_parse_variants_maps_learner_keys_and_safe_dirnames():
    vs = parse_variants("grpo, grpo:mask_env_tokens=false:lr=2e-5,ppo:learner.epochs=2")
    assert vs == [Variant("grpo", "grpo"),
                  Variant("grpo:mask_env_tokens=false:lr=2e-5", "grpo",
                          ("learner.mask_env_tokens=false", "optim.lr=2e-5")),
                  Variant("ppo:learner.epochs=2", "ppo", ("learner.epochs=2",))]
    assert vs[1].dirname == "grpo_mask_env_tokens-false_lr-2e-5"


def _record(label: str, seed: int, rewards: list[float]) -> RunRecord:
    hist = [{"step": float(i + 1), "rollout/reward_mean": r, "rollout/success_rate": float(r > 0.5),
             "rollout/generated_tokens": 10.0, "time/step_s": 2.0} for i, r in enumerate(rewards)]
    return RunRecord(label, label, seed, "", {}, history=hist, before={"eval/success_rate": 0.0},
                     after={"eval/success_rate": 0.5}, wall_s=10.0)


def test_summary_definitions_by_hand():
    runs = [_record("fast", 0, [0.0, 0.6, 1.0]), _record("fast", 1, [0.0, 1.0, 1.0]),
            _record("slow", 0, [0.0, 0.2, 0.4]), _record("slow", 1, [0.0, 0.2, 0.2])]
    s = summarize_runs(runs, [Variant("fast", "fast"), Variant("slow", "slow")], per_step=4, threshold=0.8)
    # r0 = 0, r* = 1.0 (fast's final seed mean), target 0.8: fast's mean curve [0, 0.8, 1.0] hits it at step 2
    assert s["_reference"] == pytest.approx({"r0": 0.0, "best_final": 1.0, "target": 0.8})
    assert s["fast"]["episodes_to_threshold"] == 8 and s["slow"]["episodes_to_threshold"] is None
    assert s["fast"]["auc_reward"][0] == pytest.approx((1.6 / 3 + 2.0 / 3) / 2)
    assert s["slow"]["final_reward"] == pytest.approx((0.3, 0.1414213), rel=1e-5)  # mean, sample std
    assert s["fast"]["train_s"] == (6.0, 0.0) and s["fast"]["tokens"] == (30.0, 0.0)
    flat = summarize_runs([_record("a", 0, [0.5, 0.4])], [Variant("a", "a")], per_step=4, threshold=0.8)
    assert flat["a"]["episodes_to_threshold"] is None  # nothing improved on r0: no efficiency to report


@pytest.mark.slow
def test_trl_grpo_runs_with_the_same_budget(tmp_path):
    """TRL's GRPOTrainer as one more algo (opt-in: importing and starting TRL takes ~30 s here)."""
    pytest.importorskip("trl")
    out = tmp_path / "cmp"
    result = cmp.compare("grpo,trl-grpo", 1, 2, env="Arithmetic-v0", overrides=TINY, out_dir=out)
    with (out / "compare.csv").open() as f:
        train = [r for r in csv.DictReader(f) if r["phase"] == "train"]
    assert sorted((r["algo"], r["step"], r["episodes"]) for r in train) == [
        ("grpo", "1", "4"), ("grpo", "2", "8"), ("trl-grpo", "1", "4"), ("trl-grpo", "2", "8")]
    assert result["same_tasks"] == "yes (not recorded for trl-grpo)"
    assert result["summary"]["trl-grpo"]["eval_success_after"][0] >= 0.0


def test_undefined_intervals_are_reported_as_such_never_as_significant():
    """Seeds that all agree (zero variance) and a variant with one seed: the table prints n/a with the
    reason instead of a zero-width [+0.250, +0.250], no such difference is significant, the legend says
    why, and compare.json carries NaN bounds with the reason (its readers see no interval)."""
    from agentgym.algorithms.compare.report import markdown_table
    from agentgym.algorithms.loop.train_config import TrainConfig
    runs = [_record("flat_hi", s, [0.0, 0.75]) for s in range(3)] + \
           [_record("flat_lo", s, [0.0, 0.5]) for s in range(3)] + [_record("single", 0, [0.0, 0.6])]
    variants = [Variant(v, v) for v in ("flat_hi", "flat_lo", "single")]
    s = summarize_runs(runs, variants, per_step=4, threshold=0.8)
    assert s["flat_hi"]["ci_undefined"]["final_reward"] == "seeds agree: no spread"
    assert s["single"]["ci_undefined"]["final_reward"] == "1 seed"
    assert all(math.isnan(s["flat_hi"]["ci"]["final_reward"][i]) for i in (1, 2))
    rows = {(d["a"], d["b"], d["metric"]): d for d in s["_differences"]}
    flat = rows[("flat_hi", "flat_lo", "final_reward")]
    assert flat["diff"] == pytest.approx(0.25) and flat["verdict"] == "n/a" and flat["undefined"] == "seeds agree: no spread"
    assert math.isnan(flat["low"]) and math.isnan(flat["high"])
    assert rows[("flat_hi", "single", "final_reward")]["undefined"] == "1 seed"
    assert not any(d["verdict"] == "significant" for d in s["_differences"])
    back = json.loads(json.dumps(s, default=compare_report._json_default))       # what compare.json holds
    assert math.isnan(back["_differences"][0]["low"]) and back["_differences"][0]["undefined"]

    md = markdown_table(s, TrainConfig(), [0, 1, 2], 2, 4, 0.8, "yes")
    assert "[+0.250, +0.250]" not in md and "| +0.250 | n/a (seeds agree: no spread) | n/a |" in md
    assert "n/a (1 seed)" in md and "| significant |" not in md
    assert "*n/a (seeds agree: no spread)*: every seed gave the same value" in md      # the legend
    assert "0 of 9 differences are significant at 95 %; 9 have no interval (n/a) and are not judged." in md



def _eval_record(label: str, seed: int, successes: list[float]) -> RunRecord:
    rec = _record(label, seed, [0.0, 0.5])
    rec.after = {"eval/success_rate": float(np.mean(successes)), "successes": list(successes)}
    return rec


def test_held_out_success_is_also_compared_paired_over_seeds_and_tasks():
    """Arms that share seeds and eval tasks: per pair, the headline interval over seeds and questions (its verdict
    is the pair's), a t interval over the per-seed differences and a bootstrap over tasks conditional on the runs;
    the control lines give the headline verdict. (Before issue 47 the verdict was 'separated' when both the
    over-seeds and the over-tasks intervals excluded 0; the conditional one no longer votes.)"""
    from agentgym.algorithms.compare.report import markdown_table
    from agentgym.algorithms.loop.train_config import TrainConfig
    rng = np.random.default_rng(0)
    # 40 tasks; a seed's difficulty moves both arms alike; the learner solves 8 more tasks than the control
    runs = []
    for seed in range(4):
        easy = 6 + 7 * seed
        control = [1.0] * easy + [0.0] * (40 - easy)
        learner = [1.0] * (easy + 8 + (seed % 2)) + [0.0] * (40 - easy - 8 - (seed % 2))
        noisy = list(rng.permutation(control))          # same mean as the control, other tasks
        runs += [_eval_record("grpo", seed, learner), _eval_record("grpo-shuffled", seed, control),
                 _eval_record("noisy", seed, noisy)]
    variants = [Variant(v, v) for v in ("grpo", "grpo-shuffled", "noisy")]
    s = summarize_runs(runs, variants, per_step=4, threshold=0.8)
    paired = {(p["a"], p["b"]): p for p in s["_paired"]}
    p = paired[("grpo", "grpo-shuffled")]
    assert p["seeds"] == [0, 1, 2, 3] and p["tasks"] == 40
    assert p["diff"] == pytest.approx((8 + 9 + 8 + 9) / 4 / 40)
    assert p["over_seeds"][1] > 0 and p["over_tasks"][1] > 0 and p["headline"][1] > 0 and p["verdict"] == "significant"
    # Welch over the same per-seed values cannot separate them: the seeds' spread swamps the difference
    welch = next(d for d in s["_differences"] if (d["a"], d["b"], d["metric"]) == ("grpo", "grpo-shuffled", "eval_success_after"))
    assert welch["verdict"] == "noise"
    same = paired[("grpo-shuffled", "noisy")]
    assert same["diff"] == 0.0 and same["verdict"] in ("noise", "n/a")
    md = markdown_table(s, TrainConfig(), [0, 1, 2, 3], 2, 4, 0.8, "yes")
    assert "**Held-out success after training, paired**" in md
    diff = f"{p['diff']:+.3f}"
    assert f"| `grpo` − `grpo-shuffled` | {diff} |" in md and "(4 seeds)" in md and "(40 tasks) | significant |" in md
    assert (f"- `grpo` vs `grpo-shuffled`, eval_success_after: {welch['diff']:+.3f} — not separated (noise) (Welch); "
            "paired over seeds and tasks: significant (the headline interval)") in md
    back = json.loads(json.dumps(s, default=compare_report._json_default))       # what compare.json holds
    assert back["_paired"][0]["verdict"] == "significant"
    # the report's first line is the declared primary metric (by default held-out success on the test split)
    assert md.splitlines()[0].startswith("**Primary metric: held-out success after training** (`eval_success_after`, "
                                         "held-out split `test`, greedy per task)")
    head = f"{p['headline'][1]:+.3f}, {p['headline'][2]:+.3f}]"
    assert f"| `grpo` − `grpo-shuffled` | {diff} | [{head} | [" in md      # the headline leads the opening table
    assert "| eval_success_after (primary) |" in md and "| final_reward (secondary) |" in md


def test_paired_held_out_success_leaves_out_tasks_a_service_failure_left_unscored():
    """A task whose episodes service failures all ended is NaN in its run's successes (held_out.task_successes):
    the paired comparison leaves that (seed, task) out of both arms, so the rest are still compared on the
    same tasks, and the task count says how many were."""
    nan = math.nan
    a0, b0 = [1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, nan]      # seed 0: task 3 unscored in b
    a1, b1 = [1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]
    runs = [_eval_record("a", 0, a0), _eval_record("b", 0, b0), _eval_record("a", 1, a1), _eval_record("b", 1, b1)]
    s = summarize_runs(runs, [Variant("a", "a"), Variant("b", "b")], per_step=4, threshold=0.8)
    p = s["_paired"][0]
    # per seed, on the tasks both scored: seed 0 (tasks 0-2) 2/3 - 1/3, seed 1 (all four) 3/4 - 1/4
    assert p["diff"] == pytest.approx(((2 / 3 - 1 / 3) + (3 / 4 - 1 / 4)) / 2)
    assert p["tasks"] == 4 and p["seeds"] == [0, 1]
    assert all(math.isfinite(x) for x in p["over_tasks"])
    # a task no seed scored in both arms is left out of the bootstrap over tasks
    runs[3] = _eval_record("b", 1, [0.0, 0.0, 1.0, nan])
    p = summarize_runs(runs, [Variant("a", "a"), Variant("b", "b")], per_step=4, threshold=0.8)["_paired"][0]
    assert p["tasks"] == 3 and p["diff"] == pytest.approx(1 / 3)


def test_paired_table_with_one_seed_says_why_once():
    """One finished seed: the interval over seeds is n/a with its reason, said once, not "(1 seed) (1 seeds)";
    the interval over tasks still exists and counts its tasks."""
    from agentgym.algorithms.compare.report import _paired_lines
    runs = [_eval_record("a", 0, [1.0, 1.0, 0.0, 1.0]), _eval_record("b", 0, [0.0, 1.0, 0.0, 0.0])]
    s = summarize_runs(runs, [Variant("a", "a"), Variant("b", "b")], per_step=4, threshold=0.8)
    row = next(line for line in _paired_lines(s["_paired"]) if line.startswith("| `a` − `b`"))
    assert "| n/a (1 seed) | n/a |" in row and "seeds)" not in row and "(4 tasks) |" in row


def test_one_seed_artifacts_say_1_seed(tmp_path, monkeypatch):
    """compare.{csv,png,md,json} of a single finished seed: the figure's title says "1 seed", not "1 seeds"."""
    from agentgym.algorithms.compare import report as compare_report
    from agentgym.algorithms.loop.train_config import TrainConfig
    titles = []
    monkeypatch.setattr(compare_report, "plot_comparison", lambda *a, title, **k: titles.append(title))
    runs = [_eval_record("a", 0, [1.0, 1.0, 0.0, 1.0]), _eval_record("b", 0, [0.0, 1.0, 0.0, 0.0])]
    variants = [Variant("a", "a"), Variant("b", "b")]
    s = summarize_runs(runs, variants, per_step=4, threshold=0.8)
    paths = compare_report.write_artifacts(tmp_path, runs, variants, s, TrainConfig(), [0], 2, 0.8, "yes")
    assert titles and titles[0].endswith("· 1 seed") and paths["md"].exists() and paths["json"].exists()


def test_training_health_table_says_signal_collapse_and_alarms(tmp_path):
    """compare.md's health table: per arm, the seed mean of the share of groups without signal, entropy and
    response length first → last, grad norm, infra-error episodes, and how many runs raised each alarm
    (read from each run's alarms.json)."""
    from agentgym.algorithms.compare.report import markdown_table
    from agentgym.algorithms.loop.train_config import TrainConfig
    runs = []
    for seed, (zv, ent) in enumerate([([1.0, 0.5], [2.0, 1.0]), ([0.5, 0.0], [2.0, 0.5])]):
        rec = _record("grpo", seed, [0.0, 0.5])
        for row, z, e in zip(rec.history, zv, ent):
            row.update({"health/zero_var_groups": z, "train/entropy": e, "health/response_tokens": 40.0 - 10 * z,
                        "train/grad_norm": 1.0, "rollout/infra_errors": 1.0})
        rec.output_dir = str(tmp_path / f"grpo{seed}")
        Path(rec.output_dir).mkdir()
        rules = ["no_signal", "entropy_drop"] if seed == 0 else ["no_signal"]
        Path(rec.output_dir, "alarms.json").write_text(json.dumps([{"step": 2, "rule": r, "message": ""} for r in rules]))
        runs.append(rec)
    runs.append(_record("ppo", 0, [0.0, 0.5]))      # no health keys, no run directory: shown as —, no alarms
    s = summarize_runs(runs, [Variant("grpo", "grpo"), Variant("ppo", "ppo")], per_step=4, threshold=0.8)
    h = s["_health"]["grpo"]
    assert h["zero_var_groups"] == pytest.approx((0.75 + 0.25) / 2)
    assert (h["entropy_first"], h["entropy_last"]) == pytest.approx((2.0, 0.75))
    assert h["infra_errors"] == 2.0 and h["alarms"] == {"entropy_drop": 1, "no_signal": 2}
    assert math.isnan(s["_health"]["ppo"]["zero_var_groups"]) and s["_health"]["ppo"]["alarms"] == {}
    md = markdown_table(s, TrainConfig(), [0, 1], 2, 4, 0.8, "yes")
    assert ("| `grpo` | 0.50 | n/a | n/a | 2.00 → 0.75 | 32.5 → 37.5 | 1.00 | 2.0 | entropy_drop 1/2, no_signal 2/2 |"
            in md)   # no rollout/signal_share logged: n/a (tests/test_compare_health.py checks the numbers)
    assert "| `ppo` | — | n/a | n/a | — → — | — → — | — | — | none |" in md


def test_report_only_reports_the_finished_seeds_and_trains_nothing(tmp_path, capsys):
    """A study run seed by seed: --report-only writes the report from the seeds every algo finished, names
    the runs left out, and starts no run; with nothing finished it is a one-line error."""
    out = tmp_path / "cmp"
    args = ["compare", "--env", "Arithmetic-v0", "--algos", "reinforce,grpo", "--steps", "1", "--out", str(out), *TINY]
    assert main([*args[:-len(TINY)], "--seeds", "0,", *TINY]) == 0
    first = json.loads((out / "compare.json").read_text())
    (out / "compare.json").unlink()
    capsys.readouterr()
    assert main([*args[:-len(TINY)], "--seeds", "2", "--report-only", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "left out: reinforce seed 1, grpo seed 1; the report covers seeds [0]" in printed
    assert "[compare 1/" not in printed and not (out / "reinforce" / "seed1").exists()     # nothing trained
    report = json.loads((out / "compare.json").read_text())
    assert report["seeds"] == [0] and report["summary"]["grpo"]["per_seed"] == first["summary"]["grpo"]["per_seed"]
    empty = tmp_path / "empty"
    report_only = ["compare", "--env", "Arithmetic-v0", "--algos", "grpo", "--steps", "1", "--seeds", "1",
                   "--out", str(empty), "--report-only", *TINY]
    assert main(report_only) == 2      # no such folder
    err = capsys.readouterr().err
    assert f"--report-only: {empty} is not a folder" in err and "Traceback" not in err
    empty.mkdir()
    assert main(report_only) == 2
    err = capsys.readouterr().err
    assert f"--report-only: no seed has a finished run of every variant in {empty}; not finished: grpo seed 0" in err
    assert "Traceback" not in err


def test_finished_runs_are_reused_wherever_the_study_folder_is_named_or_moved(tmp_path, capsys, monkeypatch):
    """A study run with an absolute --out is reported from a relative one (and from a moved copy): where the
    runs lie is not part of their config, and the report reads them where they lie now."""
    import shutil
    out = tmp_path / "cmp"
    args = ["compare", "--env", "Arithmetic-v0", "--algos", "reinforce,grpo", "--steps", "1", "--seeds", "1"]
    assert main([*args, "--out", str(out), *TINY]) == 0
    first = json.loads((out / "compare.json").read_text())
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main([*args, "--out", "cmp", "--report-only", *TINY]) == 0             # relative name, same folder
    assert json.loads((out / "compare.json").read_text())["summary"] == first["summary"]
    shutil.move(str(out), str(tmp_path / "moved"))
    assert main([*args, "--out", "moved", "--resume", *TINY]) == 0                # moved: reused, nothing trained
    printed = capsys.readouterr().out
    assert "reused" in printed and "[compare 1/2] reinforce seed=0 ->" not in printed
    moved = json.loads((tmp_path / "moved" / "compare.json").read_text())
    assert moved["summary"] == first["summary"]


def test_runs_recorded_before_a_knob_existed_are_still_reused():
    """--resume / --report-only (and small_scale's --resume) reuse a run whose recorded config lacks a key
    added since, as long as the current config holds that key's default; any other difference is a new run."""
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.config import same_config, to_dict
    defaults = to_dict(TrainConfig())
    current = to_dict(TrainConfig())
    recorded = json.loads(json.dumps(current))
    del recorded["learner"]["skip_no_signal"]                   # the run predates the knob
    assert same_config(recorded, current, defaults)
    current["learner"]["skip_no_signal"] = True                 # ... but this run would set it
    assert not same_config(recorded, current, defaults)
    current = to_dict(TrainConfig())
    changed = json.loads(json.dumps(current))
    changed["optim"]["lr"] = 3e-5
    assert not same_config(changed, current, defaults)
    gone = json.loads(json.dumps(current))
    gone["no_longer_a_key"] = 1                                 # a key the current config no longer has
    assert not same_config(gone, current, defaults)


def test_knobs_that_do_not_change_what_a_run_learns_do_not_make_it_another_run():
    """Micro-batching (the same update up to the order of float sums), checkpoint keeping and where a run
    is written are TrainConfig.RESULT_NEUTRAL: a run recorded with other values is reused; a nested key of
    the same name elsewhere, or any other knob, still counts."""
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.config import same_config, to_dict
    defaults, current = to_dict(TrainConfig()), to_dict(TrainConfig())
    recorded = json.loads(json.dumps(current))
    recorded["learner"]["micro_batch_size"] = 2
    recorded["learner"]["micro_batch_tokens"] = 2048
    recorded["checkpoint_every"], recorded["output_dir"], recorded["tensorboard"] = 1, "/elsewhere", False
    assert not same_config(recorded, current, defaults)                      # without ignore: different
    assert same_config(recorded, current, defaults, TrainConfig.RESULT_NEUTRAL)
    recorded["learner"]["epochs"] = 2
    assert not same_config(recorded, current, defaults, TrainConfig.RESULT_NEUTRAL)
    assert not same_config({**current, "steps": 99}, current, defaults, {"learner.steps", "micro_batch_size"})


def test_a_finished_run_is_reused_after_the_micro_batches_change(tmp_path, capsys):
    """--resume after lowering learner.micro_batch_size (an out-of-memory) or setting a token budget reuses
    the finished runs; the record keeps the micro-batching it ran with. Another learning knob retrains."""
    out = tmp_path / "cmp"
    args = ["compare", "--env", "Arithmetic-v0", "--algos", "grpo", "--steps", "1", "--seeds", "1", "--out", str(out)]
    assert main([*args, *TINY]) == 0
    capsys.readouterr()
    assert main([*args, "--resume", *TINY, "learner.micro_batch_size=1", "learner.micro_batch_tokens=64"]) == 0
    printed = capsys.readouterr().out
    assert "reused" in printed and "[compare 1/1] grpo seed=0 ->" not in printed
    record = json.loads((out / "grpo" / "seed0" / "compare_run.json").read_text())
    assert record["config"]["learner"]["micro_batch_tokens"] is None
    assert main([*args, "--resume", *TINY, "optim.lr=3e-5"]) == 0
    assert "[compare 1/1] grpo seed=0 ->" in capsys.readouterr().out


def test_arms_of_a_seed_share_the_eval_before_training_which_each_would_have_measured(tmp_path, capsys):
    """The eval before training is made by a seed's first arm and taken by the others (same weights, tasks
    and draws; sampled here, eval.samples=2); each arm evaluating itself gets the same numbers, and a
    resumed comparison takes it from a finished run."""
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.config import load_config
    out = tmp_path / "cmp"
    args = ["compare", "--env", "Arithmetic-v0", "--algos", "reinforce,ppo", "--steps", "1", "--seeds", "0,1",
            "--out", str(out)]
    assert main([*args, *TINY, "eval.samples=2"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("its eval, not run again") == 2             # ppo, seeds 0 and 1
    runs = {(r["label"], r["seed"]): r for r in json.loads((out / "compare.json").read_text())["runs"]}
    for seed in (0, 1):
        shared = runs[("ppo", seed)]["before"]
        assert shared["successes"] == runs[("reinforce", seed)]["before"]["successes"] and len(shared["successes"]) == 2
        cfg = load_config(TrainConfig, overrides=[*TINY, "env=Arithmetic-v0", "algo=ppo", f"seed={seed}", "eval.samples=2",
                                                  f"output_dir={tmp_path / f'alone{seed}'}"])
        own = Trainer(cfg).evaluate("before")[0]                      # what ppo would have measured itself
        assert {k: own[k] for k in own if k.startswith("eval/")} == {k: shared[k] for k in shared if k.startswith("eval/")}
        assert own["successes"] == shared["successes"]

    for seed in (0, 1):                                               # one arm to run again on resume
        (out / "ppo" / f"seed{seed}" / "compare_run.json").unlink()
    assert main([*args, "--resume", *TINY, "eval.samples=2"]) == 0
    assert capsys.readouterr().out.count("(the same initial weights, tasks and draws as reinforce seed") == 2


def test_a_killed_comparison_goes_on_from_the_run_checkpoint_and_matches_an_uninterrupted_one(tmp_path):
    """--resume continues an unfinished run from its last checkpoint (a real SIGKILL mid-run), keeps every
    step's task digest, and ends with the numbers of a comparison that was never interrupted."""
    from helpers_processes import kill_once_written
    args = ["compare", "--env", "Arithmetic-v0", "--algos", "reinforce,grpo", "--steps", "4", "--seeds", "1",
            *TINY, "checkpoint_every=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "agentgym.app.cli"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    r = subprocess.run([*cmd, *args, "--out", str(full)], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]

    kill_once_written([*cmd, *args, "--out", str(killed)], killed / "grpo" / "seed0" / "checkpoints" / "step_000002", env,
                      out_dir=killed)
    r = subprocess.run([*cmd, *args, "--out", str(killed), "--resume"], capture_output=True, text=True, timeout=900,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "reinforce seed=0: reused" in r.stdout and "(going on from step_00000" in r.stdout
    assert "same tasks across algos: yes" in r.stdout
    a, b = (json.loads((d / "compare.json").read_text()) for d in (full, killed))
    for ra, rb in zip(a["runs"], b["runs"]):
        assert (ra["label"], len(ra["tasks"])) == (rb["label"], 4) and ra["tasks"] == rb["tasks"]
        assert ra["task_indices"] == rb["task_indices"]
        for ha, hb in zip(ra["history"], rb["history"]):
            for key in ("rollout/reward_mean", "train/loss", "train/grad_norm"):
                assert ha[key] == pytest.approx(hb[key], rel=1e-5, abs=1e-7), key
        assert ra["after"]["successes"] == rb["after"]["successes"]


def test_the_primary_metric_is_declared_before_the_runs_and_cannot_change_after(tmp_path, capsys):
    """--primary is recorded before the first run (compare_declared.json) and in every compare_run.json; the
    report leads with it and marks every other metric secondary; --resume with another --primary is refused in
    one line, --exploratory adds a metric labelled so; the report carries the provenance of the code that ran,
    and a resume over runs made at different commits warns and says so in the report."""
    out = tmp_path / "cmp"
    args = ["compare", "--env", "Arithmetic-v0", "--algos", "reinforce,grpo", "--steps", "1", "--seeds", "2",
            "--out", str(out)]
    assert main([*args, "--primary", "final_reward", *TINY]) == 0
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()
    assert json.loads((out / "compare_declared.json").read_text())["primary"] == "final_reward"
    runs = sorted(out.glob("*/seed*/compare_run.json"))
    assert len(runs) == 4 and {json.loads(r.read_text())["primary"] for r in runs} == {"final_reward"}
    md = (out / "compare.md").read_text()
    assert md.splitlines()[0].startswith("**Primary metric: training reward at the last step (sampled)** "
                                         "(`final_reward`, training rollouts, sampled), declared ")
    assert "| final_reward (primary) |" in md and "| eval_success_after (secondary) |" in md
    assert "held-out (`test`) success before → after" in md
    assert f"**Provenance**: report written at commit `{head[:12]}`" in md and ": 4 runs." in md
    report = json.loads((out / "compare.json").read_text())
    assert list(report)[:2] == ["primary", "provenance"] and report["primary"]["eval_split"] == "test"
    assert {d["metric"] for d in report["primary"]["differences"]} == {"final_reward"}
    assert report["provenance"]["code"]["commit"] == head and sum(map(len, report["provenance"]["runs"].values())) == 4
    capsys.readouterr()

    assert main([*args, "--resume", "--primary", "eval_success_after", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "declared final_reward before it ran" in err
    assert "--exploratory eval_success_after" in err

    grpo1 = out / "grpo" / "seed1" / "provenance.json"
    record = json.loads(grpo1.read_text())
    grpo1.write_text(json.dumps({**record, "code": {**record["code"], "commit": "0" * 40, "dirty": False}}))
    assert main([*args, "--resume", "--exploratory", "auc_reward", *TINY]) == 0
    printed = capsys.readouterr().out
    assert printed.count(": reused") == 4 and "warning: the runs of this comparison ran at 2 different commits" in printed
    md = (out / "compare.md").read_text()
    assert "exploratory, chosen after the declaration: `auc_reward` (added after test results)" in md.splitlines()[0]
    assert "| auc_reward (exploratory) |" in md
    assert "`000000000000`: 1 run" in md and "**2 different commits**" in md
