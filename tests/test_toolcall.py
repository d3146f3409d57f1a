"""ToolCall-v0 specifics (envs/toolcall/): tasks, the SQLite backend, every reward term, the oracle.

The env is registered here the way a user registers theirs (guarded, so a built-in registration wins);
run this module before ``tests/test_envs_registry.py`` on one command line and the registry-wide
contract tests cover ToolCall-v0 as well.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
from typing import Any, Callable, Mapping

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym
from agentgym.app.checking import check_invalid_step, fuzz_env, run_check_env
from agentgym.envs.toolcall import (FAMILIES, TOOL_NAMES, TOOL_SCHEMAS, TRANSIENT_MARKER, ToolCallEnv, answer_numbers,
                                    answer_ok, tool_f1)

ENV_ID = "agentgym/ToolCall-v0"
if ENV_ID not in agentgym.list_envs():
    agentgym.register("ToolCall-v0", entry_point="agentgym.envs.toolcall:ToolCallEnv")

WEIGHTS = {"task_completion": 0.4, "tool_accuracy": 0.25, "efficiency": 0.15, "timing": 0.10, "format": 0.10,
           "wrong_tool": 0.3, "redundant_call": 0.2, "format_error": 0.1, "timeout": 0.5}
METRICS = ("tool_selection_accuracy", "argument_accuracy", "plan_success", "step_efficiency", "end_to_end_success")


# --------------------------------------------------------------------------- helpers
def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def answer(text: str) -> str:
    return f"<answer>{text}</answer>"


def find_task(env: ToolCallEnv, predicate: Callable[[dict], bool], limit: int = 3000) -> int:
    return next(i for i in range(limit) if predicate(env.get_task(i)))


def family(name: str, transient: bool | None = False, extra: Callable[[dict], bool] = lambda t: True):
    """Predicate: a task of ``name`` with (True) / without (False) / either (None) an injected failure."""
    return lambda t: (t["family"] == name and (transient is None or (t["transient_tool"] is not None) == transient)
                      and extra(t))


def steps(env: ToolCallEnv, actions: list[str]) -> list[tuple]:
    out = []
    for a in actions:
        out.append(env.step(a))
        if out[-1][2] or out[-1][3]:
            break
    return out


def oracle_episode(env: ToolCallEnv, options: Mapping[str, Any]) -> tuple[float, dict, list[tuple]]:
    obs, info = env.reset(options=dict(options))
    task = info["privileged"]["task"]
    record = []
    while True:
        action = ToolCallEnv.oracle({"turn": env.turn, "messages": list(env.messages), "task": task})
        record.append(env.step(action))
        if record[-1][2] or record[-1][3]:
            return sum(r[1] for r in record), record[-1][4], record


def plan_call(task: dict, k: int) -> str:
    step = task["plan"][k]
    return call(step["name"], **step["arguments"])


def order_id_from(obs: list[dict]) -> int:
    return json.loads(obs[0]["content"])["order_id"]


@pytest.fixture(scope="module")
def env() -> ToolCallEnv:
    e = ToolCallEnv()
    yield e
    e.close()


@pytest.fixture(scope="module")
def clean_env() -> ToolCallEnv:
    """No injected transient failures: scripted episodes control exactly which calls fail."""
    e = ToolCallEnv(transient_rate=0.0)
    yield e
    e.close()


# --------------------------------------------------------------------------- tasks
def test_tasks_are_deterministic_json_and_splits_differ():
    a, b = ToolCallEnv(), ToolCallEnv()
    b.reset(seed=5)
    tasks = [a.get_task(i) for i in range(60)]
    assert tasks == [b.get_task(i) for i in range(60)]
    assert json.loads(json.dumps(tasks)) == tasks  # plain JSON: loggable, replayable via options={"task": ...}
    test = ToolCallEnv(split="test")
    assert sum(t["request"] != test.get_task(i)["request"] for i, t in enumerate(tasks)) >= 55
    assert {t["db_seed"] for t in tasks}.isdisjoint(test.get_task(i)["db_seed"] for i in range(60))


def test_generator_covers_every_family_with_consistent_targets(env):
    tasks = [env.get_task(i) for i in range(400)]
    counts = {f: sum(t["family"] == f for t in tasks) for f in FAMILIES}
    assert all(n >= 15 for n in counts.values()), counts
    tool_tasks = [t for t in tasks if t["plan"]]
    injected = sum(t["transient_tool"] is not None for t in tool_tasks) / len(tool_tasks)
    assert 0.12 <= injected <= 0.28
    for t in tasks:
        assert t["target_tools"] == sorted({s["name"] for s in t["plan"]})
        assert t["optimal_steps"] == len(t["plan"]) + 1 + (t["transient_tool"] is not None)
        assert t["transient_tool"] is None or t["transient_tool"] in t["target_tools"]
        assert set(t["target_tools"]) <= set(TOOL_NAMES)
        if t["family"] == "no_tool":
            assert t["plan"] == [] and t["optimal_steps"] == 1 and t["transient_tool"] is None
    # multi-tool chains, out-of-stock and plans of up to four calls all occur
    assert max(len(t["plan"]) for t in tasks) == 4
    assert any(t["family"] == "availability" and t["answer_check"]["kind"] == "number" for t in tasks)


def test_constructor_options():
    only = ToolCallEnv(families=["no_tool", "place_order"], transient_rate=0.0)
    tasks = [only.get_task(i) for i in range(100)]
    assert {t["family"] for t in tasks} == {"no_tool", "place_order"}
    assert all(t["transient_tool"] is None for t in tasks)
    always = ToolCallEnv(families=["stock_check"], transient_rate=1.0)
    assert all(always.get_task(i)["transient_tool"] in ("search_product", "check_inventory") for i in range(30))
    for bad in ({"split": "dev"}, {"families": ["nope"]}, {"families": []}, {"transient_rate": 1.5}):
        with pytest.raises(ValueError):
            ToolCallEnv(**bad)


def test_reset_with_a_task_missing_keys_raises(env):
    with pytest.raises(ValueError, match="db_seed"):
        env.reset(options={"task": {"request": "hi"}})


# --------------------------------------------------------------------------- the oracle
@pytest.mark.parametrize("split", ["train", "test"])
def test_oracle_solves_every_task_via_env_step(split):
    env = ToolCallEnv(split=split)
    seen = set()
    for i in range(200):
        total, info, record = oracle_episode(env, {"task_index": i})
        s = info["episode_summary"]
        seen.add(s["family"])
        assert s["success"] and s["terminated"] and not s["truncated"], (i, env.messages[-3:])
        assert total == pytest.approx(1.0, abs=1e-9), (i, s["reward_terms"])
        assert s["turns"] == env.task["optimal_steps"]
        assert all(s[m] == 1 for m in METRICS), s
        assert s["transient_recovered"] == s["transient_injected"]
    assert seen == set(FAMILIES)
    env.close()


@pytest.fixture(scope="module")
def tok():
    """The real SmolLM2 tokenizer (``load_tokenizer()``), loaded once per test session."""
    from fixtures_llm import cached_tokenizer
    return cached_tokenizer()


def test_oracle_solves_every_task_through_the_rollout_engine(tok):
    from agentgym.policies.scripted import ScriptedPolicy
    from agentgym.rollout_config import RolloutConfig
    from agentgym.rollout import RolloutEngine
    engine = RolloutEngine(ScriptedPolicy(tok, ToolCallEnv.oracle), RolloutConfig(debug_checks=True))
    try:
        for split in ("train", "test"):
            batch = engine.collect("ToolCall-v0", task_indices=list(range(100)), env_kwargs={"split": split})
            assert batch.metrics["success_rate"] == 1.0, [t.episode for t in batch.trajectories if not t.episode["success"]][:2]
            assert batch.metrics["reward_mean"] == pytest.approx(1.0)
            assert batch.metrics["truncated_rate"] == 0.0
            injected = [t for t in batch.trajectories if t.episode["transient_injected"]]
            assert injected and all(t.episode["transient_recovered"] for t in injected)
            assert all(len(t.token_ids) < 2048 for t in batch.trajectories)  # the prompt and results stay compact
    finally:
        engine.close()


# --------------------------------------------------------------------------- tools, prompt, POMDP
def test_tool_specs_and_system_prompt(env):
    specs = env.tool_specs()
    assert [s["function"]["name"] for s in specs] == list(TOOL_NAMES)
    assert {"search_product", "check_inventory", "create_order", "get_order", "cancel_order", "find_customer",
            "get_customer"} == set(TOOL_NAMES)
    for s in specs:
        assert s["type"] == "function" and s["function"]["description"]
        assert s["function"]["parameters"]["additionalProperties"] is False
    create = next(s for s in specs if s["function"]["name"] == "create_order")["function"]["parameters"]
    assert create["required"] == ["product_id", "quantity", "customer_id"]
    obs, _ = env.reset(seed=0)
    system = obs[0]["content"]
    assert obs[0]["role"] == "system" and obs[1]["role"] == "user"
    for name in TOOL_NAMES:
        assert f"- {name}(" in system  # described for chat templates without tools=
    assert "<tool_call>" in system and "<answer>" in system
    quiet = ToolCallEnv(tools_in_prompt=False)  # for chat templates that render tool_specs() themselves
    bare = quiet.reset(seed=0)[0][0]["content"]
    assert "- search_product(" not in bare and "<tool_call>" in bare and len(bare) < len(system)
    quiet.close()


def test_observations_hide_the_hidden_state(env):
    for i in range(300):
        task = env.get_task(i)
        if task["family"] != "price_lookup":
            continue
        obs, info = env.reset(options={"task_index": i})
        text = json.dumps(obs)
        assert f"{task['answer_check']['value']:.2f}" not in obs[1]["content"]  # the price must be looked up
        assert str(task["plan"][0]["target_id"]) not in text  # so must the product id
        assert "target_tools" not in text and "db_seed" not in text and str(task["db_seed"]) not in text
        assert info["privileged"]["task"] == task


def test_schema_violations_and_unknown_tools_are_tool_error_observations(clean_env):
    env = clean_env
    env.reset(options={"task_index": find_task(env, family("price_lookup"))})
    cases = [
        (call("search_product", query=7), "invalid arguments"),
        (call("search_product", query="kettle", colour="red"), "invalid arguments"),
        (call("search_product", query="kettle", category="garden"), "invalid arguments"),
        (call("create_order", product_id="abc", quantity=1, customer_id=1), "invalid arguments"),
        (call("create_order", product_id=1, quantity=0, customer_id=1), "invalid arguments"),
        (call("refund_everything", amount=100), "unknown tool"),
        (call("get_order", order_id=1), "no order with order_id 1"),
    ]
    for action, expected in cases:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_type"] == "tool_call" and not terminated
        assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error") and expected in obs[0]["content"]
        assert not info["tool_ok"]
    assert env.store.effects()["new_orders"] == []


# --------------------------------------------------------------------------- the database
def test_db_is_fresh_per_episode_and_identical_for_the_same_seed(clean_env):
    env = clean_env
    other = ToolCallEnv(transient_rate=0.0)
    i = find_task(env, family("place_order"))
    env.reset(options={"task_index": i})
    first_conn, initial = env.store.conn, env.store.dump()
    task = env.task
    steps(env, [plan_call(task, 0), plan_call(task, 1), plan_call(task, 2)])
    assert env.store.dump() != initial and len(env.store.effects()["new_orders"]) == 1
    env.reset(options={"task_index": i})
    assert env.store.conn is not first_conn and env.store.dump() == initial
    other.reset(options={"task": task})  # a task replayed elsewhere brings its database with it
    assert other.store.dump() == initial
    other.reset(seed=123)
    env.reset(seed=123)
    assert other.store.dump() == env.store.dump()
    env.reset(seed=124)
    assert env.store.dump() != other.store.dump()
    other.close()


def test_steps_may_run_in_another_thread(clean_env):
    """The rollout engine resets in one thread and steps in a pool: the SQLite connection must allow it."""
    env = clean_env
    i = find_task(env, family("stock_check"))
    env.reset(options={"task_index": i})
    with cf.ThreadPoolExecutor(1) as pool:
        for k in range(2):
            obs, *_, info = pool.submit(env.step, plan_call(env.task, k)).result()
            assert info["tool_ok"], obs


# --------------------------------------------------------------------------- reward terms, one by one
def test_default_weights_are_the_seed_design_and_configurable(env):
    assert env.reward.weights == WEIGHTS
    heavier = agentgym.make(ENV_ID, reward={"wrong_tool": 1.0, "task_completion": 0.0})
    assert heavier.unwrapped.reward.weights == {**WEIGHTS, "wrong_tool": 1.0, "task_completion": 0.0}
    with pytest.raises(ValueError):
        agentgym.make(ENV_ID, reward={"no_such_term": 1.0})


def test_no_tool_task_answered_directly_and_over_called(clean_env):
    env = clean_env
    i = find_task(env, family("no_tool"))
    total, info, _ = oracle_episode(env, {"task_index": i})
    assert total == pytest.approx(1.0)
    assert info["reward_terms"] == pytest.approx({**{k: 0.0 for k in WEIGHTS}, "task_completion": 0.4,
                                                  "tool_accuracy": 0.25, "efficiency": 0.15, "timing": 0.1, "format": 0.1})
    env.reset(options={"task_index": i})
    gold = ToolCallEnv.oracle({"task": env.task, "messages": env.messages})
    (_, r1, _, _, i1), (_, r2, term, _, i2) = steps(env, [call("search_product", query="kettle"), gold])
    assert i1["reward_terms"] == pytest.approx({**{k: 0.0 for k in WEIGHTS}, "wrong_tool": -0.3})
    assert term and i2["episode_summary"]["success"]  # right answer, but the call cost
    assert i2["reward_terms"] == pytest.approx({**{k: 0.0 for k in WEIGHTS}, "task_completion": 0.4, "tool_accuracy": 0.0,
                                                "efficiency": 0.15 / 2, "timing": 0.1 / 2, "format": 0.1})
    assert r1 + r2 == pytest.approx(-0.3 + 0.4 + 0.075 + 0.05 + 0.1)
    s = i2["episode_summary"]
    assert (s["tool_selection_accuracy"], s["plan_success"], s["step_efficiency"]) == (0.0, False, 0.5)


def test_wrong_tool_on_a_tool_task(clean_env):
    env = clean_env
    env.reset(options={"task_index": find_task(env, family("price_lookup"))})
    task = env.task
    out = steps(env, [call("get_order", order_id=1), plan_call(task, 0), answer(task["oracle_answer"])])
    assert out[0][4]["reward_terms"]["wrong_tool"] == pytest.approx(-0.3)
    assert out[1][4]["reward_terms"]["wrong_tool"] == 0.0
    final = out[2][4]
    assert final["episode_summary"]["success"]
    f1 = tool_f1({"get_order", "search_product"}, {"search_product"})
    assert f1 == pytest.approx(2 / 3)
    assert final["reward_terms"]["tool_accuracy"] == pytest.approx(0.25 * f1)
    assert final["reward_terms"]["efficiency"] == pytest.approx(0.15 * 2 / 3)
    assert final["reward_terms"]["timing"] == pytest.approx(0.1)  # each call came while the lookup was outstanding
    assert final["episode_summary"]["tool_selection_accuracy"] == pytest.approx(2 / 3)


def test_redundant_identical_call(clean_env):
    env = clean_env
    env.reset(options={"task_index": find_task(env, family("price_lookup"))})
    task = env.task
    same = plan_call(task, 0)
    reworded = call("search_product", query=task["plan"][0]["arguments"]["query"].lower())
    out = steps(env, [same, same, reworded, answer(task["oracle_answer"])])
    assert [o[4]["reward_terms"]["redundant_call"] for o in out[:3]] == pytest.approx([0.0, -0.2, 0.0])
    assert [o[4]["redundant"] for o in out[:3]] == [False, True, False]
    assert all(o[4]["reward_terms"]["wrong_tool"] == 0.0 for o in out)
    assert out[-1][4]["reward_terms"]["timing"] == pytest.approx(0.1 * 2 / 4)  # the 2nd and 3rd calls came late


def test_format_errors(clean_env):
    env = clean_env
    env.reset(options={"task_index": find_task(env, family("price_lookup"))})
    task = env.task
    invalid = ["I will look that up.", "<tool_call>{\"name\": \"search_product\", \"arguments\": {</tool_call>",
               "<tool_call>", "<answer></answer>", "<answer>  </answer>"]
    for action in invalid:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_type"] == "invalid" and not terminated
        assert info["reward_terms"]["format_error"] == pytest.approx(-0.1) and reward == pytest.approx(-0.1)
        assert obs[0]["role"] == "user" and obs[0]["content"].startswith("Invalid")
        assert check_invalid_step(obs, info) is None
    obs, reward, *_, info = env.step(call("search_product", query=["not", "a", "string"]))  # schema violation
    assert info["action_type"] == "tool_call" and obs[0]["role"] == "tool"
    assert info["reward_terms"]["format_error"] == pytest.approx(-0.1) and info["reward_terms"]["wrong_tool"] == 0.0
    # two calls in one turn: the first runs, the model is told, and the turn is not well-formed
    obs, reward, *_, info = env.step(plan_call(task, 0) + call("get_order", order_id=5))
    assert info["tool_ok"] and len(obs) == 2 and "first tool call" in obs[1]["content"]
    assert info["reward_terms"]["format_error"] == 0.0 and not info["well_formed"]
    *_, info = env.step(answer(task["oracle_answer"]))
    assert info["episode_summary"]["success"]
    assert info["reward_terms"]["format"] == pytest.approx(0.1 * 1 / 8)  # only the answer was well-formed


def test_timeout():
    env = ToolCallEnv(transient_rate=0.0, max_turns=3)
    env.reset(options={"task_index": find_task(env, family("stock_check"))})
    task = env.task
    out = steps(env, [plan_call(task, 0), plan_call(task, 1), call("search_product", query="tent")])
    *_, terminated, truncated, info = out[-1]
    assert truncated and not terminated and len(out) == 3
    assert info["reward_terms"]["timeout"] == pytest.approx(-0.5)
    assert info["reward_terms"]["task_completion"] == 0.0 and info["reward_terms"]["efficiency"] == 0.0
    assert [o[4]["reward_terms"]["timeout"] for o in out[:2]] == [0.0, 0.0]
    s = info["episode_summary"]
    assert s["truncated"] and not s["success"] and not s["end_to_end_success"]
    # stalling on a no-tool task earns no tool-accuracy credit for "calling nothing"
    env.reset(options={"task_index": find_task(env, family("no_tool"))})
    *_, info = steps(env, ["hmm", "hmm", "hmm"])[-1]
    assert info["reward_terms"]["tool_accuracy"] == 0.0 and info["reward_terms"]["timeout"] == pytest.approx(-0.5)
    env.close()


def test_answer_written_around_a_call_is_badly_timed(clean_env):
    env = clean_env
    env.reset(options={"task_index": find_task(env, family("price_lookup"))})
    task = env.task
    *_, terminated, _, info = env.step(answer(task["oracle_answer"]) + plan_call(task, 0))
    assert terminated and info["timely"] is False  # a call written after the answer never runs
    assert info["reward_terms"]["timing"] == 0.0 and info["reward_terms"]["tool_accuracy"] == 0.0
    assert info["reward_terms"]["format"] == 0.0 and info["episode_summary"]["tool_calls"] == 0
    env.reset(options={"task_index": find_task(env, family("price_lookup"))})
    out = steps(env, [plan_call(env.task, 0) + answer("12 EUR"), answer(env.task["oracle_answer"])])
    assert out[0][4]["timely"] is False and not out[0][2]  # the call ran; the early answer was ignored
    assert out[1][4]["reward_terms"]["timing"] == pytest.approx(0.1 / 2)


def test_transient_failure_is_recovered_by_retrying(env):
    i = find_task(env, family("place_order", transient=True, extra=lambda t: t["transient_tool"] == "create_order"))
    env.reset(options={"task_index": i})
    task = env.task
    out = steps(env, [plan_call(task, 0), plan_call(task, 1), plan_call(task, 2)])
    obs, _, _, _, info = out[2]
    assert TRANSIENT_MARKER in obs[0]["content"] and "retry" in obs[0]["content"]
    assert info["transient"] and not info["tool_ok"] and info["tool_error"] == "exception"
    assert env.store.effects()["new_orders"] == []  # the failed call had no effect
    obs, _, _, _, info = env.step(plan_call(task, 2))  # the identical retry is not redundant
    assert info["tool_ok"] and not info["redundant"] and info["reward_terms"]["redundant_call"] == 0.0
    *_, info = env.step(answer(f"Order {order_id_from(obs)} is placed."))
    s = info["episode_summary"]
    assert s["success"] and s["transient_recovered"] and s["turns"] == task["optimal_steps"] == 5
    assert s["return"] == pytest.approx(1.0)
    # giving up after the failure leaves no order: the database check fails
    env.reset(options={"task_index": i})
    *_, info = steps(env, [plan_call(task, 0), plan_call(task, 1), plan_call(task, 2),
                           answer("Sorry, the order system is down.")])[-1]
    assert not info["db_ok"] and not info["episode_summary"]["success"]
    assert info["reward_terms"]["task_completion"] == 0.0


def test_transient_failure_fires_once_on_the_first_valid_call(env):
    i = find_task(env, family("price_lookup", transient=True))
    env.reset(options={"task_index": i})
    bad = env.step(call("search_product", query=3))[4]  # a schema violation does not consume the failure
    assert bad["tool_error"] == "invalid_arguments" and not bad["transient"]
    first = env.step(call("search_product", query="tent"))[4]
    second = env.step(call("search_product", query="tent"))[4]
    assert first["transient"] and not second["transient"] and second["tool_ok"] and not second["redundant"]


def test_out_of_stock_is_handled_by_ordering_elsewhere(clean_env):
    env = clean_env
    env.reset(options={"task_index": find_task(env, family("out_of_stock_fallback"))})
    task = env.task
    pid, q, cid = (task["plan"][3]["arguments"][k] for k in ("product_id", "quantity", "customer_id"))
    preferred = task["request"].split("shipped from our ")[1].split(" store")[0]
    out = steps(env, [plan_call(task, 0), plan_call(task, 1),
                      call("create_order", product_id=pid, quantity=q, customer_id=cid, location=preferred)])
    obs, _, _, _, info = out[-1]
    assert not info["tool_ok"] and "InsufficientStock" in obs[0]["content"] and "only" in obs[0]["content"]
    assert info["reward_terms"]["wrong_tool"] == 0.0 and env.store.effects()["new_orders"] == []
    obs, *_, info = env.step(call("create_order", product_id=pid, quantity=q, customer_id=cid))
    assert info["tool_ok"] and json.loads(obs[0]["content"])["location"] != preferred
    *_, info = env.step(answer(f"Placed order {order_id_from(obs)} from another store."))
    s = info["episode_summary"]
    assert s["success"] and info["reward_terms"]["task_completion"] == pytest.approx(0.4)
    assert info["reward_terms"]["efficiency"] == pytest.approx(0.15)  # 5 turns, as the plan with check_inventory
    assert info["reward_terms"]["tool_accuracy"] == pytest.approx(0.25 * tool_f1(
        {"find_customer", "search_product", "create_order"}, set(task["target_tools"])))
    assert s["plan_success"] is False  # it skipped the inventory check


def test_out_of_stock_report_and_nothing_else_changed(clean_env):
    env = clean_env
    i = find_task(env, family("availability", extra=lambda t: t["answer_check"]["kind"] == "number"))
    total, info, _ = oracle_episode(env, {"task_index": i})
    assert info["episode_summary"]["success"] and total == pytest.approx(1.0)
    wanted = env.task["answer_check"]["value"]
    env.reset(options={"task_index": i})
    *_, info = steps(env, [plan_call(env.task, 0), plan_call(env.task, 1), answer(f"We have {wanted + 1} in total.")])[-1]
    assert info["db_ok"] and not info["answer_ok"] and not info["episode_summary"]["success"]
    # an extra order next to the right one fails the final-state check
    env.reset(options={"task_index": find_task(env, family("place_order"))})
    task = env.task
    args = task["plan"][2]["arguments"]
    extra = next(pid for pid, _, _, _ in env.store.data.products
                 if pid != args["product_id"] and max(env.store.data.stock(pid).values()) >= 1)
    out = steps(env, [plan_call(task, 0), plan_call(task, 1), plan_call(task, 2),
                      call("create_order", product_id=extra, quantity=1, customer_id=args["customer_id"])])
    assert out[-1][4]["tool_ok"]
    *_, info = env.step(answer(f"Order {order_id_from(out[2][0])} is placed."))
    assert not info["db_ok"] and not info["episode_summary"]["success"]


def test_cancelling_the_wrong_order_fails(clean_env):
    env = clean_env
    i = find_task(env, family("cancel_order", extra=lambda t: len(t["plan"]) == 3))
    total, info, _ = oracle_episode(env, {"task_index": i})
    assert info["episode_summary"]["success"] and total == pytest.approx(1.0)
    env.reset(options={"task_index": i})
    task = env.task
    target = task["goal"]["cancelled"][0]
    other = next(o[0] for o in env.store.data.orders if o[5] == "placed" and o[0] != target)
    out = steps(env, [plan_call(task, 0), plan_call(task, 1), call("cancel_order", order_id=other), answer("Cancelled.")])
    assert out[2][4]["tool_ok"] and not out[2][4]["args_ok"]
    s = out[-1][4]["episode_summary"]
    assert not s["success"] and s["argument_accuracy"] == pytest.approx(2 / 3) and not s["plan_success"]
    # a shipped order cannot be cancelled: an error observation, and the database is untouched
    env.reset(options={"task_index": i})
    shipped = next((o[0] for o in env.store.data.orders if o[5] in ("shipped", "delivered")), None)
    if shipped is not None:
        obs, *_, info = env.step(call("cancel_order", order_id=shipped))
        assert not info["tool_ok"] and "can no longer be cancelled" in obs[0]["content"]
        assert env.store.effects()["status_changes"] == {}


def test_wrong_arguments_lower_argument_accuracy(clean_env):
    env = clean_env
    env.reset(options={"task_index": find_task(env, family("place_order"))})
    task = env.task
    args = dict(task["plan"][2]["arguments"], quantity=task["plan"][2]["arguments"]["quantity"] + 1)
    args.pop("location", None)
    out = steps(env, [plan_call(task, 0), call("search_product", query="zzz unknown"), plan_call(task, 1),
                      call("create_order", **args)])
    assert [o[4]["args_ok"] for o in out] == [True, False, True, False]
    *_, info = env.step(answer("done"))
    s = info["episode_summary"]
    assert s["argument_accuracy"] == pytest.approx(2 / 4) and s["tool_selection_accuracy"] == 1.0
    assert not s["plan_success"] and not s["end_to_end_success"] and s["step_efficiency"] == pytest.approx(4 / 5)


def test_answer_checks():
    assert answer_numbers("1,234 units; 24,99 EUR; order #20391. 7.") == [1234, 24.99, 20391, 7]
    status = {"kind": "text", "values": ["shipped"], "exclude": ["placed", "delivered", "cancelled"]}
    assert answer_ok(status, "It has shipped.", {}, {})
    assert not answer_ok(status, "It was placed and has not shipped yet.", {}, {})
    assert answer_ok({"kind": "number", "value": 37.5}, "The total is 37.50 EUR.", {}, {})
    assert not answer_ok({"kind": "number", "value": 37.5}, "The total is 375 EUR.", {}, {})
    assert answer_ok(None, "ok", {}, {}) and not answer_ok(None, " ", {}, {})


# --------------------------------------------------------------------------- conformance
def test_check_env_and_kernel_fuzz():
    check_env(gym.make(ENV_ID).unwrapped)
    assert run_check_env(ENV_ID) is None
    report = fuzz_env(ENV_ID, n=300)
    assert report.ok, report.failures
    assert {"invalid", "tool_call"} <= set(report.action_types)


_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=False),
                               st.text(max_size=12)),
                     lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                     max_leaves=6)
_arg_keys = sorted({k for _, schema in TOOL_SCHEMAS.values() for k in schema["properties"]})
_arguments = st.one_of(st.dictionaries(st.sampled_from(_arg_keys), _json, max_size=4),
                       st.dictionaries(st.sampled_from(_arg_keys), st.integers(1, 100_000), max_size=4),
                       st.fixed_dictionaries({"query": st.text(max_size=20)}))
_tool_actions = st.builds(lambda name, args, tail: call(name, **args) + tail, st.sampled_from(TOOL_NAMES + ("nope",)),
                          _arguments, st.sampled_from(["", "<answer>x</answer>", "<tool_call>", call("get_order", order_id=1)]))


def test_fuzz_tool_calls_with_random_arguments():
    """Random arguments to the real tools: never an exception, always a well-formed, explained step."""
    env = gym.make(ENV_ID)
    env.reset(seed=0)

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.one_of(_tool_actions, st.text(max_size=40)))
    def run(action):
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs) and math.isfinite(reward)
        assert sum(info["reward_terms"].values()) == pytest.approx(reward, abs=1e-9)
        assert check_invalid_step(obs, info) is None
        if info["action_type"] == "tool_call":
            assert obs[0]["role"] == "tool" and obs[0]["content"]
            assert obs[0]["content"].startswith("Error") != info["tool_ok"]
        if terminated or truncated:
            env.reset(seed=int(reward * 1000) % 97)

    run()
    env.close()
