"""A Dask cluster of separate processes on this machine whose workers share no folder with the
client: ``dask scheduler`` and ``dask worker`` commands, each worker in a mount namespace of
its own (``unshare -m`` as root, else ``unshare -rm`` in a user namespace) with a private
tmpfs mounted over the client's folder, as a worker on another machine sees it. Used by
tests/test_cluster_no_shared_disk.py and bench/bench_dask_cluster.py."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MOUNT = 'mount -t tmpfs msprobe-private "$0" && exec "$@"'


class NoPrivateMount(RuntimeError):
    """This machine cannot give a process a private tmpfs over a folder (why in the message)."""


def private_mount_prefix(probe_dir: str) -> list:
    """The command prefix that runs ``prefix + [folder, command...]`` with a private tmpfs over
    ``folder``; raises NoPrivateMount saying why where this machine cannot (no unshare, not root,
    no user namespaces)."""
    if shutil.which("unshare") is None:
        raise NoPrivateMount("no unshare command on PATH (util-linux): the workers cannot be given a private "
                             "tmpfs over the client's folders")
    tried = []
    for flags in (["-m"], ["-r", "-m"]):
        command = ["unshare", *flags, "sh", "-c", _MOUNT, probe_dir, "true"]
        try:
            done = subprocess.run(command, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"`unshare {' '.join(flags)}`: {exc}")
            continue
        if done.returncode == 0:
            return ["unshare", *flags, "sh", "-c", _MOUNT]
        why = done.stderr.decode(errors="replace").strip().splitlines()
        tried.append(f"`unshare {' '.join(flags)}` exited {done.returncode}: {why[-1] if why else 'no message'}")
    raise NoPrivateMount("unshare cannot mount a private tmpfs here (needs root, or user namespaces for "
                         "`unshare -r`): " + "; ".join(tried))


@contextlib.contextmanager
def isolated_cluster(hidden: str, aside: str, prefix: list, workers: int = 2) -> Iterator[str]:
    """The scheduler's address of a cluster of ``workers`` worker processes (one thread each)
    that cannot see the folder ``hidden``; ``aside``: a folder outside it for the scheduler file,
    the logs and the workers' own space. Checks that the workers do not see ``hidden``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    scheduler_file = os.path.join(aside, "scheduler.json")
    dask = [sys.executable, "-m", "dask"]
    logs = []
    procs = []
    try:
        logs.append(open(os.path.join(aside, "scheduler.log"), "wb"))
        procs.append(subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                       "--scheduler-file", scheduler_file], cwd=aside, env=env,
                                      stdout=subprocess.DEVNULL, stderr=logs[-1]))
        for i in range(workers):
            local = os.path.join(aside, f"worker{i}")
            os.makedirs(local, exist_ok=True)
            logs.append(open(f"{local}.log", "wb"))
            procs.append(subprocess.Popen(
                [*prefix, hidden, *dask, "worker", "--scheduler-file", scheduler_file, "--nthreads", "1",
                 "--no-nanny", "--no-dashboard", "--local-directory", local, "--name", f"w{i}"],
                cwd=local, env=env, stdout=subprocess.DEVNULL, stderr=logs[-1]))
        from distributed import Client

        deadline = time.monotonic() + 120
        while not os.path.exists(scheduler_file):
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError(f"the scheduler did not start (see {aside}/scheduler.log)")
            time.sleep(0.2)
        time.sleep(0.2)  # the file is written whole, but give it its last byte
        with open(scheduler_file, encoding="utf-8") as handle:
            address = json.load(handle)["address"]
        with Client(address) as client:
            client.wait_for_workers(workers, timeout=120)
            seen = os.path.join(hidden, f".seen-by-the-client-{os.getpid()}")
            open(seen, "w").close()
            try:
                if any(client.run(os.path.exists, seen).values()):
                    raise RuntimeError(f"a worker sees {hidden}: the folder is not hidden from it")
            finally:
                os.remove(seen)
        yield address
    finally:
        for proc in reversed(procs):  # the workers first, then the scheduler
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
