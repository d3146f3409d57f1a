r"""Final-answer extraction and answer equivalence for math responses: exact numbers, then math-verify.

Extraction order (:func:`extract_answer`): the last ``\boxed{...}`` (balanced braces), else the last
explicit "answer is / answer: / answer =" phrase followed by a number, else the last number in the
text. A present box decides even when its content is not a number (the model committed to it).

Equivalence (:func:`answers_equal`) has two paths.

1. **Exact numbers first.** When both strings parse as plain numbers (:func:`parse_number`), they are
   compared as exact rationals (:class:`fractions.Fraction`) after normalising the many ways one
   number is written: ``0.5 = 1/2 = \frac{1}{2} = \dfrac12 = .5``, ``-3 = -3.0 = −3``,
   ``1,234 = 1{,}234 = 1\,234 = 1234``, ``1\frac{1}{2} = 1 1/2 = 3/2`` (mixed numbers), ``$12``,
   ``12 \text{ apples}``, ``x = 5``. This path is fast (no sympy) and decides every Math-v0 answer.
2. **math-verify for the rest.** When either side is not a plain number (``\frac{\sqrt{2}}{2}``,
   ``2\pi``, ``\{1,2\}``, ``[0, 1)``, ``x^2+1``), HuggingFace's ``math-verify`` decides
   (``verify(parse(gold), parse(prediction))``, each answer wrapped in ``$...$``; gold first: the
   order matters to math-verify for equations, e.g. gold ``5`` takes the right side of ``x = 5``).

Decisions:

* A decimal is the rational it spells: ``0.333`` is not ``1/3`` (no rounding tolerance; our
  generated answers are exact, and tolerance would reward a rounded guess). math-verify rounds a
  float to ``float_rounding`` (6) places, so a side that parses as a plain number is handed to it as
  an exact ``\frac{p}{q}``, never as a float: ``0.7071`` is not ``\frac{\sqrt{2}}{2}``. A plain
  decimal too long or too large for path 1 is unequal to everything. Floats *inside* an expression
  (``0.5\pi``) are compared by math-verify with ``float_rounding=15`` (its 15-digit precision), not 6.
* ``%`` is a unit and is dropped on path 1: ``50%`` equals ``50``, not ``0.5``. Questions that want a
  percentage expect the number of percent; a question whose answer is a fraction wants the fraction.
  (math-verify's own reading, ``50\% = 1/2``, applies only to answers path 1 cannot parse.)
* Bounded time: sympy can take unbounded time and memory on hostile input (``9^{9^{9^{9}}}``).
  math-verify bounds itself with ``signal.alarm``, which works only in the main thread, cancels any
  alarm the caller set (pytest-timeout's, for one) and cannot interrupt long C calls. So it runs in
  one long-lived helper process (``python -c``, started on first use, shared by the threads of this
  process, serialised by a lock), with its own timeouts off (``parsing_timeout=None``,
  ``timeout_seconds=None``), a per-request alarm there of ``timeout_s`` (default
  :data:`VERIFY_TIMEOUT_S`), a memory cap (:data:`VERIFY_MEMORY_MB` over its start-up size), and a
  hard deadline here: a helper that does not answer in time is killed (the next call starts a new
  one) and the answers are unequal. Any thread may call :func:`answers_equal`; it never raises.
* Inputs longer than :data:`VERIFY_MAX_CHARS`, nested deeper than :data:`VERIFY_MAX_DEPTH` brackets,
  or without a single letter or digit are unequal without being parsed. Results are memoised (a GRPO
  group repeats one gold).
* Without ``math-verify`` installed, path 2 says unequal (a warning is logged once): the exact path,
  as before.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from fractions import Fraction

from agentgym.parsing import boxed_spans

__all__ = ["Extracted", "extract_answer", "parse_number", "answers_equal", "format_fraction", "latex_fraction",
           "NUMBER_PATTERN", "VERIFY_TIMEOUT_S", "VERIFY_MEMORY_MB", "VERIFY_MAX_CHARS", "VERIFY_MAX_DEPTH"]

logger = logging.getLogger(__name__)

_MAX_LEN = 200        # longer "numbers" are not answers (and int() of huge strings is slow)
_MAX_EXPONENT = 400   # 1e999999999 would build a gigantic integer
_MAX_VALUE = 10 ** _MAX_EXPONENT

# A number as written in text: LaTeX fraction (optionally mixed: 1\frac{1}{2}), a/b, decimal with
# thousands separators, leading-dot decimal. A sign counts only where it cannot be a binary minus.
_FRAC = r"\\[dt]?frac\s*(?:\{[^{}]{1,40}\}|\d)\s*(?:\{[^{}]{1,40}\}|\d)"
_DEC = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
NUMBER_PATTERN = (rf"(?:(?<![\w)\]}}.])-)?(?:(?:\d+\s*)?{_FRAC}|(?:{_DEC})(?:\s*/\s*(?:{_DEC}))?)")
_NUMBER_RE = re.compile(NUMBER_PATTERN)
_PHRASE_RE = re.compile(r"\banswer\b[\s*_]*(?:is\b|=|:|(?:would|will|should) be\b)[\s*_:$]*", re.IGNORECASE)


@dataclass(frozen=True)
class Extracted:
    """An extracted final answer: its text, how it was found, and where (offsets into the response)."""
    text: str
    method: str  # "boxed" | "phrase" | "last_number"
    start: int
    end: int


def extract_answer(text: str) -> Extracted | None:
    """The response's final answer (see the module docstring for the order), or None."""
    text = text.replace("\u2212", "-")
    box = _last_box(text)
    if box is not None:
        return box
    phrase = None
    for m in _PHRASE_RE.finditer(text):
        phrase = m
    if phrase is not None:
        window = text[phrase.end():phrase.end() + 100]
        n = _NUMBER_RE.search(window)
        if n is not None:
            return Extracted(n.group(0).strip(), "phrase", phrase.end() + n.start(), phrase.end() + n.end())
    last = None
    for last in _NUMBER_RE.finditer(text):
        pass
    if last is not None:
        return Extracted(last.group(0).strip(), "last_number", last.start(), last.end())
    return None


def _last_box(text: str) -> Extracted | None:
    """The last balanced, non-empty ``\\boxed{...}`` with its span (one linear pass: ``boxed_spans``)."""
    for start, content_start, end in reversed(boxed_spans(text)):
        content = text[content_start:end - 1].strip()
        if content:
            return Extracted(content, "boxed", start, end)
    return None


# --------------------------------------------------------------------------- parsing numbers
_STRIP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\$", "$", "\\(", "\\)", "\\[", "\\]",
          "\\displaystyle")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_UNIT_TAIL = re.compile(r"^(.*?\d)\s*(?:[A-Za-z][A-Za-z ./]*)?$")
_DECIMAL = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?(\d+))?$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_LATEX_FRAC = re.compile(r"^(-)?\\frac\s*(\{[^{}]*\}|\d)\s*(\{[^{}]*\}|\d)$")
_LATEX_MIXED = re.compile(r"^(-)?(\d+)\s*\\frac\s*(\{\d+\}|\d)\s*(\{\d+\}|\d)$")
_PLAIN_MIXED = re.compile(r"^(-)?(\d+)\s+(\d+)\s*/\s*(\d+)$")


def _decimal(s: str) -> Fraction | None:
    s = s.strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    m = _DECIMAL.match(s)
    if m is None or (m.group(1) is not None and len(m.group(1)) > 3):
        return None
    try:
        value = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    if value.denominator > _MAX_VALUE or abs(value) > _MAX_VALUE:
        return None
    return value


def _ratio(num: Fraction | None, den: Fraction | None) -> Fraction | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def _unbrace(s: str) -> str:
    s = s.strip()
    while len(s) >= 2 and ((s[0] == "{" and s[-1] == "}") or (s[0] == "(" and s[-1] == ")")):
        inner, depth = s[1:-1], 0
        for ch in inner:  # only strip a pair that wraps the whole string
            depth += (ch in "{(") - (ch in "})")
            if depth < 0:
                return s
        if depth:
            return s
        s = inner.strip()
    return s


def parse_number(text: str | None) -> Fraction | None:
    r"""The exact value of a written number (``"1/2"``, ``"\dfrac{1}{2}"``, ``"1,234.5"``, ``"50\%"``), else None.

    Memoised (results are immutable): one Math-v0 step parses the same gold and predicted strings
    several times (validation at reset, the ``correct`` term, the episode summary), and a GRPO group
    repeats one task's gold answer ``group_size`` times."""
    if text is None:
        return None
    s = str(text).strip()
    if not s or len(s) > _MAX_LEN:  # checked before the cache: its keys stay short
        return None
    return _parse_number(s)


@functools.lru_cache(maxsize=8192)
def _parse_number(s: str) -> Fraction | None:
    s = s.replace("\u2212", "-").replace("{,}", ",").replace("\\%", "%").replace("\\dfrac", "\\frac")
    s = s.replace("\\tfrac", "\\frac").replace("\\cdot", "*")
    s = _TEXT_CMD.sub(r" \1 ", s)
    for token in _STRIP:
        s = s.replace(token, " " if token in ("\\,", "\\ ", "~", "\\;", "\\:") else "")
    s = s.strip().rstrip(".").strip()
    if "=" in s:  # "x = 5"
        s = s.rsplit("=", 1)[1].strip()
    s = _unbrace(s)
    if s.endswith("%"):
        s = s[:-1].strip()
    s = re.sub(r"(?<=\d) (?=\d{3}\b)", "", s)  # "1 234" written with a (thin) space separator
    m = _UNIT_TAIL.match(s)
    if m is not None and m.group(1) != s and not s.rstrip().endswith("}"):
        s = m.group(1)  # "12 apples", "5 km"
    s = s.strip()
    if s.startswith("+"):
        s = s[1:].strip()
    m = _LATEX_MIXED.match(s)
    if m:
        whole = Fraction(int(m.group(2)))
        frac = _ratio(_decimal(m.group(3).strip("{}")), _decimal(m.group(4).strip("{}")))
        if frac is None:
            return None
        value = whole + frac
        return -value if m.group(1) else value
    m = _LATEX_FRAC.match(s)
    if m:
        value = _ratio(parse_number(m.group(2)[1:-1] if m.group(2).startswith("{") else m.group(2)),
                       parse_number(m.group(3)[1:-1] if m.group(3).startswith("{") else m.group(3)))
        if value is None:
            return None
        return -value if m.group(1) else value
    m = _PLAIN_MIXED.match(s)
    if m:
        frac = _ratio(Fraction(int(m.group(3))), Fraction(int(m.group(4))))
        if frac is None:
            return None
        value = int(m.group(2)) + frac
        return -value if m.group(1) else value
    if s.count("/") == 1:
        num, den = s.split("/")
        return _ratio(_decimal(num), _decimal(den))
    if s.startswith("-") and s[1:].strip() and not s[1:].strip().startswith("-"):
        inner = parse_number(s[1:])
        return -inner if inner is not None else None
    return _decimal(s)


def answers_equal(prediction: str | None, gold: str, *, timeout_s: float | None = None) -> bool:
    """Whether ``prediction`` denotes the same answer as ``gold``: exact numbers first, then math-verify
    within ``timeout_s`` seconds (default :data:`VERIFY_TIMEOUT_S`). Never raises; see the module docstring."""
    if prediction is None or gold is None:
        return False
    pred_s, gold_s = _strip_dollars(str(prediction)), _strip_dollars(str(gold))
    if not pred_s or not gold_s:
        return False
    p, g = parse_number(pred_s), parse_number(gold_s)
    if p is not None and g is not None:
        return p == g
    sides = [(pred_s, p), (gold_s, g)]
    if any(v is None and _PLAIN_NUMBER.match(s) for s, v in sides):
        return False  # a plain number path 1 refused (too long, too large): never a float for math-verify
    if any(len(s) > VERIFY_MAX_CHARS or _nesting(s) > VERIFY_MAX_DEPTH or not any(ch.isalnum() for ch in s)
           for s, v in sides if v is None):
        return False  # too big to parse safely, or no digit, letter or command name: nothing to compare
    pred_tex = latex_fraction(p) if p is not None else pred_s
    gold_tex = latex_fraction(g) if g is not None else gold_s
    return _verify_cached(gold_tex, pred_tex, float(VERIFY_TIMEOUT_S if timeout_s is None else timeout_s))


# --------------------------------------------------------------------------- math-verify, in a helper process
VERIFY_TIMEOUT_S = 5.0      # seconds one math-verify comparison may take (parse of both + verify)
VERIFY_MEMORY_MB = 1024     # address space the helper may grow by beyond its start-up size
VERIFY_MAX_CHARS = 1000     # longer non-numeric answers are unequal unparsed
VERIFY_MAX_DEPTH = 30       # so are answers nested deeper than this in {[( brackets
_START_TIMEOUT_S = 120.0    # importing sympy on a loaded machine
_GRACE_S = 2.0              # the helper's own alarm fires first; this deadline catches a stuck C call

_PLAIN_NUMBER = re.compile(r"^[+-]?(?:\d*\.?\d+|\d+\.)(?:[eE][+-]?\d+)?%?$")


def _strip_dollars(s: str) -> str:
    s = s.strip()
    while len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s[1:-1].strip()
    return s


def _nesting(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        if ch in "{[(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}])":
            depth = max(0, depth - 1)
    return deepest


# Runs in the helper (``python -c``): replies one JSON line per request line; math-verify's own
# signal-based timeouts are off, the alarm here covers parse + verify of one request.
_HELPER = r"""
import json, os, resource, signal, sys

class Late(BaseException):
    pass

def alarm(signum, frame):
    raise Late()

def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()

try:
    from math_verify import parse, verify
except Exception as e:
    reply({"error": f"{type(e).__name__}: {e}"})
    sys.exit(0)
signal.signal(signal.SIGALRM, alarm)
try:  # a memory cap over the start-up size (Linux); where it cannot be set, the time bound remains
    with open("/proc/self/statm") as f:
        limit = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + int(sys.argv[1]) * 2 ** 20
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
except (OSError, ValueError):
    pass

def compare(req):
    signal.setitimer(signal.ITIMER_REAL, req["timeout"])
    try:
        gold = parse("$" + req["gold"] + "$", parsing_timeout=None)
        pred = parse("$" + req["pred"] + "$", parsing_timeout=None)
        return bool(gold) and bool(pred) and bool(verify(gold, pred, float_rounding=15, timeout_seconds=None))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)

reply({"ready": True})
for line in sys.stdin:
    try:
        ok = compare(json.loads(line))
    except BaseException:
        ok = False
    reply(ok)
"""


class _Helper:
    """The math-verify helper process: started on first use, killed when late, one request at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._buf = b""
        self.unavailable: str | None = None

    def after_fork_in_child(self) -> None:
        """A forked child starts its own helper: the pipes (and maybe a held lock) are the parent's."""
        if self._proc is not None:
            for pipe in (self._proc.stdin, self._proc.stdout):
                try:
                    pipe.close()  # this process's copies only; the parent keeps its helper
                except OSError:
                    pass
        self._lock, self._proc, self._buf = threading.Lock(), None, b""

    def compare(self, gold: str, pred: str, timeout_s: float) -> bool:
        with self._lock:
            if self.unavailable is not None:
                return False
            try:
                proc = self._running()
                if proc is None:
                    return False
                proc.stdin.write((json.dumps({"gold": gold, "pred": pred, "timeout": timeout_s}) + "\n").encode())
                proc.stdin.flush()
                return self._read(proc, timeout_s + _GRACE_S) is True
            except (OSError, ValueError, TimeoutError, EOFError):
                self._stop()
                return False

    def _running(self) -> subprocess.Popen | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        try:
            self._proc = subprocess.Popen([sys.executable, "-c", _HELPER, str(int(VERIFY_MEMORY_MB))],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          start_new_session=True)  # a terminal's Ctrl-C is the parent's to handle
            hello = self._read(self._proc, _START_TIMEOUT_S)
            why = None if isinstance(hello, dict) and hello.get("ready") else \
                str(hello.get("error") if isinstance(hello, dict) else hello)
        except (OSError, ValueError, TimeoutError, EOFError) as e:
            why = f"its helper did not start: {type(e).__name__}: {e}"
        if why is not None:  # not installed, or no process can start: the exact path only, said once
            self._stop()
            self.unavailable = why
            logger.warning("math-verify is unavailable (%s): non-numeric answers count as unequal", why)
            return None
        return self._proc

    def _read(self, proc: subprocess.Popen, timeout_s: float) -> object:
        """The next JSON line from the helper; TimeoutError past the deadline, EOFError if it died."""
        deadline = time.monotonic() + timeout_s
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("math-verify helper did not answer in time")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("math-verify helper exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _stop(self) -> None:
        proc, self._proc, self._buf = self._proc, None, b""
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._stop()


_HELPER_PROCESS = _Helper()
atexit.register(_HELPER_PROCESS.close)
os.register_at_fork(after_in_child=_HELPER_PROCESS.after_fork_in_child)


@functools.lru_cache(maxsize=4096)
def _verify_cached(gold: str, pred: str, timeout_s: float) -> bool:
    return _HELPER_PROCESS.compare(gold, pred, timeout_s)


def format_fraction(value: Fraction) -> str:
    """Canonical plain form: ``"3"``, ``"-1/2"``."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def latex_fraction(value: Fraction) -> str:
    r"""LaTeX form: ``"3"``, ``"-\frac{1}{2}"``."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
