"""Issue 22: each shared constant and helper is defined once (read from the source's AST).

``FORMAT_VERSION`` is defined in ``msprobe/__init__.py`` (the bottom layer; re-exported by
:mod:`msprobe.format.layout`), ``STORE_DIR`` in :mod:`msprobe.format.layout`; no other module
assigns them or spells them as literals, and storage keys are joined by the one ``join_key``."""
from __future__ import annotations

import ast
import pathlib

import msprobe
from msprobe.format import layout

PKG = pathlib.Path(msprobe.__file__).parent
HOME = PKG / "format" / "layout.py"
HOMES = {"FORMAT_VERSION": PKG / "__init__.py", "STORE_DIR": HOME}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _docstrings(tree: ast.AST) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _where(path: pathlib.Path, node: ast.AST) -> str:
    return f"{path.relative_to(PKG.parent)}:{node.lineno}"


def test_constants_are_defined_once():
    assigned, literals, marker_versions = [], [], []
    for path, tree in _modules():
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id in HOMES and path != HOMES[t.id]:
                        assigned.append(f"{t.id} at {_where(path, node)}")
            elif (isinstance(node, ast.Constant) and node.value == layout.STORE_DIR and id(node) not in docs
                  and path != HOME):
                literals.append(_where(path, node))
            elif isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if isinstance(k, ast.Constant) and k.value == "format_version" and isinstance(v, ast.Constant):
                        marker_versions.append(_where(path, node))
    assert not assigned, f"defined again outside their homes {HOMES}: {assigned}"
    assert not literals, f"{layout.STORE_DIR!r} spelled as a literal (use format.layout.STORE_DIR): {literals}"
    assert not marker_versions, f"a literal format_version (use FORMAT_VERSION): {marker_versions}"
    assert msprobe.FORMAT_VERSION == layout.FORMAT_VERSION


def _is_slash_join(fn: ast.FunctionDef) -> bool:
    """A function whose result is ``"/".join(...)`` of its arguments: a key joiner."""
    for node in ast.walk(fn):
        if (isinstance(node, ast.Return) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "join"
                and isinstance(node.value.func.value, ast.Constant) and node.value.func.value.value == "/"):
            return True
    return False


def test_one_key_joiner():
    joiners = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and _is_slash_join(node) and "join" in node.name:
                joiners.append(f"{node.name} at {_where(path, node)}")
    assert joiners == [f"join_key at {_where(HOME, _find(HOME, 'join_key'))}"], joiners
    assert layout.join_key("", "step0/", "/rank0", "", "dump.json") == "step0/rank0/dump.json"
    assert layout.join_key("", "") == ""


def _find(path: pathlib.Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


# --- issue 28: each file format is written and read in one module -------------------------------

JOURNAL = PKG / "format" / "journal.py"
MARKER = PKG / "format" / "marker.py"
MODEL = PKG / "format" / "model.py"
DOCUMENTS = PKG / "format" / "documents.py"
NAMING = PKG / "format" / "naming.py"
#: the keys of journal lines and of the marker (spec/FORMAT.md 17 and 6.1)
_RECORD_KEYS = {"name", "record", "parent", "stack_id", "stack"}
_MARKER_KEYS = {"format_version", "dialect", "producer", "framework", "task", "level", "summary_mode", "tensor_format",
                "step", "rank", "records", "complete", "final", "pid", "document_crc32", "files"}


def _const_keys(node: ast.Dict) -> set:
    return {k.value for k in node.keys if isinstance(k, ast.Constant)}


def test_each_format_has_one_home():
    """Journal lines are built only in format/journal.py, markers only in format/marker.py,
    32-digit file names only in format/naming.py, tensor types only in format/model.py, the rank
    directory's documents only in format/documents.py (the one writer of publish, recover, convert)."""
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = _const_keys(node)
                if path != JOURNAL and (keys == {"stack_id", "frames"} or {"name", "record"} <= keys <= _RECORD_KEYS):
                    found.append(f"a journal line built at {_where(path, node)}")
                if path != MARKER and {"format_version", "dialect"} <= keys <= _MARKER_KEYS:
                    found.append(f"a marker built at {_where(path, node)}")
            elif isinstance(node, ast.Assign) and path != MARKER:
                for t in node.targets:  # the rewrites of a marker: final, document_crc32, tensor_format
                    key = t.slice.value if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) else None
                    if (key in ("document_crc32", "tensor_format")
                            or key == "final" and isinstance(node.value, ast.Constant) and node.value.value is True):
                        found.append(f"marker key {key!r} set at {_where(path, node)}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "randbelow" and path != NAMING):
                found.append(f"a converted (32-digit) file name made at {_where(path, node)}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and path != DOCUMENTS
                  and node.func.id in ("dumps_json", "dumps_records_json")):
                found.append(f"a document encoded at {_where(path, node)} (use format.documents.encode_documents)")
            elif isinstance(node, (ast.Set, ast.Tuple, ast.List)) and path != MODEL:
                values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if {"torch.Tensor", "mindspore.Tensor"} <= values:
                    found.append(f"a set of tensor types at {_where(path, node)} (use format.model.is_tensor_entry)")
    assert not found, found


def test_one_leaf_walker():
    """Walkers over raw records: format.model.tensor_entries only (the index and the session use it)."""
    from msprobe.format.model import data_names, tensor_entries

    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1], "data_name": "a.pt"}
    raw = {"input_args": [t, [dict(t, data_name="b.pt")]], "input_kwargs": {"k": {"type": "int", "value": 1}},
           "output": [dict(t, data_name=None)]}
    assert [p for p, _ in tensor_entries(raw)] == ["input_args.0", "input_args.1.0", "output.0"]
    assert data_names(raw) == ["a.pt", "b.pt"]
    walkers = [f"{n.name} at {_where(p, n)}" for p, tree in _modules() for n in ast.walk(tree)
               if isinstance(n, ast.FunctionDef) and n.name in ("_walk", "_data_names", "_is_tensor")
               and p.parent.name in ("index", "dumpers")]
    assert not walkers, walkers


def test_one_is_tensor_entry():
    """compare, the index and the record model agree on what a tensor entry is (spec 10.2)."""
    from msprobe.compare._rows import leaf_side
    from msprobe.format.model import TENSOR_TYPES, TensorArg, is_tensor_entry, parse_arg
    from msprobe.index.rows import record_tensors

    cases = [{"type": t} for t in sorted(TENSOR_TYPES)] + [
        {"type": "jax.Array"}, {"type": "x.Y", "dtype": "f", "shape": []}, {"type": "int", "value": 1}]
    for leaf in cases:
        want = leaf["type"] in TENSOR_TYPES or "dtype" in leaf
        assert is_tensor_entry(leaf) is want, leaf
        assert isinstance(parse_arg(leaf), TensorArg) is want, leaf
        assert leaf_side(leaf).tensor is want, leaf
        assert bool(record_tensors("api", {"output": [leaf]})) is want, leaf
