"""Micro-batches by token budget (no padded FLOPs): rows of similar length together, the same update."""

from __future__ import annotations

import pytest
import torch
from fixtures_llm import cached_tokenizer, one_torch_thread  # noqa: F401  (autouse: one torch thread)
from helpers_learners import make

from agentgym.algorithms.loop.batch import collate

from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.trajectory import Trajectory


def _traj(n_prompt: int, n_resp: int, seed: int) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 200, (n_prompt + n_resp,), generator=g).tolist()
    return Trajectory(token_ids=ids, loss_mask=[0] * n_prompt + [1] * n_resp,
                      logprobs=[0.0] * n_prompt + [-2.0] * n_resp, prompt_length=n_prompt,
                      turn_spans=[(n_prompt, n_prompt + n_resp)], actions=["a"], finish_reasons=["eos"],
                      step_rewards=[float(seed % 3)], reward_terms=[{}], messages=[], group_id=seed // 4,
                      temperature=1.0)


LENGTHS = [(5, 3), (40, 20), (6, 2), (38, 25), (7, 4), (4, 3), (42, 18), (5, 5)]


def test_rows_are_grouped_by_length_within_the_budget_and_each_row_appears_once():
    batch = collate([_traj(p, r, i) for i, (p, r) in enumerate(LENGTHS)])
    pieces = list(batch.micro_rows(4, max_tokens=120))
    assert sorted(i for p in pieces for i in p) == list(range(len(LENGTHS)))
    for p in pieces:
        width = max(int(batch.lengths[i]) for i in p)
        assert len(p) <= 4 and (len(p) == 1 or len(p) * width <= 120)
    padded = sum(m.padded_tokens for m in batch.micro_batches(4, max_tokens=120))
    plain = sum(m.padded_tokens for m in batch.micro_batches(4))
    real = int(batch.lengths.sum())
    assert padded < plain and real <= padded
    assert [list(range(0, 4)), list(range(4, 8))] == list(batch.micro_rows(4))   # without a budget: as before
    with pytest.raises(ValueError, match="token budget"):
        list(batch.micro_rows(4, max_tokens=0))


def test_a_token_budget_gives_the_update_of_consecutive_micro_batches_with_less_padding():
    trajs = [_traj(p, r, i) for i, (p, r) in enumerate(LENGTHS)]
    out = {}
    for budget in (None, 120):
        policy = TransformersPolicy.tiny_random(cached_tokenizer(), seed=0)
        learner = make("grpo", policy, dict(lr=1e-3, micro_batch_size=4, micro_batch_tokens=budget,
                                                             kl_coef=0.05, seed=0))
        m = learner.update(trajs)
        out[budget] = (m, {k: v.detach().clone() for k, v in policy.model.state_dict().items()})
    (m0, w0), (m1, w1) = out[None], out[120]
    assert m1["pad_frac"] < m0["pad_frac"]
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-5, abs=1e-6)
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-5)
    # the same sum in another order: AdamW's first step moves each weight by ~lr, equal up to rounding
    diff = max((w0[k] - w1[k]).abs().max().item() for k in w0)
    assert diff <= 1e-2 * 1e-3, diff
