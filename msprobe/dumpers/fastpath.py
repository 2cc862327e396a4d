"""The compiled fast path of the dumpers: one-pass statistics and CRC-32 (``_fastpath.c``).

``native()`` returns the extension module, or None when it is not available:

* built at install (``pip install``, ``scripts/bootstrap.sh``: setuptools ``ext-modules``,
  optional, so an install without a compiler still succeeds), else
* built at first use with the C compiler Python was built with, into
  ``~/.cache/msprobe-lake/native/`` (``$MSPROBE_LAKE_CACHE`` overrides the root), once per
  source version and interpreter, atomically (a lock and a rename: concurrent processes are safe);
* ``MSPROBE_LAKE_NATIVE=0`` forces the pure torch / numpy code (the reference), and so does a
  failed build (no compiler, no Python headers): the values are the same within the format's
  tolerance (tests/dumpers/test_fastpath.py checks both paths).
"""
from __future__ import annotations

import hashlib
import os
import sys
from typing import Any, Optional

__all__ = ["native", "DTYPE_CODES", "disabled", "record_text_function"]

#: the C module's FASTPATH_VERSION this Python code expects
VERSION = 4
#: dtype name (torch's / numpy's spelling) -> the C dtype code
DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5, "int16": 6,
               "int32": 7, "int64": 8, "bool": 9}

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fastpath.c")
_state: dict = {}


def disabled() -> bool:
    return os.environ.get("MSPROBE_LAKE_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


def native() -> Optional[Any]:
    """The loaded extension (None: use the fallback). Decided once per process."""
    if "mod" in _state:
        return _state["mod"]
    mod = None
    if not disabled():
        mod = _installed() or _built_in_cache()
    _state["mod"] = mod
    return mod


def _installed() -> Optional[Any]:
    try:
        from msprobe.dumpers import _fastpath  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _fastpath if getattr(_fastpath, "VERSION", None) == VERSION else None


def _cache_dir() -> str:
    root = os.environ.get("MSPROBE_LAKE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "msprobe-lake")
    return os.path.join(root, "native")


def _built_in_cache() -> Optional[Any]:
    import importlib.machinery
    import importlib.util
    import sysconfig

    try:
        with open(_SRC, "rb") as f:
            src = f.read()
    except OSError:
        return None
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = hashlib.sha1(src + sys.version.encode() + sys.executable.encode()).hexdigest()[:16]
    d = _cache_dir()
    path = os.path.join(d, f"_fastpath-{tag}{suffix}")
    if not os.path.exists(path) and not _compile(d, path):
        return None
    try:
        loader = importlib.machinery.ExtensionFileLoader("msprobe.dumpers._fastpath", path)
        spec = importlib.util.spec_from_file_location("msprobe.dumpers._fastpath", path, loader=loader)
        if spec is None:  # the loader is given, so this does not happen; treated as "no fast path"
            return None
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
    except (ImportError, OSError):
        return None
    return mod if getattr(mod, "VERSION", None) == VERSION else None


def _compile(d: str, path: str) -> bool:
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
            cmd = [*shlex.split(cc), "-O3", "-shared", "-fPIC", "-I", include, _SRC, "-o", tmp]
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=120)
            if r.returncode != 0 or not os.path.exists(tmp):
                return False
            os.replace(tmp, path)
            return True
    except (OSError, subprocess.SubprocessError):
        return False


def record_text_function() -> Any:
    """``record -> its JSON text`` exactly as :data:`msprobe.format.journal.record_text` (``json.dumps``
    with ``", "``/``": "``) writes it: through the C ``record_json`` over orjson's encoder (its float
    digits, ~6x faster on a record of statistics) when both are there, else (and for any record the C
    side declines: NaN/Infinity, other types, huge ints) the json module itself."""
    from msprobe.format.journal import record_text

    mod = native()
    fast = getattr(mod, "record_json", None) if mod is not None else None
    if fast is None:
        return record_text
    try:
        import orjson  # the [fast] extra
    except ImportError:
        return record_text
    dumps = orjson.dumps

    def text(record: Any) -> str:
        out = fast(record, dumps)
        return out if out is not None else record_text(record)

    return text
