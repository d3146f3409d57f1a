"""A faiss index built by Search-R1 (``e5_Flat.index``) with its corpus jsonl, searched in process.

Search-R1 (PeterGriffinJin/Search-R1, ``search_r1/search/index_builder.py`` and
``retrieval_server.py``) writes one faiss file, ``<method>_<faiss type>.index`` (an inner-product
index from ``faiss.index_factory``; the paper's is ``e5_Flat.index`` over wiki-18), and keeps no
metadata beside it. Row ``i`` of the index is line ``i`` of the corpus jsonl, whose ``contents``
is the passage. Queries are encoded with ``transformers``' ``AutoModel``: the ``query: `` prefix for
e5, tokenised with ``max_length`` 256 (truncation, padding to the longest), pooled over the attention
mask (``mean``; ``cls`` and ``pooler`` are the other choices there), then L2-normalised.

:class:`SearchR1IndexRetriever` does the same with an encoder the user names (no metadata exists to
name it for them). Everything is checked when it is built: the index file, the corpus file, the
encoder, that the index holds one vector per corpus line and that its dimension is the encoder's.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import faiss
import numpy as np

from .base import Corpus, Hit, PathLike, Retriever
from .dense import resolve_device

__all__ = ["SearchR1IndexRetriever", "POOLINGS", "SEARCH_R1_E5", "from_spec"]

POOLINGS = ("mean", "cls", "pooler")
#: Search-R1's recipe defaults (``retrieval_launch.sh``, ``retrieval_server.py``).
SEARCH_R1_E5 = {"model": "intfloat/e5-base-v2", "pooling": "mean", "query_prefix": "query: ", "max_length": 256}
_SPEC_KEYS = {"index", "corpus", "model", "pooling", "query_prefix", "max_length", "device"}


class SearchR1IndexRetriever(Retriever):
    """Search a Search-R1-built faiss index.

    Args:
        index: the faiss file (e.g. ``e5_Flat.index``).
        corpus: the corpus jsonl the index was built from (``{"id", "contents"}`` per line, same order).
        model: the query encoder, a local folder or a hub name (Search-R1's recipe: ``intfloat/e5-base-v2``).
        pooling: ``"mean"`` (e5), ``"cls"`` or ``"pooler"``.
        query_prefix: put before every query (``"query: "`` for e5; ``""`` for none).
        max_length: query tokens kept (Search-R1's server: 256).
    """

    kind: ClassVar[str] = "search_r1_index"

    def __init__(self, index: PathLike, corpus: PathLike, model: str = SEARCH_R1_E5["model"], *,
                 pooling: str = "mean", query_prefix: str = "query: ", max_length: int = 256,
                 device: str | None = None) -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an int >= 1, got {max_length!r}")
        if not isinstance(query_prefix, str):
            raise ValueError(f"query_prefix must be a string ('' for none), got {query_prefix!r}")
        index_path, corpus_path = Path(index), Path(corpus)
        missing = [f"{what} file {p}" for what, p in (("index", index_path), ("corpus", corpus_path)) if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"Search-R1 index: missing {' and '.join(missing)}")
        self.index_path, self.corpus_path, self.model_name = str(index_path), str(corpus_path), str(model)
        self.pooling, self.query_prefix, self.max_length = pooling, query_prefix, int(max_length)
        self.device = resolve_device(device)
        self._tokenizer, self._model = _load_encoder(self.model_name, self.device)
        self._lock = threading.Lock()  # one fast tokenizer and model, many env threads
        try:
            self._index = faiss.read_index(self.index_path)
        except RuntimeError as e:
            raise ValueError(f"{index_path} is not a faiss index file: {str(e).splitlines()[0]}") from None
        self._corpus = Corpus.from_jsonl(corpus_path)
        dim = int(self.encode_queries(["dimension probe"]).shape[1])
        if self._index.ntotal != len(self._corpus):
            raise ValueError(f"{index_path} holds {self._index.ntotal} vectors but {corpus_path} has "
                             f"{len(self._corpus)} passages: they must be the files built together")
        if self._index.d != dim:
            raise ValueError(f"{index_path} holds vectors of dim {self._index.d}, encoder {self.model_name} "
                             f"gives dim {dim}: name the encoder the index was built with")

    @property
    def num_docs(self) -> int | None:
        return len(self._corpus)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "index": self.index_path, "corpus": self.corpus_path, "model": self.model_name,
                "pooling": self.pooling, "query_prefix": self.query_prefix, "max_length": self.max_length}

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Unit-norm float32 query embeddings, as Search-R1's server computes them."""
        import torch

        texts = [self.query_prefix + q for q in queries]
        with self._lock, torch.inference_mode():
            inputs = self._tokenizer(texts, max_length=self.max_length, padding=True, truncation=True,
                                     return_tensors="pt").to(self.device)
            out = self._model(**inputs, return_dict=True)
            if self.pooling == "mean":
                mask = inputs["attention_mask"][..., None].to(out.last_hidden_state.dtype)
                emb = (out.last_hidden_state * mask).sum(dim=1) / mask.sum(dim=1)
            elif self.pooling == "cls":
                emb = out.last_hidden_state[:, 0]
            else:
                emb = out.pooler_output
            emb = torch.nn.functional.normalize(emb.float(), dim=-1)
        return np.ascontiguousarray(emb.cpu().numpy(), dtype=np.float32)

    def _search_batch(self, queries: list[str], topk: int) -> list[list[Hit]]:
        k = min(topk, self._index.ntotal)
        scores, ids = self._index.search(self.encode_queries(queries), k)
        return [[self._corpus.hit(int(i), float(s)) for s, i in zip(rs, ri) if i >= 0] for rs, ri in zip(scores, ids)]


def _load_encoder(model: str, device: str) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    local = Path(model).is_dir()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=local)
        encoder = AutoModel.from_pretrained(model, local_files_only=local).to(device).eval()
    except OSError as e:
        raise ValueError(f"Search-R1 index: cannot load the query encoder {model!r} (a local model folder or a hub "
                         f"name; offline, it must be in the Hugging Face cache): {str(e).splitlines()[0]}") from None
    return tokenizer, encoder


def from_spec(spec: Mapping[str, Any]) -> SearchR1IndexRetriever:
    """Build from a ``retriever=`` mapping: ``{"index", "corpus"}`` required; ``model`` (default
    e5-base-v2), ``pooling``, ``query_prefix``, ``max_length``, ``device`` optional."""
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        raise ValueError(f"retriever mapping: unknown keys {unknown}; allowed {sorted(_SPEC_KEYS)}")
    missing = [k for k in ("index", "corpus") if not spec.get(k)]
    if missing:
        raise ValueError(f"retriever mapping for a Search-R1 index needs {' and '.join(repr(k) for k in missing)} "
                         "(the faiss file and the corpus jsonl it was built from)")
    opts = {**SEARCH_R1_E5, **{k: v for k, v in spec.items() if k not in ("index", "corpus")}}
    return SearchR1IndexRetriever(spec["index"], spec["corpus"], opts.pop("model"), **opts)
