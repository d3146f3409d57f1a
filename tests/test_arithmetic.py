"""Arithmetic-v0 specifics (envs/arithmetic.py)."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import pytest

import agentgym
from agentgym import Reward
from agentgym.envs.arithmetic import SYSTEM_PROMPT, ArithmeticEnv, numeric_equal
from agentgym.envs.calculator import calculate
from agentgym.rewards import ExactMatch

ID = "agentgym/Arithmetic-v0"
TERMS0 = {"correct": 0.0, "format": 0.0, "tool_cost": 0.0, "invalid": 0.0}


def call(expression: str, name: str = "calculator") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"expression": expression}}) + "</tool_call>"


def operands(task):
    a, op, b = task["expression"].split(" ")
    return int(a), op, int(b)


def find_task(env: ArithmeticEnv, predicate, limit: int = 1000) -> int:
    return next(i for i in range(limit) if predicate(env.get_task(i)))


# --------------------------------------------------------------------------- tasks
@pytest.mark.parametrize("hard_fraction, lo, hi", [(0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (0.5, 0.45, 0.55), (0.2, 0.16, 0.24)])
def test_hard_fraction_controls_the_split(hard_fraction, lo, hi):
    env = ArithmeticEnv(hard_fraction=hard_fraction)
    tasks = [env.get_task(i) for i in range(2000)]
    share = sum(t["difficulty"] == "hard" for t in tasks) / len(tasks)
    assert lo <= share <= hi
    for t in tasks:
        a, op, b = operands(t)
        if t["difficulty"] == "easy":
            assert 1 <= a <= 12 and 1 <= b <= 12 and op in "+-*"
        else:
            assert 1_000 <= a < 100_000 and 100 <= b < 10_000 and op in "+-*"
        assert t["answers"] == [str(calculate(t["expression"]))]
        assert t["question"] == f"What is {t['expression']}?"


def test_tasks_deterministic_per_split_and_index():
    a, b = ArithmeticEnv(), ArithmeticEnv()
    b.reset(seed=123)  # resets and seeds do not change the task stream
    assert [a.get_task(i) for i in range(50)] == [b.get_task(i) for i in range(50)]
    assert ArithmeticEnv(split="test").get_task(7) == ArithmeticEnv(split="test").get_task(7)


def test_train_and_test_differ():
    train, test = ArithmeticEnv(split="train"), ArithmeticEnv(split="test")
    differ = sum(train.get_task(i)["expression"] != test.get_task(i)["expression"] for i in range(100))
    assert differ >= 90
    # every question, easy ones included, is in one split only (a hash of its text); 150 test tasks at
    # hard_fraction 0.5 ask for ~75 of the ~80 easy questions the test split holds
    train_set = {train.get_task(i)["expression"] for i in range(300)}
    test_set = {test.get_task(i)["expression"] for i in range(150)}
    assert not train_set & test_set
    with pytest.raises(ValueError, match="split 'test' holds only .* distinct questions of kind 'easy'"):
        ArithmeticEnv(split="test", hard_fraction=0.0).get_task(100)


def test_seed_picks_the_task():
    env = gym.make(ID)
    q = {s: env.reset(seed=s)[0][1]["content"] for s in range(20)}
    assert len(set(q.values())) >= 15
    assert env.reset(seed=3)[0][1]["content"] == q[3]


def test_first_observation_and_metadata():
    env = gym.make(ID)
    obs, info = env.reset(options={"task_index": 0})
    task = env.unwrapped.get_task(0)
    assert obs == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task["question"]}]
    assert info == {"task_index": 0, "turn": 0, "privileged": {"task": task}}
    assert env.unwrapped.stop_strings == ("</tool_call>", "</answer>")
    assert [s["function"]["name"] for s in env.unwrapped.tool_specs()] == ["calculator"]


def test_constructor_validation():
    with pytest.raises(ValueError):
        ArithmeticEnv(split="dev")
    with pytest.raises(ValueError):
        ArithmeticEnv(hard_fraction=1.5)
    with pytest.raises(ValueError):
        ArithmeticEnv(max_turns=0)


# --------------------------------------------------------------------------- numeric_equal
@pytest.mark.parametrize("pred, gold, equal", [
    ("-5", "5", False), ("5", "-5", False), ("-5", "-5", True), (" -5 ", "-5", True),
    ("1,234", "1234", True), ("1 234", "1234", True), ("42.", "42", True), ("42.0", "42", True),
    ("3/4", "0.75", True), ("0.1", "1/10", True), ("1e3", "1000", True),
    ("41", "42", False), ("forty-two", "42", False), ("", "0", False), (None, "0", False), ("1/0", "0", False),
])
def test_numeric_equal(pred, gold, equal):
    assert numeric_equal(pred, gold) is equal


# --------------------------------------------------------------------------- episodes
def test_scripted_correct_episode_with_calculator():
    env = gym.make(ID)
    base = env.unwrapped
    i = find_task(base, lambda t: t["difficulty"] == "hard")
    obs, info = env.reset(options={"task_index": i})
    task = info["privileged"]["task"]
    gold = task["answers"][0]

    obs, reward, terminated, truncated, info = env.step("Let me compute. " + call(task["expression"]))
    assert obs == [{"role": "tool", "name": "calculator", "content": gold}]
    assert (terminated, truncated, info["action_type"]) == (False, False, "tool_call")
    assert (info["tool"], info["tool_ok"]) == ("calculator", True)
    assert info["reward_terms"] == {**TERMS0, "tool_cost": -0.05}
    assert reward == pytest.approx(-0.05)

    obs, reward, terminated, truncated, info = env.step(f"<answer>{gold}</answer>")
    assert obs == []
    assert (terminated, truncated, info["action_type"], info["answer"]) == (True, False, "answer", gold)
    assert info["reward_terms"] == {**TERMS0, "correct": 1.0, "format": pytest.approx(0.1)}
    assert reward == pytest.approx(1.1)
    s = info["episode_summary"]
    assert s["success"] is True and s["tool_calls"] == 1 and s["turns"] == 2 and s["invalid_actions"] == 0
    assert s["return"] == pytest.approx(1.0 + 0.1 - 0.05)
    assert s["reward_terms"] == pytest.approx({"correct": 1.0, "format": 0.1, "tool_cost": -0.05, "invalid": 0.0})
    assert s["difficulty"] == "hard" and s["task_index"] == i
    assert s["action_counts"] == {"tool_call": 1, "answer": 1}


def test_direct_correct_answer_has_no_tool_cost():
    env = gym.make(ID)
    obs, info = env.reset(seed=0)
    gold = info["privileged"]["task"]["answers"][0]
    *_, reward, terminated, truncated, info = env.step(f"Easy. <answer> {gold} </answer>")
    assert terminated and reward == pytest.approx(1.1)
    assert info["episode_summary"]["tool_calls"] == 0


def test_wrong_answer_earns_no_correct_term():
    env = gym.make(ID)
    obs, info = env.reset(seed=0)
    gold = int(info["privileged"]["task"]["answers"][0])
    *_, reward, terminated, truncated, info = env.step(f"<answer>{gold + 1}</answer>")
    assert terminated and not truncated
    assert info["reward_terms"] == {**TERMS0, "format": pytest.approx(0.1)}
    assert reward == pytest.approx(0.1)
    assert info["episode_summary"]["success"] is False


def test_non_numeric_answer_earns_nothing():
    env = gym.make(ID)
    env.reset(seed=0)
    *_, reward, terminated, truncated, info = env.step("<answer>I don't know</answer>")
    assert terminated and reward == 0.0 and info["reward_terms"] == TERMS0


def test_negative_answers_compare_with_sign():
    env = gym.make(ID)
    i = find_task(env.unwrapped, lambda t: t["answers"][0].startswith("-"))
    obs, info = env.reset(options={"task_index": i})
    gold = info["privileged"]["task"]["answers"][0]
    *_, info = env.step(f"<answer>{gold[1:]}</answer>")   # the sign dropped
    assert info["reward_terms"]["correct"] == 0.0 and not info["episode_summary"]["success"]
    env.reset(options={"task_index": i})
    *_, info = env.step(f"<answer>{gold}</answer>")
    assert info["reward_terms"]["correct"] == 1.0 and info["episode_summary"]["success"]


def test_answer_with_thousands_separator_is_correct():
    env = gym.make(ID)
    i = find_task(env.unwrapped, lambda t: abs(int(t["answers"][0])) >= 10_000)
    obs, info = env.reset(options={"task_index": i})
    gold = int(info["privileged"]["task"]["answers"][0])
    *_, info = env.step(f"<answer>{gold:,}</answer>")
    assert info["reward_terms"]["correct"] == 1.0


@pytest.mark.parametrize("action, message", [
    ("I think it is 12", "Invalid action: no <tool_call> or <answer> found."),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}',
     "Invalid action: <tool_call> is opened but never closed with </tool_call>."),
    ("<tool_call>{bad json</tool_call>", "Invalid tool call: invalid JSON in <tool_call>: Expecting property name"),
    ("<tool_call></tool_call>", "Invalid tool call: empty <tool_call>"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'Invalid tool call: a tool call needs a string "name"'),
    ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>',
     "Invalid tool call: \"arguments\" of 'calculator' must be a JSON object, got list"),
    ("<answer>5", "Invalid action: no <tool_call> or <answer> found."),
])
def test_invalid_actions_get_an_observation_and_the_penalty(action, message):
    env = gym.make(ID)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["action_type"] == "invalid"
    assert (terminated, truncated) == (False, False)
    assert len(obs) == 1 and obs[0]["role"] == "user"
    assert obs[0]["content"].startswith(message)
    assert info["error"] == obs[0]["content"]
    assert info["reward_terms"] == {**TERMS0, "invalid": -0.1}
    assert reward == pytest.approx(-0.1)


def test_tool_errors_are_tool_observations():
    env = gym.make(ID)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("2 + 2", name="search"))
    assert info["action_type"] == "tool_call" and not terminated
    assert obs == [{"role": "tool", "name": "search",
                    "content": "Error: unknown tool 'search'. Available tools: calculator."}]
    assert (info["tool"], info["tool_ok"]) == ("search", False)
    assert info["reward_terms"] == {**TERMS0, "tool_cost": -0.05}

    obs, *_, info = env.step(call("__import__('os')"))
    assert obs[0]["role"] == "tool" and info["tool_ok"] is False
    assert obs[0]["content"].startswith("Error: calculator failed: ValueError: unsupported element")

    obs, *_, info = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": 5}}</tool_call>')
    assert obs[0]["content"].startswith("Error: invalid arguments for calculator: expression: 5 is not of type 'string'")


def test_first_tag_decides_between_tool_call_and_answer():
    env = gym.make(ID)
    obs, info = env.reset(seed=0)
    gold = info["privileged"]["task"]["answers"][0]
    *_, terminated, truncated, info = env.step(call("1 + 1") + f"<answer>{gold}</answer>")
    assert info["action_type"] == "tool_call" and not terminated
    *_, terminated, truncated, info = env.step(f"<answer>{gold}</answer>" + call("1 + 1"))
    assert info["action_type"] == "answer" and terminated
    # only the first of several tool calls runs
    env.reset(seed=0)
    obs, *_ = env.step(call("1 + 1") + call("2 + 2"))
    assert obs == [{"role": "tool", "name": "calculator", "content": "2"}]


def test_turn_limit_truncates_with_summary():
    env = gym.make(ID, max_turns=2)
    env.reset(seed=0)
    _, r1, term, trunc, info = env.step(call("1 + 1"))
    assert (term, trunc) == (False, False)
    _, r2, term, trunc, info = env.step(call("1 + 2"))
    assert (term, trunc) == (False, True)
    s = info["episode_summary"]
    assert s["truncated"] and not s["terminated"] and not s["success"]
    assert s["return"] == pytest.approx(-0.1) and s["tool_calls"] == 2


def test_reward_weights_via_env_kwargs():
    env = gym.make(ID, reward={"tool_cost": 0.2})
    assert env.unwrapped.reward.weights == {"correct": 1.0, "format": 0.1, "tool_cost": 0.2, "invalid": 0.1}
    env.reset(seed=0)
    _, reward, *_, info = env.step(call("3 * 3"))
    assert info["reward_terms"]["tool_cost"] == pytest.approx(-0.2) and reward == pytest.approx(-0.2)
    assert agentgym.make("Arithmetic-v0", tool_cost=0.3).unwrapped.reward.weights["tool_cost"] == 0.3
    with pytest.raises(ValueError, match="unknown reward terms"):
        gym.make(ID, reward={"no_such_term": 1.0})


def test_custom_reward_object():
    env = gym.make(ID, reward=Reward([ExactMatch()]))
    obs, info = env.reset(seed=0)
    gold = info["privileged"]["task"]["answers"][0]
    _, reward, *_, info = env.step(call("1+1"))
    assert info["reward_terms"] == {"exact_match": 0.0} and reward == 0.0
    _, reward, *_, info = env.step(f"<answer>{gold}</answer>")
    assert info["reward_terms"] == {"exact_match": 1.0} and reward == 1.0


def test_history_in_render():
    env = gym.make(ID, render_mode="ansi")
    env.reset(options={"task_index": 0})
    env.step(call("6 * 7"))
    text = env.render()
    assert re.search(r"\[tool\]\n42\n$", text)
    assert text.startswith("[system]\n" + SYSTEM_PROMPT)
