"""Data-parallel training on torch.distributed: real gloo processes under torchrun (CPU).

* two processes updating on a fixed global batch give the parameters of one process (≤ 1e-6);
* ``torchrun -m agentgym.cli train`` runs end to end, only rank 0 writes;
* a killed-and-resumed two-process run matches an uninterrupted one.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from agentgym.policies.transformers_policy import TransformersPolicy

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

UPDATE_SCRIPT = textwrap.dedent("""
    import sys, torch
    import torch.distributed as dist
    from agentgym.algorithms.distributed import init_from_env
    from agentgym.algorithms.learners import LearnerConfig, make_learner
    from agentgym.policies.transformers_policy import TransformersPolicy
    from agentgym.policy import SamplingParams
    from agentgym.rollout import RolloutConfig, RolloutEngine

    def fixed_batch(policy):
        engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=6, seed=0)))
        kwargs = {"kinds": ["arithmetic"], "difficulty": 0, "max_turns": 1}
        trajs = engine.collect("Math-v0", num_groups=3, group_size=2, seed=0, env_kwargs=kwargs).trajectories
        engine.close()
        for i, t in enumerate(trajs):       # a reward spread, so every learner has a signal
            t.step_rewards = [float(i % 3)]
        return trajs

    def run(algo, out):
        ctx = init_from_env()
        torch.manual_seed(0)
        policy = TransformersPolicy.tiny_random(seed=0)
        learner = make_learner(algo, policy, LearnerConfig(lr=1e-3, micro_batch_size=1, seed=0))
        m = learner.update(fixed_batch(policy))
        if ctx is None or ctx.is_main:
            state = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
            if getattr(learner, "value_head", None) is not None:
                state.update({"value_head." + k: v for k, v in learner.value_head.state_dict().items()})
            torch.save({"state": state, "metrics": m}, out)
        if ctx is not None:
            dist.destroy_process_group()

    run(sys.argv[1], sys.argv[2])
""")


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    p = tmp_path_factory.mktemp("dist") / "update.py"
    p.write_text(UPDATE_SCRIPT)
    return p


@pytest.mark.parametrize("algo", ["grpo", "ppo", "reinforce"])
def test_two_processes_match_one_on_a_fixed_global_batch(script, tmp_path, algo):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    r = subprocess.run([sys.executable, str(script), algo, str(one)], capture_output=True, text=True, env=ENV,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([*TORCHRUN, str(script), algo, str(two)], capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = torch.load(one), torch.load(two)
    assert a["metrics"]["optimizer_steps"] == b["metrics"]["optimizer_steps"] == 1
    # 6 micro-batches: 3 on each rank; gradients summed across ranks = accumulated in one process
    for k, v in a["state"].items():
        assert (v - b["state"][k]).abs().max().item() <= 1e-6, k
    start = TransformersPolicy.tiny_random(seed=0).model.state_dict()
    assert max((a["state"][k] - v).abs().max().item() for k, v in start.items()) > 1e-4   # it did learn
    for key in ("loss", "policy_loss", "grad_norm", "advantage_std"):
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], rel=1e-5, abs=1e-6), key


TINY = ["model=tiny-random", "algo=grpo", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4",
        "eval.episodes=2", "learner.lr=1e-3", "learner.micro_batch_size=1", "tensorboard=false",
        "env=Arithmetic-v0", "env_kwargs={hard_fraction: 0.0, max_turns: 2}"]


def _train(out: Path, *extra: str) -> list[str]:
    return [*TORCHRUN, "-m", "agentgym.cli", "train", *TINY, f"output_dir={out}", *extra]


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "train_log.csv").open() as f:
        return list(csv.DictReader(f))


def test_torchrun_train_end_to_end_and_resume_after_a_kill(tmp_path):
    full = tmp_path / "full"
    r = subprocess.run(_train(full, "steps=3", "checkpoint_every=1"), capture_output=True, text=True, env=ENV,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(full)
    assert [float(x["step"]) for x in rows] == [1.0, 2.0, 3.0]
    assert all(float(x["rollout/episodes"]) == 4 for x in rows)       # both ranks' groups in every step
    assert r.stdout.count("[train]") == 1                               # only rank 0 speaks
    assert (full / "curves.png").exists() and (full / "evals.json").exists()

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train(killed, "steps=3", "checkpoint_every=1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV, start_new_session=True)
    deadline = time.monotonic() + 900
    try:
        while not (killed / "checkpoints" / "step_000002").exists():
            assert proc.poll() is None, "the run ended before its second checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    r = subprocess.run(_train(killed, "steps=3", "checkpoint_every=1", "--resume"), capture_output=True, text=True,
                       env=ENV, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = _rows(killed)
    assert [float(x["step"]) for x in resumed] == [1.0, 2.0, 3.0]
    for a, b in zip(rows, resumed):
        for key in ("rollout/reward_mean", "train/loss", "train/grad_norm", "rollout/generated_tokens"):
            assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-5, abs=1e-6), (a["step"], key)
