"""benchmarks/search_r1/rescore_summary.py: the sampled re-scores of Search-R1 in a box v2, read per arm.

Checked against hand computations on files written here: eval files with the structure and keys of a real
`agentgym eval --json` file and study records shaped like the committed ``heldout_records.json`` (synthetic
values; no test reads benchmarks/results), and small files for the edge cases (seeds an arm lacks, unscored
questions, bad input).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers_scripts import load_script

from agentgym.stats import paired_bootstrap_ci, t_quantile

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "search_r1" / "rescore_summary.py"
#: the synthetic study: 4 questions of each type, 4 sampled episodes a question (successes in quarters)
TYPES = ["single_hop", "multi_hop", "no_search"] * 4
RUNS = ("sft", "rag_sft", "ppo_masked_seed0", "ppo_masked_seed1", "ppo_masked_seed2", "grpo_masked_seed0",
        "grpo_masked_seed1")


def _module():
    return load_script(SCRIPT)


def _write(folder: Path, name: str, successes: dict[int, float]) -> None:
    per_task = [{"task_index": k, "episodes": 4, "scored": 0 if math.isnan(v) else 4, "success": v}
                for k, v in successes.items()]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"per_task": per_task, "task_summary": {"pass@4": 0.5}}))


def _write_eval(folder: Path, name: str, successes: list[float]) -> None:
    """An `agentgym eval --json` file as the sampled re-score writes it (the keys of the committed ones:
    config, metrics, metrics_std, task_summary with pass@4 among other keys, per_task), values from
    ``successes`` (one per question, each the mean of 4 episodes)."""
    n, rate = len(successes), float(np.mean(successes))
    doc = {"env": "agentgym/SearchQA-v0", "policy": f"runs/search_r1_v2/{name}/model",
           "config": {"env": "SearchQA-v0", "split": "test", "episodes": n, "group_size": 4, "tasks": list(range(n)),
                      "seed": 0, "rollout": {"sampling": {"max_new_tokens": 48, "temperature": 1.0, "greedy": False}}},
           "env_kwargs": {"protocol": "search_r1", "retrieval": "agentic", "topk": 3, "split": "test"},
           "metrics": {"episodes": 4.0 * n, "infra_errors": 0.0, "success_rate": rate, "reward_mean": rate,
                       "generated_tokens": 200.0 * n},
           "metrics_std": {"success_rate": 0.4, "reward/exact_match": 0.4},
           "task_summary": {"tasks": float(n), "task_success": rate, "task_success_ci_low": rate - 0.1,
                            "task_success_ci_high": rate + 0.1, "ci_note": None,
                            "pass@4": float(np.mean([x > 0 for x in successes]))},
           "per_task": [{"task_index": k, "episodes": 4, "scored": 4, "success": x} for k, x in enumerate(successes)]}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(doc, indent=1))


def _write_records(path: Path) -> None:
    """The study's held-out records as committed (``heldout_records.json``): per phase, per seed, one row per
    question with its type; the first phase, a one-seed baseline, is the one read."""
    def rows(em: float) -> list[dict]:
        return [{"task_index": k, "type": t, "em": em, "searches": 1.0, "invalid": 0.0, "answered": 1.0,
                 "found_gold": 0.0, "turns": 2.0, "response_tokens": 40.0, "response_tail": "<answer>x</answer>"}
                for k, t in enumerate(TYPES)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"note": "held-out per-question records (synthetic)",
                                "records": {"none_base": [rows(0.0)], "grpo_masked": [rows(1.0), rows(0.0)]}}))


def _study(folder: Path) -> dict[str, list[float]]:
    """Every model's per-question success (quarters, fixed seed), written as re-scores into ``folder``/rescore
    with the records beside them; returns them for the hand computations."""
    rng = np.random.default_rng(7)
    scores = {name: (rng.integers(0, 5, len(TYPES)) / 4).tolist() for name in RUNS}
    for name, successes in scores.items():
        _write_eval(folder / "rescore", name, successes)
    _write_records(folder / "heldout_records.json")
    return scores


def test_rescores_of_a_study_match_a_hand_computation(tmp_path):
    mod = _module()
    raw = _study(tmp_path / "search_r1_v2_runs")
    scores = mod.load_scores(tmp_path / "search_r1_v2_runs" / "rescore")
    assert scores["sft"]["pass"] == {"pass@4": pytest.approx(np.mean([x > 0 for x in raw["sft"]]))}   # pass@k only
    assert scores["sft"]["per_task"] == dict(enumerate(raw["sft"]))
    types = mod.load_types(tmp_path / "search_r1_v2_runs" / "heldout_records.json")
    assert types == dict(enumerate(TYPES))
    s = mod.summarize(scores, types)
    seeds = ["ppo_masked_seed0", "ppo_masked_seed1", "ppo_masked_seed2"]
    sft = raw["sft"]
    runs = np.asarray([raw[n] for n in seeds])
    # over questions: each question's mean over the seeds, minus SFT's, bootstrapped over the questions
    arm = s["arms"]["ppo_masked"]
    assert arm["over_questions"]["diff"] == pytest.approx(runs.mean() - np.mean(sft))
    assert (arm["over_questions"]["diff"], arm["over_questions"]["low"], arm["over_questions"]["high"]) == \
        pytest.approx(paired_bootstrap_ci(runs.mean(axis=0).tolist(), sft))
    assert arm["over_questions"]["n"] == len(TYPES) and arm["success"] == pytest.approx(runs.mean())
    # over seeds: Student's t over the per-seed differences
    d = runs.mean(axis=1) - np.mean(sft)
    half = t_quantile(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    assert arm["over_seeds"]["low"] == pytest.approx(d.mean() - half)
    assert arm["over_seeds"]["high"] == pytest.approx(d.mean() + half)
    assert arm["seeds"] == [0, 1, 2] and s["arms"]["grpo_masked"]["seeds"] == [0, 1]
    assert s["arms"]["rag_sft"]["seeds"] == [0]   # a file without a seed is an arm of its own
    # per type: 4 questions of each type, the type read from the study's records
    assert set(s["models"]["sft"]["by_type"]) == {"single_hop", "multi_hop", "no_search"}
    for t in ("single_hop", "multi_hop", "no_search"):
        mine = [k for k, kind in enumerate(TYPES) if kind == t]
        assert s["models"]["sft"]["by_type"][t] == pytest.approx(np.mean([sft[k] for k in mine]))
        assert arm["by_type"][t] == pytest.approx(runs[:, mine].mean())
    assert s["models"]["ppo_masked_seed1"]["minus_baseline"]["diff"] == pytest.approx(np.mean(raw["ppo_masked_seed1"]) - np.mean(sft))


def test_arms_pair_by_seed_and_fall_back_to_welch(tmp_path):
    mod = _module()
    tasks = range(6)
    _write(tmp_path, "sft", {k: 0.0 for k in tasks})
    for seed, lift in enumerate((0.5, 0.25, 0.5)):
        _write(tmp_path, f"a_seed{seed}", {k: lift if k % 2 else 0.0 for k in tasks})
    for seed, lift in enumerate((0.25, 0.0, 0.25)):
        _write(tmp_path, f"b_seed{seed}", {k: lift if k % 2 else 0.0 for k in tasks})
    _write(tmp_path, "c_seed7", {k: 0.25 for k in tasks})
    s = mod.summarize(mod.load_scores(tmp_path), {}, pairs=[("a", "b"), ("a", "c")])
    ab, ac = s["pairs"]
    assert ab["over_seeds"]["how"] == "paired over 3 shared seeds"
    assert ab["over_seeds"]["diff"] == pytest.approx(0.125) and ab["over_seeds"]["undefined"] == "seeds agree: no spread"
    assert ac["over_seeds"]["how"] == "Welch, all seeds" and ac["over_seeds"]["undefined"] == "1 seed"
    assert s["arms"]["c"]["over_seeds"]["undefined"] == "1 seed"   # one seed: no interval, and it says why
    md = mod.markdown(s)
    assert "| `a` − `b` |" in md and "n/a (1 seed)" in md and md.index("`sft`") < md.index("`a_seed0`")


def test_a_question_no_episode_scored_is_left_out_of_both_sides(tmp_path):
    mod = _module()
    _write(tmp_path, "sft", {0: 0.0, 1: 0.0, 2: 1.0, 3: 0.5})
    _write(tmp_path, "x_seed0", {0: 1.0, 1: math.nan, 2: 1.0, 3: 0.5})
    s = mod.summarize(mod.load_scores(tmp_path), {})
    row = s["models"]["x_seed0"]["minus_baseline"]
    assert row["n"] == 3 and row["diff"] == pytest.approx(1 / 3)
    assert s["arms"]["x"]["over_questions"]["n"] == 3


def test_bad_input_gets_a_short_error(tmp_path):
    mod = _module()
    _write(tmp_path / "nosft", "a_seed0", {0: 1.0})
    with pytest.raises(SystemExit, match="no sft.json"):
        mod.summarize(mod.load_scores(tmp_path / "nosft"), {})
    _write(tmp_path / "ok", "sft", {0: 1.0})
    _write(tmp_path / "ok", "a_seed0", {0: 1.0})
    with pytest.raises(SystemExit, match="--pair a zz: no re-scores of zz"):
        mod.summarize(mod.load_scores(tmp_path / "ok"), {}, pairs=[("a", "zz")])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "sft.json").write_text('{"metrics": {}}')
    with pytest.raises(SystemExit, match="not an `agentgym eval --json` file"):
        mod.load_scores(tmp_path / "bad")
    r = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(tmp_path / "missing")], capture_output=True, text=True)
    assert r.returncode == 2 and "no such folder" in r.stderr and "Traceback" not in r.stderr


def test_cli_writes_markdown_json_and_png(tmp_path):
    _write(tmp_path / "rescore", "sft", {0: 0.0, 1: 1.0, 2: 0.5})
    _write(tmp_path / "rescore", "a_seed0", {0: 1.0, 1: 1.0, 2: 0.5})
    _write(tmp_path / "rescore", "a_seed1", {0: 0.5, 1: 1.0, 2: 0.75})
    _write(tmp_path / "rescore", "b_seed0", {0: 0.0, 1: 0.5, 2: 0.5})
    out, png = tmp_path / "summary.json", tmp_path / "summary.png"
    r = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(tmp_path / "rescore"), "--json", str(out),
                        "--png", str(png), "--pair", "a", "b"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "| `a_seed0` | 0.833 | +0.333" in r.stdout
    assert json.loads(out.read_text())["arms"]["a"]["success"] == pytest.approx(0.791666, abs=1e-5)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000   # a drawn figure


def test_cli_png_with_only_the_baseline_says_so_and_writes_nothing(tmp_path):
    _write(tmp_path / "rescore", "sft", {0: 0.0, 1: 1.0})
    png = tmp_path / "summary.png"
    r = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(tmp_path / "rescore"), "--png", str(png)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "nothing to draw" in r.stderr and not png.exists()


def test_cli_finds_the_records_beside_the_rescores(tmp_path):
    """A folder laid out as the committed one, heldout_records.json (not progress.json) beside rescore/: the
    per-type column is filled, with each type's mean success."""
    raw = _study(tmp_path / "search_r1_v2_runs")
    r = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(tmp_path / "search_r1_v2_runs" / "rescore")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    sft_row = next(line for line in r.stdout.splitlines() if line.startswith("| `sft` |"))
    by_type = [np.mean([x for x, kind in zip(raw["sft"], TYPES) if kind == t]) for t in TYPES[:3]]
    assert f"| {' / '.join(f'{m:.3f}' for m in by_type)} |" in sft_row and "n/a" not in sft_row


STUDIES = ROOT / "benchmarks" / "issue23_studies.sh"


def _studies(*args: str, runs: Path, raw: Path) -> subprocess.CompletedProcess:
    import os
    env = {**os.environ, "RUNS": str(runs), "RAW": str(raw)}
    return subprocess.run(["bash", str(STUDIES), *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_studies_rescore_takes_over_committed_rescores_and_skips_runs_without_weights(tmp_path):
    """`issue23_studies.sh rescore` on a machine that kept no weights: the committed re-scores are taken over,
    an unscored run without weights is named and skipped; nothing is evaluated."""
    raw, runs = tmp_path / "raw", tmp_path / "runs"
    _write(raw / "search_r1_v2_runs" / "rescore", "sft", {0: 0.0, 1: 1.0})
    _write(raw / "search_r1_v2_runs" / "rescore", "ppo_masked_seed0", {0: 1.0, 1: 1.0})
    v2 = runs / "search_r1_v2"
    v2.mkdir(parents=True)
    row = {"task_index": 0, "type": "single_hop", "em": 1.0}
    (v2 / "progress.json").write_text(json.dumps({"records": {"sft": [[row]], "ppo_masked": [[row]],
                                                              "grpo_unmasked": [[row], [row]]}}))
    (v2 / "grpo_unmasked_seed1" / "checkpoints").mkdir(parents=True)   # a run whose weights are gone
    r = _studies("rescore", runs=runs, raw=raw)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (v2 / "rescore").iterdir()) == ["ppo_masked_seed0.json", "sft.json"]
    assert "no weights of grpo_unmasked_seed0 here" in r.stdout and "no weights of grpo_unmasked_seed1 here" in r.stdout
    assert "ppo_masked_seed0" not in r.stdout   # already scored: not named, not evaluated


def test_studies_rescore_waits_for_a_run_stopped_part_way(tmp_path):
    """A `--retrain` stopped at step 10 of 30 leaves an early checkpoint with weights: those are not the run's,
    so it is named and not re-scored (re-scoring it would record a partly trained model as the arm's)."""
    raw, runs = tmp_path / "raw", tmp_path / "runs"
    _write(raw / "search_r1_v2_runs" / "rescore", "sft", {0: 0.0, 1: 1.0})
    v2 = runs / "search_r1_v2"
    v2.mkdir(parents=True)
    row = {"task_index": 0, "type": "single_hop", "em": 1.0}
    (v2 / "progress.json").write_text(json.dumps({"records": {"sft": [[row]], "grpo_masked": [[row]]}}))
    run = v2 / "grpo_masked_seed0"
    (run / "checkpoints" / "step_000010" / "model").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 30\ncheckpoint_every: 5\n")
    r = _studies("rescore", runs=runs, raw=raw)
    assert r.returncode == 0, r.stderr
    assert "grpo_masked_seed0 has not reached its last step (step_000030)" in r.stdout
    assert sorted(p.name for p in (v2 / "rescore").iterdir()) == ["sft.json"]


def test_studies_save_commits_rescores_without_their_trajectories(tmp_path):
    raw, runs = tmp_path / "raw", tmp_path / "runs"
    _write(runs / "search_r1_v2" / "rescore", "sft", {0: 1.0})
    path = runs / "search_r1_v2" / "rescore" / "sft.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "trajectories": [{"big": "x" * 1000}]}))
    r = _studies("save", runs=runs, raw=raw)
    assert r.returncode == 0, r.stderr
    saved = json.loads((raw / "search_r1_v2_runs" / "rescore" / "sft.json").read_text())
    assert "trajectories" not in saved and saved["per_task"] == [{"task_index": 0, "episodes": 4, "scored": 4, "success": 1.0}]
