"""Rollouts: lockstep vs async episodes (issue 14), side by side in one run.

    python benchmarks/rollout_async.py [--policies tiny-random,smollm2,scripted] [--backends hf,vllm]
        [--envs math,searchqa,codeexec,codeexec-bwrap] [--episodes 16] [--threads 1] [--repeats 1]
        [--out benchmarks/results/rollout_async.json]

For every (policy, backend, env) the same episodes (same tasks and reset seeds, greedy decoding, so
both schedules do the same work) are collected with ``mode="lockstep"`` and ``mode="async"``,
alternately (``--repeats``: the fastest run of each is kept), after one warm-up collection (model
load, stop-string tables, retriever, sandbox).
Reported per row: wall time, episodes/s, time inside ``generate``, the share of wall time outside
it, summed env-call time (over worker threads), ``generate`` calls, and whether async gave the same
trajectories (token ids, texts, rewards) as lockstep.

Envs: ``Math-v0`` (one turn), ``SearchQA-v0`` (4 turns + a forced answer, dense MiniLM retrieval on the CPU)
and ``CodeExec-v0`` (up to 3 attempts, each a real sandbox run — docker, else bwrap: 0.3-0.7 s).
Policies: ``tiny-random`` (2-layer random Llama, real SmolLM2 tokenizer: generation is cheap, its
garbage rarely reaches the tools), ``smollm2`` (SmolLM2-135M-Instruct, fp32) and ``scripted`` (each
env's oracle; for CodeExec two failing drafts, then the reference, one of the three programs sleeping
1 s: generation ≈ 0, so the row isolates env-step overlap, like a fast inference engine would).
Backends: ``hf`` (KV reuse across turns, the default), ``hf-nokv`` (the same with ``reuse_kv=False``:
every turn prefills the whole history, as before issue 14's KV reuse) and ``vllm`` (prefix cache).
Torch threads are set explicitly (``--threads``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import zlib
from typing import Any

import torch

import agentgym
from agentgym.policy import SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine

#: name -> (env id, env kwargs, new tokens per turn: enough for SmolLM2 to close a code block on CodeExec)
ENVS: dict[str, tuple[str, dict[str, Any], int]] = {
    "math": ("Math-v0", {"max_turns": 1}, 64),
    "searchqa": ("SearchQA-v0", {}, 64),
    "codeexec": ("CodeExec-v0", {}, 128),                       # sandbox "auto": docker, else bwrap
    "codeexec-bwrap": ("CodeExec-v0", {"sandbox": "bwrap"}, 128),
}


def scripted_policy(env_id: str) -> Any:
    from agentgym.policies.models import load_tokenizer
    from agentgym.policies.scripted import ScriptedPolicy
    env = agentgym.make(env_id)
    oracle = env.unwrapped.oracle
    env.close()
    if env_id.startswith("CodeExec"):
        def script(ctx: dict[str, Any]) -> str:
            """Two failing drafts, then the reference; one attempt per task (picked by a hash of its
            id) is slow — it sleeps 1 s in the sandbox —, so every turn has slow programs, every
            episode only one."""
            turn = ctx["turn"]
            program = "print('draft')" if turn < 2 else oracle(ctx).split("```python\n", 1)[1].rsplit("```", 1)[0]
            if turn == zlib.crc32(ctx["task"]["task_id"].encode()) % 3:
                program = "import time\ntime.sleep(1.0)\n" + program
            return "```python\n" + program.rstrip("\n") + "\n```"
        return ScriptedPolicy(load_tokenizer(), script)
    return ScriptedPolicy(load_tokenizer(), oracle)


def load(policy: str, backend: str, env_id: str, cache: dict[tuple[str, str], Any]) -> Any | None:
    if policy == "scripted":
        return scripted_policy(env_id) if backend == "hf" else None
    if (policy, backend) not in cache:
        from agentgym.policies.loading import load_policy
        from agentgym.policies.backends import resolve_backend
        notes: list[str] = []
        engine, options = ("hf", {"reuse_kv": False}) if backend == "hf-nokv" else (backend, {})
        if resolve_backend(engine, notice=notes.append) != engine:
            print(f"[skip] {policy}/{backend}: {notes[0] if notes else 'unavailable'}", flush=True)
            cache[(policy, backend)] = None
        else:
            t0 = time.perf_counter()
            cache[(policy, backend)] = load_policy(policy, backend=engine, dtype=torch.float32, **options)
            print(f"[load] {policy}/{backend}: {time.perf_counter() - t0:.1f} s", flush=True)
    return cache[(policy, backend)]


def warm_services(env_id: str, env_kwargs: dict[str, Any]) -> None:
    """One step with the env's oracle action: loads the retriever, starts the sandbox (both shared)."""
    env = agentgym.make(env_id, **env_kwargs)
    try:
        obs, info = env.reset(seed=0)
        env.step(env.unwrapped.oracle({"turn": 0, "task": info["privileged"]["task"], "messages": obs}))
    finally:
        env.close()


def same(a: Any, b: Any) -> bool:
    return (a.token_ids, a.actions, a.step_rewards, a.messages) == (b.token_ids, b.actions, b.step_rewards, b.messages)


def run_pair(policy: Any, env_id: str, env_kwargs: dict[str, Any], episodes: int, max_new_tokens: int,
             seed: int, repeats: int = 1) -> dict[str, Any]:
    sampling = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    configs = {mode: RolloutConfig(sampling=sampling, mode=mode) for mode in ("lockstep", "async")}
    # one engine (one set of envs) for both modes; the schedule is read from engine.config per collect
    engine = RolloutEngine(policy, configs["lockstep"].replace(sampling=sampling.replace(max_new_tokens=2)))
    try:
        # warm-up: every env made, stop-string tables built; shared services (retriever, sandbox) started
        engine.collect(env_id, num_groups=episodes, seed=seed + 1, env_kwargs=env_kwargs)
        warm_services(env_id, env_kwargs)
        out: dict[str, Any] = {}
        batches, walls = {}, {}
        for rep in range(repeats):  # alternate the order; keep each mode's fastest run
            for mode in (("lockstep", "async") if rep % 2 == 0 else ("async", "lockstep")):
                engine.config = configs[mode]
                t0 = time.perf_counter()
                batch = engine.collect(env_id, num_groups=episodes, seed=seed, env_kwargs=env_kwargs)
                wall = time.perf_counter() - t0
                if wall < walls.get(mode, float("inf")):
                    batches[mode], walls[mode] = batch, wall
        for mode in ("lockstep", "async"):
            wall, m = walls[mode], batches[mode].metrics
            out[mode] = {"wall_s": wall, "episodes_per_s": episodes / wall, "generate_s": m["time/generate_s"],
                         "outside_generate_frac": 1 - m["time/generate_s"] / wall, "env_calls_s": m["time/env_calls_s"],
                         "env_wait_s": m["time/env_s"], "generate_calls": m["rollout/generate_calls"],
                         "batch_size_mean": m["rollout/batch_size_mean"], "turns_mean": m["turns_mean"],
                         "tool_calls_mean": m["tool_calls_mean"], "generated_tokens": m["generated_tokens"],
                         "success_rate": m["success_rate"]}
        pairs = list(zip(batches["lockstep"].trajectories, batches["async"].trajectories))
        out["same_trajectories"] = sum(same(a, b) for a, b in pairs) / len(pairs)
        out["async_speedup"] = out["lockstep"]["wall_s"] / out["async"]["wall_s"]
        return out
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="tiny-random,smollm2,scripted")
    ap.add_argument("--backends", default="hf", help="hf, hf-nokv and/or vllm (vllm rows are skipped where it does not import)")
    ap.add_argument("--envs", default="math,searchqa,codeexec,codeexec-bwrap")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="per turn (default: per env, 64 or 128)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (set explicitly: 2 cores here)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="runs per mode (order alternated); the fastest is kept")
    ap.add_argument("--out", default=None, help="write the raw numbers as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results: dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": f"{platform.machine()} {platform.node()}, {os.cpu_count()} cores", "python": platform.python_version(),
        "torch": torch.__version__, "torch_threads": args.threads, "load_before": os.getloadavg(),
        "episodes": args.episodes, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "rows": []}
    cache: dict[tuple[str, str], Any] = {}
    header = (f"{'policy':<12} {'backend':<7} {'env':<14} {'mode':<8} {'wall s':>7} {'ep/s':>6} {'gen s':>7} "
              f"{'outside':>7} {'env calls s':>11} {'calls':>5} {'batch':>5} {'turns':>5} {'same':>5}")
    print(header, flush=True)
    for policy_name in args.policies.split(","):
        for backend in args.backends.split(","):
            for env_name in args.envs.split(","):
                env_id, env_kwargs, env_tokens = ENVS[env_name]
                policy = load(policy_name, backend, env_id, cache)
                if policy is None:
                    continue
                r = run_pair(policy, env_id, env_kwargs, args.episodes, args.max_new_tokens or env_tokens, args.seed,
                             args.repeats)
                results["rows"].append({"policy": policy_name, "backend": backend, "env": env_name, "env_id": env_id,
                                        "env_kwargs": env_kwargs, "max_new_tokens": args.max_new_tokens or env_tokens, **r})
                for mode in ("lockstep", "async"):
                    m = r[mode]
                    print(f"{policy_name:<12} {backend:<7} {env_name:<14} {mode:<8} {m['wall_s']:7.2f} "
                          f"{m['episodes_per_s']:6.2f} {m['generate_s']:7.2f} {m['outside_generate_frac']:7.1%} "
                          f"{m['env_calls_s']:11.2f} {m['generate_calls']:5.0f} {m['batch_size_mean']:5.1f} "
                          f"{m['turns_mean']:5.2f} {r['same_trajectories'] if mode == 'async' else '':>5}", flush=True)
                print(f"{'':<35} async speed-up {r['async_speedup']:.2f}x", flush=True)
    results["load_after"] = os.getloadavg()
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
