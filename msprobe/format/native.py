"""Compiled extension modules of msprobe-lake, each optional: the Python code beside it is the
fallback and the reference.

:func:`load` returns one module, or None when it is not available:

* built at install (``pip install``, ``scripts/bootstrap.sh``: setuptools ``ext-modules``,
  optional, so an install without a compiler still succeeds), else
* built at first use with the C compiler Python was built with, into
  ``~/.cache/msprobe-lake/native/`` (``$MSPROBE_LAKE_CACHE`` overrides the root), once per
  source version and interpreter, atomically (a lock and a rename: concurrent processes are safe);
* ``MSPROBE_LAKE_NATIVE=0`` forces the Python code everywhere, and so does a failed build (no
  compiler, no Python headers).

The modules: ``msprobe.dumpers._fastpath`` (the dumpers' statistics and CRC-32,
:mod:`msprobe.dumpers.fastpath`) ``msprobe.format._leafwalk`` (the leaves of a document's
records as columns, for compare's plan: :func:`leafwalk`) and ``msprobe.format._docscan`` (compare's
leaf columns read from a dump.json's bytes without parsing it into objects: :func:`docscan`).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
from typing import Any, Optional

__all__ = ["load", "disabled", "built_in_cache", "leafwalk", "docscan", "LEAFWALK_VERSION", "DOCSCAN_VERSION"]

#: the C module's LEAFWALK_VERSION this Python code expects
LEAFWALK_VERSION = 17
_LEAFWALK_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_leafwalk.c")
#: the C module's DOCSCAN_VERSION this Python code expects
DOCSCAN_VERSION = 1
_DOCSCAN_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_docscan.c")
_loaded: dict = {}


def disabled() -> bool:
    return os.environ.get("MSPROBE_LAKE_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


def load(name: str, source: str, version: int) -> Optional[Any]:
    """The extension ``name`` (a dotted module name) of C file ``source`` whose ``VERSION`` is
    ``version``: installed, else built in the cache; None where neither works or the native code
    is disabled. Decided once per process and module."""
    if name in _loaded:
        return _loaded[name]
    mod = None
    if not disabled():
        mod = _installed(name, version) or built_in_cache(name, source, version)
    _loaded[name] = mod
    return mod


def leafwalk() -> Optional[Any]:
    """``msprobe.format._leafwalk`` (see its C source), or None."""
    return load("msprobe.format._leafwalk", _LEAFWALK_SRC, LEAFWALK_VERSION)


def docscan() -> Optional[Any]:
    """``msprobe.format._docscan`` (compare's leaf columns of a dump.json's bytes: see its C source), or None."""
    return load("msprobe.format._docscan", _DOCSCAN_SRC, DOCSCAN_VERSION)


def _installed(name: str, version: int) -> Optional[Any]:
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return None
    return mod if getattr(mod, "VERSION", None) == version else None


def _cache_dir() -> str:
    root = os.environ.get("MSPROBE_LAKE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "msprobe-lake")
    return os.path.join(root, "native")


def built_in_cache(name: str, source: str, version: int) -> Optional[Any]:
    """The extension built from ``source`` into the cache (compiled there first if needed)."""
    import importlib.machinery
    import importlib.util
    import sysconfig

    try:
        with open(source, "rb") as f:
            src = f.read()
    except OSError:
        return None
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = hashlib.sha1(src + sys.version.encode() + sys.executable.encode()).hexdigest()[:16]
    d = _cache_dir()
    short = name.rsplit(".", 1)[-1]
    path = os.path.join(d, f"{short}-{tag}{suffix}")
    if not os.path.exists(path) and not _compile(source, d, path):
        return None
    try:
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        if spec is None:  # the loader is given, so this does not happen; treated as "no extension"
            return None
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
    except (ImportError, OSError):
        return None
    return mod if getattr(mod, "VERSION", None) == version else None


def _compile(source: str, d: str, path: str) -> bool:
    import shlex
    import subprocess
    import sysconfig

    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        return False
    try:
        os.makedirs(d, exist_ok=True)
        import fcntl

        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(path):
                return True
            tmp = f"{path}.{os.getpid()}.tmp"
            cmd = [*shlex.split(cc), "-O3", "-shared", "-fPIC", "-I", include, source, "-o", tmp]
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=120)
            if r.returncode != 0 or not os.path.exists(tmp):
                return False
            os.replace(tmp, path)
            return True
    except (OSError, subprocess.SubprocessError):
        return False
