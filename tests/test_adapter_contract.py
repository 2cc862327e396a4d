"""The framework dumpers' written contract (issue 42 part 2, docs/architecture.md "Add a framework"),
read from the AST of msprobe/dumpers (no framework imported):

- every ``FrameworkAdapter`` subclass declares the collaborators the core builds (``framework``,
  ``encoder_cls``, ``patcher_cls``, ``guard``, ``fetch_stats``, ``get_rank``), and its ``on_api``
  and ``stop`` hand the call to the core (``record_api``, ``stop``);
- ``DumperCore``'s constructor takes the adapter and the configuration, nothing typed ``Any``;
- the skeleton of recording an API call lives once: one function of msprobe/dumpers both names
  the next API call (``next_api_name``) and adds its record (``add_record``): ``DumperCore.record_api``
  (it was three: both frameworks' ``on_api`` and MindSpore's Primitive/jit ``record``);
- the skeleton of stopping lives once: one function turns ``enabled`` off and publishes dump.json
  (``DumperCore.stop``; it was two);
- no stat handle is probed as a tuple (``isinstance(h[-1], dict)``, ``len(h) > 2``).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DUMPERS = ROOT / "msprobe" / "dumpers"
COLLABORATORS = {"framework", "encoder_cls", "patcher_cls", "guard", "fetch_stats", "get_rank"}


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for p in sorted(DUMPERS.rglob("*.py"))}


def _functions(tree: ast.Module):
    """(qualified name, node) of every function, methods as ``Class.method``."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node


def _called(node: ast.AST) -> set:
    """The attribute and function names called anywhere inside ``node``."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            out.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None))
    return out


def _adapters() -> list[tuple[Path, ast.ClassDef]]:
    found = []
    for path, tree in _trees().items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "FrameworkAdapter" for b in node.bases):
                found.append((path, node))
    return found


def test_both_frameworks_are_adapters():
    names = sorted(node.name for _, node in _adapters())
    assert names == ["MindSporeDumper", "TorchDumper"], names


def test_adapters_declare_their_collaborators_and_leave_the_skeletons_to_the_core():
    problems = []
    for path, cls in _adapters():
        assigned = {t.id for node in cls.body if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Name)}
        missing = COLLABORATORS - assigned
        if missing:
            problems.append(f"{cls.name} ({path.name}) declares no {sorted(missing)}")
        methods = {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)}
        for method, core_call in (("on_api", "record_api"), ("stop", "stop")):
            if method not in methods or core_call not in _called(methods[method]):
                problems.append(f"{cls.name}.{method} does not call the core's {core_call}")
    assert not problems, "\n".join(problems)


def test_the_core_constructor_takes_typed_collaborators():
    tree = ast.parse((DUMPERS / "control.py").read_text(encoding="utf-8"))
    core = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DumperCore")
    init = next(n for n in core.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    params = {a.arg: ast.unparse(a.annotation) if a.annotation else None
              for a in init.args.args + init.args.kwonlyargs if a.arg != "self"}
    assert params == {"adapter": "FrameworkAdapter", "config": "DumpConfig"}, params


def test_recording_an_api_call_lives_once():
    where = [f"{path.relative_to(DUMPERS)}:{name}" for path, tree in _trees().items()
             for name, fn in _functions(tree) if {"next_api_name", "add_record"} <= _called(fn)]
    assert where == ["control.py:DumperCore.record_api"], where


def test_stopping_lives_once():
    def turns_off(fn: ast.AST) -> bool:
        return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "enabled"
                                                      for t in n.targets)
                   and isinstance(n.value, ast.Constant) and n.value.value is False for n in ast.walk(fn))

    where = [f"{path.relative_to(DUMPERS)}:{name}" for path, tree in _trees().items()
             for name, fn in _functions(tree) if turns_off(fn) and "publish" in _called(fn)]
    assert where == ["control.py:DumperCore.stop"], where


def test_no_stat_handle_is_probed_as_a_tuple():
    probes = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Compare)) else ""
            if (isinstance(node, ast.Call) and text.startswith("isinstance(") and "[-1], dict)" in text) or \
                    (isinstance(node, ast.Compare) and text.startswith("len(") and text.endswith("> 2")):
                probes.append(f"{path.relative_to(DUMPERS)}:{node.lineno}: {text}")
    assert not probes, probes
