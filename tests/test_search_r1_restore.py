"""benchmarks/search_r1/restore_progress.py: a study continued on a machine without its runs/ folder.

A real (tiny) study runs, its finished phases are saved the way they are committed, the runs folder is
thrown away, and the study is continued from the saved files alone: the baselines and the RL run are taken
over, the SFT model is trained again and measured against the saved one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks" / "search_r1"


def _load(name: str):
    sys.path.insert(0, str(HERE))
    return load_script(HERE / f"{name}.py")


STUDY = ["--quick", "--model", "tiny-random", "--retriever", "bm25", "--threads", "1", "--eval-per-type", "1",
         "--arms", "grpo_masked", "--n-boot", "200"]


def test_a_study_goes_on_from_its_committed_files_on_a_new_machine(tmp_path, capsys):
    ss, rp = _load("small_scale"), _load("restore_progress")
    first, raw = tmp_path / "machine1", tmp_path / "committed"
    assert ss.main([*STUDY, "--out", str(first / "out"), "--runs-dir", str(first)]) == 0
    assert rp.main(["--runs-dir", str(first), "--raw", str(raw), "--save"]) == 0
    saved = json.loads((raw / "heldout_records.json").read_text())["records"]
    assert set(saved) == {"none_base", "rag_base", "sft", "grpo_masked"}
    assert sorted(p.name for p in (raw / "grpo_masked_seed0").iterdir()) == \
        ["alarms.json", "config.yaml", "curves.png", "train_log.csv"]
    assert not list(raw.rglob("*.safetensors"))          # weights are not committed

    second = tmp_path / "machine2"                        # a new machine: only the committed files
    assert rp.main(["--runs-dir", str(second), "--raw", str(raw), "--", *STUDY]) == 0
    said = capsys.readouterr().out
    assert "taken over none_base, rag_base, grpo_masked_seed0" in said and "SFT, sft" in said
    capsys.readouterr()
    assert ss.main([*STUDY, "--out", str(second / "out"), "--runs-dir", str(second), "--resume"]) == 0
    ran = capsys.readouterr().out
    assert "--resume: reusing none_base, rag_base, grpo_masked_seed0" in ran
    assert "eval (c) SFT only" in ran and "RL grpo_masked_seed0" not in ran and "eval (a) no search" not in ran
    result = json.loads((second / "out" / "small_scale.json").read_text())
    assert result["records"]["grpo_masked"] == saved["grpo_masked"]        # taken over as it was
    first_log = json.loads((first / "out" / "small_scale.json").read_text())["rl"]["grpo_masked"][0]["history"]
    assert [r["step"] for r in result["rl"]["grpo_masked"][0]["history"]] == [r["step"] for r in first_log]
    assert (second / "sft" / "model" / "config.json").is_file()            # trained again

    assert rp.main(["--runs-dir", str(second), "--check"]) == 0
    check = capsys.readouterr().out
    # same code, same seed, same CPU: the re-trained model gives the saved verdicts
    assert "sft: EM" in check and "verdicts differ on 0 of 3 questions" in check


def test_report_only_writes_an_interim_report_of_the_finished_phases(tmp_path, capsys):
    ss = _load("small_scale")
    runs, out = tmp_path / "runs", tmp_path / "interim"
    args = [*STUDY, "--runs-dir", str(runs), "--out", str(out), "--report-only"]
    assert ss.main(args) == 2                                   # nothing ran here yet
    assert "nothing has finished" in capsys.readouterr().err
    assert ss.main([*STUDY, "--runs-dir", str(runs), "--out", str(tmp_path / "full")]) == 0
    full = json.loads((tmp_path / "full" / "small_scale.json").read_text())
    # the study as it stood before its RL run finished: the same file without that run
    state = json.loads((runs / "progress.json").read_text())
    state["records"].pop("grpo_masked"), state["rl"].pop("grpo_masked")
    (runs / "progress.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert ss.main(args) == 0
    md = (out / "small_scale.md").read_text()
    assert "**Interim report**" in md and "grpo_masked: 0 of 1 seeds" in md
    assert "| (c) SFT only" in md and "SFT→GRPO" not in md
    interim = json.loads((out / "small_scale.json").read_text())
    assert interim["stats"]["sft"] == full["stats"]["sft"] and (out / "small_scale.png").is_file()
    assert json.loads((runs / "progress.json").read_text()) == state     # read, never written
    # the settings are checked as --resume checks them
    assert ss.main([*args, "--seeds", "2"]) == 2
    assert "--report-only" in capsys.readouterr().err


def test_restore_refuses_a_machine_that_has_the_study_and_a_run_without_its_log(tmp_path):
    rp = _load("restore_progress")
    raw = tmp_path / "committed"
    (raw / "grpo_masked_seed0").mkdir(parents=True)
    rec = [{"task_index": 0, "type": "single_hop", "em": 1.0}]
    (raw / "heldout_records.json").write_text(json.dumps({"records": {"sft": [rec], "grpo_masked": [rec]}}))
    with pytest.raises(SystemExit, match="train_log.csv is missing"):
        rp.main(["--runs-dir", str(tmp_path / "runs"), "--raw", str(raw), "--", *STUDY])
    (raw / "grpo_masked_seed0" / "train_log.csv").write_text("step,rollout/success_rate\n1,0.5\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "progress.json").write_text("{}")
    with pytest.raises(SystemExit, match="exists: this machine has the study"):
        rp.main(["--runs-dir", str(tmp_path / "runs"), "--raw", str(raw), "--", *STUDY])


def test_save_keeps_the_recorded_run_when_its_folder_holds_a_retrain(tmp_path):
    """``--retrain`` trains a finished run again in its own folder; saving must not put the new run's (partial)
    log over the committed one: the new run's files go to RUN/retrained/ once it has finished, and a retrain
    still under way (or stopped part way) is not saved at all."""
    rp = _load("restore_progress")
    runs, raw = tmp_path / "runs", tmp_path / "committed"
    run = runs / "grpo_masked_seed0"
    run.mkdir(parents=True)
    (runs / "progress.json").write_text(json.dumps({"records": {}, "rl": {"grpo_masked": [{}]}}))
    (run / "train_log.csv").write_text("step,reward\n1,0.1\n2,0.2\n")
    (run / "config.yaml").write_text("seed: 0\n")
    assert rp.save(runs, raw) == ["grpo_masked_seed0"]
    assert (raw / "grpo_masked_seed0" / "train_log.csv").read_text().endswith("2,0.2\n")
    assert rp.save(runs, raw) == ["grpo_masked_seed0"]          # unchanged: saved again in place
    (run / "train_log.csv").write_text("step,reward\n1,0.3\n")   # the retrain, one step in
    assert rp.save(runs, raw) == []                              # under way: nothing of it is a result yet
    assert (raw / "grpo_masked_seed0" / "train_log.csv").read_text().endswith("2,0.2\n")   # the recorded run kept
    assert not (raw / "grpo_masked_seed0" / "retrained").exists()
    (run / "train_log.csv").write_text("step,reward\n1,0.3\n2,0.4\n")
    (run / "retrained.json").write_text('{"em": 0.3}')             # the retrain finished
    assert rp.save(runs, raw) == ["grpo_masked_seed0/retrained"]
    assert (raw / "grpo_masked_seed0" / "train_log.csv").read_text().endswith("2,0.2\n")
    assert (raw / "grpo_masked_seed0" / "retrained" / "train_log.csv").read_text().endswith("2,0.4\n")
    assert (raw / "grpo_masked_seed0" / "retrained" / "retrained.json").is_file()


def test_save_leaves_the_committed_records_alone_when_they_have_not_changed(tmp_path):
    """A study restored on a new machine holds the committed records, its phases in another order: saving it
    must not rewrite the committed file (a diff of thousands of lines that changes nothing)."""
    rp = _load("restore_progress")
    runs, raw = tmp_path / "runs", tmp_path / "committed"
    runs.mkdir(), raw.mkdir()
    rec = {"sft": [[{"task_index": 0, "em": 1.0}]], "none_base": [[{"task_index": 0, "em": 0.0}]]}
    committed = json.dumps({"note": "kept", "records": rec}, indent=1)
    (raw / "heldout_records.json").write_text(committed)
    reordered = {"none_base": rec["none_base"], "sft": rec["sft"]}
    (runs / "progress.json").write_text(json.dumps({"records": reordered, "rl": {}}))
    rp.save(runs, raw)
    assert (raw / "heldout_records.json").read_text() == committed          # byte for byte
    reordered["sft"] = [[{"task_index": 0, "em": 0.0}]]                     # a record that did change
    (runs / "progress.json").write_text(json.dumps({"records": reordered, "rl": {}}))
    rp.save(runs, raw)
    saved = json.loads((raw / "heldout_records.json").read_text())
    assert saved == {"note": "kept", "records": reordered}
