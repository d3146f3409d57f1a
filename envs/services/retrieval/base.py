"""The retriever contract shared by dense, BM25 and remote retrievers, plus the corpus they index.

Formats follow Search-R1 (PeterGriffinJin/Search-R1, ``search_r1/search/retrieval_server.py``;
arXiv 2503.09516): a corpus is jsonl with one passage per line, ``{"id": "0", "contents":
"\\"Title\\"\\ntext"}``, and a retrieval hit travels as ``{"document": {"id", "contents"}, "score"}``.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from agentgym.jsonl import read_jsonl

PathLike = str | os.PathLike[str]

#: Search-R1's default number of passages per search (``retrieval_topk`` = 3 in the paper scripts).
DEFAULT_TOPK = 3

META_FILE = "meta.json"
DOCS_FILE = "docs.jsonl"
#: Written into every saved index's meta so that ``load_retriever`` can refuse foreign directories.
FORMAT = "agentgym.retrieval/1"


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved passage. ``score`` is higher-is-better (inner product or BM25)."""

    doc_id: str
    contents: str
    score: float

    @property
    def title(self) -> str:
        """First line of ``contents``, kept verbatim (quotes included) as Search-R1 formats ``Doc i(Title: ...)``."""
        return self.contents.split("\n", 1)[0]

    @property
    def text(self) -> str:
        """Everything after the first line of ``contents``."""
        parts = self.contents.split("\n", 1)
        return parts[1] if len(parts) > 1 else ""

    def to_dict(self, with_score: bool = True) -> dict[str, Any]:
        """Search-R1's wire form ``{"document": {"id", "contents"}, "score"}`` (score optional)."""
        out: dict[str, Any] = {"document": {"id": self.doc_id, "contents": self.contents}}
        if with_score:
            out["score"] = self.score
        return out

    @classmethod
    def from_dict(cls, item: Mapping[str, Any]) -> Hit:
        """Parse a wire item; also accepts a bare document (Search-R1's ``return_scores=false`` intent)."""
        doc = item.get("document", item)
        if not isinstance(doc, Mapping) or not isinstance(doc.get("contents"), str):
            raise ValueError(f"not a retrieval hit (needs document.contents): {str(item)[:200]}")
        score = item.get("score", float("nan"))
        return cls(doc_id=str(doc.get("id", "")), contents=doc["contents"], score=float(score))


def format_passages(hits: Sequence[Hit]) -> str:
    """``Doc {i}(Title: {title}) {text}\\n`` per passage, i from 1 (Search-R1 `_passages2string`): what
    search envs show the policy. Title = the first line of ``contents`` verbatim (quotes and any
    surrounding spaces kept), text = the remaining lines joined by "\\n"."""
    return "".join(f"Doc {i}(Title: {h.title}) {h.text}\n" for i, h in enumerate(hits, start=1))


class Corpus:
    """Passages held as two parallel lists (ids, contents): far smaller than one dict per passage."""

    def __init__(self, ids: list[str], contents: list[str]) -> None:
        if len(ids) != len(contents):
            raise ValueError(f"{len(ids)} ids but {len(contents)} contents")
        self.ids = ids
        self.contents = contents

    def __len__(self) -> int:
        return len(self.ids)

    def hit(self, index: int, score: float) -> Hit:
        return Hit(doc_id=self.ids[index], contents=self.contents[index], score=float(score))

    @classmethod
    def from_docs(cls, docs: Iterable[Mapping[str, Any]], *, where: Callable[[int], str] | None = None) -> Corpus:
        """Accept Search-R1 rows; rows with ``title``/``text`` instead of ``contents`` are joined
        the Search-R1 way (``"Title"`` line, then text); a missing ``id`` becomes the row number.
        ``where(i)`` names row ``i`` in errors (``PATH:LINE`` for a file); else ``corpus row I``."""
        name = where or (lambda i: f"corpus row {i}")   # called only for a bad row
        ids: list[str] = []
        contents: list[str] = []
        for i, doc in enumerate(docs):
            if not isinstance(doc, Mapping):
                raise ValueError(f"{name(i)} is not an object: {str(doc)[:200]}")
            text = doc.get("contents")
            if text is None and "text" in doc:
                title = str(doc.get("title", "")).strip('"')
                text = f'"{title}"\n{doc["text"]}'
            if not isinstance(text, str):
                raise ValueError(f"{name(i)} has no string 'contents' (or 'title'/'text'): {str(doc)[:200]}")
            ids.append(str(doc.get("id", i)))
            contents.append(text)
        return cls(ids, contents)

    @classmethod
    def from_jsonl(cls, path: PathLike, *, progress: Any = None) -> Corpus:
        """A corpus file (``.jsonl`` / ``.jsonl.gz``); a row that is not a passage names its ``PATH:LINE``.
        ``progress`` wraps the stream of rows (a tqdm class, say)."""
        line = [0]   # the line of the row being checked: from_docs names a bad row before taking the next

        def rows() -> Iterator[dict[str, Any]]:
            for line[0], obj in read_jsonl(path, what="corpus"):
                yield obj
        stream = rows() if progress is None else progress(rows())
        return cls.from_docs(stream, where=lambda _i: f"{path}:{line[0]}")

    @classmethod
    def coerce(cls, corpus: Corpus | PathLike | Iterable[Mapping[str, Any]]) -> Corpus:
        """One entry point for every way a caller can hand over a corpus."""
        if isinstance(corpus, Corpus):
            return corpus
        if isinstance(corpus, (str, os.PathLike)):
            return cls.from_jsonl(corpus)
        return cls.from_docs(corpus)

    def to_jsonl(self, path: PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for doc_id, text in zip(self.ids, self.contents):
                f.write(json.dumps({"id": doc_id, "contents": text}, ensure_ascii=False) + "\n")


def iter_jsonl(path: PathLike) -> Iterator[dict[str, Any]]:
    """Rows of a corpus ``.jsonl`` (or ``.jsonl.gz``) file, streamed; bad lines name their number
    (:func:`agentgym.jsonl.read_jsonl`)."""
    for _, obj in read_jsonl(path, what="corpus"):
        yield obj


def read_meta(path: PathLike) -> dict[str, Any]:
    """The meta of a saved index directory, checked to be ours."""
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        hint = ""
        faiss_files = sorted(Path(path).glob("*.index")) if Path(path).is_dir() else [Path(path)]
        if faiss_files and (Path(path).is_dir() or Path(path).is_file()):
            # a Search-R1 index (e.g. e5_Flat.index) has no meta: it needs its corpus and encoder named
            hint = (f"; {faiss_files[0]} looks like a faiss file built by Search-R1: pass retriever="
                    "{'index': <faiss file>, 'corpus': <corpus jsonl>, 'model': <encoder, e.g. intfloat/e5-base-v2>}")
        raise FileNotFoundError(f"no retriever index at {path} (missing {META_FILE}){hint}")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path} has format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def write_meta(path: PathLike, meta: Mapping[str, Any]) -> None:
    Path(path, META_FILE).write_text(json.dumps({"format": FORMAT, **meta}, indent=2) + "\n", encoding="utf-8")


def check_topk(topk: int) -> int:
    # bool is an int subclass; True as a topk is always a bug.
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise TypeError(f"topk must be an int, got {type(topk).__name__}")
    if topk <= 0:
        raise ValueError(f"topk must be >= 1, got {topk}")
    return topk


class Retriever(ABC):
    """Batched passage search.

    ``search`` is the template: it validates once, answers empty/whitespace queries with ``[]``
    (an agent's empty ``<search></search>`` must not crash a rollout) unless ``search_empty=True``,
    and hands the rest to ``_search_batch`` in one call so dense retrievers encode a whole batch at
    once. ``search_empty=True`` passes empty queries on as they are: what Search-R1's client does
    (it posts ``""`` and its e5 server returns the passages nearest to ``"query: "``). Wrong *types*
    or ``topk <= 0`` are programming errors and raise.
    """

    kind: ClassVar[str] = "base"

    @abstractmethod
    def _search_batch(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Search non-empty queries; ``topk`` >= 1 (may exceed the corpus size)."""

    @property
    def num_docs(self) -> int | None:
        """Number of indexed passages, ``None`` where unknown (remote)."""
        return None

    def describe(self) -> dict[str, Any]:
        """Small JSON-able summary for ``/health`` and logs."""
        return {"kind": self.kind, "num_docs": self.num_docs}

    def search(self, queries: Sequence[str], topk: int = DEFAULT_TOPK, *, search_empty: bool = False) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("search() takes a list of queries; use search_one() for a single string")
        check_topk(topk)
        queries = list(queries)
        for q in queries:
            if not isinstance(q, str):
                raise TypeError(f"queries must be strings, got {type(q).__name__}")
        results: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if search_empty or q.strip()]
        if live:
            found = self._search_batch([queries[i] for i in live], topk)
            if len(found) != len(live):
                raise RuntimeError(f"{type(self).__name__} returned {len(found)} result lists for {len(live)} queries")
            for i, hits in zip(live, found):
                results[i] = hits
        return results

    def search_one(self, query: str, topk: int = DEFAULT_TOPK) -> list[Hit]:
        return self.search([query], topk)[0]
