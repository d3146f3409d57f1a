"""Thinking-model chat templates (issue 17 §5): a Qwen3-style template that rewrites history must not
break append-only formatting; drift between the ids held and what the template renders is detected
and handled as ``on_template_drift`` says.

The template is the real SmolLM2 tokenizer's with ``chat_template`` replaced by ``QWEN3_STYLE`` below:
the history rules of Qwen3's template (abridged: no tool schemas or ``tool_calls``) — an assistant turn
before the last real user query is rendered without its ``<think>`` block; after it, the block is kept
in a canonical layout; the last assistant turn always gets one (empty if it had none); consecutive tool
results are grouped in one ``user`` turn as ``<tool_response>`` blocks. No hub access.
"""

from __future__ import annotations

import copy
import logging

import pytest

import agentgym.formatting
from agentgym.formatting import ChatFormatter, TemplateDriftError, make_formatter
from agentgym.policy import Generation
from agentgym.trajectory import TrajectoryBuilder, check_trajectory

from fixtures_llm import assert_faithful, tok  # noqa: F401

QWEN3_STYLE = """
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>')
          and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in message.content %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
            {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

PROMPT = [{"role": "system", "content": "Think, then act."}, {"role": "user", "content": "What is 2+3?"}]
# canonical layout (what the template itself renders for a kept thinking block)
THINK_CALL = '<think>\nI should use the calculator.\n</think>\n\n<tool_call>{"name": "calc", "arguments": {"e": "2+3"}}</tool_call>'
THINK_ANSWER = "<think>\nThe tool said 5.\n</think>\n\n<answer>5</answer>"
TOOL = [{"role": "tool", "name": "calc", "content": "5"}]
FEEDBACK = [{"role": "user", "content": "Wrong format. Try again."}]


@pytest.fixture(scope="module")
def qwen_tok(tok):
    t = copy.copy(tok)  # shallow: only this copy's template changes
    t.chat_template = QWEN3_STYLE
    assert tok.chat_template != t.chat_template
    return t


def gen_of(tok, text: str) -> Generation:
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    return Generation(ids, [-0.5] * len(ids), tok.decode(ids, skip_special_tokens=True), "eos")


def episode(tok, fmt, turns, *, with_history: bool = True) -> tuple[TrajectoryBuilder, list[list[int]]]:
    """Drive ``turns`` = [(reply, observation messages)] through ``fmt`` and a builder; returns the
    builder and the prompt the policy saw before each turn."""
    b = TrajectoryBuilder(fmt.prompt_ids(PROMPT), PROMPT)
    prompts = []
    for reply, obs in turns:
        prompts.append(list(b.token_ids))
        gen = gen_of(tok, reply)
        b.add_policy(gen.token_ids, gen.logprobs, gen.text, gen.finish_reason)
        b.add_step(0.0, {})
        if obs is not None:
            b.add_env(fmt.observation_ids(gen.token_ids, obs, history=b if with_history else None), obs)
    return b, prompts


def test_the_template_really_rewrites_history(qwen_tok):
    """The premise: rendering more messages changes the text of an earlier assistant turn."""
    convo = PROMPT + [{"role": "assistant", "content": THINK_ANSWER}]
    last = qwen_tok.apply_chat_template(convo, tokenize=False)
    after = qwen_tok.apply_chat_template(convo + FEEDBACK, tokenize=False, add_generation_prompt=True)
    assert "<think>\nThe tool said 5.\n</think>" in last
    assert "<think>" not in after and "<answer>5</answer><|im_end|>\n<|im_start|>user\nWrong" in after
    assert not after.startswith(last)
    # and an assistant turn that is last gets an empty thinking block it loses later
    bare = qwen_tok.apply_chat_template(PROMPT + [{"role": "assistant", "content": "x"}], tokenize=False)
    assert "<think>\n\n</think>\n\nx" in bare


def test_formatting_stays_append_only_and_faithful(qwen_tok):
    fmt = ChatFormatter(qwen_tok)
    b, prompts = episode(qwen_tok, fmt, [(THINK_CALL, TOOL), ("<think>\nhm\n</think>\n\n5?", FEEDBACK),
                                         (THINK_ANSWER, None)])
    traj = b.build()
    assert check_trajectory(traj, qwen_tok) == []  # spans decode to the sampled texts, kinds agree with the mask
    for k, p in enumerate(prompts):  # each turn's prompt is a prefix of the final ids (append-only)
        assert traj.token_ids[: len(p)] == p and traj.turn_spans[k][0] == len(p)
    # the observations are what the template renders for them (the reference's rewrite is not emitted)
    s0, e0 = traj.turn_spans[0]
    s1, _ = traj.turn_spans[1]
    assert qwen_tok.decode(traj.token_ids[e0:s1]) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # every thinking block stays in the trajectory, exactly as sampled
    assert qwen_tok.decode(traj.token_ids).count("<think>") == 3
    # kinds: the tool result is `tool`, the feedback `env`, the glue `template`
    kinds = traj.token_kinds
    tool_kinds = {kinds[i] for i in range(e0, s1)}
    assert tool_kinds == {"template", "tool"}
    assert qwen_tok.decode([t for t, k in zip(traj.token_ids[e0:s1], kinds[e0:s1]) if k == "tool"]) == "5"


def test_no_drift_while_the_template_keeps_the_thinking(qwen_tok):
    """Tool results do not start a new user query: canonical thinking blocks are kept, nothing drifts."""
    fmt = ChatFormatter(qwen_tok, on_template_drift="error")
    b, _ = episode(qwen_tok, fmt, [(THINK_CALL, TOOL), (THINK_CALL, TOOL), (THINK_ANSWER, None)])
    assert fmt.drift_turns == 0
    # the ids held are exactly what the template renders for the whole conversation (but the closing
    # newline after the final EOS, which nothing follows)
    traj = b.build()
    assert qwen_tok.decode(traj.token_ids) + "\n" == qwen_tok.apply_chat_template(traj.messages, tokenize=False)
    assert_faithful(traj, qwen_tok, "chat")


def test_drift_is_detected_when_a_user_turn_drops_earlier_thinking(qwen_tok):
    fmt = ChatFormatter(qwen_tok, on_template_drift="error")
    with pytest.raises(TemplateDriftError, match="renders the conversation differently") as err:
        episode(qwen_tok, fmt, [(THINK_CALL, TOOL), (THINK_ANSWER, FEEDBACK)])
    msg = str(err.value)
    assert "<think>" in msg and "after turn 1" in msg  # shows both texts where they part
    # a non-canonical thinking layout drifts too (the template re-lays it out even when it keeps it)
    with pytest.raises(TemplateDriftError):
        episode(qwen_tok, ChatFormatter(qwen_tok, on_template_drift="error"), [("<think>x</think>y", TOOL)])


def test_keep_trains_exactly_what_was_sampled(qwen_tok, caplog, monkeypatch):
    turns = [(THINK_CALL, TOOL), (THINK_ANSWER, FEEDBACK), (THINK_ANSWER, FEEDBACK), (THINK_ANSWER, None)]
    monkeypatch.setattr(agentgym.formatting, "_DRIFT_LOGGED", set())
    fmt = ChatFormatter(qwen_tok)  # keep is the default
    with caplog.at_level(logging.WARNING, logger="agentgym.formatting"):
        kept, _ = episode(qwen_tok, fmt, turns)
        episode(qwen_tok, ChatFormatter(qwen_tok), turns)  # the engine makes a formatter per collect
    assert fmt.on_template_drift == "keep" and fmt.drift_turns == 2  # both turns after a feedback message
    assert sum("template drift" in r.message for r in caplog.records) == 1  # logged once per template
    # the ids are those formatted without detection: keep changes nothing but the count
    plain, _ = episode(qwen_tok, ChatFormatter(qwen_tok), turns, with_history=False)
    assert kept.token_ids == plain.token_ids and kept.token_kinds == plain.token_kinds
    traj = kept.build()
    assert check_trajectory(traj, qwen_tok) == []
    # every sampled thinking block is trained on (loss_mask 1) although the template would drop them
    sampled = qwen_tok.decode([t for t, m in zip(traj.token_ids, traj.loss_mask) if m])
    assert sampled.count("<think>") == 4
    rendered = qwen_tok.apply_chat_template(traj.messages, tokenize=False)
    assert rendered.count("<think>") == 1 and qwen_tok.decode(traj.token_ids) != rendered


def test_segment_is_documented_as_not_built_and_bad_values_rejected(tok):
    with pytest.raises(NotImplementedError, match="not built"):
        ChatFormatter(tok, on_template_drift="segment")
    with pytest.raises(ValueError, match="on_template_drift"):
        make_formatter("chat", tok, on_template_drift="drop")
    assert make_formatter("continuation", tok, on_template_drift="error").on_template_drift == "error"


def test_the_default_template_never_drifts(tok):
    """SmolLM2's own template is append-only: detection finds nothing, for any layout of the reply."""
    fmt = ChatFormatter(tok, on_template_drift="error")
    obs = [{"role": "tool", "content": " 5 "}, {"role": "user", "content": "ok\n"}]
    episode(tok, fmt, [(THINK_CALL, TOOL), ("<think>x</think>y  ", obs), ("x <|", FEEDBACK), (THINK_ANSWER, None)])
    assert fmt.drift_turns == 0
