"""Per-turn credit assignment: how step rewards reach each turn's tokens (``learner.credit``).

Every estimator is checked against numbers worked out by hand on hand-built trajectories (the
arithmetic is in the comments), then the bias case of verl issue #7244 is built and the estimators'
expected policy gradients are computed *exactly*, by enumerating every outcome of a small group;
finally a real learner runs each credit choice on real multi-turn episodes.
"""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from agentgym.algorithms import (ADVANTAGES, GRPOConfig, PPOConfig, ReinforceConfig, RLOOConfig, collate)
from helpers_learners import make
from agentgym.algorithms.maths.advantages import AdvantageInputs
from agentgym.trajectory import Trajectory

PROMPT = [1, 2]


def episode(turns: list[list[int]], observations: list[list[int]], rewards: list[float], group: int | None = 0,
            prompt: list[int] = PROMPT) -> Trajectory:
    """A hand-built trajectory: the prompt, then each turn's sampled ids followed by the observation
    after it (``observations[k]``, environment tokens)."""
    ids, mask, spans = list(prompt), [0] * len(prompt), []
    for k, action in enumerate(turns):
        spans.append((len(ids), len(ids) + len(action)))
        ids += action
        mask += [1] * len(action)
        obs = observations[k] if k < len(observations) else []
        ids += obs
        mask += [0] * len(obs)
    return Trajectory(ids, mask, [0.0] * len(ids), len(prompt), spans, ["a"] * len(turns), ["stop"] * len(turns),
                      list(rewards), [{} for _ in rewards], [], group_id=group)


def advantages(algo_config, trajectories: list[Trajectory], values: torch.Tensor | None = None,
               estimator: str | None = None) -> tuple[list[list[float]], list[list[float]], torch.Tensor]:
    """Run an advantage estimator on the trajectories; per trajectory, each turn's advantage and return
    (read at the turn's tokens, which must all agree), and the token tensor."""
    batch = collate(trajectories)
    name = estimator or {"ReinforceConfig": "returns", "GRPOConfig": "group", "RLOOConfig": "rloo",
                         "PPOConfig": "gae"}[type(algo_config).__name__]
    est = ADVANTAGES[name](algo_config)
    adv, ret = est(AdvantageInputs(trajectories, batch.token_rewards, batch.loss_mask, values))
    adv, ret = adv * batch.loss_mask, ret * batch.loss_mask
    per_turn_adv, per_turn_ret = [], []
    for i, t in enumerate(trajectories):
        a_row, r_row = [], []
        for s, e in t.turn_spans:
            assert torch.allclose(adv[i, s:e], adv[i, s].expand(e - s)), "a turn's tokens share its advantage"
            a_row.append(float(adv[i, s]))
            r_row.append(float(ret[i, s]))
        per_turn_adv.append(a_row)
        per_turn_ret.append(r_row)
    env = (batch.attention_mask.float() - batch.loss_mask).bool()
    assert torch.count_nonzero(adv[env]) == 0, "environment and prompt tokens get no advantage"
    return per_turn_adv, per_turn_ret, adv


def two_turn_group() -> list[Trajectory]:
    """a: rewards 0.5 then 1.0; b: 0 then 0.5 (same observation "3" between the turns)."""
    return [episode([[10, 11], [12]], [[3]], [0.5, 1.0]), episode([[13], [14, 15]], [[3]], [0.0, 0.5])]


# --------------------------------------------------------------------------- the estimators by hand

def test_episode_credit_broadcasts_the_return_to_every_turn():
    # GRPO (Dr.GRPO: no std): returns 1.5 and 0.5, group mean 1 -> +0.5 on both of a's turns, -0.5 on b's
    adv, ret, _ = advantages(GRPOConfig(credit="episode", group_scale=False), two_turn_group())
    assert adv == [pytest.approx([0.5, 0.5]), pytest.approx([-0.5, -0.5])]
    assert ret == [pytest.approx([1.5, 1.5]), pytest.approx([0.5, 0.5])]
    # REINFORCE, episode credit, batch-mean baseline over episodes (one value each): mean 1 -> ±0.5
    adv, _, _ = advantages(ReinforceConfig(credit="episode", baseline="mean"), two_turn_group())
    assert adv == [pytest.approx([0.5, 0.5]), pytest.approx([-0.5, -0.5])]


def test_per_turn_returns_to_go_with_discount():
    # gamma 0.5: a: G = [0.5 + 0.5·1.0, 1.0] = [1.0, 1.0];  b: G = [0 + 0.5·0.5, 0.5] = [0.25, 0.5]
    cfg = ReinforceConfig(credit="turn", gamma=0.5, baseline="none")
    adv, ret, _ = advantages(cfg, two_turn_group())
    assert adv == [pytest.approx([1.0, 1.0]), pytest.approx([0.25, 0.5])] and ret == adv
    # a batch-mean baseline pools the four transitions: mean (1 + 1 + 0.25 + 0.5) / 4 = 0.6875
    adv, _, _ = advantages(ReinforceConfig(credit="turn", gamma=0.5, baseline="mean"), two_turn_group())
    assert adv == [pytest.approx([0.3125, 0.3125]), pytest.approx([-0.4375, -0.1875])]
    # episode credit with gamma: every turn gets the discounted return from the first turn, G_0
    adv, _, _ = advantages(ReinforceConfig(credit="episode", gamma=0.5, baseline="none"), two_turn_group())
    assert adv == [pytest.approx([1.0, 1.0]), pytest.approx([0.25, 0.25])]


def test_grpo_turn_credit_uses_turn_level_baselines_of_equal_observation_histories():
    # three episodes of one group. Turn 0 starts from the prompt for all: one pool.
    # a and b then see observation 3 (the same history), c sees 4 (no peer: the group's turn-1 pool).
    trajs = [episode([[10], [11]], [[3]], [0.0, 1.0]),    # G = [1, 1]
             episode([[12], [13]], [[3]], [0.5, 0.0]),    # G = [0.5, 0]
             episode([[14], [15]], [[4]], [0.0, 0.5])]    # G = [0.5, 0.5]
    adv, ret, _ = advantages(GRPOConfig(credit="turn", group_scale=False), trajs)
    # turn 0: pool {1, 0.5, 0.5}, mean 2/3 -> 1/3, -1/6, -1/6
    # turn 1: a, b share history (1, 2, 3): pool {1, 0}, mean 0.5 -> +0.5, -0.5;
    #         c: pool = every turn 1 of the group {1, 0, 0.5}, mean 0.5 -> 0
    assert [a[0] for a in adv] == pytest.approx([1 / 3, -1 / 6, -1 / 6])
    assert [a[1] for a in adv] == pytest.approx([0.5, -0.5, 0.0])
    assert ret == [pytest.approx([1.0, 1.0]), pytest.approx([0.5, 0.0]), pytest.approx([0.5, 0.5])]
    # with the std: turn 0's pool {1, .5, .5} has sample std √(1/12); turn 1's state pool {1, 0} std √0.5
    adv, _, _ = advantages(GRPOConfig(credit="turn", adv_eps=0.0), trajs)
    assert [a[0] for a in adv] == pytest.approx([(1 / 3) / math.sqrt(1 / 12), (-1 / 6) / math.sqrt(1 / 12),
                                                 (-1 / 6) / math.sqrt(1 / 12)])
    assert [a[1] for a in adv[:2]] == pytest.approx([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)])
    # RLOO: turn 0: 1 - 0.5 = 0.5, 0.5 - 0.75 = -0.25 (twice); turn 1: a 1 - 0 = 1, b 0 - 1 = -1, c 0.5 - 0.5 = 0
    adv, _, _ = advantages(RLOOConfig(credit="turn"), trajs)
    assert adv == [pytest.approx([0.5, 1.0]), pytest.approx([-0.25, -1.0]), pytest.approx([-0.25, 0.0])]


def test_gigpo_adds_the_state_grouped_turn_advantage_to_the_episode_advantage():
    trajs = [episode([[10], [11]], [[3]], [0.0, 1.0]),    # return 1,   G = [1, 1]
             episode([[12], [13]], [[3]], [0.5, 0.0]),    # return 0.5, G = [0.5, 0]
             episode([[14], [15]], [[4]], [0.0, 0.5])]    # return 0.5, G = [0.5, 0.5]
    adv, _, _ = advantages(GRPOConfig(credit="gigpo", group_scale=False, turn_adv_weight=0.5), trajs)
    # episode: returns {1, .5, .5}, mean 2/3 -> 1/3, -1/6, -1/6 on every turn
    # turn term: turn 0 as the episode's (same pool, G_0 = return); turn 1: a +0.5, b -0.5, c no peer -> 0
    assert adv[0] == pytest.approx([1 / 3 + 0.5 / 3, 1 / 3 + 0.5 * 0.5])
    assert adv[1] == pytest.approx([-1 / 6 - 0.5 / 6, -1 / 6 - 0.5 * 0.5])
    assert adv[2] == pytest.approx([-1 / 6 - 0.5 / 6, -1 / 6])


def test_turn_level_gae_with_a_critic():
    trajs = two_turn_group()
    batch = collate(trajs)
    # the critic's values at collection: 0.4 at each turn's first token of a, 0.2 / 0.1 for b (others ignored)
    values = torch.full(batch.input_ids.shape, 9.0)
    (a0, _), (a1, _) = trajs[0].turn_spans
    (b0, _), (b1, _) = trajs[1].turn_spans
    values[0, a0], values[0, a1], values[1, b0], values[1, b1] = 0.4, 0.4, 0.2, 0.1
    cfg = PPOConfig(credit="turn", gamma=0.5, lam=0.5, whiten_advantages=False)
    adv, ret, _ = advantages(cfg, trajs, values)
    # a: rewards 0.5, 1.0; V 0.4, 0.4.  k=1: δ = 1 - 0.4 = 0.6;
    #    k=0: δ = 0.5 + 0.5·0.4 - 0.4 = 0.3, A = 0.3 + 0.25·0.6
    # b: rewards 0, 0.5;   V 0.2, 0.1.  k=1: δ = 0.5 - 0.1 = 0.4;  k=0: δ = 0 + 0.05 - 0.2 = -0.15, A = -0.15 + 0.1
    assert adv == [pytest.approx([0.45, 0.6]), pytest.approx([-0.05, 0.4])]
    assert ret == [pytest.approx([0.85, 1.0]), pytest.approx([0.15, 0.5])]   # A + V
    # token-level GAE (PPO's default) is still there and differs: each policy token is a step, so a's
    # two-token first turn has two different advantages (V = 9 at its second token)
    est = ADVANTAGES["gae"](PPOConfig(gamma=0.5, lam=0.5, whiten_advantages=False))
    tok, _ = est(AdvantageInputs(trajs, batch.token_rewards, batch.loss_mask, values))
    assert tok[0, a0].item() != pytest.approx(tok[0, a0 + 1].item())


def test_credit_choices_are_checked_per_estimator():
    with pytest.raises(ValueError, match="credit='token' is not supported by the 'group'"):
        ADVANTAGES["group"](GRPOConfig(credit="token"))
    with pytest.raises(ValueError, match="credit='gigpo' is not supported by the 'returns'"):
        ADVANTAGES["returns"](ReinforceConfig(credit="gigpo"))
    with pytest.raises(ValueError, match="credit must be one of"):
        GRPOConfig(credit="per-token")
    # each algorithm's default, from its config's own table; a value given wins
    assert ReinforceConfig().credit == "turn"
    assert GRPOConfig().credit == "episode"
    assert PPOConfig().credit == "token"
    assert PPOConfig(credit="turn").credit == "turn"


# --------------------------------------------------------------------------- verl #7244: the bias case

def naive_per_turn_index(rewards: list[list[float]]) -> list[list[float]]:
    """The construction verl issue #7244 warns about (MT-GRPO-style per-turn-index normalisation, ported
    to per-turn rewards): turn k's reward minus the mean of the group's turn-k rewards (over the episodes
    that reached turn k), and turn t's advantage = the sum of those from t to the episode's *own* last turn."""
    depth = max(len(r) for r in rewards)
    mu = [sum(r[k] for r in rewards if len(r) > k) / sum(len(r) > k for r in rewards) for k in range(depth)]
    return [[sum(r[k] - mu[k] for k in range(t, len(r))) for t in range(len(r))] for r in rewards]


R_STOP = 1.0


def stop_or_search(intermediate: float, final: float) -> dict[str, Trajectory]:
    """One decision: answer now (one turn, reward R_STOP) or search (turn 0 pays ``intermediate``, then
    a forced answer pays ``final``). A stop/search coin with P(stop) = p = sigmoid(θ)."""
    return {"stop": episode([[10]], [], [R_STOP]),
            "search": episode([[11], [12]], [[3]], [intermediate, final])}


def expected_gradient(estimator, p: float, n: int, intermediate: float, final: float) -> float:
    """E[(1/n) Σ_i A_i,0 · ∂/∂θ log π(a_i)] over every outcome of a group of n, exactly.

    ∂/∂θ log π(stop) = 1 - p and ∂/∂θ log π(search) = -p; the forced second turn has no decision."""
    kinds = stop_or_search(intermediate, final)
    total = 0.0
    for outcome in itertools.product(("stop", "search"), repeat=n):
        prob = math.prod(p if o == "stop" else 1 - p for o in outcome)
        trajs = [copy.deepcopy(kinds[o]) for o in outcome]
        adv = estimator(trajs)
        g = sum(a[0] * ((1 - p) if o == "stop" else -p) for a, o in zip(adv, outcome)) / n
        total += prob * g
    return total


def ours(config):
    return lambda trajs: advantages(config, trajs)[0]


def naive(trajs):
    return naive_per_turn_index([t.step_rewards for t in trajs])


def test_naive_per_turn_index_normalisation_is_biased_and_ours_is_not():
    """verl-project/verl issue #7244 ("[RFC] Per-turn reward support for multi-turn RL: a turn-level
    baseline that stays unbiased under variable turn counts"): normalising per-turn rewards per turn
    index and summing them to the episode's own end subtracts one baseline term per remaining turn, so
    the baseline depends on the episode's own decision to stop, and "take another turn" is penalised by
    the group's mean reward of that extra turn.

    The case: answer now (1 turn, reward 1) or search (0.5 now, 0.5 after the forced answer). Both
    choices are worth exactly 1, so the true policy gradient is 0. By hand, for a group {stop, search}:
    turn-0 mean (1 + 0.5)/2 = 0.75, turn-1 mean 0.5 -> naive A_stop = 1 - 0.75 = +0.25 and
    A_search = (0.5 - 0.75) + (0.5 - 0.5) = -0.25: stopping is preferred for nothing. Ours compare
    returns-to-go, one baseline per turn: both turn-0 returns are 1 -> A = 0.
    """
    kinds = stop_or_search(0.5, 0.5)
    group = [kinds["stop"], kinds["search"]]
    assert naive(group) == [pytest.approx([0.25]), pytest.approx([-0.25, 0.0])]
    for cfg in (GRPOConfig(credit="turn"), GRPOConfig(credit="gigpo"), GRPOConfig(credit="episode"),
                RLOOConfig(credit="turn")):
        adv = advantages(cfg, copy.deepcopy(group))[0]
        assert adv[0][0] == pytest.approx(0.0) and adv[1][0] == pytest.approx(0.0), cfg.credit

    # exact expectations over every outcome of groups of 2 and 3, for several stop probabilities
    for n, p in ((2, 0.3), (3, 0.5), (3, 0.8)):
        # the closed form of the naive estimator's bias: (n-1)/n · p(1-p) · (mean reward of the extra turn)
        bias = (n - 1) / n * p * (1 - p) * 0.5
        assert expected_gradient(naive, p, n, 0.5, 0.5) == pytest.approx(bias)
        for cfg in (GRPOConfig(credit="turn", group_scale=False), GRPOConfig(credit="turn"),
                    GRPOConfig(credit="gigpo", group_scale=False), RLOOConfig(credit="turn")):
            assert expected_gradient(ours(cfg), p, n, 0.5, 0.5) == pytest.approx(0.0, abs=1e-12), (n, p, cfg)


def test_when_the_choices_differ_ours_follow_the_true_gradient():
    # search pays 0.2 + 0.3 = 0.5 < 1: the true gradient of J = p·1 + (1-p)·0.5 is p(1-p)·0.5 > 0
    for n, p in ((2, 0.3), (3, 0.6)):
        true = p * (1 - p) * (R_STOP - 0.5)
        # leave-one-out baselines: exactly unbiased
        assert expected_gradient(ours(RLOOConfig(credit="turn")), p, n, 0.2, 0.3) == pytest.approx(true)
        # in-group means: GRPO's usual (n-1)/n shrinkage, nothing else
        shrunk = (n - 1) / n * true
        assert expected_gradient(ours(GRPOConfig(credit="turn", group_scale=False)), p, n, 0.2, 0.3) == \
            pytest.approx(shrunk)
        assert expected_gradient(ours(GRPOConfig(credit="episode", group_scale=False)), p, n, 0.2, 0.3) == \
            pytest.approx(shrunk)
        # the naive estimator adds the extra turn's mean reward (0.3) as a penalty on searching
        assert expected_gradient(naive, p, n, 0.2, 0.3) == pytest.approx(shrunk + (n - 1) / n * p * (1 - p) * 0.3)


# --------------------------------------------------------------------------- a real learner, every credit

@pytest.fixture(scope="module")
def episodes():
    """Real two-turn episodes of a tiny random model in Arithmetic-v0 (its actions are invalid, so the env
    answers and the episode runs both turns), with hand-set step rewards."""
    from agentgym.policies.transformers_policy import TransformersPolicy
    from agentgym.policy import SamplingParams
    from agentgym.rollout_config import RolloutConfig
    from agentgym.rollout import RolloutEngine
    from fixtures_llm import cached_tokenizer
    torch.manual_seed(0)
    policy = TransformersPolicy.tiny_random(cached_tokenizer(), seed=1)
    engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=4), style="continuation",
                                                 env_workers=1))
    trajs = engine.collect("Arithmetic-v0", num_groups=1, group_size=3, seed=0,
                           env_kwargs={"max_turns": 2}).trajectories
    engine.close()
    for t, rewards in zip(trajs, ([0.0, 1.0], [0.5, 0.0], [0.0, 0.5])):
        t.step_rewards = rewards
    assert all(t.num_turns == 2 for t in trajs)
    return trajs


@pytest.mark.parametrize("algo, credit", [("grpo", "episode"), ("grpo", "turn"), ("grpo", "gigpo"),
                                          ("rloo", "turn"), ("reinforce", "episode"), ("reinforce", "turn"),
                                          ("ppo", "turn"), ("ppo", "token"), ("gspo", "turn"), ("cispo", "gigpo")])
def test_a_real_learner_trains_with_every_credit_choice(episodes, algo, credit):
    from agentgym.policies.transformers_policy import TransformersPolicy
    from fixtures_llm import cached_tokenizer
    policy = TransformersPolicy.tiny_random(cached_tokenizer(), seed=1)
    learner = make(algo, policy, dict(lr=1e-3, credit=credit, group_scale=False, baseline="none",
                                      whiten_advantages=False))
    assert learner.config.credit == credit
    trajs = copy.deepcopy(episodes)
    batch = collate(trajs)
    learner.compute_advantages(trajs, batch, batch.token_rewards, batch.loss_mask)
    if (algo, credit) == ("grpo", "turn"):
        # the hand numbers of test_grpo_turn_credit_...: G = [1, 1], [.5, 0], [.5, .5]; turn 1's pool is the
        # whole group here (the same env reply to three invalid actions, or three different ones), mean 0.5
        keys = AdvantageInputs(trajs, batch.token_rewards, batch.loss_mask).state_keys()
        assert len({k[1] for k in keys}) in (1, 3)
        for t, a in zip(trajs, ([1 / 3, 0.5], [-1 / 6, -0.5], [-1 / 6, 0.0])):
            for (s, e), v in zip(t.turn_spans, a):
                assert batch.advantages[trajs.index(t), s:e].tolist() == pytest.approx([v] * (e - s))
    assert torch.count_nonzero(batch.advantages * (1 - batch.loss_mask)) == 0
    before = [p.detach().clone() for p in learner.policy_parameters()]
    m = learner.update(trajs)
    assert m["skipped"] == 0 and m["optimizer_steps"] >= 1
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.policy_parameters()))
