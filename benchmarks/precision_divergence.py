"""Sampler–learner log-prob divergence under each precision, and what recompute + TIS make of it (issue 22).

    python benchmarks/precision_divergence.py --episodes 8 --max-new-tokens 32 --out runs/benchmarks/precision_divergence.json

SmolLM2-135M-Instruct samples one batch of the main job's task (Math-v0 warm-up) with the HF sampler in
fp32 and in bf16 autocast; for each, a learner in fp32 and in bf16 recomputes the old log-probs with the
same weights (``learner.old_logprobs=recompute``, lr 0: the update changes nothing) and reports what the
trainer logs every step: ``sampler_logp_diff_mean`` / ``_max`` (|Δ log p| per sampled token),
``sampler_logp_diff_frac`` (share over ``divergence_threshold``) and, with ``tis_cap=2``, the mean
truncated importance weight exp(learner − sampler). The PPO/GRPO ratio is then taken against the
learner's own recomputed log-probs, so it starts at exactly 1 whatever the sampler's precision; TIS
reweights each token by how far the sampler was off. Numerics only: the figures do not depend on the
load, but bf16 is emulated (slow) on a CPU without bf16 units.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/benchmarks/precision_divergence.json")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    from agentgym.algorithms import GRPOConfig, OptimConfig, make_learner
    from agentgym.algorithms.loop.train_config import TrainConfig
    from agentgym.policies.loading import load_policy
    from agentgym.precision import cpu_identity, resolve_precision
    from agentgym.rollout_config import RolloutConfig
    from agentgym.rollout import RolloutEngine

    cfg = TrainConfig()
    rows = []
    for sampler in ("fp32", "bf16"):
        policy = load_policy("smollm2", "hf", precision=sampler, seed=0)
        rollout = RolloutConfig(sampling=cfg.rollout.sampling.__class__(max_new_tokens=args.max_new_tokens, seed=0),
                                max_obs_tokens=256, max_context_tokens=2048)
        batch = RolloutEngine(policy, rollout).collect(cfg.env, num_groups=args.episodes // 2, group_size=2, seed=0,
                                                       env_kwargs=cfg.env_kwargs)
        for learner_precision in ("fp32", "bf16"):
            learner = make_learner("grpo", policy, GRPOConfig(old_logprobs="recompute", tis_cap=2.0, micro_batch_size=4),
                                   optim=OptimConfig(lr=0.0), separate_sampler=True, precision=resolve_precision(learner_precision, "cpu"))
            m = learner.update(batch.trajectories)
            row = {"sampler": sampler, "learner": learner_precision,
                   **{k: float(m[k]) for k in ("sampler_logp_diff_mean", "sampler_logp_diff_max",
                                               "sampler_logp_diff_frac", "tis_weight_mean", "clip_frac") if k in m}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"cpu": cpu_identity()["cpu"], "episodes": args.episodes, "max_new_tokens": args.max_new_tokens,
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
