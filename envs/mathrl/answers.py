r"""Final-answer extraction and exact numeric equivalence for math responses. Pure functions.

Extraction order (:func:`extract_answer`): the last ``\boxed{...}`` (balanced braces), else the last
explicit "answer is / answer: / answer =" phrase followed by a number, else the last number in the
text. A present box decides even when its content is not a number (the model committed to it).

Equivalence (:func:`answers_equal`) is exact rational comparison (:class:`fractions.Fraction`) after
normalising the many ways one number is written: ``0.5 = 1/2 = \frac{1}{2} = \dfrac12 = .5``,
``-3 = -3.0 = −3``, ``1,234 = 1{,}234 = 1\,234 = 1234``, ``1\frac{1}{2} = 1 1/2 = 3/2`` (mixed numbers),
``$12``, ``12 \text{ apples}``, ``x = 5``. Decisions:

* A decimal is the rational it spells: ``0.333`` is not ``1/3`` (no rounding tolerance; our
  generated answers are exact, and tolerance would reward a rounded guess).
* ``%`` is a unit and is dropped: ``50%`` equals ``50``, not ``0.5``. Questions that want a
  percentage expect the number of percent; a question whose answer is a fraction wants the fraction.
* Irrational or symbolic answers (``\sqrt{2}``, ``\pi``) do not parse and are never equal.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction

from agentgym.parsing import extract_boxed

__all__ = ["Extracted", "extract_answer", "parse_number", "answers_equal", "format_fraction", "latex_fraction",
           "NUMBER_PATTERN"]

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
    """The last balanced, non-empty ``\\boxed{...}`` with its span (``extract_boxed`` decides the content)."""
    for m in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))):
        content = extract_boxed(text[m.start():], "first")
        if content is None or not content.strip():
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "\\":
                i += 2
                continue
            depth += (text[i] == "{") - (text[i] == "}")
            i += 1
        return Extracted(content.strip(), "boxed", m.start(), i)
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


def answers_equal(prediction: str | None, gold: str) -> bool:
    """Exact equality of the numbers two strings denote (see the module docstring)."""
    p, g = parse_number(prediction), parse_number(gold)
    if p is None or g is None:
        return False
    return p == g


def format_fraction(value: Fraction) -> str:
    """Canonical plain form: ``"3"``, ``"-1/2"``."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def latex_fraction(value: Fraction) -> str:
    r"""LaTeX form: ``"3"``, ``"-\frac{1}{2}"``."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
