"""Stores own their capabilities (docs/architecture.md, "Recipe: add a storage backend").

Measured from the AST of every ``msprobe`` module outside ``msprobe/backends/``: a module tells
local from remote itself when it reads a store's ``is_local``, calls ``local_path``, reaches
for a store's fsspec file system or root (``.fs``, ``store.root``, ``getattr(x, "fs")``...) or
names ``LocalStore``/``FsspecStore``. Callers ask the store instead: ``stat``, ``disk_usage``,
``arrow_location``, ``fsspec_location``, ``append_dir`` and the flags ``exact_mtimes`` and
``cheap_requests`` (msprobe.backends.Store), which LocalStore and FsspecStore override.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests._ast_measure import listing, modules_with

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "msprobe"
BACKENDS = PKG / "backends"
DOC = ROOT / "docs" / "architecture.md"

#: modules outside msprobe/backends/ that tell local from remote themselves: issue 42's figure (it
#: was 18 before stores owned stat, disk_usage, delete_prefix, location, without_fsync,
#: remove_temps, remove_empty_dirs, arrow_location, fsspec_location, duckdb_path, list_dir_stats,
#: append_dir, exact_mtimes and cheap_requests).
MAX_MODULES = 0

_ATTRS = {"is_local", "local_path", "fs"}
_NAMES = {"LocalStore", "FsspecStore"}
_GETATTR = {"is_local", "local_path", "fs", "root"}


def _storeish(node: ast.expr) -> bool:
    text = ast.unparse(node).lower()
    return "store" in text or text.endswith("._s")


def telling(source: str) -> list[tuple[int, str]]:
    """(line, what) of each place in ``source`` that tells a local store from a remote one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in _ATTRS:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Attribute) and node.attr == "root" and _storeish(node.value):
            found.append((node.lineno, ".root"))
        elif isinstance(node, ast.Name) and node.id in _NAMES:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.alias) and node.name in _NAMES:
            found.append((getattr(node, "lineno", 0), f"import {node.name}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in _GETATTR):
            found.append((node.lineno, f"{node.func.id}({node.args[1].value!r})"))
    return sorted(set(found))


def test_no_module_outside_backends_tells_local_from_remote():
    hint = ("ask the store (Store.stat, disk_usage, delete_prefix, arrow_location, fsspec_location, "
            "append_dir, exact_mtimes, cheap_requests) or give Store a method")
    found = modules_with(telling, outside=BACKENDS)
    assert len(found) <= MAX_MODULES, f"{len(found)} modules tell local from remote ({MAX_MODULES} at most); {hint}:\n" + (
        listing(found))


def test_the_measure_sees_every_way_of_telling():
    source = '''
from msprobe.backends import LocalStore
a = store.is_local
b = self._s.local_path("x")
c = store.fs.info(p)
d = getattr(store, "root", None)
e = hasattr(st, "is_local")
f = isinstance(s, FsspecStore)
g = self.store.root
h = args.root
i = store.stat("k")
'''
    kinds = [what for _, what in telling(source)]
    assert kinds == ["import LocalStore", ".is_local", ".local_path", ".fs", "getattr('root')",
                     "hasattr('is_local')", "FsspecStore", ".root"], kinds


def test_the_recipe_is_written():
    text = DOC.read_text(encoding="utf-8")
    assert "## Recipe: add a storage backend" in text
    recipe = text.split("## Recipe: add a storage backend", 1)[1].split("\n## ", 1)[0]
    for needed in ("msprobe/backends/", "msprobe.testing", "StoreTests", "open_store"):
        assert needed in recipe, needed


# -- URL schemes read from text ---------------------------------------------------------------------

#: modules outside msprobe/backends/ that read a URL's scheme from its text (``"://" in url``,
#: ``url.startswith("s3://")``, ``url.split("://")``, ``urlparse``): issue 50 measured 9
#: (cli/compare.py, compare/_runner.py, dumpers/pytorch/_kernel_dump.py, dumpers/session/_storage.py,
#: lake/_core.py, lake/_lake.py, lake/_place.py, readers/_api.py, run_ut/runner.py). Where a path
#: is and how it is read is the store's answer (msprobe.backends: local_path_of, shares_options,
#: url_path, join_location, upload_files; Store.get_many, duckdb_setup).
MAX_SCHEME_MODULES = 0

_TEXT_METHODS = {"startswith", "endswith", "split", "rsplit", "partition", "rpartition", "find", "rfind",
                 "index", "rindex", "count", "replace", "removeprefix", "removesuffix"}
_URL_PARSERS = {"urlparse", "urlsplit", "urldefrag", "url_to_fs", "split_protocol", "get_protocol",
                "infer_storage_options", "strip_protocol"}
_RE_CALLS = {"match", "fullmatch", "search", "compile", "sub", "split", "findall", "finditer"}


def _schemeish(node: ast.AST) -> bool:
    """A constant (or a tuple of them) holding ``://``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return "://" in node.value
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_schemeish(elt) for elt in node.elts)


def reading_schemes(source: str) -> list[tuple[int, str]]:
    """(line, what) of each place in ``source`` that reads a URL's scheme from its text (building
    a URL, an f-string or a message that shows one, is not reading it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and (
                _schemeish(node.left) or any(_schemeish(c) for c in node.comparators)):
            found.append((node.lineno, "'://' in"))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in _URL_PARSERS:
                found.append((node.lineno, f"{name}()"))
            elif isinstance(func, ast.Attribute) and name in _TEXT_METHODS and any(_schemeish(a) for a in node.args):
                found.append((node.lineno, f".{name}('...://')"))
            elif name == "len" and any(_schemeish(a) for a in node.args):
                found.append((node.lineno, "len('...://')"))
            elif (isinstance(func, ast.Attribute) and name in _RE_CALLS and isinstance(func.value, ast.Name)
                  and func.value.id == "re" and any(_schemeish(a) for a in node.args)):
                found.append((node.lineno, f"re.{name}('...://')"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(a.name in _URL_PARSERS for a in node.names):
            found.append((node.lineno, "import " + ", ".join(a.name for a in node.names if a.name in _URL_PARSERS)))
    return sorted(set(found))


def test_no_module_outside_backends_reads_a_url_scheme():
    hint = ("ask msprobe.backends where the path is (local_path_of, shares_options, url_path, join_location, "
            "upload_files) or the store (get_many, duckdb_setup), or give them a method")
    found = modules_with(reading_schemes, outside=BACKENDS)
    assert len(found) <= MAX_SCHEME_MODULES, (
        f"{len(found)} modules read a URL's scheme from its text ({MAX_SCHEME_MODULES} at most); {hint}:\n"
        + listing(found))


def test_the_measure_sees_every_way_of_reading_a_scheme():
    source = '''
from urllib.parse import urlparse
a = "://" in url
b = "://" not in path.split("::", 1)[0]
c = url.startswith("file://")
d = url.split("://", 1)[-1]
e = endpoint.partition("://")
f = out[len("file://"):]
g = urlparse(url).scheme
h = url.startswith(("s3://", "gs://"))
i = re.match(r"^[a-z]+://", url)
j = f"packet://{key}"
k = "tcp://host:8786"
m = help_text("see s3://bucket")
'''
    kinds = [what for _, what in reading_schemes(source)]
    assert kinds == ["import urlparse", "'://' in", "'://' in", ".startswith('...://')", ".split('...://')",
                     ".partition('...://')", "len('...://')", "urlparse()", ".startswith('...://')",
                     "re.match('...://')"], kinds
