"""BFCL-v0 (envs/bfcl/): the bfcl-eval package's real data, BFCL's own checkers, the oracle, hostile actions.

Every verdict here comes from BFCL's code (its AST checker, its multi-turn checker and API classes); the
oracle replays the ground truth through ``env.step`` exactly as a policy would.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

import agentgym
from agentgym.app.checking import MALFORMED_ACTIONS, check_invalid_step
from agentgym.envs.bfcl import CATEGORIES, BFCLEnv, load_tasks
from agentgym.envs.bfcl.env import ADDED_FUNCTIONS_PROMPT
from agentgym.envs.bfcl.scoring import ast_checker_module, score_single_turn
from agentgym.parsing import ToolCall


def call(fn: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": fn, "arguments": arguments}) + "</tool_call>"


def play(env, index: int, policy=BFCLEnv.oracle) -> dict:
    """One episode through env.step; returns the final info."""
    obs, info = env.reset(options={"task_index": index})
    task, messages = info["privileged"]["task"], list(obs)
    while True:
        action = policy({"task": task, "messages": messages})
        obs, reward, terminated, truncated, info = env.step(action)
        messages += [{"role": "assistant", "content": action}, *obs]
        if terminated or truncated:
            info["return"] = info["episode_summary"]["return"]
            return info


# --------------------------------------------------------------------------- configuration
def test_default_env_is_simple_python_test_split():
    env = agentgym.make("BFCL-v0")
    base = env.unwrapped
    assert (base.category, base.split, base.num_tasks) == ("simple_python", "test", 400)
    obs, info = env.reset(seed=0)
    assert obs[0]["role"] == "system" and "<tool_call>" in obs[0]["content"] and obs[-1]["role"] == "user"
    assert info["privileged"]["task"]["id"].startswith("simple_python_")
    assert "ground_truth" not in json.dumps(obs)


def test_bad_config_names_the_valid_choices():
    with pytest.raises(ValueError, match="simple_python.*multi_turn_base"):
        agentgym.make("BFCL-v0", category="simple_pyhton")
    with pytest.raises(ValueError, match="internet"):
        agentgym.make("BFCL-v0", category="web_search_base")
    with pytest.raises(ValueError, match="'test'"):
        agentgym.make("BFCL-v0", split="train")


def test_every_offered_category_loads_in_package_order():
    sizes = {c: len(load_tasks(c)) for c in CATEGORIES}
    assert sizes["simple_python"] == 400 and sizes["multiple"] == 200 and sizes["parallel"] == 200
    assert sizes["multi_turn_base"] == 200 and sizes["irrelevance"] == 240
    assert [t["id"] for t in load_tasks("multiple")[:3]] == ["multiple_0", "multiple_1", "multiple_2"]


# --------------------------------------------------------------------------- the oracle
#: tasks no call can solve: BFCL's possible answer requires a parameter with no accepted value, or one the
#: function's doc does not declare (the checker rejects undeclared parameters)
UNSOLVABLE = {"live_simple": {"live_simple_106-63-0", "live_simple_112-68-0"},
              "live_multiple": {"live_multiple_507-149-4", "live_multiple_862-181-3", "live_multiple_964-207-0"}}


@pytest.mark.parametrize("category", ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance",
                                      "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
                                      "live_irrelevance", "live_relevance"])
def test_oracle_solves_every_single_turn_task(category):
    env = BFCLEnv(category=category)
    failed = set()
    for i in range(env.num_tasks):
        info = play(env, i)
        assert info["episode_summary"]["turns"] == 1
        if info["success"]:
            assert info["return"] == pytest.approx(1.0)
        else:
            failed.add(info["episode_summary"]["bfcl_id"])
    assert failed == UNSOLVABLE.get(category, set())


def test_oracle_solves_every_multi_turn_base_task():
    env = BFCLEnv(category="multi_turn_base")
    for i in range(env.num_tasks):
        info = play(env, i)
        assert info["success"] and info["return"] == pytest.approx(1.0), (i, info["privileged"]["verdict"])
        assert info["episode_summary"]["user_turns_done"] == len(env.task["question"])


@pytest.mark.parametrize("category", ["multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"])
def test_oracle_solves_other_multi_turn_categories(category):
    env = BFCLEnv(category=category)
    for i in range(0, env.num_tasks, 10):
        info = play(env, i)
        assert info["success"], (i, info["privileged"]["verdict"])


def test_garbage_policies_score_zero():
    env = BFCLEnv(category="simple_python")
    texts = ["", "I think the answer is 42.", call("nope", x=1), call("calculate_triangle_area", base="ten")]
    wins = sum(play(env, i, lambda ctx, i=i: texts[i % len(texts)])["success"] for i in range(0, 400, 5))
    assert wins == 0
    multi = BFCLEnv(category="multi_turn_base")
    assert not any(play(multi, i, lambda ctx: "ok")["success"] for i in range(10))


# --------------------------------------------------------------------------- BFCL's checker, unchanged
def test_checker_is_bfcl_source():
    module = ast_checker_module()
    assert module.ast_checker.__code__.co_filename.endswith("bfcl_eval/eval_checker/ast_eval/ast_checker.py")
    assert module.MODEL_CONFIG_MAPPING["agentgym-dots"].underscore_to_dot is False


@pytest.mark.parametrize("category", ["simple_python", "multiple", "parallel"])
def test_perturbed_calls_are_rejected_and_bfcl_leniency_is_kept(category):
    """Wrong type, missing required, unknown parameter, wrong name, one call too many: rejected. Strings
    differing only in case and punctuation, and ints for floats, pass (BFCL's rules)."""
    checked = 0
    for task in load_tasks(category)[:60]:
        gold = [ToolCall(c["name"], c["arguments"]) for c in _oracle_calls(task)]
        assert score_single_turn(task, gold)["valid"]
        first = gold[0]
        doc = next(d for d in task["checker_functions"] if d["name"] == first.name)
        for bad in _perturbations(first, doc):
            assert not score_single_turn(task, [bad, *gold[1:]])["valid"], (task["id"], bad)
        assert not score_single_turn(task, gold + [gold[0]])["valid"]
        loud = {k: (v.upper() + "." if isinstance(v, str) else v) for k, v in first.arguments.items()}
        assert score_single_turn(task, [ToolCall(first.name, loud), *gold[1:]])["valid"]
        checked += 1
    assert checked == 60


def _oracle_calls(task):
    from agentgym.envs.bfcl.oracle import single_turn_calls
    return single_turn_calls(task)


def _perturbations(first: ToolCall, doc: dict) -> list[ToolCall]:
    out = [ToolCall(first.name + "_x", first.arguments), ToolCall(first.name, {**first.arguments, "zz_unknown": 1})]
    required = doc["parameters"].get("required", [])
    if required and required[0] in first.arguments:
        out.append(ToolCall(first.name, {k: v for k, v in first.arguments.items() if k != required[0]}))
    for key, value in first.arguments.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(ToolCall(first.name, {**first.arguments, key: [value]}))
            break
    return out


def test_relevance_rule_matches_bfcl_is_empty_output():
    from bfcl_eval.utils import is_empty_output
    task = load_tasks("irrelevance")[0]
    for calls in ([], [ToolCall("f", {})], [ToolCall("f", {"a": 1}), ToolCall("g", {})]):
        decoded = [{c.name: c.arguments} for c in calls]
        assert score_single_turn(task, calls)["valid"] is is_empty_output(decoded)
        assert score_single_turn(load_tasks("live_relevance")[0], calls)["valid"] is not is_empty_output(decoded)


# --------------------------------------------------------------------------- hostile actions
def test_malformed_and_oversized_single_turn_actions_are_observations():
    env = BFCLEnv()
    env.reset(options={"task_index": 0})
    obs, reward, terminated, truncated, info = env.step("<tool_call>{not json</tool_call>")
    assert info["action_type"] == "invalid" and not terminated and check_invalid_step(obs, info) is None
    assert info["reward_terms"]["invalid"] < 0 and "invalid JSON" in obs[0]["content"]
    obs, reward, terminated, truncated, info = env.step(call("calculate_triangle_area", base=10, height=5))
    assert terminated and info["success"]  # one retry after an unparseable reply
    roomy = BFCLEnv(max_action_chars=100_000)
    roomy.reset(options={"task_index": 0})
    obs, *_, info = roomy.step(call("f", x=1) * 1000)
    assert info["action_type"] == "invalid" and "Too many calls" in obs[0]["content"]
    env.reset(options={"task_index": 0})
    *_, info = env.step(call("calculate_triangle_area", base="x" * 10_000, height=[[[[]]]], unit={"a": None}))
    assert info["success"] is False and info["error_type"]
    for action in MALFORMED_ACTIONS:
        env.reset(options={"task_index": 1})
        obs, reward, terminated, truncated, info = env.step(action)
        assert check_invalid_step(obs, info) is None


def test_multi_turn_hostile_calls_never_run_code():
    env = BFCLEnv(category="multi_turn_base")
    env.reset(options={"task_index": 0})
    action = (call("open", file="/tmp/agentgym_bfcl_pwned", mode="w") + call("__import__", name="os")
              + call("cd", **{"folder); import os; (x": 1}) + call("cd", folder=10**30) + call("cd", nope=1)
              + call("cd", folder="document"))
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["action_type"] == "tool_call" and not terminated and len(obs) == 6
    contents = [m["content"] for m in obs]
    assert "no function named 'open'" in contents[0] and "no function named '__import__'" in contents[1]
    assert "plain identifiers" in contents[2] and "within" in contents[3]
    assert "unexpected keyword argument" in contents[4] and "Error" not in contents[5]
    import os
    assert not os.path.exists("/tmp/agentgym_bfcl_pwned")
    for action in MALFORMED_ACTIONS:
        obs, reward, terminated, truncated, info = env.step(action)
        assert check_invalid_step(obs, info) is None and env.observation_space.contains(obs)
        if terminated or truncated:
            env.reset(options={"task_index": 0})


def test_a_number_past_pythons_digit_limit_is_an_invalid_action():
    """json.loads raises a plain ValueError (not a JSONDecodeError) for an integer of more than 4300 digits."""
    for category in ("simple_python", "multi_turn_base"):
        env = BFCLEnv(category=category)
        env.reset(options={"task_index": 0})
        huge = "9" * 5000
        as_string = json.dumps({"name": "cd", "arguments": '{"folder": ' + huge + "}"})   # arguments as a JSON string
        for action in ('<tool_call>{"name": "cd", "arguments": {"folder": ' + huge + '}}</tool_call>',
                       f"<tool_call>{as_string}</tool_call>"):
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["action_type"] == "invalid" and not terminated, (category, obs)
            assert "4300 digits" in obs[0]["content"] and check_invalid_step(obs, info) is None
        env.close()


@pytest.mark.parametrize("depth", [150, 500, 900])
def test_deeply_nested_multi_turn_arguments_are_a_tool_error(depth):
    """Nesting that json accepts (under ~1000 levels) but Python's parser (200) and a recursive walk do not."""
    env = BFCLEnv(category="multi_turn_base")
    env.reset(options={"task_index": 0})
    nested = "[" * depth + "]" * depth
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name": "cd", "arguments": {"folder": ' + nested + '}}</tool_call>')
    assert info["action_type"] == "tool_call" and not terminated
    assert obs == [{"role": "tool", "name": "cd",
                    "content": "Error: the arguments of 'cd' are nested too deeply (at most 100 levels)."}]
    obs, *_ = env.step(call("cd", folder="document"))   # the episode goes on
    assert "Error" not in obs[0]["content"]
    env.close()


def test_math_api_arguments_that_would_compute_for_minutes_are_refused():
    env = BFCLEnv(category="multi_turn_base")
    index = next(i for i, t in enumerate(load_tasks("multi_turn_base")) if "MathAPI" in t["involved_classes"])
    env.reset(options={"task_index": index})
    t0 = time.monotonic()
    obs, *_ = env.step(call("power", base=1000000, exponent=1000000) + call("square_root", number=2, precision=10**6)
                       + call("logarithm", value=10, base=2, precision=10**6) + call("power", base=2, exponent=10)
                       + call("square_root", number=2, precision=10))
    assert time.monotonic() - t0 < 10
    contents = [m["content"] for m in obs]
    assert contents[:3] == ["Error: exponent of 'power' must lie within ±1000, got 1000000.",
                            "Error: precision of 'square_root' must lie within ±1000, got 1000000.",
                            "Error: precision of 'logarithm' must lie within ±1000, got 1000000."]
    assert json.loads(contents[3]) == {"result": 1024} and "1.41421" in contents[4]
    env.close()


def test_wrong_types_and_values_of_the_settings_are_one_line_errors():
    import gymnasium as gym
    for bad, message in (({"max_steps_per_turn": "x"}, "max_steps_per_turn must be int, got 'x'"),
                         ({"tools_in_prompt": "no"}, "tools_in_prompt must be bool, got 'no'"),
                         ({"max_action_chars": -5}, "max_action_chars must be >= 1, got -5")):
        for make in (lambda: BFCLEnv(**bad), lambda: gym.make("agentgym/BFCL-v0", **bad),
                     lambda: agentgym.make("BFCL-v0", **bad)):
            with pytest.raises((TypeError, ValueError), match=re.escape(message)):
                make()


# --------------------------------------------------------------------------- multi-turn flow
def test_user_turns_follow_call_free_replies():
    env = BFCLEnv(category="multi_turn_base")
    obs, info = env.reset(options={"task_index": 0})
    task = info["privileged"]["task"]
    assert obs[-1] == task["question"][0][-1]
    obs, *_, info = env.step(call("cd", folder="document"))
    assert obs[0]["role"] == "tool" and obs[0]["name"] == "cd"
    obs, reward, terminated, *_, info = env.step("Done.")
    assert not terminated and info["action_type"] == "reply" and obs == task["question"][1]


def test_miss_func_functions_come_back_at_their_turn():
    env = BFCLEnv(category="multi_turn_miss_func")
    obs, info = env.reset(options={"task_index": 0})
    task = info["privileged"]["task"]
    turn = int(next(iter(task["missed_function"])))
    names = {d["name"] for d in task["missed_function"][str(turn)]}
    assert not names & {s["function"]["name"] for s in env.tool_specs()}
    messages = list(obs)
    for _ in range(200):
        action = BFCLEnv.oracle({"task": task, "messages": messages})
        obs, *_ = env.step(action)
        messages += [{"role": "assistant", "content": action}, *obs]
        if any(ADDED_FUNCTIONS_PROMPT in m["content"] for m in obs):
            break
    assert names <= {s["function"]["name"] for s in env.tool_specs()}


def test_step_limit_per_turn_force_quits_and_fails():
    env = BFCLEnv(category="multi_turn_base", max_steps_per_turn=3)
    env.reset(options={"task_index": 0})
    for _ in range(3):
        assert not env.step(call("pwd"))[2]
    obs, reward, terminated, truncated, info = env.step(call("pwd"))
    assert terminated and not info["success"] and info["error_type"] == "multi_turn:force_terminated"


def test_api_instances_are_released():
    """BFCL's executor caches instances in its module globals: finished, reset, closed or dropped episodes
    leave none behind."""
    import gc
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    def cached():
        return {k for k in vars(multi_turn_utils) if k.startswith("agentgym_bfcl_")}
    before = cached()
    env = BFCLEnv(category="multi_turn_base")
    for i in range(3):
        play(env, i)
    assert cached() == before
    env.reset(options={"task_index": 0})
    assert len(cached() - before) == len(env.task["involved_classes"])
    env.reset(options={"task_index": 1})
    env.close()
    assert cached() == before
    env = BFCLEnv(category="multi_turn_base")
    env.reset(options={"task_index": 0})
    del env
    gc.collect()
    assert cached() == before
