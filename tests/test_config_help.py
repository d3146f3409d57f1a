"""Every knob of every command's config has a one-line help, and ``agentgym config`` lists them all."""

from __future__ import annotations

import dataclasses

import pytest

from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.app.knobs import command_config, describe_configs
from agentgym.algorithms.offline.sft import SFTRunConfig
from agentgym.config import config_fields, format_config_table


# EvalRunConfig (agentgym/evaluation.py) gets its helps in a parallel change; drop this mark when it lands


@pytest.mark.parametrize("command", ["dpo", "eval", "sft", "train"])
def test_every_knob_has_a_one_line_help(command):
    knobs = list(config_fields(command_config(command)))
    assert len(knobs) > 10
    missing = [k.path for k in knobs if not k.help.strip()]
    assert missing == [], f"{command}: knobs without metadata['help']: {missing}"
    multiline = [k.path for k in knobs if "\n" in k.help]
    assert multiline == []


def test_a_knob_added_without_help_is_caught():
    @dataclasses.dataclass
    class Grown(TrainConfig):
        new_knob: int = 3

    missing = [k.path for k in config_fields(Grown) if not k.help]
    assert missing == ["new_knob"]


def test_listing_names_nested_knobs_with_their_resolved_defaults():
    knobs = {k.path: k for k in config_fields(TrainConfig)}
    assert knobs["optim.lr"].default == 1e-5                        # TrainConfig's, not OptimConfig's 1e-6
    assert knobs["learner.micro_batch_size"].default == 16
    assert knobs["learner.clip_eps"].help and knobs["learner.kl_coef"].help and "lr" not in {
        k.rsplit(".", 1)[-1] for k in knobs if k.startswith("learner.")}   # the optimizer is optim.*
    assert knobs["rollout.sampling.temperature"].default == 1.0
    assert knobs["rollout.sampling.max_new_tokens"].default == 48
    assert knobs["health.window"].default == 5
    assert knobs["eval.env_kwargs"].default == {"split": "test"}
    assert knobs["optim.lr"].type == "float" and "learning rate" in knobs["optim.lr"].help
    assert knobs["lora"].default is None and "LoRA" in knobs["lora"].help
    assert knobs["rollout"].default == "(section)" and knobs["rollout"].help


def test_every_listed_default_is_what_train_config_resolves_to():
    cfg = TrainConfig()
    for knob in config_fields(cfg):
        if knob.default == "(section)":
            continue
        value = cfg
        for part in knob.path.split("."):
            value = getattr(value, part)
        assert value == knob.default, knob.path


def test_table_has_one_line_per_knob_with_path_default_and_help():
    table = describe_configs("train")
    lines = table.splitlines()
    assert lines[0] == "agentgym train: TrainConfig"
    assert lines[1].split()[:4] == ["path", "type", "default", "help"]
    main = lines[:lines.index("")]                               # TrainConfig's own table comes first
    assert len(main) == 2 + len(list(config_fields(TrainConfig)))
    # then, per other algorithm, the learner settings its typed config adds or defaults otherwise
    ppo = table[table.index("agentgym train algo=ppo: learner is PPOConfig"):]
    assert "learner.critic_lr " in ppo and "learner.lam " in ppo and '"token"' in ppo
    assert "learner.clip_eps " not in ppo                          # the same as grpo's: listed once, above
    lr = next(line for line in lines if line.startswith("optim.lr "))
    assert "1e-05" in lr and "learning rate" in lr
    temp = next(line for line in lines if line.startswith("rollout.sampling.temperature "))
    assert "1.0" in temp and "temperature" in temp
    assert format_config_table(SFTRunConfig).splitlines()[0].startswith("path")


def test_describe_configs_covers_every_command_and_refuses_others():
    for command in ("sft", "dpo"):
        assert f"agentgym {command}:" in describe_configs(command)
    assert "optim.epochs" in describe_configs("sft")
    assert "beta " in describe_configs("dpo")
    with pytest.raises(ValueError, match="train"):
        describe_configs("nope")


def test_agentgym_config_lists_every_knob_from_the_command_line(capsys):
    """`agentgym config train` as a user types it: one line per knob with its default and help."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "agentgym", "config", "train"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    lr = next(line for line in lines if line.startswith("optim.lr "))
    assert "1e-05" in lr and len(lr.split()) > 3
    assert any(line.startswith("rollout.sampling.temperature ") for line in lines)
    bad = subprocess.run([sys.executable, "-m", "agentgym", "config", "bogus"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'bogus'" in bad.stderr and "Traceback" not in bad.stderr


def test_config_env_lists_every_setting_of_an_env_with_defaults_and_help():
    from agentgym.app.knobs import describe_env, env_settings
    rows = {name: (kind, default, help_) for name, kind, default, help_ in env_settings("SearchQA-v0")}
    assert rows["topk"] == ("int", "3", "passages per search (Search-R1: 3).")
    assert rows["split"][1] == "'train'" and "validation" in rows["split"][2]
    assert "group_reward" in rows and "reward" in rows          # the AgentEnv keywords, through **kwargs or named
    text = describe_env("Math-v0")
    assert text.startswith("agentgym env Math-v0: set as env_kwargs.NAME=VALUE") and "difficulty" in text
    with pytest.raises(ValueError, match="no env 'Nope-v0'"):
        env_settings("Nope-v0")


def test_config_env_from_the_command_line():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "agentgym", "config", "env", "Arithmetic-v0"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "hard_fraction" in r.stdout and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "agentgym", "config", "env"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "needs an env id" in r.stderr and "Traceback" not in r.stderr
