"""Data-parallel training on torch.distributed: real gloo processes under torchrun (CPU).

* two processes updating on a fixed global batch give the parameters of one process, up to fp32
  summation order (:func:`assert_same_update`), and a deliberately wrong all-reduce is caught;
* ``torchrun -m agentgym.app.cli train`` runs end to end, only rank 0 writes;
* a killed-and-resumed two-process run matches an uninterrupted one.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from agentgym.policies.transformers_policy import TransformersPolicy
from helpers_processes import kill_once_written

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

UPDATE_SCRIPT = textwrap.dedent("""
    import sys, torch
    import torch.distributed as dist
    from agentgym.algorithms.loop.distributed import init_from_env
    from agentgym.algorithms import GRPOConfig, OptimConfig, PPOConfig, ReinforceConfig, make_learner
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

    def run(algo, out, fsdp=False, kl_coef=0.0, critic="head"):
        ctx = init_from_env()
        torch.manual_seed(0)
        policy = TransformersPolicy.tiny_random(seed=0)
        batch = fixed_batch(policy)             # sampled before any sharding
        config = {"ppo": PPOConfig, "grpo": GRPOConfig, "reinforce": ReinforceConfig}[algo]
        extra = {"critic": critic} if algo == "ppo" else {}
        learner = make_learner(algo, policy, config(micro_batch_size=1, seed=0, kl_coef=kl_coef, **extra),
                               optim=OptimConfig(lr=1e-3), fsdp=fsdp)
        m = learner.update(batch)
        state = {k: v.detach().clone() for k, v in learner.full_model_state().items()}   # all ranks (FSDP)
        if getattr(learner, "value_head", None) is not None and learner.critic is None:
            state.update({"value_head." + k: v for k, v in learner.value_head.state_dict().items()})
        if learner.critic is not None:
            if fsdp:
                from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
                cs = get_model_state_dict(learner.critic, options=StateDictOptions(full_state_dict=True))
            else:
                cs = learner.critic.state_dict()
            state.update({"critic." + k: v.detach().clone() for k, v in cs.items()})
        if ctx is None or ctx.is_main:
            torch.save({"state": state, "metrics": m,
                        "sharded": [type(p).__name__ for p in learner.model.parameters()][:1]}, out)
        if ctx is not None:
            dist.destroy_process_group()

    import os
    if os.environ.get("WRONG_ALL_REDUCE"):   # negative control: the test must catch a broken reduction
        import agentgym.algorithms.loop.distributed as D
        right = D.all_reduce_gradients
        def wrong(params, ctx, average=False):
            if os.environ["WRONG_ALL_REDUCE"] == "skip":
                return                                     # each rank keeps only its own gradients
            right(params, ctx, average=True)               # averaged where the learner needs the sum
        D.all_reduce_gradients = wrong

    run(sys.argv[1], sys.argv[2], fsdp=len(sys.argv) > 3 and sys.argv[3] == "fsdp",
        kl_coef=float(sys.argv[4]) if len(sys.argv) > 4 else 0.0, critic=sys.argv[5] if len(sys.argv) > 5 else "head")
""")


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    p = tmp_path_factory.mktemp("dist") / "update.py"
    p.write_text(UPDATE_SCRIPT)
    return p


LR = 1e-3   # the scripts' learning rate: AdamW's first step moves each weight by about LR


def update_mismatch(a: dict, b: dict, lr: float = LR) -> list[str]:
    """Where two one-step updates of the same weights differ by more than fp32 summation order explains.

    Two processes add the same per-sample gradients in another order (each rank accumulates its
    micro-batches, then one all-reduce), which changes a gradient entry by a few ulps of its partial
    sums — how many depends on the CPU's kernels (bit-equal on the Xeon this was written on, 1.1e-6
    on an AMD EPYC). AdamW's first step is ``lr·g/(|g| + eps)``: where ``|g| ≫ eps`` that is ``±lr``
    whatever the rounding; only entries whose gradient is itself ~eps (near-cancelling sums) move by a
    visible share of ``lr``. So the bound is relative to the update's size: all but one entry in a
    million within 1 % of ``lr`` and none beyond 10 % (on the Intel Xeon with AMX, 2026-11-28, after
    Math-v0's train tasks changed: 1 entry of 6.4 M at 1.14 % of lr, the next at 0.016 %), and all but one
    in 10 000 within 0.1 % of it. A real divergence — a rank's gradients missing, or averaged where they
    must be summed — moves a large share of the entries by ~``lr`` (the negative-control test below
    checks that this function reports it)."""
    problems = []
    diffs = torch.cat([(v - b["state"][k]).abs().reshape(-1) for k, v in a["state"].items()])
    outliers = int((diffs > 1e-2 * lr).sum())
    if outliers > max(1, diffs.numel() // 1_000_000) or diffs.max().item() > 1e-1 * lr:
        problems.append(f"max |difference| {diffs.max().item():.3g}: {outliers} entries > 1 % of lr")
    share = (diffs > 1e-3 * lr).float().mean().item()
    if share > 1e-4:
        problems.append(f"{share:.2%} of the entries differ by > 0.1 % of lr")
    for key in ("loss", "policy_loss", "grad_norm"):
        if a["metrics"][key] != pytest.approx(b["metrics"][key], rel=1e-5, abs=1e-6):
            problems.append(f"{key}: {a['metrics'][key]} vs {b['metrics'][key]}")
    return problems


def _one_and_two(script, tmp_path, algo, *args: str, env: dict | None = None) -> tuple[dict, dict]:
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    r = subprocess.run([sys.executable, str(script), algo, str(one), *args], capture_output=True, text=True,
                       env=ENV, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    mode = ["fsdp", *args[1:]] if args else []
    r = subprocess.run([*TORCHRUN, str(script), algo, str(two), *mode], capture_output=True, text=True,
                       env=env or ENV, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(one), torch.load(two)


@pytest.mark.parametrize("algo", ["grpo", "ppo", "reinforce"])
def test_two_processes_match_one_on_a_fixed_global_batch(script, tmp_path, algo):
    a, b = _one_and_two(script, tmp_path, algo)
    assert a["metrics"]["optimizer_steps"] == b["metrics"]["optimizer_steps"] == 1
    # 6 micro-batches: 3 on each rank; gradients summed across ranks = accumulated in one process
    assert set(a["state"]) == set(b["state"])
    assert update_mismatch(a, b) == []
    start = TransformersPolicy.tiny_random(seed=0).model.state_dict()
    assert max((a["state"][k] - v).abs().max().item() for k, v in start.items()) > 1e-4   # it did learn
    assert a["metrics"]["advantage_std"] == pytest.approx(b["metrics"]["advantage_std"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("wrong", ["skip", "average"])
def test_a_wrong_all_reduce_is_caught(script, tmp_path, wrong):
    """The tolerance above is loose enough for summation order, and no looser: a reduction that drops
    the other rank's gradients, or averages where the learner needs their sum, fails it."""
    a, b = _one_and_two(script, tmp_path, "grpo", env={**ENV, "WRONG_ALL_REDUCE": wrong})
    assert update_mismatch(a, b) != []


@pytest.mark.parametrize("algo,kl,critic", [("grpo", "0.1", "head"), ("ppo", "0.0", "head"), ("ppo", "0.1", "model")])
def test_fsdp2_two_processes_match_one_process(script, tmp_path, algo, kl, critic):
    """FSDP2 (``fully_shard``) on CPU with gloo: the policy, the KL reference and a separate critic are
    sharded across two processes; one update on a fixed global batch equals one unsharded process."""
    a, b = _one_and_two(script, tmp_path, algo, "plain", kl, critic)
    assert b["sharded"] == ["DTensor"] and a["sharded"] == ["Parameter"]   # the path under test really sharded
    assert a["metrics"]["optimizer_steps"] == b["metrics"]["optimizer_steps"] == 1
    assert set(a["state"]) == set(b["state"])
    # FSDP reduces per shard: another summation order, the same bound as the DDP test above
    assert update_mismatch(a, b) == []
    start = TransformersPolicy.tiny_random(seed=0).model.state_dict()
    assert max((a["state"][k] - v).abs().max().item() for k, v in start.items()) > 1e-4   # it did learn
    if critic == "model" or algo == "ppo":
        assert a["metrics"]["value_loss"] == pytest.approx(b["metrics"]["value_loss"], rel=1e-5, abs=1e-6)


TINY = ["model=tiny-random", "algo=grpo", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4",
        "eval.episodes=2", "optim.lr=1e-3", "learner.micro_batch_size=1", "tensorboard=false",
        "env=Arithmetic-v0", "env_kwargs={hard_fraction: 0.0, max_turns: 2}"]


def _train(out: Path, *extra: str) -> list[str]:
    return [*TORCHRUN, "-m", "agentgym.app.cli", "train", *TINY, f"output_dir={out}", *extra]


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "train_log.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("mode", [(), ("fsdp=true", "algo=ppo", "learner.kl_coef=0.05")], ids=["ddp", "fsdp2-ppo-kl"])
def test_torchrun_train_end_to_end_and_resume_after_a_kill(tmp_path, mode):
    """Data-parallel (gloo all-reduce) and FSDP2 (policy, reference and optimizer state sharded; an
    unsharded HF sampler per rank): the run, its checkpoints and a resume after SIGKILL."""
    full = tmp_path / "full"
    r = subprocess.run(_train(full, "steps=3", "checkpoint_every=1", *mode), capture_output=True, text=True,
                       env=ENV, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(full)
    assert [float(x["step"]) for x in rows] == [1.0, 2.0, 3.0]
    assert all(float(x["rollout/episodes"]) == 4 for x in rows)       # both ranks' groups in every step
    assert r.stdout.count("[train]") == 1                               # only rank 0 speaks
    assert (full / "curves.png").exists() and (full / "evals.json").exists()

    killed = tmp_path / "killed"
    kill_once_written(_train(killed, "steps=3", "checkpoint_every=1", *mode), killed / "checkpoints" / "step_000002", ENV,
                      out_dir=killed)
    r = subprocess.run(_train(killed, "steps=3", "checkpoint_every=1", "--resume", *mode), capture_output=True,
                       text=True, env=ENV, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = _rows(killed)
    assert [float(x["step"]) for x in resumed] == [1.0, 2.0, 3.0]
    for a, b in zip(rows, resumed):
        for key in ("rollout/reward_mean", "train/loss", "train/grad_norm", "rollout/generated_tokens"):
            assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-5, abs=1e-6), (a["step"], key)
    # the checkpoint holds full (gathered) weights under the model's own names, whatever wrote it
    from safetensors.torch import load_file
    ckpt = sorted((killed / "checkpoints").glob("step_*[0-9]"))[-1] / "model"
    saved = {}
    for f in ckpt.glob("*.safetensors"):
        saved.update(load_file(f))
    start = TransformersPolicy.tiny_random(seed=0).model.state_dict()
    assert {k: tuple(v.shape) for k, v in saved.items()} == {k: tuple(v.shape) for k, v in start.items()
                                                             if k in saved}
    assert len(saved) >= len(start) - 1                                  # a tied lm_head may be left out


def test_fsdp_without_torchrun_is_a_clear_error(tmp_path, capsys):
    from agentgym.app.cli import main
    code = main(["train", *TINY, "fsdp=true", "steps=1", f"output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code != 0 and "fsdp=true needs torchrun" in err and "Traceback" not in err


def test_fsdp_under_torchrun_at_world_size_one_trains_as_one_process(tmp_path):
    """One rank (a one-GPU machine, say): fsdp=true is accepted, says there is nothing to shard, and trains."""
    out = tmp_path / "one"
    cmd = [*TORCHRUN[:-1], "1", "-m", "agentgym.app.cli", "train", *TINY, "fsdp=true", "steps=2",
           f"output_dir={out}"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "nothing to shard" in r.stdout
    assert [float(x["step"]) for x in _rows(out)] == [1.0, 2.0]
