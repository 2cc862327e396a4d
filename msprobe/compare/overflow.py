"""``msprobe overflow_check -i STEP_DIR -o OUT``: the first anomaly (NaN/Inf) of one step over all
its ranks, written where and as the real 26.2.0 writes its answer.

The answer is :func:`msprobe.format.cluster.first_anomaly`: each rank's first record holding a NaN
or an Inf (a mask's intended ``-inf`` and the content of a receive buffer before its receive left
out), the one that comes first in the order the step's communication implies (a send before its
receive, a collective at once on its members). A NaN born on pipeline stage 1 that comes back to
stage 0 with the gradient is named on stage 1, where it was born, not on stage 0's ``recv``.

The file, ``OUT/anomaly_analyze_{timestamp}.json`` (``timestamp``: nanoseconds since the epoch),
has 26.2.0's shape: ``{"rank_N": [{"op_name", "data_info", "construct_info", "stack_info"}]}``,
one entry, the first anomaly, under its rank: ``data_info`` the record as dump.json holds it
(``input_args``/``input_kwargs``/``output``, or a backward's ``input``/``output``),
``construct_info`` its module chain outermost first and the record last (construct.json),
``stack_info`` its frames (stack.json). No anomaly: no file.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Iterator, Optional

from msprobe.errors import ConfigError
from msprobe.format.cluster import first_anomaly
from msprobe.readers import open as open_dump
from msprobe.readers import records_of

__all__ = ["analyze_step", "write_anomaly_file", "ANOMALY_FILE"]

#: the answer's file name (``{timestamp}``: nanoseconds since the epoch)
ANOMALY_FILE = "anomaly_analyze_{timestamp}.json"
_CHAIN_MAX = 256


def _rank_of(source: Any, position: int) -> int:
    return source.rank if source.rank is not None else position


def _sources(path: str, storage_options: Optional[dict]) -> list:
    dump = open_dump(path, storage_options=storage_options)
    sources = list(dump.sources)
    steps = {source.step for source in sources}
    if not sources:
        raise ConfigError(f"overflow_check: no rank directory with a dump.json under {path}")
    if len(steps) > 1:
        shown = ", ".join(f"step{s}" for s in sorted(s for s in steps if s is not None))
        raise ConfigError(f"overflow_check: {path} holds several steps ({shown}): give one step directory, "
                          f"e.g. {path.rstrip('/')}/step{min(s for s in steps if s is not None)}")
    return sources


def _ranks(sources: list) -> Iterator[tuple]:
    """(rank, records) of each rank, one parsed document at a time."""
    for position, source in enumerate(sources):
        records = records_of(source)
        yield _rank_of(source, position), records
        source.release()


def _chain(parents: dict, name: str) -> list:
    chain = [name]
    cur = parents.get(name)
    while cur and cur not in chain and len(chain) < _CHAIN_MAX:
        chain.append(cur)
        cur = parents.get(cur)
    return chain[::-1]


def _entry(source: Any, name: str) -> dict:
    record = records_of(source).get(name)
    frames = source.frames_of(name)
    return {"op_name": name, "data_info": dict(record) if isinstance(record, dict) else {},
            "construct_info": _chain(source.parents(), name), "stack_info": list(frames or [])}


def analyze_step(path: str, storage_options: Optional[dict] = None) -> Optional[dict]:
    """The first anomaly of the step at ``path`` (a step directory of rank directories, or one rank
    directory): ``{"anomaly": first_anomaly's answer (rank, record, kind, argument, order, path,
    path_text, ranks), "result": the file's content}``, or None when no rank holds a NaN/Inf."""
    sources = _sources(path, storage_options)
    found = first_anomaly(_ranks(sources))
    if found is None:
        return None
    source = next(s for k, s in enumerate(sources) if _rank_of(s, k) == found["rank"])
    entry = _entry(source, found["record"])
    source.release()
    return {"anomaly": found, "result": {f"rank_{found['rank']}": [entry]}}


def write_anomaly_file(result: dict, out_dir: str) -> str:
    """Write ``result`` (:func:`analyze_step`'s ``result``) to ``out_dir`` (created): its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, ANOMALY_FILE.format(timestamp=time.time_ns()))
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)
    return path
