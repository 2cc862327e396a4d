"""Helpers of the MindSpore tests (they run in the MindSpore venv, see ms_venv.py)."""
from __future__ import annotations

import glob
import json
import math
import os
import re
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
REAL = os.path.join(ROOT, "tests", "fixtures", "real", "ms26_mindspore")
SCRIPTS = os.path.join(ROOT, "tests", "fixtures", "real", "scripts")
_PGRAD_COUNT = re.compile(r"\.parameters_grad\.\d+$")


def normalize_real(name: str) -> str:
    """Deliberate difference 2 (spec/FORMAT.md and PRODUCER.md §20): parameters_grad records carry no count."""
    return _PGRAD_COUNT.sub(".parameters_grad", name)


def read_doc(root: str, step: int = 0, name: str = "dump.json", rank: str = "rank", split: str = "") -> dict:
    """A JSON document of ``root/[split/]step{step}/{rank}/``."""
    with open(os.path.join(root, split, f"step{step}", rank, name), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture
def pynative():
    """PyNative mode on CPU and a fresh debugger around a test (use it autouse: ``usefixtures``)."""
    import mindspore

    from msprobe.mindspore import PrecisionDebugger

    mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")
    PrecisionDebugger._reset()
    yield
    PrecisionDebugger._reset()
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)


def rank_dir(dump_root: str, step: int = 0) -> str:
    found = sorted(glob.glob(os.path.join(dump_root, f"step{step}", "*")))
    found = [p for p in found if os.path.isdir(p)]
    assert len(found) == 1, found
    return found[0]


def load(dump_root: str, doc: str = "dump.json", step: int = 0) -> dict:
    with open(os.path.join(rank_dir(dump_root, step), doc), encoding="utf-8") as f:
        return json.load(f)


def run_script(script: str, args: list, cwd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3")
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *args], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


_FLOAT_DTYPE = re.compile(r"float|complex", re.I)


def is_float_checksum(entry) -> bool:
    """A tensor entry whose ``md5`` covers the bits of a floating-point tensor."""
    return isinstance(entry, dict) and isinstance(entry.get("md5"), str) and bool(_FLOAT_DTYPE.search(str(entry.get("dtype"))))


def diff_values(ours, real, path: str = "", rtol: float = 1e-5, atol: float = 1e-7, float_checksums: bool = True) -> list:
    """Differences between two JSON values; floats compared with a tolerance. ``float_checksums``
    False leaves out the ``md5`` of float tensors (their bits are the CPU kernels': compared with a
    live run of the real tool only, tests/fixtures/real/README.md)."""
    out: list = []
    if isinstance(real, dict) and isinstance(ours, dict):
        if list(ours) != list(real):
            out.append(f"{path}: keys {list(ours)} != {list(real)}")
        for k in real:
            if k == "md5" and not float_checksums and is_float_checksum(real):
                continue
            if k in ours:
                out += diff_values(ours[k], real[k], f"{path}.{k}", rtol, atol, float_checksums)
    elif isinstance(real, list) and isinstance(ours, list):
        if len(ours) != len(real):
            return [f"{path}: length {len(ours)} != {len(real)}"]
        for i, (a, b) in enumerate(zip(ours, real)):
            out += diff_values(a, b, f"{path}[{i}]", rtol, atol, float_checksums)
    elif isinstance(real, float) and isinstance(ours, (int, float)) and not isinstance(ours, bool):
        if not (math.isnan(real) and math.isnan(ours)) and not math.isclose(ours, real, rel_tol=rtol, abs_tol=atol):
            out.append(f"{path}: {ours!r} != {real!r}")
    elif ours != real or type(ours) is not type(real):
        out.append(f"{path}: {ours!r} != {real!r}")
    return out


def frame_key(frame: str) -> str:
    """A stack frame without the machine-specific part of its path."""
    m = re.match(r"File (.*?), line (\d+), in (.*?), \n (.*)$", frame, re.S)
    if not m:
        return frame
    path, line, func, code = m.groups()
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    else:
        path = os.path.basename(path)
    return f"{path}:{line}:{func}:{code.strip()}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cluster(python: str, script: str, args: list, cwd: str, timeout: float = 240, workers: int = 2) -> None:
    """``python script *args`` as a MindSpore CPU cluster of ``workers`` workers on 127.0.0.1 (a scheduler
    and the workers, by ``MS_ROLE``; the framework's mccl backend), our sources on PYTHONPATH; fails the
    test with each process's log tail when one of them fails."""
    env = dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3", MS_WORKER_NUM=str(workers), MS_SCHED_HOST="127.0.0.1",
               MS_SCHED_PORT=str(_free_port()))
    roles = [("MS_SCHED", None)] + [("MS_WORKER", node) for node in range(workers)]
    procs = []
    for role, node in roles:
        e = dict(env, MS_ROLE=role, **({} if node is None else {"MS_NODE_ID": str(node)}))
        procs.append(subprocess.Popen([python, script, *args], env=e, cwd=cwd,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        pytest.fail("\n".join(f"--- {role} {node}: exit {p.returncode}\n{log[-2500:]}"
                              for (role, node), p, log in zip(roles, procs, logs)))
