"""Where compare's work runs: forked chunks of one rank pair, a temporary directory uploaded to a
remote output, and the garbage collector paused meanwhile. (Rank pairs go to
:class:`msprobe.execution.Executor` as :class:`~msprobe.compare._options.PairJob` tasks.)"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable, Optional

from msprobe.backends import local_path_of, upload_files
from msprobe.compare import _columnar
from msprobe.format.gcpause import gc_paused

__all__ = ["run_forked", "fork_available", "in_out_dir", "gc_paused"]


def fork_available() -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


def _chunk_child(context: Any, job: tuple, connection: Any) -> None:
    """A forked chunk process: its rows go to its part file, its summary back through ``connection``."""
    try:
        start, stop, with_rest, part = job
        open(part, "w").close()  # the part exists even when the chunk has no rows
        summary, _ = _columnar.columnar_pair(context, part, False, start=start, stop=stop, with_rest=with_rest)
        connection.send(("ok", summary))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        connection.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        connection.close()


def run_forked(context: Any, count: int, chunks: int, path: str, progress: Any) -> list:
    """The ``count`` record pairs of ``context`` split over ``chunks`` forked processes (each
    inherits the context; nothing is pickled but the summaries); part ``i`` of the CSV goes to
    ``<path>.part<i>``. Their :class:`PairSummary` objects, in order."""
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    bounds = [count * i // chunks for i in range(chunks + 1)]
    processes = []
    for i in range(chunks):
        receive, send = fork.Pipe(duplex=False)
        job = (bounds[i], bounds[i + 1], i == chunks - 1, f"{path}.part{i}")
        process = fork.Process(target=_chunk_child, args=(context, job, send), daemon=True)
        process.start()
        send.close()
        processes.append((process, receive))
    summaries: list = []
    failure = None
    for process, receive in processes:
        try:
            status, got = receive.recv()
        except EOFError:
            process.join()
            status, got = "error", f"a compare process died (exit code {process.exitcode})"
        process.join()
        receive.close()
        if status != "ok":
            failure = failure or got
            continue
        summaries.append(got)
        if progress is not None:
            progress.update(got.records)
    if failure is not None:
        raise RuntimeError(f"compare of {os.path.basename(path)} failed: {failure}")
    return summaries


def concatenate_parts(path: str, header: list, chunks: int) -> None:
    """The CSV ``path``: its header line, then the forked chunks' parts (removed)."""
    parts = [f"{path}.part{i}" for i in range(chunks)]
    try:
        with open(path, "wb") as out:
            out.write((",".join(header) + "\r\n").encode())
            for part in parts:
                with open(part, "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 22)
    finally:
        remove_parts(path, chunks)


def remove_parts(path: str, chunks: int) -> None:
    for i in range(chunks):
        part = f"{path}.part{i}"
        if os.path.exists(part):
            os.remove(part)


def in_out_dir(run: Callable[[str], dict], out_dir: str, storage_options: Optional[dict]) -> dict:
    """``run(directory)`` into ``out_dir``; an ``out_dir`` that is not a local directory (``s3://...``,
    a registered store's URL) gets the files (its result's ``files``) uploaded from a temporary
    local directory, so workers need no shared file system."""
    local = local_path_of(out_dir)
    if local is not None:
        return run(local)
    tmp = tempfile.mkdtemp(prefix="msprobe_compare_")
    try:
        result = run(tmp)
        result["files"] = upload_files(out_dir, tmp, [os.path.basename(f) for f in result["files"]], storage_options)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)



