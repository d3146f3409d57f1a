"""Generation overlapped with the update (``max_staleness=1``) against on-policy steps, side by side (issue 22).

    python benchmarks/overlap.py --steps 6 --repeats 2 --threads 2 --out runs/benchmarks/overlap.json

Runs the main job's training (``agentgym train`` defaults: GRPO, SmolLM2-135M, Math-v0 warm-up, 4 groups × 4)
for ``--steps`` steps with ``max_staleness=0`` and ``1``, alternating, ``--repeats`` times, with a fixed
torch thread budget (with overlap it is shared: one lane generates while the other updates). Reports the
steps' wall time (the sum of ``time/step_s``: model loading and the evals are left out, they do not
change), the median step, generation and waiting time, the sampler–learner log-prob divergence, and
the ratio on-policy / overlapped. Same seeds in both: the first step's batch is the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def one_run(steps: int, staleness: int, threads: int, extra: list[str]) -> dict:
    from agentgym import threads as torch_threads
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.algorithms.loop.trainer import Trainer
    from agentgym.config import load_config

    torch_threads.install(torch_threads.ThreadGovernor(threads, fixed=True, log=lambda m: None))
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(TrainConfig, overrides=[f"steps={steps}", f"max_staleness={staleness}", "eval.episodes=1",
                                                  "checkpoint_every=0", "tensorboard=false", f"output_dir={out}",
                                                  *extra])
        rows = Trainer(cfg, log=lambda m: None).train()["history"]
    torch_threads.install(None)
    med = lambda key: statistics.median(r.get(key, float("nan")) for r in rows)  # noqa: E731
    return {"max_staleness": staleness, "steps_wall_s": sum(r["time/step_s"] for r in rows),
            "step_s_median": med("time/step_s"), "rollout_s_median": med("time/rollout_s"),
            "rollout_wait_s_median": med("time/rollout_wait_s"), "sync_s_median": med("time/sync_s"),
            "staleness": [r["rollout/staleness"] for r in rows],
            "batch_reward": [round(r["rollout/reward_mean"], 4) for r in rows],
            "sampler_logp_diff_mean": med("train/sampler_logp_diff_mean"),
            "sampler_logp_diff_max": max(r.get("train/sampler_logp_diff_max", 0.0) for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="training steps per run")
    ap.add_argument("--repeats", type=int, default=2, help="pairs of runs (on-policy, overlapped), alternating")
    ap.add_argument("--threads", type=int, default=2, help="torch thread budget (shared by the lanes when overlapped)")
    ap.add_argument("--out", default="runs/benchmarks/overlap.json")
    ap.add_argument("overrides", nargs="*", help="extra train config keys, e.g. backend=vllm learner.tis_cap=2")
    args = ap.parse_args()
    from agentgym.precision import cpu_identity

    runs = []
    for rep in range(args.repeats):
        for staleness in (0, 1):
            r = one_run(args.steps, staleness, args.threads, args.overrides)
            runs.append({"repeat": rep, **r})
            print(f"repeat {rep} max_staleness={staleness}: steps {r['steps_wall_s']:.1f} s (median step "
                  f"{r['step_s_median']:.1f} s, generation {r['rollout_s_median']:.1f} s, waited "
                  f"{r['rollout_wait_s_median']:.1f} s), sampler-learner |dlogp| mean "
                  f"{r['sampler_logp_diff_mean']:.2e}", flush=True)
    pairs = [(a["steps_wall_s"], b["steps_wall_s"]) for a, b in zip(runs[0::2], runs[1::2])]
    ratios = [on / ahead for on, ahead in pairs]
    result = {"cpu": cpu_identity()["cpu"], "threads": args.threads, "steps": args.steps,
              "overrides": args.overrides, "runs": runs, "speedup_per_pair": ratios}
    print("on-policy / overlapped, steps' wall time per pair: " + ", ".join(f"{x:.2f}x" for x in ratios))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
