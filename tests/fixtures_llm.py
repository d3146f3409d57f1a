"""Shared pieces for the token-level tests: the real SmolLM2 tokenizer, tiny random-weight policies,
and one precise checker of a trajectory's token faithfulness.

Imported by ``test_formatting.py``, ``test_rollout.py`` and ``test_transformers_policy.py`` with
``from fixtures_llm import ...`` (pytest puts ``tests/`` on ``sys.path``; it has no ``__init__.py``).
Loads are cached per process, so the tokenizer is read from disk once per test session.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import pytest
import torch

import agentgym
from agentgym.policies.models import load_tokenizer
from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.policy import Generation, SamplingParams
from agentgym.trajectory import Trajectory, check_trajectory

__all__ = ["ENV_IDS", "COVERAGE_ENV", "STYLES", "UNICODE_ACTIONS", "tok", "one_torch_thread", "single_threaded_math", "cached_tokenizer",
           "tiny_policy", "eos_prone_policy", "RecordingPolicy", "split_messages", "assert_faithful",
           "assert_snapshots_are_prefixes"]

ENV_IDS = agentgym.list_envs()   # every registered env, so new envs are covered automatically
# Invariants are asserted on every env. Coverage assertions (that a run really produced EOS, length and
# stop finishes, several turns, truncated observations) need an env whose dynamics the test knows:
# this one (multi-turn, long "invalid action" messages, max_turns=4).
COVERAGE_ENV = "agentgym/Arithmetic-v0"
STYLES = ("chat", "continuation")

# Actions that any env must survive: garbage, markup, a tool call, multi-byte text and emoji,
# text that ends like the start of the chat template's closing ("<", "<|"), a final answer.
UNICODE_ACTIONS = [
    "asdf qwer ]]}{ <<< garbage",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>',
    "Ünïcödé → 中文 😀🎉 \u200b done <",
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    "<tool_call>not json at all</tool_call> trailing <|",
    "<answer>42</answer>",
]


@functools.lru_cache(maxsize=None)
def cached_tokenizer() -> Any:
    return load_tokenizer()


@functools.lru_cache(maxsize=None)
def tiny_policy(seed: int = 0) -> TransformersPolicy:
    """A 2-layer random Llama (fp32, CPU) with the real tokenizer: realistic garbage tokens, fast."""
    return TransformersPolicy.tiny_random(cached_tokenizer(), seed=seed)


@functools.lru_cache(maxsize=None)
def eos_prone_policy(eos_logit: float = 7.5, seed: int = 0) -> TransformersPolicy:
    """A tiny random Llama whose output head has a bias towards EOS (a real model, just biased).

    Measured with this tokenizer: at 7.5, a batch sampling 8-12 tokens ends about a third of its
    replies by EOS, at different steps, and the rest by length; at 100, greedy decoding emits EOS
    first.
    """
    tok = cached_tokenizer()
    pol = TransformersPolicy.tiny_random(tok, seed=seed)
    head = pol.model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight = head.weight  # keep the tie with the input embeddings
    with torch.no_grad():
        biased.bias.zero_()
        biased.bias[tok.eos_token_id] = eos_logit
    pol.model.lm_head = biased
    return pol


@pytest.fixture(scope="session")
def tok() -> Any:
    return cached_tokenizer()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny matrices: thread start-up costs more than it saves, and on a busy 2-core runner OpenMP
    spin-waiting makes a 64-wide model ~10x slower with 2 threads. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class RecordingPolicy:
    """Delegates to a real policy and records every ``generate`` call (prompts, sampling, outputs)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.wants_context = getattr(inner, "wants_context", False)
        self.calls: list[tuple[list[list[int]], SamplingParams, list[Generation]]] = []

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, **kwargs: Any) -> list[Generation]:
        gens = self.inner.generate(prompts, sampling, **kwargs)
        self.calls.append(([list(p) for p in prompts], sampling, gens))
        return gens

    @property
    def batch_sizes(self) -> list[int]:
        return [len(p) for p, _, _ in self.calls]


# --------------------------------------------------------------------------- the checker

def split_messages(traj: Trajectory) -> tuple[list[dict], list[list[dict]]]:
    """(initial messages, env messages after each policy turn), cross-checked against ``actions``."""
    assistant_at = [i for i, m in enumerate(traj.messages) if m["role"] == "assistant"]
    assert [traj.messages[i]["content"] for i in assistant_at] == traj.actions
    bounds = assistant_at + [len(traj.messages)]
    initial = traj.messages[: bounds[0]]
    after = [traj.messages[bounds[k] + 1: bounds[k + 1]] for k in range(len(assistant_at))]
    return initial, after


def _render(tok: Any, messages: Sequence[dict], generation_prompt: bool) -> str:
    return tok.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=generation_prompt)


def _closing(tok: Any) -> str:
    probe = "\uE000probe\uE001"
    text = _render(tok, [{"role": "user", "content": "u"}, {"role": "assistant", "content": probe}], False)
    return text[text.rfind(probe) + len(probe):]


def assert_faithful(traj: Trajectory, tok: Any, style: str) -> None:
    """Every token-faithfulness property, asserted precisely.

    * ``check_trajectory`` finds nothing: mask 1 exactly on the policy spans, each span decodes to
      the text the env received; log-probs are 0 on environment tokens;
    * the environment segment after turn k decodes to exactly what the format prescribes for that
      turn's observation — chat: the template's rendering of the new messages plus the next
      generation prompt, preceded by the assistant closing minus what the policy sampled of it (its
      EOS); continuation: the raw concatenated message contents. So env text never sits in a
      loss-masked span, and every env message is in a mask-0 region;
    * the whole trajectory decodes to the rendered conversation: chat — ``apply_chat_template(
      messages)`` minus the final assistant closing that was not sampled (nothing of it is appended
      after the last turn; if the episode was cut by the context limit it ends with the generation
      prompt instead); continuation — the chat-rendered prompt followed by actions (with their EOS
      as sampled) and raw observations.
    """
    assert check_trajectory(traj, tok) == []
    n = len(traj.token_ids)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if m == 0)
    assert traj.prompt_length > 0 and set(traj.loss_mask[: traj.prompt_length]) <= {0}
    eos_text = tok.eos_token
    closing = _closing(tok)
    initial, after = split_messages(traj)
    assert len(after) == len(traj.turn_spans) == len(traj.finish_reasons)

    decode = functools.partial(tok.decode, skip_special_tokens=False)
    prompt_text = decode(traj.token_ids[: traj.prompt_length])
    assert prompt_text == _render(tok, initial, True), "prompt is not the chat-rendered task prompt"

    recon = prompt_text                # the expected decoding, built from texts the env saw
    history = list(initial)
    for k, ((s, e), action, reason, obs) in enumerate(zip(traj.turn_spans, traj.actions, traj.finish_reasons, after)):
        span = traj.token_ids[s:e]
        if reason == "eos":
            assert span and span[-1] == tok.eos_token_id, f"turn {k}: finish 'eos' but the span does not end with EOS"
        else:
            assert tok.eos_token_id not in span, f"turn {k}: EOS inside a {reason!r} span"
        piece = action + (eos_text if reason == "eos" else "")
        env_end = traj.turn_spans[k + 1][0] if k + 1 < len(traj.turn_spans) else n
        env_text = decode(traj.token_ids[e:env_end])
        history.append({"role": "assistant", "content": action})
        if style == "chat":
            before = _render(tok, history, False)
            history.extend(obs)
            if e == n:
                expected_env = ""      # the episode ended with this turn: nothing appended after it
            else:
                after_text = _render(tok, history, True)
                assert after_text.startswith(before), "the chat template is not append-only on this conversation"
                sampled_closing = eos_text if reason == "eos" and closing.startswith(eos_text) else ""
                assert before.endswith(action + closing)
                expected_env = closing[len(sampled_closing):] + after_text[len(before):]
        else:
            history.extend(obs)
            expected_env = "".join(m["content"] for m in obs)
        assert env_text == expected_env, f"turn {k}: env segment {env_text!r} != {expected_env!r}"
        for m in obs:  # every env message's text lives in a mask-0 region
            assert m["content"] in env_text
        recon += piece + env_text

    # direct decode equals the reconstruction when spans hold no special tokens besides a final EOS
    special = set(tok.all_special_ids)
    plain = all(t not in special for s, e in traj.turn_spans for t in traj.token_ids[s:e - 1])
    if plain:
        assert decode(traj.token_ids) == recon

    ended_on_policy = bool(traj.turn_spans) and traj.turn_spans[-1][1] == n
    if style == "chat":
        if ended_on_policy:
            last_eos = traj.finish_reasons[-1] == "eos"
            missing = closing[len(eos_text):] if last_eos else closing
            assert recon + missing == _render(tok, traj.messages, False)
        else:  # cut by the context limit after an observation: ends with the generation prompt
            assert recon == _render(tok, traj.messages, True)
    else:
        expected = _render(tok, initial, True) + "".join(
            a + (eos_text if r == "eos" else "") + "".join(m["content"] for m in obs)
            for a, r, obs in zip(traj.actions, traj.finish_reasons, after))
        assert recon == expected


def assert_snapshots_are_prefixes(prompts: Sequence[Sequence[int]], gens: Sequence[Generation],
                                  final_ids: Sequence[int]) -> None:
    """Append-only: prompt k+1 starts with prompt k + the ids sampled at turn k; so does the final trajectory."""
    assert len(prompts) == len(gens) >= 1
    for k in range(len(prompts)):
        head = list(prompts[k]) + list(gens[k].token_ids)
        nxt = list(prompts[k + 1]) if k + 1 < len(prompts) else list(final_ids)
        assert nxt[: len(head)] == head, f"turn {k}: earlier ids changed"
        assert len(nxt) >= len(head)


@pytest.fixture(scope="module", autouse=True)
def single_threaded_math():
    """One torch and one faiss thread for a module (retrieval tests). On a shared 2-core runner
    OpenMP spin-waiting makes one-query encodes ~5-6x slower with 2 threads (measured); results do
    not depend on the thread count. Restored afterwards."""
    import faiss

    torch_threads, faiss_threads = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    yield
    torch.set_num_threads(torch_threads)
    faiss.omp_set_num_threads(faiss_threads)
