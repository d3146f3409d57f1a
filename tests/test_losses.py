"""The loss core: log-probs, ratio clipping, aggregation, KL estimators, entropy, value loss; the
retrieved-token mask proven on gradients (synthetic logits, then a real model inside each learner);
a non-finite loss skips the update."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from agentgym.algorithms.maths import losses
from agentgym.algorithms.loop.batch import Batch, collate
from agentgym.algorithms import OptimConfig, make_learner
from agentgym.algorithms.maths.losses import (LossSettings, aggregate, cispo_surrogate, clipped_surrogate,
                                        clipped_value_loss, dual_clip_surrogate, entropy_from_logits, gspo_surrogate,
                                        kl_penalty, ppo_objective, reinforce_surrogate, token_logprobs)
from agentgym.algorithms import OBJECTIVES, GRPOConfig
from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.policy import SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine

from fixtures_llm import cached_tokenizer, one_torch_thread  # noqa: F401  (autouse fixture)
from helpers_learners import algo_config

LN2 = math.log(2.0)


# --------------------------------------------------------------------------- log-probs and entropy

def test_trl_selective_log_softmax_is_found_and_agrees():
    fn = losses._trl_selective_log_softmax()
    assert fn is not None, "trl.trainer.utils.selective_log_softmax should be importable with trl 1.16"
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0))
    index = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    expected = logits.log_softmax(-1).gather(-1, index[..., None]).squeeze(-1)
    assert torch.allclose(fn(logits, index), expected, atol=1e-6)
    assert torch.allclose(losses._own_selective_log_softmax(logits, index), expected, atol=1e-6)


def test_token_logprobs_are_aligned_with_tokens_and_use_the_temperature():
    # vocabulary of 3; logits at position t predict token t+1
    logits = torch.tensor([[[0.0, 0.0, LN2], [LN2, 0.0, 0.0], [0.0, 0.0, 0.0]]])  # (1, 3, 3)
    ids = torch.tensor([[1, 2, 0]])
    logp, ent = token_logprobs(logits, ids, with_entropy=True)
    # token 2 after position 0: softmax(0, 0, ln2) = (1/4, 1/4, 1/2) -> log 1/2; token 0 after position 1: log 1/2
    assert logp.tolist()[0] == pytest.approx([0.0, math.log(0.5), math.log(0.5)])
    # entropy of (1/4, 1/4, 1/2) = 2·(1/4)·ln 4 + (1/2)·ln 2 = 1.5·ln 2
    assert ent.tolist()[0] == pytest.approx([0.0, 1.5 * LN2, 1.5 * LN2])
    # temperature 0.5: logits doubled -> softmax(0, 0, 2 ln2) = (1/6, 1/6, 4/6)
    logp_t, _ = token_logprobs(logits, ids, temperature=0.5)
    assert logp_t[0, 1].item() == pytest.approx(math.log(4 / 6))
    # offset 1: only the logits from position 1 on are given; position <= 1 is 0
    logp_o, _ = token_logprobs(logits[:, 1:], ids, offset=1)
    assert logp_o.tolist()[0] == pytest.approx([0.0, 0.0, math.log(0.5)])
    with pytest.raises(ValueError):
        token_logprobs(logits, ids, temperature=0.0)


def test_token_logprobs_at_chosen_positions_equal_the_full_pass_there_and_zero_elsewhere():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 9, 11, generator=g, requires_grad=True)
    ids = torch.randint(0, 11, (3, 9), generator=g)
    full, full_ent = token_logprobs(logits, ids, temperature=0.7, with_entropy=True)
    positions = torch.tensor([1, 2, 5, 7])
    part, part_ent = token_logprobs(logits[:, positions], ids, temperature=0.7, with_entropy=True, positions=positions)
    at = positions + 1
    assert torch.allclose(part[:, at], full[:, at]) and torch.allclose(part_ent[:, at], full_ent[:, at])
    others = torch.ones(9, dtype=torch.bool)
    others[at] = False
    assert (part[:, others] == 0).all() and (part_ent[:, others] == 0).all()
    part[:, at].sum().backward()                        # the gradient reaches the chosen logits only
    assert logits.grad[:, positions].abs().sum() > 0 and logits.grad[:, [0, 3, 4, 6, 8]].abs().sum() == 0
    with pytest.raises(ValueError, match="positions"):
        token_logprobs(logits[:, :3], ids, positions=positions)


def test_batch_logit_positions_are_the_union_of_what_the_rows_need():
    from agentgym.algorithms.loop.batch import Batch
    needed = torch.tensor([[0, 0, 1, 1, 0, 0, 0],
                           [0, 0, 0, 0, 0, 1, 0.]])
    width = needed.shape[1]
    fake = type("B", (), {"width": width})()   # only the method's arithmetic is under test
    assert Batch.logit_positions(fake, needed).tolist() == [1, 2, 4]   # logits at p predict token p + 1
    assert Batch.logit_positions(fake, torch.zeros(2, width)).tolist() == [width - 2]   # never empty


def test_entropy_closed_forms():
    assert entropy_from_logits(torch.zeros(1, 8)).item() == pytest.approx(math.log(8))   # uniform: log V
    assert entropy_from_logits(torch.tensor([[0.0, -1e4, -1e4]])).item() == pytest.approx(0.0, abs=1e-6)
    # chunking does not change anything
    x = torch.randn(7, 5, 13, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(entropy_from_logits(x, chunk_rows=3), entropy_from_logits(x))


# --------------------------------------------------------------------------- surrogates

def test_clipped_surrogate_by_hand():
    # ratios 1.5, 1.5, 0.5, 0.5, 1.1 with advantages +1, -1, +1, -1, +1 and eps 0.2
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    logp = torch.log(ratio).requires_grad_()
    loss, r, clipped = clipped_surrogate(logp, torch.zeros(5), adv, clip_eps=0.2)
    # +1, 1.5: max(-1.5, -1.2) = -1.2 (clipped)   -1, 1.5: max(1.5, 1.2) = 1.5
    # +1, 0.5: max(-0.5, -0.8) = -0.5             -1, 0.5: max(0.5, 0.8) = 0.8 (clipped)   +1, 1.1: -1.1
    assert loss.tolist() == pytest.approx([-1.2, 1.5, -0.5, 0.8, -1.1])
    assert r.tolist() == pytest.approx(ratio.tolist())
    assert clipped.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    loss.sum().backward()
    # clipped tokens have no gradient; the others -A·ratio
    assert logp.grad.tolist() == pytest.approx([0.0, 1.5, -0.5, 0.0, -1.1])


def test_clip_higher_widens_only_the_upper_bound():
    ratio = torch.tensor([1.5, 0.5])
    adv = torch.tensor([1.0, -1.0])
    loss, _, _ = clipped_surrogate(torch.log(ratio), torch.zeros(2), adv, clip_eps=0.2, clip_eps_high=0.28)
    # upper bound 1.28: -min(1.5, 1.28) = -1.28; lower bound still 0.8: max(0.5, 0.8) = 0.8
    assert loss.tolist() == pytest.approx([-1.28, 0.8])


def test_reinforce_surrogate_gradient_is_minus_advantage():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    reinforce_surrogate(logp, torch.tensor([2.0, -0.5])).sum().backward()
    assert logp.grad.tolist() == [-2.0, 0.5]


def test_dual_clip_bounds_the_loss_of_negative_advantages_by_hand():
    # Ye et al. 2020: for A < 0 the loss is min(PPO loss, -c·A); c = 3, eps = 0.2
    ratio = torch.tensor([5.0, 4.0, 2.0, 5.0, 0.5])
    adv = torch.tensor([-1.0, -0.5, -1.0, 1.0, -1.0])
    logp = torch.log(ratio).requires_grad_()
    loss, _, clipped = dual_clip_surrogate(logp, torch.zeros(5), adv, clip_eps=0.2, dual_clip_c=3.0)
    # 5, -1: PPO max(5, 1.2) = 5 -> min(5, 3) = 3        4, -0.5: max(2, 0.6) = 2 -> min(2, 1.5) = 1.5
    # 2, -1: PPO 2 < 3: unchanged                         5, +1: PPO max(-5, -1.2) = -1.2 (A > 0: no dual bound)
    # 0.5, -1: PPO max(0.5, 0.8) = 0.8 (the usual clip)
    assert loss.tolist() == pytest.approx([3.0, 1.5, 2.0, -1.2, 0.8])
    assert clipped.tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    loss.sum().backward()
    # under the dual bound the loss is the constant -c·A: no gradient; the unclipped token: -A·ratio = 2
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, 2.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="dual_clip_c"):
        dual_clip_surrogate(logp, torch.zeros(5), adv, dual_clip_c=1.0)


def test_gspo_uses_one_length_normalised_ratio_per_sequence_by_hand():
    # row 0: token log-ratios ln 2, 0 (and a masked token with log-ratio 5): s = exp(ln 2 / 2) = √2
    # row 1: log-ratios ln 4, ln 4: s = 4, outside [0.5, 1.5]
    old = torch.zeros(2, 3)
    logp = torch.tensor([[LN2, 0.0, 5.0], [2 * LN2, 2 * LN2, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    loss, ratio, clipped = gspo_surrogate(logp, old, adv, mask, clip_eps=0.5, clip_eps_high=0.5)
    s = math.sqrt(2.0)
    # every token carries its sequence's ratio; row 1 is clipped as a whole at 1.5
    assert ratio[0, :2].tolist() == pytest.approx([s, s]) and ratio[1, :2].tolist() == pytest.approx([4.0, 4.0])
    assert loss[0, :2].tolist() == pytest.approx([-s, -s]) and loss[1, :2].tolist() == pytest.approx([-1.5, -1.5])
    assert clipped[:, :2].tolist() == [[0.0, 0.0], [1.0, 1.0]]
    (loss * mask).sum().backward()
    # GSPO-token: each unclipped token's gradient is -A·s (the sequence ratio's value, its own log-prob's
    # direction); the clipped sequence gets none; a masked token does not enter s
    assert logp.grad[0].tolist() == pytest.approx([-s, -s, 0.0]) and logp.grad[1].tolist() == [0.0, 0.0, 0.0]


def test_gspo_token_form_has_the_sequence_objectives_gradient():
    # with one advantage per sequence and a per-sequence token mean, the token form's gradient equals that
    # of GSPO's sequence objective -min(s·A, clip(s)·A), s = exp(mean_t log-ratio) (Zheng et al. 2025)
    g = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, generator=g)
    base = (old + 0.01 * torch.randn(3, 5, generator=g))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float32)
    adv = torch.tensor([[0.7], [-1.2], [0.3]]).expand(3, 5)
    a = base.clone().requires_grad_()
    loss, _, _ = gspo_surrogate(a, old, adv, mask, clip_eps=0.2)
    aggregate(loss, mask, "seq-mean-token-mean").backward()
    b = base.clone().requires_grad_()
    s = torch.exp(((b - old) * mask).sum(-1) / mask.sum(-1))
    seq = torch.maximum(-adv[:, 0] * s, -adv[:, 0] * torch.clamp(s, 0.8, 1.2))
    seq.mean().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_cispo_keeps_every_tokens_gradient_with_a_clipped_detached_weight_by_hand():
    # ratios 1.5, 0.5, 1.1 with A = +1, -1, +1; no lower bound (eps 1), upper 1 + 0.28
    ratio = torch.tensor([1.5, 0.5, 1.1])
    adv = torch.tensor([1.0, -1.0, 1.0])
    logp = torch.log(ratio).requires_grad_()
    loss, r, clipped = cispo_surrogate(logp, torch.zeros(3), adv, clip_eps=1.0, clip_eps_high=0.28)
    # weights min(1.5, 1.28) = 1.28, 0.5, 1.1 (detached); loss -w·A·log p
    assert loss.tolist() == pytest.approx([-1.28 * math.log(1.5), 0.5 * math.log(0.5), -1.1 * math.log(1.1)])
    assert clipped.tolist() == [1.0, 0.0, 0.0] and r.tolist() == pytest.approx(ratio.tolist())
    loss.sum().backward()
    # gradient -w·A on every token, the clipped one included (PPO's clip would give it 0)
    assert logp.grad.tolist() == pytest.approx([-1.28, 0.5, -1.1])


def test_objective_takes_a_policy_term_and_the_named_surrogates():
    logp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    adv = torch.tensor([[0.0, 2.0, 2.0]])

    def half_pg(lp, old, a, ratio_mask):       # a user objective: half the on-policy policy gradient
        return -0.5 * a * lp, torch.exp(lp - old), torch.zeros_like(lp)
    loss, st = ppo_objective(logp, logp.detach(), adv, mask, LossSettings(), policy_term=half_pg)
    assert loss.item() == pytest.approx(-0.5 * 2 * (-1.0 - 2.0) / 2)   # token mean of -0.5·A·log p = 1.5
    for name in ("clip", "reinforce", "gspo", "cispo"):   # the registered objectives
        term = OBJECTIVES.lookup(name)(GRPOConfig())
        pg, ratio, _ = term(logp, logp.detach(), adv, mask)
        assert ratio[0, 1:].tolist() == pytest.approx([1.0, 1.0]), name   # on-policy: every ratio is 1
    with pytest.raises(ValueError, match="surrogate"):
        OBJECTIVES.lookup("dqn")


# --------------------------------------------------------------------------- aggregation

VALUES = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


def test_aggregation_modes_by_hand():
    # token sums S = (6, 4), tokens N = 4, sequences n = 2, padded width T = 4
    assert aggregate(VALUES, MASK, "token-mean").item() == pytest.approx(10 / 4)            # Σ S / N
    assert aggregate(VALUES, MASK, "seq-mean-token-mean").item() == pytest.approx((6 / 3 + 4 / 1) / 2)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)   # Σ S / n
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(10 / 4)  # Σ S / T
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm", max_len=10).item() == pytest.approx(10 / 10)
    assert aggregate(VALUES, MASK, "dr-grpo").item() == pytest.approx(10 / 4 / 2)          # Σ S / (n·T)
    assert aggregate(VALUES, MASK, "dr-grpo", max_len=10).item() == pytest.approx(10 / 10 / 2)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(VALUES, MASK, "sum")


@pytest.mark.parametrize("mode", losses.LOSS_AGG_MODES)
def test_a_sequence_without_loss_tokens_changes_no_aggregation(mode):
    """veRL's rule: a row whose mask is all 0 is not one of the sequences averaged over."""
    values = torch.cat([VALUES, torch.full((1, 4), 5.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4)])
    assert aggregate(values, mask, mode, max_len=4).item() == pytest.approx(aggregate(VALUES, MASK, mode).item())


@pytest.mark.parametrize("mode", losses.LOSS_AGG_MODES)
def test_aggregation_over_micro_batches_adds_up_to_the_whole(mode):
    whole = aggregate(VALUES, MASK, mode, max_len=4)
    parts = sum(aggregate(VALUES[i:i + 1], MASK[i:i + 1], mode, num_tokens=MASK.sum(), num_seqs=2, max_len=4)
                for i in range(2))
    assert parts.item() == pytest.approx(whole.item())


def test_whitening_uses_the_sample_variance_inside_the_root_as_trl_and_verl():
    # the first row's masked entries 1, 2, 3: mean 2, sample variance (1 + 0 + 1) / 2 = 1 (population: 2/3)
    out = losses.masked_whiten(VALUES[:1], MASK[:1])
    torch.testing.assert_close(out, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]) / math.sqrt(1.0 + 1e-8), rtol=0, atol=1e-7)
    both = losses.masked_whiten(VALUES, MASK)          # entries 1, 2, 3, 4: mean 2.5, sample variance 5/3
    torch.testing.assert_close(both[MASK.bool()], (torch.tensor([1.0, 2.0, 3.0, 4.0]) - 2.5) / math.sqrt(5 / 3 + 1e-8))
    assert both[~MASK.bool()].abs().sum() == 0
    one = losses.masked_whiten(VALUES, torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    assert one.abs().sum() == 0                          # one entry: nothing to scale by, no NaN


# --------------------------------------------------------------------------- KL

def test_kl_estimators_by_hand():
    # p(x) = 1/2 under the policy, 1/4 under the reference: d = ln 2
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(LN2)             # d
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * LN2 ** 2)  # d²/2 = 0.2402
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 + LN2 - 1)   # e^-d + d - 1 = 0.1931
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(0.5 + LN2 - 1)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, "k4")


def test_kl_estimators_against_the_closed_form_kl():
    # categorical p, q over 4 outcomes; the expectation under p of k1 and k3 is exactly KL(p‖q)
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    kl = (p * (p / q).log()).sum().item()   # = Σ p ln(4p) = 0.106440
    assert kl == pytest.approx(0.106440, abs=1e-6)
    for est in ("k1", "k3", "low_var_kl"):
        assert (p * kl_penalty(p.log(), q.log(), est)).sum().item() == pytest.approx(kl, rel=1e-9)
    # k2 is biased; for close distributions its expectation is the KL to second order: ½ E[d²] ≈ KL
    k2 = (p * kl_penalty(p.log(), q.log(), "k2")).sum().item()
    assert k2 == pytest.approx(kl, rel=0.1) and k2 != pytest.approx(kl, rel=1e-3)
    # k3 is never negative, k1 is
    d = torch.linspace(-3, 3, 13)
    assert (kl_penalty(d, torch.zeros(13), "k3") >= 0).all() and (kl_penalty(d, torch.zeros(13), "k1") < 0).any()


def test_low_var_kl_is_clamped():
    # d = -30: k3 = e^30 - 29 ≈ 1e13; low_var_kl clamps d to -20 before exp and the result to 10
    logp, ref = torch.tensor([-30.0]), torch.tensor([0.0])
    assert kl_penalty(logp, ref, "k3").item() > 1e12
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(10.0)


# --------------------------------------------------------------------------- value loss

def test_clipped_value_loss_by_hand():
    # V = 2, V_old = 1, R = 3, eps 0.2: V_clip = 1.2; max((2-3)², (1.2-3)²) = 3.24 -> 1.62, clipped
    # V = 1.1 (inside the clip range): V_clip = V; ½ (1.1-3)² = 1.805
    v = torch.tensor([2.0, 1.1], requires_grad=True)
    loss, clipped = clipped_value_loss(v, torch.tensor([1.0, 1.0]), torch.tensor([3.0, 3.0]), 0.2)
    assert loss.tolist() == pytest.approx([1.62, 1.805])
    assert clipped.tolist() == [1.0, 0.0]
    loss.sum().backward()
    assert v.grad.tolist() == pytest.approx([0.0, -1.9])   # clipped: no gradient; else V - R
    plain, _ = clipped_value_loss(torch.tensor([2.0]), torch.tensor([1.0]), torch.tensor([3.0]), None)
    assert plain.item() == pytest.approx(0.5)


# --------------------------------------------------------------------------- the objective

def test_objective_adds_entropy_bonus_kl_and_value_terms():
    logp = torch.tensor([[0.0, -1.0, -2.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    adv = torch.tensor([[0.0, 1.0, 1.0]])
    entropy = torch.tensor([[0.0, 2.0, 4.0]])
    ref = logp - LN2                      # d = ln 2 everywhere: k1 = ln 2
    values, returns = torch.tensor([[0.0, 1.0, 1.0]]), torch.tensor([[0.0, 2.0, 3.0]])
    s = LossSettings(entropy_coef=0.1, kl_coef=0.5, kl_estimator="k1", value_coef=0.5, value_clip_eps=None)
    loss, st = ppo_objective(logp, logp.detach(), adv, mask, s, entropy=entropy, ref_logp=ref, values=values,
                             old_values=values, returns=returns)
    # policy: ratio 1 -> -1 per token, mean -1; entropy mean 3; KL mean ln 2; value ½((1-2)² + (1-3)²)/2 = 1.25
    assert st["policy_loss"].item() == pytest.approx(-1.0)
    assert st["entropy"].item() == pytest.approx(3.0)
    assert st["kl"].item() == pytest.approx(LN2)
    assert st["value_loss"].item() == pytest.approx(1.25)
    assert loss.item() == pytest.approx(-1.0 - 0.1 * 3.0 + 0.5 * LN2 + 0.5 * 1.25)
    assert st["clip_frac"].item() == 0.0 and st["approx_kl"].item() == pytest.approx(0.0)


# --------------------------------------------------------------------------- retrieved-token masking

# one row of 8 tokens: prompt 0-1, policy 2-3, environment 4-5, policy 6-7
IDS = torch.tensor([[5, 1, 2, 3, 7, 8, 4, 6]])
LOSS_MASK = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1.0]])
RESPONSE_MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1.0]])
ENV = [4, 5]


def _all_terms_loss(logits: torch.Tensor, mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    logp, ent = token_logprobs(logits, IDS, temperature=0.7, with_entropy=True)
    old = torch.where(LOSS_MASK.bool(), logp.detach() - 0.1, torch.zeros_like(logp))  # sampling-time: 0 on env tokens
    adv = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0, 1.0, -0.5, -0.5]]) * mask
    s = LossSettings(entropy_coef=0.01, kl_coef=0.1, kl_estimator="k3", value_coef=0.5)
    loss, _ = ppo_objective(logp, old, adv, mask, s, sampled_mask=LOSS_MASK, entropy=ent, ref_logp=logp.detach() + 0.3,
                            values=values, old_values=torch.zeros_like(values), returns=torch.ones_like(values))
    return loss


def test_env_tokens_get_exactly_zero_gradient_when_masked():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 8, 10, generator=g, requires_grad=True)
    values = torch.randn(1, 8, generator=g, requires_grad=True)
    _all_terms_loss(logits, LOSS_MASK, values).backward()
    for t in ENV:  # the logits at t-1 produce token t's log-prob and entropy
        assert torch.count_nonzero(logits.grad[0, t - 1]) == 0
        assert values.grad[0, t] == 0
    for t in (2, 3, 6, 7):
        assert logits.grad[0, t - 1].abs().sum() > 0 and values.grad[0, t] != 0


def test_env_tokens_get_gradient_when_masking_is_off():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 8, 10, generator=g, requires_grad=True)
    values = torch.randn(1, 8, generator=g, requires_grad=True)
    _all_terms_loss(logits, RESPONSE_MASK, values).backward()
    for t in ENV + [2, 3, 6, 7]:
        assert logits.grad[0, t - 1].abs().sum() > 0 and values.grad[0, t] != 0
    # prompt tokens never count
    assert torch.count_nonzero(logits.grad[0, 0]) == 0


def test_unmasked_env_tokens_use_their_current_logprob_as_old():
    # ratio 1 for env tokens (no sampling-time log-prob), the sampling log-prob for policy tokens
    logp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[0.0, -1.5, 0.0]])            # token 2 is an env token: its stored 0 must be ignored
    sampled, mask = torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.0, 1.0, 1.0]])
    _, st = ppo_objective(logp, old, torch.ones(1, 3), mask, LossSettings(clip_eps=10.0), sampled_mask=sampled)
    # ratios: exp(-1 + 1.5) = 1.6487 and 1 -> mean 1.3244
    assert st["ratio_mean"].item() == pytest.approx((math.exp(0.5) + 1.0) / 2)


POLICY_SEED = 1


def new_policy() -> TransformersPolicy:
    """A fresh tiny random model; the same weights every time, so the trajectories' sampling-time
    log-probs are this policy's own (ratio 1 at the first step)."""
    return TransformersPolicy.tiny_random(cached_tokenizer(), seed=POLICY_SEED)


@pytest.fixture(scope="module")
def episodes():
    """Real multi-turn episodes: a random tiny model's actions are invalid in Arithmetic-v0, so the env
    answers with a message (environment tokens) and the episode runs its 2 turns."""
    torch.manual_seed(0)
    engine = RolloutEngine(new_policy(), RolloutConfig(sampling=SamplingParams(max_new_tokens=4),
                                                       style="continuation", env_workers=1))
    trajs = engine.collect("Arithmetic-v0", num_groups=1, group_size=2, seed=0,
                           env_kwargs={"max_turns": 2}).trajectories
    engine.close()
    for k, t in enumerate(trajs):  # give the two episodes different returns (GRPO needs a difference)
        t.step_rewards = [float(k + 1)] * len(t.step_rewards)
    assert all(t.num_turns == 2 and 0 < t.num_policy_tokens < len(t.token_ids) - t.prompt_length for t in trajs)
    return trajs


def _captured_logit_grads(name: str, mask_env_tokens: bool, trajs):
    """Run one real ``Learner.update`` and return the gradient that reached the model's logits, with the batch."""
    policy = new_policy()
    cfg = algo_config(name, micro_batch_size=8, kl_coef=0.05, entropy_coef=0.01, mask_env_tokens=mask_env_tokens,
                      baseline="none", whiten_advantages=False)
    learner = make_learner(name, policy, cfg, optim=OptimConfig(lr=1e-3))
    captured = []

    def keep(module, args, output):
        if output.requires_grad:  # the training forward (not the no-grad reference / value passes)
            output.retain_grad()
            captured.append(output)
    handle = policy.model.lm_head.register_forward_hook(keep)
    try:
        metrics = learner.update(copy.deepcopy(trajs))
    finally:
        handle.remove()
    assert metrics["skipped"] == 0 and metrics["optimizer_steps"] == 1 and len(captured) == 1
    batch = collate(trajs, pad_id=0)
    grad = torch.zeros(len(trajs), batch.width, captured[0].shape[-1])
    kept = batch.logit_positions(batch.train_mask(mask_env_tokens) + batch.loss_mask)   # what the learner projects
    assert captured[0].shape[1] == kept.numel()
    grad[:, kept] = captured[0].grad
    return grad, batch


@pytest.mark.parametrize("name", ["reinforce", "grpo", "ppo"])
def test_learner_update_gives_env_tokens_zero_gradient_only_when_masking(name, episodes):
    grad, batch = _captured_logit_grads(name, True, episodes)
    env = (batch.response_mask - batch.loss_mask).bool()
    policy_tokens = batch.loss_mask.bool()
    # the logits at position t-1 carry token t's terms: shift the masks left by one
    at_env = grad[:, :-1][env[:, 1:]]
    at_policy = grad[:, :-1][policy_tokens[:, 1:]]
    assert env.sum() > 0 and torch.count_nonzero(at_env) == 0
    assert (at_policy.abs().sum(-1) > 0).all()

    grad, batch = _captured_logit_grads(name, False, episodes)
    at_env = grad[:, :-1][env[:, 1:]]
    assert (at_env.abs().sum(-1) > 0).all(), "with mask_env_tokens=False every env token must carry loss"


def test_a_micro_batch_finds_its_logit_positions_once(episodes, monkeypatch):
    """The forward pass and the log-probs of a micro-batch read the same positions: they are found once
    per micro-batch (a ``nonzero``, which waits for a GPU), also with a reference pass (kl_coef > 0)."""
    asked = []
    real = Batch.logit_positions

    def counting(self, needed):
        asked.append(self)      # the objects kept alive, so that ids are not reused
        return real(self, needed)
    monkeypatch.setattr(Batch, "logit_positions", counting)
    learner = make_learner("grpo", new_policy(), GRPOConfig(kl_coef=0.1, micro_batch_size=2),
                           optim=OptimConfig(lr=1e-3))
    learner.update(copy.deepcopy(episodes))
    assert len(asked) >= 2 and len({id(b) for b in asked}) == len(asked)


# --------------------------------------------------------------------------- non-finite losses

@pytest.mark.parametrize("name, baseline", [("reinforce", "rebn"), ("reinforce", "ema"), ("grpo", "rebn"),
                                            ("ppo", "rebn")])
def test_non_finite_loss_skips_the_update_and_keeps_the_weights(name, baseline, episodes):
    policy = new_policy()
    trajs = copy.deepcopy(episodes)
    trajs[0].step_rewards[-1] = float("nan")
    learner = make_learner(name, policy, algo_config(name, baseline=baseline), optim=OptimConfig(lr=1e-2))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    head_before = [p.clone() for p in learner.critic_parameters()]
    metrics = learner.update(trajs)
    assert metrics["skipped"] == 1.0 and metrics["optimizer_steps"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())
    assert all(torch.equal(a, b) for a, b in zip(head_before, learner.critic_parameters()))
    assert learner.optimizer.state == {} and learner.step == 0
    assert all(p.grad is None for p in learner.policy_parameters())
    if baseline == "ema":
        assert learner.baseline.value is None    # the moving average did not take the NaN in


def test_infinite_old_logprob_is_caught_too(episodes):
    policy = new_policy()
    trajs = copy.deepcopy(episodes)
    s, _ = trajs[0].turn_spans[0]
    trajs[0].logprobs[s] = float("-inf")          # ratio exp(logp + inf) = inf
    learner = make_learner("grpo", policy, optim=OptimConfig(lr=1e-2))
    before = [p.clone() for p in learner.policy_parameters()]
    assert learner.update(trajs)["skipped"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, learner.policy_parameters()))
