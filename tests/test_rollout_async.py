"""Asynchronous episodes (agentgym/rollout.py, ``RolloutConfig.mode="async"``) against the lockstep
schedule, with real parts: the SmolLM2 tokenizer, scripted policies, the tiny random Llama, envs from
``agentgym.make`` and a small registered env whose tool is slow (it sleeps) on one turn per episode.

* a slow tool holds up only its own episode: async wall time ≈ the longest episode, lockstep ≈ the
  sum over turns of the slowest step (wall times measured, generous margins);
* the same trajectories as lockstep for deterministic policies (scripted; greedy tiny model:
  identical ids, texts and rewards, log-probs equal to float rounding since batches are composed
  differently), GRPO groups, context-limit truncation, ``max_concurrent_episodes``;
* env settings read through wrappers (``get_wrapper_attr``), in both modes;
* the chat-level path, progress callbacks (with and without tokens), config validation.
"""

from __future__ import annotations

import re
import time
from typing import Any, Mapping

import gymnasium
import numpy as np
import pytest

import agentgym
from agentgym import AgentEnv, Reward, Transition, shaper
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.policy import Generation, SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.turns import env_attr

from fixtures_llm import (RecordingPolicy, assert_faithful, one_torch_thread, tiny_policy,  # noqa: F401  (fixtures)
                          tok)

ARITH = "agentgym/Arithmetic-v0"
SLOW = "agentgym/SlowTool-v0"
TURNS = 4


@shaper("correct", terminal=True)
def correct(event) -> float:
    return float(event.answer is not None and event.answer == event.task["answers"][0])


class SlowToolEnv(AgentEnv):
    """``TURNS`` tool calls (``<tick/>``), then ``<answer>INDEX</answer>``. The tool sleeps
    ``delay_s`` on turn ``task_index % TURNS`` of each episode, so the episodes of tasks 0..3 are each
    slow once, on different turns: lockstep pays the delay on every turn, async once."""

    num_tasks = 1000
    stop_strings = ("</answer>",)

    def __init__(self, delay_s: float = 0.3, **kwargs: Any):
        self.delay_s = delay_s
        super().__init__(max_turns=TURNS + 1, **kwargs)

    def default_reward(self) -> Reward:
        return Reward([correct])

    def get_task(self, index: int) -> dict[str, Any]:
        return {"question": f"Tick {TURNS} times, then answer {index}.", "answers": [str(index)],
                "slow_turn": index % TURNS}

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": task["question"]}]

    def transition(self, action: str) -> Transition:
        answer = re.search(r"<answer>(.*?)</answer>", action)
        if answer:
            return Transition([], "answer", terminated=True, answer=answer.group(1))
        if self.turn == self.task["slow_turn"]:
            time.sleep(self.delay_s)
        return Transition([{"role": "tool", "content": f"tick {self.turn + 1}"}], "tool_call")

    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        return "<tick/>" if context["turn"] < TURNS else f"<answer>{context['task']['answers'][0]}</answer>"


@pytest.fixture(scope="module", autouse=True)
def slow_env():
    """Registered for this module only (other modules iterate over every registered env)."""
    agentgym.register("SlowTool-v0", SlowToolEnv)
    yield
    del gymnasium.registry[SLOW]


def collect(policy: Any, env: Any, mode: str, **kwargs: Any):
    config_keys = {"sampling", "style", "max_context_tokens", "max_concurrent_episodes", "batch_wait_s", "debug_checks"}
    cfg = RolloutConfig(mode=mode, **{"debug_checks": True, **{k: v for k, v in kwargs.items() if k in config_keys}})
    engine = RolloutEngine(policy, cfg)
    try:
        t0 = time.perf_counter()
        batch = engine.collect(env, **{k: v for k, v in kwargs.items() if k not in config_keys})
        return batch, time.perf_counter() - t0
    finally:
        engine.close()


def comparable(traj) -> dict[str, Any]:
    """A trajectory as a dict, log-probs apart (compared to float rounding)."""
    return {k: v for k, v in traj.to_dict().items() if k != "logprobs"}


def assert_same_trajectories(a, b, atol: float = 0.0) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert comparable(x) == comparable(y)
        np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=atol)


# --------------------------------------------------------------------------- overlap of slow env steps

def test_slow_tool_holds_up_only_its_own_episode(tok):
    delay = SlowToolEnv().delay_s
    runs = {mode: collect(ScriptedPolicy(tok, SlowToolEnv.oracle), SLOW, mode, task_indices=range(TURNS), seed=0)
            for mode in ("lockstep", "async")}
    (lock, lock_s), (asyn, async_s) = runs["lockstep"], runs["async"]
    assert lock.metrics["success_rate"] == asyn.metrics["success_rate"] == 1.0
    assert_same_trajectories(lock.trajectories, asyn.trajectories)
    # lockstep: every turn waits for that turn's slow step; async: each episode waits once
    assert lock_s >= TURNS * delay
    assert async_s < delay + 0.45, f"async took {async_s:.2f} s; the longest episode sleeps {delay} s"
    assert async_s < 0.6 * lock_s
    # the same work was done: every env call ran, in both modes (summed over the worker threads)
    assert asyn.metrics["time/env_calls_s"] >= TURNS * delay
    assert asyn.metrics["time/env_calls_s"] > asyn.metrics["time/wall_s"]  # env calls overlapped
    assert lock.metrics["rollout/generate_calls"] == TURNS + 1
    assert asyn.metrics["rollout/generate_calls"] > TURNS + 1  # turns of different episodes in different calls


def test_max_concurrent_episodes(tok):
    """At most k episodes run at once (k envs are made, no call is larger than k); async starts the
    next episode when one ends, so 4 one-slow-turn episodes on 2 slots take ≈ 2 delays (lockstep: 4)."""
    made: list[gymnasium.Env] = []

    def make_slow() -> gymnasium.Env:
        made.append(agentgym.make(SLOW))
        return made[-1]

    delay = SlowToolEnv().delay_s
    reference, _ = collect(ScriptedPolicy(tok, SlowToolEnv.oracle), make_slow, "lockstep", task_indices=range(4), seed=3)
    assert len(made) == 4
    for mode in ("lockstep", "async"):
        made.clear()
        policy = RecordingPolicy(ScriptedPolicy(tok, SlowToolEnv.oracle))
        batch, seconds = collect(policy, make_slow, mode, max_concurrent_episodes=2, task_indices=range(4), seed=3)
        assert len(made) == 2 and max(policy.batch_sizes) <= 2
        assert_same_trajectories(batch.trajectories, reference.trajectories)
        if mode == "async":
            assert seconds < 2 * delay + 0.45
        else:  # two waves of lockstep; in each, the two episodes are slow on different turns
            assert seconds >= 4 * delay


# --------------------------------------------------------------------------- same results as lockstep

@pytest.mark.parametrize("env_id, kwargs", [(ARITH, {}), ("agentgym/Math-v0", {"max_turns": 1}), (SLOW, {"delay_s": 0.05})],
                         ids=["arithmetic", "math", "slow-tool"])
def test_greedy_tiny_model_same_as_lockstep(env_id, kwargs, tok):
    """Greedy decoding with a real (random) transformer: identical ids, texts, rewards; log-probs to
    float rounding (an episode may share its batch with other episodes than in lockstep, and a
    padded batch's matmuls round differently)."""
    sampling = SamplingParams(max_new_tokens=12, greedy=True)
    runs = [collect(tiny_policy(), env_id, mode, sampling=sampling, num_groups=3, group_size=2, seed=5,
                    env_kwargs=kwargs)[0] for mode in ("lockstep", "async")]
    assert_same_trajectories(runs[0].trajectories, runs[1].trajectories, atol=1e-4)
    assert all(t.num_turns >= 1 for t in runs[1].trajectories)
    for t in runs[1].trajectories:
        assert_faithful(t, tok, "chat")


def test_seeded_sampling_single_turn_replays_lockstep():
    """Sampling with a seed: the first call of an async collect holds every episode, so on a
    one-turn env async draws exactly the lockstep's samples (multi-turn: see RolloutConfig.mode)."""
    sampling = SamplingParams(max_new_tokens=8, seed=3, temperature=1.0)
    runs = [collect(tiny_policy(), "agentgym/Math-v0", mode, sampling=sampling, num_groups=2, group_size=3, seed=1,
                    env_kwargs={"max_turns": 1})[0] for mode in ("lockstep", "async")]
    assert_same_trajectories(runs[0].trajectories, runs[1].trajectories)


def test_grpo_groups_are_preserved(tok):
    """Groups share a task and a prompt, group ids and task draws are the lockstep's, trajectories
    come back in episode order — while the slow steps make episodes finish out of order."""
    policy = ScriptedPolicy(tok, SlowToolEnv.oracle)
    runs = {mode: collect(policy, SLOW, mode, num_groups=3, group_size=4, seed=7, env_kwargs={"delay_s": 0.05})[0]
            for mode in ("lockstep", "async")}
    trajs = runs["async"].trajectories
    assert [t.group_id for t in trajs] == [g for g in range(3) for _ in range(4)]
    # per group: one (task, prompt ids) pair; three different tasks
    per_group = {g: {(t.task_index, tuple(t.token_ids[: t.prompt_length])) for t in trajs if t.group_id == g}
                 for g in range(3)}
    assert [len(v) for v in per_group.values()] == [1, 1, 1]
    assert len({task for v in per_group.values() for task, _ in v}) == 3
    assert_same_trajectories(runs["lockstep"].trajectories, trajs)


@pytest.mark.parametrize("style", ["chat", "continuation"])
def test_context_limit_in_async_mode(style, tok):
    """Episodes stop as truncated ("context_limit") at the same turn as in lockstep, while others go on."""
    policy = ScriptedPolicy(tok, SlowToolEnv.oracle)
    probe, _ = collect(policy, SLOW, "lockstep", style=style, task_indices=[0], env_kwargs={"delay_s": 0})
    per_turn = (len(probe.trajectories[0].token_ids) - probe.trajectories[0].prompt_length) // (TURNS + 1)
    # room for about two turns past the prompt
    limit = probe.trajectories[0].prompt_length + 2 * per_turn + 16
    runs = [collect(policy, SLOW, mode, style=style, sampling=SamplingParams(max_new_tokens=16),
                    max_context_tokens=limit, task_indices=range(4), env_kwargs={"delay_s": 0.05})[0]
            for mode in ("lockstep", "async")]
    assert_same_trajectories(*(r.trajectories for r in runs))
    for t in runs[1].trajectories:
        assert t.truncated and not t.terminated and t.episode["end_reason"] == "context_limit"
        assert 1 <= t.num_turns < TURNS + 1 and len(t.token_ids) + 16 > limit
        assert_faithful(t, tok, style)


# --------------------------------------------------------------------------- env settings through wrappers

class StopAndStyle(gymnasium.Wrapper):
    """Changes what the engine reads: its own stop string, the continuation style, no tools, one task."""
    stop_strings = ("STOP",)
    observation_style = "continuation"
    num_tasks = 1

    def tool_specs(self) -> list[dict[str, Any]]:
        return []


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_wrapper_attributes_change_what_the_engine_does(mode, tok):
    def plain():
        return agentgym.make(ARITH)

    def wrapped():
        return StopAndStyle(agentgym.make(ARITH))

    env = wrapped()
    assert env_attr(env, "stop_strings") == ("STOP",) and env.unwrapped.stop_strings != ("STOP",)
    assert env_attr(env, "no_such_setting", 5) == 5

    results = {}
    for name, factory in (("plain", plain), ("wrapped", wrapped)):
        policy = RecordingPolicy(ScriptedPolicy(tok, ["Ünïcödé garbage", "<answer>1</answer>"]))
        batch, _ = collect(policy, factory, mode, num_groups=3, seed=0)
        results[name] = (policy, batch.trajectories)
    (p_plain, t_plain), (p_wrapped, t_wrapped) = results["plain"], results["wrapped"]
    assert set(p_plain.calls[0][1].stop) == {"</tool_call>", "</answer>"}
    assert p_wrapped.calls[0][1].stop == ("STOP",)
    # num_tasks: every task is drawn from the wrapper's single one
    assert {t.task_index for t in t_wrapped} == {0} and len({t.task_index for t in t_plain}) > 1
    # style: chat renders the env's reply as a chat turn; continuation appends it raw
    for t in t_plain:
        assert_faithful(t, tok, "chat")
    for t in t_wrapped:
        assert_faithful(t, tok, "continuation")
    (s0, e0), (s1, _) = t_wrapped[0].turn_spans
    assert tok.decode(t_wrapped[0].token_ids[e0:s1]) == t_wrapped[0].messages[3]["content"]
    # tools: what a chat-level policy is offered (SmolLM2's chat template renders no tools)
    offered = {}
    for name, factory in (("plain", plain), ("wrapped", wrapped)):
        chat = ChatScript()
        collect(chat, factory, mode, seed=0)
        offered[name] = chat.tools
    assert [t["function"]["name"] for t in offered["plain"]] == ["calculator"] and offered["wrapped"] == []


# --------------------------------------------------------------------------- chat-level path, progress, config

class ChatScript:
    """A chat-level policy (messages in, text out), like a hosted model behind an endpoint."""

    def __init__(self):
        self.tools: Any = None

    def respond(self, conversations, sampling, tools=None):
        self.tools = tools
        out = []
        for conv in conversations:
            turns = sum(m["role"] == "assistant" for m in conv)
            index = re.search(r"then answer (\d+)", conv[0]["content"])
            reply = "<tick/>" if turns < TURNS or index is None else f"<answer>{index.group(1)}</answer>"
            out.append(Generation([], [], reply, "stop"))
        return out


def test_chat_level_policy_in_both_modes():
    runs = {mode: collect(ChatScript(), SLOW, mode, task_indices=range(TURNS), seed=0) for mode in ("lockstep", "async")}
    (lock, lock_s), (asyn, async_s) = runs["lockstep"], runs["async"]
    assert [t.to_dict() for t in lock.trajectories] == [t.to_dict() for t in asyn.trajectories]
    assert asyn.metrics["success_rate"] == 1.0 and asyn.trajectories[0].token_ids == []
    assert async_s < 0.6 * lock_s


def test_progress_reports_episodes_and_tokens(tok):
    seen: list[tuple[int, int, int]] = []
    engine = RolloutEngine(ScriptedPolicy(tok, SlowToolEnv.oracle), RolloutConfig())
    try:
        batch = engine.collect(SLOW, task_indices=range(3), env_kwargs={"delay_s": 0.0},
                               progress=lambda p: seen.append((p.finished, p.total, p.tokens)))
    finally:
        engine.close()
    assert seen[-1] == (3, 3, batch.metrics["generated_tokens"]) and all(total == 3 for _, total, _ in seen)
    assert [f for f, _, _ in seen] == sorted(f for f, _, _ in seen)
    tokens = [n for _, _, n in seen]
    assert tokens == sorted(tokens) and tokens[0] > 0  # reported after each generate call, growing


class FailsOnSecondCall(ScriptedPolicy):
    calls = 0

    def generate(self, prompts, sampling, contexts=None):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("generation failed")
        return super().generate(prompts, sampling, contexts=contexts)


def test_a_failing_policy_leaves_the_engine_usable(tok):
    """An exception in generate propagates after the env calls in flight have ended, so the same
    envs serve the next collect (with the same results as a fresh engine)."""
    engine = RolloutEngine(FailsOnSecondCall(tok, SlowToolEnv.oracle), RolloutConfig())
    try:
        with pytest.raises(RuntimeError, match="generation failed"):
            engine.collect(SLOW, task_indices=range(TURNS), env_kwargs={"delay_s": 0.2})
        again = engine.collect(SLOW, task_indices=range(TURNS), env_kwargs={"delay_s": 0.2})
    finally:
        engine.close()
    fresh, _ = collect(ScriptedPolicy(tok, SlowToolEnv.oracle), SLOW, "async", task_indices=range(TURNS),
                       env_kwargs={"delay_s": 0.2})
    assert_same_trajectories(again.trajectories, fresh.trajectories)
    assert again.metrics["success_rate"] == 1.0


def test_config_validation():
    assert RolloutConfig().mode == "async" and RolloutConfig().max_concurrent_episodes is None
    for bad in ({"mode": "parallel"}, {"max_concurrent_episodes": 0}, {"batch_wait_s": -1.0}):
        with pytest.raises(ValueError):
            RolloutConfig(**bad)
    assert RolloutConfig(max_concurrent_episodes=3, batch_wait_s=0).max_concurrent_episodes == 3
