"""The import structure of ``msprobe`` (docs/architecture.md), read from the AST of every module.

Every import counts, the ones inside functions and under ``if TYPE_CHECKING`` included:

- a module may import only modules of its own layer or of the layers before it (no cycle between
  subpackages can form, however late an import is done);
- a package's public surface is its ``__init__``: no module imports another subpackage's private
  module or name (``from msprobe.x._y import z``, ``from msprobe.x import _z``, ``import msprobe.x._y``
  from outside x); a submodule without a leading underscore (``msprobe.readers.index``) is public;
- no two modules import each other (a two-module import circle), at module level or inside a function.
"""
from __future__ import annotations

import ast
import re
import sys
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
    ("msprobe.tensor_store",),
    ("msprobe.index",),
    ("msprobe.readers",),
    ("msprobe.online",),
    ("msprobe.dumpers", "msprobe.compare", "msprobe.run_ut"),
    ("msprobe.convert",),
    ("msprobe.testing",),
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
                bad = [p for p in target.split(".")[2:] if _private(p)]  # a private module on the way
                bad += [n for n in names if _private(n)]
                if bad:
                    private.append(f"{where}:{line}: imports {', '.join(bad)} from {target}")
    return layering, private


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules it imports (anywhere in the file); ``from msprobe.x import y`` is an arrow
    to ``msprobe.x.y`` when that is a module, else to ``msprobe.x``."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        arrows = graph.setdefault(module, set())
        for _line, target, names in _imports(path, module):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if len(subs) < len(names) or not names:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                subs.append(target)
            arrows.update(s for s in subs if s != module)
    return graph


def _two_module_circles() -> list[str]:
    graph = _import_graph()
    return sorted(f"{a} <-> {b}" for a, arrows in graph.items() for b in arrows
                  if a < b and a in graph.get(b, ()))


def test_every_module_is_in_a_layer():
    for module in _modules():
        _unit(module)


def test_imports_go_one_way():
    layering, _ = _violations()
    assert not layering, "imports against the layer order (docs/architecture.md):\n" + "\n".join(layering)


def test_no_private_name_across_subpackages():
    """Another package is reached through its ``__init__`` (its ``__all__``) or a public submodule,
    never through a private module or name: 45 such imports (43 distinct file -> module pairs) when
    this was first measured, 0 now. docs/architecture.md, "Public surfaces"."""
    _, private = _violations()
    assert not private, "private modules or names imported from another subpackage:\n" + "\n".join(private)


def test_no_two_module_import_circle():
    """No two modules import each other, however late (2 circles when first measured: backends'
    _base <-> _journal and the PyTorch dumper's _encode <-> _ptfile)."""
    circles = _two_module_circles()
    assert not circles, "two-module import circles:\n" + "\n".join(circles)


def test_the_checker_sees_private_imports_and_circles(tmp_path, monkeypatch):
    """The two measurements find a planted private import and a planted circle (inside a function)."""
    pkg = tmp_path / "msprobe"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "_x.py").write_text("from msprobe.a import _y\n")
    (pkg / "a" / "_y.py").write_text("def f():\n    from msprobe.a._x import g\n    return g\n")
    (pkg / "b" / "m.py").write_text("from msprobe.a._x import g\nfrom msprobe.a import _z, ok\n"
                                    "import msprobe.a._y\n")
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "ROOT", tmp_path)
    monkeypatch.setattr(here, "PKG", pkg)
    monkeypatch.setattr(here, "LAYERS", [("msprobe",), ("msprobe.a",), ("msprobe.b",)])
    _, private = _violations()
    assert [p.split(": ", 1)[1] for p in private] == [
        "imports _x from msprobe.a._x", "imports _z from msprobe.a", "imports _y from msprobe.a._y"], private
    assert _two_module_circles() == ["msprobe.a._x <-> msprobe.a._y"]


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
