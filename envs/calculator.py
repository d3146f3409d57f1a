"""A safe arithmetic evaluator used as the ``calculator`` tool (no ``eval``)."""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

from agentgym.parsing import parse_python

__all__ = ["calculate", "calculator"]

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPR = 500
_MAX_POW = 1_000
_MAX_DIGITS = 4_000
_MAX_BITS = int(_MAX_DIGITS * 3.33)


def _bits(x: int | Fraction) -> int:
    """Size of an exact number: the longer of numerator and denominator, in bits."""
    f = Fraction(x)
    return max(f.numerator.bit_length(), f.denominator.bit_length())


def _pow(left: int | Fraction | float, right: int | Fraction | float) -> int | Fraction | float:
    if abs(right) > _MAX_POW:
        raise ValueError(f"exponent too large (> {_MAX_POW})")
    if isinstance(left, float) or isinstance(right, float) or Fraction(right).denominator != 1:
        # a non-integer power is irrational in general: floating point
        if left < 0:
            raise ValueError("fractional power of a negative number")
        if left == 0 and right < 0:
            raise ValueError("division by zero")
        return float(left) ** float(right)
    base, exponent = Fraction(left), int(right)
    if base == 0 and exponent < 0:
        raise ValueError("division by zero")
    if _bits(base) * abs(exponent) > _MAX_BITS:
        raise ValueError("result too large")
    return base ** exponent  # exact, also for negative exponents (2**-1 == 1/2)


def calculate(expression: str) -> int | float | Fraction:
    """Evaluate ``+ - * / // % **`` and parentheses on numbers exactly (``/`` gives a Fraction).

    Decimal literals are exact (``0.1 + 0.2 == 3/10``); only non-integer powers (``2 ** 0.5``) give
    a float. Raises ValueError with a readable message on anything else (names, calls, huge powers).
    """
    if len(expression) > _MAX_EXPR:
        raise ValueError(f"expression longer than {_MAX_EXPR} characters")
    expression = expression.replace("×", "*").replace("÷", "/").replace("^", "**").replace(",", "")
    try:
        tree = parse_python(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None

    def ev(node: ast.AST) -> int | Fraction | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            if isinstance(node.value, int):
                return node.value
            if not math.isfinite(node.value):
                raise ValueError("number too large")
            return Fraction(repr(node.value))  # the decimal as written, not its binary approximation
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow):
                out = _pow(left, right)
            elif isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            elif isinstance(node.op, ast.Div) and not isinstance(left, float) and not isinstance(right, float):
                out = Fraction(left) / Fraction(right)
            else:
                out = _BINOPS[type(node.op)](left, right)
            if isinstance(out, float):
                if not math.isfinite(out):
                    raise ValueError("result too large")
            elif _bits(out) > _MAX_BITS:
                raise ValueError("result too large")
            return out
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
            return _UNOPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported element {type(node).__name__} in expression")

    try:
        value = ev(tree)
    except (ArithmeticError, RecursionError) as e:  # float overflow, deep nesting
        raise ValueError(f"cannot evaluate: {type(e).__name__}: {e}") from None
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    return value


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(12 + 7) * 3".
    """
    value = calculate(expression)
    if isinstance(value, Fraction):
        return f"{value} (≈ {float(value):.10g})"
    return str(value)
