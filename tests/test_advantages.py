"""Advantage estimators against numbers worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym.algorithms.maths.returns import (BatchMeanBaseline, MovingAverageBaseline, NoBaseline, broadcast_to_tokens,
                                            discounted_returns, episode_returns, gae, group_normalize, leave_one_out,
                                            make_baseline, observation_history_keys, rebn, turn_gae,
                                            turn_group_normalize, turn_rewards)


# --------------------------------------------------------------------------- returns

def test_discounted_returns_by_hand():
    # rewards 1, 0, 2 with gamma 0.5:  G2 = 2;  G1 = 0 + 0.5·2 = 1;  G0 = 1 + 0.5·1 = 1.5
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == pytest.approx([1.5, 1.0, 2.0])
    # gamma 1: plain reward-to-go 3, 2, 2
    assert discounted_returns([1.0, 0.0, 2.0], 1.0) == pytest.approx([3.0, 2.0, 2.0])
    # gamma 0: each step only its own reward
    assert discounted_returns([1.0, 0.0, 2.0], 0.0) == pytest.approx([1.0, 0.0, 2.0])
    assert discounted_returns([], 0.9) == []


def test_broadcast_puts_each_turn_value_on_its_policy_tokens():
    # 10 tokens: prompt 0-2, turn 0 = [3, 5), env 5-6, turn 1 = [7, 9), env 9
    spans = [(3, 5), (7, 9)]
    assert broadcast_to_tokens(spans, [1.5, 2.0], 10) == [0, 0, 0, 1.5, 1.5, 0, 0, 2.0, 2.0, 0]
    # ablation: env tokens take the value of the turn they follow; the prompt stays 0
    assert broadcast_to_tokens(spans, [1.5, 2.0], 10, fill_env=True) == [0, 0, 0, 1.5, 1.5, 1.5, 1.5, 2.0, 2.0, 2.0]
    # a turn without a step reward (episode cut) gets 0
    assert broadcast_to_tokens(spans, [1.5], 10) == [0, 0, 0, 1.5, 1.5, 0, 0, 0, 0, 0]


# --------------------------------------------------------------------------- baselines

def test_no_and_batch_mean_baselines():
    returns = [1.0, 2.0, 3.0, 6.0]
    assert NoBaseline()(returns) == 0.0
    assert BatchMeanBaseline()(returns) == pytest.approx(3.0)   # (1+2+3+6)/4
    assert isinstance(make_baseline("mean"), BatchMeanBaseline)
    with pytest.raises(ValueError, match="unknown baseline"):
        make_baseline("median")


def test_moving_average_baseline_uses_earlier_batches_only():
    ema = MovingAverageBaseline(momentum=0.5)
    # batch 1, mean 2: nothing seen yet -> its own mean; the average becomes 2
    assert ema([1.0, 3.0]) == pytest.approx(2.0)
    assert ema.value == pytest.approx(2.0)
    # batch 2, mean 4: baseline is the old average 2; then 0.5·2 + 0.5·4 = 3
    assert ema([4.0, 4.0]) == pytest.approx(2.0)
    assert ema.value == pytest.approx(3.0)
    # batch 3, mean 0: baseline 3; then 0.5·3 + 0.5·0 = 1.5
    assert ema([0.0]) == pytest.approx(3.0)
    assert ema.value == pytest.approx(1.5)
    # a non-finite batch (its update is skipped) leaves the average alone
    assert math.isnan(ema([float("nan"), 1.0])) and ema.value == pytest.approx(1.5)
    restored = MovingAverageBaseline()
    restored.load_state_dict(ema.state_dict())
    assert (restored.momentum, restored.value) == (0.5, 1.5)


def test_rebn_by_hand():
    # G = 1, 2, 3, 6: mean 3, deviations -2, -1, 0, 3; population variance (4+1+0+9)/4 = 3.5, std 1.870829
    std = math.sqrt(3.5)
    assert rebn([1.0, 2.0, 3.0, 6.0], eps=0.0) == pytest.approx([-2 / std, -1 / std, 0.0, 3 / std])
    assert rebn([1.0, 2.0, 3.0, 6.0]) == pytest.approx([-1.069045, -0.534522, 0.0, 1.603567], abs=1e-5)
    # all equal: nothing to prefer -> 0 (eps keeps it finite)
    assert rebn([2.0, 2.0, 2.0]) == [0.0, 0.0, 0.0]
    assert rebn([]) == []


# --------------------------------------------------------------------------- GAE

# one trajectory of 7 tokens: prompt (0), turn 1 = tokens 1-2, env tokens 3-4, turn 2 = tokens 5-6
MASK = torch.tensor([0, 1, 1, 0, 0, 1, 1.0])
REWARDS = torch.tensor([0, 0, 1.0, 0, 0, 0, 2.0])        # step rewards on each turn's last token
VALUES = torch.tensor([9.0, 0.5, 1.0, 7.0, 7.0, 1.5, 2.0])  # env-token values are junk: they must not matter


def test_gae_by_hand_skips_env_tokens():
    # policy positions 1, 2, 5, 6 with V 0.5, 1.0, 1.5, 2.0 and r 0, 1, 0, 2; gamma 0.9, lambda 0.8 (γλ = 0.72)
    # pos 6: delta = 2 + 0.9·0   - 2.0 = 0.0   A = 0.0
    # pos 5: delta = 0 + 0.9·2.0 - 1.5 = 0.3   A = 0.3 + 0.72·0.0   = 0.3
    # pos 2: delta = 1 + 0.9·1.5 - 1.0 = 1.35  A = 1.35 + 0.72·0.3  = 1.566   (next state = token 5, not env)
    # pos 1: delta = 0 + 0.9·1.0 - 0.5 = 0.4   A = 0.4 + 0.72·1.566 = 1.52752
    adv, ret = gae(REWARDS, VALUES, MASK, gamma=0.9, lam=0.8)
    assert adv.tolist() == pytest.approx([0, 1.52752, 1.566, 0, 0, 0.3, 0.0], abs=1e-5)
    # returns = A + V on policy tokens: 2.02752, 2.566, 1.8, 2.0
    assert ret.tolist() == pytest.approx([0, 2.02752, 2.566, 0, 0, 1.8, 2.0], abs=1e-5)


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    # Search-R1's setting: A_t = (sum of later rewards) - V_t: 3-0.5, 3-1, 2-1.5, 2-2
    adv, ret = gae(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    assert adv.tolist() == pytest.approx([0, 2.5, 2.0, 0, 0, 0.5, 0.0])
    assert ret.tolist() == pytest.approx([0, 3.0, 3.0, 0, 0, 2.0, 2.0])


def test_gae_lambda_zero_is_one_step_td():
    # lambda 0: A_t = delta_t: 0.4, 1.35, 0.3, 0.0 (the deltas above)
    adv, _ = gae(REWARDS, VALUES, MASK, gamma=0.9, lam=0.0)
    assert adv.tolist() == pytest.approx([0, 0.4, 1.35, 0, 0, 0.3, 0.0], abs=1e-6)


def test_gae_batched_rows_match_single_rows_and_compact_sequences():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 12, generator=g)
    values = torch.randn(3, 12, generator=g)
    mask = (torch.rand(3, 12, generator=g) > 0.4).float()
    mask[:, 0] = 0
    adv, ret = gae(rewards, values, mask, gamma=0.95, lam=0.9)
    for b in range(3):
        a1, r1 = gae(rewards[b], values[b], mask[b], gamma=0.95, lam=0.9)
        assert torch.allclose(adv[b], a1) and torch.allclose(ret[b], r1)
        # the same as textbook GAE on the compacted sequence of kept positions
        keep = mask[b].bool()
        r, v = rewards[b][keep].tolist(), values[b][keep].tolist()
        expected, running = [0.0] * len(r), 0.0
        for t in reversed(range(len(r))):
            nxt = v[t + 1] if t + 1 < len(r) else 0.0
            running = r[t] + 0.95 * nxt - v[t] + 0.95 * 0.9 * running
            expected[t] = running
        assert adv[b][keep].tolist() == pytest.approx(expected, abs=1e-5)
        assert (adv[b][~keep] == 0).all()


# --------------------------------------------------------------------------- groups

def test_group_normalize_by_hand():
    rewards = [1.0, 0.0, 1.0, 1.0, 5.0, 5.0, 3.0]
    groups = [0, 0, 0, 0, 1, 1, None]
    # group 0: mean 0.75, deviations .25, -.75, .25, .25; sample variance (3·.0625 + .5625)/3 = .25, std .5
    #          -> .5, -1.5, .5, .5;  group 1: all equal -> 0;  no group -> 0
    assert group_normalize(rewards, groups, eps=0.0) == pytest.approx([0.5, -1.5, 0.5, 0.5, 0, 0, 0])
    # Dr.GRPO: only the mean is removed
    assert group_normalize(rewards, groups, scale=False) == pytest.approx([0.25, -0.75, 0.25, 0.25, 0, 0, 0])
    # default eps 1e-6 barely changes a std of 0.5
    assert group_normalize(rewards, groups)[1] == pytest.approx(-0.75 / (0.5 + 1e-6))


def test_group_normalize_groups_need_not_be_contiguous():
    # group "a" = indices 0, 2 (rewards 0, 2: mean 1, sample std sqrt(2)); group "b" = 1, 3 (rewards 1, 1)
    out = group_normalize([0.0, 1.0, 2.0, 1.0], ["a", "b", "a", "b"], eps=0.0)
    assert out == pytest.approx([-1 / math.sqrt(2), 0.0, 1 / math.sqrt(2), 0.0])


def test_leave_one_out_by_hand():
    # group 0: 1, 2, 6 -> 1 - (2+6)/2 = -3; 2 - (1+6)/2 = -1.5; 6 - (1+2)/2 = 4.5; a group of one and None: 0
    assert leave_one_out([1.0, 2.0, 6.0, 5.0, 5.0], [0, 0, 0, 1, None]) == pytest.approx([-3.0, -1.5, 4.5, 0.0, 0.0])
    # = n/(n-1) · (r - group mean): mean 3 -> 1.5 · (-2, -1, 3)
    assert leave_one_out([1.0, 2.0, 6.0], [0, 0, 0]) == pytest.approx([1.5 * -2, 1.5 * -1, 1.5 * 3])


# --------------------------------------------------------------------------- per-turn credit

def test_turn_rewards_and_episode_returns_by_hand():
    # tokens: prompt 0-1, turn 0 = [2, 4) (step reward 0.5 on token 3), env 4, turn 1 = [5, 7) (2.0 on token 6)
    # a KL penalty of -0.1 on token 2 belongs to turn 0 too
    rewards = [0, 0, -0.1, 0.5, 0, 0, 2.0]
    assert turn_rewards(rewards, [(2, 4), (5, 7)]) == pytest.approx([0.4, 2.0])
    assert episode_returns([0.4, 2.0]) == pytest.approx([2.4, 2.4])
    # discounted from the first turn: 0.4 + 0.5·2.0 = 1.4 on both turns
    assert episode_returns([0.4, 2.0], gamma=0.5) == pytest.approx([1.4, 1.4]) and episode_returns([]) == []


def test_observation_history_keys_keep_only_the_tokens_the_policy_did_not_sample():
    # ids 1 2 | 3 4 (policy) | 5 | 6 7 (policy): turn 0 saw (1, 2); turn 1 saw (1, 2, 5)
    keys = observation_history_keys([1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 0, 1, 1], [(2, 4), (5, 7)])
    assert keys == [(1, 2), (1, 2, 5)]
    # a different action with the same observations has the same key
    assert observation_history_keys([1, 2, 9, 9, 5, 6], [0, 0, 1, 1, 0, 1], [(2, 4), (5, 6)]) == keys


def test_turn_group_normalize_by_hand():
    # one group of three; turn values (returns-to-go): a = [3, 1], b = [1, 2], c = [2, 4]
    values = [[3.0, 1.0], [1.0, 2.0], [2.0, 4.0]]
    keys = [["p", "x"], ["p", "x"], ["p", "y"]]       # a and b reached the same state at turn 1, c another
    adv = turn_group_normalize(values, [0, 0, 0], keys, scale=False)
    # turn 0: one state (the prompt), mean 2 -> 1, -1, 0
    # turn 1: a, b share "x": mean 1.5 -> -0.5, +0.5; c has no peer -> the group's turn-1 pool {1, 2, 4}, mean 7/3
    assert [a[0] for a in adv] == pytest.approx([1.0, -1.0, 0.0])
    assert [a[1] for a in adv] == pytest.approx([-0.5, 0.5, 4.0 - 7.0 / 3.0])
    # without the index fallback a turn without a peer gets 0 (as a group of one)
    assert turn_group_normalize(values, [0, 0, 0], keys, scale=False, index_fallback=False)[2][1] == 0.0
    # leave-one-out: turn 0: 3 - 1.5 = 1.5, 1 - 2.5 = -1.5, 2 - 2 = 0; turn 1: 1 - 2 = -1, 2 - 1 = 1, 4 - 1.5 = 2.5
    loo = turn_group_normalize(values, [0, 0, 0], keys, leave_one_out_baseline=True)
    assert loo == [pytest.approx([1.5, -1.0]), pytest.approx([-1.5, 1.0]), pytest.approx([0.0, 2.5])]
    # std scaling: turn 0's pool {3, 1, 2} has sample std 1
    scaled = turn_group_normalize(values, [0, 0, 0], keys, scale=True, eps=0.0)
    assert [a[0] for a in scaled] == pytest.approx([1.0, -1.0, 0.0])
    # trajectories of other groups never share a pool; a turn nobody else reached gets 0
    other = turn_group_normalize([[1.0], [5.0, 7.0], [3.0]], [0, 0, 1], None, scale=False)
    assert other == [pytest.approx([-2.0]), pytest.approx([2.0, 0.0]), pytest.approx([0.0])]


def test_turn_gae_by_hand():
    # rewards 1, 0, 2; values 0.5, 1.0, 1.5; gamma = lam = 0.5
    # k=2: delta = 2 - 1.5 = 0.5;                A2 = 0.5
    # k=1: delta = 0 + 0.5·1.5 - 1.0 = -0.25;    A1 = -0.25 + 0.25·0.5 = -0.125
    # k=0: delta = 1 + 0.5·1.0 - 0.5 = 1.0;      A0 = 1.0 + 0.25·(-0.125) = 0.96875
    adv, ret = turn_gae([1.0, 0.0, 2.0], [0.5, 1.0, 1.5], gamma=0.5, lam=0.5)
    assert adv == pytest.approx([0.96875, -0.125, 0.5])
    assert ret == pytest.approx([1.46875, 0.875, 2.0])
    # gamma = lam = 1: return-to-go minus value
    adv, _ = turn_gae([1.0, 0.0, 2.0], [0.5, 1.0, 1.5])
    assert adv == pytest.approx([3.0 - 0.5, 2.0 - 1.0, 2.0 - 1.5])
