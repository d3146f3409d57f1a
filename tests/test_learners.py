"""Learners end to end: each of REINFORCE, PPO and GRPO raises the mean reward of a tiny random
model on a small two-turn env within a few updates (real rollout engine, real tokenizer, CPU);
LoRA trains only the adapter; state round-trips; gradient accumulation; schedule; config."""

from __future__ import annotations

import copy
import io
import math

import gymnasium
import pytest
import torch

import agentgym
from agentgym import AgentEnv, Reward, Transition, shaper
from agentgym.algorithms import GRPOLearner, LoraSettings, PPOLearner, ReinforceLearner, collate, lr_factor
from agentgym.algorithms.maths.losses import LOSS_AGG_MODES
from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.policy import SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.trajectory import Trajectory

from fixtures_llm import cached_tokenizer, one_torch_thread  # noqa: F401  (autouse fixture)
from helpers_learners import make


# --------------------------------------------------------------------------- a tiny learnable env

def capital_share(text: str) -> float:
    words = text.split()
    return sum(w[0].isupper() for w in words) / len(words) if words else 0.0


@shaper("capitals")
def capitals(event) -> float:
    """Share of the action's words that start with a capital letter."""
    return capital_share(event.action)


class CapitalsEnv(AgentEnv):
    """Two turns of "write words"; each step pays the share of capitalised words (0…1 per turn).

    A random-weight model writes random tokens (about 28 % capitalised words); raising the share is
    learnable token by token, quickly. Continuation style: the env's "More:" prompt sits between
    the turns as environment tokens, so the loss mask matters.
    """
    observation_style = "continuation"
    num_tasks = 1

    def __init__(self, max_turns: int = 2, **kwargs):
        super().__init__(max_turns=max_turns, **kwargs)

    def default_reward(self) -> Reward:
        return Reward([capitals])

    def get_task(self, index: int) -> dict:
        return {"index": index}

    def initial_messages(self, task) -> list[dict]:
        return [{"role": "system", "content": "Game."}, {"role": "user", "content": "Write words."}]

    def transition(self, action: str) -> Transition:
        return Transition([{"role": "user", "content": "\nMore:"}], "write")


@pytest.fixture(scope="module")
def env_id():
    fid = agentgym.register("CapitalsTest-v0", CapitalsEnv)
    yield fid
    del gymnasium.registry[fid]


# Temperature 0.1 makes the near-uniform random model's sampling distribution peaked enough
# (entropy ~8 nats instead of ~10.8) that reinforcing sampled tokens shows within a few updates;
# the learner divides its logits by the same temperature.
TEMPERATURE = 0.1


def new_policy(seed: int = 0) -> TransformersPolicy:
    return TransformersPolicy.tiny_random(cached_tokenizer(), seed=seed)


def engine_for(policy, max_new_tokens: int = 6) -> RolloutEngine:
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=TEMPERATURE)
    return RolloutEngine(policy, RolloutConfig(sampling=sampling, env_workers=1))


def learning_curve(name: str, env_id: str, cfg: dict, steps: int, precision: str | None = None) -> list[float]:
    """Mean episode reward of each batch (before the update on it); ``precision`` as a run's (sampler too)."""
    torch.manual_seed(0)   # sampling uses torch's global RNG
    policy = new_policy(0)
    learner = make(name, policy, cfg, precision=precision)
    if precision is not None:   # the colocated sampler generates in the precision the learner resolved
        policy = TransformersPolicy(policy.model, policy.tokenizer, precision=learner.precision.name)
    engine = engine_for(policy)
    curve = []
    try:
        for step in range(steps):
            batch = engine.collect(env_id, num_groups=4, group_size=8, seed=step)
            curve.append(batch.metrics["reward_mean"])
            metrics = learner.update(batch)   # a RolloutBatch (or its list of trajectories)
            assert metrics["skipped"] == 0 and metrics["optimizer_steps"] >= 1
        curve.append(engine.collect(env_id, num_groups=4, group_size=8, seed=steps).metrics["reward_mean"])
    finally:
        engine.close()
    print(f"\n{name} reward curve: " + " ".join(f"{r:.2f}" for r in curve))
    return curve


def assert_learned(curve: list[float], margin: float = 0.4) -> None:
    # rewards are in [0, 2] (two turns); a random model earns ~0.55
    first, last = sum(curve[:2]) / 2, sum(curve[-3:]) / 3
    assert last > first + margin, f"mean reward {first:.2f} -> {last:.2f}: did not learn"


# --------------------------------------------------------------------------- learning

def test_reinforce_learns(env_id):
    cfg = dict(lr=5e-3, temperature=TEMPERATURE, baseline="rebn", seed=0)
    assert_learned(learning_curve("reinforce", env_id, cfg, steps=8))


def test_grpo_learns(env_id):
    cfg = dict(lr=2e-3, temperature=TEMPERATURE, kl_coef=0.01, kl_estimator="k3", seed=0)
    assert_learned(learning_curve("grpo", env_id, cfg, steps=8))


def test_ppo_learns(env_id):
    # two minibatches: the second step is slightly off-policy, so ratios and clipping are exercised
    cfg = dict(lr=2e-3, critic_lr=1e-2, temperature=TEMPERATURE, minibatch_size=16, seed=0)
    assert_learned(learning_curve("ppo", env_id, cfg, steps=8))


@pytest.mark.slow
@pytest.mark.parametrize("baseline", ["none", "mean", "ema"])
def test_reinforce_learns_with_every_baseline(env_id, baseline):
    cfg = dict(lr=5e-3, temperature=TEMPERATURE, baseline=baseline, seed=0)
    assert_learned(learning_curve("reinforce", env_id, cfg, steps=14))


@pytest.mark.slow
def test_grpo_learns_without_env_token_masking(env_id):
    cfg = dict(lr=2e-3, temperature=TEMPERATURE, mask_env_tokens=False, group_scale=False,
                        loss_agg="dr-grpo", seed=0)
    assert_learned(learning_curve("grpo", env_id, cfg, steps=12))


# --------------------------------------------------------------------------- small batches for the rest

def small_batch(env_id: str, policy, seed: int = 0):
    torch.manual_seed(seed)
    engine = engine_for(policy, max_new_tokens=4)
    try:
        trajs = engine.collect(env_id, num_groups=2, group_size=3, seed=seed).trajectories
    finally:
        engine.close()
    for k, t in enumerate(trajs):  # distinct rewards so that every advantage estimator has something to say
        t.step_rewards = [0.2 * k, 0.5]
    return trajs


def test_update_trains_the_policy_module_generate_uses(env_id):
    policy = new_policy(4)
    trajs = small_batch(env_id, policy)
    learner = make("grpo", policy, dict(lr=1e-2, temperature=TEMPERATURE))
    assert learner.model is policy.model
    prompt = trajs[0].token_ids[: trajs[0].prompt_length]
    sampling = SamplingParams(max_new_tokens=3, temperature=TEMPERATURE, seed=0)
    before = policy.generate([prompt], sampling)[0]
    metrics = learner.update(trajs)
    after = policy.generate([prompt], sampling)[0]
    assert before.logprobs != after.logprobs
    expected = {"loss", "policy_loss", "kl", "entropy", "clip_frac", "grad_norm", "lr", "approx_kl", "tokens",
                "skipped"}
    assert expected <= set(metrics) and all(isinstance(v, float) for v in metrics.values())
    assert metrics["tokens"] == sum(t.num_policy_tokens for t in trajs)
    assert learner.step == 1


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_lora_trains_only_the_adapter(env_id, name):
    policy = new_policy(5)
    trajs = small_batch(env_id, policy)
    base = policy.model
    cfg = dict(lr=1e-2, temperature=TEMPERATURE, kl_coef=0.1, lora=LoraSettings(r=4, alpha=8))
    learner = make(name, policy, cfg)
    from peft import PeftModel
    # the learner owns its PEFT wrapper; the policy keeps its module (the adapters are injected into it)
    assert isinstance(learner.model, PeftModel) and policy.model is base and learner.model.get_base_model() is base
    assert learner.ref_model is None     # the reference is the adapter-disabled base, not a copy
    before = {k: v.clone() for k, v in learner.model.named_parameters()}
    head_before = [p.clone() for p in learner.critic_parameters()]
    m1 = learner.update(trajs)
    m2 = learner.update(trajs)
    assert m1["skipped"] == m2["skipped"] == 0
    assert m1["kl"] == pytest.approx(0.0, abs=1e-6) and m2["kl"] > 0   # the adapter moved away from the base
    # the adapter's random init is seeded by the config: the same on a second identical policy
    twin = new_policy(5)
    twin_learner = make(name, twin, cfg)
    assert all(torch.equal(before[k], v) for k, v in twin_learner.model.named_parameters())
    changed = {k for k, v in learner.model.named_parameters() if not torch.equal(v, before[k])}
    assert changed and all("lora_" in k for k in changed)
    assert all("lora_B" in k or not k.endswith("lora_B.default.weight") for k in changed)
    assert {k for k in before if "lora_" in k and "lora_B" in k} <= changed   # B starts at 0 and must move
    if name == "ppo":
        assert not all(torch.equal(a, b) for a, b in zip(head_before, learner.critic_parameters()))
    # the policy samples through the adapter: the same module the learner trains
    assert any("lora_" in k for k, _ in policy.model.named_parameters())
    gens = policy.generate([trajs[0].token_ids[: trajs[0].prompt_length]], SamplingParams(max_new_tokens=2))
    assert len(gens[0].token_ids) >= 1


def test_ppo_with_a_separate_critic_model(env_id):
    policy = new_policy(14)
    trajs = small_batch(env_id, policy)
    learner = make("ppo", policy, dict(lr=1e-2, critic="model", critic_lr=1e-2,
                                                        temperature=TEMPERATURE, epochs=2, minibatch_size=3))
    assert learner.critic is not None and not hasattr(policy, "value_head")
    critic_ids = {id(p) for p in learner.critic_parameters()}
    assert critic_ids.isdisjoint(id(p) for p in learner.policy_parameters())   # its own network
    critic_before = [p.clone() for p in learner.critic_parameters()]
    policy_before = [p.clone() for p in learner.policy_parameters()]
    m = learner.update(trajs)
    assert m["skipped"] == 0 and m["optimizer_steps"] == 4 and m["value_loss"] > 0
    assert m["clip_frac"] > 0      # later minibatches are off-policy: clipping is active
    assert any(not torch.equal(a, b) for a, b in zip(critic_before, learner.critic_parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(policy_before, learner.policy_parameters()))
    assert learner.optimizer.param_groups[-1]["lr"] == 1e-2


@pytest.mark.parametrize("name, extra", [
    ("reinforce", {"baseline": "ema"}),
    ("ppo", {"epochs": 2, "minibatch_size": 3, "critic_lr": 1e-2}),
    ("grpo", {"epochs": 2, "minibatch_size": 3, "kl_coef": 0.05, "warmup_steps": 3}),
])
def test_state_dict_round_trip_resumes_identically(env_id, name, extra):
    cfg = dict(lr=1e-2, temperature=TEMPERATURE, seed=7, **extra)
    policy = new_policy(6)
    batches = [small_batch(env_id, policy, seed=s) for s in range(3)]
    learner = make(name, policy, cfg)
    for b in batches[:2]:
        learner.update(copy.deepcopy(b))
    buf = io.BytesIO()
    torch.save({"learner": learner.state_dict(), "model": policy.model.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)

    resumed_policy = new_policy(99)                         # different start, overwritten by the checkpoint
    resumed_policy.model.load_state_dict(saved["model"])
    if name == "grpo":  # the reference is the policy at construction: rebuild from the same start
        resumed_policy = new_policy(6)
    resumed = make(name, resumed_policy, cfg)
    if name == "grpo":
        resumed_policy.model.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["learner"])
    assert resumed.step == learner.step == 2
    assert resumed.optimizer.param_groups[0]["lr"] == learner.optimizer.param_groups[0]["lr"]

    m_a = learner.update(copy.deepcopy(batches[2]))
    m_b = resumed.update(copy.deepcopy(batches[2]))
    assert m_a["loss"] == pytest.approx(m_b["loss"], rel=1e-5, abs=1e-7)
    for (k, a), b in zip(policy.model.state_dict().items(), resumed_policy.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), k
    for a, b in zip(learner.critic_parameters(), resumed.critic_parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    if name == "reinforce":
        assert resumed.baseline.value == pytest.approx(learner.baseline.value)
    with pytest.raises(ValueError, match="cannot load"):
        other = make("reinforce" if name != "reinforce" else "grpo", new_policy(6), cfg)
        other.load_state_dict(saved["learner"])


def test_checkpoints_written_before_the_learner_parts_split_still_load(env_id):
    # REINFORCE's moving-average baseline used to be saved under "baseline"; it now lives in the
    # advantage estimator's state ("advantage")
    cfg = dict(lr=1e-2, temperature=TEMPERATURE, baseline="ema")
    policy = new_policy(16)
    learner = make("reinforce", policy, cfg)
    learner.update(small_batch(env_id, policy))
    state = copy.deepcopy(learner.state_dict())
    state["baseline"] = state.pop("advantage")
    resumed = make("reinforce", new_policy(16), cfg)
    resumed.load_state_dict(state)
    assert resumed.baseline.value == pytest.approx(learner.baseline.value) and resumed.baseline.value is not None


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
def test_gradient_accumulation_matches_one_big_batch(env_id, loss_agg):
    policy = new_policy(8)
    trajs = small_batch(env_id, policy)
    results = []
    for micro in (1, 2, 6):
        p = new_policy(8)
        learner = make("grpo", p, dict(lr=1e-3, temperature=TEMPERATURE, micro_batch_size=micro,
                                                         loss_agg=loss_agg, kl_coef=0.05, entropy_coef=0.01,
                                                         max_grad_norm=None))
        results.append(learner.update(copy.deepcopy(trajs)))
    # At the first step the ratio is 1 and a group's advantages sum to 0, so the policy loss is a sum of O(1)
    # terms that cancel to ~1e-7: its fp32 rounding (~n_tokens x 6e-8) depends on the order of the sums, which
    # micro-batching changes. seq-mean-token-sum divides token sums by no length, so tens of times more. A real
    # accumulation error shows at the terms' scale (and in grad_norm, loss, entropy and kl, compared relatively).
    tol = 1e-5 if loss_agg == "seq-mean-token-sum" else 1e-6
    for m in results[1:]:
        for key in ("loss", "policy_loss", "grad_norm", "entropy", "kl", "tokens"):
            assert m[key] == pytest.approx(results[0][key], rel=1e-4, abs=tol), key


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4)])
def test_gradient_checkpointing_gives_the_same_update(env_id, lora):
    trajs = small_batch(env_id, new_policy(15))
    results = []
    for checkpointing in (False, True):
        policy = new_policy(15)
        learner = make("grpo", policy, dict(lr=1e-3, temperature=TEMPERATURE, lora=lora, kl_coef=0.05,
                                                             gradient_checkpointing=checkpointing))
        metrics = learner.update(copy.deepcopy(trajs))
        results.append((metrics, [p.detach().clone() for p in learner.policy_parameters()]))
        assert any(getattr(m, "gradient_checkpointing", False) for m in policy.model.modules()) == checkpointing
    (m_a, w_a), (m_b, w_b) = results
    assert m_a["loss"] == pytest.approx(m_b["loss"], rel=1e-5)
    assert m_a["grad_norm"] == pytest.approx(m_b["grad_norm"], rel=1e-4)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(w_a, w_b))


def test_non_finite_update_is_skipped_then_training_resumes(env_id):
    policy = new_policy(9)
    good = small_batch(env_id, policy)
    bad = copy.deepcopy(good)
    bad[2].step_rewards[0] = float("inf")
    learner = make("ppo", policy, dict(lr=1e-2, temperature=TEMPERATURE, epochs=2, minibatch_size=3))
    weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
    m = learner.update(bad)
    # whitening spreads the inf/nan over every advantage: all 2 epochs x 2 minibatches are skipped
    assert m["skipped"] == 4 and m["optimizer_steps"] == 0 and learner.step == 0
    assert all(torch.equal(weights[k], v) for k, v in policy.model.state_dict().items())
    m = learner.update(good)
    assert m["skipped"] == 0 and m["optimizer_steps"] == 4 and learner.step == 1
    assert not all(torch.equal(weights[k], v) for k, v in policy.model.state_dict().items())


def test_skip_no_signal_leaves_weights_and_optimizer_untouched(env_id):
    """A batch where every group has equal rewards (GRPO advantages all 0): by default the entropy term
    alone still moves the weights (Adam normalises its tiny gradient to an lr-sized step); with
    skip_no_signal there is no optimizer step at all, and a batch with signal still trains."""
    trajs = small_batch(env_id, new_policy(5))
    flat = copy.deepcopy(trajs)
    for t in flat:
        t.step_rewards = [0.5, 0.5]
    cfg = dict(lr=1e-3, temperature=TEMPERATURE, entropy_coef=0.01)
    policy = new_policy(5)
    weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
    m = make("grpo", policy, cfg).update(copy.deepcopy(flat))
    assert m["advantage_std"] == 0.0 and m["optimizer_steps"] == 1 and m["no_signal_skip"] == 0.0
    assert not all(torch.equal(weights[k], v) for k, v in policy.model.state_dict().items())   # drift

    policy = new_policy(5)
    learner = make("grpo", policy, dict(lr=1e-3, temperature=TEMPERATURE, entropy_coef=0.01,
                                                         skip_no_signal=True))
    m = learner.update(copy.deepcopy(flat))
    assert m["no_signal_skip"] == 1.0 and m["optimizer_steps"] == 0 and learner.step == 0
    assert all(torch.equal(weights[k], v) for k, v in policy.model.state_dict().items())
    assert not learner.optimizer.state                                   # no Adam moments either
    m = learner.update(copy.deepcopy(trajs))
    assert m["no_signal_skip"] == 0.0 and m["optimizer_steps"] == 1 and learner.step == 1
    assert not all(torch.equal(weights[k], v) for k, v in policy.model.state_dict().items())


# --------------------------------------------------------------------------- batch format

def _traj(ids, mask, logprobs, prompt_length, spans, rewards, group_id=None):
    return Trajectory(ids, mask, logprobs, prompt_length, spans, ["a"] * len(spans), ["length"] * len(spans), rewards,
                      [{} for _ in rewards], [], group_id=group_id)


def test_collate_right_pads_and_micro_batches_trim():
    a = _traj([1, 2, 3, 4, 5, 6], [0, 0, 1, 0, 1, 1], [0, 0, -1.0, 0, -2.0, -3.0], 2, [(2, 3), (4, 6)], [0.5, 2.0], 7)
    b = _traj([9, 8, 7], [0, 1, 1], [0, -0.5, -0.25], 1, [(1, 3)], [1.0])
    batch = collate([a, b], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [9, 8, 7, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 0, 1, 1], [0, 1, 1, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]]
    assert batch.old_logprobs.tolist() == [[0, 0, -1, 0, -2, -3], [0, -0.5, -0.25, 0, 0, 0]]
    # each step reward on its turn's last policy token
    assert batch.token_rewards.tolist() == [[0, 0, 0.5, 0, 0, 2.0], [0, 0, 1.0, 0, 0, 0]]
    assert batch.group_ids.tolist() == [7, -1] and batch.seq_ids.tolist() == [0, 1]
    assert batch.logits_offset == 0        # the shortest prompt is 1 token: logits from position 0 on
    first, second = batch.micro_batches(1)
    assert first.width == 6 and second.width == 3 and second.input_ids.tolist() == [[9, 8, 7]]
    assert second.logits_offset == 0 and first.logits_offset == 1
    assert batch.select([1, 0]).seq_ids.tolist() == [1, 0]


# --------------------------------------------------------------------------- schedule, config, factory

def test_lr_schedule_by_hand():
    # warmup 4 of 10 updates: 1/4, 2/4, 3/4, 1; then linear decay over the remaining 6: at 7, 1 - 3/6
    f = [lr_factor(s, warmup_steps=4, total_steps=10, schedule="linear") for s in range(11)]
    assert f[:5] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    assert f[7] == pytest.approx(0.5) and f[10] == pytest.approx(0.0)
    # cosine: half way through the decay, 0.5
    assert lr_factor(7, warmup_steps=4, total_steps=10, schedule="cosine") == pytest.approx(0.5)
    assert lr_factor(100, schedule="constant") == 1.0
    with pytest.raises(ValueError, match="needs total_steps"):
        lr_factor(5, schedule="cosine")


def test_learner_follows_warmup_ratio(env_id):
    # Search-R1's warmup ratio 0.285 of 7 updates: round(1.995) = 2 warmup updates (lr/2, lr), then a cosine
    # over the remaining 5: lr at update 2 (progress 0), at update 3 (progress 1/5) 0.5·(1 + cos(π/5))
    policy = new_policy(10)
    trajs = small_batch(env_id, policy)
    learner = make("reinforce", policy, dict(lr=1e-3, warmup_ratio=0.285, total_steps=7,
                                                              schedule="cosine", temperature=TEMPERATURE))
    assert learner.warmup_steps == 2
    lrs = [learner.update(copy.deepcopy(trajs))["lr"] for _ in range(4)]
    assert lrs == pytest.approx([0.5e-3, 1e-3, 1e-3, 1e-3 * 0.5 * (1 + math.cos(math.pi / 5))])


def test_config_from_yaml_like_mapping_and_validation():
    from agentgym.algorithms import GRPOConfig, OptimConfig
    from agentgym.config import ConfigError, from_dict, to_dict
    cfg = from_dict(GRPOConfig, {"loss_agg": "seq-mean-token-sum", "kl_in": "reward", "loss_token_kinds": ["policy"]})
    assert cfg.loss_agg == "seq-mean-token-sum" and cfg.loss_token_kinds == ("policy",)
    assert from_dict(GRPOConfig, to_dict(cfg)) == cfg
    optim = from_dict(OptimConfig, {"lr": 1e-5, "betas": [0.9, 0.95]})
    assert optim.betas == (0.9, 0.95)
    assert from_dict(LoraSettings, {"r": 16, "target_modules": ["q_proj"]}) == LoraSettings(r=16, target_modules=("q_proj",))
    with pytest.raises(ConfigError, match="learning_rate"):
        from_dict(GRPOConfig, {"learning_rate": 1e-5})
    with pytest.raises(ValueError, match="kl_estimator"):
        GRPOConfig(kl_estimator="k5")
    with pytest.raises(ValueError, match="needs total_steps"):
        make("grpo", new_policy(0), {"schedule": "linear"})


def test_factory_and_grpo_needs_groups(env_id):
    policy = new_policy(11)
    assert isinstance(make("reinforce", policy), ReinforceLearner)
    ppo = make("PPO", policy)
    assert isinstance(ppo, PPOLearner) and ppo.value_head is not None and not hasattr(policy, "value_head")
    learner = make("grpo", policy)
    assert isinstance(learner, GRPOLearner)
    with pytest.raises(ValueError, match="unknown learner"):
        make("dqn", policy)
    trajs = small_batch(env_id, policy)
    for t in trajs:
        t.group_id = None
    with pytest.raises(ValueError, match="group_size > 1"):
        learner.update(trajs)


def test_kl_in_reward_penalises_with_the_sampling_logprobs(env_id):
    policy = new_policy(12)
    trajs = small_batch(env_id, policy)
    learner = make("reinforce", policy, dict(lr=1e-2, temperature=TEMPERATURE, kl_coef=1.0,
                                                              kl_in="reward", kl_estimator="k3"))
    m = learner.update(copy.deepcopy(trajs))
    # sampled by the reference itself: KL(old ‖ ref) = 0, nothing subtracted
    assert m["kl_reward"] == pytest.approx(0.0, abs=1e-5) and m["kl"] == pytest.approx(0.0, abs=1e-5)
    m = learner.update(small_batch(env_id, policy, seed=1))
    # sampled by the moved policy: a positive penalty on the rewards; the KL is reported, not in the loss
    assert m["kl_reward"] > 0 and m["kl"] > 0


# --------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bf16 autocast path)")
@pytest.mark.parametrize("name", ["reinforce", "grpo", "ppo"])
def test_update_on_cuda_with_bf16_autocast(env_id, name):
    policy = new_policy(13)
    policy.model.to("cuda")
    trajs = small_batch(env_id, policy)
    learner = make(name, policy, dict(lr=1e-2, temperature=TEMPERATURE, kl_coef=0.05,
                                                       gradient_checkpointing=True))
    before = [p.detach().clone() for p in learner.policy_parameters()]
    m = learner.update(trajs)
    assert m["skipped"] == 0 and all(v == v for v in m.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.policy_parameters()))
    assert next(policy.model.parameters()).device.type == "cuda"
