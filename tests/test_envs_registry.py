"""Contract tests for every registered env (iterating ``agentgym.list_envs()``, so new envs are covered
automatically), plus registration of a user's own env exactly as the README shows it.

The user env (``Echo-v0``) is registered inside a fixture and removed from Gymnasium's registry
afterwards, so the registry-wide tests (parametrised at collection time) never depend on test order;
the user-env test runs the same registry-wide checks on ``Echo-v0`` itself.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym
from agentgym import AgentEnv, FullHistory, Reward, Transition
from agentgym.app.checking import MALFORMED_ACTIONS, check_invalid_step, fuzz_env, run_check_env
from agentgym.parsing import first_tag
from agentgym.rewards import ExactMatch, InvalidActionPenalty

ENV_IDS = agentgym.list_envs()
FUZZ_ACTIONS = 1_000

SUMMARY_KEYS = {"success", "return", "turns", "terminated", "truncated", "tool_calls", "invalid_actions",
                "action_counts", "reward_terms", "task_index"}


def test_registry_lists_builtin_envs():
    assert "agentgym/Arithmetic-v0" in ENV_IDS
    assert ENV_IDS == sorted(ENV_IDS)
    assert all(env_id.startswith("agentgym/") for env_id in ENV_IDS)


# --------------------------------------------------------------------------- the fuzz strategy
_FRAGMENTS = ["<answer>", "</answer>", "<search>", "</search>", "<tool_call>", "</tool_call>", "{", "}", "[", "]",
              '"name"', '"arguments"', ":", ",", '"calculator"', '"expression"', "\\boxed{", "```python\n", "```",
              "Thought:", "Action:", "Action Input:", "Final Answer:", "Observation:", "\n", " ", "1", "-", "x", '"']
_expression = st.one_of(st.text(max_size=20),
                        st.lists(st.sampled_from(list("0123456789+-*/%().^e ,×÷")), max_size=20).map("".join),
                        st.builds(lambda a, op, b: f"{a} {op} {b}", st.integers(-10**6, 10**6),
                                  st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "^"]), st.integers(-50, 50)))
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10))
_tool_call = st.builds(
    lambda name, args, wrap: wrap.format(json.dumps({"name": name, "arguments": args})),
    st.one_of(st.sampled_from(["calculator", "search", "python", "", " "]), st.text(max_size=10)),
    st.one_of(st.fixed_dictionaries({"expression": _expression}),
              st.dictionaries(st.text(max_size=8), _json_leaf, max_size=3),
              _expression, st.lists(_json_leaf, max_size=3)),
    st.sampled_from(["<tool_call>{}</tool_call>", "<tool_call>\n{}\n</tool_call>", "<tool_call>{}",
                     "{}</tool_call>", "<tool_call>{}</tool_call><answer>1</answer>"]),
)
_calculator_call = _expression.map(
    lambda e: "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": e}}) + "</tool_call>")
_answer = st.builds(lambda pre, s, post: f"{pre}<answer>{s}</answer>{post}",
                    st.text(max_size=10), st.one_of(st.text(max_size=10), st.integers().map(str)), st.text(max_size=10))
_markupish = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=6)), max_size=25).map("".join)
ACTIONS = st.one_of(st.text(), st.sampled_from(MALFORMED_ACTIONS), _markupish, _tool_call, _calculator_call, _answer,
                    st.builds(lambda t, a, i: f"Thought: {t}\nAction: {a}\nAction Input: {i}",
                              st.text(max_size=10), st.text(max_size=10), st.text(max_size=10)))


class _Stepper:
    """Steps one env through many actions, resetting when an episode ends, checking every step."""

    def __init__(self, env: gym.Env):
        self.env, self.steps, self.episodes, self.action_types = env, 0, 0, set()
        self.episode_rewards: list[float] = []
        self._reset()

    def _reset(self) -> None:
        obs, info = self.env.reset(seed=self.episodes)
        assert self.env.observation_space.contains(obs) and obs, "the first observation holds the task prompt"
        self.episodes += 1
        self.episode_rewards = []

    def step(self, action: str) -> None:
        env = self.env
        obs, reward, terminated, truncated, info = env.step(action)
        self.steps += 1
        self.action_types.add(info["action_type"])
        assert env.observation_space.contains(obs), f"observation outside the space: {obs!r}"
        problem = check_invalid_step(obs, info)
        assert problem is None, problem
        assert isinstance(reward, float) and math.isfinite(reward)
        assert type(terminated) is bool and type(truncated) is bool and not (terminated and truncated)
        assert isinstance(info["action_type"], str) and info["action_type"]
        terms = info["reward_terms"]
        assert set(terms) == set(env.unwrapped.reward.names)
        assert sum(terms.values()) == pytest.approx(reward, abs=1e-9)
        self.episode_rewards.append(reward)
        if terminated or truncated:
            summary = info["episode_summary"]
            assert SUMMARY_KEYS <= set(summary)
            assert summary["turns"] == len(self.episode_rewards)
            assert summary["return"] == pytest.approx(sum(self.episode_rewards), abs=1e-9)
            assert (summary["terminated"], summary["truncated"]) == (terminated, truncated)
            self._reset()
        else:
            assert "episode_summary" not in info


def fuzz(env_id: str, n: int = FUZZ_ACTIONS) -> _Stepper:
    env = gym.make(env_id)
    stepper = _Stepper(env)
    for action in MALFORMED_ACTIONS:
        stepper.step(action)

    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(ACTIONS)
    def run(action):
        stepper.step(action)

    run()
    env.close()
    return stepper


# --------------------------------------------------------------------------- registry-wide contract tests
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env_passes(env_id):
    check_env(gym.make(env_id).unwrapped)
    check_env(gym.make(env_id, render_mode="ansi").unwrapped)
    assert run_check_env(env_id) is None


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_fuzz_no_exception_and_invalid_actions_are_explained(env_id):
    stepper = fuzz(env_id)
    assert stepper.steps >= FUZZ_ACTIONS
    assert "invalid" in stepper.action_types
    assert len(stepper.action_types) >= 2, stepper.action_types


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_seeding_determinism(env_id):
    env1, env2 = gym.make(env_id), gym.make(env_id)
    for seed in (0, 1, 12345):
        obs1, info1 = env1.reset(seed=seed)
        obs2, info2 = env2.reset(seed=seed)
        assert obs1 == obs2
        assert info1["task_index"] == info2["task_index"]
        assert info1["privileged"]["task"] == info2["privileged"]["task"]
        a = env1.step("not an action")
        b = env2.step("not an action")
        assert a[:4] == b[:4] and a[4]["reward_terms"] == b[4]["reward_terms"]
    # unseeded resets continue the seeded stream deterministically too
    env1.reset(seed=7)
    env2.reset(seed=7)
    assert env1.reset()[1]["privileged"]["task"] == env2.reset()[1]["privileged"]["task"]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_reset_task_options(env_id):
    env = gym.make(env_id)
    base = env.unwrapped
    for i in (0, 1, 2):
        obs, info = env.reset(options={"task_index": i})
        assert info["task_index"] == i
        assert info["privileged"]["task"] == base.get_task(i)
        assert obs == base.initial_messages(base.get_task(i))
        assert env.reset(seed=99, options={"task_index": i})[0] == obs  # the option wins over the seed
    task = env.reset(seed=3)[1]["privileged"]["task"]
    obs, info = env.reset(options={"task": task})
    assert obs == base.initial_messages(task)
    assert info["privileged"]["task"] == task
    assert base.task == task and base.task is not task  # copied


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("options", [{"bogus": 1}, {"task_index": -1}, {"task_index": "zero"},
                                     {"task_index": 1.5}, {"task_index": None}, {"task": 5}, {"task": "text"}])
def test_reset_bad_options_raise_value_error(env_id, options):
    env = gym.make(env_id)
    with pytest.raises(ValueError):
        env.reset(options=options)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_task_index_beyond_num_tasks_raises(env_id):
    env = gym.make(env_id)
    n = env.unwrapped.num_tasks
    if n is None:  # procedurally unbounded: any non-negative index is a task
        assert env.reset(options={"task_index": 10**9})[1]["task_index"] == 10**9
    else:
        env.reset(options={"task_index": n - 1})
        with pytest.raises(ValueError):
            env.reset(options={"task_index": n})


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_turn_limit_truncates(env_id):
    env = gym.make(env_id)
    base = env.unwrapped
    env.reset(seed=0)
    steps = []
    while True:
        obs, reward, terminated, truncated, info = env.step("")
        steps.append((terminated, truncated))
        if terminated or truncated:
            break
    assert len(steps) <= base.max_turns
    if not terminated:  # "" is not a final answer in any sane env
        assert steps == [(False, False)] * (base.max_turns - 1) + [(False, True)]
        assert info["episode_summary"]["truncated"] and not info["episode_summary"]["terminated"]
        assert info["episode_summary"]["turns"] == base.max_turns
    with pytest.raises(RuntimeError, match="reset"):
        base.step("")
    env.reset(seed=0)
    env.step("")  # usable again after reset


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_oversized_action_is_invalid_not_a_crash(env_id):
    env = gym.make(env_id)
    limit = env.unwrapped.max_action_chars
    assert env.action_space.contains("x" * limit) and not env.action_space.contains("x" * (limit + 1))
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<answer>1</answer>" + "x" * limit)
    assert info["action_type"] == "invalid" and not terminated
    assert f"{limit + 18} characters" in obs[0]["content"] and str(limit) in obs[0]["content"]
    assert check_invalid_step(obs, info) is None
    with pytest.raises(TypeError):
        env.unwrapped.step(b"bytes")  # not an action at all: a programming error


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_render_ansi(env_id):
    env = gym.make(env_id, render_mode="ansi")
    obs, info = env.reset(seed=0)
    env.step("my action text")
    text = env.render()
    assert isinstance(text, str)
    assert obs[0]["content"] in text
    assert "[assistant]\nmy action text" in text
    quiet = gym.make(env_id)
    quiet.reset(seed=0)
    assert quiet.render() is None
    with pytest.raises(ValueError), pytest.warns(UserWarning, match="render_mode"):
        gym.make(env_id, render_mode="human")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_time_limit_and_episode_statistics(env_id):
    env = RecordEpisodeStatistics(TimeLimit(gym.make(env_id).unwrapped, max_episode_steps=2))
    env.reset(seed=0)
    rewards = []
    for _ in range(2):
        obs, reward, terminated, truncated, info = env.step("no")
        rewards.append(reward)
        if terminated or truncated:
            break
    assert terminated or truncated
    assert info["episode"]["l"] == len(rewards)
    assert info["episode"]["r"] == pytest.approx(sum(rewards))
    # the same through gymnasium.make's own arguments
    env = RecordEpisodeStatistics(gym.make(env_id, max_episode_steps=1))
    env.reset(seed=0)
    *_, info = env.step("no")
    assert info["episode"]["l"] == 1
    assert list(env.length_queue) == [1]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_full_history_wrapper(env_id):
    env = FullHistory(gym.make(env_id))
    obs, info = env.reset(seed=0)
    first = list(obs)
    assert obs == env.unwrapped.initial_messages(info["privileged"]["task"])
    obs, _, terminated, truncated, _ = env.step("first try")
    new = env.unwrapped.messages[len(first) + 1:]
    assert obs == first + [{"role": "assistant", "content": "first try"}] + new
    # Plain text may be a final answer (BFCL: no call is the answer) and a single-turn env ends after one
    # reply; the second step is checked wherever the episode goes on.
    if not (terminated or truncated):
        obs2, *_ = env.step("second try")
        assert obs2[:len(obs)] == obs
        assert obs2[len(obs)] == {"role": "assistant", "content": "second try"}
        assert obs2 == env.unwrapped.messages
        assert env.observation_space.contains(obs2)
        obs2.append({"role": "user", "content": "mutating the returned list"})
        assert env.unwrapped.messages[-1]["content"] != "mutating the returned list"
    else:
        assert env.observation_space.contains(obs)
        obs.append({"role": "user", "content": "mutating the returned list"})
        assert env.unwrapped.messages[-1]["content"] != "mutating the returned list"
    obs, _ = env.reset(seed=1)
    assert obs == env.unwrapped.messages and len(obs) == len(first)


# --------------------------------------------------------------------------- a user's own env (README)
class EchoEnv(agentgym.AgentEnv):
    """Say the word you are shown back, inside <answer>...</answer>."""

    num_tasks = 3
    WORDS = ("alpha", "beta", "gamma")

    def get_task(self, index):
        return {"word": self.WORDS[index], "answers": [self.WORDS[index]]}

    def initial_messages(self, task):
        return [{"role": "user", "content": f"Say {task['word']} inside <answer></answer>."}]

    def transition(self, action):
        tag = first_tag(action, ("answer",))
        if tag is None:
            return self.invalid("Reply with <answer>WORD</answer>.")
        return Transition([], "answer", parsed=tag, terminated=True, answer=tag.content)

    def default_reward(self):
        return Reward([ExactMatch(), (InvalidActionPenalty(), 0.1)])


@pytest.fixture
def echo_id():
    """Register Echo-v0 the README way; take it out of Gymnasium's registry afterwards."""
    fid = agentgym.register("Echo-v0", entry_point=EchoEnv)
    yield fid
    del gym.registry[fid]


def test_user_env_registered_like_the_readme(echo_id):
    assert echo_id == "agentgym/Echo-v0"
    assert "agentgym/Echo-v0" in agentgym.list_envs()
    assert agentgym.spec("Echo-v0").entry_point is EchoEnv
    for env in (gym.make("agentgym/Echo-v0"), agentgym.make("Echo-v0"), agentgym.make("agentgym/Echo-v0")):
        assert isinstance(env.unwrapped, EchoEnv) and isinstance(env.unwrapped, AgentEnv)
        obs, info = env.reset(options={"task_index": 1})
        assert obs == [{"role": "user", "content": "Say beta inside <answer></answer>."}]
        obs, reward, terminated, truncated, info = env.step("hmm")
        assert (reward, terminated, truncated, info["action_type"]) == (-0.1, False, False, "invalid")
        assert obs == [{"role": "user", "content": "Reply with <answer>WORD</answer>."}]
        obs, reward, terminated, truncated, info = env.step("<answer> Beta </answer>")
        assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
        assert info["reward_terms"] == {"exact_match": 1.0, "invalid": 0.0}
        assert info["answer"] == "Beta"
        summary = info["episode_summary"]
        assert summary["success"] is True and summary["turns"] == 2 and summary["invalid_actions"] == 1
        assert summary["return"] == pytest.approx(0.9)
        assert summary["action_counts"] == {"invalid": 1, "answer": 1}
        # (after a successful reset: Gymnasium 1.4's PassiveEnvChecker breaks if the very first reset raises)
        with pytest.raises(ValueError, match="out of range"):
            env.reset(options={"task_index": 3})
        env.close()


def test_user_env_is_held_to_the_registry_wide_rules(echo_id):
    check_env(gym.make(echo_id).unwrapped)
    assert run_check_env(echo_id) is None
    stepper = fuzz(echo_id, n=300)
    assert stepper.action_types == {"invalid", "answer"}
    report = fuzz_env(echo_id, n=200)
    assert report.ok, report.failures
    assert report.steps == 200


def test_register_options_and_kwargs(echo_id):
    fid = agentgym.register("Echo-v1", entry_point=f"{EchoEnv.__module__}:EchoEnv", max_turns=2,
                            max_episode_steps=5, kwargs={"max_action_chars": 100})
    try:
        spec = agentgym.spec("Echo-v1")
        assert spec.max_episode_steps == 5
        assert spec.kwargs == {"max_turns": 2, "max_action_chars": 100}
        env = agentgym.make("Echo-v1")
        assert (env.unwrapped.max_turns, env.unwrapped.max_action_chars) == (2, 100)
        assert agentgym.make("Echo-v1", max_turns=4).unwrapped.max_turns == 4
        assert fid in agentgym.list_envs() and echo_id in agentgym.list_envs()
    finally:
        del gym.registry[fid]
    assert fid not in agentgym.list_envs()


def test_register_and_make_errors():
    with pytest.raises(ValueError, match="namespace"):
        agentgym.register("other/Thing-v0", entry_point=EchoEnv)
    with pytest.raises(gym.error.NameNotFound, match="Arithmetic-v0"):
        agentgym.make("NoSuchEnv-v0")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_make_names_an_unknown_argument(env_id):
    """A mistyped constructor argument is named, with the nearest real one, before the env is built."""
    with pytest.raises(TypeError, match=r"no argument 'max_turn' \(did you mean 'max_turns'\?\)"):
        agentgym.make(env_id, max_turn=2)
    with pytest.raises(TypeError, match=r"no argument 'zzz'; it takes: .*max_turns"):
        agentgym.make(env_id, zzz=1)


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("value", ["abc", [1], True, 2.5])
def test_make_names_a_wrong_type(env_id, value):
    """max_turns is an int (or None) in every built-in env; any other type gets one clear line."""
    with pytest.raises(TypeError, match=r"max_turns must be int"):
        agentgym.make(env_id, max_turns=value)


def test_make_accepts_the_types_users_pass():
    import numpy as np
    env = agentgym.make("Math-v0", max_turns=np.int64(3), kinds=("arithmetic",), difficulty=[1, 2],
                        guess_step_ratio=1, max_action_chars=100)  # an int where a float is asked is fine
    assert env.unwrapped.max_turns == 3
    env.close()
    env = agentgym.make("ToolCall-v0", families=None, transient_rate=0)
    env.close()
    with pytest.raises(TypeError, match=r"kinds must be a list of str, got 'arithmetic'"):
        agentgym.make("Math-v0", kinds="arithmetic")  # a bare string would be split into letters
    with pytest.raises(TypeError, match=r"world_size must be str or int, got None"):
        agentgym.make("SearchQA-v0", world_size=None)


class _Loose(EchoEnv):
    def __init__(self, scale, **kwargs):  # no annotation, and **kwargs: names and types pass through
        super().__init__(**{k: v for k, v in kwargs.items() if k in ("max_turns",)})
        self.scale = scale


def test_make_leaves_unannotated_and_var_keyword_constructors_alone():
    fid = agentgym.register("Loose-v0", entry_point=_Loose)
    try:
        env = agentgym.make("Loose-v0", scale="anything", whatever=1, max_turns=2)
        assert env.unwrapped.scale == "anything" and env.unwrapped.max_turns == 2
        env.close()
    finally:
        del gym.registry[fid]


def test_check_env_kwargs_on_the_command_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "agentgym", "play", "Math-v0", "-e", "max_turns=abc"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == ["error: TypeError: Math-v0: max_turns must be int or None, got 'abc'"]
    assert "Traceback" not in out.stderr


def test_import_agentgym_loads_no_concrete_env():
    code = ("import sys, agentgym; assert 'agentgym.envs.arithmetic' not in sys.modules, 'eager import'; "
            "print(agentgym.list_envs())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "agentgym/Arithmetic-v0" in out.stdout


# --------------------------------------------------------------------------- termination (a known env)
def test_answer_terminates():
    env = agentgym.make("Arithmetic-v0")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(f"<answer>{info['privileged']['task']['answers'][0]}</answer>")
    assert terminated and not truncated
    assert info["action_type"] == "answer"
    assert info["episode_summary"]["success"] is True
    assert info["episode_summary"]["terminated"] is True
    assert info["episode_summary"]["truncated"] is False


def test_an_env_missing_a_method_says_which():
    class Bare(agentgym.AgentEnv):
        num_tasks = 1

    with pytest.raises(NotImplementedError, match=r"^Bare has no reward: define default_reward\(\) or pass reward="):
        Bare()
    env = Bare(reward=Reward([ExactMatch()]))
    with pytest.raises(NotImplementedError, match=r"^Bare must define get_task\(index\)"):
        env.reset(seed=0)
