"""Generation engines side by side: the HF policy (``transformers`` ``generate``) vs the vLLM policy,
plus vLLM weight-sync time vs model size (issue 14).

    python benchmarks/generation.py --threads 2 --out benchmarks/results/generation.json

needs vLLM (``bash scripts/setup.sh --vllm``; here it ran from a venv that has it). Each engine runs in
its own subprocess per (dtype, batch) (clean memory and threads), HF and vLLM back to back so each pair
sees about the same machine load; ``--threads`` torch threads in each.

Generation: SmolLM2-135M-Instruct (the project's default model), fp32 and bf16, batches of 16 and 64
prompts of exactly ``--prompt-tokens`` (300) tokens cut from Python's standard-library docstrings
(different text per prompt, so no shared prefixes), ``--new-tokens`` (64) sampled at T = 1 with a seed,
through each policy's public ``generate`` (ids, log-probs, text). Timed per batch:

* turn 1 (the prefix cache is reset first);
* turn 1 prefill only (``max_new_tokens=1``, cache reset): decode tokens/s = (tokens of turn 1 -
  batch) / (time of turn 1 - time of prefill only), i.e. prefill removed;
* turn 2, right after turn 1: each prompt extended by its turn-1 ids and a ~10-token follow-up, 64
  new tokens again (vLLM reuses the turn-1 KV blocks from its prefix cache; HF recomputes).

Tokens/s counts the tokens the policy returned (a reply that ends at EOS counts its real length).

Compute bound, measured in each child just before its runs (same machine, threads and load): the
Linear layers of one SmolLM2 decode step at this batch (``batch x in`` times ``in x out``: 30 layers of
q/k/v/o/gate/up/down, 210 distinct weight matrices, plus the tied 49 152-row head; 538 MB in fp32, so
the weights stream from memory as in a real step), timed with ``torch.nn.functional.linear`` and with
vLLM's prepacked oneDNN GEMM (the faster of the two; median of repeats) -> GFLOP/s, and bound tokens/s
= batch / (time of that pass) = that rate / (2 x 134.5 M FLOPs per token). Attention over the
~360-token context (~7 % more FLOPs), norms, sampling and scheduling are left out, so it is an upper
bound. Also recorded: the cache-hot GEMM peak (each shape timed alone, its weight staying in cache).

Weight sync: ``VLLMPolicy.sync_weights(model)`` (in-process ``reload_weights`` + prefix-cache reset)
from an fp32 training model into an fp32 or bf16 engine, median of 3 after one warm-up; SmolLM2-135M
(real weights) and a random model with Qwen2.5-0.5B's published sizes (494 M parameters).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent

# SmolLM2-135M's Linear shapes per layer (in, out) and count of layers; the head is tied to the embedding.
SMOLLM2_LINEARS = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
SMOLLM2_LAYERS, SMOLLM2_HEAD = 30, (576, 49152)
FOLLOW_UP = "\n\nNow continue, with one more concrete example:\n"


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def set_threads(n: int) -> None:
    import torch
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------ prompts
def corpus_prompts(tokenizer: Any, n: int, length: int, skip: int = 0) -> list[list[int]]:
    """``n`` disjoint windows of ``length`` tokens of standard-library docstrings (deterministic)."""
    import collections, functools, itertools, json as js, os as o, pathlib, re, statistics as st, string, textwrap
    docs = []
    for mod in (collections, functools, itertools, js, o, pathlib, re, st, string, textwrap, inspect, subprocess):
        for name in sorted(dir(mod)):
            doc = inspect.getdoc(getattr(mod, name, None))
            if doc and len(doc) > 200:
                docs.append(doc)
    ids = tokenizer("\n\n".join(docs), add_special_tokens=False)["input_ids"]
    need = (n + skip) * length
    if len(ids) < need:
        raise RuntimeError(f"corpus too small: {len(ids)} tokens < {need}")
    return [ids[(i + skip) * length:(i + skip + 1) * length] for i in range(n)]


# ---------------------------------------------------------------------------------- jobs (child)
def _gemms(x: Any, weights: list[Any]) -> list[Any]:
    """Ways this machine computes ``x @ w.T`` for every ``w`` in turn: torch's Linear and, where vLLM
    is installed, the prepacked oneDNN GEMM its CPU backend uses for every Linear."""
    import torch.nn.functional as F
    fns = [lambda: [F.linear(x, w) for w in weights]]
    try:
        from vllm import _custom_ops as ops
        handlers = [ops.create_onednn_mm(w.t(), 32) for w in weights]
        fns.append(lambda: [ops.onednn_mm(h, x, None) for h in handlers])
    except Exception:  # noqa: BLE001 - no vLLM: torch's GEMM only
        pass
    return fns


def _median_time(fn: Any, repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bound_one(dtype_name: str, batch: int, repeats: int) -> dict[str, float]:
    """The decode compute bound of SmolLM2 at this batch (see the module docstring).

    ``step``: one pass over 211 distinct weight matrices of SmolLM2's shapes (538 MB in fp32), as a
    decode step reads them: the bound we compare with (the weights stream from memory).
    ``hot``: each shape timed on its own, its weight staying in cache: the GEMM peak, for reference.
    """
    import torch
    dtype = getattr(torch, dtype_name)
    shapes = [(s, SMOLLM2_LAYERS) for s in SMOLLM2_LINEARS] + [(SMOLLM2_HEAD, 1)]
    flops = sum(2.0 * batch * fi * fo * n for (fi, fo), n in shapes)
    hot_s, step_s = 0.0, float("inf")
    with torch.inference_mode():
        for (fan_in, fan_out), count in shapes:
            x, w = torch.randn(batch, fan_in, dtype=dtype), torch.randn(fan_out, fan_in, dtype=dtype)
            hot_s += min(_median_time(f, repeats) for f in _gemms(x, [w])) * count
        by_input: dict[int, list[Any]] = {}
        for (fan_in, fan_out), count in shapes:
            by_input.setdefault(fan_in, []).extend(torch.randn(fan_out, fan_in, dtype=dtype) for _ in range(count))
        passes = [_gemms(torch.randn(batch, fan_in, dtype=dtype), ws) for fan_in, ws in by_input.items()]
        for way in range(min(len(p) for p in passes)):
            step_s = min(step_s, _median_time(lambda: [p[way]() for p in passes], max(3, repeats // 4)))
    return {"gflops": flops / step_s / 1e9, "bound_tokens_per_s": batch / step_s,
            "gflops_hot": flops / hot_s / 1e9, "bound_tokens_per_s_hot": batch / hot_s, "flops_per_token": flops / batch}


def _timed(policy: Any, prompts: list[list[int]], sp: Any, reset: Any) -> tuple[float, list[Any]]:
    if reset is not None:
        reset()
    t = time.perf_counter()
    gens = policy.generate(prompts, sp)
    return time.perf_counter() - t, gens


def job_generate(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from agentgym.policy import SamplingParams
    set_threads(args.threads)
    load_avg_start = load_avg()
    t0 = time.perf_counter()
    if args.backend == "hf":
        from agentgym.policies.transformers_policy import TransformersPolicy
        policy = TransformersPolicy.from_pretrained("smollm2", device="cpu", dtype=getattr(torch, args.dtype))
        reset = None
    else:
        from agentgym.policies.vllm_policy import load
        policy = load("smollm2", dtype=args.dtype, max_model_len=2048)
        reset = policy.llm.reset_prefix_cache
    start_s = time.perf_counter() - t0
    tok = policy.tokenizer
    nmax = 64  # the same prompts whatever the batch sizes of this child
    prompts = corpus_prompts(tok, max(nmax, *args.batches), args.prompt_tokens)
    follow = tok(FOLLOW_UP, add_special_tokens=False)["input_ids"]
    warm = corpus_prompts(tok, 2, args.prompt_tokens, skip=max(nmax, *args.batches))
    policy.generate(warm, SamplingParams(max_new_tokens=4, seed=0))  # one-time costs out of the timings
    rows = []
    for b in args.batches:
        bound = bound_one(args.dtype, b, args.bound_repeats)  # measured now, under the same load
        batch = prompts[:b]
        full = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
        t_pre, _ = _timed(policy, batch, full.replace(max_new_tokens=1), reset)
        t1, gens1 = _timed(policy, batch, full, reset)
        n1 = sum(len(g.token_ids) for g in gens1)
        turn2 = [p + g.token_ids + follow for p, g in zip(batch, gens1)]
        t2, gens2 = _timed(policy, turn2, full.replace(seed=1), None)  # no reset: turn 1 is cached
        n2 = sum(len(g.token_ids) for g in gens2)
        row = {"batch": b, "turn1_s": t1, "turn1_tokens": n1, "turn1_tokens_per_s": n1 / t1,
               "prefill_only_s": t_pre, "decode_tokens_per_s": (n1 - b) / max(t1 - t_pre, 1e-9),
               "turn2_s": t2, "turn2_tokens": n2, "turn2_tokens_per_s": n2 / t2,
               "turn2_prompt_tokens_mean": sum(map(len, turn2)) / b,
               "turn2_cached_tokens_mean": (sum(g.meta.get("num_cached_tokens") or 0 for g in gens2) / b
                                            if args.backend == "vllm" else 0),
               "bound": bound, "load_avg": load_avg()}
        rows.append(row)
        print(f"[{args.backend} {args.dtype} b{b}] turn1 {row['turn1_tokens_per_s']:.1f} tok/s, decode "
              f"{row['decode_tokens_per_s']:.1f} tok/s, turn2 {row['turn2_tokens_per_s']:.1f} tok/s, bound "
              f"{bound['bound_tokens_per_s']:.0f} tok/s (load {row['load_avg']})", file=sys.stderr, flush=True)
    policy.close()   # a Backend from the one loader: close is part of its interface
    return {"backend": args.backend, "dtype": args.dtype, "start_s": start_s, "rows": rows,
            "load_avg_start": load_avg_start}


def job_sync(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM
    from agentgym.policies.models import _ensure_plain_copy, load_tokenizer, resolve_model
    from agentgym.policies.vllm_policy import load
    from agentgym.policy import SamplingParams
    set_threads(args.threads)
    tok = load_tokenizer("smollm2")
    with tempfile.TemporaryDirectory(prefix="agentgym-sync-bench-") as tmp:
        if args.model == "smollm2":
            model_dir = str(_ensure_plain_copy(resolve_model("smollm2")))
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        else:  # random weights, Qwen2.5-0.5B's sizes (speed does not depend on the values)
            sys.path.insert(0, str(HERE))
            from learner_throughput import build_model
            model = build_model("qwen2.5-0.5b", "cpu")
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)  # a tokenizer for the engine; the vocabulary is not exercised
            model_dir = tmp
        params = sum(p.numel() for p in model.parameters())
        out: dict[str, Any] = {"model": args.model, "params": params, "rows": []}
        for dtype_name in args.dtypes:
            t0 = time.perf_counter()
            policy = load(model_dir, tokenizer=tok, dtype=dtype_name, max_model_len=2048, kv_cache_memory_bytes=512 << 20)
            start_s = time.perf_counter() - t0
            policy.sync_weights(model)  # warm-up
            times = [policy.sync_weights(model) for _ in range(3)]
            check = policy.generate([tok("Hello", add_special_tokens=False)["input_ids"]],
                                    SamplingParams(max_new_tokens=2, greedy=True))
            assert len(check[0].token_ids) >= 1  # the engine still generates after the syncs
            policy.close()
            row = {"engine_dtype": dtype_name, "sync_s": statistics.median(times), "sync_s_all": times,
                   "engine_start_s": start_s, "load_avg": load_avg()}
            out["rows"].append(row)
            print(f"[sync {args.model} -> {dtype_name}] {row['sync_s']:.3f} s (load {row['load_avg']})",
                  file=sys.stderr, flush=True)
    return out


# ----------------------------------------------------------------------------------- driver
def run_child(argv: list[str], threads: int) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, __file__, *argv], env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {' '.join(argv)} failed ({proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> dict[str, Any]:
    import torch
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        import transformers
        import vllm
        info.update(transformers=transformers.__version__, vllm=vllm.__version__)
    except ImportError as e:
        info["vllm"] = f"unavailable ({e})"
    return info


def summarize(res: dict[str, Any]) -> list[str]:
    gen = {(g["backend"], g["dtype"], r["batch"]): r for g in res["generation"] for r in g["rows"]}
    lines = ["| dtype | batch | turn 1 tok/s HF / vLLM (ratio) | decode tok/s HF / vLLM (ratio) | bound tok/s "
             "(GFLOP/s; cache-hot) | % of bound HF / vLLM | turn 2 tok/s HF / vLLM (ratio) |",
             "|---|---:|---|---|---|---|---|"]
    for (backend, dtype, b), h in sorted(gen.items()):
        if backend != "hf" or ("vllm", dtype, b) not in gen:
            continue
        v = gen[("vllm", dtype, b)]
        bh, bv = h["bound"], v["bound"]
        bound = (bh["bound_tokens_per_s"] + bv["bound_tokens_per_s"]) / 2
        gfl = (bh["gflops"] + bv["gflops"]) / 2
        hot = (bh["gflops_hot"] + bv["gflops_hot"]) / 2

        def pair(k: str) -> str:
            return f"{h[k]:.1f} / {v[k]:.1f} ({v[k] / h[k]:.2f}×)"
        lines.append(f"| {dtype} | {b} | {pair('turn1_tokens_per_s')} | {pair('decode_tokens_per_s')} | "
                     f"{bound:.0f} ({gfl:.0f}; {hot:.0f}) | {100 * h['decode_tokens_per_s'] / bh['bound_tokens_per_s']:.0f} % / "
                     f"{100 * v['decode_tokens_per_s'] / bv['bound_tokens_per_s']:.0f} % | {pair('turn2_tokens_per_s')} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--bound-repeats", type=int, default=20)
    ap.add_argument("--sync-models", nargs="*", default=["smollm2", "qwen2.5-0.5b"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--job", choices=["generate", "sync"], help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        result = {"generate": job_generate, "sync": job_sync}[args.job](args)
        print(json.dumps(result))
        return

    common = ["--threads", str(args.threads), "--batches", *map(str, args.batches), "--dtypes", *args.dtypes,
              "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
              "--bound-repeats", str(args.bound_repeats)]
    t0 = time.perf_counter()
    res: dict[str, Any] = {"command": " ".join(["python", "benchmarks/generation.py", *sys.argv[1:]]),
                           "machine": machine(), "threads": args.threads, "load_avg_start": load_avg(),
                           "settings": {"prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                                        "temperature": 1.0, "model": "SmolLM2-135M-Instruct"}}
    # one child per (dtype, batch, backend), the two backends back to back: load drifts, pairs stay close
    res["generation"] = []
    for d in args.dtypes:
        for batch in args.batches:
            for b in args.backends:
                argv = ["--job", "generate", "--backend", b, "--dtype", d, *common]
                argv[argv.index("--batches") + 1: argv.index("--batches") + 1 + len(args.batches)] = [str(batch)]
                res["generation"].append(run_child(argv, args.threads))
    res["sync"] = [run_child(["--job", "sync", "--model", m, *common], args.threads) for m in args.sync_models]
    res["load_avg_end"], res["wall_s"] = load_avg(), time.perf_counter() - t0
    print("\n".join(summarize(res)) if {"hf", "vllm"} <= set(args.backends) else json.dumps(res["generation"]))
    for s in res["sync"]:
        print(s["model"], s["params"], [(r["engine_dtype"], round(r["sync_s"], 3)) for r in s["rows"]])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
