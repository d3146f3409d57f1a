"""Gymnasium spaces for LLM environments.

Gymnasium's :class:`~gymnasium.spaces.Text` only holds strings over a fixed character set, so
it cannot represent a model's output (any Unicode). These spaces are proper
:class:`gymnasium.spaces.Space` subclasses, so ``check_env``, wrappers and vector envs accept them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from gymnasium.spaces import Space

__all__ = ["UnicodeText", "MessageList", "Message", "ROLES"]

Message = dict[str, str]
ROLES = ("system", "user", "assistant", "tool")

# Characters used by ``sample``: printable ASCII, whitespace, markup that env parsers react to,
# and a few multi-byte code points so that samples exercise real Unicode handling.
_SAMPLE_ALPHABET = (
    [chr(c) for c in range(32, 127)]
    + ["\n", "\t", "é", "ß", "中", "文", "😀", "→", "\u200b"]
)
_SAMPLE_SNIPPETS = ("<answer>", "</answer>", "<search>", "</search>", "<tool_call>", "</tool_call>",
                    "{", "}", '"name"', "```python\n", "```", "\\boxed{", "Action:", "Final Answer:")


class UnicodeText(Space[str]):
    """Any UTF-8-encodable string of at most ``max_length`` characters.

    ``max_length`` bounds what an env accepts as one action; an env is expected to *handle*
    longer strings (as an invalid action), not to crash on them.
    """

    def __init__(self, max_length: int = 32_768, min_length: int = 0, seed: int | np.random.Generator | None = None):
        if not 0 <= min_length <= max_length:
            raise ValueError(f"need 0 <= min_length <= max_length, got {min_length}, {max_length}")
        self.max_length = int(max_length)
        self.min_length = int(min_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str:
        """A random string mixing characters and markup snippets (length <= min(max_length, 256))."""
        if mask is not None or probability is not None:
            raise ValueError("UnicodeText.sample does not support masks or probabilities")
        hi = min(self.max_length, 256)
        length = int(self.np_random.integers(self.min_length, max(hi, self.min_length) + 1))
        out: list[str] = []
        while sum(map(len, out)) < length:
            if self.np_random.random() < 0.15:
                out.append(_SAMPLE_SNIPPETS[int(self.np_random.integers(len(_SAMPLE_SNIPPETS)))])
            else:
                out.append(_SAMPLE_ALPHABET[int(self.np_random.integers(len(_SAMPLE_ALPHABET)))])
        text = "".join(out)[:length]
        return text

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates
            return False
        return True

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, UnicodeText) and other.max_length == self.max_length
                and other.min_length == self.min_length)

    def to_jsonable(self, sample_n: Sequence[str]) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: list[str]) -> list[str]:
        return list(sample_n)


class MessageList(Space[list]):
    """A list of chat messages ``{"role": str, "content": str}`` (OpenAI / HF chat format).

    Messages may carry extra string-keyed fields (``name``, ``tool_call_id``); ``role`` must be one
    of ``roles`` and ``content`` a UTF-8 string.
    """

    def __init__(self, roles: Sequence[str] = ROLES, max_messages: int = 1_024,
                 max_content_length: int = 1_000_000, seed: int | np.random.Generator | None = None):
        self.roles = tuple(roles)
        self.max_messages = int(max_messages)
        self._content = UnicodeText(max_length=max_content_length)
        super().__init__(shape=None, dtype=None, seed=seed)
        if isinstance(seed, np.random.Generator):  # Space.__init__ adopts a Generator without calling seed()
            self._content.seed(int(self.np_random.integers(2**31)))

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def seed(self, seed: int | None = None) -> int:
        out = super().seed(seed)
        self._content.seed(int(self.np_random.integers(2**31)))
        return out

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> list[Message]:
        if mask is not None or probability is not None:
            raise ValueError("MessageList.sample does not support masks or probabilities")
        n = int(self.np_random.integers(1, min(self.max_messages, 4) + 1))
        return [{"role": self.roles[int(self.np_random.integers(len(self.roles)))],
                 "content": self._content.sample()} for _ in range(n)]

    def contains(self, x: Any) -> bool:
        if not isinstance(x, list) or len(x) > self.max_messages:
            return False
        for m in x:
            if not isinstance(m, dict) or m.get("role") not in self.roles:
                return False
            if not self._content.contains(m.get("content")):
                return False
            if not all(isinstance(k, str) for k in m):
                return False
        return True

    def __repr__(self) -> str:
        return f"MessageList(roles={self.roles})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MessageList) and other.roles == self.roles and other.max_messages == self.max_messages

    def to_jsonable(self, sample_n: Sequence[list[Message]]) -> list[list[Message]]:
        return [list(s) for s in sample_n]

    def from_jsonable(self, sample_n: list[list[Message]]) -> list[list[Message]]:
        return [list(s) for s in sample_n]
