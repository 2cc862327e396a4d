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

__all__ = ["merge_result", "read_yaml", "METRICS"]

#: the metric columns a mode's result holds (md5 results have none: refused, as in 8.x)
METRICS = {"statistics": COLUMNS["statistics"][8:16], "tensor": COLUMNS["tensor"][8:14]}
_RANK = re.compile(r"^compare_result_(?:step\d+_)?rank(\d+)_\d+\.(csv|xlsx)$")
_UNDEFINED = {"N/A", "unsupported", "nan", "Nan", "NaN", ""}


def read_yaml(path: str, option: str):
    """A YAML file given on the command line (``option``: its flag, for the one-line errors)."""
    yaml = require("yaml", "yaml")
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot read it ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{option} {path}: not valid YAML ({str(exc).splitlines()[0]})") from exc


def _read_config(path: str) -> tuple:
    cfg = read_yaml(path, "-config")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("api"), list) or not cfg["api"] \
            or not all(isinstance(a, str) and a for a in cfg["api"]):
        raise ConfigError(f"-config {path}: 'api' (a list of API or module names) is required")
    idx = cfg.get("compare_index") or []
    if not isinstance(idx, list) or not all(isinstance(x, str) for x in idx):
        raise ConfigError(f"-config {path}: 'compare_index' must be a list of metric column names")
    return cfg["api"], idx


def _rows(path: str) -> list:
    if path.endswith(".xlsx"):
        openpyxl = _openpyxl()
        wb = openpyxl.load_workbook(path, read_only=True)
        rows = [["" if v is None else str(v) for v in r] for r in wb.active.iter_rows(values_only=True)]
        wb.close()
    else:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
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
    return any(name == a or name.startswith(a + ".") for a in apis)


def merge_result(input_dir: str, output_dir: str, config: str, *, timestamp: Optional[str] = None) -> dict:
    """Merge the rank compare results of ``input_dir``; returns {"file", "ranks", "rows", "metrics"}."""
    apis, index = _read_config(config)
    openpyxl = _openpyxl()
    if not os.path.isdir(input_dir):
        raise ConfigError(f"-i {input_dir}: not a directory")
    files: dict = {}
    for f in sorted(os.listdir(input_dir)):
        fm = _RANK.match(f)
        if fm:
            files.setdefault(int(fm.group(1)), os.path.join(input_dir, f))
    if not files:
        raise ConfigError(f"-i {input_dir}: no compare_result_rank<N>_<timestamp>.csv/.xlsx files (the output of a "
                          f"multi-rank compare)")
    mode = None
    table: dict = {}  # metric -> {name: {rank: value}}
    names: list = []
    for rank, path in sorted(files.items()):
        rows = _rows(path)
        header = rows[0]
        m = next((k for k, cols in METRICS.items() if cols[0] in header), None)
        if m is None:
            raise ConfigError(f"{path}: not a statistics or tensor compare result (md5 results hold no metrics)")
        if mode is not None and m != mode:
            raise ConfigError(f"{input_dir}: statistics and tensor compare results mixed ({os.path.basename(path)})")
        mode = m
        metrics = index or METRICS[mode]
        bad = [x for x in metrics if x not in METRICS[mode]]
        if bad:
            raise ConfigError(f"compare_index {bad} are not {mode} metrics (valid: {', '.join(METRICS[mode])})")
        col = {c: i for i, c in enumerate(header)}
        for r in rows[1:]:
            name = r[col["NPU Name"]]
            if not _wanted(name, apis):
                continue
            if name not in table.get(metrics[0], {}):
                names.append(name)
            for x in metrics:
                v = r[col[x]]
                if v.strip() in _UNDEFINED:
                    v = f"NPU:'{r[col['NPU max']]}'  Bench:'{r[col['Bench max']]}'"
                table.setdefault(x, {}).setdefault(name, {})[rank] = v
    assert mode is not None  # files is not empty: every file set it
    metrics = index or METRICS[mode]
    ranks = sorted(files)
    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for x in metrics:
        ws = wb.create_sheet(x.replace("/", "_")[:31])
        ws.append(["NPU Name"] + [f"rank{r}" for r in ranks])
        for name in names:
            got = table.get(x, {}).get(name, {})
            ws.append([name] + [got.get(r, "") for r in ranks])
    os.makedirs(output_dir, exist_ok=True)
    out = os.path.join(output_dir, f"multi_ranks_compare_merge_{timestamp or time.strftime('%Y%m%d%H%M%S')}.xlsx")
    wb.save(out)
    return {"file": out, "ranks": ranks, "rows": len(names), "metrics": list(metrics), "mode": mode}
