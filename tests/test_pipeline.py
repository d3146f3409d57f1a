"""The seed pipeline end to end, through the commands users type (``agentgym.app.cli.main``), on CPU with a
tiny random Llama: SFT on oracle episodes → GRPO from the SFT output → DPO from the GRPO run →
evaluation of the result (and of a checkpoint, and of ToolCall's evaluator metrics) with mean and std.
Each stage's output must load as the next stage's model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from agentgym.policies.loading import load_trained_policy, trainer_checkpoint
from agentgym.app.cli import main
from agentgym.app.eval_run import env_takes_split

from fixtures_llm import one_torch_thread  # noqa: F401  (autouse fixture)

ENV = ["env=Arithmetic-v0", "env_kwargs={hard_fraction: 0.5, max_turns: 2}"]   # multi-turn: calculator, answer


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(sum((a[k].float() - b[k].float()).abs().sum() for k in a if k in b))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pipeline")
    assert main(["sft", "model=tiny-random", *ENV, "data.episodes=4", "optim.max_steps=2", "optim.batch_size=2",
                 "optim.lr=1e-3", f"output_dir={root / 'sft'}"]) == 0
    # GRPO from the SFT output directory (a tiny lr: the test is about the hand-over, not learning)
    assert main(["train", f"model={root / 'sft'}", *ENV, "algo=grpo", "steps=1", "groups_per_step=2", "group_size=2",
                 "sampling.max_new_tokens=4", "eval.episodes=2", "optim.lr=1e-6", "learner.micro_batch_size=4",
                 "tensorboard=false", f"output_dir={root / 'grpo'}"]) == 0
    # DPO from the GRPO run directory; the oracle joins each group so the tiny model's equal returns
    # still yield pairs
    assert main(["dpo", f"model={root / 'grpo'}", *ENV, "data.episodes=2", "data.samples_per_task=2",
                 "data.max_new_tokens=48", "data.oracle_chosen=true", "optim.max_steps=1", "optim.batch_size=1",
                 "optim.lr=1e-3", f"output_dir={root / 'dpo'}"]) == 0
    return root


def test_each_stage_writes_its_config_and_loads_the_previous_output(pipeline):
    sft, grpo, dpo = pipeline / "sft", pipeline / "grpo", pipeline / "dpo"
    for run in (sft, grpo, dpo):
        assert (run / "config.yaml").exists() and (run / "train_log.csv").stat().st_size > 0
    assert yaml.safe_load((sft / "config.yaml").read_text())["data"]["source"] == "oracle"
    assert yaml.safe_load((grpo / "config.yaml").read_text())["model"] == str(sft)
    assert yaml.safe_load((dpo / "config.yaml").read_text())["model"] == str(grpo)
    assert json.loads((dpo / "data_summary.json").read_text())["pairs"] >= 1

    sft_w = weights(sft / "model")
    init_w = {k: v for k, v in load_trained_policy("tiny-random").model.state_dict().items()}
    ckpt = trainer_checkpoint(grpo)
    assert ckpt is not None and ckpt.name == "step_000001"
    grpo_w = weights(ckpt / "model")
    # GRPO started from the SFT weights, not from a fresh model
    assert distance(grpo_w, sft_w) < 0.01 * distance(grpo_w, init_w)
    # the GRPO run directory loads as exactly its last checkpoint's weights, with the SFT tokenizer
    loaded = load_trained_policy(str(grpo))
    assert all(torch.equal(loaded.model.state_dict()[k], v) for k, v in grpo_w.items())
    assert loaded.tokenizer.get_vocab() == load_trained_policy(str(sft)).tokenizer.get_vocab()
    # DPO trained (its output moved away from the GRPO weights it started from)
    assert distance(weights(dpo / "model"), grpo_w) > 0


def run_eval(*argv: str, out: Path) -> dict:
    assert main(["eval", *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_eval_reports_mean_and_std_on_held_out_tasks(pipeline, capsys):
    res = run_eval("Arithmetic-v0", "--policy", str(pipeline / "dpo"), "--episodes", "2", "--max-new-tokens", "4",
                   "-e", "hard_fraction=0.5", "-e", "max_turns=2", out=pipeline / "eval_dpo.json")
    assert res["env_kwargs"] == {"hard_fraction": 0.5, "max_turns": 2, "split": "test"}   # held out by default
    assert res["config"]["model"] == str(pipeline / "dpo") and res["config"]["episodes"] == 2
    assert len(res["trajectories"]) == 2
    for key in ("success_rate", "reward_mean", "turns_mean", "reward/correct", "reward/invalid"):
        assert key in res["metrics"] and key in res["metrics_std"]
    table = capsys.readouterr().out
    assert "mean" in table and "std" in table and "split test" in table
    # a trainer checkpoint directory is a policy too
    ckpt = trainer_checkpoint(pipeline / "grpo")
    res = run_eval("Arithmetic-v0", "--policy", str(ckpt), "--episodes", "1", "--max-new-tokens", "4",
                   out=pipeline / "eval_ckpt.json")
    assert res["metrics"]["episodes"] == 1


def test_eval_config_file_reports_toolcall_evaluator_metrics(tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text("env: ToolCall-v0\nmodel: oracle\nepisodes: 3\nmax_new_tokens: 256\nfirst_task: 0\n")
    res = run_eval("--config", str(cfg), "episodes=4", "batch_size=2", out=tmp_path / "tc.json")
    m, s = res["metrics"], res["metrics_std"]
    assert m["episodes"] == 4 and res["env_kwargs"] == {"split": "test"}
    assert [t["task_index"] for t in res["trajectories"]] == [0, 1, 2, 3]
    for key in ("tool_selection_accuracy", "plan_success", "step_efficiency", "end_to_end_success"):
        assert m[f"episode/{key}"] == 1.0 and s[f"episode/{key}"] == 0.0     # the oracle is perfect
    for term in ("task_completion", "tool_accuracy", "efficiency", "timing", "format"):
        assert f"reward/{term}" in m and f"reward/{term}" in s
    assert m["reward_mean"] == pytest.approx(1.0) and s["reward_mean"] == pytest.approx(0.0)
    assert s["turns_mean"] > 0                                                  # tasks differ in length
    assert env_takes_split("agentgym/ToolCall-v0") and env_takes_split("agentgym/CodeExec-v0")  # held-out split too
