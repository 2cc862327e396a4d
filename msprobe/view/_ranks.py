"""The ranks behind each row of a merged parallel layout (``msprobe view --layout`` / ``--bench-layout``).

A merged cell is one logical model (:func:`msprobe.compare.merged_dump`: the ranks of a TP x PP (x DP)
run merged record by record). Its merged source's report names, per logical record, the ranks that
hold it and the suspects (the ranks whose shard or replica alone carries an anomaly). Each row gets
them as text: ``ranks`` (the target's), ``bench_ranks`` (the bench record's, when the bench is merged
too) and ``suspects`` (the target's suspects), so the list, the record and the tree say which ranks
hold what they show.
"""
from __future__ import annotations

from typing import Any

__all__ = ["mark_ranks", "RANK_COLUMNS"]

#: the columns of ``rows`` this module fills (NULL where no layout merged the side)
RANK_COLUMNS = ("ranks", "bench_ranks", "suspects")


def _text(ranks: Any) -> str:
    return ",".join(str(rank) for rank in ranks or [])


def _entries(located_row: Any, side: str, cell_row: dict) -> list:
    """[(record, ranks, suspects)] of the merged source of ``cell_row`` on ``side``; [] when that side
    is not merged (or cannot be opened)."""
    source = located_row(side, cell_row)[1]
    report = getattr(source, "report", None)
    if not report:
        return []
    return [(record, _text(entry.get("ranks")), _text(entry.get("suspects")) or None)
            for record, entry in (report.get("records") or {}).items()]


def mark_ranks(db: Any, located_row: Any, layouts: dict, record_sql: Any) -> int:
    """Fill :data:`RANK_COLUMNS` of the rows of every merged cell (``layouts``: side -> the layout
    text of the sides merged; ``located_row``: a row of ``cells`` -> (dump, source));
    ``record_sql(column)``: SQL of the record a row name is of (the bench record of ``bench_name``).
    Returns the (cell, side) pairs filled."""
    for column in RANK_COLUMNS:
        db.execute(f"ALTER TABLE rows ADD COLUMN IF NOT EXISTS {column} VARCHAR")
    if not any((layouts or {}).values()):
        return 0
    cur = db.execute("SELECT * FROM cells ORDER BY cell")
    cells = [dict(zip([described[0] for described in cur.description], found)) for found in cur.fetchall()]
    filled = 0
    for cell_row in cells:
        for side, sets, key in (("target", "ranks = t.ranks, suspects = t.suspects", "rows.record"),
                                ("bench", "bench_ranks = t.ranks", record_sql("rows.bench_name"))):
            if not layouts.get(side):
                continue
            entries = _entries(located_row, side, cell_row)
            if not entries:
                continue
            db.execute("CREATE OR REPLACE TEMP TABLE record_ranks (record VARCHAR, ranks VARCHAR, suspects VARCHAR)")
            db.executemany("INSERT INTO record_ranks VALUES (?, ?, ?)", entries)
            db.execute(f"UPDATE rows SET {sets} FROM record_ranks t WHERE rows.cell = ? AND {key} = t.record",
                       [cell_row["cell"]])
            db.execute("DROP TABLE record_ranks")
            filled += 1
    return filled
