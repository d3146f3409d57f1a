"""The rollout engine (agentgym/rollout.py) with the real SmolLM2 tokenizer, scripted policies and a
random-weight tiny transformers model: token faithfulness on every registered env and both styles,
groups, task selection, metrics, drop-out of finished episodes, truncation limits, determinism,
debug checks; plus ``cut_at_stop`` and Gymnasium's vector envs over our text spaces."""

from __future__ import annotations

import itertools
from collections import Counter

import gymnasium
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.policy import Generation, SamplingParams, cut_at_stop
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine
from agentgym.rollout_metrics import summarize
from agentgym.trajectory import Trajectory, check_trajectory

from fixtures_llm import (COVERAGE_ENV, ENV_IDS, STYLES, UNICODE_ACTIONS,  # noqa: F401  (fixtures)
                          RecordingPolicy, assert_faithful, assert_snapshots_are_prefixes, cached_tokenizer,
                          eos_prone_policy, one_torch_thread, split_messages, tok)

ARITH = "agentgym/Arithmetic-v0"


def arithmetic_oracle(ctx):
    """Uses the privileged task: easy questions answered at once, hard ones via the calculator."""
    t = ctx["task"]
    if ctx["turn"] == 0 and t["difficulty"] == "hard":
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % t["expression"]
    return "<answer>%s</answer>" % t["answers"][0]


def varied_script():
    """Env-agnostic actions in rotation: consecutive replies (within a batch too) differ, so every
    turn of a batch mixes short replies (EOS) with long ones (cut by max_new_tokens)."""
    counter = itertools.count()
    return lambda ctx: UNICODE_ACTIONS[next(counter) % len(UNICODE_ACTIONS)]


def find_tasks(difficulty: str, n: int) -> list[int]:
    env = agentgym.make(ARITH).unwrapped
    return [i for i in range(200) if env.get_task(i)["difficulty"] == difficulty][:n]


def assert_calls_match_trajectories(policy: RecordingPolicy, trajs: list[Trajectory]) -> None:
    """Turn k's prompt of every episode is exactly the first ids of its final trajectory, and the ids
    sampled at turn k follow it verbatim (so ids after turn k are a prefix of ids after turn k+1).
    Searched over all recorded calls: in async mode a call may mix episodes at different turns.
    An env with a ``cut_after`` rule (SearchQA under Search-R1, issue 26) has its reply cut by the engine:
    then the turn ends in "stop" where the policy did not stop, and its ids are a prefix of the sampled ones."""
    recorded = [(p, g) for prompts, _, gens in policy.calls for p, g in zip(prompts, gens)]

    def same(g, seg, reason):
        return g.token_ids == seg or (reason == "stop" and g.finish_reason != "stop" and g.token_ids[:len(seg)] == seg)

    for t in trajs:
        for k, (s, e) in enumerate(t.turn_spans):
            seg = t.token_ids[s:e]
            hits = [g for p, g in recorded if p == t.token_ids[:s] and same(g, seg, t.finish_reasons[k])]
            assert hits, f"turn {k}: no recorded prompt is a prefix of the final trajectory"
        assert t.turn_spans[0][0] == t.prompt_length if t.turn_spans else True
    assert sum(len(t.turn_spans) for t in trajs) == len(recorded)  # one generation per turn, none lost


# --------------------------------------------------------------------------- invariants on every env × style

@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_scripted_rollout_is_faithful(env_id, style, tok):
    policy = RecordingPolicy(ScriptedPolicy(tok, varied_script()))
    engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=14), style=style,
                                                 debug_checks=True))
    batch = engine.collect(env_id, num_groups=3, group_size=2, seed=1)
    engine.close()
    reasons = Counter(r for t in batch.trajectories for r in t.finish_reasons)
    assert reasons["eos"] and reasons["length"], reasons
    for t in batch.trajectories:
        assert_faithful(t, tok, style)
    assert_calls_match_trajectories(policy, batch.trajectories)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_model_rollout_is_faithful(env_id, style, tok):
    """Sampled garbage from random weights; replies end by EOS, by a stop string or by length."""
    policy = RecordingPolicy(eos_prone_policy())
    sampling = SamplingParams(max_new_tokens=8, seed=1, stop=("ing",))
    engine = RolloutEngine(policy, RolloutConfig(sampling=sampling, style=style, debug_checks=True))
    batch = engine.collect(env_id, num_groups=2, group_size=2, seed=0)
    engine.close()
    reasons = Counter(r for t in batch.trajectories for r in t.finish_reasons)
    if env_id == COVERAGE_ENV:
        assert set(reasons) == {"eos", "stop", "length"}, reasons
    # the env's stop strings were added to ours
    base = agentgym.make(env_id).unwrapped
    assert set(policy.calls[0][1].stop) == {"ing", *base.stop_strings}
    for t in batch.trajectories:
        assert_faithful(t, tok, style)
        for (s, e), r in zip(t.turn_spans, t.finish_reasons):
            assert e - s <= 8
            if r == "stop":
                assert "ing" in tok.decode(t.token_ids[s:e]) and "ing" not in tok.decode(t.token_ids[s:e - 1])
            assert all(lp < 0 for lp in t.logprobs[s:e])  # real sampling-time log-probs
    assert_calls_match_trajectories(policy, batch.trajectories)


def test_snapshots_captured_by_a_script(tok):
    """The prompt at turn k+1 starts with the prompt at turn k plus the ids sampled at turn k."""
    seen: list[list[int]] = []

    def script(ctx):
        seen.append(ctx["prompt_ids"])
        return UNICODE_ACTIONS[ctx["turn"]]

    policy = RecordingPolicy(ScriptedPolicy(tok, script))
    engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=14), style="chat"))
    traj = engine.collect(ARITH, task_indices=[find_tasks("easy", 1)[0]], seed=0).trajectories[0]
    assert traj.num_turns == 4 and len(seen) == 4  # no answer among the first four actions: max_turns
    gens = [g for _, _, gs in policy.calls for g in gs]
    assert_snapshots_are_prefixes(seen, gens, traj.token_ids)
    assert traj.truncated and not traj.terminated


# --------------------------------------------------------------------------- oracle, groups, tasks, metrics

@pytest.mark.parametrize("mode", ["lockstep", "async"])
@pytest.mark.parametrize("style", STYLES)
def test_oracle_solves_arithmetic_and_drops_out_finished_episodes(style, mode, tok):
    easy, hard = find_tasks("easy", 2), find_tasks("hard", 3)
    policy = RecordingPolicy(ScriptedPolicy(tok, arithmetic_oracle))
    engine = RolloutEngine(policy, RolloutConfig(style=style, debug_checks=True, mode=mode))
    batch = engine.collect(ARITH, task_indices=easy + hard, seed=0)
    m = batch.metrics
    assert m["success_rate"] == 1.0 and m["reward/correct"] == 1.0
    # easy episodes finished after turn 1; hard ones continued (async: the first call always holds
    # every episode; the hard ones' second turns may come in one call or, on a loaded machine, more)
    if mode == "lockstep":
        assert policy.batch_sizes == [5, 3]
    else:
        assert policy.batch_sizes[0] == 5 and sum(policy.batch_sizes) == 8
    assert m["rollout/generate_calls"] == len(policy.batch_sizes)
    assert [t.num_turns for t in batch.trajectories] == [1, 1, 2, 2, 2]
    assert m["turns_mean"] == pytest.approx(8 / 5) and m["tool_calls_mean"] == pytest.approx(3 / 5)
    for t in batch.trajectories:
        assert t.terminated and not t.truncated and t.episode["success"]
        assert_faithful(t, tok, style)
    hard_traj = batch.trajectories[2]
    _, after = split_messages(hard_traj)
    assert after[0][0]["role"] == "tool"
    result = after[0][0]["content"]
    task = agentgym.make(ARITH).unwrapped.get_task(hard[0])
    assert result == task["answers"][0]
    # the tool output sits in the env segment between the two policy turns, never in a policy span
    (s0, e0), (s1, _) = hard_traj.turn_spans
    assert result in tok.decode(hard_traj.token_ids[e0:s1])
    assert set(hard_traj.loss_mask[e0:s1]) == {0}


@pytest.mark.parametrize("add_eos", [True, False], ids=["eos", "no-eos"])
def test_whole_trajectory_decodes_to_the_rendered_conversation(tok, add_eos):
    """What exactly holds, spelled out: after the last policy turn nothing is appended, so chat-style
    ids decode to the chat template's rendering minus the closing the policy did not sample."""
    hard = find_tasks("hard", 1)
    for style in STYLES:
        engine = RolloutEngine(ScriptedPolicy(tok, arithmetic_oracle, add_eos=add_eos), RolloutConfig(style=style))
        (t,) = engine.collect(ARITH, task_indices=hard, seed=0).trajectories
        assert t.num_turns == 2 and t.messages[3]["role"] == "tool"
        text = tok.decode(t.token_ids, skip_special_tokens=False)
        eos = "<|im_end|>" if add_eos else ""
        if style == "chat":
            rendered = tok.apply_chat_template(t.messages, tokenize=False)
            assert text + ("\n" if add_eos else "<|im_end|>\n") == rendered
        else:
            prompt = tok.apply_chat_template(t.messages[:2], tokenize=False, add_generation_prompt=True)
            assert text == prompt + t.actions[0] + eos + t.messages[3]["content"] + t.actions[1] + eos


def test_groups_share_a_task(tok):
    policy = RecordingPolicy(ScriptedPolicy(tok, arithmetic_oracle))
    engine = RolloutEngine(policy, RolloutConfig())
    batch = engine.collect(ARITH, num_groups=3, group_size=4, seed=3)
    trajs = batch.trajectories
    assert len(trajs) == 12 and batch.metrics["episodes"] == 12
    assert [t.group_id for t in trajs] == [g for g in range(3) for _ in range(4)]
    for g in range(3):
        members = trajs[4 * g: 4 * g + 4]
        assert len({t.task_index for t in members}) == 1
        assert len({tuple(t.token_ids[: t.prompt_length]) for t in members}) == 1
    assert len({trajs[4 * g].task_index for g in range(3)}) == 3
    assert policy.batch_sizes[0] == 12  # one generate call serves every episode of a turn
    assert all(t.env_id == ARITH for t in trajs)
    # without groups there are no group ids
    single = engine.collect(ARITH, num_groups=2, seed=3).trajectories
    assert [t.group_id for t in single] == [None, None]


def test_explicit_task_indices_and_tasks(tok):
    engine = RolloutEngine(ScriptedPolicy(tok, arithmetic_oracle), RolloutConfig())
    batch = engine.collect(ARITH, task_indices=[5, 7, 5], group_size=2, seed=0)
    assert [t.task_index for t in batch.trajectories] == [5, 5, 7, 7, 5, 5]
    env = agentgym.make(ARITH).unwrapped
    for t in batch.trajectories:
        assert t.messages[1]["content"] == env.get_task(t.task_index)["question"]
        assert t.episode["success"]

    task = {"question": "What is 1000 * 1000?", "expression": "1000 * 1000", "answers": ["1000000"],
            "difficulty": "hard"}
    batch = engine.collect(ARITH, tasks=[task], group_size=3, seed=0)
    assert len(batch.trajectories) == 3
    for t in batch.trajectories:
        assert t.messages[1]["content"] == "What is 1000 * 1000?"
        assert t.actions[-1] == "<answer>1000000</answer>" and t.episode["success"]
        assert t.task_index is None and t.group_id == 0


def test_env_factory(tok):
    def make_arithmetic():
        return agentgym.make(ARITH, max_turns=2)

    engine = RolloutEngine(ScriptedPolicy(tok, ["nonsense"]), RolloutConfig())
    batch = engine.collect(make_arithmetic, num_groups=2, seed=0)
    assert [t.num_turns for t in batch.trajectories] == [2, 2]
    assert all(t.truncated and t.env_id == "make_arithmetic" for t in batch.trajectories)


def test_metrics(tok):
    easy, hard = find_tasks("easy", 1), find_tasks("hard", 1)
    engine = RolloutEngine(ScriptedPolicy(tok, arithmetic_oracle), RolloutConfig(max_obs_tokens=None))
    batch = engine.collect(ARITH, task_indices=easy + hard, group_size=2, seed=0)
    m, trajs = batch.metrics, batch.trajectories
    for key in ["success_rate", "reward_mean", "reward/correct", "reward/format", "reward/tool_cost",
                "reward/invalid", "turns_mean", "tool_calls_mean", "generated_tokens", "masked_token_fraction",
                "time/generate_s", "time/env_s", "time/format_s", "time/wall_s"]:
        assert key in m and np.isfinite(m[key]), key
    assert m["reward_mean"] == pytest.approx(np.mean([t.total_reward for t in trajs]))
    assert m["reward/tool_cost"] == pytest.approx(-0.05 * 2 / 4)  # one call in each hard episode
    assert m["reward/format"] == pytest.approx(0.1)
    assert m["generated_tokens"] == sum(sum(t.loss_mask) for t in trajs)
    env_tokens = sum(len(t.token_ids) - t.prompt_length - sum(t.loss_mask) for t in trajs)
    assert env_tokens > 0
    after_prompt = sum(len(t.token_ids) - t.prompt_length for t in trajs)
    assert m["masked_token_fraction"] == pytest.approx(env_tokens / after_prompt)
    assert m["time/wall_s"] >= m["time/generate_s"] + m["time/env_s"] + m["time/format_s"] - 1e-6 >= 0
    assert summarize([]) == {}
    assert summarize(trajs)["reward_mean"] == m["reward_mean"]


# --------------------------------------------------------------------------- limits

@pytest.mark.parametrize("style", STYLES)
def test_long_observations_are_truncated(style, tok):
    engine = RolloutEngine(ScriptedPolicy(tok, ["garbage", "<answer>1</answer>"]),
                           RolloutConfig(style=style, max_obs_tokens=5, debug_checks=True))
    batch = engine.collect(ARITH, task_indices=[0, 2], seed=0)
    env = agentgym.make(ARITH)
    for t in batch.trajectories:
        initial, after = split_messages(t)
        obs, _ = env.reset(options={"task_index": t.task_index})
        assert initial == obs, "the task prompt is never cut"
        (msg,) = after[0]
        assert msg["content"].endswith("\n[observation truncated to 5 tokens]\n")
        assert msg["content"].startswith("Invalid")
        head = msg["content"][: -len("\n[observation truncated to 5 tokens]\n")]
        assert len(tok.encode(head, add_special_tokens=False)) == 5
        assert_faithful(t, tok, style)  # the tokens hold the truncated text, as the messages do


@pytest.mark.parametrize("mode", ["lockstep", "async"])
@pytest.mark.parametrize("style", STYLES)
def test_context_limit_ends_episode_as_truncated(style, mode, tok):
    policy = RecordingPolicy(ScriptedPolicy(tok, ["not an answer"]))
    probe = RolloutEngine(ScriptedPolicy(tok, ["x"]), RolloutConfig(style=style))
    prompt_len = probe.collect(ARITH, task_indices=[0], seed=0).trajectories[0].prompt_length
    sampling = SamplingParams(max_new_tokens=16)
    # the first turn fits; after one reply and the env's long "invalid action" message the next does not
    cfg = RolloutConfig(sampling=sampling, style=style, max_context_tokens=prompt_len + 16 + 10, mode=mode)
    batch = RolloutEngine(policy, cfg).collect(ARITH, task_indices=[0, 1], seed=0)
    assert policy.batch_sizes == [2]
    for t in batch.trajectories:
        assert t.truncated and not t.terminated
        assert t.episode["end_reason"] == "context_limit" and t.episode["success"] is False
        assert t.num_turns == 1 and t.turn_spans[-1][1] < len(t.token_ids)  # ends with the env segment
        assert len(t.token_ids) + 16 > cfg.max_context_tokens
        assert_faithful(t, tok, style)
    assert batch.metrics["truncated_rate"] == 1.0

    # a prompt that leaves less room than max_new_tokens: no turn at all, the policy is never called
    policy = RecordingPolicy(ScriptedPolicy(tok, ["x"]))
    cfg = RolloutConfig(sampling=sampling, style=style, max_context_tokens=prompt_len + 15, mode=mode)
    batch = RolloutEngine(policy, cfg).collect(ARITH, task_indices=[0], seed=0)
    (t,) = batch.trajectories
    assert policy.calls == [] and t.num_turns == 0 and t.episode["end_reason"] == "context_limit"
    assert len(t.token_ids) == t.prompt_length
    assert_faithful(t, tok, style)


def test_scripted_policy_finish_reasons(tok):
    reply = "<answer>1234</answer>"
    n = len(tok.encode(reply, add_special_tokens=False))
    eos = tok.eos_token_id

    def gen(max_new_tokens, add_eos=True):
        policy = ScriptedPolicy(tok, [reply], add_eos=add_eos)
        (g,) = policy.generate([[1]], SamplingParams(max_new_tokens=max_new_tokens))
        return g.token_ids, g.text, g.finish_reason

    assert gen(n + 1) == (tok.encode(reply, add_special_tokens=False) + [eos], reply, "eos")
    assert gen(n)[2] == "length" and gen(n)[0][-1] != eos  # the budget ran out before the EOS
    assert gen(n - 2)[2] == "length" and len(gen(n - 2)[0]) == n - 2
    assert gen(n, add_eos=False) == (tok.encode(reply, add_special_tokens=False), reply, "stop")


# --------------------------------------------------------------------------- determinism and debug checks

def test_same_seed_same_trajectories(tok):
    """Seeded sampling replays exactly in lockstep mode (async: tests/test_rollout_async.py)."""
    def run(seed):
        engine = RolloutEngine(eos_prone_policy(), RolloutConfig(sampling=SamplingParams(max_new_tokens=6, seed=7),
                                                                 mode="lockstep"))
        batch = engine.collect(ARITH, num_groups=2, group_size=2, seed=seed)
        engine.close()
        return [(t.task_index, t.token_ids, [round(x, 5) for x in t.logprobs]) for t in batch.trajectories]

    first = run(11)
    assert run(11) == first
    assert [x[0] for x in run(12)] != [x[0] for x in first]


class MismatchedTextPolicy:
    """A broken policy: its text does not match its token ids."""

    def __init__(self, tok):
        self.tokenizer = tok

    def generate(self, prompts, sampling):
        ids = self.tokenizer.encode("<answer>1</answer>", add_special_tokens=False)
        return [Generation(ids, [0.0] * len(ids), "<answer>2</answer>", "stop") for _ in prompts]


def test_debug_checks_raise_on_a_broken_trajectory(tok):
    with pytest.raises(AssertionError, match="invariants violated.*decoded span"):
        RolloutEngine(MismatchedTextPolicy(tok), RolloutConfig(debug_checks=True)).collect(ARITH, seed=0)
    # without debug checks the broken trajectory comes back, and the checker names the problem
    (t,) = RolloutEngine(MismatchedTextPolicy(tok), RolloutConfig()).collect(ARITH, seed=0).trajectories
    assert check_trajectory(t, tok) == [
        "turn 0: decoded span '<answer>1</answer>' != sampled text '<answer>2</answer>'"]


def test_check_trajectory_finds_each_kind_of_corruption(tok):
    engine = RolloutEngine(ScriptedPolicy(tok, arithmetic_oracle), RolloutConfig())
    t = engine.collect(ARITH, task_indices=find_tasks("hard", 1), seed=0).trajectories[0]
    assert check_trajectory(t, tok) == []
    d = t.to_dict()
    assert check_trajectory(Trajectory.from_dict(d), tok) == []
    bad = Trajectory.from_dict({**d, "loss_mask": [1] + d["loss_mask"][1:]})
    assert check_trajectory(bad, tok) == ["loss_mask is not 1 exactly on the policy spans"]
    bad = Trajectory.from_dict({**d, "logprobs": d["logprobs"][:-1]})
    assert "length mismatch" in check_trajectory(bad, tok)[0]
    s, e = t.turn_spans[1]
    bad = Trajectory.from_dict({**d, "turn_spans": [t.turn_spans[0], (s + 1, e + 1)]})
    assert any("loss_mask" in p for p in check_trajectory(bad, tok))
    bad = Trajectory.from_dict({**d, "step_rewards": d["step_rewards"] + [1.0]})
    assert check_trajectory(bad, tok) == ["3 step rewards but 2 policy turns"]
    # rewards sit on the last token of each policy turn
    assert t.reward_positions == [e - 1 for _, e in t.turn_spans]
    assert sum(t.token_rewards()) == pytest.approx(t.total_reward)


# --------------------------------------------------------------------------- cut_at_stop

def _dec(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def test_cut_at_stop_eos(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    eos = tok.eos_token_id
    assert cut_at_stop(ids + [eos, 5, 6], _dec(tok), (), [eos]) == (len(ids) + 1, "eos")
    assert cut_at_stop([eos], _dec(tok), ("x",), [eos]) == (1, "eos")
    # EOS before a stop string wins; a stop string completed before EOS wins
    stop_ids = tok.encode("done. STOP", add_special_tokens=False)
    assert cut_at_stop([eos] + stop_ids, _dec(tok), ("STOP",), [eos]) == (1, "eos")
    assert cut_at_stop(stop_ids + [eos], _dec(tok), ("STOP",), [eos]) == (len(stop_ids), "stop")


def test_cut_at_stop_string_spanning_several_tokens(tok):
    ids = tok.encode("<answer>42</answer> and then more text", add_special_tokens=False)
    stop_tokens = tok.encode("</answer>", add_special_tokens=False)
    assert len(stop_tokens) > 1
    end, reason = cut_at_stop(ids, _dec(tok), ("</answer>",))
    assert reason == "stop" and tok.decode(ids[:end]) == "<answer>42</answer>"


def test_cut_at_stop_completed_mid_token(tok):
    ids = tok.encode("the quick brownish fox", add_special_tokens=False)
    assert [tok.decode([i]) for i in ids] == ["the", " quick", " brownish", " fox"]
    end, reason = cut_at_stop(ids, _dec(tok), ("quick brow",))
    assert (end, reason) == (3, "stop")  # " brownish" completes it mid-token and is kept, overhang and all
    # a stop string completed by the last byte of a multi-byte character
    emoji = tok.encode("ok 😀 then", add_special_tokens=False)
    end, reason = cut_at_stop(emoji, _dec(tok), ("😀",))
    assert reason == "stop" and tok.decode(emoji[:end]) == "ok 😀" and "😀" not in tok.decode(emoji[:end - 1])


def test_cut_at_stop_without_stop_is_length(tok):
    ids = tok.encode("no stop here", add_special_tokens=False)
    assert cut_at_stop(ids, _dec(tok), ("</answer>",), [tok.eos_token_id]) == (len(ids), "length")
    assert cut_at_stop(ids, _dec(tok), ()) == (len(ids), "length")
    assert cut_at_stop([], _dec(tok), ("x",)) == (0, "length")


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="ab <>/é😀\n", max_size=40), stop=st.sampled_from(["</a>", "b b", "😀", "a", "\n\n"]))
def test_cut_at_stop_cuts_at_the_first_completing_token(text, stop):
    tok = cached_tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    end, reason = cut_at_stop(ids, _dec(tok), (stop,))
    if reason == "stop":
        assert stop in tok.decode(ids[:end]) and stop not in tok.decode(ids[:end - 1])
    else:
        assert (end, reason) == (len(ids), "length") and stop not in text


# --------------------------------------------------------------------------- Gymnasium vector envs

@pytest.mark.parametrize("vector_cls", [gymnasium.vector.SyncVectorEnv, gymnasium.vector.AsyncVectorEnv])
def test_vector_envs_step_with_text_actions(vector_cls):
    kwargs = {"shared_memory": False} if vector_cls is gymnasium.vector.AsyncVectorEnv else {}
    envs = vector_cls([lambda: gymnasium.make(ARITH)] * 2, **kwargs)
    try:
        assert isinstance(envs.single_observation_space, agentgym.MessageList)
        assert isinstance(envs.single_action_space, agentgym.UnicodeText)
        obs, info = envs.reset(seed=0)
        assert len(obs) == 2 and all(envs.single_observation_space.contains(o) for o in obs)
        assert obs[0][-1]["role"] == "user" and obs[0][-1]["content"].startswith("What is")
        obs, reward, terminated, truncated, info = envs.step(("<answer>1</answer>", "Ünïcödé garbage 😀"))
        assert list(terminated) == [True, False] and list(truncated) == [False, False]
        assert obs[0] == [] and "Invalid" in obs[1][0]["content"]
        assert reward[1] == pytest.approx(-0.1)
        assert list(info["action_type"]) == ["answer", "invalid"]
        # next step: env 0 auto-resets (Gymnasium's next-step autoreset); a list works as well as a tuple
        obs, reward, terminated, truncated, info = envs.step(["ignored", "<answer>2</answer>"])
        assert obs[0][0]["role"] == "system" and reward[0] == 0.0
        assert list(terminated) == [False, True]
        assert all(envs.single_observation_space.contains(o) for o in obs)
    finally:
        envs.close()
