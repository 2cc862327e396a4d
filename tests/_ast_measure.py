"""Shared by the AST-measured architecture figures (tests/test_architecture_*.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "msprobe"


def modules_with(finder: Callable[[str], list], *, outside: Path) -> dict[str, list]:
    """``{module path: finder(source)}`` for every msprobe module outside ``outside`` where
    ``finder`` finds something."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        if outside in path.parents:
            continue
        found = finder(path.read_text(encoding="utf-8"))
        if found:
            out[str(path.relative_to(ROOT))] = found
    return out


def listing(found: dict[str, list]) -> str:
    """One line per module: where and what was found."""
    return "\n".join(f"{module}: {hits}" for module, hits in found.items())
