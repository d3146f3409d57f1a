"""Continue a Search-R1-in-a-box study on a machine that lacks its ``runs/`` folder.

A study of hours spans sessions, and a new machine starts without the gitignored run folder: its
``progress.json`` and its SFT model are gone, while each finished phase's raw files were committed
(``benchmarks/results/search_r1_v2_runs/``: ``heldout_records.json`` and each RL run's ``train_log.csv``).
This script writes ``RUNS_DIR/progress.json`` from those files, for ``small_scale.py --resume`` with the
same flags: the finished base-model baselines and RL runs are taken over; the SFT model is trained again
(same oracle episodes, seed and settings) and every phase that reads it (its own eval, ``--sft-baselines``)
runs again, so the re-trained model is measured against the committed one. The committed SFT records go to
``RUNS_DIR/restored_sft_records.json`` for that check (``--check``), which says on how many questions the
two SFT models' greedy verdicts differ.

    python benchmarks/search_r1/restore_progress.py --runs-dir runs/search_r1_v2 -- \\
        --config benchmarks/search_r1/configs/smollm2_v2.yaml --sft-baselines --seeds 3 --eval-per-type 30
    python benchmarks/search_r1/small_scale.py ... --runs-dir runs/search_r1_v2 --resume   # the same flags
    python benchmarks/search_r1/restore_progress.py --runs-dir runs/search_r1_v2 --check  # after its SFT eval
    python benchmarks/search_r1/restore_progress.py --runs-dir runs/search_r1_v2 --save   # before the session ends

The RL runs taken over were trained from the committed SFT model, later ones from the re-trained one;
``--check`` is what says whether those are the same model for the held-out questions.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

#: phases that read the SFT model: run again with the re-trained one
SFT_PHASES = ("sft", "none_sft", "rag_sft")


def history(path: Path) -> list[dict[str, float]]:
    """A run's ``train_log.csv`` as the rows ``small_scale.run_rl`` returns (numbers as floats)."""
    with path.open() as f:
        return [{k: float(v) if v not in ("", None) else float("nan") for k, v in row.items()}
                for row in csv.DictReader(f)]


def restore(raw: Path, runs_dir: Path, study_argv: list[str]) -> dict:
    import small_scale as ss
    if (runs_dir / "progress.json").exists():   # before any work: nothing here to rebuild
        raise SystemExit(f"error: {runs_dir / 'progress.json'} exists: this machine has the study; "
                         "run small_scale.py --resume instead")
    args = ss.parse_args([*study_argv, "--runs-dir", str(runs_dir)])
    cfg = ss.load_train_config(args)
    records = json.loads((raw / "heldout_records.json").read_text())["records"]
    kept = {k: v for k, v in records.items() if k not in SFT_PHASES}
    rl = {}
    for key, _, _ in ss.RL_ARMS:
        for seed in range(len(kept.get(key, []))):
            log_csv = raw / f"{key}_seed{seed}" / "train_log.csv"
            if not log_csv.exists():
                raise SystemExit(f"error: {log_csv} is missing: the RL run {key}_seed{seed} has records but no log")
            rl.setdefault(key, []).append({"history": history(log_csv),
                                           "output_dir": str(runs_dir / f"{key}_seed{seed}")})
    progress = ss.Progress(runs_dir / "progress.json", ss.fingerprint(args, cfg))
    progress.records, progress.rl = kept, rl
    runs_dir.mkdir(parents=True, exist_ok=True)
    progress.save()
    (runs_dir / "restored_sft_records.json").write_text(json.dumps(
        {"from": str(raw / "heldout_records.json"), "records": {k: records[k] for k in SFT_PHASES if k in records}}))
    return {"taken_over": progress.finished(), "again": [k for k in SFT_PHASES if k in records]}


#: what of a finished RL run is committed (its weights, 0.5 GB, are not)
RUN_FILES = ("train_log.csv", "curves.png", "alarms.json", "config.yaml")


def save(runs_dir: Path, raw: Path) -> list[str]:
    """The other way: this machine's finished phases into the committed raw files (before a session ends).
    Writes ``heldout_records.json`` from ``progress.json`` and each finished RL run's small files."""
    import shutil
    state = json.loads((runs_dir / "progress.json").read_text())
    raw.mkdir(parents=True, exist_ok=True)
    out = raw / "heldout_records.json"
    committed = json.loads(out.read_text()) if out.exists() else {}
    if committed.get("records") != state["records"]:   # unchanged records (a restored study) leave the file as it is
        note = committed.get("note") or (
            "held-out per-question records (greedy EM) of the finished runs, from RUNS_DIR/progress.json")
        out.write_text(json.dumps({"note": note, "records": state["records"]}, indent=1))
    copied = []
    for key, runs in state["rl"].items():
        for seed in range(len(runs)):
            src, dst = runs_dir / f"{key}_seed{seed}", raw / f"{key}_seed{seed}"
            if _holds_a_retrain(src, dst):   # the recorded run's files stay; the new run's go beside them
                if not (src / "retrained.json").exists():   # still training (or stopped part way): not a result
                    print(f"{src.name}: a --retrain is under way (no retrained.json yet): its files are not saved")
                    continue
                dst = dst / "retrained"
            dst.mkdir(parents=True, exist_ok=True)
            for name in (*RUN_FILES, "retrained.json"):
                if (src / name).exists():
                    shutil.copy2(src / name, dst / name)
            copied.append(str(dst.relative_to(raw)))
    return copied


def _holds_a_retrain(src: Path, dst: Path) -> bool:
    """Whether the run folder ``src`` now holds a ``--retrain`` of the finished run committed in ``dst`` (the
    retrain writes into the same folder): it has written ``retrained.json``, or its training log is no longer
    the committed one. A finished run's files do not change otherwise."""
    import filecmp
    if (src / "retrained.json").exists():
        return True
    log, kept = src / "train_log.csv", dst / "train_log.csv"
    return log.exists() and kept.exists() and not filecmp.cmp(log, kept, shallow=False)


def check(runs_dir: Path) -> int:
    """The re-trained SFT model's records against the committed ones, question by question."""
    old = json.loads((runs_dir / "restored_sft_records.json").read_text())["records"]
    new = json.loads((runs_dir / "progress.json").read_text())["records"]
    for key in SFT_PHASES:
        if key not in old or key not in new:
            print(f"{key}: {'not re-run yet' if key in old else 'not in the committed records'}")
            continue
        a = {r["task_index"]: r["em"] for r in old[key][0]}
        b = {r["task_index"]: r["em"] for r in new[key][0]}
        differ = sorted(i for i in a if a[i] != b.get(i))
        print(f"{key}: EM {sum(a.values()) / len(a):.3f} committed, {sum(b.values()) / len(b):.3f} re-trained; "
              f"verdicts differ on {len(differ)} of {len(a)} questions{': ' + str(differ) if differ else ''}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs-dir", required=True, help="the study's --runs-dir on this machine")
    p.add_argument("--raw", default=str(HERE.parent / "results" / "search_r1_v2_runs"),
                   help="the committed raw files (heldout_records.json, RUN/train_log.csv)")
    p.add_argument("--check", action="store_true", help="compare the re-trained SFT model's records with the committed ones")
    p.add_argument("--save", action="store_true",
                   help="the other way: write this machine's finished phases into --raw (records and RL run logs)")
    p.add_argument("study", nargs="*", help="after --: the study's flags, as given to small_scale.py")
    a = p.parse_args(argv)
    if a.check:
        return check(Path(a.runs_dir))
    if a.save:
        print(f"wrote {Path(a.raw) / 'heldout_records.json'} and the files of {', '.join(save(Path(a.runs_dir), Path(a.raw)))}")
        return 0
    done = restore(Path(a.raw), Path(a.runs_dir), a.study)
    print(f"wrote {Path(a.runs_dir) / 'progress.json'}: taken over {', '.join(done['taken_over'])}; "
          f"run again with a re-trained SFT model: SFT, {', '.join(done['again'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
