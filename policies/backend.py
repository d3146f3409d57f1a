"""The Backend interface, as the ``policies`` package names it.

The classes are defined in the kernel (:mod:`agentgym.backend`), so the rollout engine needs nothing from
this package; backends subclass them from either path (``from agentgym.policies.backend import
TokenBackend`` keeps working, as the docs show).
"""

from agentgym.backend import Backend, ChatBackend, ProtocolBackend, TokenBackend, as_backend, tokenizer_of

__all__ = ["Backend", "TokenBackend", "ChatBackend", "ProtocolBackend", "as_backend", "tokenizer_of"]
