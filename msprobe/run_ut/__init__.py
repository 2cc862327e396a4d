"""The offline precision pre-check (``msprobe run_ut`` / ``acc_check``) and ``api_precision_compare``.

Each forward API record of an L1 dump is replayed from ``msprobe.readers``
(dumped tensors, or tensors generated from their statistics) on the device side
in the recorded dtype and on a CPU float64 benchmark, forward and, when the dump
holds its backward, backward with the recorded gradient; every output is judged
with the docs' standards (:mod:`msprobe.run_ut.standards`,
:mod:`msprobe.run_ut.metrics`).

Library use::

    from msprobe.run_ut import check_api, CheckOptions, ResultWriter, run_ut
    res = check_api(record, CheckOptions(), backward_record=bwd)   # -> ApiResult (rows = details rows)
    with ResultWriter("out") as w:
        w.write(res)
    run_ut("dump/step0/rank0/dump.json", "out", workers=2)         # the whole CLI run

Online checking builds :class:`ApiPacket` objects and passes them to
:func:`check_api` (or :func:`check_packet`). Importing this package does not
import torch.
"""
from __future__ import annotations

from msprobe.run_ut.csvio import RESULT_HEADER, ResultWriter
from msprobe.run_ut.execute import ApiPacket, ApiResult, CheckOptions, check_packet, packet_from_record
from msprobe.run_ut.metrics import DETAILS_HEADER, compare_values
from msprobe.run_ut.precision_compare import api_precision_compare as _apc
from msprobe.run_ut.runner import check_api, list_tasks, load_run_ut_config, open_rank, run_ut

__all__ = ["run_ut", "check_api", "check_packet", "packet_from_record", "ApiPacket", "ApiResult", "CheckOptions",
           "ResultWriter", "RESULT_HEADER", "DETAILS_HEADER", "compare_values", "open_rank", "list_tasks",
           "load_run_ut_config", "api_precision_compare"]


def api_precision_compare(npu_csv: str, gpu_csv: str, out_path: str = ".") -> dict:
    return _apc(npu_csv, gpu_csv, out_path)
