"""``import msprobe`` (its format, backends, readers and view packages, and ``msprobe --help``)
loads none of the heavy optional dependencies."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

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


def _probe(code: str, timeout: float = 120, env: Optional[dict] = None) -> dict:
    """The JSON object the last line of ``code``, run by a fresh interpreter, prints."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    result = _probe(probe)
    assert result["engine"] == [], f"the leaf table's import loaded {result['engine']}"
    assert result["names"] and all(result["names"].values()) and result["dir"]


#: what ``msprobe compare`` of two local statistics dumps (no index, no plot, one process) does not
#: take: process pools, the tensor store, the journal and the run-directory writer, the index's
#: compactor and writer, the layout merger, fsspec's store with its retry and logging machinery
NOT_ON_THE_COMPARE_PATH = (
    "multiprocessing", "concurrent.futures.process", "msprobe.tensor_store", "msprobe.backends._journal",
    "msprobe.backends._writer", "msprobe.backends._rundir", "msprobe.index.compact", "msprobe.readers.index",
    "msprobe.readers._merged", "pandas", "fsspec") + HEAVY


def test_compare_of_two_local_dumps_loads_only_what_it_takes(tmp_path):
    """A fresh ``msprobe compare T B -o OUT --no-plot`` (the CSV written) imports none of
    :data:`NOT_ON_THE_COMPARE_PATH`: the readers, backends, index and tensor_store packages load
    each part on first use."""
    real = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "real", "ms26")
    target, bench = (os.path.join(real, name, "step0") for name in ("L1_statistics", "L1_statistics_perturbed"))
    probe = ("import json, sys\n"
             "from msprobe.cli import main\n"
             f"code = main(['compare', {target!r}, {bench!r}, '-o', {str(tmp_path)!r}, '--no-plot', '-n', '1'])\n"
             f"loaded = sorted(m for m in sys.modules if m in {NOT_ON_THE_COMPARE_PATH!r} "
             f"or m.split('.')[0] in {NOT_ON_THE_COMPARE_PATH!r})\n"
             "print(json.dumps({'code': code, 'loaded': loaded}))\n")
    result = _probe(probe, timeout=300, env={**os.environ, "MSPROBE_LAKE_COMPARE_INDEX": "0"})
    assert result["code"] == 0 and any(name.endswith(".csv") for name in os.listdir(tmp_path))
    assert result["loaded"] == [], f"msprobe compare of two local dumps loaded {result['loaded']}"


def test_lazy_packages_resolve_every_public_name():
    """Each public name of the packages whose names load on first use resolves, and ``dir`` lists it."""
    probe = ("import importlib, json\n"
             "bad = {}\n"
             "for name in ('msprobe.readers', 'msprobe.backends', 'msprobe.index', 'msprobe.tensor_store'):\n"
             "    package = importlib.import_module(name)\n"
             "    missing = [n for n in package.__all__ if getattr(package, n, None) is None]\n"
             "    if missing or not set(package.__all__) <= set(dir(package)):\n"
             "        bad[name] = missing\n"
             "try:\n"
             "    importlib.import_module('msprobe.readers').no_such_name\n"
             "except AttributeError as exc:\n"
             "    error = str(exc)\n"
             "print(json.dumps({'bad': bad, 'error': error}))\n")
    result = _probe(probe)
    assert result["bad"] == {}
    assert result["error"] == "module 'msprobe.readers' has no attribute 'no_such_name'"


def test_the_command_line_lets_openblas_threads_sleep_at_once():
    """The msprobe command sets OPENBLAS_THREAD_TIMEOUT=4 before numpy's import (numpy's OpenBLAS
    threads otherwise spin ~2**28 cycles after they start: ~40 ms of CPU a command); the user's
    own value is kept."""
    probe = ("import json, os, sys; import msprobe.cli; before = 'numpy' in sys.modules; import numpy; "
             "print(json.dumps([os.environ.get('OPENBLAS_THREAD_TIMEOUT'), before]))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    for given, want in ((None, "4"), ("12", "12")):
        run_env = dict(env, **({"OPENBLAS_THREAD_TIMEOUT": given} if given else {}))
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=run_env, check=True)
        assert json.loads(out.stdout) == [want, False]


def test_the_command_line_builds_its_parser_with_the_collector_paused():
    """msprobe's parser is built (its modules, numpy among them, imported) with the cyclic collector
    paused, and no collection runs then; the collector is on again for the command, with the
    imports' objects in the oldest generation (a young collection no longer walks them)."""
    probe = ("import gc, json, sys\n"
             "import msprobe.cli as cli\n"
             "seen, collections = [], []\n"
             "real = cli.build_parser\n"
             "def build():\n"
             "    seen.append(gc.isenabled())\n"
             "    parser = real()\n"
             "    seen.append(len(collections))\n"
             "    return parser\n"
             "cli.build_parser = build\n"
             "gc.callbacks.append(lambda phase, info: phase == 'start' and collections.append(info['generation']))\n"
             "try:\n"
             "    cli.main(['validate', '--help'])\n"
             "except SystemExit:\n"
             "    pass\n"
             "print(json.dumps([seen, gc.isenabled(), 'numpy' in sys.modules, gc.get_count()[0] < 700]))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[False, 0], True, True, True]
