"""BM25 over the corpus ``contents`` (title line + text) with ``bm25s``.

Search-R1's sparse baseline is Lucene BM25 through pyserini (arXiv 2503.09516). We match its
defaults where bm25s can: Lucene's scoring variant, pyserini's k1 = 0.9 and b = 0.4, lowercase,
and Lucene's 33-word English stopword list (bm25s's ``"en"``). Unlike Lucene we do not stem by
default (that needs the optional PyStemmer). Like Lucene, only passages sharing at least one term
with the query are returned, so a query of stopwords or unknown words gets ``[]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import bm25s
import numpy as np

from .base import DOCS_FILE, Corpus, Hit, PathLike, Retriever, read_meta, write_meta

BM25S_DIR = "bm25s"


class BM25Retriever(Retriever):
    """Lexical retrieval; thread-safe for concurrent ``search`` (read-only numpy after ``build``)."""

    kind: ClassVar[str] = "bm25"

    def __init__(
        self,
        *,
        stopwords: str | list[str] | None = "en",
        k1: float = 0.9,
        b: float = 0.4,
        method: str = "lucene",
        lower: bool = True,
    ) -> None:
        self.stopwords = stopwords
        self.k1 = k1
        self.b = b
        self.method = method
        self.lower = lower
        self._bm25: bm25s.BM25 | None = None
        self._corpus: Corpus | None = None

    def _tokenize(self, texts: list[str], show_progress: bool = False) -> list[list[str]]:
        return bm25s.tokenize(
            texts, lower=self.lower, stopwords=self.stopwords or [], return_ids=False, show_progress=show_progress
        )

    def build(
        self, corpus: Corpus | PathLike | Iterable[Mapping[str, Any]], show_progress: bool | None = None
    ) -> BM25Retriever:
        corpus = Corpus.coerce(corpus)
        if len(corpus) == 0:
            raise ValueError("cannot build an index over an empty corpus")
        show = len(corpus) >= 50_000 if show_progress is None else show_progress
        bm25 = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        bm25.index(self._tokenize(corpus.contents, show), show_progress=show)
        self._bm25, self._corpus = bm25, corpus
        return self

    @property
    def num_docs(self) -> int | None:
        return None if self._corpus is None else len(self._corpus)

    def _search_batch(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if self._bm25 is None or self._corpus is None:
            raise RuntimeError("BM25Retriever has no index: call build() or BM25Retriever.load() first")
        vocab = self._bm25.vocab_dict
        tokens = [[t for t in q if t in vocab] for q in self._tokenize(queries)]
        results: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, t in enumerate(tokens) if t]
        if not live:
            return results
        k = min(topk, len(self._corpus))
        docs, scores = self._bm25.retrieve([tokens[i] for i in live], k=k, show_progress=False, n_threads=0)
        for i, row_d, row_s in zip(live, np.asarray(docs), np.asarray(scores)):
            results[i] = [self._corpus.hit(int(d), float(s)) for d, s in zip(row_d, row_s) if s > 0]
        return results

    def _meta(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "stopwords": self.stopwords,
            "k1": self.k1,
            "b": self.b,
            "method": self.method,
            "lower": self.lower,
            "count": self.num_docs,
        }

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self._meta()}

    def save(self, path: PathLike) -> Path:
        """bm25s's own files under ``bm25s/``, plus ``docs.jsonl`` and ``meta.json``."""
        if self._bm25 is None or self._corpus is None:
            raise RuntimeError("nothing to save: build() the index first")
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self._bm25.save(str(out / BM25S_DIR), show_progress=False)
        self._corpus.to_jsonl(out / DOCS_FILE)
        write_meta(out, self._meta())
        return out

    @classmethod
    def load(cls, path: PathLike, *, mmap: bool = False) -> BM25Retriever:
        """``mmap=True`` leaves the score matrix on disk (for wiki-scale indexes)."""
        path = Path(path)
        meta = read_meta(path)
        if meta.get("kind") != cls.kind:
            raise ValueError(f"{path} holds a {meta.get('kind')!r} index, not {cls.kind!r}")
        self = cls(stopwords=meta["stopwords"], k1=meta["k1"], b=meta["b"], method=meta["method"], lower=meta["lower"])
        bm25 = bm25s.BM25.load(str(path / BM25S_DIR), mmap=mmap, show_progress=False)
        corpus = Corpus.from_jsonl(path / DOCS_FILE)
        if bm25.scores["num_docs"] != len(corpus) or len(corpus) != meta["count"]:
            raise ValueError(
                f"index at {path} is inconsistent: bm25 has {bm25.scores['num_docs']} docs, "
                f"docs.jsonl {len(corpus)}, meta count {meta['count']}"
            )
        self._bm25, self._corpus = bm25, corpus
        return self
