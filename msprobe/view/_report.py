"""``msprobe report``: the explorer as one self-contained HTML file (no server, no network).

The page holds the built script and stylesheet inline, and the data as one JSON block
(``<script type="application/json">``, never executed): the overview, each cell's rows (bounded:
``max_rows`` per cell, the divergent rows kept first), each cell's model tree and the stacks of
the records kept. Its Content-Security-Policy allows only that one script, by its SHA-256 hash.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import Any

from msprobe.errors import MsprobeError
from msprobe.view._data import ROW_FIELDS, ViewData, json_safe
from msprobe.view._server import static_asset

__all__ = ["write_report", "report_bundle", "MAX_ROWS_PER_CELL", "MAX_TREE_NODES"]

MAX_ROWS_PER_CELL = 20000
MAX_TREE_NODES = 20000
#: the steps whose cluster view a report holds (those with NaN/Inf or errors first), and its lanes a step
MAX_CLUSTER_STEPS = 20
#: the row fields a report keeps (the list, the record detail and the trends need these)
_FIELDS = [field for field in ROW_FIELDS]


def _tree_bundle(data: ViewData, cell: int, keep: set, side: str = "target") -> dict:
    model = data.tree(cell, side)
    nodes: dict = {}
    children: dict = {}
    # breadth-first from the roots, so a bounded tree keeps its upper levels
    queue: list = [None]
    while queue and len(nodes) < MAX_TREE_NODES:
        parent = queue.pop(0)
        kids = model.children.get(parent, [])
        children["" if parent is None else parent] = kids[: MAX_TREE_NODES - len(nodes)]
        for kid in children["" if parent is None else parent]:
            node = model.view(kid)
            if node["rows"] and (node["peer"] if side == "bench" else kid) not in keep:
                node["rows"] = 0  # its rows are not in the report: the node is not a link
            nodes[kid] = node
            queue.append(kid)
    for name, node in nodes.items():  # children counts match what the report holds
        node["children"] = len(children.get(name, []))
    return {"nodes": nodes, "children": children, "bench_only": model.bench_only[:200]}


def _cluster_bundle(data: ViewData, cells: list) -> tuple:
    """({step key: the cluster page of its first lanes}, {cell: step key}) for the report's steps."""
    from msprobe.view._cluster import MAX_LANES

    steps: dict = {}
    for cell_row in cells:
        steps.setdefault((cell_row["run"], cell_row["step"]), []).append(cell_row)
    bad = {key for key, rows in steps.items() if any(row["nan_inf"] or row["errors"] for row in rows)}
    keys = sorted(steps, key=lambda key: key not in bad)[:MAX_CLUSTER_STEPS]
    clusters: dict = {}
    cluster_of: dict = {}
    for number, key in enumerate(keys):
        first = steps[key][0]["cell"]
        try:
            clusters[str(number)] = json_safe(data.cluster(first, 0, MAX_LANES))
        except (MsprobeError, OSError) as exc:
            clusters[str(number)] = {"error": str(exc)}
        for row in steps[key]:
            cluster_of[str(row["cell"])] = str(number)
    return clusters, cluster_of


def report_bundle(data: ViewData, max_rows: int = MAX_ROWS_PER_CELL) -> dict:
    """The report's data: bounded, pre-aggregated, JSON-ready."""
    meta = data.meta()
    overview = data.overview()
    rows: dict = {}
    stacks: dict = {}
    stack_texts: list = []
    stack_ids: dict = {}
    trees: dict = {}
    bench_trees: dict = {}
    truncated = 0
    for cell_row in meta["cells"]:
        cell = cell_row["cell"]
        kept = data.query(f"""SELECT {', '.join(_FIELDS)}, stack FROM rows WHERE cell = ? AND i IN (
            SELECT i FROM rows WHERE cell = ? ORDER BY (CASE WHEN {data.divergent_sql} THEN 0 ELSE 1 END), i
            LIMIT ?) ORDER BY i""", [cell, cell, max_rows])
        total = next((entry["rows"] for entry in overview["cells"] if entry["cell"] == cell), len(kept))
        truncated += max(total - len(kept), 0)
        cell_stacks: dict = {}
        for row in kept:
            rec = row["record"]
            if rec not in cell_stacks:
                frames = data.record_stack(cell, rec, row.pop("stack"))
                key = "\n".join(frames)
                if key not in stack_ids:
                    stack_ids[key] = len(stack_texts)
                    stack_texts.append(frames)
                cell_stacks[rec] = stack_ids[key]
            else:
                row.pop("stack")
        rows[str(cell)] = [[json_safe(row[field]) for field in _FIELDS] for row in kept]
        stacks[str(cell)] = cell_stacks
        trees[str(cell)] = _tree_bundle(data, cell, set(cell_stacks))
        if data.bench:
            bench_trees[str(cell)] = _tree_bundle(data, cell, set(cell_stacks), "bench")
    meta = dict(meta, truncated_rows=truncated)
    clusters, cluster_of = _cluster_bundle(data, overview["cells"])
    threshold = None
    div = str(data.summary.get("divergence") or "")
    if "NormRelativeErr >" in div:
        threshold = float(div.rsplit(">", 1)[1])
    return {"meta": meta, "overview": json_safe(overview), "columns": _FIELDS, "rows": rows, "stacks": stacks,
            "stack_texts": stack_texts, "trees": json_safe(trees),
            "bench_trees": json_safe(bench_trees), "threshold": threshold, "csv_fields": list(ROW_FIELDS),
            "clusters": clusters, "cluster_of": cluster_of}


def _json_block(obj: Any) -> str:
    """JSON that cannot end its ``<script>`` element nor open a comment (every ``<``, ``>``, ``&`` escaped)."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_report(bundle: dict) -> str:
    script = static_asset("app.js")
    style = static_asset("app.css")
    if "</script" in script.lower():
        script = script.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    csp = (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data: blob:; "
           f"base-uri 'none'; form-action 'none'")
    title = str(bundle["meta"].get("title") or "")
    esc_title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><link rel=\"icon\" href=\"data:,\">\n"
            f"<title>msprobe report · {esc_title}</title>\n<style>{style}</style></head>\n<body><div id=\"app\"></div>\n"
            f"<script type=\"application/json\" id=\"msprobe-data\">{_json_block(bundle)}</script>\n"
            f"<script>{script}</script>\n</body></html>\n")


def write_report(data: ViewData, out: str, max_rows: int = MAX_ROWS_PER_CELL) -> str:
    """Write the report of ``data`` to ``out`` (a local path); returns the path."""
    html = render_report(report_bundle(data, max_rows))
    tmp = out + ".part"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(html)
    os.replace(tmp, out)
    return out
