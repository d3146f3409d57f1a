"""Learner update time with logits only where a loss reads them vs from the last prompt token on.

    python benchmarks/logit_positions.py --threads 1 --out runs/logit_positions.json

Multi-turn episodes interleave the policy's tokens with the environment's (retrieved documents, tool
output): the learner needs log-probs at the policy's tokens only (with ``mask_env_tokens``), but the
forward pass used to project every position after the shortest prompt onto the vocabulary. This times
one ``GRPOLearner.update`` on a batch shaped like a Search-R1 episode — prompt, then turns of policy
tokens and retrieved passages — under both choices, alternating, after one warm-up each; medians.

"before": ``logits_to_keep`` = every position from the last prompt token on (the previous behaviour,
restored for this run by overriding the learner's ``_logit_positions``). "after": the positions some
row's loss reads (``Batch.logit_positions``). Same model (SmolLM2-135M's sizes, random weights), same
batch, same optimizer settings; the log-probs at the loss positions are identical (checked here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch


def episode(g: torch.Generator, args: argparse.Namespace) -> tuple[list[int], list[int], int]:
    """Token ids and loss mask of one episode: prompt, then (policy turn, retrieved passages) x turns."""
    prompt = args.prompt_len + int(torch.randint(-8, 9, (1,), generator=g))
    ids = torch.randint(100, 49152, (prompt,), generator=g).tolist()
    mask = [0] * prompt
    for turn in range(args.turns):
        n = args.policy_len + int(torch.randint(-10, 11, (1,), generator=g))
        ids += torch.randint(100, 49152, (n,), generator=g).tolist()
        mask += [1] * n
        if turn < args.turns - 1:
            m = args.obs_len + int(torch.randint(-20, 21, (1,), generator=g))
            ids += torch.randint(100, 49152, (m,), generator=g).tolist()
            mask += [0] * m
    return ids, mask, prompt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=150)
    ap.add_argument("--policy-len", type=int, default=40, help="policy tokens per turn")
    ap.add_argument("--obs-len", type=int, default=150, help="environment tokens between turns (3 passages)")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from learner_throughput import build_model
    from agentgym.algorithms import GRPOConfig, GRPOLearner, OptimConfig
    from agentgym.algorithms.loop.batch import collate
    from agentgym.trajectory import Trajectory

    model = build_model("smollm2-135m", "cpu")
    policy = SimpleNamespace(model=model, tokenizer=SimpleNamespace(pad_token_id=0))
    learner = GRPOLearner(policy, GRPOConfig(micro_batch_size=args.micro_batch_size, kl_coef=0.0, entropy_coef=0.0),
                          optim=OptimConfig(lr=1e-6), precision="fp32")
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(args.episodes):
        ids, mask, prompt = episode(g, args)
        trajs.append(Trajectory(token_ids=ids, loss_mask=mask, logprobs=[-1.0 * m for m in mask], prompt_length=prompt,
                                turn_spans=[], actions=["x"], finish_reasons=["stop"],
                                step_rewards=[float(i % 2)], reward_terms=[{}], messages=[],
                                group_id=i // args.group_size))
    batch = collate(trajs, pad_id=0)
    after = learner._logit_positions

    def before(micro):   # the previous behaviour: from the last prompt token on
        return torch.arange(micro.logits_offset, micro.width - 1)

    # same log-probs where the loss reads them
    micro = batch.select(list(range(min(args.micro_batch_size, len(trajs)))))
    with torch.no_grad():
        lp = {}
        for name, fn in (("before", before), ("after", after)):
            learner._logit_positions = fn
            lp[name], _ = learner._logprobs(learner._model_outputs(model, micro), micro)
        need = micro.loss_mask.bool()
        max_diff = float((lp["before"] - lp["after"]).abs()[need].max())
    kept = {"before": int(before(micro).numel()), "after": int(after(micro).numel()), "width": micro.width,
            "policy_tokens": int(micro.loss_mask.sum())}

    times: dict[str, list[float]] = {"before": [], "after": []}
    for rep in range(args.repeats + 1):
        order = (("before", before), ("after", after)) if rep % 2 == 0 else (("after", after), ("before", before))
        for name, fn in order:
            learner._logit_positions = fn
            t0 = time.perf_counter()
            learner.update(trajs)
            dt = time.perf_counter() - t0
            if rep:   # the first round is the warm-up
                times[name].append(dt)
                print(f"[logit positions] repeat {rep}/{args.repeats} {name}: {dt:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}",
              "load_avg_start": list(os.getloadavg()), "args": vars(args), "first_micro_batch": kept,
              "max_logprob_diff_at_loss_tokens": max_diff, "seconds": times, "median_s": med,
              "speedup": med["before"] / med["after"]}
    print(f"first micro-batch: {kept['width']} positions, logits before {kept['before']}, after {kept['after']} "
          f"({kept['policy_tokens']} policy tokens); max |logp diff| at loss tokens {max_diff:.2e}")
    print(f"median update: before {med['before']:.2f} s, after {med['after']:.2f} s -> {result['speedup']:.2f}x")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from _common import run_interruptible
    raise SystemExit(run_interruptible(main))
