"""benchmarks/search_r1/small_scale.py: the Search-R1 small-scale study's machinery.

* fast (default suite): the whole script end to end on ``tiny-random`` with BM25 — SFT on oracle
  episodes, one RL step, the held-out evals, statistics, markdown table and PNG; plus the eval
  machinery scoring the env's oracle (EM 1 on every question, one search exactly when needed).
* slow (opt in with ``--runslow`` or ``AGENTGYM_SLOW=1``): a shortened study with SmolLM2-135M on
  fixed seeds; the SFT→GRPO (masked) arm must beat the no-search baseline by a stated margin.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from helpers_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "search_r1" / "small_scale.py"


def _module():
    return load_script(SCRIPT, "search_r1_small_scale")


def _check_outputs(out: Path, arms: list[str], questions: int) -> dict:
    result = json.loads((out / "small_scale.json").read_text())
    md = (out / "small_scale.md").read_text()
    png = out / "small_scale.png"
    assert png.is_file() and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for arm in arms:
        assert arm in result["stats"], arm
        runs = result["records"][arm]
        assert runs and all(len(run) == questions for run in runs)
        assert [r["task_index"] for r in runs[0]] == result["meta"]["eval_task_indices"]
        em, lo, hi = result["stats"][arm]["em_overall"]
        assert math.isfinite(em) and 0.0 <= lo <= em <= hi <= 1.0
        # the arm's table row holds its numbers
        row = next(line for line in md.splitlines() if line.startswith(f"| {_module().LABELS[arm]} |"))
        assert f"{em:.3f}" in row
    table_rows = [line for line in md.splitlines() if line.startswith("| (")]
    assert len(table_rows) >= len(arms)
    assert result["meta"]["wall_s"]["total"] > 0 and len(result["meta"]["machine"]["load_average_start"]) == 3
    return result


def test_small_scale_end_to_end_tiny(tmp_path):
    """SFT + one RL step + evals + table + PNG, on tiny-random (< 60 s with 1 thread)."""
    mod = _module()
    out = tmp_path / "out"
    rc = mod.main(["--quick", "--model", "tiny-random", "--retriever", "bm25", "--threads", "1",
                   "--eval-per-type", "1", "--arms", "grpo_masked",
                   "--n-boot", "500", "--out", str(out), "--runs-dir", str(tmp_path / "runs")])
    assert rc == 0
    result = _check_outputs(out, ["none_base", "rag_base", "sft", "grpo_masked"], questions=3)
    types = sorted(r["type"] for r in result["records"]["sft"][0])
    assert types == ["multi_hop", "no_search", "single_hop"]
    assert result["sft"]["kept"] == 8 and math.isfinite(result["sft"]["loss_last"])
    assert len(result["rl"]["grpo_masked"][0]["history"]) == 1
    # the final weights stay for a re-score (agentgym eval --policy RUN), the optimizer state does not
    run = tmp_path / "runs" / "grpo_masked_seed0"
    assert [p.relative_to(run).as_posix() for p in sorted(run.glob("checkpoints/*/*"))] == \
        ["checkpoints/step_000001/history.json", "checkpoints/step_000001/model"]
    from agentgym.policies.loading import load_trained_policy
    assert load_trained_policy(str(run)).name == str(run)
    assert (tmp_path / "runs" / "sft" / "model" / "config.json").is_file()
    comps = result["comparisons"]
    assert any("(d) SFT→GRPO, masked − (a) no search" in k for k in comps)


def test_eval_machinery_scores_the_oracle():
    """The env's scripted oracle through the script's eval: EM 1 everywhere, searches only when needed,
    no invalid actions; and the baseline arms' layout (one generation) accepts its answer turn."""
    mod = _module()
    from agentgym.envs.searchqa.env import SearchQAEnv
    from agentgym.policies.scripted import ScriptedPolicy
    from agentgym.policies.transformers_policy import TransformersPolicy
    cfg = mod.load_train_config(mod.parse_args(["--retriever", "bm25", "--model", "tiny-random"]))
    indices = mod.eval_indices(cfg, 2)
    tok = TransformersPolicy.tiny_random(seed=0).tokenizer
    oracle = ScriptedPolicy(tok, SearchQAEnv.oracle)
    recs, _ = mod.evaluate(oracle, cfg, indices, "agentic", "oracle")
    assert [r["task_index"] for r in recs] == indices
    assert all(r["em"] == 1.0 and r["invalid"] == 0.0 for r in recs)
    for r in recs:
        assert r["searches"] == (0.0 if r["type"] == "no_search" else 1.0), r
    stats = mod.arm_stats([recs], n_boot=200)
    assert stats["em_overall"][0] == 1.0 and stats["searches"][0] == pytest.approx(4 / 6)


@pytest.mark.slow
def test_small_scale_rl_beats_no_search(tmp_path):
    """Shortened study on fixed seeds (SmolLM2-135M, dense retriever, SFT seed 0 on 64 oracle episodes,
    GRPO seed 0 with masking, 2 steps × 2×4 at Search-R1's lr 1e-6): on 30 held-out questions its EM
    must exceed the base model's no-search EM by at least 0.20. Measured 2026-11-24 with these settings
    (the SFT model reused from the recorded run): RL 0.300, no-search 0.000, SFT only 0.400. At lr 1e-5
    the same seed stopped searching after one update (EM 0.100), hence Search-R1's lr here.
    Time (issue 23 asks for under 10 min), quiet 2-core AMD EPYC family 26 model 2 (Zen 5), 2026-11-28:
    10 min 51 s on 1 torch thread, 7 min 03 s on 2 (SFT 372 -> 236 s), the same result on both
    (RL 0.333, SFT only 0.400, no search 0.000); so it takes up to 2 threads, as an opt-in run has the
    machine to itself."""
    mod = _module()
    out = tmp_path / "out"
    threads = str(min(2, os.cpu_count() or 1))
    rc = mod.main(["--threads", threads, "--eval-per-type", "10", "--sft-episodes", "64", "--seeds", "1",
                   "--arms", "grpo_masked", "--steps", "2", "--groups", "2", "--group-size", "4",
                   "--override", "optim.lr=1e-6", "--n-boot", "2000",
                   "--out", str(out), "--runs-dir", str(tmp_path / "runs")])
    assert rc == 0
    result = _check_outputs(out, ["none_base", "rag_base", "sft", "grpo_masked"], questions=30)
    rl = result["stats"]["grpo_masked"]["em_overall"][0]
    none = result["stats"]["none_base"]["em_overall"][0]
    assert rl >= none + 0.20, (rl, none)
    assert result["stats"]["grpo_masked"]["searches"][0] > 0.3   # it still searches: not a collapse to answering


def test_no_spread_intervals_are_reported_as_undefined():
    """Two arms that score 0 on every question (the tiny model's usual result): each arm's bootstrap
    interval and their paired difference have zero width; the table prints n/a with the reason, the
    comparison is not counted as excluding 0, and the JSON difference has NaN bounds with the reason."""
    mod = _module()
    qs = [{"task_index": i, "type": t, "em": 0.0, "searches": 0.0, "invalid": 0.0, "answered": 1.0,
           "found_gold": 0.0, "response_tokens": 5.0} for i, t in enumerate(mod.QTYPES * 2)]
    a, b = [qs, qs], [qs, qs]                                  # two seeds each, all agreeing
    sa, sb = mod.arm_stats(a, n_boot=200), mod.arm_stats(b, n_boot=200)
    assert sa["em_overall"] == (0.0, 0.0, 0.0) and sa["ci_undefined"]["em_overall"] == "questions agree: no spread"
    assert sa["ci_undefined"]["em_seed_t_ci"] == "seeds agree: no spread" and math.isnan(sa["em_seed_t_ci"][1])
    assert mod.fmt_ci(sa["em_overall"], sa["ci_undefined"]["em_overall"]) == "0.000, CI n/a (questions agree: no spread)"
    c = mod.compare(a, b, sa, sb, n_boot=200)
    o = c["overall"]
    assert o["verdict"] == "n/a" and o["undefined"] == "questions agree: no spread" and math.isnan(o["ci_low"])
    assert c["seed_welch"]["verdict"] == "n/a" and c["seed_welch"]["undefined"] == "seeds agree: no spread"
    assert mod.fmt_diff(o) == "+0.000, CI n/a (questions agree: no spread)"
    assert json.loads(json.dumps(c, default=float))["overall"]["undefined"] == "questions agree: no spread"
    spread = {"diff": 0.1, "ci_low": -0.05, "ci_high": 0.25, "verdict": "noise", "undefined": None}
    assert mod.fmt_diff(spread) == "+0.100 [-0.05, +0.25]"


_META = {"date": "2026-11-26", "model": "tiny-random", "retriever": "bm25", "topk": 3, "eval_questions": 6,
         "eval_per_type": 2, "seeds": 3, "command": "small_scale.py", "wall_s": {"total": 1.0},
         "rl": {"steps": 2, "groups": 2, "group_size": 4, "lr": 1e-6, "max_new_tokens": 8, "max_turns": 2},
         "machine": {"platform": "Linux", "cpus": 2, "torch_threads": 1, "load_average_start": [0.0] * 3,
                     "load_average_end": [0.0] * 3}}
_SFT = {"kept": 4, "episodes": 4, "steps": 1, "loss_first": 2.0, "loss_last": 1.0}


def test_seed_intervals_against_a_fixed_baseline_and_between_rl_arms():
    """Over seeds: an RL arm against a one-run greedy baseline gets Student's t over its per-seed EMs minus
    the baseline's (a constant); two RL arms get Welch's interval and, seed by seed, the paired one. The
    format-matched baselines (the SFT model without search, with one-shot RAG) are compared too."""
    mod = _module()

    def run(ems):   # one seed's records: 6 questions, the first round(6 * em) answered right
        return [{"task_index": i, "type": mod.QTYPES[i % 3], "em": float(i < round(6 * ems)), "searches": 1.0,
                 "invalid": 0.0, "answered": 1.0, "found_gold": 1.0, "response_tokens": 5.0} for i in range(6)]
    records = {"none_base": [run(0.0)], "rag_base": [run(0.0)], "sft": [run(1 / 6)], "none_sft": [run(0.0)],
               "rag_sft": [run(1 / 6)], "grpo_masked": [run(3 / 6), run(4 / 6), run(5 / 6)],
               "grpo_unmasked": [run(2 / 6), run(4 / 6), run(4 / 6)]}
    stats, comps = mod.analyse(records, n_boot=200)
    vs_rag = comps["(d) SFT→GRPO, masked − RAG, SFT model"]
    t = vs_rag["seed_t"]                                   # per-seed 3/6, 4/6, 5/6 minus 1/6: mean 1/2, sd 1/6
    assert t["diff"] == pytest.approx(0.5) and t["verdict"] == "significant"
    half = 4.302653 * (1 / 6) / math.sqrt(3)
    assert (t["ci_low"], t["ci_high"]) == pytest.approx((0.5 - half, 0.5 + half), rel=1e-5)
    assert "seed_welch" not in vs_rag and "(d) SFT→GRPO, masked − no search, SFT model" in comps
    rl = comps["(d) SFT→GRPO, masked − (f) SFT→GRPO, unmasked"]
    assert rl["seed_paired"]["diff"] == pytest.approx(1 / 9) and "seed_t" not in rl
    assert rl["seed_welch"]["diff"] == pytest.approx(1 / 9)
    md = mod.markdown({"meta": {**_META, "seeds": 3}, "stats": stats, "comparisons": comps, "sft": _SFT})
    row = next(line for line in md.splitlines() if line.startswith("| (d) SFT→GRPO, masked − (f)"))
    assert "Welch +0.111" in row and "; paired +0.111" in row
    row = next(line for line in md.splitlines() if line.startswith("| (d) SFT→GRPO, masked − RAG, SFT model"))
    assert row.endswith(f"| {mod.fmt_diff(t)} (t) |")


def test_default_out_is_untracked_so_a_run_keeps_the_committed_results():
    """Without --out the study writes under runs/ (git-ignored), not into benchmarks/search_r1/results."""
    import subprocess
    out = _module().parse_args([]).out
    assert Path(out).parts[0] == "runs" and "benchmarks" not in Path(out).parts
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{out}/small_scale.json"], cwd=ROOT)
    assert ignored.returncode == 0, f"{out} is not git-ignored"


def test_ctrl_c_prints_one_line_exits_130_and_resume_continues(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) once the baselines are recorded and the
    SFT warm start is under way: exit 130, no traceback, one line naming what was kept and --resume.
    Then --resume reuses the two finished evals and completes the study."""
    import os
    import queue
    import signal
    import subprocess
    import sys
    import threading
    import time
    args = ["--quick", "--model", "tiny-random", "--retriever", "bm25", "--threads", "1", "--eval-per-type", "1",
            "--arms", "grpo_masked", "--n-boot", "200", "--out", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # SIGINT at its default in the child even when pytest runs as a background job (which ignores it);
    # stderr (progress bars) to a file, so that a full pipe can never stall the child
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err_file:
        p = subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=err_file,
                             text=True, env=env, cwd=tmp_path, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in p.stdout], daemon=True).start()
    deadline, seen = time.monotonic() + 240, []
    while not any(" SFT: " in line for line in seen):      # the warm start has begun: (a) and (b) are done
        assert time.monotonic() < deadline and p.poll() is None, "".join(seen) + stderr.read_text()
        try:
            seen.append(lines.get(timeout=1))
        except queue.Empty:
            pass
    time.sleep(1)
    os.killpg(p.pid, signal.SIGINT)
    assert p.wait(timeout=120) == 130
    err = stderr.read_text()
    assert "Traceback" not in err, err
    said = [line for line in err.splitlines() if line.startswith("interrupted:")]
    assert len(said) == 1 and "--resume" in said[0] and "none_base, rag_base" in said[0], err
    assert not (tmp_path / "out" / "small_scale.json").exists()

    r = subprocess.run([sys.executable, str(SCRIPT), *args, "--resume"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--resume: reusing none_base, rag_base from" in r.stdout
    assert "eval (a) no search" not in r.stdout and "eval (c) SFT only" in r.stdout   # only what was left ran
    result = _check_outputs(tmp_path / "out", ["none_base", "rag_base", "sft", "grpo_masked"], questions=3)
    assert result["meta"]["resumed"] == ["none_base", "rag_base"]


def test_killed_rl_run_resumes_from_its_last_checkpoint(tmp_path):
    """A session killed (SIGKILL: no handler runs) during an RL run: --resume continues that run from its
    last periodic checkpoint (--checkpoint-every), not from step 0, and the run ends with every step."""
    import os
    import signal
    import subprocess
    import sys
    import time
    runs = tmp_path / "runs"
    args = ["--quick", "--model", "tiny-random", "--retriever", "bm25", "--threads", "1", "--eval-per-type", "1",
            "--arms", "grpo_masked", "--steps", "4", "--checkpoint-every", "1", "--n-boot", "200",
            "--out", str(tmp_path / "out"), "--runs-dir", str(runs)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    ckpts = runs / "grpo_masked_seed0" / "checkpoints"
    with (tmp_path / "first.txt").open("w") as log:
        p = subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=log, stderr=subprocess.STDOUT,
                             env=env, cwd=tmp_path, start_new_session=True)
        deadline = time.monotonic() + 300
        from agentgym.algorithms.loop.run_control import latest_checkpoint
        while latest_checkpoint(ckpts.parent) is None:   # a whole one (a checkpoint is written aside, then renamed)
            assert time.monotonic() < deadline and p.poll() is None, (tmp_path / "first.txt").read_text()[-3000:]
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    # the same runs folder named relatively this time: where the runs lie is not part of the study's settings
    resume = [a if a != str(runs) else "runs" for a in args]
    r = subprocess.run([sys.executable, str(SCRIPT), *resume, "--resume"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "[grpo_masked_seed0] continuing from" in r.stdout and "/checkpoints/step_" in r.stdout, \
        (tmp_path / "first.txt").read_text()[-3000:] + r.stdout[-3000:]
    result = _check_outputs(tmp_path / "out", ["none_base", "rag_base", "sft", "grpo_masked"], questions=3)
    assert [int(row["step"]) for row in result["rl"]["grpo_masked"][0]["history"]] == [1, 2, 3, 4]
    # once the run finished, only the final weights stay: no optimizer state, no older checkpoint
    assert [p.relative_to(ckpts).as_posix() for p in sorted(ckpts.glob("*/*"))] == \
        ["step_000004/history.json", "step_000004/model"]


def test_a_study_is_the_same_wherever_its_folders_are():
    """--resume's fingerprint leaves out where outputs go (--out, --runs-dir, named relatively or absolutely,
    or moved), also for progress files recorded while --runs-dir was still part of it; a real flag differs."""
    mod = _module()
    recorded = {"config": {"algo": "grpo"}, "args": {"steps": 30, "runs_dir": "/abs/runs/search_r1_v2"}}
    current = {"config": {"algo": "grpo"}, "args": {"steps": 30}}
    assert mod._same_fingerprint(recorded, current)
    assert not mod._same_fingerprint(recorded, {**current, "args": {"steps": 20}})


def test_a_study_resumes_with_other_micro_batches():
    """A token budget (or a smaller micro-batch after an out-of-memory) set in the config of a study under
    way resumes it: micro-batching does not change what a run learns. The learning rate does."""
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.config import to_dict
    mod = _module()
    cfg = to_dict(TrainConfig())
    recorded = {"config": cfg, "args": {"steps": 30}}
    budget = json.loads(json.dumps(cfg))
    budget["learner"].update(micro_batch_tokens=2048, micro_batch_size=2)
    assert mod._same_fingerprint(recorded, {"config": budget, "args": {"steps": 30}})
    budget["optim"]["lr"] = 5e-6
    assert not mod._same_fingerprint(recorded, {"config": budget, "args": {"steps": 30}})


def test_resume_finds_the_sft_model_in_a_moved_study_folder(tmp_path):
    mod = _module()
    runs = tmp_path / "moved"
    (runs / "sft" / "model").mkdir(parents=True)
    fp = {"config": {"algo": "grpo"}, "args": {"steps": 30}}
    (runs / "progress.json").write_text(json.dumps({
        "fingerprint": fp, "records": {}, "rl": {}, "timings": {}, "sft_config": {}, "elapsed_s": 1.0,
        "sft": {"model_dir": str(tmp_path / "where_it_was" / "sft" / "model")}}))
    progress = mod.Progress(runs / "progress.json", fp)
    progress.load()
    assert progress.sft["model_dir"] == str(runs / "sft" / "model")
    (runs / "sft" / "model").rmdir()           # gone altogether: the clear error as before
    with pytest.raises(ValueError, match="is gone"):
        mod.Progress(runs / "progress.json", fp).load()


def test_retrain_brings_back_the_weights_of_a_finished_run(tmp_path, capsys):
    """A finished RL run whose weights are gone (a new machine): --resume --retrain trains it again with its
    settings into its folder, keeps the recorded eval, writes the new greedy eval beside it, and stops."""
    import shutil
    mod = _module()
    study = ["--quick", "--model", "tiny-random", "--retriever", "bm25", "--threads", "1", "--eval-per-type", "1",
             "--arms", "grpo_masked", "--n-boot", "200", "--out", str(tmp_path / "out"),
             "--runs-dir", str(tmp_path / "runs")]
    assert mod.main(study) == 0
    progress = tmp_path / "runs" / "progress.json"
    recorded = json.loads(progress.read_text())["records"]
    run = tmp_path / "runs" / "grpo_masked_seed0"
    shutil.rmtree(run / "checkpoints")
    assert mod.main([*study, "--retrain", "grpo_masked_seed0"]) == 2   # without --resume: refused
    assert "give it with --resume" in capsys.readouterr().err
    assert mod.main([*study, "--resume", "--retrain", "grpo_masked_seed0"]) == 0
    assert [p.relative_to(run).as_posix() for p in sorted(run.glob("checkpoints/*/*"))] == \
        ["checkpoints/step_000001/history.json", "checkpoints/step_000001/model"]
    again = json.loads((run / "retrained.json").read_text())
    assert again["run"] == "grpo_masked_seed0" and again["questions"] == 3
    assert 0 <= again["questions_differing"] <= 3 and again["recorded_em"] == \
        sum(r["em"] for r in recorded["grpo_masked"][0]) / 3
    assert json.loads(progress.read_text())["records"] == recorded   # the study's results are not replaced
    capsys.readouterr()
    assert mod.main([*study, "--resume", "--retrain", "grpo_masked_seed0"]) == 0   # done: not trained a third time
    assert "done before" in capsys.readouterr().out
    for bad, says in (("ppo_masked_seed0", "has not finished"), ("sft_seed0", "not an RL run name"),
                      ("grpo_masked_seedX", "not an RL run name")):
        assert mod.main([*study, "--resume", "--retrain", bad]) == 2
        assert says in capsys.readouterr().err
