"""Share of padded positions in the learner's passes, consecutive micro-batches vs a token budget (issue 22).

    python benchmarks/padding.py --out runs/benchmarks/padding.json

Collects one training batch the way a run does — the main job's (Math-v0 warm-up, 4 groups × 4, SmolLM2
sampling at T=1) and a SearchQA one (bundled world, BM25, 4 groups × 4, up to 4 turns) — then cuts it into
micro-batches the learner's way: ``micro_batch_size`` consecutive rows (today's default), and rows of
similar length under a budget of ``micro_batch_size × mean length`` padded positions
(``learner.micro_batch_tokens``). Padding share = 1 − real tokens / (Σ rows × width over the micro-batches):
the forward and backward FLOPs spent on padding. Only the batch is generated; nothing is trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def shares(trajectories, micro: int) -> dict:
    from agentgym.algorithms.loop.batch import collate
    batch = collate(trajectories)
    real = int(batch.lengths.sum())
    budget = int(micro * real / len(batch))
    out = {"rows": len(batch), "real_tokens": real, "min_len": int(batch.lengths.min()),
           "max_len": int(batch.lengths.max()), "budget": budget}
    for name, tokens in (("consecutive", None), ("token_budget", budget)):
        padded = sum(m.padded_tokens for m in batch.micro_batches(micro, tokens))
        out[name] = {"padded_positions": padded, "pad_frac": 1 - real / padded,
                     "micro_batches": len(list(batch.micro_rows(micro, tokens)))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--micro-batch-size", type=int, default=4, help="the main job's learner.micro_batch_size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/benchmarks/padding.json")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.policies.loading import load_policy
    from agentgym.precision import cpu_identity
    from agentgym.rollout import RolloutEngine

    cfg = TrainConfig()
    policy = load_policy("smollm2", "hf")
    engine = RolloutEngine(policy, cfg.rollout)
    result = {"cpu": cpu_identity()["cpu"], "micro_batch_size": args.micro_batch_size}
    try:
        jobs = {"main_job_math": ("Math-v0", cfg.env_kwargs),
                "searchqa": ("SearchQA-v0", {"retriever": "bm25", "max_turns": 4})}
        for name, (env, kwargs) in jobs.items():
            batch = engine.collect(env, num_groups=4, group_size=4, seed=0, env_kwargs=kwargs)
            result[name] = shares(batch.trajectories, args.micro_batch_size)
            r = result[name]
            print(f"{name}: {r['rows']} rows of {r['min_len']}-{r['max_len']} tokens; padding "
                  f"{r['consecutive']['pad_frac']:.1%} consecutive -> {r['token_budget']['pad_frac']:.1%} with a "
                  f"budget of {r['budget']} positions", flush=True)
    finally:
        engine.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    import sys

    from _common import run_interruptible
    sys.exit(run_interruptible(main))
