"""The import structure of ``msprobe`` (docs/architecture.md), read from the AST of every module.

Every import counts, the ones inside functions and under ``if TYPE_CHECKING`` included:

- a module may import only modules of its own layer or of the layers before it (no cycle between
  subpackages can form, however late an import is done);
- no module imports another subpackage's private name (``from msprobe.x._y import z`` is fine when
  ``z`` is public: ``_y`` is x's own file layout; ``from msprobe.x import _z`` or ``import ... _z`` from
  outside x is not).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "msprobe"

# bottom first; a module may import its own layer and the ones before it. Keep in step with
# docs/architecture.md (test_doc_lists_the_layers checks the two agree).
LAYERS: list[tuple[str, ...]] = [
    ("msprobe", "msprobe._coexist", "msprobe.errors", "msprobe.progress", "msprobe.execution"),
    ("msprobe.format",),
    ("msprobe.backends",),
    ("msprobe.testing",),
    ("msprobe.tensor_store",),
    ("msprobe.index",),
    ("msprobe.readers",),
    ("msprobe.online",),
    ("msprobe.dumpers", "msprobe.compare", "msprobe.run_ut"),
    ("msprobe.convert",),
    ("msprobe.lake", "msprobe.pytorch", "msprobe.mindspore"),
    ("msprobe.view",),
    ("msprobe.cli", "msprobe.demo", "msprobe.__main__"),
]
# the packages of one layer that must not import each other (the layer is a fan, not a chain)
INDEPENDENT = {("msprobe.dumpers", "msprobe.compare", "msprobe.run_ut")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    """The layer entry that holds ``module`` (the longest listed prefix)."""
    best = ""
    for layer in LAYERS:
        for unit in layer:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best = unit
    if not best:
        raise AssertionError(f"{module} is in no layer of tests/test_architecture.py LAYERS")
    return best


def _rank(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(path: Path, module: str) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) for every import in the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append((node.lineno, alias.name, []))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_pkg:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target, [a.name for a in node.names]))
    return [(line, target, names) for line, target, names in out if target.split(".")[0] == "msprobe"]


def _home(module: str) -> str:
    """The subpackage a module belongs to (``msprobe.readers._dump`` -> ``msprobe.readers``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def _violations() -> tuple[list[str], list[str]]:
    modules = _modules()
    layering: list[str] = []
    private: list[str] = []
    for module, path in modules.items():
        unit = _unit(module)
        where = f"{path.relative_to(ROOT)}"
        for line, target, names in _imports(path, module):
            # "from msprobe.x import y" may name the submodule msprobe.x.y
            targets = [target] + [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            for tgt in targets:
                tunit = _unit(tgt)
                if tunit == unit:
                    continue
                if _rank(tunit) > _rank(unit) or (
                        _rank(tunit) == _rank(unit) and any({unit, tunit} <= set(g) for g in INDEPENDENT)):
                    layering.append(f"{where}:{line}: {unit} imports {tgt} (layer {tunit})")
            if _home(target) != _home(module):
                tparts = target.split(".")[2:]
                bad = [p for p in tparts[:-1] if p.startswith("_")]  # a private subpackage on the way
                bad += [n for n in names if n.startswith("_") and not n.startswith("__")]
                if bad:
                    private.append(f"{where}:{line}: imports {', '.join(bad)} from {target}")
    return layering, private


def test_every_module_is_in_a_layer():
    for module in _modules():
        _unit(module)


def test_imports_go_one_way():
    layering, _ = _violations()
    assert not layering, "imports against the layer order (docs/architecture.md):\n" + "\n".join(layering)


def test_no_private_name_across_subpackages():
    _, private = _violations()
    assert not private, "private names imported from another subpackage:\n" + "\n".join(private)


def test_doc_lists_the_layers():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for layer in LAYERS:
        for unit in layer:
            if unit == "msprobe":
                continue
            shown = unit.replace("msprobe.", "", 1)
            assert f"`{shown}`" in doc, f"docs/architecture.md does not name the layer entry `{shown}`"


def test_the_test_command_lints():
    """CI's command (scripts/test.sh, run by .ci/run) runs ruff and mypy before the tests, with the
    settings of pyproject.toml, and the dev install pins both."""
    script = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8").splitlines()
    steps = [line.split("#")[0].strip() for line in script]
    assert ".venv/bin/ruff check ." in steps and ".venv/bin/mypy" in steps, steps
    assert steps.index(".venv/bin/mypy") < next(i for i, s in enumerate(steps) if "pytest" in s)
    pins = (ROOT / "constraints" / "ci.txt").read_text(encoding="utf-8")
    assert re.search(r"^ruff==", pins, re.M) and re.search(r"^mypy==", pins, re.M)
    toml = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "[tool.ruff.lint]" in toml and "[tool.mypy]" in toml and "warn_unused_ignores = true" in toml


def test_data_path_names_real_code():
    """Every file the data-path diagram of docs/architecture.md names exists, and every class or
    function it names is defined in one of them."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"^```text\n(.*?)^```", doc, re.S | re.M)
    assert block, "docs/architecture.md has no data-path diagram"
    text = block.group(1)
    files = re.findall(r"\b([a-z_]+(?:/[a-z_]+)*\.py)\b", text)
    assert len(files) >= 8, files
    defined: set = set()
    for f in files:
        path = PKG / f
        assert path.is_file(), f"docs/architecture.md names {f}, which is not in msprobe/"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    names = re.findall(r"\b([A-Z][A-Za-z]+|[a-z]+_[a-z_]+)\b(?!\.py|/)", text)
    names = [n for n in names if not re.search(rf"\b{n}\.py|\b{n}/", text)]
    assert names, text
    missing = sorted(set(names) - defined)
    assert not missing, f"the diagram names {missing}, defined in none of {files}"


@pytest.mark.parametrize("module", ["msprobe.readers._dump"])
def test_the_checker_sees_function_level_imports(module, tmp_path):
    """The walk reaches imports inside functions (a late import cannot hide a cycle)."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from msprobe.cli import main\n    return main\n")
    found = _imports(src, module)
    assert found == [(2, "msprobe.cli", ["main"])]
