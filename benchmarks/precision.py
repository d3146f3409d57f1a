"""Learner update throughput at each precision, side by side in one run (issue 22).

    python benchmarks/precision.py --threads 2 --out runs/benchmarks/precision.json

A SmolLM2-135M-sized model with random weights (speed does not depend on the values) takes GRPO updates
on one fixed batch (``--batch`` sequences of ``--prompt-len`` + ``--completion-len`` random tokens) at
``fp32``, ``auto`` and ``bf16`` (:mod:`agentgym.precision`); the arms alternate, one untimed warm-up each,
then ``--repeats`` timed updates, median reported. The bound: an update is ≈ 6 × parameters × tokens
FLOPs (forward + backward), and the GEMM rate of this CPU at the update's shapes is measured in the same
run for fp32 and bf16 (``torch.mm`` of (tokens × hidden) @ (hidden × intermediate)), so each arm reports
the share of its precision's GEMM rate it reaches. Prints the CPU model: figures differ by CPU kind.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def gemm_gflops(tokens: int, hidden: int, inner: int, bf16: bool, repeats: int = 5) -> float:
    a = torch.randn(tokens, hidden)
    b = torch.randn(hidden, inner)
    if bf16:
        a, b = a.bfloat16(), b.bfloat16()
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * tokens * hidden * inner / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4, help="sequences per update")
    ap.add_argument("--prompt-len", type=int, default=192)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed updates per arm (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arms", default="fp32,auto,bf16")
    ap.add_argument("--out", default="runs/benchmarks/precision.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentgym.algorithms import GRPOConfig, OptimConfig, make_learner
    from agentgym.policies.models import load_tokenizer
    from agentgym.policies.transformers_policy import TransformersPolicy
    from agentgym.precision import cpu_identity, resolve_precision
    from agentgym.trajectory import Trajectory

    tok = load_tokenizer("smollm2")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg).eval()
    params = sum(p.numel() for p in base.parameters())
    n = args.prompt_len + args.completion_len
    g = torch.Generator().manual_seed(0)
    trajs = [Trajectory(token_ids=torch.randint(5, 40000, (n,), generator=g).tolist(),
                        loss_mask=[0] * args.prompt_len + [1] * args.completion_len,
                        logprobs=[0.0] * args.prompt_len + [-3.0] * args.completion_len,
                        prompt_length=args.prompt_len, turn_spans=[(args.prompt_len, n)], actions=["a"],
                        finish_reasons=["length"], step_rewards=[float(i % 2)], reward_terms=[{}], messages=[],
                        group_id=i // 2, temperature=1.0) for i in range(args.batch)]
    tokens = args.batch * n
    flops = 6 * params * tokens
    arms = args.arms.split(",")
    learners = {}
    for arm in arms:
        import copy
        policy = TransformersPolicy(copy.deepcopy(base), tok)
        learners[arm] = make_learner("grpo", policy, GRPOConfig(micro_batch_size=args.batch),
                                     optim=OptimConfig(lr=1e-6), precision=arm)
        learners[arm].update(trajs)                       # warm-up (oneDNN kernel choice)
    times: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(args.repeats):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            times[arm].append(_timed(lambda: learners[arm].update(trajs)))
            print(f"  {arm:5s} update {times[arm][-1]:.2f} s", flush=True)
    rate = {"fp32": gemm_gflops(tokens, 576, 1536, False), "bf16": gemm_gflops(tokens, 576, 1536, True)}
    ident = cpu_identity()
    result = {"cpu": ident["cpu"], "cpu_flags": ident["flags"], "torch": ident["torch"], "threads": args.threads,
              "batch": args.batch, "tokens_per_update": tokens, "params": params, "gemm_gflops": rate,
              "auto_resolved": resolve_precision("auto", "cpu").name, "arms": {}}
    fp32 = statistics.median(times[arms[0]]) if arms[0] == "fp32" else None
    print(f"{ident['cpu']} ({', '.join(ident['flags'])}), {args.threads} thread(s); GEMM fp32 "
          f"{rate['fp32']:.0f}, bf16 {rate['bf16']:.0f} GFLOP/s; auto -> {result['auto_resolved']}")
    for arm in arms:
        med = statistics.median(times[arm])
        resolved = learners[arm].precision.name
        share = flops / med / 1e9 / rate[resolved]
        result["arms"][arm] = {"resolved": resolved, "median_s": med, "times_s": times[arm],
                               "tokens_per_s": tokens / med, "vs_fp32": (fp32 / med) if fp32 else None,
                               "share_of_gemm_rate": share}
        print(f"{arm:5s} ({resolved}): {med:.2f} s/update, {tokens / med:.0f} tokens/s"
              + (f", {fp32 / med:.2f}x fp32" if fp32 else "") + f", {share:.0%} of the {resolved} GEMM rate")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    import sys

    from _common import run_interruptible
    sys.exit(run_interruptible(main))
