"""``import msprobe`` (and its format, backends and readers packages) loads no heavy dependency."""
from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "mindspore", "pyarrow", "zarr", "s3fs", "dask", "duckdb")
PACKAGES = ("msprobe", "msprobe.format", "msprobe.backends", "msprobe.readers")

_PROBE = """
import importlib, json, sys
imported, missing = [], []
for name in %r:
    try:
        importlib.import_module(name)
        imported.append(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:  # the package exists but needs something absent: a real failure
            raise
        missing.append(name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in %r)
print(json.dumps({"imported": imported, "missing": missing, "heavy": heavy}))
"""


def _probe():
    out = subprocess.run([sys.executable, "-c", _PROBE % (PACKAGES, HEAVY)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_loads_no_heavy_dependency():
    result = _probe()
    assert "msprobe" in result["imported"] and "msprobe.format" in result["imported"]
    assert result["heavy"] == [], f"importing {result['imported']} loaded {result['heavy']}"


def test_cli_help_loads_no_heavy_dependency():
    code = ("import sys, contextlib, io\nfrom msprobe.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in %r))" % (HEAVY,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
