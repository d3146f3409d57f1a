"""Rollout overhead: how much wall time the engine spends outside ``generate``, and whether
per-turn formatting cost grows with history length (target: turn 16 <= 1.2x turn 1).

    python benchmarks/rollout_overhead.py [--policy tiny-random|smollm2] [--episodes 16] [--out FILE]

(1) Formatting per turn: a 16-turn conversation is formatted append-only with both styles, the
    cost of producing turn k's env ids is timed (median of repeats) and reported relative to turn 1.
    For contrast, the naive approach (re-render and re-tokenize the whole conversation each turn)
    is timed the same way.
(2) Engine overhead: a batch of Arithmetic-v0 episodes; share of wall time outside ``generate``
    (env stepping + formatting + bookkeeping).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import agentgym  # noqa: F401
from agentgym.formatting import make_formatter
from agentgym.policy import SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.policies.models import load_tokenizer

TURNS = 16


def time_formatting(tok, style: str, repeats: int) -> dict[str, list[float]]:
    fmt = make_formatter(style, tok)
    sampled = tok.encode('<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>',
                         add_special_tokens=False) + [tok.eos_token_id]
    obs = [{"role": "tool", "name": "calculator", "content": "56088 " * 20}]
    messages = [{"role": "system", "content": "You solve arithmetic questions."}, {"role": "user", "content": "What is 123*456?"}]
    per_turn: dict[str, list[float]] = {"append_only": [[] for _ in range(TURNS)], "naive": [[] for _ in range(TURNS)]}
    for _ in range(repeats):
        conv = list(messages)
        for k in range(TURNS):
            conv = conv + [{"role": "assistant", "content": tok.decode(sampled, skip_special_tokens=True)}]
            t0 = time.perf_counter()
            fmt.observation_ids(sampled, obs)
            per_turn["append_only"][k].append(time.perf_counter() - t0)
            conv = conv + obs
            t0 = time.perf_counter()
            tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=True)
            per_turn["naive"][k].append(time.perf_counter() - t0)
    return {name: [statistics.median(x) for x in turns] for name, turns in per_turn.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="tiny-random", choices=["tiny-random", "smollm2"])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=None, help="write the raw numbers as JSON")
    args = ap.parse_args()
    tok = load_tokenizer()
    results: dict = {"machine": f"{platform.machine()} {platform.processor() or ''} {platform.node()}".strip(),
                     "python": platform.python_version()}

    for style in ("chat", "continuation"):
        timings = time_formatting(tok, style, args.repeats)
        a = timings["append_only"]
        n = timings["naive"]
        results[f"format_{style}"] = {"turn1_us": a[0] * 1e6, "turn16_us": a[-1] * 1e6, "ratio_16_over_1": a[-1] / a[0],
                                      "naive_turn1_us": n[0] * 1e6, "naive_turn16_us": n[-1] * 1e6,
                                      "naive_ratio_16_over_1": n[-1] / n[0]}
        r = results[f"format_{style}"]
        print(f"[format/{style}] append-only turn 1 {r['turn1_us']:.0f} us, turn 16 {r['turn16_us']:.0f} us "
              f"-> ratio {r['ratio_16_over_1']:.2f}  (naive re-tokenize: {r['naive_turn1_us']:.0f} -> "
              f"{r['naive_turn16_us']:.0f} us, ratio {r['naive_ratio_16_over_1']:.2f})")

    from agentgym.policies.transformers_policy import TransformersPolicy
    policy = TransformersPolicy.tiny_random(tok) if args.policy == "tiny-random" else TransformersPolicy.from_pretrained("smollm2")
    engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=args.max_new_tokens)))
    engine.collect("Arithmetic-v0", num_groups=2, seed=123)  # warm-up
    batch = engine.collect("Arithmetic-v0", num_groups=args.episodes, seed=0)
    m = batch.metrics
    results["engine"] = {k: m[k] for k in m if k.startswith("time/")} | {"episodes": args.episodes,
                                                                        "policy": args.policy,
                                                                        "generated_tokens": m["generated_tokens"]}
    print(f"[engine/{args.policy}] {args.episodes} episodes: wall {m['time/wall_s']:.2f} s, generate "
          f"{m['time/generate_s']:.2f} s, env {m['time/env_s']:.3f} s, formatting {m['time/format_s']:.3f} s "
          f"-> outside generate {100 * m['time/outside_generate_frac']:.2f} %")
    engine.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
