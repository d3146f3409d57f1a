"""Scale-out on a real local Ray cluster: envs in actors (same trajectories as the thread pool, failure
handling) and generation engines as Ray actors with weight pushes."""

from __future__ import annotations

import copy
import csv
import os
import threading

import pytest
import torch

ray = pytest.importorskip("ray", reason="ray not installed: bash scripts/setup.sh installs it")

from agentgym.policies.loading import load_tokenizer_for  # noqa: E402
from agentgym.policies.scripted import ScriptedPolicy  # noqa: E402
from agentgym.policies.transformers_policy import TransformersPolicy  # noqa: E402
from agentgym.policy import SamplingParams  # noqa: E402
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine


pytestmark = pytest.mark.usefixtures("ray_cluster")   # tests/conftest.py: a local Ray cluster


def _crash(actor) -> None:
    """Kill the actor's process (as a crash would) and wait until it is really gone: ``ray.kill`` alone
    is asynchronous, and a step sent right after it may still be served."""
    import signal

    from helpers_processes import wait_until_gone
    pid = ray.get(actor.pid.remote())
    os.kill(pid, signal.SIGKILL)
    wait_until_gone(pid, 30, "actor process")


def _key(t):
    return (t.token_ids, t.loss_mask, t.step_rewards, t.terminated, t.truncated, t.task_index, t.group_id)


@pytest.mark.parametrize("env_id, kwargs", [("Arithmetic-v0", {"max_turns": 3}),
                                            ("ToolCall-v0", {})])
def test_envs_in_actors_give_the_thread_pool_trajectories(env_id, kwargs):
    import agentgym
    oracle = agentgym.make(env_id).unwrapped.oracle
    out = {}
    for backend in ("thread", "ray"):
        policy = ScriptedPolicy(load_tokenizer_for("tiny-random"), oracle)
        engine = RolloutEngine(policy, RolloutConfig(env_backend=backend, debug_checks=True))
        try:
            out[backend] = engine.collect(env_id, num_groups=2, group_size=2, seed=3, env_kwargs=kwargs).trajectories
        finally:
            engine.close()
    assert [_key(t) for t in out["thread"]] == [_key(t) for t in out["ray"]]
    assert all(t.episode.get("success") for t in out["ray"])


def test_a_killed_env_actor_truncates_only_its_episode_and_is_restarted():
    import agentgym
    from agentgym.ray_envs import make_ray_envs
    tok = load_tokenizer_for("tiny-random")
    envs = make_ray_envs("Arithmetic-v0", 1, {"max_turns": 3})
    victim = envs[0]
    obs, _ = victim.reset(seed=0, options={"task_index": 0})
    _crash(victim.actor)
    _, reward, terminated, truncated, info = victim.step("<answer>1</answer>")
    assert truncated and not terminated and reward == 0.0
    assert info["episode_summary"]["end_reason"].startswith("env_actor_failed")
    assert victim.restarts == 1
    obs, _ = victim.reset(seed=0, options={"task_index": 0})     # a fresh actor serves the next episode
    assert obs and obs[-1]["role"] == "user"
    victim.close()

    # inside a batch: kill one actor while the episodes run; the others finish normally
    oracle = agentgym.make("Arithmetic-v0").unwrapped.oracle
    killed = threading.Event()

    class KillOnce(ScriptedPolicy):
        def generate(self, prompts, sampling, contexts=None):
            if not killed.is_set():
                killed.set()
                pool = next(iter(engine_envs()))
                _crash(pool[0].actor)
            return super().generate(prompts, sampling, contexts=contexts)

    engine = RolloutEngine(KillOnce(tok, oracle), RolloutConfig(env_backend="ray"))

    def engine_envs():
        return engine._envs.values()
    try:
        batch = engine.collect("Arithmetic-v0", num_groups=3, group_size=1, seed=1, env_kwargs={"max_turns": 3})
    finally:
        engine.close()
    reasons = [t.episode.get("end_reason", "") for t in batch.trajectories]
    assert sum(r.startswith("env_actor_failed") for r in reasons) == 1
    assert sum(bool(t.episode.get("success")) for t in batch.trajectories) == 2


def test_rollout_workers_generate_like_one_engine_and_take_weight_pushes():
    from agentgym.policies.ray_pool import RayPolicyPool
    local = TransformersPolicy.tiny_random(seed=0)
    pool = RayPolicyPool("tiny-random", num_workers=2, seed=0)
    try:
        prompts = [local.tokenizer.encode(f"Question {i}: what is {i} + {i}?") for i in range(5)]
        greedy = SamplingParams(max_new_tokens=6, greedy=True)
        a, b = local.generate(prompts, greedy), pool.generate(prompts, greedy)
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        assert len({ray.get(w.pid.remote()) for w in pool.workers}) == 2       # two processes
        trained = copy.deepcopy(local.model)
        with torch.no_grad():
            for p in trained.parameters():
                p.add_(0.05 * torch.randn_like(p))
        assert pool.sync_weights(trained) > 0
        local.sync_weights(list(trained.state_dict().items()))
        a, b = local.generate(prompts, greedy), pool.generate(prompts, greedy)
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        for x, y in zip(a, b):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    finally:
        pool.close()


def test_rollout_workers_get_the_engine_dtype_the_run_precision_gives():
    """Ray rollout workers load their engine in the dtype placement resolves (a vLLM engine runs bf16 when
    the run's precision is bf16, as one engine does): the dtype reaches each actor's loader, and weight
    pushes from fp32 master weights are cast on load."""
    from agentgym.policies.ray_pool import RayPolicyPool
    pool = RayPolicyPool("tiny-random", num_workers=1, seed=0, dtype="bfloat16")
    try:
        assert ray.get(pool.workers[0].weight_dtypes.remote()) == ["torch.bfloat16"]
        trained = TransformersPolicy.tiny_random(seed=1).model          # fp32 master weights
        assert pool.sync_weights(trained) > 0
        assert ray.get(pool.workers[0].weight_dtypes.remote()) == ["torch.bfloat16"]
        local = TransformersPolicy.tiny_random(seed=0)
        prompt = [local.tokenizer.encode("What is 2 + 2?")]
        assert len(pool.generate(prompt, SamplingParams(max_new_tokens=4, greedy=True))[0].token_ids) > 0
    finally:
        pool.close()


def test_placement_gives_ray_vllm_workers_the_run_s_bf16(monkeypatch):
    """The placement rule hands Ray rollout workers the engine dtype it gives one engine: bf16 for a vLLM
    sampler when the run's precision is bf16, the loader's default otherwise (the pool's construction is
    recorded instead of starting vLLM engines in actors)."""
    import agentgym.policies.ray_pool as ray_pool
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.policies.placement import place_sampler
    from agentgym.precision import resolve_precision
    seen: dict = {}

    class Recorded(ray_pool.RayPolicyPool):
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)
            raise RuntimeError("recorded")

    monkeypatch.setattr(ray_pool, "RayPolicyPool", Recorded)
    cfg = TrainConfig(model="tiny-random", output_dir="unused", rollout_workers=1, backend="vllm")
    for precision, dtype in (("bf16", "bfloat16"), ("fp32", None)):
        seen.clear()
        with pytest.raises(RuntimeError, match="recorded"):
            place_sampler(cfg, "vllm", resolve_precision(precision, "cpu"), TransformersPolicy.tiny_random(seed=0))
        assert seen["dtype"] == dtype, precision


def test_train_with_ray_rollout_workers_and_env_actors(tmp_path):
    from agentgym.app.cli import main
    out = tmp_path / "run"
    assert main(["train", "model=tiny-random", "steps=2", "groups_per_step=2", "group_size=2",
                 "sampling.max_new_tokens=6", "eval.episodes=2", "tensorboard=false", "rollout_workers=2",
                 "rollout.env_backend=ray", f"output_dir={out}"]) == 0
    rows = list(csv.DictReader((out / "train_log.csv").open()))
    assert len(rows) == 2 and all(float(r["time/sync_s"]) > 0 for r in rows)
    assert all("train/sampler_logp_diff_mean" in r for r in rows)          # a separate sampler: recomputed
    assert float(rows[0]["train/sampler_logp_diff_mean"]) < 1e-4         # same weights, same kernels
