"""The policy seam (issue 14 §1, §3): one loader with a backend registry, ``sync_weights``, learners
that own their training module, and off-policy safety when a separate engine samples."""

from __future__ import annotations

import copy

import pytest
import torch

from agentgym.algorithms import LoraSettings
from agentgym.policies.backends import POLICY_BACKENDS, BackendUnavailable, resolve_backend
from agentgym.policies.loading import load_policy
from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.policy import SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from helpers_learners import make

ENV = "Math-v0"
ENV_KWARGS = {"kinds": ["arithmetic"], "difficulty": 0, "max_turns": 1}


def _batch(policy, temperature=1.0, n=4):
    engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=6, temperature=temperature,
                                                                        seed=0)))
    try:
        return engine.collect(ENV, num_groups=2, group_size=n // 2, seed=0, env_kwargs=ENV_KWARGS).trajectories
    finally:
        engine.close()


def _perturbed(policy, scale=0.05):
    twin = TransformersPolicy(copy.deepcopy(policy.model), policy.tokenizer)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in twin.model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return twin


def test_trajectories_carry_the_sampling_temperature():
    trajs = _batch(TransformersPolicy.tiny_random(seed=0), temperature=0.6)
    assert {t.temperature for t in trajs} == {0.6}


def test_learner_refuses_mixed_or_contradicting_temperatures():
    policy = TransformersPolicy.tiny_random(seed=0)
    a, b = _batch(policy, 0.6), _batch(policy, 1.0)
    with pytest.raises(ValueError, match="temperatures"):
        make("grpo", policy, dict(lr=0.0)).update(a + b)
    with pytest.raises(ValueError, match="sampled at temperature 0.6"):
        make("grpo", policy, dict(lr=0.0, temperature=1.0)).update(a)


def test_separate_sampler_old_logprobs_are_recomputed_and_divergence_logged():
    learner_policy = TransformersPolicy.tiny_random(seed=0)
    sampler = _perturbed(learner_policy)               # another engine: different numbers
    trajs = _batch(sampler)
    # using the sampler's log-probs as "old": the first ratio is off 1 even at lr=0
    naive = make("grpo", TransformersPolicy(copy.deepcopy(learner_policy.model), learner_policy.tokenizer),
                         dict(lr=0.0, old_logprobs="sampler")).update(trajs)
    assert abs(naive["ratio_mean"] - 1) > 1e-3
    m = make("grpo", learner_policy, dict(lr=0.0, tis_cap=2.0), separate_sampler=True).update(trajs)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and abs(m["approx_kl"]) < 1e-6
    assert m["sampler_logp_diff_mean"] > 0 and m["sampler_logp_diff_max"] >= m["sampler_logp_diff_mean"]
    assert 0 <= m["sampler_logp_diff_frac"] <= 1
    assert 0 < m["tis_weight_mean"] <= 2.0
    # the same sampler and learner: no divergence
    same = TransformersPolicy.tiny_random(seed=0)
    m = make("grpo", same, dict(lr=0.0, old_logprobs="recompute")).update(_batch(same))
    assert m["sampler_logp_diff_mean"] < 1e-4


def test_tis_changes_the_gradient_only_through_the_weights():
    base = TransformersPolicy.tiny_random(seed=0)
    trajs = _batch(_perturbed(base))
    grads = {}
    for cap in (None, 1.0):
        p = TransformersPolicy(copy.deepcopy(base.model), base.tokenizer)
        learner = make("reinforce", p, dict(lr=1e-2, tis_cap=cap, baseline="none"),
                               separate_sampler=True)
        learner.update(trajs)
        grads[cap] = torch.cat([x.detach().flatten() for x in p.model.parameters()])
    assert not torch.equal(grads[None], grads[1.0])


def test_learner_owns_peft_and_merged_weights_sync_into_a_separate_engine():
    policy = TransformersPolicy.tiny_random(seed=0)
    learner = make("grpo", policy, dict(lr=5e-2, lora=LoraSettings(r=4, alpha=8)))
    assert not hasattr(policy, "value_head") and type(policy.model).__name__ == "LlamaForCausalLM"
    learner.update(_batch(policy))
    merged = dict(learner.policy_weights())
    assert not any("lora_" in k or "base_layer" in k for k in merged)
    engine_copy = TransformersPolicy.tiny_random(seed=0)          # a separate "engine" with the old weights
    assert engine_copy.sync_weights(learner.policy_weights()) >= 0
    prompt = [_batch(policy)[0].token_ids[:20]]
    greedy = SamplingParams(max_new_tokens=5, greedy=True)
    a, b = policy.generate(prompt, greedy)[0], engine_copy.generate(prompt, greedy)[0]
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_colocated_sync_is_a_no_op_and_bad_weights_are_refused():
    policy = TransformersPolicy.tiny_random(seed=0)
    assert policy.sync_weights(policy.model) == 0.0
    with pytest.raises(ValueError, match="do not match"):
        policy.sync_weights([("no.such.weight", torch.zeros(1))])
    # right names plus one stray: refused before anything is loaded (the model is untouched)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    other = TransformersPolicy.tiny_random(seed=1).model.state_dict()
    with pytest.raises(ValueError, match="unexpected"):
        policy.sync_weights(list(other.items()) + [("no.such.weight", torch.zeros(1))])
    assert all(torch.equal(v, before[k]) for k, v in policy.model.state_dict().items())


def test_one_loader_and_its_backend_registry():
    assert set(POLICY_BACKENDS) >= {"hf", "vllm"}
    assert isinstance(load_policy("tiny-random", "hf"), TransformersPolicy)
    with pytest.raises(ValueError, match="unknown backend"):
        load_policy("tiny-random", "tgi")
    POLICY_BACKENDS["missing"] = "agentgym.policies.no_such_module:load"
    try:
        said = []
        assert resolve_backend("missing", notice=said.append) == "hf"
        assert len(said) == 1 and "unavailable" in said[0] and "hf" in said[0]
        assert isinstance(load_policy("tiny-random", "missing", notice=said.append), TransformersPolicy)
    finally:
        del POLICY_BACKENDS["missing"]
    assert issubclass(BackendUnavailable, ImportError)


def test_hf_backend_options_reach_the_policy_and_unknown_ones_are_refused():
    pol = load_policy("tiny-random", "hf", reuse_kv=False, kv_cache_tokens=64, max_batch_size=3)
    assert (pol.reuse_kv, pol.kv_cache_tokens, pol.max_batch_size) == (False, 64, 3)
    eager = load_policy("tiny-random", "hf", attn_implementation="eager")
    assert eager.model.config._attn_implementation == "eager"
    sp = SamplingParams(max_new_tokens=5, greedy=True)
    prompt = [[1, 2, 3, 4, 5, 6]]
    a, b = eager.generate(prompt, sp)[0], load_policy("tiny-random", "hf").generate(prompt, sp)[0]
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    with pytest.raises(ValueError, match=r"unknown hf backend option\(s\) \['gpu_memory_utilization'\]"):
        load_policy("tiny-random", "hf", gpu_memory_utilization=0.5)
