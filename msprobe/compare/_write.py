"""The one writer of compare's result files: the CSV (RFC 4180 quoting only where a cell needs
it, ``\\r\\n`` line ends, as csv.writer) written a column at a time, and the .xlsx sheet."""
from __future__ import annotations

import math
from typing import Any

from msprobe.compare._floattext import FloatCells
from msprobe.errors import MissingDependencyError
from msprobe.format.native import leafwalk
from msprobe.format.stats import CSV_BENCH, CSV_DIFF

__all__ = ["write_header", "write_columns", "write_xlsx", "XLSX_FILLS"]

#: the xlsx's row fills by Result (8.1.1 colours error rows red and warning rows yellow)
XLSX_FILLS = {"error": "FFC7CE", "warning": "FFEB9C"}
#: rows joined per write
_ROWS_PER_WRITE = 50000


def _needs_quote(cell: str) -> bool:
    return "," in cell or '"' in cell or "\n" in cell or "\r" in cell


def _quoted(column: list) -> list:
    """A CSV column, RFC 4180 quoting only the cells that need it."""
    if not _needs_quote("\x00".join(column)):
        return column
    distinct = {cell: ('"' + cell.replace('"', '""') + '"') if _needs_quote(cell) else cell for cell in set(column)}
    return list(map(distinct.__getitem__, column))  # each distinct cell (a stack repeats) looked at once


def write_header(path: str, names: list) -> None:
    """Start the CSV ``path`` with its header line."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        handle.write(",".join(_quoted(list(names))) + "\r\n")


def write_columns(path: str, columns: list) -> None:
    """Append the rows of ``columns`` (lists of strings or :class:`FloatCells`, one per CSV column)
    to the CSV ``path``."""
    if not columns or not len(columns[0]):
        return
    walker = leafwalk()
    text = None
    if walker is not None:  # the same bytes, made in C (FloatCells' floats written from orjson's text)
        text = walker.csv_rows([column.csv_column() if column.__class__ is FloatCells else column
                                for column in columns])
    if text is not None:
        with open(path, "ab") as handle:
            handle.write(text)
        return
    columns = [column.tolist() if column.__class__ is FloatCells else column for column in columns]
    quoted = [_quoted(column) for column in columns]
    with open(path, "a", newline="", encoding="utf-8") as handle:
        for start in range(0, len(quoted[0]), _ROWS_PER_WRITE):
            stop = start + _ROWS_PER_WRITE
            handle.write("\r\n".join(map(",".join, zip(*[column[start:stop] for column in quoted]))) + "\r\n")


def _xlsx_value(value: Any) -> Any:
    """A CSV cell as the xlsx stores it: a finite number as a number, ``12.5%`` as the number
    0.125 (shown as a percentage), anything else (names, ``N/A``, ``nan``, ``inf``) as text."""
    if not isinstance(value, str) or not value or value[0] not in "-+.0123456789":
        return value
    is_percent = value.endswith("%")
    try:
        number = float(value[:-1] if is_percent else value)
    except ValueError:
        return value
    if not math.isfinite(number):
        return value
    if is_percent:
        return number / 100, True
    return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number


def write_xlsx(path: str, names: list, rows: list) -> str:
    """The CSV's rows as an xlsx sheet: the metric and statistics cells as numbers (Excel sorts
    them), error rows red and warning rows yellow."""
    try:
        import openpyxl
        from openpyxl.cell import WriteOnlyCell
        from openpyxl.styles import PatternFill
    except ImportError as exc:
        raise MissingDependencyError("--xlsx needs openpyxl: pip install 'msprobe-lake[xlsx]'") from exc
    workbook = openpyxl.Workbook(write_only=True)
    sheet = workbook.create_sheet("compare_result")
    sheet.append(names)
    fills = {result: PatternFill("solid", start_color=colour, end_color=colour)
             for result, colour in XLSX_FILLS.items()}
    result_at = names.index("Result") if "Result" in names else None
    first = next((k for k, name in enumerate(names) if name in (CSV_DIFF[0], "Cosine")), len(names))
    last = names.index(CSV_BENCH[-1]) if CSV_BENCH[-1] in names else first - 1
    for row in rows:
        fill = fills.get(row[result_at]) if result_at is not None else None
        out = []
        for position, value in enumerate(row):
            cell = _xlsx_value(value) if first <= position <= last else value
            if isinstance(cell, tuple) or fill is not None:
                styled = WriteOnlyCell(sheet, value=cell[0] if isinstance(cell, tuple) else cell)
                if isinstance(cell, tuple):
                    styled.number_format = "0.00########%"
                if fill is not None:
                    styled.fill = fill
                cell = styled
            out.append(cell)
        sheet.append(out)
    workbook.save(path)
    return path
