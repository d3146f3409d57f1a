"""Scale-out measurements on this machine, side by side in one run (issue 15).

1. CodeExec-v0 rollouts (real sandbox) with envs in Ray actors vs the local thread pool: episodes/s and
   the per-step overhead of an actor call (a no-op ``get_wrapper_attr`` round trip).
2. Generation: 2 Ray rollout workers vs 1 in-process engine (transformers, SmolLM2-135M or tiny).
3. Learner step: 2-process DDP (gloo, torchrun) vs 1 process on the same global batch (tiny model).
4. Weight push to 2 Ray rollout workers: Ray's object store vs the collective (gloo broadcast of packed
   buckets; also one broadcast per tensor), the same pool and weights, median of ``--pushes`` pushes
   after a warm-up push each (the first collective push, which opens the group, is reported apart).

On a 2-core machine none of these can show a speed-up from parallelism (2 workers share 2 cores with
the driver); they measure the *overhead* of the distributed machinery. Speed-ups need more cores, GPUs
or machines. Usage::

    python benchmarks/scale_out.py --model smollm2 --out benchmarks/results/scale_out.json
    python benchmarks/scale_out.py --sections weight_push --out benchmarks/results/scale_out_weight_push.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def bench_envs(episodes: int) -> dict:
    import ray

    import agentgym
    from agentgym.policies.loading import load_tokenizer_for
    from agentgym.policies.scripted import ScriptedPolicy
    from agentgym.ray_envs import make_ray_envs
    from agentgym.rollout_config import RolloutConfig
    from agentgym.rollout import RolloutEngine
    oracle = agentgym.make("CodeExec-v0").unwrapped.oracle
    out = {}
    for backend in ("thread", "ray"):
        engine = RolloutEngine(ScriptedPolicy(load_tokenizer_for("tiny-random"), oracle),
                               RolloutConfig(env_backend=backend))
        try:
            engine.collect("CodeExec-v0", num_groups=2, group_size=1, seed=0)          # warm-up (actors, sandbox)
            t0 = time.perf_counter()
            b = engine.collect("CodeExec-v0", num_groups=episodes, group_size=1, seed=1)
            wall = time.perf_counter() - t0
        finally:
            engine.close()
        out[backend] = {"episodes": episodes, "wall_s": wall, "episodes_per_s": episodes / wall,
                        "success": b.metrics["success_rate"], "env_s": b.metrics.get("time/env_s")}
    env = make_ray_envs("Arithmetic-v0", 1, {})[0]
    env.get_wrapper_attr("num_tasks")
    n, t0 = 200, time.perf_counter()
    for _ in range(n):
        ray.get(env.actor.pid.remote())
    out["actor_call_ms"] = (time.perf_counter() - t0) / n * 1000
    env.close()
    return out


def bench_generation(model: str, batch: int, new_tokens: int) -> dict:
    import torch

    from agentgym.policies.loading import load_policy
    from agentgym.policies.ray_pool import RayPolicyPool
    from agentgym.policy import SamplingParams
    sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0)
    out = {}
    torch.set_num_threads(2)
    local = load_policy(model, "hf")
    prompts = [local.tokenizer.encode(f"Question {i}: explain step by step why {i} + {i} = {2 * i}.") for i in range(batch)]
    local.generate(prompts[:2], sp.replace(max_new_tokens=2))
    t0 = time.perf_counter()
    gens = local.generate(prompts, sp)
    wall = time.perf_counter() - t0
    out["in_process_2_threads"] = {"wall_s": wall, "tokens_per_s": sum(len(g.token_ids) for g in gens) / wall}
    del local
    pool = RayPolicyPool(model, num_workers=2, threads_per_worker=1, weight_transfer="object_store")
    try:
        pool.generate(prompts[:2], sp.replace(max_new_tokens=2))
        t0 = time.perf_counter()
        gens = pool.generate(prompts, sp)
        wall = time.perf_counter() - t0
        out["ray_2_workers_1_thread"] = {"wall_s": wall, "tokens_per_s": sum(len(g.token_ids) for g in gens) / wall}
        import copy
        weights = copy.deepcopy(load_policy(model, "hf").model)
        out["ray_sync_s"] = min(pool.sync_weights(weights) for _ in range(3))
    finally:
        pool.close()
    return out


DDP_SCRIPT = r'''
import sys, time, torch
from agentgym.algorithms.loop.distributed import init_from_env
from agentgym.algorithms import GRPOConfig, OptimConfig, make_learner
from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.policy import SamplingParams
from agentgym.rollout import RolloutConfig, RolloutEngine
ctx = init_from_env()
torch.set_num_threads(1 if ctx else int(sys.argv[2]))
policy = TransformersPolicy.tiny_random(seed=0)
engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=24, seed=0)))
trajs = engine.collect("Math-v0", num_groups=8, group_size=4, seed=0,
                       env_kwargs={"kinds": ["arithmetic"], "difficulty": 0, "max_turns": 1}).trajectories
for i, t in enumerate(trajs):
    t.step_rewards = [float(i % 3)]
learner = make_learner("grpo", policy, GRPOConfig(micro_batch_size=4), optim=OptimConfig(lr=1e-4))
learner.update(trajs)
times = []
for _ in range(5):
    t0 = time.perf_counter(); learner.update(trajs); times.append(time.perf_counter() - t0)
if ctx is None or ctx.is_main:
    print("RESULT", min(times))
'''


def bench_ddp() -> dict:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "ddp.py"
        script.write_text(DDP_SCRIPT)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        out = {}
        for name, cmd in (("1_process_1_thread", [sys.executable, str(script), "x", "1"]),
                          ("1_process_2_threads", [sys.executable, str(script), "x", "2"]),
                          ("2_processes_ddp_gloo", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    "--nproc-per-node", "2", str(script), "x", "1"])):
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            line = [x for x in r.stdout.splitlines() if x.startswith("RESULT")]
            out[name] = {"update_s": float(line[-1].split()[1]) if line else None,
                         "error": None if line else r.stderr[-500:]}
        return out


def bench_weight_push(model: str, pushes: int) -> dict:
    import statistics

    import torch

    from agentgym.policies.loading import load_policy
    from agentgym.policies.ray_pool import RayPolicyPool, plan_buckets
    torch.set_num_threads(1)
    weights = load_policy(model, "hf").model
    named = list(weights.state_dict().items())
    _, sizes = plan_buckets(named, 256 * 2**20)
    out = {"model": model, "tensors": len(named), "wire_mb": sum(sizes) / 2**20, "buckets_256mb": len(sizes),
           "params": sum(p.numel() for p in weights.parameters()), "dtype": str(next(weights.parameters()).dtype)}
    variants = (("object_store", "object_store", 256), ("collective_gloo", "collective", 256),
                ("collective_gloo_per_tensor", "collective", 0))
    pool = RayPolicyPool(model, num_workers=2, threads_per_worker=1, weight_transfer="object_store")
    try:
        def push(transfer: str, bucket_mb: int) -> float:
            pool.weight_transfer, pool.bucket_bytes = transfer, bucket_mb * 2**20
            return pool.sync_weights(weights)
        for name, transfer, bucket_mb in variants:                      # warm-up (the group opens here)
            t = push(transfer, bucket_mb)
            if name == "collective_gloo":
                out["collective_first_push_s"] = t
        times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        loads: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        for _ in range(pushes):                                          # interleaved: same load for all
            for name, transfer, bucket_mb in variants:
                times[name].append(push(transfer, bucket_mb))
                loads[name].append(pool.last_load_s)
        out["backend"] = pool.collective_backend
        for name, _, _ in variants:     # load_s: the slowest actor's load_state_dict, part of the push
            out[name] = {"median_s": statistics.median(times[name]), "all_s": times[name],
                         "median_load_s": statistics.median(loads[name])}
        out["collective_over_object_store"] = out["collective_gloo"]["median_s"] / out["object_store"]["median_s"]
    finally:
        pool.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--pushes", type=int, default=3)
    ap.add_argument("--sections", default="envs,generation,ddp,weight_push")
    ap.add_argument("--out", default="runs/benchmarks/scale_out.json",
                    help="JSON (default under git-ignored runs/; the committed numbers are "
                         "benchmarks/results/scale_out*.json: name that file to refresh it)")
    args = ap.parse_args()
    from agentgym.ray_envs import ensure_ray
    ensure_ray(num_cpus=2)
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_before": os.getloadavg()},
              "command": " ".join(sys.argv)}
    sections = args.sections.split(",")
    if "envs" in sections:
        result["envs_codeexec"] = bench_envs(args.episodes)
    if "generation" in sections:
        result["generation"] = bench_generation(args.model, args.batch, args.new_tokens)
    if "ddp" in sections:
        result["ddp"] = bench_ddp()
    if "weight_push" in sections:
        result["weight_push"] = bench_weight_push(args.model, args.pushes)
    result["machine"]["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
