"""Every built-in env declares its settings as one typed config (``config_class``): listed by
``agentgym config env ID``, checked before an env is built or a run loads a model, and the same env whether
a setting is given at its default or left out."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.envs.registration import load_env_creator

import agentgym
from agentgym import EnvConfig
from agentgym.app.knobs import describe_env, env_settings
from agentgym.config import ConfigError
from agentgym.registry import BUILTIN_ENVS, check_env_kwargs, check_run_env_kwargs

UNSAFE = {"sandbox": "subprocess", "allow_unsafe": True}   # the code envs run without docker or bwrap too
#: what each env needs to be built here; every other setting is left at its default
NEEDS = {"CodeExec-v0": UNSAFE, "HumanEval-v0": UNSAFE}


def config_class(env_id: str) -> type:
    return load_env_creator(BUILTIN_ENVS[env_id]).config_class


@pytest.mark.parametrize("env_id", sorted(BUILTIN_ENVS))
def test_config_is_a_dataclass_with_help_on_every_field_and_listed_whole(env_id):
    cls = config_class(env_id)
    assert dataclasses.is_dataclass(cls) and issubclass(cls, EnvConfig)
    fields = dataclasses.fields(cls)
    assert all(f.metadata.get("help", "").strip() for f in fields), [f.name for f in fields if not f.metadata.get("help")]
    rows = {name: (kind, default, help_) for name, kind, default, help_ in env_settings(env_id)}
    assert set(rows) == {f.name for f in fields}
    for f in fields:
        assert rows[f.name] == (str(f.type), repr(f.default), f.metadata["help"])
    text = describe_env(env_id)
    assert all(f"\n{f.name} " in text for f in fields)


@pytest.mark.parametrize("env_id", sorted(BUILTIN_ENVS))
def test_each_default_given_is_the_env_made_without_it(env_id):
    needs = NEEDS.get(env_id, {})
    defaults = {f.name: f.default for f in dataclasses.fields(config_class(env_id)) if f.name not in needs}
    plain, spelled = agentgym.make(env_id, **needs), agentgym.make(env_id, **needs, **defaults)
    try:
        a, b = plain.unwrapped, spelled.unwrapped
        assert a.config == b.config == config_class(env_id)(**needs)
        assert (a.max_turns, a.stop_strings, a.cut_after, a.num_tasks) == (b.max_turns, b.stop_strings, b.cut_after,
                                                                          b.num_tasks)
        assert a.reset(seed=3) == b.reset(seed=3)
    finally:
        plain.close()
        spelled.close()


def test_a_config_object_and_keywords_make_the_same_env():
    from agentgym.envs.mathrl import MathConfig, MathEnv
    by_config = MathEnv(MathConfig(difficulty=0, kinds=["arithmetic"]))
    by_keywords = gym.make("agentgym/Math-v0", difficulty=0, kinds=["arithmetic"]).unwrapped
    assert by_config.config == by_keywords.config and by_config.kinds == ("arithmetic",)
    assert by_config.reset(seed=1)[0] == by_keywords.reset(seed=1)[0]
    assert MathEnv(MathConfig(difficulty=0), max_turns=5).config.difficulty == 0   # keywords over a config
    with pytest.raises(TypeError, match="config must be a MathConfig, got dict"):
        MathEnv({"difficulty": 0})
    with pytest.raises(TypeError, match="MathConfig has no setting 'difficulti'; its settings: .*difficulty"):
        MathEnv(difficulti=0)


@pytest.mark.parametrize("env_id, kwargs, error, message", [
    ("Math-v0", {"max_turn": 2}, TypeError, "no argument 'max_turn' (did you mean 'max_turns'?)"),
    ("Math-v0", {"zzz": 2}, TypeError, "no argument 'zzz'; it takes: split, kinds, difficulty, tools, "),
    ("SearchQA-v0", {"zzz": 1}, TypeError, "no argument 'zzz'; it takes: protocol, split, retriever, topk,"),
    ("SearchQA-v0", {"topk": "3"}, TypeError, "topk must be int, got '3'"),
    ("SearchQA-v0", {"topk": 2.5}, TypeError, "topk must be int, got 2.5"),
    ("SearchQA-v0", {"forced_answer": "yes"}, TypeError, "forced_answer must be bool, got 'yes'"),
    ("Arithmetic-v0", {"max_turns": True}, TypeError, "max_turns must be int, got True"),
    ("Arithmetic-v0", {"split": None}, TypeError, "split must be str, got None"),
    ("Math-v0", {"kinds": "arithmetic"}, TypeError, "kinds must be a list of str, got 'arithmetic'"),
    ("Math-v0", {"difficulty": [1, "x"]}, TypeError, "difficulty must be int or a list of int, got [1, 'x']"),
    ("ToolCall-v0", {"families": {"a": 1}}, TypeError, "families must be a list of str or None"),
    ("Arithmetic-v0", {"hard_fraction": math.nan}, ValueError, "hard_fraction must be in [0, 1], got nan"),
    ("Arithmetic-v0", {"split": "dev"}, ValueError, "split must be one of ['train', 'validation', 'test']"),
    ("Math-v0", {"difficulty": -1}, ValueError, "difficulty must be >= 0, got -1"),
    ("SearchQA-v0", {"protocol": "chat", "retrieval": "rag"}, ValueError, "retrieval='rag' is a baseline of"),
    ("SearchQA-v0", {"oracle_two_hop": 1.5}, ValueError, "oracle_two_hop must be a number in [0, 1], got 1.5"),
    ("CodeExec-v0", {"sandbox": "vm"}, ValueError, "unknown sandbox 'vm'"),
    ("HumanEval-v0", {"memory_mb": 1}, ValueError, "memory_mb >= 16"),
    ("BFCL-v0", {"category": "nope"}, ValueError, "unknown BFCL category 'nope'"),
    ("ReasoningGym-v0", {"size": {"tests": 3}}, ValueError, "unknown split(s) ['tests']"),
    ("ReAct-v0", {"few_tool_calls": 9}, ValueError, "need 0 <= few_tool_calls <= many_tool_calls"),
])
def test_hostile_env_kwargs_are_one_line_errors_before_the_env_is_built(env_id, kwargs, error, message):
    with pytest.raises(error) as e:
        check_env_kwargs(env_id, kwargs)
    assert str(e.value).startswith(f"{env_id}: ") and message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^env_kwargs: " + env_id):      # a run's check: a usage error
        check_run_env_kwargs(env_id, kwargs)
    with pytest.raises(error):
        agentgym.make(env_id, **kwargs)


def test_a_runs_eval_env_kwargs_are_checked_over_its_env_kwargs():
    check_run_env_kwargs("SearchQA-v0", {"protocol": "search_r1"}, {"retrieval": "rag"})
    with pytest.raises(ConfigError, match="^eval.env_kwargs: SearchQA-v0: retrieval='rag' is a baseline"):
        check_run_env_kwargs("SearchQA-v0", {"protocol": "chat"}, {"retrieval": "rag"})


def test_a_user_subclass_extends_a_config_and_its_own_keywords_are_listed_too():
    from agentgym.envs.arithmetic import ArithmeticConfig, ArithmeticEnv

    @dataclasses.dataclass
    class SlowConfig(ArithmeticConfig):
        delay: float = dataclasses.field(default=0.0, metadata={"help": "seconds to wait per step"})

    class Slow(ArithmeticEnv):
        config_class = SlowConfig

    class Leveled(ArithmeticEnv):
        """Args:
            level: how hard.
        """
        def __init__(self, level: int = 1, **settings):
            super().__init__(**settings)
            self.level = level

    fids = [agentgym.register("Slow-v0", Slow), agentgym.register("Leveled-v0", Leveled, hard_fraction=0.0)]
    try:
        assert Slow(delay=2.0).config.delay == 2.0 and "delay" in {r[0] for r in env_settings("Slow-v0")}
        with pytest.raises(TypeError, match="Slow-v0: delay must be float, got 'x'"):
            check_env_kwargs("Slow-v0", {"delay": "x"})
        rows = {r[0]: r for r in env_settings("Leveled-v0")}
        assert rows["level"] == ("level", "int", "1", "how hard.") and rows["hard_fraction"][2] == "0.0"
        with pytest.raises(TypeError, match="Leveled-v0: level must be int"):
            check_env_kwargs("Leveled-v0", {"level": "hard"})
        assert Leveled(level=3, split="test").config.split == "test"
    finally:
        for fid in fids:
            del gym.registry[fid]


def test_a_bad_value_stops_the_command_line_before_any_env_or_model():
    out = subprocess.run([sys.executable, "-m", "agentgym", "play", "Math-v0", "-e", "difficulty=-1"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr
    assert "Math-v0: difficulty must be >= 0, got -1" in out.stderr and "Traceback" not in out.stderr
