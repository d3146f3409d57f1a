"""The one ``.jsonl`` reader behind every data file agentgym loads.

Search-R1 corpora, FlashRAG question files and HumanEval/MBPP problem files are all JSON Lines: one JSON
object per line, optionally gzipped (``.jsonl.gz``). They are read here, so a bad file gets the same short
error whichever loader meets it, naming the file and the line::

    corpus.jsonl:3: not valid JSON (Expecting value at column 1)
    he.jsonl:2: expected a JSON object, got list

Each loader passes its own error class (a ``ValueError`` subclass) so that its callers can catch its errors.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Iterator

__all__ = ["read_jsonl"]


def read_jsonl(path: str | os.PathLike, *, what: str = "file",
               error: type[ValueError] = ValueError) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of a ``.jsonl`` or ``.jsonl.gz`` file.

    ``what`` names the file in the not-found message (``"corpus"`` → ``corpus file not found: PATH``).
    A line that is not JSON, or not a JSON object, and a file that is not UTF-8 (or not gzip though named
    ``.gz``) raise ``error`` with ``PATH:LINE:`` in front. Rows are read lazily: a large corpus streams.
    """
    p = Path(path)
    if p.is_dir():
        raise FileNotFoundError(f"{what} {p} is a directory, not a .jsonl file")
    if not p.is_file():
        raise FileNotFoundError(f"{what} file not found: {p}")
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as e:
                    raise error(f"{p}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(obj, dict):
                    raise error(f"{p}:{lineno}: expected a JSON object, got {type(obj).__name__}")
                yield lineno, obj
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as e:
        raise error(f"{p}: cannot be read as UTF-8 jsonl ({e})") from None
