"""Learner update throughput (tokens/s): our ``GRPOLearner`` vs TRL's ``GRPOTrainer`` on the same batch;
on a GPU also decode tokens/s of a 0.5B-class model against the memory-bandwidth bound.

    # CPU, this machine (trl 1.16 in the main env):
    python benchmarks/learner_throughput.py --model-config tiny --out benchmarks/results/learner_throughput.json
    python benchmarks/learner_throughput.py --model-config smollm2-135m --prompt-len 32 --completion-len 32 ...
    # GPU (needs trl for the learner comparison; without it only our side runs):
    python benchmarks/learner_throughput.py --device cuda --model-config qwen2.5-0.5b --decode --out FILE
    # where the time goes: one more update per side under torch.profiler, its 20 costliest ops
    python benchmarks/learner_throughput.py --device cuda --model-config qwen2.5-0.5b --profile 20 ...

Models have random weights built from a published config (speed does not depend on the values):
``tiny`` (2-layer Llama, hidden 64, the SmolLM2 vocabulary of 49 152, as the tests use),
``smollm2-135m`` (SmolLM2-135M's sizes) and ``qwen2.5-0.5b`` (Qwen2.5-0.5B's: hidden 896, 24 layers,
14 heads, 2 KV heads, intermediate 4864, vocab 151 936, tied embeddings). Both sides start from
identical weights (one model, deep-copied before TRL patches its copy's forward).

The batch: ``--batch`` sequences in groups of ``--group-size`` (GRPO groups), each a ``--prompt-len``
prompt plus a ``--completion-len`` completion of random token ids (no padding), one reward per
sequence (seeded random). Both sides: no reference model (KL coefficient 0), clip epsilon 0.2,
token-mean loss over the batch (ours ``loss_agg="token-mean"``; TRL's default ``loss_type="dapo"``),
gradient-norm clipping at 1.0, AdamW lr 1e-6 without weight decay, the whole batch in one micro-batch
and one optimizer step; fp32 on CPU, fp32 weights with bf16 autocast on CUDA (both sides' defaults).

What is timed (``perf_counter``, after ``torch.cuda.synchronize()`` on CUDA):
  * ours: ``GRPOLearner.update(trajectories)``, everything: collating trajectories into tensors, group
    advantages, forward, loss, backward, clipping, optimizer step.
  * TRL: ``trainer.training_step(model, inputs)`` (forward with TRL's fused chunked log-prob head,
    loss, ``accelerator.backward``) + ``accelerator.clip_grad_norm_`` + ``optimizer.step()`` +
    ``lr_scheduler.step()`` + ``zero_grad``, i.e. what ``Trainer``'s inner loop does per optimizer
    step. ``inputs`` is the dict ``_generate_and_score_completions`` would produce (prompt/completion
    ids and masks, advantages, ``num_items_in_batch``), built before timing; TRL's
    ``_prepare_inputs`` (generation + scoring + padding + advantages) is replaced by the identity on
    this trainer instance, so TRL's padding and advantage computation are *not* timed while ours are.
    ``old_per_token_logps`` is left out, which TRL reads as "ratio 1" (``num_iterations=1``); our
    trajectories carry log-probs computed from the same initial weights, so both start at ratio 1.
The sides alternate (the order flips every repeat) after one untimed warm-up step each; medians.
Tokens/s counts every token of the batch (prompt + completion) through forward and backward; loss
tokens/s counts the completion tokens.

Decode (``--decode``): the model in bf16 (fp32 on CPU), greedy ``model.generate`` of ``--new-tokens``
tokens forced to full length (``min_new_tokens``), per batch size in ``--decode-batches``; the
per-token decode time is (time for N tokens - time for 1 token) / (N - 1), which removes prefill.
Measured twice: plain, and with ``return_dict_in_generate=True, output_logits=True`` as
``TransformersPolicy.generate`` asks for (it needs the logits for sampling-time log-probs). Bound:
each decode step reads every weight once plus the KV cache, so tokens/s <= batch x bandwidth /
(parameter bytes + batch x KV-cache bytes at the mean context). Bandwidth: ``--bandwidth-gbs`` or
the GPU's datasheet figure looked up by name (H100 SXM 3350, H100 PCIe 2000, H200 4800, A100 80GB
2039, A100 40GB 1555 GB/s).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import statistics
import tempfile
import time
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(arch="llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    # HuggingFaceTB/SmolLM2-135M config.json
    "smollm2-135m": dict(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0,
                         rms_norm_eps=1e-5, max_position_embeddings=8192),
    # Qwen/Qwen2.5-0.5B config.json
    "qwen2.5-0.5b": dict(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0,
                         rms_norm_eps=1e-6, max_position_embeddings=32768),
}

# Datasheet memory bandwidth, GB/s (first matching key wins, so specific names come first).
BANDWIDTH_GBS = [("H200", 4800.0), ("H100 PCIe", 2000.0), ("H100", 3350.0), ("A100-SXM4-80GB", 2039.0),
                 ("A100 80GB", 1935.0), ("A100", 1555.0), ("L40S", 864.0), ("L4", 300.0), ("A10G", 600.0),
                 ("A10", 600.0)]


def build_model(name: str, device: str, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    spec = dict(MODEL_CONFIGS[name])
    arch = spec.pop("arch")
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**spec, pad_token_id=0))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**spec, pad_token_id=0))
    return model.to(device)


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are one parameter


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- the batch
def make_batch(args: argparse.Namespace, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(args.seed)
    n_groups = args.batch // args.group_size
    rewards = torch.rand(args.batch, generator=g).round()  # 0/1 rewards
    grouped = rewards.view(n_groups, args.group_size)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    hi = min(vocab, 49152)
    return {"prompt": torch.randint(100, hi, (args.batch, args.prompt_len), generator=g),
            "completion": torch.randint(100, hi, (args.batch, args.completion_len), generator=g),
            "rewards": rewards, "advantages": adv, "groups": torch.arange(args.batch) // args.group_size}


# --------------------------------------------------------------------------- our side
class Ours:
    name = "agentgym GRPOLearner"

    def __init__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], args: argparse.Namespace):
        from agentgym.algorithms import GRPOConfig, GRPOLearner, OptimConfig
        from agentgym.trajectory import Trajectory
        self.device = args.device
        policy = SimpleNamespace(model=model, tokenizer=SimpleNamespace(pad_token_id=0))
        self.learner = GRPOLearner(
            policy, GRPOConfig(clip_eps=0.2, loss_agg="token-mean", kl_coef=0.0, micro_batch_size=args.batch, epochs=1),
            optim=OptimConfig(lr=1e-6, weight_decay=0.0, max_grad_norm=1.0),
            precision="bf16" if args.device.startswith("cuda") else "fp32")
        ids = torch.cat([batch["prompt"], batch["completion"]], 1)
        P, C = args.prompt_len, args.completion_len
        with torch.no_grad():  # sampling-time log-probs = the initial policy's (ratio 1 at the first step)
            logits = model(input_ids=ids.to(args.device), use_cache=False).logits[:, P - 1:-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None].to(args.device)).squeeze(-1).cpu()
        self.trajectories = [
            Trajectory(token_ids=ids[i].tolist(), loss_mask=[0] * P + [1] * C, logprobs=[0.0] * P + logp[i].tolist(),
                       prompt_length=P, turn_spans=[(P, P + C)], actions=["x"], finish_reasons=["length"],
                       step_rewards=[float(batch["rewards"][i])], reward_terms=[{}], messages=[],
                       group_id=int(batch["groups"][i]))
            for i in range(args.batch)]

    def step(self) -> float:
        sync(self.device)
        t0 = time.perf_counter()
        self.learner.update(self.trajectories)
        sync(self.device)
        return time.perf_counter() - t0


# --------------------------------------------------------------------------- TRL's side
class TRLSide:
    name = "trl GRPOTrainer"

    def __init__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], args: argparse.Namespace, tokenizer: Any):
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
        self.device = args.device
        cfg = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl_bench_"), per_device_train_batch_size=args.batch,
                         gradient_accumulation_steps=1, num_generations=args.group_size,
                         max_completion_length=args.completion_len, beta=0.0, epsilon=0.2, learning_rate=1e-6,
                         weight_decay=0.0, max_grad_norm=1.0, report_to="none", logging_steps=10**6,
                         use_cpu=args.device == "cpu", bf16=args.device.startswith("cuda"), save_strategy="no")
        dataset = Dataset.from_list([{"prompt": "unused"}] * args.batch)
        self.trainer = tr = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                        args=cfg, train_dataset=dataset, processing_class=tokenizer)
        tr.create_optimizer_and_scheduler(num_training_steps=1000)
        tr._prepare_inputs = lambda inputs: inputs          # the completions are given: no generation
        tr.current_gradient_accumulation_steps = 1          # set by Trainer's training loop otherwise
        dev = tr.accelerator.device
        ones = lambda t: torch.ones_like(t, dtype=torch.long)  # noqa: E731
        self.inputs = {"prompt_ids": batch["prompt"].to(dev), "prompt_mask": ones(batch["prompt"]).to(dev),
                       "completion_ids": batch["completion"].to(dev), "completion_mask": ones(batch["completion"]).to(dev),
                       "advantages": batch["advantages"].to(dev),
                       "num_items_in_batch": torch.tensor(float(batch["completion"].numel()), device=dev)}
        self.max_grad_norm = cfg.max_grad_norm

    def step(self) -> float:
        tr, model = self.trainer, self.trainer.model
        sync(self.device)
        t0 = time.perf_counter()
        tr.training_step(model, dict(self.inputs), self.inputs["num_items_in_batch"])
        tr.accelerator.clip_grad_norm_(model.parameters(), self.max_grad_norm)
        tr.optimizer.step()
        tr.lr_scheduler.step()
        model.zero_grad(set_to_none=True)
        sync(self.device)
        return time.perf_counter() - t0


def profile_step(side: Any, args: argparse.Namespace) -> str:
    """One update of ``side`` under ``torch.profiler``: the table of its ``args.profile`` costliest ops by
    self time on the device (on CPU, self CPU time), printed and returned (where does the time go?)."""
    from torch.profiler import ProfilerActivity, profile
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        side.step()
    table = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                      row_limit=args.profile)
    print(f"[profile] {side.name}, one update:\n{table}", flush=True)
    return table


def trl_tokenizer(vocab: int) -> Any:
    """TRL's trainer wants a processing class (it reads only the pad/EOS ids here: the completions are
    given). The SmolLM2 tokenizer when it loads, else a two-token tokenizer built in memory (GPU
    machines have neither the packaged model nor a hub)."""
    try:
        from agentgym.policies.models import load_tokenizer
        tok = load_tokenizer()
        if len(tok) <= vocab:
            return tok
    except Exception as e:  # noqa: BLE001 - any reason the packaged tokenizer is unavailable
        print(f"[learner] SmolLM2 tokenizer unavailable ({type(e).__name__}: {e}); using a minimal one")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<pad>": 0, "<eos>": 1}, unk_token="<pad>")),
                                   pad_token="<pad>", eos_token="<eos>")


# --------------------------------------------------------------------------- decode
def bandwidth_gbs(args: argparse.Namespace) -> tuple[float | None, str]:
    if args.bandwidth_gbs:
        return args.bandwidth_gbs, "given (--bandwidth-gbs)"
    if not args.device.startswith("cuda"):
        return None, "no GPU"
    name = torch.cuda.get_device_name()
    for key, bw in BANDWIDTH_GBS:
        if key in name:
            return bw, f"datasheet value for {key} (device: {name})"
    return None, f"unknown GPU {name!r}: pass --bandwidth-gbs"


def decode_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = build_model(args.model_config, args.device, args.seed).to(dtype).eval()
    cfg = model.config
    n_params = param_count(model)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * torch.finfo(dtype).bits // 8
    bw, bw_source = bandwidth_gbs(args)
    n = args.new_tokens
    out: dict[str, Any] = {"model_config": args.model_config, "params": n_params, "param_bytes": param_bytes,
                           "dtype": str(dtype), "kv_bytes_per_token": kv_bytes_per_token, "bandwidth_gbs": bw,
                           "bandwidth_source": bw_source, "prompt_len": args.decode_prompt_len, "new_tokens": n, "rows": []}
    g = torch.Generator().manual_seed(args.seed)
    for b in args.decode_batches:
        prompt = torch.randint(100, min(cfg.vocab_size, 49152), (b, args.decode_prompt_len), generator=g).to(args.device)
        mask = torch.ones_like(prompt)
        for mode in ("plain", "output_logits"):
            extra = dict(return_dict_in_generate=True, output_logits=True) if mode == "output_logits" else {}

            def gen(k: int) -> float:
                sync(args.device)
                t0 = time.perf_counter()
                with torch.no_grad():
                    model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=k, min_new_tokens=k,
                                   do_sample=False, pad_token_id=0, eos_token_id=None, **extra)
                sync(args.device)
                return time.perf_counter() - t0

            gen(4)  # warm-up (kernels, allocator)
            per_tok = []
            for _ in range(args.decode_repeats):
                per_tok.append((gen(n) - gen(1)) / (n - 1))
            t = statistics.median(per_tok)
            tok_s = b / t
            ctx = args.decode_prompt_len + n / 2
            bound = None if bw is None else b * bw * 1e9 / (param_bytes + b * ctx * kv_bytes_per_token)
            row = {"batch": b, "mode": mode, "ms_per_step": 1e3 * t, "tokens_per_s": tok_s,
                   "bound_tokens_per_s": bound, "fraction_of_bound": None if bound is None else tok_s / bound}
            out["rows"].append(row)
            frac = "" if bound is None else f" = {100 * tok_s / bound:.1f}% of the {bound:.0f} tok/s bound"
            print(f"[decode] batch {b:3d} {mode:13s}: {1e3 * t:7.2f} ms/step, {tok_s:9.1f} tok/s{frac}", flush=True)
    return out


# --------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--model-config", default="tiny", choices=sorted(MODEL_CONFIGS))
    ap.add_argument("--batch", type=int, default=8, help="sequences per update")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5, help="timed updates per side (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--skip-learner", action="store_true")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after timing, profile one more update per side (torch.profiler) and print its N "
                         "costliest ops by self time on the device (CPU time on CPU); 0: no profile")
    ap.add_argument("--decode", action="store_true", help="also measure decode tokens/s (meant for a GPU)")
    ap.add_argument("--decode-batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--decode-prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--decode-repeats", type=int, default=3)
    ap.add_argument("--bandwidth-gbs", type=float, default=None, help="GPU memory bandwidth (default: looked up)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the raw numbers as JSON")
    args = ap.parse_args()
    if args.batch % args.group_size:
        raise SystemExit("--batch must be a multiple of --group-size")
    if args.profile < 0:
        raise SystemExit("--profile must be >= 0 (the number of ops to list; 0: no profile)")
    if args.threads:
        torch.set_num_threads(args.threads)
    import importlib.metadata as md
    versions = {}
    for p in ("torch", "transformers", "trl", "accelerate"):
        with contextlib.suppress(md.PackageNotFoundError):
            versions[p] = md.version(p)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.node()}, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "python": platform.python_version(), "versions": versions, "args": vars(args),
        "load_avg_start": os.getloadavg(),
    }

    if not args.skip_learner:
        base = build_model(args.model_config, args.device, args.seed)
        vocab = base.config.vocab_size
        batch = make_batch(args, vocab)
        tokens = args.batch * (args.prompt_len + args.completion_len)
        loss_tokens = args.batch * args.completion_len
        sides: list[Any] = []
        try:
            sides.append(TRLSide(copy.deepcopy(base), batch, args, trl_tokenizer(vocab)))
        except ImportError as e:
            print(f"[learner] TRL side skipped: {e}")
            results["trl_skipped"] = str(e)
        sides.insert(0, Ours(base, batch, args))
        print(f"[learner] {args.model_config} ({param_count(base) / 1e6:.1f} M params) on {args.device}: "
              f"{args.batch} x ({args.prompt_len} + {args.completion_len}) tokens", flush=True)
        for s in sides:
            s.step()  # warm-up
        times: dict[str, list[float]] = {s.name: [] for s in sides}
        for r in range(args.repeats):
            for s in (sides if r % 2 == 0 else sides[::-1]):
                times[s.name].append(s.step())
            print(f"[learner] repeat {r + 1}/{args.repeats}: " +
                  ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()), flush=True)
        summary = {}
        for name, ts in times.items():
            med = statistics.median(ts)
            summary[name] = {"median_s": med, "tokens_per_s": tokens / med, "loss_tokens_per_s": loss_tokens / med,
                             "raw_s": ts}
        if len(sides) == 2:
            ours, trl = (times[s.name] for s in sides)
            summary["ours_speedup_vs_trl"] = statistics.median(t / o for o, t in zip(ours, trl))
        results["learner"] = {"model_config": args.model_config, "params": param_count(base), "tokens_per_update": tokens,
                              "loss_tokens_per_update": loss_tokens, **summary}
        for name, s in summary.items():
            if isinstance(s, dict):
                print(f"{name:24s} median {s['median_s']:.3f} s/update  {s['tokens_per_s']:9.1f} tokens/s  "
                      f"{s['loss_tokens_per_s']:9.1f} loss tokens/s")
        if "ours_speedup_vs_trl" in summary:
            print(f"ours / TRL throughput (median of paired repeats): {summary['ours_speedup_vs_trl']:.2f}x")
        if args.profile:
            results["learner"]["profile"] = {s.name: profile_step(s, args) for s in sides}
        del sides, base

    if args.decode:
        results["decode"] = decode_benchmark(args)
    results["load_avg_end"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    from _common import run_interruptible   # benchmarks/ is sys.path[0] when this runs as a script
    raise SystemExit(run_interruptible(main))   # Ctrl-C: one line and status 130, no traceback
