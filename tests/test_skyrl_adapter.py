"""agentgym envs as SkyRL-gym environments: made through skyrl-gym's own registry (``skyrl_gym.make``, with
the ``env_config`` / ``extras`` SkyRL-train's generator passes) and stepped through its ``BaseTextEnv``
interface (``init`` then ``step`` until ``done``), as SkyRL-train does."""

from __future__ import annotations

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed (the protocols extra: scripts/setup.sh installs it)")

from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from agentgym.adapters.skyrl import SkyRLEnv, dataset_row, register_skyrl  # noqa: E402

#: only the correctness term, so a right answer is worth exactly 1 and a wrong one 0
CORRECT_ONLY = {"correct": 1.0, "format": 0.0, "tool_cost": 0.0, "invalid": 0.0}


@pytest.fixture(scope="module")
def arithmetic() -> str:
    return register_skyrl("Arithmetic-v0", reward=CORRECT_ONLY)


def _play(env: BaseTextEnv, actions: list[str]) -> list[dict]:
    outputs = []
    for action in actions:
        out = env.step(action)
        outputs.append(out)
        if out["done"]:
            break
    return outputs


def _make(env_class: str, **extras) -> BaseTextEnv:
    """As SkyRL-train's generator makes one: the row's extras plus its ``max_turns``."""
    return skyrl_gym.make(env_class, env_config={}, extras={"max_turns": 4, **extras})


def test_registered_under_our_id_and_made_by_skyrl_gym(arithmetic):
    assert arithmetic == "agentgym/Arithmetic-v0" and arithmetic in skyrl_gym.registry
    env = _make(arithmetic, extra_info={"task_index": 3})
    assert isinstance(env, BaseTextEnv) and isinstance(env, SkyRLEnv)
    prompt, metadata = env.init([{"role": "user", "content": "the dataset's prompt"}])
    assert prompt[-1] == {"role": "user", "content": "What is 7 - 10?"} and metadata["task_index"] == 3
    env.close()


def test_the_right_answer_gets_reward_1_and_a_wrong_one_0(arithmetic):
    rewards = {}
    for answer in ("-3", "3"):
        env = _make(arithmetic, extra_info={"task_index": 3})
        env.init([])
        (out,) = _play(env, [f"<answer>{answer}</answer>"])
        assert out["done"] and out["observations"] == []
        rewards[answer] = out["reward"]
        assert env.get_metrics()["success"] == float(answer == "-3")
        env.close()
    assert rewards == {"-3": 1.0, "3": 0.0}


def test_a_multi_turn_episode_passes_observations_back_as_chat_messages(arithmetic):
    env = _make(arithmetic, extra_info={"task_index": 3})
    env.init([])
    outs = _play(env, ["I think it is minus three.",
                       '<tool_call>{"name": "calculator", "arguments": {"expression": "7 - 10"}}</tool_call>',
                       "<answer>-3</answer>"])
    assert [o["done"] for o in outs] == [False, False, True]
    invalid, tool, final = outs
    assert invalid["observations"][0]["role"] == "user" and "Invalid action" in invalid["observations"][0]["content"]
    assert tool["observations"] == [{"role": "tool", "name": "calculator", "content": "-3"}]
    assert invalid["metadata"]["action_type"] == "invalid" and tool["metadata"]["action_type"] == "tool_call"
    assert final["reward"] == 1.0 and final["metadata"]["episode_summary"]["turns"] == 3
    assert env.get_metrics()["tool_calls"] == 1.0 and env.get_metrics()["turns"] == 3.0
    env.close()


def test_default_rewards_pass_through_unchanged():
    """Without reweighting, SkyRL gets exactly the env's step rewards (format term and tool cost included)."""
    name = register_skyrl("Arithmetic-v0", skyrl_id="agentgym-arithmetic-default")
    env = _make(name, task_index=3)
    env.init([])
    outs = _play(env, ['<tool_call>{"name": "calculator", "arguments": {"expression": "7 - 10"}}</tool_call>',
                       "<answer>-3</answer>"])
    assert [o["reward"] for o in outs] == pytest.approx([-0.05, 1.1])
    assert outs[-1]["metadata"]["reward_terms"] == pytest.approx({"correct": 1.0, "format": 0.1, "tool_cost": 0.0,
                                                                  "invalid": 0.0})
    env.close()


def test_env_config_and_seed_choose_the_env_and_its_task(arithmetic):
    a = _make(arithmetic, extra_info={"seed": 7})
    b = skyrl_gym.make(arithmetic, env_config={"split": "test"}, extras={"extra_info": {"seed": 7}})
    (pa, _), (pb, _) = a.init([]), b.init([])
    again = _make(arithmetic, extra_info={"seed": 7})
    assert again.init([])[0] == pa  # the seed fixes the task
    assert b.env.unwrapped.split == "test" and pb != pa
    for env in (a, b, again):
        env.close()


def test_the_episode_ends_when_the_env_truncates(arithmetic):
    name = register_skyrl("Arithmetic-v0", skyrl_id="agentgym-arithmetic-two-turns", max_turns=2)
    env = _make(name, task_index=3)
    env.init([])
    outs = _play(env, ["no idea", "still no idea", "never played"])
    assert [o["done"] for o in outs] == [False, True] and outs[-1]["metadata"]["truncated"]
    env.close()


def test_dataset_row_holds_the_envs_own_prompt(arithmetic):
    row = dataset_row("Arithmetic-v0", 3)
    assert row["env_class"] == "agentgym/Arithmetic-v0" and row["extra_info"] == {"task_index": 3}
    env = _make(row["env_class"], **{k: v for k, v in row.items() if k not in ("prompt", "env_class")})
    assert env.init(row["prompt"])[0] == row["prompt"]
    env.close()


def test_bad_env_arguments_fail_at_registration():
    with pytest.raises(TypeError, match="max_turn"):
        register_skyrl("Arithmetic-v0", skyrl_id="agentgym-arithmetic-typo", max_turn=3)
