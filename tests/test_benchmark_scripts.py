"""The benchmark scripts still run against the current API (a renamed config field once broke
``learner_throughput.py`` on every device without any test noticing). Tiny sizes; no timing asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_learner_throughput_runs_both_sides_on_the_tiny_model(tmp_path):
    out = tmp_path / "lt.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learner_throughput.py"), "--model-config", "tiny",
                        "--batch", "4", "--group-size", "2", "--prompt-len", "8", "--completion-len", "8",
                        "--repeats", "1", "--threads", "1", "--out", str(out)],
                       capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    learner = json.loads(out.read_text())["learner"]
    assert learner["tokens_per_update"] == 4 * 16 and learner["loss_tokens_per_update"] == 4 * 8
    for side in ("agentgym GRPOLearner", "trl GRPOTrainer"):
        assert learner[side]["median_s"] > 0 and learner[side]["tokens_per_s"] > 0
    assert learner["ours_speedup_vs_trl"] > 0
