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

**Token kinds.** :meth:`Formatter.observation_ids` returns :class:`~agentgym.trajectory.TokenIds`:
the ids, plus each id's kind (:data:`~agentgym.trajectory.TOKEN_KINDS`). A message's text gets the
message's kind (:func:`message_kind`: ``tool``, ``retrieved`` or ``env``); everything the template
adds around it (role headers, end-of-turn tokens, the closing of the policy's turn, the next
generation prompt) is ``template``. Kinds are located on characters and carried to tokens by the
tokenizer's offsets, so the ids are exactly what plain ``encode`` gives.

**Thinking templates and drift.** Some templates rewrite history: Qwen3-style templates drop the
``<think>…</think>`` block of earlier assistant turns once a new user turn follows. Rendering
against the fixed reference keeps formatting append-only with them (only the reference assistant
turn is rendered differently, and nothing of it is emitted). But the ids we hold then differ from
what the template would render for the same conversation at inference. When the caller passes the
episode so far (``history=``), the formatter compares the two on every turn and acts as
``on_template_drift`` says:

* ``"keep"`` (default): keep the sampled history verbatim — the trajectory trains exactly what was
  sampled and what the policy was conditioned on, even though the template at inference would
  have dropped the thinking. Drift is counted (``Formatter.drift_turns``) and logged once per
  template.
* ``"error"``: raise :class:`TemplateDriftError` (name the turn and show both texts).
* ``"segment"`` (start a new training sequence from the re-rendered history): **not built** — it
  needs trajectories made of several token sequences (batching, per-turn credit and group
  normalisation across segments), which the trajectory format does not have. Asking for it raises.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

from agentgym.trajectory import SAMPLED_KINDS, TOKEN_KINDS, TokenIds

__all__ = ["Formatter", "ChatFormatter", "ContinuationFormatter", "make_formatter", "message_kind",
           "TemplateDriftError", "DRIFT_POLICIES", "RETRIEVAL_TOOL_NAMES"]

log = logging.getLogger(__name__)

_SENTINEL = "\uE000agentgym-sentinel\uE001"
_REFERENCE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]

#: What a formatter does when the template would render the history differently from the ids held.
DRIFT_POLICIES = ("keep", "error", "segment")
#: Tools whose output is retrieved text (``retrieved`` kind) rather than a computation (``tool``):
#: Search-R1 / SearchQA's ``search``, ReAct's ``search`` and ``lookup``.
RETRIEVAL_TOOL_NAMES = frozenset({"search", "lookup", "retrieve"})
_ENV_KINDS = frozenset(TOKEN_KINDS) - SAMPLED_KINDS - {"prompt", "template"}
_DRIFT_LOGGED: set[str] = set()  # chat templates whose drift was logged (keep mode logs once per template)


class TemplateDriftError(ValueError):
    """The chat template renders the conversation differently from the ids held (``on_template_drift="error"``)."""


def message_kind(message: dict[str, Any]) -> str:
    """The kind of an environment message's text: ``tool``, ``retrieved`` or ``env``.

    An explicit ``"kind"`` field on the message wins (an env may label its messages). Otherwise: a
    message that is a Search-R1 ``<information>…</information>`` block (how SearchQA returns
    passages) or the output of a retrieval tool (:data:`RETRIEVAL_TOOL_NAMES`; SearchQA's chat
    protocol, ReAct) is ``retrieved``; any other ``tool`` / ``ipython`` message is ``tool``;
    everything else (feedback, error messages as ``user`` turns) is ``env``.
    """
    kind = message.get("kind")
    if kind in _ENV_KINDS:
        return str(kind)
    content = str(message.get("content", "")).strip()
    if content.startswith("<information>") and content.endswith("</information>"):
        return "retrieved"
    if message.get("role") in ("tool", "ipython"):
        return "retrieved" if message.get("name") in RETRIEVAL_TOOL_NAMES else "tool"
    return "env"


def _content_sentinel(i: int) -> str:
    return f"\uE000agentgym-content-{i}\uE001"


class Formatter:
    """Base: observation truncation and the shared API. Use :func:`make_formatter`."""

    style = "base"

    def __init__(self, tokenizer: Any, *, max_obs_tokens: int | None = None,
                 truncation_marker: str = "\n[observation truncated to {n} tokens]\n",
                 on_template_drift: str = "keep"):
        if max_obs_tokens is not None and max_obs_tokens < 1:
            raise ValueError("max_obs_tokens must be >= 1 or None")
        if on_template_drift not in DRIFT_POLICIES:
            raise ValueError(f"on_template_drift must be one of {DRIFT_POLICIES}, got {on_template_drift!r}")
        if on_template_drift == "segment":
            raise NotImplementedError(
                "on_template_drift='segment' is not built: a new training segment needs trajectories made of "
                "several token sequences, which agentgym's Trajectory is not. Use 'keep' (train exactly what was "
                "sampled) or 'error' (fail on drift).")
        self.tokenizer = tokenizer
        self.max_obs_tokens = max_obs_tokens
        self.truncation_marker = truncation_marker
        self.on_template_drift = on_template_drift
        self.drift_turns = 0  # turns whose history the template would have rendered differently

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of ``ids`` (special tokens kept, no clean-up of spaces)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def encode_with_kinds(self, text: str, spans: Sequence[tuple[int, int, str]], default: str = "template") -> TokenIds:
        """``encode(text)`` with each token's kind: the kind of the character span ``(start, end, kind)``
        the token overlaps (``default`` for tokens outside every span). The ids are exactly
        ``encode(text)``'s; kinds come from the tokenizer's character offsets."""
        if not text:
            return TokenIds()
        char_kind = [default] * len(text)
        for start, end, kind in spans:
            char_kind[start:end] = [kind] * (end - start)
        ids, offsets = self._encode_offsets(text)
        kinds = []
        for a, b in offsets:
            inside = [k for k in char_kind[a:b] if k != default]
            kinds.append(inside[0] if inside else (char_kind[a] if a < len(text) else default))
        return TokenIds(ids, kinds)

    def _encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        try:  # fast tokenizers: one pass gives ids and character offsets
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
            if len(ids) == len(offsets):
                return ids, offsets
        except (NotImplementedError, TypeError, KeyError, ValueError):
            pass
        ids = self.encode(text)  # slow tokenizers: offsets from growing decoded prefixes
        offsets, prev = [], 0
        for k in range(len(ids)):
            end = min(len(text), len(self.decode(ids[:k + 1])))
            offsets.append((prev, max(prev, end)))
            prev = max(prev, end)
        return ids, offsets

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
                        tools: Sequence[dict[str, Any]] | None = None, *, history: Any = None) -> TokenIds:
        """Ids appended after a policy turn: closing glue, the new messages, the next generation prompt,
        with each id's kind (``.kinds``).

        ``history`` — the episode so far, an object with ``token_ids`` (the ids held, the policy's
        last turn included) and ``messages`` (the conversation so far, that turn's message included),
        e.g. the episode's :class:`~agentgym.trajectory.TrajectoryBuilder` — turns on template-drift
        detection (chat style; see the module docstring).
        """
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
        self._reference_cache: dict[tuple[str, str], str] = {}

    def _render(self, messages: Sequence[dict[str, str]], tools: Sequence[dict[str, Any]] | None,
                generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation_prompt}
        if tools and _template_supports_tools(self.tokenizer):
            kwargs["tools"] = list(tools)
        return self.tokenizer.apply_chat_template([dict(m) for m in messages], **kwargs)

    def _delta(self, new: Sequence[dict[str, str]], tools: Sequence[dict[str, Any]] | None) -> str:
        """The text the template adds after the reference assistant turn for ``new`` messages and the
        next generation prompt (the closing of that turn excluded).

        Append-only templates: the reference rendered with the new messages extends the reference
        rendered without them. Templates that render an earlier assistant turn differently once
        something follows it (Qwen3 drops its ``<think>`` block, or the empty one it adds to a last
        assistant turn) are accepted too, provided everything before that turn is unchanged and
        its closing is the same: the text after it is then still well defined.
        """
        base = _REFERENCE + [{"role": "assistant", "content": _SENTINEL}]
        before = self._reference_text(base, tools)
        after = self._render(base + [dict(m) for m in new], tools, generation_prompt=True)
        if after.startswith(before):
            return after[len(before):]
        head = self._reference_text(_REFERENCE, tools)
        i, j = before.rfind(_SENTINEL), after.rfind(_SENTINEL)
        closing = before[i + len(_SENTINEL):] if i >= 0 else None
        tail = after[j + len(_SENTINEL):] if j >= 0 else ""
        if not (before.startswith(head) and after.startswith(head) and closing is not None
                and tail.startswith(closing)):
            raise ValueError("this chat template is not append-only (rendering more messages changes the "
                             "earlier text); use style='continuation' with it")
        return tail[len(closing):]

    def _reference_text(self, messages: list[dict[str, str]], tools: Sequence[dict[str, Any]] | None) -> str:
        """The template applied to a fixed reference conversation, cached (it never changes for given tools)."""
        key = (json.dumps(messages), json.dumps(tools, sort_keys=True, default=str) if tools else "")
        if key not in self._reference_cache:
            self._reference_cache[key] = self._render(messages, tools, generation_prompt=False)
        return self._reference_cache[key]

    def _content_spans(self, delta: str, messages: Sequence[dict[str, str]],
                       tools: Sequence[dict[str, Any]] | None) -> list[tuple[int, int, str]]:
        """Where each message's text sits in ``delta``, as ``(start, end, kind)``.

        The template is rendered once more with a sentinel for each message's content; the text
        between sentinels is template glue, and the real contents (however the template changed
        them, e.g. trimmed) fill the gaps. If that alignment fails, each content is searched for in
        order; a content not found is left to the template kind.
        """
        if not messages:
            return []
        kinds = [message_kind(m) for m in messages]
        try:
            skeleton = self._delta([{**m, "content": _content_sentinel(k)} for k, m in enumerate(messages)], tools)
        except ValueError:  # the template treats the sentinels unlike the real contents: search instead
            skeleton = ""
        pieces, rest = [], skeleton
        for k in range(len(messages)):
            cut = rest.find(_content_sentinel(k))
            if cut < 0:
                break
            pieces.append(rest[:cut])
            rest = rest[cut + len(_content_sentinel(k)):]
        else:
            pieces.append(rest)
            spans = _align(delta, pieces)
            if spans is not None:
                return [(s, e, kind) for (s, e), kind in zip(spans, kinds)]
        out, cursor = [], 0
        for m, kind in zip(messages, kinds):
            for text in (str(m.get("content", "")), str(m.get("content", "")).strip()):
                at = delta.find(text, cursor) if text else -1
                if at >= 0:
                    out.append((at, at + len(text), kind))
                    cursor = at + len(text)
                    break
        return out

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

    def observation_ids(self, generation_ids, messages, tools=None, *, history=None):
        closing = self.assistant_closing(tools)
        glue = closing[self._sampled_closing_chars(generation_ids, closing):]
        messages = [dict(m) for m in messages]
        new_text = self._delta(messages, tools)
        spans = [(len(glue) + s, len(glue) + e, kind) for s, e, kind in self._content_spans(new_text, messages, tools)]
        out = self.encode_with_kinds(glue + new_text, spans)
        if history is not None:
            self.check_drift(history, messages, out, tools)
        return out

    def check_drift(self, history: Any, messages: Sequence[dict[str, str]], new_ids: Sequence[int],
                    tools: Sequence[dict[str, Any]] | None = None) -> str | None:
        """Compare what the template renders for the whole conversation (``history.messages`` +
        ``messages``, with the next generation prompt) with the ids held (``history.token_ids`` +
        ``new_ids``). Returns None when they agree, else a description of the first difference —
        after acting on it as ``on_template_drift`` says (count and log once, or raise).

        Compared as text: the policy's ids need not be the canonical tokenization of its text, and
        that is no drift. Text the tokenizer cannot represent (bytes missing from its vocabulary) is
        compared as the tokenizer round-trips it.
        """
        held = self.decode(list(history.token_ids) + list(new_ids))
        rendered = self._render(list(history.messages) + [dict(m) for m in messages], tools, generation_prompt=True)
        if held == rendered or held == self.decode(self.encode(rendered)):
            return None
        at = next((k for k, (a, b) in enumerate(zip(held, rendered)) if a != b), min(len(held), len(rendered)))
        turn = sum(m.get("role") == "assistant" for m in history.messages)
        what = (f"after turn {turn - 1}, the chat template renders the conversation differently from the ids held, "
                f"from character {at}: held {held[max(0, at - 40):at + 60]!r} vs template "
                f"{rendered[max(0, at - 40):at + 60]!r}")
        if self.on_template_drift == "error":
            raise TemplateDriftError(what + " (on_template_drift='error'; 'keep' trains on the sampled history as is)")
        self.drift_turns += 1
        template = str(getattr(self.tokenizer, "chat_template", ""))
        if template not in _DRIFT_LOGGED:  # a rollout engine makes a formatter per collect: once per template
            _DRIFT_LOGGED.add(template)
            log.warning("template drift: %s. Keeping the sampled history verbatim (on_template_drift='keep'): the "
                        "trajectory trains exactly what was sampled; the template at inference would render the "
                        "history differently (e.g. without earlier <think> blocks). Logged once per template.", what)
        return what


def _align(text: str, pieces: Sequence[str]) -> list[tuple[int, int]] | None:
    """Spans of the gaps when ``text`` = pieces[0] + gap_1 + pieces[1] + … + gap_n + pieces[n]; None
    when ``text`` is not of that form (or a gap's end is ambiguous: an empty piece between gaps)."""
    if not (text.startswith(pieces[0]) and text.endswith(pieces[-1])) or len(text) < len(pieces[0]) + len(pieces[-1]):
        return None
    spans, pos, last_end = [], len(pieces[0]), len(text) - len(pieces[-1])
    for k in range(1, len(pieces)):
        if k == len(pieces) - 1:
            end = last_end
        elif not pieces[k]:
            return None
        else:
            end = text.find(pieces[k], pos, last_end)
        if end < pos:
            return None
        spans.append((pos, end))
        pos = end + len(pieces[k])
    return spans


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

    def observation_ids(self, generation_ids, messages, tools=None, *, history=None):
        # raw text, no template: each message's characters carry its kind; nothing can drift
        spans, pos = [], 0
        for m in messages:
            spans.append((pos, pos + len(m["content"]), message_kind(m)))
            pos += len(m["content"])
        return self.encode_with_kinds("".join(m["content"] for m in messages), spans)


def make_formatter(style: str, tokenizer: Any, **kwargs: Any) -> Formatter:
    styles = {"chat": ChatFormatter, "continuation": ContinuationFormatter}
    if style not in styles:
        raise ValueError(f"unknown formatter style {style!r}; choose from {sorted(styles)}")
    return styles[style](tokenizer, **kwargs)
