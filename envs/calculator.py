"""A safe arithmetic evaluator used as the ``calculator`` tool (no ``eval``)."""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

__all__ = ["calculate", "calculator"]

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPR = 500
_MAX_POW = 1_000
_MAX_DIGITS = 4_000


def calculate(expression: str) -> int | float | Fraction:
    """Evaluate ``+ - * / // % **`` and parentheses on numbers exactly (``/`` gives a Fraction).

    Raises ValueError with a readable message on anything else (names, calls, huge powers).
    """
    if len(expression) > _MAX_EXPR:
        raise ValueError(f"expression longer than {_MAX_EXPR} characters")
    expression = expression.replace("×", "*").replace("÷", "/").replace("^", "**").replace(",", "")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None

    def ev(node: ast.AST) -> int | Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return Fraction(node.value) if isinstance(node.value, float) else node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POW:
                raise ValueError(f"exponent too large (> {_MAX_POW})")
            if isinstance(node.op, ast.Pow) and abs(Fraction(left)).numerator.bit_length() * abs(right) > _MAX_DIGITS * 3.33:
                raise ValueError("result too large")
            if isinstance(node.op, ast.Div):
                if right == 0:
                    raise ValueError("division by zero")
                return Fraction(left) / Fraction(right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            out = _BINOPS[type(node.op)](left, right)
            if isinstance(out, int) and out.bit_length() > _MAX_DIGITS * 3.33:
                raise ValueError("result too large")
            return out
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
            return _UNOPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported element {type(node).__name__} in expression")

    value = ev(tree)
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
