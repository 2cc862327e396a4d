"""Each dialect is an object of the format layer (docs/architecture.md, "Recipe: add a dialect").

Measured from the AST of every ``msprobe`` module: no comparison (``==``, ``in``...) and no
``return`` holds a dialect's name (``"msprobe-8"``...) as a literal; what a dialect means is asked
of its :class:`msprobe.format.dialects.Dialect` (before: 5, the four answers of ``detect_dialect``
and the statistics rule of ``reference_stats``).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from msprobe.errors import UnknownDialectError
from msprobe.format.dialects import (
    DIALECTS,
    casts_stats,
    detect_dialect,
    get_dialect,
    normalise_record_name,
)
from msprobe.format.stats import reference_stats

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "msprobe"


def name_uses(source: str, names: frozenset) -> list[int]:
    """Lines of ``source`` where a comparison or a ``return`` holds one of ``names`` as a literal."""
    out = []
    for node in ast.walk(ast.parse(source)):
        part = node if isinstance(node, ast.Compare) else node.value if isinstance(node, ast.Return) else None
        if part is not None and any(isinstance(leaf, ast.Constant) and leaf.value in names for leaf in ast.walk(part)):
            out.append(node.lineno)
    return sorted(set(out))


def test_no_module_compares_a_dialects_name():
    names = frozenset(DIALECTS)
    found = {str(path.relative_to(ROOT)): lines for path in sorted(PKG.rglob("*.py"))
             if (lines := name_uses(path.read_text(encoding="utf-8"), names))}
    assert not found, f"a dialect's name compared or returned as a literal (ask its Dialect): {found}"


def test_the_measure_sees_a_comparison_and_a_return():
    source = 'def f(d):\n    if d == "msprobe-8":\n        return "msprobe-26"\n    return d in ("msprobe-1",)\n'
    assert name_uses(source, frozenset(DIALECTS)) == [2, 3, 4]


def test_each_dialect_says_its_rules():
    assert [name for name, dialect in DIALECTS.items() if dialect.casts_stats] == ["msprobe-8", "msprobe-1"]
    assert not casts_stats("no-such-dialect")
    assert DIALECTS["msprobe-26"].normalise_name("Module.fc.Linear.parameters_grad.3") == \
        "Module.fc.Linear.parameters_grad"
    assert DIALECTS["msprobe-8"].normalise_name("Module.fc.Linear.parameters_grad.3") == \
        "Module.fc.Linear.parameters_grad.3"
    assert normalise_record_name("m.parameters_grad.0") == "m.parameters_grad"
    assert [d.name for d in DIALECTS.values() if d.claims_rank_dirs(["proc12"])] == ["msprobe-26"]
    with pytest.raises(UnknownDialectError):
        get_dialect("msprobe-2")
    # the statistics rule as reference_stats applies it
    ints = np.array([1, 2, 3], dtype=np.int32)
    assert reference_stats(ints, dialect="msprobe-26")[2:] == (None, None)
    assert reference_stats(ints, dialect="msprobe-8")[2] == pytest.approx(2.0)


def test_detection_asks_the_dialects():
    forward_8 = {"Functional.relu.0.forward": {"is_recompute": False, "input_args": []}}
    forward_26 = {"Functional.relu.0.forward": {"input_args": []}}
    assert detect_dialect(["rank0"], forward_8) == "msprobe-8"
    assert detect_dialect(["rank0"], forward_26) == "msprobe-26"
    assert detect_dialect(["proc7"], forward_8) == "msprobe-26"
    assert detect_dialect(["rank0"]) == "msprobe-8"
    assert detect_dialect(["rank0"], forward_8, {"dialect": "msprobe-lake"}) == "msprobe-lake"
    assert detect_dialect(["rank"], forward_26, None, {"data": forward_26}) == "msprobe-1"
    with pytest.raises(UnknownDialectError):
        detect_dialect(["logs"])


def test_the_recipe_names_real_files():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    match = re.search(r"^## Recipe: add a dialect\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, "docs/architecture.md has no section '## Recipe: add a dialect'"
    steps = re.findall(r"^\d+\. `([^`]+)`", match.group(1), re.MULTILINE)
    assert steps and steps[0] == "msprobe/format/dialects.py"
    for path in steps:
        assert (ROOT / path).is_file(), path
