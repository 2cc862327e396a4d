"""``merge_result``: gather chosen APIs' compare metrics from every rank's compare result into one table.

The 8.x command ``msprobe -f pytorch merge_result -i INPUT_DIR -o OUTPUT_DIR -config config.yaml``
(doc 10 section 4): INPUT_DIR holds the ``compare_result_rank<N>_<ts>.csv`` (or ``.xlsx``) files of a
multi-rank compare; ``config.yaml`` names the APIs (``api``: prefixes such as
``Distributed.all_reduce`` or ``Distributed.all_reduce.0.forward``) and optionally the metrics
(``compare_index``: a subset of the compare mode's metric columns; default all of them). The
result has one sheet per metric: a row per matching NPU Name, a column per rank; a metric that
cannot be computed (``N/A``, ``unsupported``, ``nan``) shows the two sides' max values instead.
Written as ``multi_ranks_compare_merge_<ts>.xlsx`` (needs openpyxl).
"""
from __future__ import annotations

import csv
import os
import re
import time
from typing import Optional

from msprobe.compare._rows import COLUMNS
from msprobe.errors import ConfigError, MissingDependencyError, require
from msprobe.format.stats import CSV_BENCH, CSV_TARGET

__all__ = ["merge_result", "read_yaml", "METRICS"]

#: the metric columns a mode's result holds (md5 results have none: refused, as in 8.x)
METRICS = {"statistics": COLUMNS["statistics"][8:16], "tensor": COLUMNS["tensor"][8:14]}
_RANK = re.compile(r"^compare_result_(?:step\d+_)?rank(\d+)_\d+\.(csv|xlsx)$")
_UNDEFINED = {"N/A", "unsupported", "nan", "Nan", "NaN", ""}


def read_yaml(path: str, option: str):
    """A YAML file given on the command line (``option``: its flag, for the one-line errors)."""
    yaml = require("yaml", "yaml")
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot read it ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{option} {path}: not valid YAML ({str(exc).splitlines()[0]})") from exc


def _read_config(path: str) -> tuple:
    cfg = read_yaml(path, "-config")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("api"), list) or not cfg["api"] \
            or not all(isinstance(api, str) and api for api in cfg["api"]):
        raise ConfigError(f"-config {path}: 'api' (a list of API or module names) is required")
    index = cfg.get("compare_index") or []
    if not isinstance(index, list) or not all(isinstance(metric, str) for metric in index):
        raise ConfigError(f"-config {path}: 'compare_index' must be a list of metric column names")
    return cfg["api"], index


def _rows(path: str) -> list:
    if path.endswith(".xlsx"):
        openpyxl = _openpyxl()
        workbook = openpyxl.load_workbook(path, read_only=True)
        rows = [["" if cell is None else str(cell) for cell in row]
                for row in workbook.active.iter_rows(values_only=True)]
        workbook.close()
    else:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    if not rows:
        raise ConfigError(f"{path}: an empty compare result")
    return rows


def _openpyxl():
    try:
        import openpyxl
    except ImportError as exc:
        raise MissingDependencyError("merge_result writes .xlsx: pip install 'msprobe-lake[xlsx]'") from exc
    return openpyxl


def _wanted(name: str, apis: list) -> bool:
    return any(name == api or name.startswith(api + ".") for api in apis)


def merge_result(input_dir: str, output_dir: str, config: str, *, timestamp: Optional[str] = None) -> dict:
    """Merge the rank compare results of ``input_dir``; returns {"file", "ranks", "rows", "metrics"}."""
    apis, index = _read_config(config)
    openpyxl = _openpyxl()
    if not os.path.isdir(input_dir):
        raise ConfigError(f"-i {input_dir}: not a directory")
    files: dict = {}
    for file_name in sorted(os.listdir(input_dir)):
        found = _RANK.match(file_name)
        if found:
            files.setdefault(int(found.group(1)), os.path.join(input_dir, file_name))
    if not files:
        raise ConfigError(f"-i {input_dir}: no compare_result_rank<N>_<timestamp>.csv/.xlsx files (the output of a "
                          f"multi-rank compare)")
    mode = None
    table: dict = {}  # metric -> {name: {rank: value}}
    names: list = []
    for rank, path in sorted(files.items()):
        rows = _rows(path)
        header = rows[0]
        found_mode = next((kind for kind, columns in METRICS.items() if columns[0] in header), None)
        if found_mode is None:
            raise ConfigError(f"{path}: not a statistics or tensor compare result (md5 results hold no metrics)")
        if mode is not None and found_mode != mode:
            raise ConfigError(f"{input_dir}: statistics and tensor compare results mixed ({os.path.basename(path)})")
        mode = found_mode
        metrics = index or METRICS[mode]
        bad = [metric for metric in metrics if metric not in METRICS[mode]]
        if bad:
            raise ConfigError(f"compare_index {bad} are not {mode} metrics (valid: {', '.join(METRICS[mode])})")
        column = {name: position for position, name in enumerate(header)}
        for row in rows[1:]:
            name = row[column["NPU Name"]]
            if not _wanted(name, apis):
                continue
            if name not in table.get(metrics[0], {}):
                names.append(name)
            for metric in metrics:
                value = row[column[metric]]
                if value.strip() in _UNDEFINED:
                    value = f"NPU:'{row[column[CSV_TARGET[0]]]}'  Bench:'{row[column[CSV_BENCH[0]]]}'"
                table.setdefault(metric, {}).setdefault(name, {})[rank] = value
    assert mode is not None  # files is not empty: every file set it
    metrics = index or METRICS[mode]
    ranks = sorted(files)
    workbook = openpyxl.Workbook()
    workbook.remove(workbook.active)
    for metric in metrics:
        sheet = workbook.create_sheet(metric.replace("/", "_")[:31])
        sheet.append(["NPU Name"] + [f"rank{rank}" for rank in ranks])
        for name in names:
            got = table.get(metric, {}).get(name, {})
            sheet.append([name] + [got.get(rank, "") for rank in ranks])
    os.makedirs(output_dir, exist_ok=True)
    out = os.path.join(output_dir, f"multi_ranks_compare_merge_{timestamp or time.strftime('%Y%m%d%H%M%S')}.xlsx")
    workbook.save(out)
    return {"file": out, "ranks": ranks, "rows": len(names), "metrics": list(metrics), "mode": mode}
