"""Formatter: episode messages → token ids, append-only.

Two styles (docs/architecture.md, Formatter contract):

* ``chat`` — every env message is a chat turn rendered with the tokenizer's chat template; a
  generation prompt precedes each policy turn. New turns are rendered as the *difference* between
  the template applied to a fixed reference conversation with and without them, so earlier ids are
  never re-tokenized and the policy's sampled ids stay exactly as sampled. The assistant turn's
  closing (e.g. ``<|im_end|>\\n``) is appended as environment tokens unless the policy already
  sampled it (its EOS).
* ``continuation`` — the prompt is rendered once (chat template if there is one); afterwards env
  text is appended raw into the running sequence, as Search-R1 does.

Observations longer than ``max_obs_tokens`` (per step, all new messages together) are cut, and
``truncation_marker`` is appended so the policy can see it happened.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["Formatter", "ChatFormatter", "ContinuationFormatter", "make_formatter"]

_SENTINEL = "\uE000agentgym-sentinel\uE001"
_REFERENCE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]


class Formatter:
    """Base: observation truncation and the shared API. Use :func:`make_formatter`."""

    style = "base"

    def __init__(self, tokenizer: Any, *, max_obs_tokens: int | None = None,
                 truncation_marker: str = "\n[observation truncated to {n} tokens]\n"):
        if max_obs_tokens is not None and max_obs_tokens < 1:
            raise ValueError("max_obs_tokens must be >= 1 or None")
        self.tokenizer = tokenizer
        self.max_obs_tokens = max_obs_tokens
        self.truncation_marker = truncation_marker

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def truncate(self, messages: Sequence[dict[str, str]]) -> tuple[list[dict[str, str]], bool]:
        """Cut the step's messages to ``max_obs_tokens`` tokens in total (in order)."""
        if self.max_obs_tokens is None:
            return [dict(m) for m in messages], False
        budget, out, cut = self.max_obs_tokens, [], False
        for m in messages:
            ids = self.encode(m["content"])
            if len(ids) > budget:
                m = {**m, "content": self.tokenizer.decode(ids[:budget]) + self.truncation_marker.format(n=self.max_obs_tokens)}
                cut = True
                budget = 0
            else:
                budget -= len(ids)
            out.append(dict(m))
        return out, cut

    # -- API
    def prompt_ids(self, messages: Sequence[dict[str, str]], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        raise NotImplementedError

    def observation_ids(self, generation_ids: Sequence[int], messages: Sequence[dict[str, str]],
                        tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """Ids appended after a policy turn: closing glue, the new messages, the next generation prompt."""
        raise NotImplementedError


def _template_supports_tools(tokenizer: Any) -> bool:
    tmpl = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in tmpl


class ChatFormatter(Formatter):
    style = "chat"

    def __init__(self, tokenizer: Any, **kwargs: Any):
        super().__init__(tokenizer, **kwargs)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the chat style needs a tokenizer with a chat template; use style='continuation' "
                             "for base models")
        self._closing_cache: dict[bool, str] = {}

    def _render(self, messages: Sequence[dict[str, str]], tools: Sequence[dict[str, Any]] | None,
                generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation_prompt}
        if tools and _template_supports_tools(self.tokenizer):
            kwargs["tools"] = list(tools)
        return self.tokenizer.apply_chat_template([dict(m) for m in messages], **kwargs)

    def _delta(self, base: list[dict[str, str]], new: Sequence[dict[str, str]],
               tools: Sequence[dict[str, Any]] | None) -> str:
        before = self._render(base, tools, generation_prompt=False)
        after = self._render(base + [dict(m) for m in new], tools, generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("this chat template is not append-only (rendering more messages changes the "
                             "earlier text); use style='continuation' with it")
        return after[len(before):]

    def assistant_closing(self, tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The text a template puts after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        key = bool(tools)
        if key not in self._closing_cache:
            text = self._render(_REFERENCE + [{"role": "assistant", "content": _SENTINEL}], tools, False)
            i = text.rfind(_SENTINEL)
            if i < 0:
                raise ValueError("the chat template drops assistant content; cannot format append-only")
            self._closing_cache[key] = text[i + len(_SENTINEL):]
        return self._closing_cache[key]

    def prompt_ids(self, messages, tools=None):
        return self.encode(self._render(messages, tools, generation_prompt=True))

    def _sampled_closing_chars(self, generation_ids: Sequence[int], closing: str) -> int:
        """How many characters of ``closing`` the policy already sampled as tokens (e.g. its EOS).

        Matched on token ids, and only when the generation ends with a special token: a reply whose
        *text* merely ends like the closing (``"... <"``) must still get the whole closing, or the
        end-of-turn token would be spelled out as plain-text pieces.
        """
        gen = list(generation_ids)
        if not gen or gen[-1] not in set(getattr(self.tokenizer, "all_special_ids", ())):
            return 0
        closing_ids = self.encode(closing)
        for k in range(min(len(gen), len(closing_ids)), 0, -1):
            if gen[-k:] == closing_ids[:k]:
                done = self.tokenizer.decode(closing_ids[:k], skip_special_tokens=False)
                if closing.startswith(done):
                    return len(done)
        return 0

    def observation_ids(self, generation_ids, messages, tools=None):
        closing = self.assistant_closing(tools)
        glue = closing[self._sampled_closing_chars(generation_ids, closing):]
        base = _REFERENCE + [{"role": "assistant", "content": _SENTINEL}]
        new_text = self._delta(base, messages, tools)
        return self.encode(glue + new_text)


class ContinuationFormatter(Formatter):
    style = "continuation"

    def prompt_ids(self, messages, tools=None):
        if getattr(self.tokenizer, "chat_template", None):
            kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
            if tools and _template_supports_tools(self.tokenizer):
                kwargs["tools"] = list(tools)
            text = self.tokenizer.apply_chat_template([dict(m) for m in messages], **kwargs)
            return self.encode(text)
        ids = self.encode("\n".join(m["content"] for m in messages))
        bos = getattr(self.tokenizer, "bos_token_id", None)
        return ([bos] if bos is not None else []) + ids

    def observation_ids(self, generation_ids, messages, tools=None):
        return self.encode("".join(m["content"] for m in messages))


def make_formatter(style: str, tokenizer: Any, **kwargs: Any) -> Formatter:
    styles = {"chat": ChatFormatter, "continuation": ContinuationFormatter}
    if style not in styles:
        raise ValueError(f"unknown formatter style {style!r}; choose from {sorted(styles)}")
    return styles[style](tokenizer, **kwargs)
