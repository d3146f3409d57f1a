"""Retrievers for search environments: dense (sentence-transformers + faiss), BM25 (bm25s), and a
client/server pair speaking Search-R1's ``/retrieve`` protocol (served in the background by the kernel's
:class:`agentgym.http_server.BackgroundServer`); :func:`get_retriever` resolves an env's ``retriever=``
argument and shares one instance per process.

Heavy modules (torch, faiss, bm25s, fastapi) load on first use of a name that needs them, so an
env that only takes a ``Retriever`` does not pay for them at import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import DEFAULT_TOPK, Corpus, Hit, Retriever, format_passages, iter_jsonl
from .build import build_index, load_retriever
from .shared import get_retriever
from .synthetic import SyntheticQuestion, synthetic_corpus

if TYPE_CHECKING:
    from .dense import DenseRetriever, default_model_path, shared_encoder
    from .prebuilt import SearchR1IndexRetriever
    from .remote import RemoteRetriever
    from .server import DEFAULT_MAX_REQUEST_BYTES, create_app, serve
    from .sparse import BM25Retriever

_LAZY = {
    "DenseRetriever": ".dense",
    "default_model_path": ".dense",
    "shared_encoder": ".dense",
    "BM25Retriever": ".sparse",
    "RemoteRetriever": ".remote",
    "SearchR1IndexRetriever": ".prebuilt",
    "create_app": ".server",
    "serve": ".server",
    "DEFAULT_MAX_REQUEST_BYTES": ".server",
}

__all__ = [
    "DEFAULT_TOPK",
    "Corpus",
    "Hit",
    "Retriever",
    "iter_jsonl",
    "format_passages",
    "build_index",
    "load_retriever",
    "get_retriever",
    "SyntheticQuestion",
    "synthetic_corpus",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
