"""The two entry points behind ``agentgym retriever build-index`` and ``agentgym retriever serve``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from .base import META_FILE, Corpus, PathLike, Retriever, read_meta


def build_index(
    corpus: PathLike | Iterable[Mapping[str, Any]],
    out_dir: PathLike,
    kind: Literal["dense", "bm25"] = "dense",
    model: str | None = None,
    index_type: Literal["flat", "hnsw", "ivf"] = "flat",
    *,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    device: str | None = None,
    batch_size: int = 64,
    hnsw_m: int = 32,
    ef_construction: int = 200,
    ef_search: int = 128,
    nlist: int | None = None,
    nprobe: int = 8,
    stopwords: str | list[str] | None = "en",
    k1: float = 0.9,
    b: float = 0.4,
    show_progress: bool | None = None,
    overwrite: bool = False,
) -> Retriever:
    """Index a Search-R1 jsonl corpus (path, ``.jsonl.gz`` too, or an iterable of docs) into ``out_dir``
    and return the ready retriever. Refuses to replace an existing index unless ``overwrite``:
    a wiki-scale index takes hours to rebuild."""
    out = Path(out_dir)
    _check_request(out, kind, batch_size, overwrite, model=model, query_prefix=query_prefix,
                   passage_prefix=passage_prefix, index_type=index_type)
    with _made_for_the_build(out):    # checked writable before the corpus is read and encoded (hours at
        # wiki scale), not after; a build that fails leaves no empty folder behind
        docs = _read_corpus(corpus, show_progress)
        retriever: Any
        if kind == "dense":
            from .dense import DenseRetriever

            retriever = DenseRetriever(model, device=device, query_prefix=query_prefix, passage_prefix=passage_prefix,
                                       index_type=index_type, hnsw_m=hnsw_m, ef_construction=ef_construction,
                                       ef_search=ef_search, nlist=nlist, nprobe=nprobe)
            retriever.build(docs, batch_size=batch_size, show_progress=show_progress)
        else:
            from .sparse import BM25Retriever

            retriever = BM25Retriever(stopwords=stopwords, k1=k1, b=b).build(docs, show_progress=show_progress)
        retriever.save(out)
    return retriever


def _check_request(out: Path, kind: str, batch_size: Any, overwrite: bool, **dense_only: Any) -> None:
    """Everything a build refuses, said before the corpus is read (minutes to hours), not after: a bad
    ``kind`` or ``batch_size``, dense-only settings given for BM25, an index already in ``out``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if kind not in ("dense", "bm25"):
        raise ValueError(f"kind must be 'dense' or 'bm25', got {kind!r}")
    if kind == "bm25":
        given = [k for k, v in dense_only.items() if v is not None and (k != "index_type" or v != "flat")]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to kind='dense'")
    if (out / META_FILE).exists() and not overwrite:
        raise FileExistsError(f"{out} already holds an index; pass overwrite=True to replace it")


@contextmanager
def _made_for_the_build(out: Path) -> Iterator[None]:
    """``out`` made if needed and checked to take a file (OSError naming it otherwise); removed again
    if it was made here and the build inside fails before writing anything to it."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"index directory {out} is a file")
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise PermissionError(f"cannot write the index to {out} ({e.strerror or e})") from None
    try:
        yield
    except BaseException:
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def _read_corpus(corpus: PathLike | Iterable[Mapping[str, Any]], show_progress: bool | None) -> Corpus:
    """The corpus as a :class:`Corpus`; a progress bar when asked and it is a file (a wiki-scale jsonl
    takes minutes to read)."""
    if show_progress and isinstance(corpus, (str, os.PathLike)):
        from functools import partial

        from tqdm.auto import tqdm
        return Corpus.from_jsonl(corpus, progress=partial(tqdm, desc="reading corpus", unit="doc"))
    return Corpus.coerce(corpus)


def load_retriever(
    source: PathLike,
    *,
    model: str | None = None,
    device: str | None = None,
    mmap: bool = False,
    timeout_s: float = 30.0,
) -> Retriever:
    """A saved index directory (kind read from its ``meta.json``), or an ``http(s)://`` URL of a
    running retrieval server (then a ``RemoteRetriever``), so configs can name either."""
    text = str(source)
    if text.startswith(("http://", "https://")):
        from .remote import RemoteRetriever

        return RemoteRetriever(text, timeout_s=timeout_s)
    kind = read_meta(source).get("kind")
    if kind == "dense":
        from .dense import DenseRetriever

        return DenseRetriever.load(source, model=model, device=device)
    if kind == "bm25":
        if model is not None:
            raise ValueError("model only applies to dense indexes")
        from .sparse import BM25Retriever

        return BM25Retriever.load(source, mmap=mmap)
    raise ValueError(f"{source}: unknown retriever kind {kind!r} in {META_FILE}")
