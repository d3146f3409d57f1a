"""Pluggable learners: the public registry (``register_learner`` / ``register_advantage`` /
``register_objective``), typed per-algorithm configs that the ``learner:`` section is checked against, the
new built-in learners (RLOO, GSPO, CISPO, dual-clip PPO) on a real tiny model, and the README's "Add
an algorithm" module loaded through the real CLI (``agentgym --import … train`` and ``compare``)."""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

import agentgym.algorithms as algorithms
from agentgym.algorithms import (ADVANTAGES, LEARNERS, OBJECTIVES, CISPOConfig, DualClipPPOConfig, GRPOConfig,
                                 GSPOConfig, Learner, OptimConfig, PPOConfig, RLOOConfig, UpdateConfig, collate,
                                 make_learner, register_advantage, register_learner, register_objective)
from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.config import ConfigError, load_config
from agentgym.algorithms.loop.batch import Batch
from agentgym.algorithms.compare.arms import parse_variants
from agentgym.algorithms.catalog import learner_needs_groups
from agentgym.algorithms.maths.objectives import ClipObjective, CISPOObjective, DualClipObjective, GSPOObjective
from agentgym.app.cli import main
from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.policy import SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine

from fixtures_llm import cached_tokenizer, one_torch_thread  # noqa: F401  (autouse fixture)
from helpers_learners import make

README = Path(__file__).resolve().parents[1] / "docs" / "training.md"   # the "Add an algorithm" guide
TEMPERATURE = 0.1


@pytest.fixture
def clean_registries():
    """Registrations made by a test are removed afterwards (the built-ins stay)."""
    saved = {id(r): dict(r) for r in (ADVANTAGES, OBJECTIVES, LEARNERS)}
    yield
    for r in (ADVANTAGES, OBJECTIVES, LEARNERS):
        r.clear()
        r.update(saved[id(r)])


def new_policy(seed: int = 0) -> TransformersPolicy:
    return TransformersPolicy.tiny_random(cached_tokenizer(), seed=seed)


@pytest.fixture(scope="module")
def small_batch():
    """Six real two-turn Arithmetic-v0 episodes (two groups of three) with hand-set step rewards."""
    torch.manual_seed(0)
    engine = RolloutEngine(new_policy(3), RolloutConfig(sampling=SamplingParams(max_new_tokens=4,
                                                                               temperature=TEMPERATURE),
                                                        style="continuation", env_workers=1))
    trajs = engine.collect("Arithmetic-v0", num_groups=2, group_size=3, seed=0,
                           env_kwargs={"max_turns": 2}).trajectories
    engine.close()
    for k, t in enumerate(trajs):
        t.step_rewards = [0.1 * k, 0.5 * (k % 3)][:t.num_turns]
    return trajs


# --------------------------------------------------------------------------- the built-ins

def test_built_in_learners_and_parts_are_registered():
    assert {"reinforce", "grpo", "ppo", "rloo", "gspo", "cispo", "dual-clip-ppo"} <= set(LEARNERS)
    assert {"returns", "group", "rloo", "gae"} <= set(ADVANTAGES)
    assert {"clip", "dual-clip", "reinforce", "gspo", "cispo"} <= set(OBJECTIVES)
    assert LEARNERS["gspo"].advantage_name == "group" and LEARNERS["gspo"].objective_name == "gspo"
    assert LEARNERS["dual-clip-ppo"].config_class is DualClipPPOConfig
    assert [learner_needs_groups(n) for n in ("grpo", "rloo", "gspo", "cispo", "ppo", "reinforce")] == \
        [True, True, True, True, False, False]
    # exported from the package
    for name in ("register_learner", "register_advantage", "register_objective"):
        assert name in algorithms.__all__


def test_typed_configs_carry_each_algorithms_defaults():
    assert (GSPOConfig().clip_eps, GSPOConfig().clip_eps_high, GSPOConfig().loss_agg) == \
        (3e-4, 4e-4, "seq-mean-token-mean")
    assert (CISPOConfig().clip_eps, CISPOConfig().clip_eps_high) == (1.0, 0.28)
    assert DualClipPPOConfig().dual_clip_c == 3.0 and PPOConfig().dual_clip_c is None
    assert (GRPOConfig().clip_eps, GRPOConfig().loss_agg, GRPOConfig().credit) == (0.2, "token-mean", "episode")
    assert PPOConfig().critic == "head" and not hasattr(GRPOConfig(), "critic")   # only learners with a critic
    # a value given wins over the algorithm's own default; the optimizer is not a learner setting
    assert GSPOConfig(clip_eps=1e-3).clip_eps == 1e-3 and GSPOConfig(clip_eps=1e-3).clip_eps_high == 4e-4
    assert issubclass(GRPOConfig, UpdateConfig) and not issubclass(GRPOConfig, OptimConfig)
    assert dataclasses.replace(GSPOConfig(), seed=3).clip_eps == 3e-4
    # typed configs validate
    with pytest.raises(ValueError, match="loss_agg"):
        GSPOConfig(loss_agg=None)
    with pytest.raises(ValueError, match="dual_clip_c"):
        PPOConfig(dual_clip_c=0.5)


def test_the_learner_section_is_checked_against_the_algorithms_config():
    cfg = load_config(TrainConfig, None, ["algo=gspo", "learner.credit=turn", "learner.gamma=0.9",
                                          "learner.loss_token_kinds=[policy]", "optim.lr=3e-5"])
    assert type(cfg.learner) is GSPOConfig and cfg.learner.credit == "turn" and cfg.optim.lr == 3e-5
    assert cfg.learner.loss_token_kinds == ("policy",) and cfg.learner.clip_eps == 3e-4   # GSPO's own
    ppo = load_config(TrainConfig, None, ["algo=ppo", "learner.critic=model"])
    assert type(ppo.learner) is PPOConfig and ppo.learner.credit == "token" and ppo.learner.critic == "model"
    # a setting the algorithm does not have is an error that lists the algorithm's own
    with pytest.raises(ConfigError, match=r"learner.critic .*\(not settings of GRPOConfig\); valid: .*group_scale"):
        load_config(TrainConfig, None, ["learner.critic=model"])
    with pytest.raises(ConfigError, match="learner.group_scale .*not settings of PPOConfig"):
        load_config(TrainConfig, None, ["algo=ppo", "learner.group_scale=false"])
    # in Python: a mapping is built into the algorithm's config, an instance of another one is refused
    assert type(TrainConfig(algo="ppo", learner={"lam": 0.9}).learner) is PPOConfig
    assert type(TrainConfig(algo="rloo").learner) is RLOOConfig
    with pytest.raises(ValueError, match="algo=ppo takes a PPOConfig, got GRPOConfig"):
        TrainConfig(algo="ppo", learner=GRPOConfig())
    with pytest.raises(TypeError, match="takes a PPOConfig"):
        make_learner("ppo", new_policy(0), GRPOConfig())


@pytest.mark.parametrize("key, new", [("lr", "optim.lr"), ("warmup_ratio", "optim.warmup_ratio"),
                                      ("max_grad_norm", "optim.max_grad_norm"), ("lora", "lora"),
                                      ("gradient_checkpointing", "optim.gradient_checkpointing")])
def test_renamed_learner_keys_are_refused_with_their_new_path(tmp_path, key, new):
    value = "{r: 4}" if key == "lora" else "1"
    with pytest.raises(ConfigError, match=f"^learner.{key} was renamed {re.escape(new)}$"):
        load_config(TrainConfig, None, [f"learner.{key}={value}"])
    old = tmp_path / "config.yaml"                   # a config.yaml written before the rename
    old.write_text(f"steps: 3\nlearner:\n  {key}: {value}\n  micro_batch_size: 4\n")
    with pytest.raises(ConfigError, match=f"learner.{key} was renamed {re.escape(new)}"):
        load_config(TrainConfig, old)
    with pytest.raises(ConfigError, match="learner.extra was renamed learner.KEY"):
        load_config(TrainConfig, None, ["learner.extra.cap=3"])


# --------------------------------------------------------------------------- the registry

def test_register_parts_and_learners_as_functions_classes_and_decorators(clean_registries):
    @dataclasses.dataclass
    class ScaleSettings:
        scale: float = 2.0

    @dataclasses.dataclass
    class OnePGConfig(ScaleSettings, GRPOConfig):
        """GRPO's settings and the objective's scale."""

    @register_objective("scaled-pg", settings=(ScaleSettings,), on_policy_only=True)
    def scaled_pg(logp, old_logp, advantages, mask, config):
        return -config.scale * advantages * logp

    @register_advantage("constant-one")
    def constant_one(inputs, config):
        return inputs.to_tokens([[1.0] * len(t.turn_spans) for t in inputs.trajectories])

    cls = register_learner("One-PG", advantage="constant-one", objective="scaled-pg", config=OnePGConfig)
    assert LEARNERS["one-pg"] is cls and cls.name == "one-pg" and issubclass(cls, Learner)
    assert cls.config_class is OnePGConfig and OnePGConfig().scale == 2.0
    policy = new_policy(2)
    learner = make_learner("ONE-PG", policy, OnePGConfig(scale=0.5), optim=OptimConfig(lr=1e-2))
    assert learner.config.scale == 0.5 and learner.objective.on_policy_only
    assert learner._epochs_and_minibatch(6) == (1, 6, False)
    # its own setting through the train config: learner.scale, checked against its class
    cfg = load_config(TrainConfig, None, ["algo=one-pg", "learner.scale=0.25"])
    assert type(cfg.learner) is OnePGConfig and cfg.learner.scale == 0.25

    # a class-based objective and a Learner subclass registered with the decorator
    @register_objective("half-clip")
    class HalfClip(ClipObjective):
        def __call__(self, logp, old_logp, advantages, ratio_mask):
            loss, ratio, clipped = super().__call__(logp, old_logp, advantages, ratio_mask)
            return 0.5 * loss, ratio, clipped

    @register_learner("half-grpo")
    class HalfGRPO(Learner):
        advantage_name, objective_name, config_class = "group", "half-clip", GRPOConfig
    assert LEARNERS["half-grpo"] is HalfGRPO and isinstance(make_learner("half-grpo", policy).objective, HalfClip)

    @register_learner("half-ppo")
    class HalfPPO(Learner):
        advantage_name, objective_name, config_class = "gae", "half-clip", PPOConfig
    assert make_learner("half-ppo", policy).value_head is not None

    # the config is the learner's own, and must carry every settings block its parts read
    with pytest.raises(TypeError, match="needs config=: a dataclass subclassing UpdateConfig"):
        register_learner("no-config", advantage="constant-one", objective="scaled-pg")
    with pytest.raises(TypeError, match="config GRPOConfig lacks the settings its parts read: ScaleSettings"):
        register_learner("bad-config", advantage="group", objective="scaled-pg", config=GRPOConfig)
    with pytest.raises(TypeError, match="lacks the settings its parts read: GAESettings, CriticSettings"):
        register_learner("no-critic", advantage="gae", objective="clip", config=GRPOConfig)
    # names are checked; a second registration needs replace=True
    with pytest.raises(ValueError, match="already registered"):
        register_learner("grpo", advantage="group", objective="clip", config=GRPOConfig)
    register_learner("half-grpo", advantage="group", objective="clip", config=GRPOConfig, replace=True)
    with pytest.raises(ValueError, match="unknown objective 'nope'"):
        register_learner("bad", advantage="group", objective="nope", config=GRPOConfig)
    with pytest.raises(ValueError, match="free of ':'"):
        register_objective("a:b", scaled_pg)
    with pytest.raises(TypeError, match="needs a subclass of AdvantageEstimator or a function"):
        register_advantage("x", 3)


def test_registered_learner_state_round_trips(clean_registries, small_batch):
    register_learner("rloo-cispo", advantage="rloo", objective="cispo", config=CISPOConfig)
    cfg = dict(lr=1e-2, seed=3, epochs=2, minibatch_size=3)
    a = make("rloo-cispo", new_policy(4), cfg)
    a.update(copy.deepcopy(small_batch))
    b = make("rloo-cispo", new_policy(4), cfg)
    b.policy.model.load_state_dict(a.policy.model.state_dict())
    b.load_state_dict(copy.deepcopy(a.state_dict()))   # as from a checkpoint file: no shared tensors
    ma, mb = a.update(copy.deepcopy(small_batch)), b.update(copy.deepcopy(small_batch))
    assert ma["loss"] == pytest.approx(mb["loss"], rel=1e-5)
    with pytest.raises(ValueError, match="cannot load"):
        make("rloo", new_policy(4), cfg).load_state_dict(a.state_dict())


# --------------------------------------------------------------------------- the new learners, for real

@pytest.mark.parametrize("name, objective", [("rloo", ClipObjective), ("gspo", GSPOObjective),
                                             ("cispo", CISPOObjective), ("dual-clip-ppo", DualClipObjective)])
def test_new_learners_update_a_real_model(small_batch, name, objective):
    policy = new_policy(5)
    learner = make(name, policy, dict(lr=1e-2, epochs=2, minibatch_size=3, seed=0))
    assert type(learner.objective) is objective
    before = [p.detach().clone() for p in learner.policy_parameters()]
    m = learner.update(copy.deepcopy(small_batch))
    assert m["skipped"] == 0 and m["optimizer_steps"] == 4
    assert any(not torch.equal(x, y) for x, y in zip(before, learner.policy_parameters()))
    if name == "gspo":
        # later minibatches are off-policy; GSPO's 3e-4 / 4e-4 range on the sequence ratio clips whole rows
        assert m["clip_frac"] > 0
    if name == "dual-clip-ppo":
        assert learner.config.dual_clip_c == 3.0 and learner.value_head is not None and m["value_loss"] > 0


def test_rloo_learner_uses_leave_one_out_advantages(small_batch):
    trajs = copy.deepcopy(small_batch)
    learner = make_learner("rloo", new_policy(6), optim=OptimConfig(lr=1e-3))
    batch = collate(trajs)
    learner.compute_advantages(trajs, batch, batch.token_rewards, batch.loss_mask)
    returns = [t.total_reward for t in trajs]
    for i, t in enumerate(trajs):
        others = [r for j, r in enumerate(returns) if j != i and trajs[j].group_id == t.group_id]
        expected = returns[i] - sum(others) / len(others)
        s, e = t.turn_spans[0]
        assert batch.advantages[i, s:e].tolist() == pytest.approx([expected] * (e - s))


def test_loss_token_kinds_reach_the_batch_mask_or_are_refused(small_batch):
    cfg = GRPOConfig(loss_token_kinds=("policy",))
    if "kinds" not in __import__("inspect").signature(Batch.train_mask).parameters:
        with pytest.raises(ValueError, match="typed token provenance"):
            make_learner("grpo", new_policy(7), cfg)
        return
    learner = make_learner("grpo", new_policy(7), cfg)
    batch = collate(small_batch)
    assert torch.equal(learner._train_mask(batch), batch.train_mask(True, kinds=("policy",)))
    assert make_learner("grpo", new_policy(7))._train_mask(batch).equal(batch.train_mask(True))
    # the ablation that trains on policy tokens and the env's replies, but nothing else
    ablation = GRPOConfig(mask_env_tokens=False, loss_token_kinds=("policy", "env"))
    learner = make_learner("grpo", new_policy(7), ablation, optim=OptimConfig(lr=1e-3))
    m = learner.update(copy.deepcopy(small_batch))
    assert m["skipped"] == 0 and m["tokens"] == float(batch.train_mask(False, kinds=("policy", "env")).sum())
    assert m["tokens"] > sum(t.num_policy_tokens for t in small_batch)
    with pytest.raises(ValueError, match="unknown token kinds"):
        make_learner("grpo", new_policy(7), GRPOConfig(loss_token_kinds=("tool-output",)))


# --------------------------------------------------------------------------- the README module, through the CLI

def readme_module() -> str:
    text = README.read_text()
    section = text[text.index("## Add an algorithm"):]
    section = section[:section.index("\n## ", 1)]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.splitlines()) <= 30
    return code


TINY = ["model=tiny-random", "groups_per_step=2", "group_size=2", "sampling.max_new_tokens=4", "eval.episodes=2",
        "optim.lr=1e-3", "learner.micro_batch_size=4", "tensorboard=false",
        "env_kwargs={hard_fraction: 0.0, max_turns: 2}"]


def test_readme_algorithm_trains_and_compares_through_the_cli(clean_registries, tmp_path, monkeypatch, capsys):
    (tmp_path / "readme_algo_mod.py").write_text(readme_module())
    monkeypatch.chdir(tmp_path)                      # --import resolves modules from the current directory
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "readme_algo_mod", raising=False)
    try:
        run = tmp_path / "run"
        rc = main(["--import", "readme_algo_mod", "train", "algo=median-pg", "learner.cap=3", "steps=1",
                   "env=Arithmetic-v0", f"output_dir={run}", *TINY])
        assert rc == 0, capsys.readouterr().err
        assert "median-pg" in LEARNERS and (run / "train_log.csv").stat().st_size > 0
        saved = (run / "config.yaml").read_text()
        assert "algo: median-pg" in saved and "cap: 3" in saved

        # compare: the registered learner next to a built-in, its own setting as a variant key
        assert parse_variants("median-pg:cap=3")[0].overrides == ("learner.cap=3",)
        assert parse_variants("median-pg:lr=0")[0].overrides == ("optim.lr=0",)
        out = tmp_path / "cmp"
        rc = main(["--import", "readme_algo_mod", "compare", "--env", "Arithmetic-v0", "--algos",
                   "grpo:credit=turn,median-pg:cap=3", "--seeds", "1", "--steps", "1", "--out", str(out), *TINY])
        assert rc == 0, capsys.readouterr().err
        table = (out / "compare.md").read_text()
        assert "| `median-pg:cap=3` |" in table and "| `grpo:credit=turn` |" in table
        assert "credit: turn" in (out / "grpo_credit-turn" / "seed0" / "config.yaml").read_text()
    finally:
        sys.modules.pop("readme_algo_mod", None)
    # an unknown algo still fails in one line, naming the registered ones
    assert main(["train", "algo=nope", "env=Arithmetic-v0", *TINY]) == 2
    assert "algo: unknown learner 'nope'; registered: " in capsys.readouterr().err
