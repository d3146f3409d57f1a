"""Text and message-list spaces (agentgym/spaces.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.spaces import Space
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.spaces import ROLES, MessageList, UnicodeText


# --------------------------------------------------------------------------- UnicodeText
def test_unicode_text_is_a_gymnasium_space():
    s = UnicodeText(max_length=10)
    assert isinstance(s, Space)
    assert not s.is_np_flattenable
    assert s == UnicodeText(max_length=10)
    assert s != UnicodeText(max_length=11)
    assert s != UnicodeText(max_length=10, min_length=1)
    assert repr(s) == "UnicodeText(max_length=10)"
    assert s.to_jsonable(["a", "é"]) == ["a", "é"] and s.from_jsonable(["a"]) == ["a"]


@pytest.mark.parametrize("text", ["", "plain", "中文 ünïcödé", "😀" * 5, "\x00\n\t", "\u200b\ufeff", "\U0010ffff", "\ud7ff\ue000"])
def test_unicode_text_accepts_any_unicode(text):
    assert UnicodeText(max_length=100).contains(text)
    assert text in UnicodeText(max_length=100)


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb", "\udc80" * 3])
def test_unicode_text_rejects_lone_surrogates(text):
    assert not UnicodeText().contains(text)


@pytest.mark.parametrize("value", [b"bytes", 5, None, ["a"], 3.0])
def test_unicode_text_rejects_non_str(value):
    assert not UnicodeText().contains(value)


def test_unicode_text_length_bounds():
    s = UnicodeText(max_length=5, min_length=2)
    assert s.contains("ab") and s.contains("abcde")
    assert not s.contains("a") and not s.contains("abcdef")
    assert UnicodeText(max_length=3).contains("😀😀😀")      # characters, not bytes
    with pytest.raises(ValueError):
        UnicodeText(max_length=1, min_length=2)
    with pytest.raises(ValueError):
        UnicodeText(max_length=5, min_length=-1)


def test_unicode_text_sample_in_space_and_bounded():
    for max_length, min_length in [(0, 0), (1, 0), (5, 5), (20, 3), (32_768, 0)]:
        s = UnicodeText(max_length=max_length, min_length=min_length, seed=0)
        for _ in range(50):
            x = s.sample()
            assert isinstance(x, str) and s.contains(x)
            assert len(x) <= min(max_length, 256)
    with pytest.raises(ValueError):
        UnicodeText().sample(mask=np.ones(3))


def test_unicode_text_seed_determinism():
    assert UnicodeText(seed=123).sample() == UnicodeText(seed=123).sample()
    s = UnicodeText()
    s.seed(7)
    first = [s.sample() for _ in range(5)]
    s.seed(7)
    assert [s.sample() for _ in range(5)] == first
    s.seed(8)
    assert [s.sample() for _ in range(5)] != first
    g1, g2 = UnicodeText(seed=np.random.default_rng(3)), UnicodeText(seed=np.random.default_rng(3))
    assert [g1.sample() for _ in range(3)] == [g2.sample() for _ in range(3)]


def test_unicode_text_samples_exercise_markup_and_unicode():
    s = UnicodeText(seed=0)
    joined = "".join(s.sample() for _ in range(200))
    assert "<answer>" in joined or "<tool_call>" in joined
    assert any(ord(c) > 127 for c in joined)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=50))
def test_unicode_text_contains_all_hypothesis_text(text):
    assert UnicodeText(max_length=50).contains(text)


# --------------------------------------------------------------------------- MessageList
def test_message_list_is_a_gymnasium_space():
    s = MessageList()
    assert isinstance(s, Space)
    assert s.roles == ROLES == ("system", "user", "assistant", "tool")
    assert not s.is_np_flattenable
    assert s == MessageList() and s != MessageList(roles=("user",))
    msgs = [{"role": "user", "content": "x"}]
    assert s.from_jsonable(s.to_jsonable([msgs])) == [msgs]


def test_message_list_accepts_valid_messages():
    s = MessageList()
    assert s.contains([])
    assert s.contains([{"role": r, "content": "hi 中文 😀"} for r in ROLES])
    assert s.contains([{"role": "tool", "content": "", "name": "calculator", "tool_call_id": "c1"}])


@pytest.mark.parametrize("msgs", [
    [{"role": "bot", "content": "x"}],
    [{"role": "USER", "content": "x"}],
    [{"content": "x"}],
    [{"role": "user"}],
    [{"role": "user", "content": 5}],
    [{"role": "user", "content": None}],
    [{"role": "user", "content": ["x"]}],
    [{"role": "user", "content": b"x"}],
    [{"role": "user", "content": "lone \ud800 surrogate"}],
    [{"role": "user", "content": "x", 1: "non-str key"}],
    [("user", "x")],
    ["user: x"],
    ({"role": "user", "content": "x"},),  # a tuple, not a list
    {"role": "user", "content": "x"},
    "x",
    None,
])
def test_message_list_rejects_bad_messages(msgs):
    assert not MessageList().contains(msgs)


def test_message_list_limits_and_custom_roles():
    s = MessageList(roles=("user", "assistant"), max_messages=2, max_content_length=3)
    assert s.contains([{"role": "user", "content": "abc"}, {"role": "assistant", "content": ""}])
    assert not s.contains([{"role": "user", "content": "a"}] * 3)
    assert not s.contains([{"role": "user", "content": "abcd"}])
    assert not s.contains([{"role": "system", "content": "a"}])


def test_message_list_sample_and_seed_determinism():
    s = MessageList(seed=0)
    for _ in range(50):
        x = s.sample()
        assert s.contains(x) and 1 <= len(x) <= 4
    assert MessageList(seed=5).sample() == MessageList(seed=5).sample()
    s.seed(11)
    first = [s.sample() for _ in range(3)]
    s.seed(11)
    assert [s.sample() for _ in range(3)] == first
    s.seed(12)
    assert [s.sample() for _ in range(3)] != first
    with pytest.raises(ValueError):
        s.sample(mask=1)


def test_message_list_generator_seed_determinism():
    a = MessageList(seed=np.random.default_rng(0))
    b = MessageList(seed=np.random.default_rng(0))
    assert [a.sample() for _ in range(3)] == [b.sample() for _ in range(3)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": st.text()}), max_size=5))
def test_message_list_contains_hypothesis_messages(msgs):
    assert MessageList().contains(msgs)
