"""Dataset loading for SearchQA: one place for corpora, question sets and Search-R1 files.

- Corpus files use Search-R1's jsonl shape, one passage per line:
  ``{"id": "0", "contents": "\\"Title\\"\\ntext"}``.
- Question rows (what the env consumes) are
  ``{"id", "question", "answers", "type", "needs_search", "gold_doc_ids", "hops"}``
  (rows read from a parquet file also carry ``data_source``).
- Search-R1 / verl training files are parquet with one row per prompt (see
  :func:`to_search_r1_rows`). The prompt text is supplied by the caller (``make_prompt``) because
  the environment owns it; this module never writes prompt text.

Errors name the file and the 1-based line number, because a corpus or question file that fails on
line 2,341,807 of wiki-18 has to be findable.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from agentgym.jsonl import read_jsonl
from agentgym.rewards import gold_answers
from agentgym.splits import SPLITS as SPLITS_ORDER
from agentgym.splits import check_split, check_splits
from agentgym.envs.searchqa.questions import DEFAULT_MIX, make_questions, question_pool_sizes
from agentgym.envs.searchqa.world import build_world

__all__ = [
    "DatasetFormatError", "load_corpus_jsonl", "save_corpus_jsonl", "split_title", "bundled_dataset", "bundled_questions",
    "BUNDLED_QUESTION_COUNTS", "to_search_r1_rows", "save_search_r1_parquet", "load_search_r1_parquet",
    "prepare_flashrag", "find_flashrag_files", "load_flashrag_jsonl", "SEARCH_R1_TRAIN_DATASETS",
    "SEARCH_R1_TEST_DATASETS", "MULTI_HOP_DATASETS",
]

PathLike = str | os.PathLike

SEARCH_R1_TRAIN_DATASETS: tuple[str, ...] = ("nq", "hotpotqa")
SEARCH_R1_TEST_DATASETS: tuple[str, ...] = (
    "nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
# Datasets built from multi-hop questions; rows read from them are typed multi_hop, others single_hop.
MULTI_HOP_DATASETS = frozenset({"hotpotqa", "2wikimultihopqa", "musique", "bamboogle"})
# Split preference for evaluation sets, as in Search-R1: test, else dev, else train.
EVAL_SPLIT_PREFERENCE: tuple[str, ...] = ("test", "dev", "train")


class DatasetFormatError(ValueError):
    """A data file does not have the expected shape; the message names the file and line."""


# ----------------------------------------------------------------------------- corpus
def split_title(contents: str, strip_quotes: bool = True) -> tuple[str, str]:
    """Split corpus ``contents`` into (title, text): first line, remaining lines joined by ``\\n``.

    With ``strip_quotes`` (default) one pair of surrounding double quotes is removed from the title.
    Search-R1's own ``_passages2string`` keeps the first line as is (quotes included); pass
    ``strip_quotes=False`` to reproduce its observation text byte for byte.
    """
    lines = contents.split("\n")
    title = lines[0].strip()
    if strip_quotes and len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, "\n".join(lines[1:])


def _iter_jsonl(path: Path, what: str) -> Iterator[tuple[int, dict]]:
    return read_jsonl(path, what=what, error=DatasetFormatError)


def load_corpus_jsonl(path: PathLike) -> list[dict[str, str]]:
    """Read a Search-R1 corpus (one ``{"id", "contents"}`` object per line; ids become strings)."""
    path = Path(path)
    docs = []
    for lineno, obj in _iter_jsonl(path, "corpus"):
        if "contents" not in obj or not isinstance(obj["contents"], str):
            raise DatasetFormatError(f"{path}:{lineno}: a corpus line needs a string 'contents' field")
        if "id" not in obj or isinstance(obj["id"], (dict, list)) or obj["id"] is None:
            raise DatasetFormatError(f"{path}:{lineno}: a corpus line needs an 'id' (string or number)")
        docs.append({**obj, "id": str(obj["id"])})
    return docs


def save_corpus_jsonl(docs: Iterable[Mapping[str, Any]], path: PathLike) -> Path:
    """Write a Search-R1 corpus jsonl (UTF-8, one object per line); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            if "id" not in d or "contents" not in d:
                raise ValueError(f"document {i} needs 'id' and 'contents', got keys {sorted(d)}")
            f.write(json.dumps({**d, "id": str(d["id"])}, ensure_ascii=False) + "\n")
    return path


# ----------------------------------------------------------------------------- bundled world
# (train, validation, test) question counts per named size; integer sizes use the "medium" counts scaled.
BUNDLED_QUESTION_COUNTS: dict[str, tuple[int, int, int]] = {
    "tiny": (200, 60, 60), "small": (1000, 300, 300), "medium": (8000, 1000, 1000), "large": (50000, 2000, 2000)}


@functools.lru_cache(maxsize=8)
def _bundled(seed: int, size: str | int) -> tuple[tuple[dict, ...], dict[str, tuple[dict, ...]]]:
    """(corpus, split -> questions) of the generated world, its splits checked disjoint and duplicate-free."""
    world = build_world(seed, size)
    if isinstance(size, str):
        counts = dict(zip(SPLITS_ORDER, BUNDLED_QUESTION_COUNTS[size]))
    else:  # scale with the world, within what its entities can support
        pools = question_pool_sizes(world)
        fit = {s: int(min(pools[s]["single_hop"] / DEFAULT_MIX["single_hop"],
                          pools[s]["multi_hop"] / DEFAULT_MIX["multi_hop"])) for s in pools}
        counts = {"train": min(size * 4, fit["train"]), "validation": min(max(10, size // 2), fit["validation"]),
                  "test": min(max(10, size // 2), fit["test"])}
    questions = {s: tuple(make_questions(world, n, seed=seed, split=s)) for s, n in counts.items()}
    check_splits({s: [q["question"] for q in qs] for s, qs in questions.items()},
                 source=f"bundled SearchQA world (seed {seed}, size {size!r})", what="question")
    return tuple(world.corpus()), questions


def _copy_rows(rows: Iterable[dict]) -> list[dict]:
    return [{k: (list(v) if isinstance(v, list) else v) for k, v in r.items()} for r in rows]


def bundled_dataset(seed: int = 0, size: str | int = "small") -> tuple[list[dict], list[dict], list[dict]]:
    """(corpus, train questions, test questions) of the generated world; built once per process.

    Callers get fresh copies, so mutating them cannot corrupt the cache. The "small" default is
    ~370 passages, 1,000 train and 300 test questions (0.4 single-hop, 0.4 multi-hop, 0.2 no-search);
    :func:`bundled_questions` gives any split, ``validation`` (300) included.
    """
    corpus, questions = _bundled(seed, size)
    return _copy_rows(corpus), _copy_rows(questions["train"]), _copy_rows(questions["test"])


def bundled_questions(split: str, seed: int = 0, size: str | int = "small") -> list[dict]:
    """The questions of ``split`` (``train``, ``validation`` or ``test``) of the generated world (fresh copies)."""
    return _copy_rows(_bundled(seed, size)[1][check_split(split)])


# ----------------------------------------------------------------------------- Search-R1 parquet
def to_search_r1_rows(questions: Iterable[Mapping[str, Any]], data_source: str, split: str,
                      make_prompt: Callable[[str], str]) -> list[dict]:
    """Search-R1 / verl parquet rows for question rows.

    ``extra_info`` keeps ``split`` and ``index`` (as Search-R1) and adds the question text and our
    metadata (id, type, needs_search, gold_doc_ids, hops) so :func:`load_search_r1_parquet` can
    rebuild the question rows exactly.
    """
    rows = []
    for i, q in enumerate(questions):
        if "question" not in q or "answers" not in q:
            raise ValueError(f"question {i} needs 'question' and 'answers', got keys {sorted(q)}")
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": make_prompt(q["question"])}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": gold_answers(q["answers"])}},
            "extra_info": {
                "split": split, "index": i, "question": q["question"],
                "id": str(q.get("id", f"{data_source}-{split}-{i}")),
                "type": q.get("type") or _default_type(data_source),
                "needs_search": bool(q.get("needs_search", True)),
                "gold_doc_ids": [str(d) for d in q.get("gold_doc_ids", [])],
                "hops": int(q["hops"]) if q.get("hops") is not None else _default_hops(data_source),
            },
        })
    return rows


def _default_type(data_source: str) -> str:
    return "multi_hop" if data_source.lower() in MULTI_HOP_DATASETS else "single_hop"


def _default_hops(data_source: str) -> int:
    return 2 if _default_type(data_source) == "multi_hop" else 1


def save_search_r1_parquet(rows: Sequence[Mapping[str, Any]], path: PathLike) -> Path:
    """Write Search-R1 rows (from :func:`to_search_r1_rows`) as one parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([dict(r) for r in rows]), path)
    return path


def _question_from_prompt(content: str) -> str:
    # Search-R1's templates (scripts/data_process/nq_search.py, nq.py) end with "Question: <q>\n";
    # nq_rag.py's follows the question with " Context: <passages> \n", and passages may hold anything,
    # so the text is first cut at the first " Context: " after a "Question: ", then the last
    # "Question: " of what is left starts the question (an instruction may mention the word).
    marker, context = "Question: ", " Context: "
    first = content.find(marker)
    end = content.find(context, first) if first >= 0 else -1
    head = content[:end] if end >= 0 else content
    at = head.rfind(marker)
    return (head[at + len(marker):] if at >= 0 else head).strip()


def load_search_r1_parquet(path: PathLike) -> list[dict]:
    """Question rows from a Search-R1 parquet file (ours or a foreign one, e.g. Search-R1's nq_hotpotqa).

    The question comes from ``extra_info["question"]`` when present, else from the user prompt:
    the text after the last ``"Question: "``, stripped, ending before a ``" Context: "`` that follows
    it (``nq_rag.py``'s rows put the passages there).
    Rows without our metadata get id ``<data_source>-<split>-<index>``, ``needs_search`` True, no
    gold passages, and a type/hop count from the data source (multi-hop for HotpotQA, 2Wiki,
    Musique, Bamboogle).

    Every row keeps the file's ``prompt`` (the chat messages, as written) and ``schema``:
    ``"agentgym"`` for rows we wrote (they carry ``extra_info.question``), ``"search_r1"`` for rows
    written by Search-R1's scripts. ``SearchQAEnv(prompt="auto")`` feeds the latter's prompt to the
    model as it is, as Search-R1's trainer does.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"parquet file not found: {path}")
    table = pq.read_table(path)
    missing = {"prompt", "reward_model"} - set(table.column_names)
    if missing:
        raise DatasetFormatError(f"{path}: not a Search-R1 parquet file (missing columns {sorted(missing)})")
    out = []
    for i, row in enumerate(table.to_pylist()):
        source = str(row.get("data_source") or "unknown")
        extra = row.get("extra_info") or {}
        if not isinstance(extra, dict):
            raise DatasetFormatError(f"{path}: row {i}: 'extra_info' must be a struct (a dict), not "
                                     f"{type(extra).__name__}")
        try:
            target = row["reward_model"]["ground_truth"]["target"]
        except (KeyError, TypeError):
            raise DatasetFormatError(f"{path}: row {i} has no reward_model.ground_truth.target") from None
        answers = _gold_answers(target)
        if not answers:
            raise DatasetFormatError(f"{path}: row {i}: reward_model.ground_truth.target must be an answer or a "
                                     f"non-empty list of answers, not {target!r:.80}")
        question, prompt = extra.get("question"), _prompt_messages(row.get("prompt"), path, i)
        if not question:
            users = [m["content"] for m in prompt if m["role"] == "user"]
            if not users:
                raise DatasetFormatError(f"{path}: row {i} has no user message in 'prompt'")
            question = _question_from_prompt(users[-1])
        split = extra.get("split") or "unknown"
        index = extra.get("index") if extra.get("index") is not None else i
        out.append({
            "id": str(extra.get("id") or f"{source}-{split}-{index}"),
            "question": question,
            "answers": answers,
            "type": extra.get("type") or _default_type(source),
            "needs_search": True if extra.get("needs_search") is None else bool(extra["needs_search"]),
            "gold_doc_ids": [str(d) for d in (extra.get("gold_doc_ids") or [])],
            "hops": _hops(extra["hops"], path, i) if extra.get("hops") is not None else _default_hops(source),
            "data_source": source,
            "prompt": prompt,
            "schema": "agentgym" if extra.get("question") else "search_r1",
        })
    return out


def _gold_answers(target: Any) -> list[str]:
    """``ground_truth.target`` as answer strings: one answer, or a list of them (empty entries dropped)."""
    if isinstance(target, bool) or target is None:
        return []
    if isinstance(target, (str, int, float)):
        target = [target]
    if not isinstance(target, (list, tuple)) or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool)
                                                        for a in target):
        return []
    return [str(a) for a in target if str(a).strip()]


def _hops(value: Any, path: Path, i: int) -> int:
    try:
        hops = int(value)
    except (TypeError, ValueError):
        hops = 0
    if isinstance(value, bool) or hops < 0 or hops != value:
        raise DatasetFormatError(f"{path}: row {i}: extra_info.hops must be a whole number >= 0, not {value!r:.40}")
    return hops


def _prompt_messages(prompt: Any, path: Path, i: int) -> list[dict[str, str]]:
    """The ``prompt`` column as a list of ``{"role", "content"}`` messages (Search-R1 writes one user message)."""
    if prompt is None:
        return []
    if not isinstance(prompt, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt):
        raise DatasetFormatError(f"{path}: row {i}: 'prompt' must be a list of {{'role', 'content'}} messages")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


# ----------------------------------------------------------------------------- FlashRAG → parquet
def load_flashrag_jsonl(path: PathLike, data_source: str | None = None) -> list[dict]:
    """Question rows from a FlashRAG jsonl file (``{"id", "question", "golden_answers": [...]}``)."""
    path = Path(path)
    source = data_source or path.parent.name
    rows = []
    for lineno, obj in _iter_jsonl(path, "FlashRAG"):
        q, golds = obj.get("question"), obj.get("golden_answers")
        if not isinstance(q, str) or not q.strip():
            raise DatasetFormatError(f"{path}:{lineno}: 'question' must be a non-empty string")
        if isinstance(golds, (str, int, float)) and not isinstance(golds, bool):
            golds = [golds]
        if not isinstance(golds, list) or not golds or not all(
                isinstance(g, (str, int, float)) and not isinstance(g, bool) for g in golds):
            raise DatasetFormatError(f"{path}:{lineno}: 'golden_answers' must be a non-empty list of strings")
        rows.append({
            "id": str(obj.get("id", f"{source}-{path.stem}-{len(rows)}")),
            "question": q.strip(),
            "answers": [str(g) for g in golds],
            "type": _default_type(source),
            "needs_search": True,
            "gold_doc_ids": [],
            "hops": _default_hops(source),
        })
    return rows


def find_flashrag_files(source: PathLike | Iterable[PathLike]) -> dict[tuple[str, str], Path]:
    """Index FlashRAG files as {(dataset, split): path}.

    ``source`` is a directory laid out as ``<dataset>/<split>.jsonl`` (the FlashRAG_datasets
    layout) or an iterable of such files (dataset = parent folder name, split = file stem).
    """
    if isinstance(source, (str, os.PathLike)):
        root = Path(source)
        if not root.is_dir():
            raise FileNotFoundError(f"FlashRAG directory not found: {root}")
        files = sorted(root.glob("*/*.jsonl"))
    else:
        files = [Path(p) for p in source]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"FlashRAG file not found: {f}")
            if f.suffix != ".jsonl":
                raise ValueError(f"{f}: expected a <dataset>/<split>.jsonl file")
    return {(f.parent.name.lower(), f.stem.lower()): f for f in files}


def _pick(index: Mapping[tuple[str, str], Path], dataset: str, splits: Sequence[str], purpose: str) -> tuple[str, Path]:
    for split in splits:
        if (dataset, split) in index:
            return split, index[(dataset, split)]
    have = sorted(f"{d}/{s}.jsonl" for d, s in index if d == dataset) or ["nothing"]
    raise FileNotFoundError(
        f"no {purpose} file for dataset {dataset!r}: looked for "
        f"{', '.join(f'{dataset}/{s}.jsonl' for s in splits)}; found {', '.join(have)}")


def prepare_flashrag(source: PathLike | Iterable[PathLike], out_dir: PathLike,
                     datasets: Sequence[str] = SEARCH_R1_TEST_DATASETS, *,
                     make_prompt: Callable[[str], str],
                     train_datasets: Sequence[str] = SEARCH_R1_TRAIN_DATASETS,
                     limit: int | None = None, overwrite: bool = False) -> dict[str, Path]:
    """Convert FlashRAG question files into Search-R1 ``train.parquet`` and ``test.parquet``.

    As in Search-R1: ``train.parquet`` holds the train split of ``train_datasets`` (NQ + HotpotQA);
    ``test.parquet`` holds, for each of ``datasets``, its test split, else dev, else train.
    ``data_source`` is the dataset name. ``extra_info.index`` runs over the whole file (unique, so
    it can key GRPO groups) and ``extra_info.id`` keeps the FlashRAG id. ``limit`` caps rows per
    dataset (for smoke runs). Either list may be empty to skip that file. A file already in
    ``out_dir`` is replaced only with ``overwrite`` (FileExistsError otherwise, before anything is read).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a row count >= 1 (or None for every row), got {limit!r}")
    blank = [d for d in (*train_datasets, *datasets) if not str(d).strip()]
    if blank:
        raise ValueError(f"dataset names must not be empty, got train {list(train_datasets)} and test {list(datasets)}")
    index = find_flashrag_files(source)
    out_dir = Path(out_dir)
    there = [out_dir / f"{split}.parquet" for split, names in (("train", train_datasets), ("test", datasets))
             if names and (out_dir / f"{split}.parquet").exists()]
    if there and not overwrite:
        raise FileExistsError(f"{', '.join(map(str, there))} already exist{'s' if len(there) == 1 else ''}; "
                              "pass overwrite=True (--overwrite) to replace")
    plan = {"train": [(d.lower(), *_pick(index, d.lower(), ("train",), "train")) for d in train_datasets],
            "test": [(d.lower(), *_pick(index, d.lower(), EVAL_SPLIT_PREFERENCE, "evaluation"))
                     for d in datasets]}
    splits: dict[str, list[dict]] = {}
    for out_split, parts in plan.items():  # every file is read and checked before anything is written
        if not parts:
            continue
        rows: list[dict] = []
        for dataset, _split, path in parts:
            questions = load_flashrag_jsonl(path, data_source=dataset)[:limit]
            rows += to_search_r1_rows(questions, data_source=dataset, split=out_split, make_prompt=make_prompt)
        for i, r in enumerate(rows):
            r["extra_info"]["index"] = i
        splits[out_split] = rows
    return {split: save_search_r1_parquet(rows, out_dir / f"{split}.parquet") for split, rows in splits.items()}
