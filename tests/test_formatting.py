"""Formatters (agentgym/formatting.py) with the real SmolLM2 tokenizer: append-only token ids,
exact policy spans, the chat template's closing glue, observation truncation; driven turn by turn
through a real env and a ``TrajectoryBuilder`` on every registered env and both styles."""

from __future__ import annotations

import copy
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym
from agentgym.formatting import ChatFormatter, ContinuationFormatter, make_formatter
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.policy import Generation, SamplingParams
from agentgym.trajectory import TrajectoryBuilder, check_trajectory

from fixtures_llm import (COVERAGE_ENV, ENV_IDS, STYLES, UNICODE_ACTIONS, assert_faithful,  # noqa: F401
                          cached_tokenizer, eos_prone_policy, one_torch_thread, split_messages, tok)

TOOL_MSG = [{"role": "tool", "content": "79252"}]
CHAT_REFERENCE = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]


def gen_of(tok, text: str, *, eos: bool) -> Generation:
    ids = tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
    return Generation(ids, [0.0] * len(ids), tok.decode(ids, skip_special_tokens=True), "eos" if eos else "stop")


def test_every_registered_env_is_covered():
    assert COVERAGE_ENV in ENV_IDS and all(e.startswith("agentgym/") for e in ENV_IDS)


# --------------------------------------------------------------------------- chat style: glue and prompt

def test_chat_prompt_is_the_rendered_template(tok):
    f = make_formatter("chat", tok)
    assert isinstance(f, ChatFormatter)
    text = tok.apply_chat_template(CHAT_REFERENCE, tokenize=False, add_generation_prompt=True)
    assert f.prompt_ids(CHAT_REFERENCE) == tok.encode(text, add_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n")


def test_assistant_closing_of_smollm2(tok):
    assert ChatFormatter(tok).assistant_closing() == "<|im_end|>\n"
    assert tok.eos_token == "<|im_end|>"


def test_closing_glue_is_added_in_full_when_the_reply_has_no_eos(tok):
    f = ChatFormatter(tok)
    ids = f.observation_ids(gen_of(tok, "The answer is 4.", eos=False).token_ids, TOOL_MSG)
    assert ids[0] == tok.eos_token_id, "the end-of-turn must be the special token, not text"
    assert tok.decode(ids) == "<|im_end|>\n<|im_start|>tool\n79252<|im_end|>\n<|im_start|>assistant\n"


def test_closing_glue_skips_the_eos_the_policy_sampled(tok):
    f = ChatFormatter(tok)
    ids = f.observation_ids(gen_of(tok, "The answer is 4.", eos=True).token_ids, TOOL_MSG)
    assert tok.eos_token_id not in ids[:1]
    assert tok.decode(ids) == "\n<|im_start|>tool\n79252<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("tail", ["<", "<|", "<|im", "<|im_end", "<|im_end|", " <|im_end|"])
def test_reply_text_ending_like_the_closing_still_gets_the_special_token(tok, tail):
    """Regression: the overlap with the closing was matched on *text*, so a reply ending in "<" got
    "|im_end|>" spelled out as plain-text tokens and never the end-of-turn token."""
    f = ChatFormatter(tok)
    gen = gen_of(tok, "x " + tail, eos=False)
    assert tok.eos_token_id not in gen.token_ids
    ids = f.observation_ids(gen.token_ids, TOOL_MSG)
    assert ids[:2] == tok.encode("<|im_end|>\n", add_special_tokens=False) == [tok.eos_token_id, ids[1]]


def test_empty_observation_gets_closing_and_generation_prompt(tok):
    f = ChatFormatter(tok)
    no_eos = f.observation_ids(gen_of(tok, "hm", eos=False).token_ids, [])
    with_eos = f.observation_ids(gen_of(tok, "hm", eos=True).token_ids, [])
    assert tok.decode(no_eos) == "<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(with_eos) == "\n<|im_start|>assistant\n"


def test_several_messages_in_one_step_render_in_order(tok):
    f = ChatFormatter(tok)
    msgs = [{"role": "tool", "content": "1"}, {"role": "user", "content": "and now?"}]
    text = tok.decode(f.observation_ids(gen_of(tok, "a", eos=True).token_ids, msgs))
    assert text == "\n<|im_start|>tool\n1<|im_end|>\n<|im_start|>user\nand now?<|im_end|>\n<|im_start|>assistant\n"


def test_tools_argument_is_accepted_by_a_template_without_tools(tok):
    f = ChatFormatter(tok)
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    assert f.prompt_ids(CHAT_REFERENCE, tools) == f.prompt_ids(CHAT_REFERENCE)
    assert f.assistant_closing(tools) == "<|im_end|>\n"


def test_chat_style_rejects_a_template_that_is_not_append_only(tok):
    counting = copy.copy(tok)  # shallow: only this copy's template changes
    counting.chat_template = ("{{ messages|length }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}[end]"
                              "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
    f = ChatFormatter(counting)
    with pytest.raises(ValueError, match="append-only"):
        f.observation_ids(gen_of(tok, "hi", eos=True).token_ids, TOOL_MSG)
    assert tok.chat_template != counting.chat_template


def test_tokenizer_without_chat_template(tok):
    base = copy.copy(tok)
    base.chat_template = None
    with pytest.raises(ValueError, match="continuation"):
        ChatFormatter(base)
    f = ContinuationFormatter(base)
    msgs = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "2+2?"}]
    assert f.prompt_ids(msgs) == [tok.bos_token_id] + tok.encode("Solve it.\n2+2?", add_special_tokens=False)


def test_make_formatter_and_argument_errors(tok):
    assert make_formatter("continuation", tok).style == "continuation"
    with pytest.raises(ValueError, match="unknown formatter style"):
        make_formatter("xml", tok)
    with pytest.raises(ValueError, match="max_obs_tokens"):
        make_formatter("chat", tok, max_obs_tokens=0)


# --------------------------------------------------------------------------- continuation style

def test_continuation_appends_raw_text(tok):
    f = ContinuationFormatter(tok)
    assert f.prompt_ids(CHAT_REFERENCE) == ChatFormatter(tok).prompt_ids(CHAT_REFERENCE)
    msgs = [{"role": "tool", "content": "<information>Paris</information>"}, {"role": "user", "content": " go on"}]
    ids = f.observation_ids(gen_of(tok, "<search>x</search>", eos=False).token_ids, msgs)
    assert ids == tok.encode("<information>Paris</information> go on", add_special_tokens=False)
    assert f.observation_ids([5], []) == []


# --------------------------------------------------------------------------- truncation

def test_truncation_cuts_visibly_and_keeps_short_messages(tok):
    f = ChatFormatter(tok, max_obs_tokens=5)
    long = "one two three four five six seven eight nine ten"
    out, cut = f.truncate([{"role": "tool", "content": long, "name": "calculator"}])
    assert cut
    ids = tok.encode(long, add_special_tokens=False)
    assert out == [{"role": "tool", "content": tok.decode(ids[:5]) + "\n[observation truncated to 5 tokens]\n",
                    "name": "calculator"}]
    short = [{"role": "tool", "content": "42"}]
    assert f.truncate(short) == (short, False)
    unlimited = [{"role": "tool", "content": long}]
    assert ChatFormatter(tok).truncate(unlimited) == (unlimited, False)


def test_truncation_budget_is_shared_by_the_step_messages(tok):
    f = ContinuationFormatter(tok, max_obs_tokens=5, truncation_marker="[cut {n}]")
    first, second = "a b c", "d e f g h i j"
    assert len(tok.encode(first, add_special_tokens=False)) == 3
    out, cut = f.truncate([{"role": "tool", "content": first}, {"role": "user", "content": second}])
    assert cut and out[0]["content"] == first
    assert out[1]["content"] == tok.decode(tok.encode(second, add_special_tokens=False)[:2]) + "[cut 5]"


# --------------------------------------------------------------------------- turn-by-turn drive

def _make_env(env_id: str, max_turns: int):
    try:  # where the env takes max_turns: enough turns for every scripted action, few for random text
        return agentgym.make(env_id, max_turns=max_turns)
    except TypeError:
        return agentgym.make(env_id)


def drive(env_id: str, style: str, tok, policy, sampling: SamplingParams, *, max_obs_tokens=None, seed=0,
          max_turns: int = len(UNICODE_ACTIONS) + 2):
    """One episode by hand: formatter + builder, checking the append-only prefix after every turn, and
    that SmolLM2's (append-only) template never reports drift (``history=``, ``on_template_drift="error"``)."""
    env = _make_env(env_id, max_turns)
    base = env.unwrapped
    fmt = make_formatter(style, tok, max_obs_tokens=max_obs_tokens, on_template_drift="error")
    tools = base.tool_specs()
    sampling = sampling.replace(stop=tuple(sampling.stop) + tuple(base.stop_strings))
    obs, _ = env.reset(seed=seed)
    builder = TrajectoryBuilder(fmt.prompt_ids(obs, tools), obs)
    env_messages_seen = []
    terminated = truncated = False
    turn = 0
    while not (terminated or truncated):
        before = list(builder.token_ids)
        kwargs = {"contexts": [{"turn": turn}]} if isinstance(policy, ScriptedPolicy) else {}
        gen = policy.generate([before], sampling, **kwargs)[0]
        builder.add_policy(gen.token_ids, gen.logprobs, gen.text, gen.finish_reason)
        obs, reward, terminated, truncated, info = env.step(gen.text)
        builder.add_step(reward, info["reward_terms"])
        if not (terminated or truncated):
            obs, _ = fmt.truncate(obs)
            env_messages_seen.extend(obs)
            builder.add_env(fmt.observation_ids(gen.token_ids, obs, tools, history=builder), obs)
        # append-only: everything before this turn is untouched, the sampled ids follow verbatim
        assert builder.token_ids[: len(before)] == before
        assert builder.token_ids[len(before): len(before) + len(gen.token_ids)] == gen.token_ids
        turn += 1
    env.close()
    traj = builder.build(terminated=terminated, truncated=truncated, env_id=env_id)
    return traj, env_messages_seen


SCRIPTED_SAMPLING = SamplingParams(max_new_tokens=14)  # the longer actions are cut: finish "length"


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("add_eos", [True, False], ids=["eos", "no-eos"])
def test_scripted_drive_is_faithful(env_id, style, add_eos, tok):
    policy = ScriptedPolicy(tok, UNICODE_ACTIONS, add_eos=add_eos)
    traj, seen = drive(env_id, style, tok, policy, SCRIPTED_SAMPLING)
    if env_id == COVERAGE_ENV:
        assert traj.num_turns >= 2
        reasons = set(traj.finish_reasons)
        assert "length" in reasons and reasons - {"length"}, reasons
    assert_faithful(traj, tok, style)
    # env text only in mask-0 regions: no env message's text is inside any policy span
    spans = [tok.decode(traj.token_ids[s:e]) for s, e in traj.turn_spans]
    for m in seen:
        if len(m["content"]) > 8:
            assert not any(m["content"] in sp for sp in spans)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_model_drive_is_faithful(env_id, style, tok):
    """Garbage tokens from a random-weight model (some replies end by EOS, others by length)."""
    policy = eos_prone_policy()
    finishes = set()
    for seed in range(3):
        traj, _ = drive(env_id, style, tok, policy, SamplingParams(max_new_tokens=8, seed=seed), seed=seed,
                        max_turns=3)
        assert_faithful(traj, tok, style)
        finishes.update(traj.finish_reasons)
    if env_id == COVERAGE_ENV:
        assert {"eos", "length"} <= finishes


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_drive_with_truncated_observations(env_id, style, tok):
    policy = ScriptedPolicy(tok, UNICODE_ACTIONS)
    traj, seen = drive(env_id, style, tok, policy, SCRIPTED_SAMPLING, max_obs_tokens=5)
    marker = "[observation truncated to 5 tokens]"
    cut = [m for m in seen if marker in m["content"]]
    if env_id == COVERAGE_ENV:
        assert cut, "the scripted actions provoke observations longer than 5 tokens"
    for m in cut:
        assert len(tok.encode(m["content"].split("\n" + marker)[0], add_special_tokens=False)) <= 5
    _, after = split_messages(traj)
    assert [m for obs in after for m in obs] == seen  # the trajectory holds the text the policy saw
    assert_faithful(traj, tok, style)


# --------------------------------------------------------------------------- property: any text, any style

@functools.lru_cache(maxsize=None)
def _encodable(ch: str) -> bool:
    """SmolLM2's byte-level vocabulary lacks 21 byte tokens (0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0,
    0xc1, 0xf1, 0xf2, 0xf5-0xff), and encoding silently drops those bytes: U+0004 or code points in
    U+40000-U+BFFFF cannot be represented at all. (A model cannot sample them either, so policy text
    is unaffected.) The property is stated over the text this tokenizer can represent."""
    tok = cached_tokenizer()
    return tok.decode(tok.encode(ch, add_special_tokens=False)) == ch


def test_the_vocabulary_gap_is_what_we_think(tok):
    assert not _encodable("\x04") and not _encodable("\U00040000")
    assert all(_encodable(c) for c in "aé中😀\U0010ffff\x1b\t\n\u200b")


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)).filter(_encodable), max_size=40)
_messages = st.lists(st.tuples(st.sampled_from(["user", "tool", "system"]), _text), max_size=2)
_turns = st.lists(st.tuples(_text, st.booleans(), _messages), min_size=1, max_size=4)  # (reply, eos?, observation)


@pytest.mark.parametrize("style", STYLES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=_turns, end_with_obs=st.booleans())
def test_any_text_round_trips(style, turns, end_with_obs):
    """Arbitrary Unicode replies (with or without EOS) and observations keep every invariant."""
    tok = cached_tokenizer()
    fmt = make_formatter(style, tok, on_template_drift="error")  # any text: still no drift reported
    prompt = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    b = TrajectoryBuilder(fmt.prompt_ids(prompt), prompt)
    for k, (reply, eos, obs) in enumerate(turns):
        gen = gen_of(tok, reply, eos=eos)
        b.add_policy(gen.token_ids, gen.logprobs, gen.text, gen.finish_reason)
        b.add_step(0.0, {})
        if k < len(turns) - 1 or end_with_obs:
            msgs = [{"role": r, "content": c} for r, c in obs]
            before = list(b.token_ids)
            b.add_env(fmt.observation_ids(gen.token_ids, msgs, history=b), msgs)
            assert b.token_ids[: len(before)] == before
    traj = b.build()
    assert check_trajectory(traj, tok) == []
    assert_faithful(traj, tok, style)
