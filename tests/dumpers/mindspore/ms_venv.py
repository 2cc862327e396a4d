"""Create (once) and cache the virtual environment the MindSpore tests run in.

MindSpore 2.10.0 needs ``numpy<2``, so it cannot share the main test environment. The
venv lives under ``$MSPROBE_LAKE_CACHE`` (default ``~/.cache/msprobe-lake``) as
``venv-mindspore-<version>-<key>``, the key a hash of the requirement list, so a venv
built for other requirements stays usable beside it; our sources are put on
``PYTHONPATH`` rather than installed. Creation downloads the MindSpore CPU wheel (about
800 MB) with the ordinary pip client, unless a venv that already holds MindSpore seeds
it: ``MSPROBE_LAKE_MS_SEED_VENV=/path/to/venv``, else an earlier cached
``venv-mindspore-<version>*`` (its site-packages are copied, except any
``msprobe``/``mindstudio-probe``, then pip installs what the requirements add).

``ensure_real_venv()`` builds (once) a second venv beside it holding the real
``mindstudio-probe`` 26.2.0 over the same packages (a ``.pth`` file appends the MindSpore
venv's site-packages after its own, as tests/_realtool.py does for torch): the MindSpore
tests run the real tool live in it for what a committed dump cannot check on another machine
(the checksums of float tensors, tests/fixtures/real/README.md).

Command line: ``python tests/dumpers/mindspore/ms_venv.py`` builds both and prints their pythons.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
from typing import Callable, Optional

MS_VERSION = "2.10.0"
REQUIREMENTS = ["numpy<2", f"mindspore=={MS_VERSION}", "pytest>=7", "fsspec>=2023.6", "pyyaml>=6", "s3fs>=2023.6"]
_KEY = hashlib.sha256(" ".join(REQUIREMENTS).encode()).hexdigest()[:8]
_SKIP_SEED = ("msprobe", "mindstudio_probe", "__pycache__")


def cache_root() -> str:
    return os.environ.get("MSPROBE_LAKE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "msprobe-lake")


def venv_dir() -> str:
    return os.path.join(cache_root(), f"venv-mindspore-{MS_VERSION}-{_KEY}")


def _cached_seed() -> Optional[str]:
    """An earlier cached venv of the same MindSpore version (other requirements) to copy from."""
    for path in sorted(glob.glob(os.path.join(cache_root(), f"venv-mindspore-{MS_VERSION}*")), reverse=True):
        site = _site_packages(path) if os.path.isdir(path) and ".build-" not in path else None
        if site and os.path.exists(os.path.join(path, ".msprobe-lake-ready")) and \
                os.path.isdir(os.path.join(site, "mindspore")):
            return path
    return None


def venv_python(path: Optional[str] = None) -> str:
    return os.path.join(path or venv_dir(), "bin", "python")


def _ready(path: str, key: str = _KEY) -> bool:
    """Whether the venv at ``path`` is built: its marker holds ``key`` (that of its requirements)."""
    marker = os.path.join(path, ".msprobe-lake-ready")
    if not os.path.exists(marker):
        return False
    with open(marker, encoding="utf-8") as f:
        return f.read().strip() == key


def _site_packages(path: str) -> Optional[str]:
    found = glob.glob(os.path.join(path, "lib", "python3*", "site-packages"))
    return found[0] if found else None


def _seed(src_venv: str, dst_venv: str) -> None:
    src, dst = _site_packages(src_venv), _site_packages(dst_venv)
    if src is None or dst is None:
        return
    for name in os.listdir(src):
        if name.lower().startswith(_SKIP_SEED) or name in ("pip", "setuptools") or name.startswith(("pip-", "_distutils")):
            continue
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if os.path.exists(d):
            continue
        if os.path.isdir(s):
            shutil.copytree(s, d, symlinks=True)
        else:
            shutil.copy2(s, d)


def _run(cmd: list, log: list, timeout: float) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    log.append(f"$ {' '.join(cmd)}\n{proc.stdout[-4000:]}")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed with exit code {proc.returncode}")


def _build_locked(path: str, key: str, fill: Callable[[str, list], None], failure: str) -> tuple:
    """(python path, None) of the venv at ``path``, built once: ready when its marker holds ``key``;
    else one process (holding ``path``.lock, the others wait and reuse its result) makes a venv in a
    temporary folder, ``fill(folder, log)`` installs into it, the marker is written and the folder
    renamed onto ``path``. (None, ``failure`` with the error and the log's tail) when that fails."""
    if _ready(path, key):
        return venv_python(path), None
    os.makedirs(cache_root(), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait and reuse its result
        if _ready(path, key):
            return venv_python(path), None
        tmp = f"{path}.build-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        log: list = []
        try:
            base = getattr(sys, "_base_executable", None) or sys.executable
            _run([base, "-m", "venv", tmp], log, 600)
            fill(tmp, log)
            with open(os.path.join(tmp, ".msprobe-lake-ready"), "w", encoding="utf-8") as f:
                f.write(key)
            shutil.rmtree(path, ignore_errors=True)
            os.rename(tmp, path)  # the venv's paths name tmp: its python is still found by venv_python(path)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = log[-1][-1500:] if log else ""
            return None, failure.format(exc=exc) + f"\n{tail}"
    return venv_python(path), None


def ensure_venv(timeout: float = 3600) -> tuple:
    """(python path, None) when the venv is ready, else (None, reason)."""

    def fill(tmp: str, log: list) -> None:
        seed = os.environ.get("MSPROBE_LAKE_MS_SEED_VENV") or _cached_seed()
        if seed and os.path.isdir(seed):
            _seed(seed, tmp)
        _run([venv_python(tmp), "-m", "pip", "install", "--disable-pip-version-check", *REQUIREMENTS], log, timeout)
        _run([venv_python(tmp), "-c", "import mindspore, numpy; assert numpy.__version__ < '2'"], log, 600)

    return _build_locked(venv_dir(), _KEY, fill,
                         "cannot create the MindSpore test venv ({exc}); no network or no wheel?")


def require_venv() -> str:
    """The MindSpore venv's python for a test: built when missing; the test fails (never skips) with the
    reason when it cannot be built."""
    py, why = ensure_venv()
    if py is None:
        import pytest

        pytest.fail(why, pytrace=False)
    return py


REAL_TOOL = ["mindstudio-probe==26.2.0", "numpy<2"]
_REAL_KEY = hashlib.sha256(" ".join([_KEY, *REAL_TOOL]).encode()).hexdigest()[:8]
#: run from the venv's own folder (away from our checkout, whose msprobe/ would shadow the real one)
_REAL_CHECK = ("import os, sys, mindspore, numpy, msprobe; from msprobe.mindspore import PrecisionDebugger; "
               "p = os.path.realpath(msprobe.__file__); assert p.startswith(os.path.realpath(sys.prefix)), p; "
               "assert numpy.__version__ < '2'; print(p)")


def real_venv_dir() -> str:
    return os.path.join(cache_root(), f"venv-mindspore-{MS_VERSION}-realtool-{_REAL_KEY}")


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def ensure_real_venv(timeout: float = 1800) -> tuple:
    """(python path, None) of the venv holding the real mindstudio-probe 26.2.0 with MindSpore,
    else (None, reason)."""
    path = real_venv_dir()
    if _ready(path, _REAL_KEY):
        return venv_python(path), None
    base_py, why = ensure_venv()
    if base_py is None:
        return None, why

    def fill(tmp: str, log: list) -> None:
        shared = _site_packages(venv_dir())
        own = _site_packages(tmp)
        if shared is None or own is None:
            raise RuntimeError("no site-packages in the MindSpore venv or the new one")
        with open(os.path.join(own, "zz_msprobe_lake_mindspore.pth"), "w", encoding="utf-8") as f:
            f.write(shared + "\n")
        _run([venv_python(tmp), "-m", "pip", "install", "--disable-pip-version-check", *REAL_TOOL], log, timeout)
        proc = subprocess.run([venv_python(tmp), "-c", _REAL_CHECK], cwd=tmp, env=_clean_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"the real msprobe does not import with MindSpore: {proc.stdout[-1500:]}")

    return _build_locked(path, _REAL_KEY, fill, "cannot create the real-tool MindSpore venv ({exc})")


if __name__ == "__main__":
    py, why = ensure_venv()
    print(py or why)
    real, why_real = ensure_real_venv() if py else (None, why)
    print(real or why_real)
    sys.exit(0 if py and real else 1)
