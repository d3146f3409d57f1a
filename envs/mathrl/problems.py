"""Procedural math problems with exact answers: arithmetic, fractions, linear equations, word problems.

``make_problem(split, index, kinds, difficulty)`` is a pure function of its arguments: the generator
is seeded by ``(split, index)``, so any index (there is no upper bound) is a reproducible task.
``difficulty`` (an int >= 0, no upper bound; 0 is a warm-up level) scales both the numbers and the number of steps.

The splits ``train``, ``validation`` and ``test`` are disjoint *by construction*: a candidate problem
belongs to the split that a hash of its question text names (:func:`split_of`: test one fifth, as before
validation existed, validation one fifth, train the rest), and each split rejects the others'
candidates, so no held-out question can ever be generated for training (small difficulties have few
distinct problems, where seeded streams alone would collide). Within a split, index ``i`` never
repeats an earlier index's question (:class:`agentgym.splits.DistinctDraws`: an index whose candidate
was already asked draws again); the warm-up level (``kinds=["arithmetic"], difficulty=0``) holds about
256 distinct test questions, and a held-out index beyond a level's supply is an error.

Every problem carries its worked solution (``steps``): the oracle writes them out, and the
answer-guessing detector compares the response's reasoning against ``min_steps``.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any, Callable, Sequence

import numpy as np

from agentgym.splits import DistinctDraws, normalise_task_text
from agentgym.splits import split_of as _split_of
from agentgym.envs.mathrl.answers import format_fraction

__all__ = ["KINDS", "SPLITS", "make_problem", "split_of"]

SPLITS = {"train": 0, "test": 1, "validation": 2}  # split -> seed of its candidate stream
KINDS = ("arithmetic", "fractions", "linear", "word")


def split_of(question: str) -> str:
    """The split a question text belongs to (stable across machines and Python versions): one in five
    (by a hash of the text, generated questions being canonical) is ``test``, one in five ``validation``."""
    return _split_of(question, test_every=5, validation_every=4)


# --------------------------------------------------------------------------- helpers
def _int(rng: np.random.Generator, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi] (Python int: no overflow at high difficulty)."""
    if hi - lo < 2**62:
        return lo + int(rng.integers(0, hi - lo + 1))
    return lo + int.from_bytes(rng.bytes(((hi - lo).bit_length() + 7) // 8 + 8), "big") % (hi - lo + 1)


def _signed(rng: np.random.Generator, lo: int, hi: int) -> int:
    v = _int(rng, lo, hi)
    return -v if rng.random() < 0.5 else v


def _fmt(v: Fraction | int) -> str:
    return format_fraction(Fraction(v))


def _paren(v: Fraction | int) -> str:
    s = _fmt(v)
    return f"({s})" if s.startswith("-") or "/" in s else s


# --------------------------------------------------------------------------- arithmetic
_OPS: dict[str, tuple[int, Callable[[Fraction, Fraction], Fraction]]] = {
    "+": (1, lambda a, b: a + b), "-": (1, lambda a, b: a - b),
    "×": (2, lambda a, b: a * b), "÷": (2, lambda a, b: a / b)}


def _expr(rng: np.random.Generator, n_ops: int, hi: int) -> Any:
    """A random expression tree with ``n_ops`` operators; leaves are ints, ``÷`` divides exactly."""
    if n_ops == 0:
        return _int(rng, 1, hi)
    k = _int(rng, 0, n_ops - 1)
    op = str(rng.choice(["+", "-", "×", "+", "-", "×", "÷"]))
    if op == "÷":  # exact division of two leaves keeps the answer an integer
        b = _int(rng, 2, max(2, min(12, hi)))
        return ("÷", b * _int(rng, 1, max(1, hi // 2)), b) if n_ops == 1 else ("+", _expr(rng, k, hi),
                                                                                _expr(rng, n_ops - 1 - k, hi))
    if op == "×":  # keep products readable: one small factor
        return (op, _expr(rng, k, hi), _expr(rng, n_ops - 1 - k, max(2, min(hi, 20))))
    return (op, _expr(rng, k, hi), _expr(rng, n_ops - 1 - k, hi))


def _render(node: Any, parent_prec: int = 0, right: bool = False) -> str:
    if not isinstance(node, tuple):
        return str(node)
    op, a, b = node
    prec = _OPS[op][0]
    text = f"{_render(a, prec)} {op} {_render(b, prec, right=True)}"
    if prec < parent_prec or (right and prec == parent_prec):
        text = f"({text})"
    return text


def _evaluate(node: Any, steps: list[str]) -> Fraction:
    if not isinstance(node, tuple):
        return Fraction(node)
    op, a, b = node
    x, y = _evaluate(a, steps), _evaluate(b, steps)
    v = _OPS[op][1](x, y)
    steps.append(f"{_paren(x)} {op} {_paren(y)} = {_fmt(v)}")
    return v


def _arithmetic(rng: np.random.Generator, d: int) -> dict[str, Any]:
    n_ops = 1 + d
    node = _expr(rng, n_ops, 2 * 10 ** (1 + d // 2))
    steps: list[str] = []
    value = _evaluate(node, steps)
    expr = _render(node)
    return {"question": f"Compute {expr}.", "answer": value, "steps": steps,
            "python": expr.replace("×", "*").replace("÷", "//")}  # ÷ is exact here: integer arithmetic


# --------------------------------------------------------------------------- fractions
def _fractions(rng: np.random.Generator, d: int) -> dict[str, Any]:
    n_terms = 2 + d // 2
    max_den = 3 + 3 * d
    terms = [Fraction(_int(rng, 1, max_den), _int(rng, 2, max_den)) for _ in range(n_terms)]
    ops = [str(rng.choice(["+", "-", "×", "÷"])) for _ in range(n_terms - 1)]
    text = _paren(terms[0])  # "(a/b)": "1/2 ÷ 3/4" would read as ((1/2) ÷ 3) / 4
    value = terms[0]
    steps = []
    for op, t in zip(ops, terms[1:]):
        new = _OPS[op][1](value, t)
        if op in "+-":
            den = value.denominator * t.denominator // math.gcd(value.denominator, t.denominator)
            a, b = value * den, t * den
            steps.append(f"{_paren(value)} {op} {_paren(t)} = {_fmt(a)}/{den} {op} {_fmt(b)}/{den} = {_fmt(new)}")
        elif op == "×":
            steps.append(f"{_paren(value)} × {_paren(t)} = {_fmt(new)}")
        else:
            steps.append(f"{_paren(value)} ÷ {_paren(t)} = {_paren(value)} × {_paren(1 / t)} = {_fmt(new)}")
        text = f"[{text}] {op} {_paren(t)}" if " " in text else f"{text} {op} {_paren(t)}"
        value = new
    text = text.replace("[", "(").replace("]", ")")
    return {"question": f"Compute {text}. Give the answer as a fraction in lowest terms (or an integer).",
            "answer": value, "steps": steps, "python": _fraction_python(terms, ops)}


def _fmt_term(f: Fraction) -> str:
    return f"{f.numerator}/{f.denominator}" if f.denominator != 1 else str(f.numerator)


def _fraction_python(terms: Sequence[Fraction], ops: Sequence[str]) -> str:
    code = f"F({terms[0].numerator}, {terms[0].denominator})"
    for op, t in zip(ops, terms[1:]):
        sym = {"+": "+", "-": "-", "×": "*", "÷": "/"}[op]
        code = f"({code} {sym} F({t.numerator}, {t.denominator}))"
    return code


# --------------------------------------------------------------------------- linear equations
def _side(coef: int, const: int, var: str = "x") -> str:
    parts = []
    if coef:
        parts.append(("-" if coef == -1 else "" if coef == 1 else str(coef)) + var)
    if const or not parts:
        if parts:
            parts.append(f"{'-' if const < 0 else '+'} {abs(const)}")
        else:
            parts.append(str(const))
    return " ".join(parts)


def _linear(rng: np.random.Generator, d: int) -> dict[str, Any]:
    hi = 5 * d + 5
    q = 1 if d < 3 else _int(rng, 1, min(2 + d, 9))
    x = Fraction(_signed(rng, 0, hi), q)
    k = _signed(rng, 1, 3)
    c = _signed(rng, 0, hi) if d >= 2 else 0
    a = c + k * q
    if a == 0:
        a, c = c + 2 * k * q, c + k * q  # keep a - c = k*q, a != 0
    b = _signed(rng, 0, 10 * hi)
    rhs = int((a - c) * x + b)
    steps = []
    if d >= 4 and a != 0 and b % a == 0 and b:
        e = b // a
        left = f"{a}(x {'-' if e < 0 else '+'} {abs(e)})"
        steps.append(f"Expand: {a}(x {'-' if e < 0 else '+'} {abs(e)}) = {_side(a, b)}")
    else:
        left = _side(a, b)
    question = f"Solve for x: {left} = {_side(c, rhs)}."
    if c:
        move = f"Subtract {_side(c, 0)} from" if c > 0 else f"Add {_side(-c, 0)} to"
        steps.append(f"{move} both sides: {_side(a - c, b)} = {rhs}")
    if b:
        steps.append(f"{'Subtract' if b > 0 else 'Add'} {abs(b)} {'from' if b > 0 else 'to'} both sides: "
                     f"{_side(a - c, 0)} = {rhs - b}")
    if a - c != 1:
        steps.append(f"Divide both sides by {a - c}: x = {_fmt(rhs - b)}/{_paren(a - c)} = {_fmt(x)}")
    python = f"(F({rhs}) - F({b})) / F({a - c})"
    return {"question": question + (" Give x as a fraction in lowest terms if it is not an integer." if q > 1 else ""),
            "answer": x, "steps": steps, "python": python}


# --------------------------------------------------------------------------- word problems
_NAMES = ("Maya", "Tomas", "Aiko", "Femi", "Lena", "Ravi", "Noor", "Jonas", "Ines", "Kofi")
_ITEMS = (("pencil", "pencils"), ("notebook", "notebooks"), ("apple", "apples"), ("ticket", "tickets"),
          ("sticker", "stickers"), ("marble", "marbles"))


def _word(rng: np.random.Generator, d: int) -> dict[str, Any]:
    scale = 10 ** (d - 1)
    name = str(rng.choice(_NAMES))
    template = _int(rng, 0, 5)
    if template == 0:  # shopping with change
        (s1, p1), (s2, p2) = [_ITEMS[i] for i in rng.choice(len(_ITEMS), size=2, replace=False)]
        c1, c2 = _int(rng, 1, 9) * scale, _int(rng, 1, 9) * scale
        n1, n2 = _int(rng, 2, 9), _int(rng, 2, 9)
        total = c1 * n1 + c2 * n2
        paid = (total // (10 * scale) + 1) * 10 * scale
        q = (f"A shop sells {p1} for ${c1} each and {p2} for ${c2} each. {name} buys {n1} {p1} and {n2} {p2} "
             f"and pays with ${paid}. How many dollars of change does {name} get?")
        steps = [f"{n1} × {c1} = {c1 * n1}", f"{n2} × {c2} = {c2 * n2}", f"{c1 * n1} + {c2 * n2} = {total}",
                 f"{paid} - {total} = {paid - total}"]
        return {"question": q, "answer": Fraction(paid - total), "steps": steps,
                "python": f"{paid} - ({n1} * {c1} + {n2} * {c2})"}
    if template == 1:  # distance over two legs
        v, t, w, s = _int(rng, 3, 12) * 10, _int(rng, 1, 3 + d), _int(rng, 3, 12) * 10, _int(rng, 1, 3 + d)
        q = (f"A train travels at {v} km/h for {t} hours and then at {w} km/h for {s} hours. "
             "How many kilometres does it travel in total?")
        steps = [f"{v} × {t} = {v * t}", f"{w} × {s} = {w * s}", f"{v * t} + {w * s} = {v * t + w * s}"]
        return {"question": q, "answer": Fraction(v * t + w * s), "steps": steps, "python": f"{v} * {t} + {w} * {s}"}
    if template == 2:  # equal sharing after keeping some
        single, plural = _ITEMS[_int(rng, 0, len(_ITEMS) - 1)]
        k, each, kept = _int(rng, 2, 9), _int(rng, 2, 12) * scale, _int(rng, 1, 20) * scale
        total = k * each + kept
        q = (f"{name} has {total} {plural}, keeps {kept} and shares the rest equally among {k} friends. "
             f"How many {plural} does each friend get?")
        steps = [f"{total} - {kept} = {total - kept}", f"{total - kept} ÷ {k} = {each}"]
        return {"question": q, "answer": Fraction(each), "steps": steps, "python": f"({total} - {kept}) // {k}"}
    if template == 3:  # ages
        young, gap, years = _int(rng, 3, 20 + 10 * d), _int(rng, 2, 15), _int(rng, 1, 10)
        other = str(rng.choice([n for n in _NAMES if n != name]))
        total = 2 * young + gap + 2 * years
        q = (f"{name} is {gap} years older than {other}. In {years} years the sum of their ages will be {total}. "
             f"How old is {other} now?")
        steps = [f"Now the sum of their ages is {total} - 2 × {years} = {total - 2 * years}",
                 f"Without the age gap: {total - 2 * years} - {gap} = {total - 2 * years - gap}",
                 f"{other} is {total - 2 * years - gap} ÷ 2 = {young}"]
        return {"question": q, "answer": Fraction(young), "steps": steps,
                "python": f"({total} - 2 * {years} - {gap}) // 2"}
    if template == 4:  # discount
        price = _int(rng, 1, 20) * 20 * scale
        pct = _int(rng, 1, 19) * 5
        off = Fraction(price * pct, 100)
        q = f"A jacket costs ${price}. It is sold at a {pct}% discount. What is the sale price in dollars?"
        steps = [f"{pct}% of {price} = {price} × {pct} ÷ 100 = {_fmt(off)}",
                 f"{price} - {_fmt(off)} = {_fmt(price - off)}"]
        return {"question": q, "answer": Fraction(price) - off, "steps": steps,
                "python": f"F({price}) - F({price} * {pct}, 100)"}
    # template 5: filling a tank with a leak
    fill, leak, minutes = _int(rng, 5, 30), _int(rng, 1, 4), _int(rng, 2, 20) * max(1, d - 1)
    leak = min(leak, fill - 1)
    volume = (fill - leak) * minutes
    q = (f"An empty tank holds {volume} litres. A pipe fills it with {fill} litres per minute while a leak drains "
         f"{leak} litres per minute. After how many minutes is the tank full?")
    steps = [f"Net rate: {fill} - {leak} = {fill - leak} litres per minute", f"{volume} ÷ {fill - leak} = {minutes}"]
    return {"question": q, "answer": Fraction(minutes), "steps": steps, "python": f"{volume} // ({fill} - {leak})"}


_GENERATORS: dict[str, Callable[[np.random.Generator, int], dict[str, Any]]] = {
    "arithmetic": _arithmetic, "fractions": _fractions, "linear": _linear, "word": _word}


def _candidate(split: str, kinds: tuple[str, ...], difficulty: int | tuple[int, int], index: int,
               attempt: int) -> dict[str, Any]:
    """Candidate ``attempt`` for task ``index`` of ``split`` (a pure function of its arguments)."""
    rng = np.random.default_rng([SPLITS[split], int(index), attempt])
    kind = str(kinds[_int(rng, 0, len(kinds) - 1)])
    d = difficulty if isinstance(difficulty, int) else _int(rng, int(difficulty[0]), int(difficulty[1]))
    p = _GENERATORS[kind](rng, d if kind == "arithmetic" else max(d, 1))  # level 0 exists for arithmetic only
    answer = format_fraction(p["answer"])
    return {"question": p["question"], "answer": answer, "answers": [answer], "kind": kind, "difficulty": d,
            "steps": list(p["steps"]), "min_steps": len(p["steps"]), "python": p["python"]}


@functools.lru_cache(maxsize=32)
def _draws(split: str, kinds: tuple[str, ...], difficulty: int | tuple[int, int]) -> DistinctDraws:
    """The task sequence of one (split, kinds, difficulty), shared by every env of the process."""
    return DistinctDraws(split, functools.partial(_candidate, split, kinds, difficulty),
                         key=lambda t: normalise_task_text(t["question"]),
                         in_split=lambda t: split_of(t["question"]) == split, what="questions")


def make_problem(split: str, index: int, kinds: Sequence[str] = KINDS,
                 difficulty: int | tuple[int, int] = (1, 3)) -> dict[str, Any]:
    """Task ``index`` of ``split``: ``question``, ``answer`` (canonical string) and ``answers``, ``kind``,
    ``difficulty``, worked ``steps``, ``min_steps`` and ``python`` (an expression computing the answer,
    with ``F`` = ``fractions.Fraction``). The first :data:`~agentgym.splits.DISTINCT_PREFIX` indices of a
    split hold distinct questions; a held-out index beyond what the settings can supply raises
    :class:`~agentgym.splits.SplitExhausted` (a ``ValueError``)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    d = difficulty if isinstance(difficulty, int) else (int(difficulty[0]), int(difficulty[1]))
    p = _draws(split, tuple(str(k) for k in kinds), d).get(index)
    return {**p, "answers": list(p["answers"]), "steps": list(p["steps"])}
