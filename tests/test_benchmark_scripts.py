"""The benchmark scripts still run against the current API (a renamed config field once broke
``learner_throughput.py`` on every device without any test noticing). Tiny sizes; no timing asserted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_learner_throughput_runs_both_sides_on_the_tiny_model(tmp_path):
    out = tmp_path / "lt.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learner_throughput.py"), "--model-config", "tiny",
                        "--batch", "4", "--group-size", "2", "--prompt-len", "8", "--completion-len", "8",
                        "--repeats", "1", "--threads", "1", "--profile", "5", "--out", str(out)],
                       capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    learner = json.loads(out.read_text())["learner"]
    assert learner["tokens_per_update"] == 4 * 16 and learner["loss_tokens_per_update"] == 4 * 8
    for side in ("agentgym GRPOLearner", "trl GRPOTrainer"):
        assert learner[side]["median_s"] > 0 and learner[side]["tokens_per_s"] > 0
    assert learner["ours_speedup_vs_trl"] > 0
    # --profile: one more update per side under torch.profiler, its costliest ops in a table
    for side in ("agentgym GRPOLearner", "trl GRPOTrainer"):
        table = learner["profile"][side]
        assert "Self CPU" in table and "aten::" in table, table[:500]
        assert f"[profile] {side}, one update:" in r.stdout


def test_learner_throughput_refuses_a_negative_profile_count():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learner_throughput.py"), "--profile", "-1"],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode != 0 and "--profile must be >= 0" in r.stderr and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- the other scripts
def _run(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``benchmarks/<script> args`` as a user runs it; fails the test with its stderr if it fails."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                       capture_output=True, text=True, env=ENV, timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, f"{script} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def _have(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def _code_sandbox() -> bool:
    """A sandbox CodeExec-v0's ``sandbox="auto"`` can use (docker or bwrap)."""
    from agentgym.envs.services.sandbox import available_backends
    status = available_backends()
    return "ok" in (status.get("docker"), status.get("bwrap"))


def test_rollout_overhead_formats_and_collects(tmp_path):
    out = tmp_path / "ro.json"
    _run("rollout_overhead.py", "--policy", "tiny-random", "--episodes", "2", "--max-new-tokens", "8",
         "--repeats", "2", "--out", str(out))
    res = json.loads(out.read_text())
    for style in ("chat", "continuation"):
        f = res[f"format_{style}"]
        assert f["turn1_us"] > 0 and f["turn16_us"] > 0 and f["naive_turn16_us"] > 0
    engine = res["engine"]
    assert engine["episodes"] == 2 and engine["generated_tokens"] > 0
    assert engine["time/wall_s"] > 0 and 0 <= engine["time/outside_generate_frac"] <= 1


def test_logit_positions_times_both_choices_with_equal_logprobs(tmp_path):
    out = tmp_path / "lp.json"
    _run("logit_positions.py", "--episodes", "2", "--group-size", "2", "--prompt-len", "12", "--policy-len", "12",
         "--obs-len", "22", "--turns", "2", "--micro-batch-size", "2", "--repeats", "1", "--threads", "1",
         "--out", str(out))
    res = json.loads(out.read_text())
    kept = res["first_micro_batch"]
    assert 0 < kept["after"] <= kept["before"] < kept["width"]
    assert res["max_logprob_diff_at_loss_tokens"] < 1e-4
    for side in ("before", "after"):
        assert len(res["seconds"][side]) == 1 and res["median_s"][side] > 0
    assert res["speedup"] > 0


def test_overlap_runs_on_policy_and_overlapped(tmp_path):
    out = tmp_path / "ov.json"
    _run("overlap.py", "--steps", "2", "--repeats", "1", "--threads", "1", "--out", str(out),
         "model=tiny-random", "groups_per_step=1", "group_size=2", "rollout.sampling.max_new_tokens=4")
    res = json.loads(out.read_text())
    assert [r["max_staleness"] for r in res["runs"]] == [0, 1]
    for r in res["runs"]:
        assert r["steps_wall_s"] > 0 and len(r["staleness"]) == 2 and len(r["batch_reward"]) == 2
    assert len(res["speedup_per_pair"]) == 1 and res["speedup_per_pair"][0] > 0


def test_rollout_async_lockstep_and_async_agree(tmp_path):
    out = tmp_path / "ra.json"
    _run("rollout_async.py", "--policies", "tiny-random,scripted", "--backends", "hf", "--envs", "math",
         "--episodes", "2", "--max-new-tokens", "4", "--threads", "1", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["policy"], r["env"]) for r in rows] == [("tiny-random", "math"), ("scripted", "math")]
    for r in rows:
        assert r["same_trajectories"] == 1.0  # greedy: both schedules produce the same episodes
        for mode in ("lockstep", "async"):
            assert r[mode]["wall_s"] > 0 and r[mode]["generate_calls"] >= 1 and r[mode]["turns_mean"] == 1.0


def test_kv_reuse_pairs_turns_with_and_without_reuse(tmp_path):
    out = tmp_path / "kv.json"
    _run("kv_reuse.py", "--threads", "1", "--batch", "1", "--turns", "2", "--prompt-tokens", "16",
         "--obs-tokens", "8", "--new-tokens", "4", "--repeats", "1", "--out", str(out))
    res = json.loads(out.read_text())
    assert res["identical_ids"] is True
    assert [t["turn"] for t in res["reuse"]] == [t["turn"] for t in res["no_reuse"]] == [1, 2]
    assert res["reuse"][1]["reused_tokens"] > 0 and res["no_reuse"][1]["reused_tokens"] == 0
    assert all(t["seconds"] > 0 for t in res["reuse"] + res["no_reuse"])


def test_generation_hf_side(tmp_path):
    """The HF engine only (vLLM's side needs vLLM and ~4 GB for its KV cache); no weight-sync models."""
    out = tmp_path / "gen.json"
    _run("generation.py", "--threads", "1", "--backends", "hf", "--dtypes", "float32", "--batches", "1",
         "--prompt-tokens", "16", "--new-tokens", "4", "--bound-repeats", "1", "--sync-models", "--out", str(out))
    res = json.loads(out.read_text())
    (gen,) = res["generation"]
    assert gen["backend"] == "hf" and gen["dtype"] == "float32"
    (row,) = gen["rows"]
    assert row["batch"] == 1 and row["turn1_tokens"] > 0 and row["turn2_tokens"] > 0
    assert row["turn1_tokens_per_s"] > 0 and row["bound"]["bound_tokens_per_s"] > 0
    assert res["sync"] == []


def test_peers_env_steps_ours_alone(tmp_path):
    """``--sides ours``: the A/B mode that needs no peers (GEM and SkyRL-Gym are not installed here)."""
    out = tmp_path / "peers.json"
    _run("peers_env_steps.py", "--sides", "ours", "--math-episodes", "4", "--search-episodes", "2",
         "--repeats", "1", "--out", str(out))
    res = json.loads(out.read_text())
    assert set(res["math"]) == {"agentgym Math-v0 (reset by index)", "agentgym Math-v0 (reset with task dict)"}
    for section in ("math", "search_bm25", "search_cached"):
        for side in res[section].values():
            assert side["us_per_step_incl_reset"] > 0
            assert side["mean_return"] == 1.0  # scripted gold answers
    assert next(iter(res["search_bm25"].values()))["steps_per_episode"] == 2.0  # search, then answer


def test_retrieval_throughput_and_recall(tmp_path):
    out = tmp_path / "ret.json"
    _run("retrieval.py", "--docs", "50", "--queries", "4", "--threads", "1", "--server", "thread", "--out", str(out))
    res = json.loads(out.read_text())
    assert set(res["throughput_qps"]) == {"dense-flat", "bm25"}
    for row in res["throughput_qps"].values():
        assert row["in-process b=1"] > 0 and row["HTTP 1 client"] > 0 and row["HTTP 8 clients"] > 0
    assert set(res["recall"]) == {"dense-flat", "dense-hnsw", "dense-ivf", "dense-ivf-wide", "bm25"}
    for rec in res["recall"].values():
        assert 0 <= rec["1"] <= rec["3"] <= rec["5"] <= 1


def test_retrieval_server_load_on_a_bm25_index(tmp_path):
    """A BM25 index of the bundled world: the server starts in seconds (the dense default encodes the
    corpus first); the script's path (start, load, stop) is the same."""
    index = tmp_path / "index"
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "retriever", "build-index", "bundled",
                        "--kind", "bm25", "--out", str(index)], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "load.json"
    _run("retrieval_server_load.py", "--clients", "2", "--duration-s", "2", "--max-requests", "10",
         "--index", str(index), "--out", str(out))
    res = json.loads(out.read_text())
    assert res["errors"] == 0 and 0 < res["requests_ok"] <= 10
    assert res["server"]["kind"] == "bm25" and res["server"]["num_docs"] > 0
    assert res["p50_ms"] > 0 and res["server_mean_batch"] >= 1


def test_sandbox_throughput(tmp_path):
    """The subprocess backend always runs; bwrap joins where it is available (the script skips what is not)."""
    out = tmp_path / "sb.json"
    _run("sandbox.py", "--runs", "2", "--slow-runs", "2", "--threads", "1", "--backends", "bwrap", "subprocess",
         "--pool-size", "1", "--out", str(out))
    from agentgym.envs.services.sandbox import available_backends
    rows = json.loads(out.read_text())["rows"]
    want = {"subprocess"} | ({"bwrap"} if available_backends().get("bwrap") == "ok" else set())
    assert {r["backend"] for r in rows} == want
    assert len(rows) == 3 * len(want)  # three programs each, one caller-thread count
    for r in rows:
        assert r["failures"] == 0 and r["exec_per_s"] > 0 and r["bare_exec_per_s"] > 0


@pytest.mark.skipif(not _have("ray"), reason="ray not installed: bash scripts/setup.sh installs it")
@pytest.mark.skipif(not _code_sandbox(), reason="CodeExec-v0 needs a docker or bwrap sandbox")
def test_scale_out_envs_section(tmp_path):
    """The CodeExec-v0 section only (thread pool vs Ray env actors); the others take minutes even tiny."""
    out = tmp_path / "so.json"
    _run("scale_out.py", "--model", "tiny-random", "--episodes", "1", "--sections", "envs", "--out", str(out))
    res = json.loads(out.read_text())["envs_codeexec"]
    for backend in ("thread", "ray"):
        assert res[backend]["episodes"] == 1 and res[backend]["wall_s"] > 0
        assert res[backend]["success"] == 1.0  # the oracle's programs pass
    assert res["actor_call_ms"] > 0


def test_collate_speed_checks_against_an_older_commit():
    r = _run("collate_speed.py", "--batch", "4", "--prompt", "8", "--response", "16", "--turns", "2", "--repeats", "2",
             "--baseline-rev", "HEAD")
    assert "same tensors as HEAD: True" in r.stdout and "median ratio" in r.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "collate_speed.py"), "--batch", "0"],
                         capture_output=True, text=True, env=ENV, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.skipif(not _code_sandbox(), reason="no isolating sandbox (docker or bwrap) on this machine")
def test_humaneval_speed_times_the_oracle(tmp_path):
    out = tmp_path / "he.json"
    from agentgym.envs.services.sandbox import available_backends
    backend = "bwrap" if available_backends().get("bwrap") == "ok" else "docker"
    _run("humaneval_speed.py", "--backends", backend, "--problems", "2", "--out", str(out))
    res = json.loads(out.read_text())["backends"][backend]
    assert res["episodes"] == 2 and res["passed"] == 2 and 0 < res["median_s"] <= res["max_s"]


@pytest.mark.skipif(not _have("openenv"), reason="openenv-core (the 'protocols' extra) is not installed")
def test_openenv_server_benchmark_runs_both_servers():
    r = _run("openenv_server.py", "--sessions", "2", "--seconds", "1", "--rounds", "2", timeout=300)
    rounds = re.findall(r"^\s+(\d) (ours|openenv)\s", r.stdout, re.M)
    assert rounds == [("1", "ours"), ("1", "openenv"), ("2", "openenv"), ("2", "ours")]  # alternating order
    assert "median ratio ours/openenv" in r.stdout


def test_hf_sampling_benchmark_times_both_samplers(tmp_path):
    out = tmp_path / "hs.json"
    r = _run("hf_sampling.py", "--model", "tiny-random", "--new-tokens", "3", "--batch", "4", "--repeats", "1",
             "--threads", "1", "--out", str(out))
    data = json.loads(out.read_text())
    assert set(data["arms"]) == {"multinomial", "inverse_cdf"}
    assert data["batch"] == 4 and data["new_tokens"] == 3 and data["machine"]["threads"] == 1
    assert all(a["generate_s_median"] > 0 and a["draw_ms_median"] > 0 for a in data["arms"].values())
    assert "inverse_cdf vs multinomial" in r.stdout


def test_hf_sampling_benchmark_refuses_a_zero_count():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hf_sampling.py"), "--repeats", "0"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and "must be >= 1" in r.stderr and "Traceback" not in r.stderr
