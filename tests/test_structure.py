"""Size limits of the package's code (issue 28), read from the AST of every module of ``msprobe``.

- no function or method has more than 30 decision points (``if``/``elif``, loops, ``with``,
  ``except``, ``assert``, conditional expressions, comprehension clauses, match cases and each extra
  operand of ``and``/``or``; a nested function or class counts on its own);
- no class is longer than 400 lines.

``KNOWN`` lists what exceeded the limits when the test was written; it may only shrink: an entry that
no longer exceeds its limit fails the test until it is removed, so a fixed place cannot grow back.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "msprobe"
MAX_DECISIONS = 30
MAX_CLASS_LINES = 400

_DECISIONS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler, ast.With,
              ast.AsyncWith, ast.Assert, ast.comprehension, ast.match_case)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

# "path:qualified name" of what exceeded a limit when the test was written (issue 28 removes them)
KNOWN: set = set()


def decision_points(node: ast.AST) -> int:
    """Decision points in ``node``'s own body (nested functions, classes and lambdas left out)."""
    count = 0
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        if isinstance(child, _SCOPES):
            continue
        if isinstance(child, _DECISIONS):
            count += 1
        elif isinstance(child, ast.BoolOp):
            count += len(child.values) - 1
        stack.extend(ast.iter_child_nodes(child))
    return count


def _walk(node: ast.AST, prefix: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            yield name, child
            yield from _walk(child, name + ".")
        else:
            yield from _walk(child, prefix)


def over_limits() -> dict[str, str]:
    """``{"path:qualified name": what exceeds}`` over the whole package."""
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name, node in _walk(ast.parse(path.read_text(encoding="utf-8")), ""):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    found[f"{rel}:{name}"] = f"class of {lines} lines (limit {MAX_CLASS_LINES})"
            elif (points := decision_points(node)) > MAX_DECISIONS:
                found[f"{rel}:{name}"] = f"{points} decision points (limit {MAX_DECISIONS})"
    return found


def test_no_function_or_class_over_the_limits():
    found = over_limits()
    new = {key: why for key, why in found.items() if key not in KNOWN}
    assert not new, "over the size limits (split them): " + "; ".join(f"{k}: {v}" for k, v in new.items())


def test_the_known_list_only_shrinks():
    stale = sorted(KNOWN - set(over_limits()))
    assert not stale, f"now within the limits, remove from tests/test_structure.py KNOWN: {stale}"


def test_the_counter_counts():
    source = "def f(a, b):\n    if a and b or a:\n        return [x for x in a if x]\n    while b:\n        pass\n"
    assert decision_points(ast.parse(source).body[0]) == 5
