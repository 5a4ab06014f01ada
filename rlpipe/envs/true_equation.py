"""The answer a reply commits to when it is one TRUE arithmetic equation: "4 - 1 = 3" -> "3".

What it does:
- `equation_answer(text)` returns the right-hand side of `text` (stripped, an optional final
  period allowed) when `text` is exactly `<expression> = <integer>`, the expression holds
  only integers, + - * (or ×) and parentheses, and it evaluates to that integer; None for
  anything else (two equations, words, a false equation, a chain "a = b = c").

A verifier that grades this right-hand side with a domain's own score_answer gives credit
for exactly one committed number and only inside a true equation: a reply cannot hedge
between candidates (only one number stands right of the one "="), and "1 + 1 = 7" scores 0
whatever the answer is. It lets a chat model that answers "4 - 1 = 3" (SmolLM2 as shipped
almost never writes the bare "3") be graded strictly without teaching it a format first.

What it does not: evaluate division, powers, decimals or names (none are needed by the
arithmetic domains that use it; a reply with them is None), or bound anything but length
(the expression is at most MAX_EXPRESSION_CHARS characters, so its value stays small).
"""

from __future__ import annotations

import ast
import re

MAX_EXPRESSION_CHARS = 200
_EQUATION = re.compile(r"([0-9+\-*×() ]+?)\s*=\s*(-?\d+)\s*\.?")
_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def equation_answer(text: str) -> str | None:
    """The integer right of "=" when `text` is one true arithmetic equation, else None."""
    match = _EQUATION.fullmatch(text.strip())
    if match is None or len(match.group(1)) > MAX_EXPRESSION_CHARS:
        return None
    value = _evaluate(match.group(1).replace("×", "*"))
    right_side = match.group(2)
    return right_side if value is not None and value == int(right_side) else None


def _evaluate(expression: str) -> int | None:
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    return _value(tree.body)


def _value(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        return None if operand is None else (-operand if isinstance(node.op, ast.USub) else operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        return None if left is None or right is None else _OPERATORS[type(node.op)](left, right)
    return None
