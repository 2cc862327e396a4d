"""The model tree of one cell: construct.json's hierarchy, each node with its worst error rolled up."""
from __future__ import annotations

from typing import Any, Optional

from msprobe.errors import MsprobeError

__all__ = ["Tree"]

_SEV = {3: "error", 2: "warning", 1: "pass", 0: ""}


class Tree:
    """Nodes are records (modules and APIs); a node's ``worst`` is the highest row score below it."""

    def __init__(self) -> None:
        self.nodes: dict = {}  # name -> node dict
        self.children: dict = {None: []}  # parent name (None: the roots) -> [child names], execution order
        self.bench_only: list = []
        self._up: Optional[dict] = None  # child -> parent, made on first use

    @staticmethod
    def _parents(src: Any) -> dict:
        if src is None:
            return {}
        try:
            p = src.parents() or {}
        except (MsprobeError, OSError, ValueError):
            return {}
        return {str(k): (str(v) if v is not None else None) for k, v in p.items()}

    @classmethod
    def build(cls, data: Any, cell: int) -> "Tree":
        t = cls()
        recs = data.query("""SELECT record, min(i) AS i, max(score) AS score, bool_or(nan_inf) AS nan_inf,
            count(*) AS n, max(CASE result WHEN 'error' THEN 3 WHEN 'warning' THEN 2 WHEN 'pass' THEN 1 ELSE 0 END)
            AS sev, max(norm_rel) FILTER (WHERE NOT isnan(norm_rel)) AS norm_rel, min(cosine) AS cosine,
            count(*) FILTER (WHERE bench_name IS NULL OR bench_name = 'N/A') AS unmatched,
            min(name) FILTER (WHERE bench_name IS NOT NULL AND bench_name <> 'N/A') AS a_name,
            min(bench_name) FILTER (WHERE bench_name IS NOT NULL AND bench_name <> 'N/A') AS a_bench
            FROM rows WHERE cell = ? GROUP BY record ORDER BY i""", [cell])
        parents = cls._parents(data.source("target", cell))
        order = {r["record"]: r["i"] for r in recs}
        for r in recs:
            bench = None
            if r["a_name"] and r["a_bench"]:
                suffix = r["a_name"][len(r["record"]):]
                b = r["a_bench"]
                bench = b[: len(b) - len(suffix)] if suffix and b.endswith(suffix) else b
            t.nodes[r["record"]] = {"name": r["record"], "i": r["i"], "score": r["score"] or 0.0,
                                    "sev": r["sev"], "nan_inf": bool(r["nan_inf"]), "norm_rel": r["norm_rel"],
                                    "cosine": r["cosine"], "rows": r["n"], "bench": bench,
                                    "matched": r["unmatched"] < r["n"] or not data.bench}
        # modules of construct.json that hold no row of their own (a module level not dumped)
        for child, parent in list(parents.items()):
            for name in (child, parent):
                if name is not None and name not in t.nodes:
                    t.nodes[name] = {"name": name, "i": None, "score": 0.0, "sev": 0, "nan_inf": False,
                                     "norm_rel": None, "cosine": None, "rows": 0, "bench": None, "matched": True}
        for name in t.nodes:
            parent = parents.get(name)
            seen = {name}
            while parent is not None and parent not in t.nodes:  # a broken chain: hang it at the root
                parent = None
            if parent in seen:
                parent = None
            t.children.setdefault(parent, []).append(name)
        t._rollup(order)
        # bench records no target record matched: compare's summary lists them per rank pair
        pairs = data.summary.get("pairs") or []
        if cell < len(pairs) and isinstance(pairs[cell], dict):
            unmatched = (pairs[cell].get("unmatched") or {}).get("bench") or []
            t.bench_only = [str(n) for n in unmatched][:1000]
        return t

    def _rollup(self, order: dict) -> None:
        """Each node's ``worst`` (its subtree's highest score) and ``first`` (its subtree's first row)."""
        big = 1 << 60
        for kids in self.children.values():
            kids.sort(key=lambda n: (order.get(n, big), n))
        # post-order without recursion (deep trees)
        stack: list = [(n, False) for n in self.children.get(None, [])]
        while stack:
            name, done = stack.pop()
            node = self.nodes[name]
            kids = self.children.get(name, [])
            if not done:
                stack.append((name, True))
                stack.extend((k, False) for k in kids if "worst" not in self.nodes[k])
                continue
            worst, first, sev, nan = node["score"], node["i"], node["sev"], node["nan_inf"]
            norm = node["norm_rel"]
            for k in kids:
                kn = self.nodes[k]
                worst = max(worst, kn["worst"])
                if kn["worst_norm"] is not None and (norm is None or kn["worst_norm"] > norm):
                    norm = kn["worst_norm"]
                sev = max(sev, kn["worst_sev"])
                nan = nan or kn["worst_nan"]
                if kn["first"] is not None and (first is None or kn["first"] < first):
                    first = kn["first"]
            node.update(worst=worst, worst_sev=sev, worst_nan=nan, first=first, worst_norm=norm)

    def view(self, name: str) -> dict:
        n = self.nodes[name]
        return {"name": name, "i": n["i"], "rows": n["rows"], "bench": n["bench"], "matched": n["matched"],
                "result": _SEV[n["sev"]], "worst": n["worst"], "worst_result": _SEV[n["worst_sev"]],
                "nan_inf": n["worst_nan"], "norm_rel": n["norm_rel"], "worst_norm_rel": n["worst_norm"],
                "cosine": n["cosine"],
                "children": len(self.children.get(name, []))}

    def kids(self, parent: Optional[str], begin: int = 0, end: int = 500) -> dict:
        if parent is not None and parent not in self.nodes:
            raise KeyError(parent)
        names = self.children.get(parent, [])
        return {"parent": parent, "total": len(names), "begin": begin,
                "nodes": [self.view(n) for n in names[begin:end]]}

    def path(self, name: str) -> list:
        """The ancestors of ``name``, root first, then ``name`` itself."""
        if self._up is None:
            self._up = {k: p for p, kids in self.children.items() for k in kids}
        parent_of = self._up
        out: list = []
        cur: Optional[str] = name
        while cur is not None and cur not in out:
            out.append(cur)
            cur = parent_of.get(cur)
        return out[::-1]
