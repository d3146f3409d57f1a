"""The HF policy's KV reuse across turns, on and off, side by side (issue 14).

    python benchmarks/kv_reuse.py --threads 2 --out benchmarks/results/kv_reuse.json

An agent's later turns extend its earlier ones (prompt + sampled ids + the env's observation), so
without reuse every turn prefills the whole history again. This drives the HF policy
(``TransformersPolicy``, SmolLM2-135M-Instruct fp32) through ``--turns`` turns of a batch of
``--batch`` episodes: turn 1 is a ``--prompt-tokens`` prompt (standard-library docstring text, as in
``generation.py``), every later turn appends the turn's sampled ids and a ``--obs-tokens`` "tool
observation" (more docstring text), ``--new-tokens`` greedy new tokens per turn. The same episodes run
with ``reuse_kv=True`` and ``reuse_kv=False`` in one process, alternating which goes first over
``--repeats`` rounds (the faster round of each is kept), and must produce identical ids.

Reported per turn: seconds, tokens/s (tokens returned / seconds), prompt tokens prefilled vs taken
from the store.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generation import corpus_prompts, load_avg  # noqa: E402  (benchmarks/ is not a package)


def run_episodes(policy, first, observations, turns, new_tokens):
    from agentgym.policy import SamplingParams
    sp = SamplingParams(greedy=True, max_new_tokens=new_tokens)
    policy.clear_kv_cache()
    policy.kv_reused_tokens = 0
    prompts = [list(p) for p in first]
    rows, outputs = [], []
    for t in range(turns):
        reused_before = policy.kv_reused_tokens
        t0 = time.perf_counter()
        gens = policy.generate(prompts, sp)
        dt = time.perf_counter() - t0
        n_new = sum(len(g.token_ids) for g in gens)
        reused = policy.kv_reused_tokens - reused_before
        rows.append({"turn": t + 1, "seconds": round(dt, 3), "tokens": n_new, "tok_s": round(n_new / dt, 2),
                     "prompt_tokens": sum(len(p) for p in prompts), "reused_tokens": reused})
        outputs.append([g.token_ids for g in gens])
        prompts = [p + g.token_ids + observations[t][i] for i, (p, g) in enumerate(zip(prompts, gens))]
    return rows, outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--obs-tokens", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from agentgym.policies.transformers_policy import TransformersPolicy
    load0 = load_avg()
    policy = TransformersPolicy.from_pretrained("smollm2")
    tok = policy.tokenizer
    first = corpus_prompts(tok, args.batch, args.prompt_tokens)
    obs_pool = corpus_prompts(tok, args.batch * (args.turns - 1), args.obs_tokens, skip=args.batch * args.prompt_tokens // args.obs_tokens + 1)
    observations = [obs_pool[t * args.batch:(t + 1) * args.batch] for t in range(args.turns - 1)] + [[[]] * args.batch]
    run_episodes(policy, [p[:50] for p in first[:2]], observations, 1, 4)   # warm-up
    best: dict[bool, list] = {}
    outs: dict[bool, list] = {}
    for r in range(args.repeats):
        for reuse in ((True, False) if r % 2 == 0 else (False, True)):
            policy.reuse_kv = reuse
            rows, out = run_episodes(policy, first, observations, args.turns, args.new_tokens)
            total = sum(x["seconds"] for x in rows)
            print(f"round {r} reuse={reuse}: {total:.1f} s  " + "  ".join(f"t{x['turn']} {x['seconds']:.1f}s" for x in rows),
                  flush=True)
            if reuse not in best or total < sum(x["seconds"] for x in best[reuse]):
                best[reuse] = rows
            outs[reuse] = out
    same = outs[True] == outs[False]
    print(f"\nSmolLM2-135M fp32, {args.threads} threads, batch {args.batch}, prompt {args.prompt_tokens} tok, "
          f"+{args.obs_tokens} obs tok/turn, {args.new_tokens} new tok/turn, greedy; identical ids: {same}")
    print(f"{'turn':>4} {'prompt tok':>10} {'reused':>7} {'s (reuse)':>10} {'s (no reuse)':>12} {'speed-up':>8}")
    for a, b in zip(best[True], best[False]):
        print(f"{a['turn']:>4} {a['prompt_tokens']:>10} {a['reused_tokens']:>7} {a['seconds']:>10.2f} "
              f"{b['seconds']:>12.2f} {b['seconds'] / a['seconds']:>7.2f}x")
    ta, tb = sum(x["seconds"] for x in best[True]), sum(x["seconds"] for x in best[False])
    print(f" all {'':>10} {'':>7} {ta:>10.2f} {tb:>12.2f} {tb / ta:>7.2f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                        "load_before": load0, "load_after": load_avg()},
            "identical_ids": same, "reuse": best[True], "no_reuse": best[False]}, indent=2))


if __name__ == "__main__":
    main()
