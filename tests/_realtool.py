"""The real msprobe (PyPI ``mindstudio-probe``) in its own cached venv, for interop tests.

``real_tool_python(version)`` returns the python of a venv under
``~/.cache/msprobe-lake/`` (``$MSPROBE_LAKE_CACHE`` overrides) holding
``mindstudio-probe==<version>``; it is created on first use. For speed the venv
does not install torch: a ``.pth`` file appends the site-packages of the
interpreter running the tests (which has torch) AFTER the venv's own
site-packages, so the venv's ``msprobe`` (the real one) wins over ours; that is
verified after creation, and the venv falls back to installing
``torch==<running version>`` itself when the shared torch does not import.
Raises :class:`RealToolUnavailable` when the venv cannot be built: the tests that need the
real tool FAIL then (the ``real_tool`` fixture of tests/conftest.py), they never skip, so that
building the venv is part of the first test run on a fresh machine.

The import check runs with the venv directory as its working directory and without
``PYTHONPATH``: from the repository root, ``python -c`` would import OUR ``msprobe`` (the
current directory comes first on ``sys.path``), fail the check and make every fresh machine
install torch into the venv and then give up.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = ["real_tool_python", "RealToolUnavailable", "CPU_WRAPPER", "run_real_checker"]

EXTRA = {"8.1.1": ["service_identity==24.1.0", "cryptography==43.0.3"],
         # 1.x imports what its requirements leave out (tensorboard for its monitor, OpenSSL, einops)
         "1.1.1": ["tensorboard", "pyOpenSSL", "einops", "pytz"]}
CPU_WRAPPER = Path(__file__).parent / "fixtures" / "real" / "scripts" / "acc_check_cpu.py"
_CHECK = ("import msprobe, msprobe.msprobe, torch, os, sys; p = os.path.realpath(msprobe.__file__); "
          "assert p.startswith(os.path.realpath(sys.prefix)), p; print(p, torch.__version__)")


class RealToolUnavailable(RuntimeError):
    pass


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def _cache_root() -> Path:
    return Path(os.environ.get("MSPROBE_LAKE_CACHE", Path.home() / ".cache" / "msprobe-lake"))


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _run(cmd: list, log: Path, timeout: float = 1800) -> int:
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(map(str, cmd)) + "\n")
        fh.flush()
        return subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, env=_clean_env(),
                               cwd=log.parent)


def _check(py: Path) -> subprocess.CompletedProcess:
    """Import the real msprobe from the venv (away from our checkout: see the module docstring)."""
    return subprocess.run([str(py), "-c", _CHECK], capture_output=True, text=True, env=_clean_env(),
                          cwd=py.parent.parent, timeout=600)


def real_tool_python(version: str = "26.2.0") -> str:
    """The python executable of the cached venv holding mindstudio-probe ``version`` (built on first use)."""
    tv = _torch_version()
    vdir = _cache_root() / f"venv-ms{version}-torch{tv}-py{sys.version_info[0]}{sys.version_info[1]}"
    py = vdir / "bin" / "python"
    ok = vdir / ".ok"
    if ok.exists() and py.exists():
        return str(py)
    vdir.parent.mkdir(parents=True, exist_ok=True)
    log = vdir.parent / f"{vdir.name}.log"
    lock = vdir.parent / f"{vdir.name}.lock"
    import fcntl

    with open(lock, "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        if ok.exists() and py.exists():
            return str(py)
        base = getattr(sys, "_base_executable", sys.executable)
        if not py.exists() and _run([base, "-m", "venv", str(vdir)], log) != 0:
            raise RealToolUnavailable(f"cannot create a venv at {vdir} (see {log})")
        site = subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       text=True).strip()
        shared = sysconfig.get_paths()["purelib"]
        Path(site, "zz_msprobe_lake_shared_torch.pth").write_text(shared + "\n")
        pkgs = [f"mindstudio-probe=={version}", *EXTRA.get(version, [])]
        if _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", *pkgs], log) != 0:
            raise RealToolUnavailable(f"pip cannot install {' '.join(pkgs)} (see {log})")
        if _check(py).returncode != 0:
            # the shared torch does not work there: install torch into the venv itself
            Path(site, "zz_msprobe_lake_shared_torch.pth").unlink()
            if _run([str(py), "-m", "pip", "install", f"torch=={tv}", "numpy", *pkgs], log) != 0:
                raise RealToolUnavailable(f"pip cannot install torch=={tv} next to {pkgs} (see {log})")
        out = _check(py)
        if out.returncode != 0:
            raise RealToolUnavailable(f"the real msprobe in {vdir} does not import: {out.stderr[-800:]}")
        ok.write_text(out.stdout)
    return str(py)


#: Triton for the CUDA kernels' test in Triton's CPU interpreter (torch's CPU wheel ships none)
TRITON_VERSION = "3.9.0"


def triton_path() -> str:
    """A folder holding ``triton`` (``pip install --target``, cached next to the venvs; built on first
    use), to put on PYTHONPATH; ``RealToolUnavailable`` when pip cannot install it."""
    tdir = _cache_root() / f"triton-{TRITON_VERSION}-py{sys.version_info[0]}{sys.version_info[1]}"
    ok = tdir / ".ok"
    if ok.exists():
        return str(tdir)
    tdir.parent.mkdir(parents=True, exist_ok=True)
    log = tdir.parent / f"{tdir.name}.log"
    import fcntl

    with open(tdir.parent / f"{tdir.name}.lock", "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        if ok.exists():
            return str(tdir)
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--target",
               str(tdir), f"triton=={TRITON_VERSION}"]
        if _run(cmd, log) != 0:
            raise RealToolUnavailable(f"pip cannot install triton=={TRITON_VERSION} (see {log})")
        ok.write_text(TRITON_VERSION + "\n")
    return str(tdir)


_WRAP8 = """
import importlib, sys, torch
def _noop(*a, **k):
    return None
for m in ("msprobe.pytorch.api_accuracy_checker.run_ut.run_ut",
          "msprobe.pytorch.api_accuracy_checker.run_ut.run_ut_utils"):
    mod = importlib.import_module(m)
    if hasattr(mod, "current_device"):
        mod.current_device = "cpu"
torch.cuda.set_device = lambda *a, **k: None
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.empty_cache = lambda *a, **k: None
from msprobe.msprobe import main
sys.argv = ["msprobe", "-f", "pytorch", "run_ut"] + sys.argv[1:]
main()
"""


def run_real_checker(version: str, dump_json: str, out_dir: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the real checker (26.x ``acc_check``, 8.x ``run_ut``) on CPU over ``dump_json``."""
    py = real_tool_python(version)
    os.makedirs(out_dir, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    if version.startswith("8."):
        cmd = [py, "-c", _WRAP8, "-api_info", dump_json, "-o", out_dir]
    else:
        cmd = [py, str(CPU_WRAPPER), "-api_info", dump_json, "-o", out_dir]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=out_dir)
