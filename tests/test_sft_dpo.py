"""SFT and DPO from agent episodes (algorithms/offline_data.py, sft.py, dpo.py) with the real SmolLM2
tokenizer, tiny random Llamas and the real TRL trainers: which episodes are kept, that the ids TRL
trains on are the trajectory's ids, that TRL's labels / completion masks exclude exactly the
environment tokens, SFT loss going down, preference pairs only where returns differ, and one-line
errors for bad configs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from agentgym.algorithms.offline.dpo import DPORunConfig, TokenPreferenceCollator, build_dpo_trainer
from agentgym.algorithms.offline.data import (CollectConfig, collect_trajectories, offline_rollout, dpo_dataset,
                                              dpo_example, preference_pairs, sft_dataset, source_policy, successful)
from agentgym.algorithms.offline.sft import SFTRunConfig, build_sft_trainer, run_sft
from agentgym.app.cli import main
from agentgym.config import load_config
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.trajectory import Trajectory

from fixtures_llm import cached_tokenizer, one_torch_thread  # noqa: F401  (autouse fixture)

TOOLCALL = "agentgym/ToolCall-v0"
ARITH = "agentgym/Arithmetic-v0"
ARITH_KW = {"hard_fraction": 0.5, "max_turns": 2}


def fresh_tiny(seed: int = 0) -> TransformersPolicy:
    """A new tiny random Llama (training mutates it, so never the shared cached one)."""
    return TransformersPolicy.tiny_random(cached_tokenizer(), seed=seed)


def oracle_policy(env: str):
    """The env's oracle as a token-level policy with the shared tokenizer."""
    return source_policy("oracle", SimpleNamespace(tokenizer=cached_tokenizer()), env)


def collect(policy, env, env_kwargs=None, episodes=4, samples=1, max_new_tokens=256):
    data = CollectConfig(episodes=episodes, samples_per_task=samples)
    rollout = offline_rollout()
    rollout = rollout.replace(sampling=rollout.sampling.replace(max_new_tokens=max_new_tokens))
    return collect_trajectories(policy, env, env_kwargs or {}, data, rollout)


@pytest.fixture(scope="module")
def toolcall_episodes() -> tuple[list[Trajectory], list[Trajectory]]:
    """(oracle episodes, failing episodes) on the same ToolCall tasks: multi-turn, with tool outputs."""
    tok = cached_tokenizer()
    oracle = collect(oracle_policy(TOOLCALL), TOOLCALL, episodes=4)
    wrong = collect(ScriptedPolicy(tok, ["<answer>I cannot help with that.</answer>"]), TOOLCALL, episodes=4)
    return oracle, wrong


def env_positions(traj: Trajectory) -> list[int]:
    """Indices after the prompt that the environment (observations, template glue) put there."""
    return [i for i in range(traj.prompt_length, len(traj.token_ids)) if traj.loss_mask[i] == 0]


# --------------------------------------------------------------------------- SFT data and masks

def test_sft_keeps_only_successful_episodes_and_trl_labels_mask_env_tokens(toolcall_episodes, tmp_path):
    oracle, wrong = toolcall_episodes
    assert all(t.episode["success"] for t in oracle) and not any(t.episode["success"] for t in wrong)
    mixed = [x for pair in zip(wrong, oracle) for x in pair]
    kept = successful(mixed)
    assert kept == oracle                                   # only successful episodes, order kept
    assert successful(mixed, min_reward=2.0) == []          # a return floor filters further
    assert any(t.num_turns > 1 for t in kept)               # tool calls: observations between policy turns
    assert all(env_positions(t) for t in kept)

    policy = fresh_tiny()
    cfg = SFTRunConfig(model="tiny-random", output_dir=str(tmp_path))
    trainer = build_sft_trainer(cfg, policy, sft_dataset(kept), tmp_path)
    rows = trainer.train_dataset
    for traj, row in zip(kept, rows):
        assert row["input_ids"] == traj.token_ids          # the trajectory's ids, not re-rendered text
        labels = row["labels"]
        assert [i for i, lab in enumerate(labels) if lab == -100] == \
               list(range(traj.prompt_length)) + env_positions(traj)
        assert all(labels[i] == traj.token_ids[i] for i in range(len(labels)) if traj.loss_mask[i])
        # what carries loss is exactly the policy's turns (with the EOS each one ended with)
        tok = policy.tokenizer
        learned = tok.decode([t for t, lab in zip(traj.token_ids, labels) if lab != -100], skip_special_tokens=True)
        assert learned == "".join(traj.actions)
        masked_text = tok.decode([traj.token_ids[i] for i in env_positions(traj)])
        for m in traj.messages[1:]:
            if m["role"] == "tool":
                assert m["content"] in masked_text          # tool outputs sit in label -100 positions

    # the collator pads with -100 and keeps the mask per row
    batch = trainer.data_collator([rows[0], rows[1]])
    for r, traj in enumerate(kept[:2]):
        n = len(traj.token_ids)
        expected = torch.tensor([t if m else -100 for t, m in zip(traj.token_ids, traj.loss_mask)])
        assert torch.equal(batch["labels"][r, :n], expected)
        assert (batch["labels"][r, n:] == -100).all() and batch["attention_mask"][r, n:].sum() == 0


def masked_nll(model, dataset) -> float:
    """Mean NLL of the labelled (policy) tokens, computed independently of TRL."""
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for row in dataset:
            ids = torch.tensor([row["input_ids"]])
            mask = torch.tensor(row["assistant_masks"][1:], dtype=torch.bool)
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            tok_logp = logp.gather(-1, ids[0, 1:, None])[:, 0]
            total -= float(tok_logp[mask].sum())
            count += int(mask.sum())
    return total / count


def test_sft_run_lowers_the_loss_on_oracle_data_and_exports_a_loadable_model(tmp_path):
    out = tmp_path / "sft"
    cfg = load_config(SFTRunConfig, overrides=[
        "model=tiny-random", f"env={ARITH}", "env_kwargs={hard_fraction: 0.5, max_turns: 2}", "data.episodes=4",
        "optim.max_steps=6", "optim.batch_size=2", "optim.lr=3e-3", "optim.schedule=constant", f"output_dir={out}"])
    result = run_sft(cfg)
    assert result["kept"] == result["episodes"] == 4 and result["steps"] == 6
    assert result["loss_last"] < result["loss_first"]
    for name in ("config.yaml", "train_log.csv", "data_summary.json", "model/config.json", "model/tokenizer.json"):
        assert (out / name).exists(), name
    assert json.loads((out / "data_summary.json").read_text())["source_success_rate"] == 1.0
    assert not (out / "trainer").exists()                   # no empty HF-trainer folder left behind

    from agentgym.policies.loading import load_trained_policy
    data = sft_dataset(collect(oracle_policy(ARITH), ARITH, ARITH_KW, episodes=4))
    before = masked_nll(fresh_tiny(seed=0).model, data)     # the run's starting point (tiny-random, seed 0)
    trained = load_trained_policy(str(out))                 # the output dir loads as a policy
    after = masked_nll(trained.model, data)
    assert after < before - 0.3, (before, after)


def test_lora_sft_output_kept_as_an_adapter_loads_merged_into_its_base(tmp_path):
    out = tmp_path / "lora"
    cfg = load_config(SFTRunConfig, overrides=[
        "model=tiny-random", f"env={ARITH}", "data.episodes=2", "optim.max_steps=1", "optim.batch_size=2",
        "optim.lr=1e-2", "lora={r: 4, alpha: 8}", "merge_lora=false", f"output_dir={out}"])
    run_sft(cfg)
    assert (out / "model" / "adapter_config.json").exists() and not (out / "model" / "config.json").exists()
    from agentgym.policies.loading import load_trained_policy
    loaded = load_trained_policy(str(out)).model           # the run's config.yaml names the base
    assert type(loaded).__name__ == "LlamaForCausalLM"     # merged: a plain model again
    init = fresh_tiny(seed=0).model.state_dict()
    changed = [k for k, v in loaded.state_dict().items() if not torch.equal(v, init[k])]
    assert changed and all("proj" in k for k in changed)   # only LoRA-targeted linear layers moved


# --------------------------------------------------------------------------- preference pairs

def make_traj(reward: float, task: int | None, prompt=(1, 2, 3), policy_tokens=2, group=None) -> Trajectory:
    ids = list(prompt) + [7] * policy_tokens + [9, 9]
    mask = [0] * len(prompt) + [1] * policy_tokens + [0, 0]
    spans = [(len(prompt), len(prompt) + policy_tokens)] if policy_tokens else []
    return Trajectory(ids, mask, [0.0] * len(ids), len(prompt), spans, ["a"] * len(spans), ["eos"] * len(spans),
                      [reward], [{}], [], {"success": reward > 0}, True, False, group, task, "agentgym/X-v0")


def test_preference_pairs_only_where_returns_differ():
    same = [make_traj(0.5, 0), make_traj(0.5, 0), make_traj(0.5, 0)]
    assert preference_pairs(same) == []                     # equal returns: no preference
    a, b, c, d = make_traj(0.2, 1), make_traj(1.0, 1), make_traj(-0.3, 1), make_traj(1.0, 1)
    assert preference_pairs([a, b, c, d]) == [(b, c)]       # best vs worst; ties -> the first one
    assert preference_pairs([a, b], min_gap=0.8) == []      # gap must exceed min_gap
    assert preference_pairs([a, b], min_gap=0.7) == [(b, a)]
    assert preference_pairs([make_traj(1.0, 2)]) == []      # a single episode has nothing to compare
    assert preference_pairs([make_traj(1.0, 3), make_traj(0.0, 3, prompt=(1, 2, 4))]) == []  # other prompt
    assert preference_pairs([make_traj(1.0, 4), make_traj(0.0, 4, policy_tokens=0)]) == []   # no policy tokens
    assert preference_pairs([make_traj(1.0, None), make_traj(0.0, None)]) == []              # task unknown
    g1, g2 = make_traj(1.0, None, group=5), make_traj(0.0, None, group=5)
    assert preference_pairs([g1, g2]) == [(g1, g2)]         # group ids identify the task otherwise
    # tasks are kept apart
    mixed = [make_traj(1.0, 7), make_traj(0.0, 8), make_traj(0.5, 7), make_traj(0.5, 8)]
    assert [(c.task_index, c.total_reward, r.total_reward) for c, r in preference_pairs(mixed)] == \
           [(7, 1.0, 0.5), (8, 0.5, 0.0)]
    with pytest.raises(ValueError, match="no preference pairs"):
        dpo_dataset([])


def test_dpo_rows_and_trl_log_probs_count_only_policy_tokens(toolcall_episodes, tmp_path):
    oracle, wrong = toolcall_episodes
    pairs = preference_pairs(oracle + wrong)
    assert len(pairs) == 4 and all(c.episode["success"] and not r.episode["success"] for c, r in pairs)
    chosen, rejected = next((c, r) for c, r in pairs if c.num_turns > 1)
    row = dpo_example(chosen, rejected)
    n = chosen.prompt_length
    assert row["prompt_ids"] + row["chosen_ids"] == chosen.token_ids
    assert row["prompt_ids"] + row["rejected_ids"] == rejected.token_ids
    assert row["chosen_mask"] == chosen.loss_mask[n:] and row["rejected_mask"] == rejected.loss_mask[n:]

    policy = fresh_tiny()
    cfg = DPORunConfig(model="tiny-random", output_dir=str(tmp_path))
    trainer = build_dpo_trainer(cfg, policy, dpo_dataset([(chosen, rejected)]), tmp_path)
    assert isinstance(trainer.data_collator, TokenPreferenceCollator)
    stored = trainer.train_dataset[0]
    assert stored["chosen_ids"] == row["chosen_ids"] and stored["chosen_mask"] == row["chosen_mask"]
    batch = trainer.data_collator([stored])
    for r, traj in enumerate((chosen, rejected)):   # rows: chosen first, then rejected
        k = len(traj.token_ids)
        assert batch["input_ids"][r, :k].tolist() == traj.token_ids
        assert batch["completion_mask"][r, :k].tolist() == traj.loss_mask   # 0 on prompt and env tokens
        assert batch["completion_mask"][r, k:].sum() == 0 and batch["attention_mask"][r, k:].sum() == 0

    # The sequence log-prob DPO optimises sums over the policy's tokens only.
    model = trainer.model
    model.train()
    trainer.compute_loss(model, batch)
    with torch.no_grad():
        ids = torch.tensor([chosen.token_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    policy_only = float(logp[torch.tensor(chosen.loss_mask[1:], dtype=torch.bool)].sum())
    after_prompt = float(logp[n - 1:].sum())
    reported = trainer._metrics["train"]["logps/chosen"][-1]
    assert reported == pytest.approx(policy_only, rel=1e-3)
    assert abs(after_prompt - policy_only) > 100          # env tokens would have changed it a lot


# --------------------------------------------------------------------------- operator mistakes

@pytest.mark.parametrize("argv, message", [
    (["sft", "optim.lrr=1"], "unknown config key(s) optim.lrr"),
    (["sft", "data.episodes=0"], "episodes, samples_per_task and batch_size must be >= 1"),
    (["dpo", "beta=0"], "beta must be > 0"),
    (["dpo", "data.samples_per_task=many"], "data.samples_per_task"),
    (["eval", "episodes=2"], "no env to evaluate"),
    (["eval", "Arithmetic-v0", "--policy", "oracle", "greedy=maybe"], "greedy"),
])
def test_bad_configs_fail_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_sft_from_a_missing_trajectory_file_fails_in_one_line(tmp_path, capsys):
    assert main(["sft", "model=tiny-random", f"data.source={tmp_path / 'none.json'}",
                 f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert "none.json not found" in err and err.count("\n") == 1
