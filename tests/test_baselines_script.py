"""benchmarks/baselines.py: runs `agentgym eval` as a user types it, keeps what the model wrote (not the
token ids) and writes the summary table; checked with the oracle on one reasoning-gym task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "baselines.py"


def test_the_oracle_baseline_is_recorded_with_its_command_and_replies(tmp_path):
    out = tmp_path / "baselines"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--only", "reasoning_gym_flexible/chain_sum", "--model",
                           "oracle", "--backend", "hf", "--threads", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads((out / "summary.json").read_text())["reasoning_gym_flexible/chain_sum"]
    assert row["success"] == 1.0 and row["episodes"] == 50 and "answer_format=flexible" in row["command"]
    assert row["cpu"] and row["wall_s"] > 0
    record = json.loads((out / "reasoning_gym_flexible__chain_sum.json").read_text())
    assert "trajectories" not in record and len(record["episodes"]) == 50
    first = record["episodes"][0]
    assert first["actions"][0].startswith("<answer>") and first["episode"]["success"] is True
    assert "| reasoning_gym_flexible/chain_sum | 50 | 1.000 |" in (out / "summary.md").read_text()


def test_an_unknown_benchmark_is_one_line_naming_the_valid_ones():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--only", "humaneva"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "unknown benchmark(s) ['humaneva']; choose from ['humaneval'" in proc.stderr
