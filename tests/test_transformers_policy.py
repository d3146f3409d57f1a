"""TransformersPolicy (policies/transformers_policy.py) on a real 2-layer random-weight Llama with the
real SmolLM2 tokenizer (fp32, CPU), and once on the real SmolLM2-135M-Instruct."""

from __future__ import annotations

import copy

import pytest
import torch

from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.policy import Policy, SamplingParams

from fixtures_llm import eos_prone_policy, one_torch_thread, tiny_policy, tok  # noqa: F401  (fixtures)

CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You solve arithmetic questions."}, {"role": "user", "content": "What is 12 * 34?"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Ünïcödé 😀 — summarise: " + "lorem ipsum " * 12},
     {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Go on."}],
]


def chat_prompts(tok) -> list[list[int]]:
    """Chat-rendered prompts of very different lengths; they contain <|im_end|>, which is also the pad id."""
    return [tok.encode(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
            for c in CHATS]


def fresh_logprobs(policy: TransformersPolicy, prompt: list[int], gen_ids: list[int],
                   temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at the sampled tokens, from one unpadded forward pass over prompt + generation."""
    ids = torch.tensor([list(prompt) + list(gen_ids)])
    with torch.no_grad():
        logits = policy.model(ids).logits[0].float()
    steps = logits[len(prompt) - 1: len(prompt) - 1 + len(gen_ids)]
    return torch.log_softmax(steps / temperature, dim=-1).gather(-1, torch.tensor(gen_ids)[:, None]).squeeze(-1)


def test_is_a_policy(tok):
    pol = tiny_policy()
    assert isinstance(pol, Policy)
    assert pol.eos_ids == [tok.eos_token_id]
    assert pol.generate([], SamplingParams(max_new_tokens=2)) == []


def test_batched_greedy_equals_one_at_a_time(tok):
    """Left padding must not change anything: same greedy tokens (and log-probs) as generating alone."""
    pol = tiny_policy()
    prompts = chat_prompts(tok)
    lengths = [len(p) for p in prompts]
    assert max(lengths) > 3 * min(lengths) and all(tok.pad_token_id in p for p in prompts)
    sp = SamplingParams(max_new_tokens=10, greedy=True)
    batch = pol.generate(prompts, sp)
    for p, g in zip(prompts, batch):
        (alone,) = pol.generate([p], sp)
        assert g.token_ids == alone.token_ids and g.finish_reason == alone.finish_reason == "length"
        assert g.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True)
    # splitting into forward batches changes nothing either
    split = TransformersPolicy(pol.model, tok, max_batch_size=2).generate(prompts, sp)
    assert [g.token_ids for g in split] == [g.token_ids for g in batch]


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 50), (1.5, 1.0, 5)])
def test_logprobs_match_a_fresh_forward_pass(tok, temperature, top_p, top_k):
    """log-softmax of logits / T before top-p / top-k filtering, at the sampled token, for every row of
    a left-padded batch."""
    pol = tiny_policy()
    prompts = chat_prompts(tok)
    sp = SamplingParams(max_new_tokens=8, temperature=temperature, top_p=top_p, top_k=top_k, seed=3)
    gens = pol.generate(prompts, sp)
    for p, g in zip(prompts, gens):
        assert len(g.logprobs) == len(g.token_ids) == 8
        expected = fresh_logprobs(pol, p, g.token_ids, temperature)
        assert torch.allclose(torch.tensor(g.logprobs), expected, atol=1e-4), (g.logprobs, expected.tolist())


def test_greedy_logprobs_use_temperature_one(tok):
    pol = tiny_policy()
    (p,) = chat_prompts(tok)[:1]
    (g,) = pol.generate([p], SamplingParams(max_new_tokens=5, greedy=True, temperature=0.3))
    assert torch.allclose(torch.tensor(g.logprobs), fresh_logprobs(pol, p, g.token_ids, 1.0), atol=1e-4)
    # greedy = argmax of a fresh forward pass
    ids = torch.tensor([p + g.token_ids])
    with torch.no_grad():
        logits = pol.model(ids).logits[0]
    assert logits[len(p) - 1: -1].argmax(-1).tolist() == g.token_ids


def test_finish_reasons_eos_and_length_in_one_batch(tok):
    """Rows end at different steps; each is cut right after its EOS, and its log-probs stay exact."""
    pol = eos_prone_policy()
    prompts = chat_prompts(tok) * 3
    sp = SamplingParams(max_new_tokens=12, seed=0)
    gens = pol.generate(prompts, sp)
    reasons = [g.finish_reason for g in gens]
    assert set(reasons) == {"eos", "length"}, reasons
    assert len({len(g.token_ids) for g in gens if g.finish_reason == "eos"}) > 1
    for p, g in zip(prompts, gens):
        if g.finish_reason == "eos":
            assert g.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in g.token_ids[:-1]
            assert len(g.token_ids) <= 12
            assert not g.text.endswith(tok.eos_token)  # text is what the env gets: special tokens skipped
        else:
            assert len(g.token_ids) == 12 and tok.eos_token_id not in g.token_ids
        assert torch.allclose(torch.tensor(g.logprobs), fresh_logprobs(pol, p, g.token_ids, 1.0), atol=1e-4)


def test_greedy_eos_first(tok):
    pol = eos_prone_policy(100.0)
    (g,) = pol.generate(chat_prompts(tok)[:1], SamplingParams(max_new_tokens=6, greedy=True))
    assert (g.token_ids, g.text, g.finish_reason) == ([tok.eos_token_id], "", "eos")
    assert g.logprobs[0] == pytest.approx(0.0, abs=1e-4)


@pytest.mark.parametrize("max_new_tokens", [1, 3, 7])
def test_max_new_tokens(tok, max_new_tokens):
    gens = tiny_policy().generate(chat_prompts(tok), SamplingParams(max_new_tokens=max_new_tokens, seed=1))
    assert [len(g.token_ids) for g in gens] == [max_new_tokens] * 3
    assert {g.finish_reason for g in gens} == {"length"}


def _sample(pol, prompts, **kw):
    return [g.token_ids for g in pol.generate(prompts, SamplingParams(max_new_tokens=12, **kw))]


def test_stop_string_cuts_at_the_completing_token_and_keeps_it(tok):
    pol = tiny_policy()
    prompts = chat_prompts(tok)
    free = pol.generate(prompts, SamplingParams(max_new_tokens=12, seed=5))
    ids = free[1].token_ids
    pieces = [tok.decode([i]) for i in ids]
    # a stop string that starts inside token 3 and is completed inside token 5 (mid-token)
    j = next(j for j in range(5, 11) if len(pieces[j].strip()) >= 2 and len(pieces[j - 2]) >= 2)
    lead = len(pieces[j]) - len(pieces[j].lstrip())   # token j's leading space belongs to the stop string too
    stop = pieces[j - 2][-1] + pieces[j - 1] + pieces[j][:lead + 1]
    assert stop not in tok.decode(ids[:j])
    cut = pol.generate(prompts, SamplingParams(max_new_tokens=12, seed=5, stop=(stop,)))
    g = cut[1]
    assert g.finish_reason == "stop" and g.token_ids == ids[: j + 1]
    assert stop in g.text and g.text == tok.decode(ids[: j + 1])
    assert g.logprobs == pytest.approx(free[1].logprobs[: j + 1], abs=1e-5)
    # the other rows are unaffected by this row's stop (unless they contain it themselves)
    for f, c in zip(free, cut):
        if stop not in f.text:
            assert c.token_ids == f.token_ids and c.finish_reason == "length"


def test_seeded_sampling_is_reproducible(tok):
    pol = tiny_policy()
    prompts = chat_prompts(tok)
    a = _sample(pol, prompts, seed=123)
    assert _sample(pol, prompts, seed=123) == a
    assert _sample(pol, prompts, seed=124) != a
    assert _sample(pol, prompts, greedy=True) == _sample(pol, prompts, greedy=True)


def test_generation_leaves_training_mode_alone(tok):
    pol = tiny_policy()
    pol.model.train()
    try:
        pol.generate(chat_prompts(tok)[:1], SamplingParams(max_new_tokens=2, greedy=True))
        assert pol.model.training
    finally:
        pol.model.eval()


def test_sampling_params_validation():
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    assert SamplingParams(temperature=0.0, greedy=True).greedy
    assert SamplingParams().replace(stop=("x",)).stop == ("x",)


def test_real_smollm2_knows_the_capital_of_france():
    pol = TransformersPolicy.from_pretrained("smollm2")
    tok = pol.tokenizer
    question = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
    prompt = tok.encode(tok.apply_chat_template(question, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)
    (g,) = pol.generate([prompt], SamplingParams(max_new_tokens=20, greedy=True))
    assert "Paris" in g.text, g.text
    assert g.finish_reason in ("eos", "length") and len(g.token_ids) <= 20
    assert all(lp <= 0 for lp in g.logprobs)


# --- KV reuse across turns ----------------------------------------------------------------------------

def _extend(tok, prompts, gens, texts):
    return [list(p) + list(g.token_ids) + tok.encode(t, add_special_tokens=False)
            for p, g, t in zip(prompts, gens, texts)]


def _three_turns(pol: TransformersPolicy, tok, sp: SamplingParams):
    """Three turns of chat-like episodes of very different lengths; turn 3 adds a fresh prompt to the batch."""
    prompts = chat_prompts(tok)
    g1 = pol.generate(prompts, sp)
    p2 = _extend(tok, prompts, g1, [" ok.", " Tool says: 408 and more text " * 3, "\n"])
    g2 = pol.generate(p2, sp)
    p3 = _extend(tok, p2, g2, [" again", " x", " Results: " + "lorem " * 20]) + [prompts[1]]
    g3 = pol.generate(p3, sp)
    return [p2, p3], g1 + g2 + g3


@pytest.mark.parametrize("greedy", [True, False])
def test_kv_reuse_across_turns_changes_nothing_but_the_work(tok, greedy):
    """Later turns reuse the stored caches (counted), and give the same ids and log-probs as recomputing
    every prompt (fresh policy objects over the same module: nothing shared), which also match an
    unpadded forward pass."""
    model = tiny_policy().model
    sp = SamplingParams(max_new_tokens=8, greedy=greedy, temperature=0.8, seed=3)
    with_kv = TransformersPolicy(model, tok)
    without = TransformersPolicy(model, tok, reuse_kv=False)
    prompts_a, gens_a = _three_turns(with_kv, tok, sp)
    prompts_b, gens_b = _three_turns(without, tok, sp)
    assert with_kv.kv_reused_tokens > 100 and without.kv_reused_tokens == 0 and not without._kv
    for a, b in zip(gens_a, gens_b):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert prompts_a == prompts_b
    turn3 = gens_a[6:]
    for p, g in zip(prompts_a[1], turn3):
        assert torch.allclose(torch.tensor(g.logprobs), fresh_logprobs(with_kv, p, g.token_ids, 1.0 if greedy else 0.8),
                              atol=1e-4)


def test_kv_store_is_dropped_when_weights_change(tok):
    """An optimizer step between turns (no sync_weights call) must not leave stale keys: turn 2 equals a
    recomputation with the new weights, and nothing was reused."""
    pol = TransformersPolicy.tiny_random(tok, seed=5)
    sp = SamplingParams(max_new_tokens=6, greedy=True)
    prompts = chat_prompts(tok)
    g1 = pol.generate(prompts, sp)
    assert pol._kv
    opt = torch.optim.SGD(pol.model.parameters(), lr=0.5)
    loss = pol.model(torch.tensor([prompts[0]])).logits.float().pow(2).mean()
    loss.backward()
    opt.step()
    p2 = _extend(tok, prompts, g1, [" next"] * 3)
    reused = pol.kv_reused_tokens
    g2 = pol.generate(p2, sp)
    assert pol.kv_reused_tokens == reused
    for p, g in zip(p2, g2):
        assert torch.allclose(torch.tensor(g.logprobs), fresh_logprobs(pol, p, g.token_ids, 1.0), atol=1e-4)
    # sync_weights clears the store, whether it copies weights or the module is already its own
    other = TransformersPolicy.tiny_random(tok, seed=6)
    assert pol._kv
    pol.sync_weights(other.model)
    assert not pol._kv
    pol.generate(p2, sp)
    assert pol._kv
    pol.sync_weights(pol.model)
    assert not pol._kv


def test_kv_store_is_bounded(tok):
    pol = TransformersPolicy(tiny_policy().model, tok, kv_cache_tokens=120)
    prompts = chat_prompts(tok)
    pol.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True))
    assert 0 < pol._kv_tokens <= 120 and pol._kv_tokens == sum(len(k) for k in pol._kv)
    assert TransformersPolicy(tiny_policy().model, tok, kv_cache_tokens=0).generate(
        prompts, SamplingParams(max_new_tokens=2, greedy=True))
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        TransformersPolicy(tiny_policy().model, tok, kv_cache_tokens=-1)


@pytest.mark.parametrize("style", ["chat", "continuation"])
def test_kv_reuse_in_real_multi_turn_rollouts(tok, style):
    """The rollout engine on a multi-turn env (Arithmetic-v0: the tiny model's garbage earns "invalid
    action" turns): identical, token-faithful trajectories with and without reuse, and reuse happened."""
    from agentgym.rollout_config import RolloutConfig
    from agentgym.rollout import RolloutEngine
    from fixtures_llm import assert_faithful
    model = tiny_policy().model
    out = {}
    for reuse in (True, False):
        pol = TransformersPolicy(model, tok, reuse_kv=reuse)
        cfg = RolloutConfig(sampling=SamplingParams(max_new_tokens=12, temperature=1.0, seed=11), style=style,
                            debug_checks=True)
        engine = RolloutEngine(pol, cfg)
        try:
            out[reuse] = (engine.collect("agentgym/Arithmetic-v0", num_groups=3, group_size=2, seed=4),
                          pol.kv_reused_tokens)
            assert not pol._kv and pol._kv_tokens == 0   # every episode ended: the store was released
        finally:
            engine.close()
    (a, reused), (b, _) = out[True], out[False]
    assert reused > 0 and max(len(t.turn_spans) for t in a.trajectories) >= 3
    for ta, tb in zip(a.trajectories, b.trajectories):
        assert ta.token_ids == tb.token_ids and ta.loss_mask == tb.loss_mask
        assert ta.logprobs == pytest.approx(tb.logprobs, abs=1e-5)
        assert_faithful(ta, tok, style)


# --- CPU grouped-query attention under a mask ---------------------------------------------------------

def test_cpu_gqa_attention_equals_transformers_sdpa(tok):
    """The default attention (``agentgym_sdpa``) gives transformers' ``sdpa`` numbers — forward and
    gradients — on a grouped-query Llama (4 query / 2 KV heads) with a left-padded batch (the masked case
    it changes), and without a mask; generation from both is identical."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentgym.policies.models import CPU_GQA_SDPA, default_attention
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg)
    ref.set_attn_implementation("sdpa")
    ours = LlamaForCausalLM(copy.deepcopy(cfg))      # its own config: the attention choice lives there
    ours.load_state_dict(ref.state_dict())
    default_attention(ours)
    assert ours.config._attn_implementation == CPU_GQA_SDPA and ref.config._attn_implementation == "sdpa"
    ids = torch.randint(10, 1000, (3, 12))
    for mask in (torch.tensor([[0] * 5 + [1] * 7, [1] * 12, [0] * 2 + [1] * 10]), None):
        outs = []
        for model in (ref, ours):
            model.zero_grad()
            logits = model(input_ids=ids, attention_mask=mask).logits
            logits.float().pow(2).mean().backward()
            outs.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        (la, ga), (lb, gb) = outs
        keep = (mask if mask is not None else torch.ones_like(ids)).bool()
        assert torch.allclose(la[keep], lb[keep], atol=1e-5)
        for n in ga:
            assert torch.allclose(ga[n], gb[n], atol=1e-5, rtol=1e-4), n
    sp = SamplingParams(max_new_tokens=6, greedy=True)
    prompts = chat_prompts(tok)
    a = TransformersPolicy(ref.eval(), tok).generate(prompts, sp)
    b = TransformersPolicy(ours.eval(), tok).generate(prompts, sp)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert all(x.logprobs == pytest.approx(y.logprobs, abs=1e-5) for x, y in zip(a, b))


def test_generation_with_kv_reuse_uses_no_deprecated_transformers_api(tok):
    """Three turns (the later ones pass the stored KV back into ``generate`` and read the new cache off its
    output) emit no FutureWarning / DeprecationWarning from transformers or attributed to our calls, and
    no deprecation line on transformers' logger. transformers renamed ``past_key_values`` to ``cache``;
    the old name warned on every run that reused KV (see ``generate_cache_name``)."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    hf_root = hf_logging.get_logger("transformers")
    handler = Keep(level=logging.WARNING)
    hf_root.addHandler(handler)
    once = getattr(logging.Logger, "warning_once", None)   # transformers' once-per-process warnings
    if once is not None and hasattr(once, "cache_clear"):
        once.cache_clear()   # so an earlier test's identical line cannot hide this one's
    pol = TransformersPolicy(tiny_policy().model, tok)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for greedy in (True, False):
                _three_turns(pol, tok, SamplingParams(max_new_tokens=6, greedy=greedy, temperature=0.8, seed=1))
    finally:
        hf_root.removeHandler(handler)
    assert pol.kv_reused_tokens > 0   # the KV path ran
    ours = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught
            if issubclass(w.category, (FutureWarning, DeprecationWarning)) and "transformers" in w.filename]
    assert ours == []
    assert [m for m in lines if "deprecat" in m.lower()] == []


def test_cpu_gqa_attention_runs_a_bf16_update_in_fp32_and_generation_in_bf16(tok):
    """Under bf16 autocast with gradients (a learner update) the attention kernel runs in fp32 (torch's CPU
    flash kernel is ~3x slower backward in bf16) and returns bf16 like the projections around it; without
    gradients (generation, no-grad passes) it runs in bf16. The bf16 update's gradients match fp32's to
    bf16 rounding."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentgym.policies import models

    class KernelDtypes(TorchDispatchMode):      # what the aten attention kernel really gets, after autocast
        def __init__(self):
            super().__init__()
            self.seen: list[torch.dtype] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "scaled_dot_product" in str(func) and "backward" not in str(func):
                self.seen.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = models.default_attention(LlamaForCausalLM(cfg))
    ids = torch.randint(10, 1000, (3, 12))
    for no_padding in (None, torch.ones_like(ids)):        # without padding transformers drops the mask
        with KernelDtypes() as kernels, torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids, attention_mask=no_padding).logits.float().mean().backward()
        assert kernels.seen == [torch.float32] * 2
    mask = torch.tensor([[0] * 5 + [1] * 7, [1] * 12, [0] * 2 + [1] * 10])
    grads = {}
    for bf16 in (False, True):
        model.zero_grad()
        with KernelDtypes() as kernels, torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids, attention_mask=mask).logits
        assert kernels.seen == [torch.float32] * 2                                # fp32, in bf16's update too
        logits.float()[mask.bool()].log_softmax(-1)[:, 5].mean().backward()    # a log-prob loss, as learners'
        grads[bf16] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n, g in grads[False].items():
        assert float((grads[True][n] - g).norm()) <= 0.05 * float(g.norm()) + 1e-8, n
    with KernelDtypes() as kernels, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, attention_mask=mask)
    assert kernels.seen == [torch.bfloat16] * 2                                   # generation keeps bf16


# --- the sampler: inverse CDF instead of torch.multinomial (issue 49) ---------------------------------------

def _draws(scores, n, seed=0, sp=None):
    from agentgym.policies.transformers_policy import InverseCdfSampler, sampling_processors
    procs = sampling_processors(sp) if sp is not None else [InverseCdfSampler()]
    torch.manual_seed(seed)
    rows = scores.expand(n, -1).clone()
    for p in procs:
        rows = p(None, rows)
    assert torch.isfinite(rows).sum(-1).eq(1).all()      # exactly one finite score per row: greedy takes it
    return rows.argmax(-1)


def test_inverse_cdf_sampler_draws_the_softmax_distribution():
    scores = torch.tensor([[2.0, 0.5, float("-inf"), -1.0, 1.0]])
    n = 40000
    counts = torch.bincount(_draws(scores, n), minlength=5).float()
    p = torch.softmax(scores, -1)[0]
    assert counts[2] == 0                                   # probability 0 is never drawn
    sigma = (n * p * (1 - p)).sqrt()
    assert ((counts - n * p).abs() <= 4 * sigma + 1).all(), (counts / n, p)


def test_inverse_cdf_sampler_with_temperature_top_k_and_top_p():
    scores = torch.tensor([[3.0, 2.5, 2.0, 0.0, -1.0]])
    n = 20000
    top2 = torch.bincount(_draws(scores, n, sp=SamplingParams(top_k=2)), minlength=5)
    assert top2[2:].sum() == 0 and top2[0] > top2[1] > 0
    hot = torch.bincount(_draws(scores, n, sp=SamplingParams(temperature=0.5)), minlength=5).float() / n
    assert hot[0] == pytest.approx(float(torch.softmax(scores / 0.5, -1)[0, 0]), abs=0.015)
    # top_p 0.5: the smallest set whose mass reaches 0.5 is {0, 1} here (p0 = 0.49)
    nucleus = torch.bincount(_draws(scores, n, sp=SamplingParams(top_p=0.5)), minlength=5)
    assert nucleus[2:].sum() == 0 and nucleus[1] > 0


def test_inverse_cdf_sampler_never_draws_a_zero_probability_token_at_u_zero(monkeypatch):
    from agentgym.policies.transformers_policy import InverseCdfSampler
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.zeros(shape))
    scores = torch.tensor([[float("-inf"), float("-inf"), 0.0, 1.0]])
    assert InverseCdfSampler()(None, scores).argmax(-1).item() == 2


def test_sampled_generation_is_reproducible_and_varies_with_the_seed(tok):
    pol = tiny_policy()
    prompts = chat_prompts(tok)
    a = _sample(pol, prompts, seed=3)
    assert a == _sample(pol, prompts, seed=3) and a != _sample(pol, prompts, seed=4)
