"""Held-out splits: ``train``, ``validation`` and ``test``, disjoint and free of duplicate tasks.

A comparison can only be trusted if the tasks it is scored on were never trained on and are not
counted twice. Every built-in env therefore offers the three splits of :data:`SPLITS`, and this module
is the one place that says what that means:

- :func:`normalise_task_text` is what "the same task" means for text: Unicode NFKC, case folded,
  whitespace collapsed (``"Compute  3 + 4."`` and ``"compute 3 + 4."`` are one task).
- :func:`split_of` puts a task in a split by a hash of its content (stable across machines and
  Python versions), so the same task can never be drawn for two splits.
- :func:`check_splits` checks finite task sets at load time: a duplicate within a split or a task in
  two splits is a ``ValueError`` naming it (a user's own data files get the same one-line error).
- :class:`DistinctDraws` turns a procedural generator into a split's task sequence in which index
  ``i`` never repeats an earlier index's task (the first :data:`DISTINCT_PREFIX` indices, built lazily
  and shared by every env of a process), for envs whose ``get_task(i)`` draws from a seeded stream.

The kernel imports no env; envs call these helpers.
"""

from __future__ import annotations

import hashlib
import threading
import unicodedata
from typing import Callable, Generic, Hashable, Iterable, Mapping, TypeVar

__all__ = ["SPLITS", "DISTINCT_PREFIX", "normalise_task_text", "split_of", "check_split", "check_splits",
           "DistinctDraws", "SplitExhausted"]

SPLITS: tuple[str, ...] = ("train", "validation", "test")
#: indices below this are distinct within a split (built in order and cached); later ones are independent draws
DISTINCT_PREFIX = 10_000

T = TypeVar("T")


def normalise_task_text(text: str) -> str:
    """The form in which two task texts are compared: NFKC, case folded, runs of whitespace as one space."""
    return " ".join(unicodedata.normalize("NFKC", str(text)).casefold().split())


def _hash64(key: str) -> int:
    """The first 8 bytes of SHA-256 of ``key`` as an int (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")


def split_of(key: str, *, test_every: int = 5, validation_every: int = 4) -> str:
    """The split of a task whose content key is ``key`` (pass a canonical text, e.g. a normalised question).

    One key in ``test_every`` is ``test``; of the others, one in ``validation_every`` is ``validation``;
    the rest are ``train`` (the defaults: 20 % / 20 % / 60 %). The test rule is the one the built-in envs
    used before validation existed (``hash % test_every == 0``), so adding the validation split left every
    test task where it was and took validation tasks from train only.
    """
    if test_every < 2 or validation_every < 2:
        raise ValueError(f"test_every and validation_every must be >= 2, got {test_every}, {validation_every}")
    h = _hash64(key)
    if h % test_every == 0:
        return "test"
    return "validation" if (h // test_every) % validation_every == 0 else "train"


def check_split(split: str, allowed: Iterable[str] = SPLITS, *, allow_none: bool = False) -> str | None:
    """``split`` if it names a split, else a ``ValueError``: ``split must be one of [...], got 'dev'``."""
    allowed = tuple(allowed)
    if (split is None and allow_none) or split in allowed:
        return split
    extra = " or None" if allow_none else ""
    raise ValueError(f"split must be one of {list(allowed)}{extra}, got {split!r}")


def _short(text: str, n: int = 80) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def check_splits(named: Mapping[str, Iterable[str]], *, source: str = "", what: str = "task",
                 normalise: Callable[[str], str] = normalise_task_text) -> None:
    """Raise ``ValueError`` if a split holds a task twice or two splits share one.

    ``named`` maps a split name to its tasks' texts (or content keys), in order; they are compared
    after ``normalise``. The message is one line: where (``source``), which task, which positions.
    """
    where = f"{source}: " if source else ""
    first: dict[str, tuple[str, int]] = {}
    for split, texts in named.items():
        for i, text in enumerate(texts):
            key = normalise(text)
            if key in first:
                other, j = first[key]
                if other == split:
                    raise ValueError(f"{where}duplicate {what} in split {split!r} (#{j} and #{i}): {_short(key)}")
                raise ValueError(f"{where}{what} in two splits, {other!r} (#{j}) and {split!r} (#{i}): "
                                 f"{_short(key)}; held-out splits must be disjoint")
            first[key] = (split, i)


class SplitExhausted(ValueError):
    """A held-out split has fewer distinct tasks (with these settings) than the index asked for."""


class DistinctDraws(Generic[T]):
    """A split's task sequence from a seeded generator: index ``i`` never repeats an earlier index's task.

    ``draw(index, attempt)`` is a candidate task (a pure function of its arguments; ``None``: no candidate);
    ``key(task)`` is its content key (two tasks with one key are the same task), and ``in_split(task)`` says
    whether it belongs to this split (e.g. by :func:`split_of` of its text).
    Index ``i`` is the first of ``draw(i, 0)``, ``draw(i, 1)``, ... that is in the split and not a task
    of an index below ``i``; so an index whose first candidate was new keeps it. Indices below
    ``prefix`` are built in order, once per process, and kept (``get`` is then a list look-up); later
    indices (the random draws of training, up to 2**31) take the first in-split candidate, unchecked.

    A generator's pool can run out (a warm-up level has a few hundred distinct questions). ``pool(i)``
    names the pool index ``i`` draws from (default: one pool); when ``max_attempts`` candidates in a row
    bring nothing new, that pool is exhausted: a ``train`` split then repeats its tasks (training samples
    with replacement anyway), a held-out split raises :class:`SplitExhausted` saying how many it holds.
    """

    def __init__(self, split: str, draw: Callable[[int, int], T], key: Callable[[T], str],
                 in_split: Callable[[T], bool], *, pool: Callable[[int], Hashable] | None = None,
                 max_attempts: int = 1000, prefix: int = DISTINCT_PREFIX, what: str = "tasks"):
        self.split, self.what = check_split(split), what
        self._draw, self._key, self._in_split, self._pool = draw, key, in_split, pool
        self.max_attempts, self.prefix = int(max_attempts), int(prefix)
        self._tasks: list[T] = []
        self._seen: set[str] = set()
        self._exhausted: dict[Hashable, int] = {}  # pool -> distinct tasks it gave before running out
        self._lock = threading.Lock()

    def get(self, index: int) -> T:
        """Task ``index`` of the split."""
        index = int(index)
        if index < 0:
            raise ValueError(f"task index must be >= 0, got {index}")
        if index >= self.prefix:
            return self._first_in_split(index)
        with self._lock:
            while len(self._tasks) <= index:
                self._tasks.append(self._next(len(self._tasks)))
            return self._tasks[index]

    def _first_in_split(self, index: int) -> T:
        for attempt in range(self.max_attempts):
            task = self._draw(index, attempt)
            if task is not None and self._in_split(task):
                return task
        raise RuntimeError(f"no {self.split} candidate among {self.max_attempts} draws for index {index}")

    def _next(self, index: int) -> T:
        pool = self._pool(index) if self._pool is not None else None
        if pool in self._exhausted:
            return self._exhausted_pool(index, pool)
        for attempt in range(self.max_attempts):
            task = self._draw(index, attempt)
            if task is None:
                continue
            key = self._key(task)
            if key not in self._seen and self._in_split(task):
                self._seen.add(key)
                return task
        self._exhausted[pool] = sum(1 for i in range(index) if pool is None or self._pool(i) == pool)
        return self._exhausted_pool(index, pool)

    def _exhausted_pool(self, index: int, pool: Hashable) -> T:
        if self.split == "train":
            return self._first_in_split(index)
        label = "" if pool is None else f" of kind {pool!r}"
        raise SplitExhausted(f"split {self.split!r} holds only {self._exhausted[pool]} distinct {self.what}{label} "
                             f"with these settings (task index {index} asks for more); use fewer episodes or "
                             "a larger task space")
