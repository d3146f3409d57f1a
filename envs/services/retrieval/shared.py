"""One retriever per (spec, corpus) per process, shared by every env that asks for it.

Envs (SearchQA, ReAct, ...) ask this module for their retriever and never build one themselves
nor import each other for it: a dense index over the same corpus is built once (the encoder and
the faiss index are the expensive part), however many envs or env types use it.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

__all__ = ["get_retriever"]

_RETRIEVERS: dict[Any, Any] = {}
_LOCK = threading.Lock()


def get_retriever(spec: Any, corpus: Sequence[Mapping[str, str]] | None, corpus_key: Hashable) -> Any:
    """Resolve ``retriever=`` once per process.

    An object with ``search`` is used as is; ``"dense"`` / ``"bm25"`` build an in-process index over
    ``corpus`` (cached under ``(spec, corpus_key)``: envs over the same corpus pass the same key);
    ``"http://…"`` is a Search-R1 retrieval server; any other string is an index directory written by
    ``agentgym retriever build-index``; a mapping ``{"index", "corpus", "model", ...}`` is a faiss file
    built by Search-R1 (``e5_Flat.index``) with its corpus (:mod:`.prebuilt`).
    """
    if hasattr(spec, "search"):
        return spec
    key = (_hashable(spec), corpus_key)
    with _LOCK:
        if key not in _RETRIEVERS:
            _RETRIEVERS[key] = _build(spec, corpus)
        return _RETRIEVERS[key]


def _hashable(spec: Any) -> Hashable:
    return tuple(sorted((str(k), str(v)) for k, v in spec.items())) if isinstance(spec, Mapping) else spec


def _build(spec: Any, corpus: Sequence[Mapping[str, str]] | None) -> Any:
    from . import BM25Retriever, DenseRetriever, RemoteRetriever, load_retriever
    if isinstance(spec, Mapping):
        from .prebuilt import from_spec
        return from_spec(spec)
    if spec in ("dense", "bm25"):
        if corpus is None:
            raise ValueError(f"retriever={spec!r} needs a corpus")
        return (DenseRetriever if spec == "dense" else BM25Retriever)().build(list(corpus))
    if isinstance(spec, str) and spec.startswith(("http://", "https://")):
        return RemoteRetriever(spec)
    if isinstance(spec, str):
        return load_retriever(spec)
    raise ValueError(f"retriever must be 'dense', 'bm25', a URL, an index directory, a mapping naming a Search-R1 "
                     f"faiss file ({{'index': ..., 'corpus': ..., 'model': ...}}) or an object with search(); "
                     f"got {spec!r}")
