"""The hf backend's sampler against ``torch.multinomial``, on the main job's rollout shapes (issue 49).

    python benchmarks/hf_sampling.py --threads 2 --out runs/hf_sampling.json

The hf backend samples through :func:`agentgym.policies.transformers_policy.sampling_processors`
(transformers' temperature / top-k / top-p warpers, then an inverse-CDF draw, one uniform number per row)
and ``generate``'s greedy argmax; ``generate(do_sample=True)`` draws with ``torch.multinomial`` instead.
Both give the same categorical distribution. This script times both, arms interleaved in one process
(this VM's speed drifts between runs, so only ratios inside one run are read):

* **the draw alone**: one call per arm on ``batch x vocab`` fp32 scores (16 x 49 152 for SmolLM2);
* **a whole generate call**: SmolLM2 (``--model``) under the run's precision (``--precision``, bf16 autocast
  by default) on ``--batch`` prompts of the main job's task (``Math-v0`` warm-up level, chat template),
  exactly ``--new-tokens`` new tokens each (``min_new_tokens`` = ``max_new_tokens``, so both arms decode
  the same number of steps whatever they sample), median of ``--repeats``; per decode step = wall /
  new tokens (the prefill is inside both arms alike).

Writes a JSON with the machine (CPU model, threads, load) and the medians; prints a short table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def main_prompts(tokenizer, batch: int) -> list[list[int]]:
    """``batch`` first prompts of the main job's training tasks, as the rollout formats them (chat template)."""
    import agentgym
    env = agentgym.make("Math-v0", kinds=["arithmetic"], difficulty=0, max_turns=1, split="train")
    prompts = []
    for i in range(batch):
        obs, _ = env.reset(options={"task_index": i})
        ids = tokenizer.apply_chat_template(obs, add_generation_prompt=True)
        prompts.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    env.close()
    return prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 (default) or tiny-random (tests)")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48, help="the main job's max_new_tokens")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("runs/hf_sampling.json"))
    args = ap.parse_args(argv)
    if min(args.threads, args.batch, args.new_tokens, args.repeats) < 1:
        ap.error("--threads, --batch, --new-tokens and --repeats must be >= 1")

    import torch
    torch.set_num_threads(args.threads)
    from agentgym.policies.models import load_tokenizer
    from agentgym.policies.transformers_policy import TransformersPolicy, sampling_processors
    from agentgym.policy import SamplingParams
    from agentgym.precision import cpu_identity

    if args.model == "tiny-random":
        policy = TransformersPolicy.tiny_random(load_tokenizer("smollm2"))
    else:
        policy = TransformersPolicy.from_pretrained(args.model)
    model, tok = policy.model, policy.tokenizer
    model.eval()
    prompts = main_prompts(tok, args.batch)
    width = max(map(len, prompts))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                  pad_token_id=pad, return_dict_in_generate=True, output_logits=True)
    arms = {
        "multinomial": dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=None),
        "inverse_cdf": dict(do_sample=False, temperature=None, top_p=None, top_k=None,
                            logits_processor=sampling_processors(SamplingParams())),
    }
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16"
                else torch.autocast("cpu", enabled=False))

    def generate(arm: str) -> float:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        with torch.no_grad(), autocast:
            out = model.generate(**common, **arms[arm])
        assert out.sequences.shape[1] == width + args.new_tokens
        return time.perf_counter() - t0

    vocab = model.get_output_embeddings().weight.shape[0]
    scores = torch.randn(args.batch, vocab) * 3
    draw = {"multinomial": lambda: torch.multinomial(torch.softmax(scores, -1), 1),
            "inverse_cdf": lambda: sampling_processors(SamplingParams())(None, scores).argmax(-1)}

    def draw_ms(arm: str, n: int = 20) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            draw[arm]()
        return (time.perf_counter() - t0) / n * 1e3

    load0 = os.getloadavg()[0]
    for arm in arms:        # warm-up: first-call allocations, oneDNN kernels, weight casts
        generate(arm)
        draw_ms(arm, 3)
    walls: dict[str, list[float]] = {a: [] for a in arms}
    draws: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(args.repeats):
        for arm in (arms if r % 2 == 0 else reversed(list(arms))):   # alternate the order
            walls[arm].append(generate(arm))
            draws[arm].append(draw_ms(arm))
    result = {
        "command": "python benchmarks/hf_sampling.py " + " ".join(argv if argv is not None else os.sys.argv[1:]),
        "machine": {**cpu_identity(), "threads": args.threads, "load_1min_start": round(load0, 2),
                    "load_1min_end": round(os.getloadavg()[0], 2)},
        "model": args.model, "precision": args.precision, "batch": args.batch, "new_tokens": args.new_tokens,
        "prompt_tokens_max": width, "vocab": vocab, "repeats": args.repeats,
        "arms": {arm: {"generate_s_median": statistics.median(walls[arm]), "generate_s": walls[arm],
                       "per_decode_step_ms": statistics.median(walls[arm]) / args.new_tokens * 1e3,
                       "draw_ms_median": statistics.median(draws[arm])} for arm in arms},
    }
    a, b = result["arms"]["multinomial"], result["arms"]["inverse_cdf"]
    result["generate_speedup"] = a["generate_s_median"] / b["generate_s_median"]
    result["draw_speedup"] = a["draw_ms_median"] / b["draw_ms_median"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{'arm':12s} {'generate (median)':>18s} {'per decode step':>16s} {'draw alone':>11s}")
    for arm, m in result["arms"].items():
        print(f"{arm:12s} {m['generate_s_median']:>16.2f} s {m['per_decode_step_ms']:>13.1f} ms "
              f"{m['draw_ms_median']:>8.2f} ms")
    print(f"inverse_cdf vs multinomial: generate {result['generate_speedup']:.2f}x, draw {result['draw_speedup']:.2f}x "
          f"({args.batch} x {args.new_tokens} tokens, {args.precision}, {args.threads} threads, "
          f"{result['machine']['cpu']}); wrote {args.out}")
    return 0


if __name__ == "__main__":
    from _common import run_interruptible
    raise SystemExit(run_interruptible(main))
