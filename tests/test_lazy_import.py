"""``import msprobe`` (its format, backends, readers and view packages, and ``msprobe --help``)
loads none of the heavy optional dependencies."""
from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "mindspore", "pyarrow", "zarr", "s3fs", "dask", "duckdb", "starlette", "uvicorn")
PACKAGES = ("msprobe", "msprobe.format", "msprobe.backends", "msprobe.readers", "msprobe.view")

_PROBE = """
import contextlib, importlib, io, json, sys
HEAVY = %r

def heavy():
    return sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)

imported, missing = [], []
for name in %r:
    try:
        importlib.import_module(name)
        imported.append(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:  # the package exists but needs something absent: a real failure
            raise
        missing.append(name)
after_import = heavy()
from msprobe.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(["--help"])
    except SystemExit:
        pass
print(json.dumps({"imported": imported, "missing": missing, "after_import": after_import,
                  "after_help": heavy()}))
"""


def test_import_loads_no_heavy_dependency():
    out = subprocess.run([sys.executable, "-c", _PROBE % (HEAVY, PACKAGES)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "msprobe" in result["imported"] and "msprobe.format" in result["imported"]
    assert result["after_import"] == [], f"importing {result['imported']} loaded {result['after_import']}"
    assert result["after_help"] == [], f"msprobe --help loaded {result['after_help']}"


def test_compare_package_loads_each_part_on_first_use():
    """``from msprobe.compare import write_compare_leaves`` (what ``msprobe index`` takes) loads
    the leaf table's modules, not compare's engine; every public name still resolves."""
    probe = ("import json, sys\n"
             "from msprobe.compare import write_compare_leaves\n"
             "engine = sorted(m for m in ('msprobe.compare._core', 'msprobe.compare._columnar', "
             "'msprobe.compare._kernels', 'msprobe.compare._plot') if m in sys.modules)\n"
             "import msprobe.compare as package\n"
             "names = {name: getattr(package, name) is not None for name in package.__all__}\n"
             "print(json.dumps({'engine': engine, 'names': names, 'dir': set(package.__all__) <= set(dir(package))}))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["engine"] == [], f"the leaf table's import loaded {result['engine']}"
    assert result["names"] and all(result["names"].values()) and result["dir"]
