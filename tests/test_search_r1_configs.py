"""The Search-R1 reproduction configs (``benchmarks/search_r1/configs/``) load with the real config
loader (what ``agentgym train --config FILE`` runs) and hold the paper's values; their env arguments
build a working SearchQA env against a real retrieval server; and the three loader / learner
additions they need: env_kwargs defaults that belong to the default env, ``critic_warmup_ratio`` and
``TrainConfig.dtype``.

Paper values: ``docs/search_r1_protocol.md`` (Search-R1 repository, 2025-10-29 snapshot; arXiv 2503.09516).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import agentgym
from agentgym.algorithms import OptimConfig, PPOConfig, make_learner
from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.algorithms.loop.trainer import Trainer
from agentgym.config import ConfigError, load_config
from agentgym.envs.services.retrieval import create_app
from agentgym.envs.searchqa.data import bundled_dataset, save_search_r1_parquet, to_search_r1_rows
from agentgym.envs.services.retrieval.shared import get_retriever
from agentgym.envs.searchqa.env import make_search_r1_prompt
from agentgym.http_server import BackgroundServer
from agentgym.policies.transformers_policy import TransformersPolicy

from fixtures_llm import cached_tokenizer, one_torch_thread  # noqa: F401  (autouse fixture)

CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "search_r1" / "configs"
PAPER = ["ppo_qwen2.5-3b-instruct.yaml", "grpo_qwen2.5-3b-instruct.yaml", "ppo_qwen2.5-7b-base.yaml"]


def load(name: str, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, CONFIGS / name, overrides)


def test_every_config_file_is_tested():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(PAPER + ["smollm2_small.yaml", "smollm2_v2.yaml"])


@pytest.mark.parametrize("name", PAPER)
def test_shared_search_r1_values(name):
    cfg = load(name)
    assert cfg.env == "SearchQA-v0"
    # rollout: prompt/tags protocol, top-3, 4 turns + forced answer, 500-token responses and observations
    assert cfg.env_kwargs == {"protocol": "search_r1", "retrieval": "agentic", "retriever": "http://127.0.0.1:8000",
                              "topk": 3, "max_turns": 4, "forced_answer": True,
                              "data": {"questions": "data/search_r1/train.parquet"}}
    assert cfg.eval.env_kwargs["data"] == {"questions": "data/search_r1/test.parquet"}
    assert (cfg.sampling.max_new_tokens, cfg.sampling.temperature, cfg.sampling.top_p) == (500, 1.0, 0.95)
    assert (cfg.max_obs_tokens, cfg.max_context_tokens) == (500, 4096 + 500)
    assert cfg.steps == 1005 and cfg.groups_per_step == 512 and cfg.dtype == "float32"
    lc, opt = cfg.learner, cfg.optim
    assert opt.lr == 1e-6 and opt.warmup_ratio == 0.285 and opt.schedule == "constant"
    assert lc.clip_eps == 0.2 and lc.clip_eps_high is None and lc.entropy_coef == 0.001 and lc.epochs == 1
    assert lc.kl_coef == 0.001 and lc.temperature is None  # the learner follows sampling.temperature
    assert lc.mask_env_tokens is True and lc.minibatch_size == 256 and opt.max_grad_norm == 1.0


@pytest.mark.parametrize("name", ["ppo_qwen2.5-3b-instruct.yaml", "ppo_qwen2.5-7b-base.yaml"])
def test_ppo_values(name):
    cfg = load(name)
    lc = cfg.learner
    assert cfg.algo == "ppo" and cfg.group_size == 1
    assert (lc.gamma, lc.lam) == (1.0, 1.0)                                  # GAE gamma = lambda = 1
    assert lc.critic == "model" and lc.critic_lr == 1e-5 and lc.critic_warmup_ratio == 0.015
    assert (lc.kl_in, lc.kl_estimator) == ("reward", "k1")                    # KL 0.001 in the reward
    assert lc.value_clip_eps == 0.5
    assert cfg.model == {"ppo_qwen2.5-3b-instruct.yaml": "Qwen/Qwen2.5-3B-Instruct",
                         "ppo_qwen2.5-7b-base.yaml": "Qwen/Qwen2.5-7B"}[name]


def test_grpo_values():
    cfg = load("grpo_qwen2.5-3b-instruct.yaml")
    lc = cfg.learner
    assert cfg.algo == "grpo" and cfg.group_size == 5                         # 5 samples per prompt
    assert (lc.kl_in, lc.kl_estimator, lc.kl_coef) == ("loss", "low_var_kl", 0.001)
    assert lc.group_scale is True and lc.adv_eps == 1e-6                      # (r - mean) / (std + 1e-6)


def test_masking_ablation_is_one_override():
    cfg = load("ppo_qwen2.5-7b-base.yaml", "learner.mask_env_tokens=false", "output_dir=runs/x")
    assert cfg.learner.mask_env_tokens is False and cfg.output_dir == "runs/x"


def test_small_config_is_the_bundled_world_with_smollm2():
    cfg = load("smollm2_small.yaml")
    assert cfg.env == "SearchQA-v0" and cfg.model == "smollm2"
    assert cfg.env_kwargs["retriever"] == "dense" and cfg.env_kwargs["split"] == "train"
    assert cfg.env_kwargs["topk"] == 3 and cfg.env_kwargs["max_turns"] == 4
    assert cfg.eval.env_kwargs == {"split": "test"} and cfg.learner.mask_env_tokens is True


def test_the_v2_study_config_has_search_r1s_optimizer_and_group_size():
    """Search-R1 in a box v2 (issue 23): lr 1e-6 with warmup ratio 0.285, n = 5, >= 30 steps of >= 16 episodes,
    and a mostly single-search SFT oracle (a quarter of the multi-hop traces search hop by hop)."""
    cfg = load("smollm2_v2.yaml")
    assert cfg.optim.lr == 1e-6 and cfg.optim.warmup_ratio == 0.285
    assert cfg.group_size == 5 and cfg.steps >= 30 and cfg.groups_per_step * cfg.group_size >= 16
    assert cfg.env_kwargs["oracle_two_hop"] == 0.25 and cfg.env_kwargs["topk"] == 3
    assert cfg.eval.env_kwargs == {"split": "test"} and cfg.learner.mask_env_tokens is True


@pytest.fixture(scope="module")
def bundled_server():
    corpus, train, _ = bundled_dataset(0, "small")
    server = BackgroundServer(create_app(get_retriever("dense", corpus, ("bundled", 0, "small"))),
                              host="127.0.0.1", port=0, start_timeout_s=60)
    url = server.start()
    try:
        yield url, train
    finally:
        server.stop()


@pytest.mark.parametrize("name", PAPER)
def test_config_env_kwargs_build_a_working_env(name, bundled_server, tmp_path):
    """The config's env arguments, with only the file paths and the server address swapped for local ones."""
    url, train = bundled_server
    parquet = save_search_r1_parquet(to_search_r1_rows(train[:8], "nq", "train", make_search_r1_prompt),
                                     tmp_path / "train.parquet")
    cfg = load(name, f"env_kwargs.data.questions={parquet}", f"env_kwargs.retriever={url}")
    env = agentgym.make(cfg.env, **cfg.env_kwargs)
    obs, _ = env.reset(seed=0, options={"task_index": 3})
    assert obs[0]["content"] == make_search_r1_prompt(train[3]["question"])
    obs, _, _, _, info = env.step(f"<think>t</think><search>{train[3]['question']}</search>")
    assert info["search_executed"] and obs[0]["content"].startswith("\n\n<information>Doc 1(Title: ")
    assert env.unwrapped.corpus is None                                      # the server holds the passages
    assert env.unwrapped.max_turns == 5                                      # 4 search turns + forced answer


# ----------------------------------------------------------------------------- loader / learner additions
def test_env_kwargs_defaults_belong_to_the_default_env(tmp_path):
    default = TrainConfig().env_kwargs
    assert load_config(TrainConfig).env_kwargs == default
    assert load_config(TrainConfig, None, ["env_kwargs.max_turns=3"]).env_kwargs == {**default, "max_turns": 3}
    assert load_config(TrainConfig, None, ["env=SearchQA-v0"]).env_kwargs == {}
    assert load_config(TrainConfig, None, ["env=SearchQA-v0", "env_kwargs.topk=5"]).env_kwargs == {"topk": 5}
    f = tmp_path / "c.yaml"
    f.write_text("env: SearchQA-v0\nenv_kwargs: {topk: 2}\n")
    assert load_config(TrainConfig, f).env_kwargs == {"topk": 2}
    f.write_text(f"env: {TrainConfig().env}\nenv_kwargs: {{max_turns: 3}}\n")   # same env: merged as before
    assert load_config(TrainConfig, f).env_kwargs == {**default, "max_turns": 3}
    with pytest.raises(ConfigError, match="unknown config key"):
        load_config(TrainConfig, None, ["learner_lr=1"])


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # stepped by hand, no update
def test_critic_has_its_own_warmup():
    policy = TransformersPolicy.tiny_random(cached_tokenizer(), seed=3)
    optim = OptimConfig(lr=1e-3, warmup_ratio=0.5)
    learner = make_learner("ppo", policy, PPOConfig(critic_lr=1e-2, critic_warmup_ratio=0.0, total_steps=8), optim=optim)
    assert (learner.warmup_steps, learner.critic_warmup_steps) == (4, 0)
    lrs = {(g["role"], g["lr"]) for g in learner.optimizer.param_groups}
    assert lrs == {("policy", 1e-3 / 4), ("critic", 1e-2)}                   # first update: warmup 1/4 vs none
    for _ in range(4):
        learner.scheduler.step()
    assert {(g["role"], g["lr"]) for g in learner.optimizer.param_groups} == {("policy", 1e-3), ("critic", 1e-2)}
    same = make_learner("ppo", TransformersPolicy.tiny_random(cached_tokenizer(), seed=3),
                        PPOConfig(total_steps=8), optim=optim)
    assert same.critic_warmup_steps == same.warmup_steps == 4                # None: the actor's warmup
    with pytest.raises(ValueError, match="critic_warmup_ratio"):
        PPOConfig(critic_warmup_ratio=1.5)


def test_train_config_dtype(tmp_path):
    with pytest.raises(ValueError, match="dtype must name a torch dtype"):
        Trainer(TrainConfig(dtype="float33", output_dir=str(tmp_path / "a"), tensorboard=False))
    trainer = Trainer(TrainConfig(dtype="bfloat16", device="cpu", output_dir=str(tmp_path / "b"), tensorboard=False))
    assert next(trainer.policy.model.parameters()).dtype == torch.bfloat16


# ----------------------------------------------------------------------------- per-dataset evaluation
def test_evaluate_reports_em_per_dataset(tmp_path, capsys):
    """benchmarks/search_r1/evaluate.py end to end with the env's scripted oracle (searches, then answers
    gold) and an in-process dense index: every dataset's EM is 1, the average is over datasets."""
    import json

    from helpers_scripts import load_script

    from agentgym.envs.searchqa.data import save_corpus_jsonl
    evaluate = load_script(CONFIGS.parent / "evaluate.py", "sr1_evaluate")
    corpus, train, _ = bundled_dataset(0, "small")
    rows = (to_search_r1_rows(train[:3], "nq", "test", make_search_r1_prompt)
            + to_search_r1_rows(train[3:8], "hotpotqa", "test", make_search_r1_prompt))
    parquet = save_search_r1_parquet(rows, tmp_path / "test.parquet")
    corpus_file = save_corpus_jsonl(corpus, tmp_path / "corpus.jsonl")
    out = tmp_path / "em.json"
    assert evaluate.main(["--model", "oracle", "--questions", str(parquet), "--retriever", "dense",
                          "--corpus", str(corpus_file), "--datasets", "hotpotqa,nq", "--limit", "4",
                          "--batch-size", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["per_dataset"] == {"hotpotqa": {"em": 1.0, "n": 4}, "nq": {"em": 1.0, "n": 3}}
    assert result["average_em"] == 1.0 and len(result["per_question"]) == 7
    assert "| hotpotqa | 4 | 1.000 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no rows with data_source"):
        evaluate.main(["--model", "oracle", "--questions", str(parquet), "--datasets", "popqa"])
