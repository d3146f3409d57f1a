"""Config error messages name the setting by its dotted path, with no dangling separator.

A section's own check (``SamplingConfig`` rejecting ``top_p=7``) used to be reported as
``rollout.sampling.: top_p …``: the section's path was built as a key prefix ending in ``.``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from agentgym.config import ConfigError, from_dict, load_config


@dataclasses.dataclass
class _Leaf:
    x: int = 1

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError(f"x must be >= 0, got {self.x}")


@dataclasses.dataclass
class _Mid:
    leaf: _Leaf = dataclasses.field(default_factory=_Leaf)


@dataclasses.dataclass
class _Top:
    mid: _Mid = dataclasses.field(default_factory=_Mid)
    y: int = 0

    def __post_init__(self) -> None:
        if self.y < 0:
            raise ValueError("y must be >= 0")


@pytest.mark.parametrize("data, message", [
    ({"mid": {"leaf": {"x": -1}}}, "mid.leaf: x must be >= 0, got -1"),        # a nested section's own check
    ({"y": -1}, "_Top: y must be >= 0"),                                       # the top level's own check
    ({"mid": {"leaf": {"x": "a"}}}, "mid.leaf.x: expected int, got str ('a')"),  # a leaf's type
    ({"mid": {"nope": 1}}, "unknown config key(s) mid.nope; valid: leaf"),
    ({"mid": 3}, "mid: expected a mapping for _Mid, got int"),
])
def test_paths_in_messages(data, message):
    with pytest.raises(ConfigError) as e:
        from_dict(_Top, data)
    assert str(e.value) == message
    assert ".:" not in str(e.value) and ".." not in str(e.value)


@pytest.mark.parametrize("data, hint", [
    ({"yy": 1}, "unknown config key(s) yy (did you mean 'y'?); valid: mid, y"),         # a typo at this level
    ({"x": 1}, "unknown config key(s) x (did you mean 'mid.leaf.x'?); valid: mid, y"),  # a key two levels down
    ({"mid": {"lef": {}}}, "unknown config key(s) mid.lef (did you mean 'mid.leaf'?); valid: leaf"),
    ({"zzz": 1}, "unknown config key(s) zzz; valid: mid, y"),                          # nothing close: no guess
])
def test_an_unknown_key_gets_the_closest_known_one(data, hint):
    with pytest.raises(ConfigError) as e:
        from_dict(_Top, data)
    assert str(e.value) == hint


@pytest.mark.parametrize("override, hint", [
    ("lr=1e-5", "unknown config key(s) lr (did you mean 'optim.lr'?)"),
    ("stepz=3", "unknown config key(s) stepz (did you mean 'steps'?)"),
    ("rollout.max_new_token=8", "(did you mean 'rollout.sampling.max_new_tokens'?)"),
    ("temperature=0.7", "(did you mean 'learner.temperature' or 'rollout.sampling.temperature'?)"),
])
def test_train_config_hints_name_the_section_a_key_lives_in(override, hint):
    from agentgym.algorithms.loop.train_config import TrainConfig
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, overrides=[override])
    assert hint in str(e.value)


def test_a_trailing_dot_prefix_is_still_accepted():
    """``prefix`` used to be passed as ``"section."``; that spelling gives the same message."""
    with pytest.raises(ConfigError, match=r"^outer\.mid\.leaf: x must be >= 0"):
        from_dict(_Top, {"mid": {"leaf": {"x": -1}}}, prefix="outer.")


@pytest.mark.parametrize("override", ["rollout.sampling.top_p=7", "sampling.top_p=7"])  # canonical and alias
def test_train_config_section_check_names_the_section(override):
    from agentgym.algorithms.loop.train_config import TrainConfig
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, [override])
    assert str(e.value) == "rollout.sampling: top_p must be in (0, 1], got 7.0"


def test_cli_prints_the_path_without_a_stray_dot():
    """The message a user sees (configs are validated before a model loads, so this exits fast)."""
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "train", "rollout.sampling.top_p=7"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode != 0
    assert "rollout.sampling: top_p must be in (0, 1], got 7.0" in r.stderr and ".:" not in r.stderr, r.stderr


def test_a_config_path_that_is_a_directory_or_not_text_is_a_config_error(tmp_path):
    from agentgym.algorithms.loop.train_config import TrainConfig
    with pytest.raises(ConfigError, match="is a directory; give a YAML file"):
        load_config(TrainConfig, tmp_path)
    (tmp_path / "weights.yaml").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="is not text"):
        load_config(TrainConfig, tmp_path / "weights.yaml")


@pytest.mark.parametrize("words, whole", [
    (["env_kwargs={difficulty:", "2}"], "env_kwargs={difficulty: 2}"),
    (["steps=3", "env_kwargs={difficulty:", "2,", "hard_fraction:", "0.5}", "seed=1"],
     "env_kwargs={difficulty: 2, hard_fraction: 0.5}"),
    (["sampling.stop=[a,", "b]"], "sampling.stop=[a, b]"),
    (["model='my", "model'"], "model='my model'"),
])
def test_an_unquoted_value_the_shell_split_gets_the_quoted_override(words, whole):
    """``agentgym train env_kwargs={difficulty: 2}`` typed without quotes: the shell passes two words."""
    from agentgym.algorithms.loop.train_config import TrainConfig
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, words)
    assert str(e.value).endswith(f"is not key=value (the shell split a value at its spaces: quote the whole "
                                 f"override, e.g. '{whole}')")


def test_a_stray_word_after_a_closed_value_gets_no_quoting_hint():
    from agentgym.algorithms.loop.train_config import TrainConfig
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, ["env_kwargs={difficulty: 2}", "steps=1", "foo"])
    assert str(e.value) == "override 'foo' is not key=value"


@pytest.mark.parametrize("override, message", [
    ("my_run.yaml", "override 'my_run.yaml' is not key=value (a config file? --config my_run.yaml)"),
    ("steps", "override 'steps' is not key=value"),
    ("=3", "override '=3' has no key before '='"),
])
def test_an_override_that_is_not_one_says_what_it_is(override, message):
    from agentgym.algorithms.loop.train_config import TrainConfig
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, [override])
    assert str(e.value) == message


@pytest.mark.parametrize("spec", ["/no/such/model", "./no_such_dir/x", "no_such_org/no_such_model"])
def test_a_model_that_is_neither_a_path_nor_on_the_hub_is_a_one_line_usage_error(spec):
    """A path that starts with / or . is never taken for a hub id; an org/name that is neither a local
    directory nor reachable on the Hub says both (HF_HUB_OFFLINE: nothing is fetched)."""
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "eval", "Arithmetic-v0", "--policy", spec,
                        "--episodes", "1", "--threads", "1"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdin=subprocess.DEVNULL)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-800:]
    assert last.startswith("error: ConfigError: model: model ") and spec in last
    if spec.startswith(("/", ".")):
        assert "nor a hub id" in last
    else:
        assert "no local directory of that name, and the Hugging Face Hub did not give it" in last


def test_invalid_yaml_is_one_line_with_where(tmp_path):
    from agentgym.algorithms.loop.train_config import TrainConfig
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\noptim: {lr: [1e-5\n")
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, bad)
    msg = str(e.value)
    assert msg.startswith(f"config file {bad} is not valid YAML (line ") and "\n" not in msg


@pytest.mark.parametrize("argv, message", [
    (["train", "env_kwargs.max_turn=3"], "env_kwargs: Math-v0: no argument 'max_turn' (did you mean 'max_turns'?)"),
    (["train", "--env-kwargs.max_turns=x"], "env_kwargs: Math-v0: max_turns must be int or None, got 'x'"),
    (["train", "env=SearchQA-v0", "eval.env_kwargs.topk=abc"], "eval.env_kwargs: SearchQA-v0: topk must be int, got 'abc'"),
    (["sft", "env=Arithmetic-v0", "env_kwargs.max_turns=[2]"], "env_kwargs: Arithmetic-v0: max_turns must be int, got [2]"),
    (["eval", "Arithmetic-v0", "--policy", "scripted", "-e", "max_turn=2"],
     "env_kwargs: Arithmetic-v0: no argument 'max_turn' (did you mean 'max_turns'?)"),
    (["compare", "--algos", "grpo", "--seeds", "1", "env_kwargs.max_turn=3"],
     "env_kwargs: Math-v0: no argument 'max_turn' (did you mean 'max_turns'?)"),
])
def test_env_arguments_are_checked_before_any_model_loads(tmp_path, argv, message):
    """A mistyped env argument is a usage error (exit 2) in one line, said before the model loads and before
    any run folder is made, by every command that builds the env."""
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", *argv, "--threads", "1"], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdin=subprocess.DEVNULL,
                       cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-800:]
    assert r.stderr.strip().splitlines()[-1].split(": ", 2)[-1] == message
    assert "Loading weights" not in r.stderr and not any(tmp_path.iterdir())


def test_a_mistyped_hub_id_gets_the_same_message_on_the_vllm_path():
    """vLLM loads from disk: a hub id it cannot get is said by agentgym, as on the transformers path, not by the
    engine after its start-up."""
    pytest.importorskip("vllm", reason="the vLLM extra is not installed (CI installs it: scripts/setup.sh --vllm)")
    r = subprocess.run([sys.executable, "-m", "agentgym.app.cli", "eval", "Arithmetic-v0", "--policy",
                        "no_such_org/no_such_model", "--backend", "vllm", "--episodes", "1", "--threads", "1"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-800:]
    assert r.stderr.strip().splitlines()[-1].startswith(
        "error: ConfigError: model: model 'no_such_org/no_such_model': no local directory of that name, and the "
        "Hugging Face Hub did not give it (")


def test_a_hub_id_in_the_offline_cache_is_handed_to_the_engine(tmp_path, monkeypatch):
    """The check before vLLM asks only for config.json, which an offline machine finds in the Hub cache."""
    from agentgym.policies.loading import model_directory
    repo = tmp_path / "hub" / "models--some-org--cached-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("0" * 40) / "config.json").write_text('{"model_type": "llama"}')
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    assert model_directory("some-org/cached-model") == "some-org/cached-model"
    with pytest.raises(FileNotFoundError, match=r"model 'some-org/not-cached': no local directory of that name"):
        model_directory("some-org/not-cached")
