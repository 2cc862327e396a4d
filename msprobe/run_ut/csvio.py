"""The result and details CSV files of run_ut, written incrementally (resumable).

``accuracy_checking_result_{ts}.csv``: ``API name, Forward Test Success,
Backward Test Success, Message``; ``accuracy_checking_details_{ts}.csv``: the
columns of :data:`msprobe.run_ut.metrics.DETAILS_HEADER`. Both start with a
UTF-8 BOM and use a single space for an empty value, as the real tool's files
do, so either tool's ``api_precision_compare`` reads them.
"""
from __future__ import annotations

import csv
import io
import os
import re
import time
from typing import Iterable, Optional

from msprobe.errors import ConfigError
from msprobe.run_ut.metrics import DETAIL_FIELDS, DETAILS_HEADER

__all__ = ["RESULT_HEADER", "ResultWriter", "read_result_names", "details_path_for", "format_value",
           "read_csv_rows", "api_of_row"]

RESULT_HEADER = ["API name", "Forward Test Success", "Backward Test Success", "Message"]
_TS_RE = re.compile(r"accuracy_checking_result_(\w+)\.csv$")
BLANK = " "


def format_value(v: object, precision: int = 14) -> str:
    if v is None:
        return BLANK
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        return f"{v:.{precision}f}"
    return str(v)


def details_path_for(result_csv: str) -> str:
    m = _TS_RE.search(os.path.basename(result_csv))
    if not m:
        raise ConfigError(f"{result_csv}: not an accuracy_checking_result_{{timestamp}}.csv file "
                          "(keep the file name to resume)")
    return os.path.join(os.path.dirname(result_csv) or ".", f"accuracy_checking_details_{m.group(1)}.csv")


def read_csv_rows(path: str) -> list:
    try:
        with open(path, newline="", encoding="utf-8-sig") as file:
            return list(csv.reader(file))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such CSV file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 CSV file") from exc


def read_result_names(result_csv: str) -> list:
    rows = read_csv_rows(result_csv)
    if not rows or rows[0][:1] != RESULT_HEADER[:1]:
        raise ConfigError(f"{result_csv}: not a run_ut result CSV (header {rows[0] if rows else 'missing'})")
    return [row[0] for row in rows[1:] if row]


def api_of_row(row_name: str) -> str:
    """``Functional.linear.0.backward.output.1`` -> ``Functional.linear.0``."""
    for sep in (".forward.", ".backward."):
        i = row_name.rfind(sep)
        if i > 0:
            return row_name[:i]
    return row_name


class ResultWriter:
    """Appends one API's result row and details rows at a time, flushed, so an interrupted run resumes."""

    def __init__(self, out_dir: str, *, timestamp: Optional[str] = None, resume_from: Optional[str] = None,
                 precision: int = 14):
        self.precision = precision
        self.done: set = set()
        if resume_from:
            self.result_path = resume_from
            self.details_path = details_path_for(resume_from)
            names = read_result_names(resume_from)
            self.done = set(names)
            self._trim_details()
        else:
            os.makedirs(out_dir, exist_ok=True)
            ts = timestamp or time.strftime("%Y%m%d%H%M%S")
            self.result_path = os.path.join(out_dir, f"accuracy_checking_result_{ts}.csv")
            self.details_path = os.path.join(out_dir, f"accuracy_checking_details_{ts}.csv")
            for path, header in ((self.result_path, RESULT_HEADER), (self.details_path, DETAILS_HEADER)):
                with open(path, "w", newline="", encoding="utf-8-sig") as file:
                    csv.writer(file).writerow(header)
        self._res = open(self.result_path, "a", newline="", encoding="utf-8")
        self._det = open(self.details_path, "a", newline="", encoding="utf-8")
        self.counts: dict = {}

    def _trim_details(self) -> None:
        """Drop details rows of APIs whose result row was never written (the run stopped between the two)."""
        if not os.path.exists(self.details_path):
            with open(self.details_path, "w", newline="", encoding="utf-8-sig") as file:
                csv.writer(file).writerow(DETAILS_HEADER)
            return
        rows = read_csv_rows(self.details_path)
        keep = [rows[0]] + [row for row in rows[1:] if row and api_of_row(row[0]) in self.done]
        if len(keep) == len(rows):
            return
        buf = io.StringIO()
        csv.writer(buf).writerows(keep)
        tmp = self.details_path + ".tmp"
        with open(tmp, "w", newline="", encoding="utf-8-sig") as file:
            file.write(buf.getvalue())
        os.replace(tmp, self.details_path)

    def write(self, result: object) -> None:
        """Write an :class:`~msprobe.run_ut.execute.ApiResult` (details first, then its result row)."""
        w = csv.writer(self._det)
        for row in result.rows:  # type: ignore[attr-defined]
            w.writerow([format_value(row.get(k), self.precision) if k not in ("name", "status", "message")
                        else (row.get(k) if row.get(k) not in (None, "") else BLANK) for k, _ in DETAIL_FIELDS])
        self._det.flush()
        csv.writer(self._res).writerow([result.name, result.forward or BLANK,  # type: ignore[attr-defined]
                                        result.backward or BLANK, result.message or ""])  # type: ignore[attr-defined]
        self._res.flush()
        self.done.add(result.name)  # type: ignore[attr-defined]
        for s in (result.forward, result.backward):  # type: ignore[attr-defined]
            if s:
                self.counts[s] = self.counts.get(s, 0) + 1

    def write_all(self, results: Iterable[object]) -> None:
        for row in results:
            self.write(row)

    def close(self) -> None:
        for file in (self._res, self._det):
            try:
                file.close()
            except OSError:
                pass

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
