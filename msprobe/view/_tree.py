"""The model tree of one cell: construct.json's hierarchy, each node with its worst error rolled up."""
from __future__ import annotations

from typing import Any, Optional

from msprobe.errors import MsprobeError

__all__ = ["Tree", "Node"]

_SEV = {3: "error", 2: "warning", 1: "pass", 0: ""}


class Node:
    """One record or module: its own figures, then its subtree's (``worst*``, ``first``)."""

    __slots__ = ("i", "score", "sev", "nan", "norm", "cosine", "rows", "bench", "matched",
                 "worst", "worst_sev", "worst_nan", "worst_norm", "first")

    def __init__(self, i: Optional[int] = None, score: float = 0.0, sev: int = 0, nan: bool = False,
                 norm: Optional[float] = None, cosine: Optional[float] = None, rows: int = 0,
                 bench: Optional[str] = None, matched: bool = True) -> None:
        self.i, self.score, self.sev, self.nan, self.norm, self.cosine = i, score, sev, nan, norm, cosine
        self.rows, self.bench, self.matched = rows, bench, matched
        self.worst, self.worst_sev, self.worst_nan, self.worst_norm, self.first = score, sev, nan, norm, i


class Tree:
    """Nodes are records (modules and APIs); a node's ``worst`` is the highest row score below it."""

    def __init__(self) -> None:
        self.nodes: dict = {}  # name -> Node
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
        cur = data.cursor()
        try:
            recs = cur.execute("""SELECT record, min(i), max(score), bool_or(nan_inf), count(*),
                max(CASE result WHEN 'error' THEN 3 WHEN 'warning' THEN 2 WHEN 'pass' THEN 1 ELSE 0 END),
                max(norm_rel) FILTER (WHERE NOT isnan(norm_rel)), min(cosine),
                count(*) FILTER (WHERE bench_name IS NULL OR bench_name = 'N/A'),
                min(name) FILTER (WHERE bench_name IS NOT NULL AND bench_name <> 'N/A'),
                min(bench_name) FILTER (WHERE bench_name IS NOT NULL AND bench_name <> 'N/A')
                FROM rows WHERE cell = ? GROUP BY record ORDER BY 2""", [cell]).fetchall()
        finally:
            cur.close()
        parents = cls._parents(data.source("target", cell))
        no_bench = not data.bench
        nodes = t.nodes
        for record, i, score, nan, n, sev, norm, cosine, unmatched, a_name, a_bench in recs:
            bench = None
            if a_name and a_bench:
                suffix = a_name[len(record):]
                bench = a_bench[: len(a_bench) - len(suffix)] if suffix and a_bench.endswith(suffix) else a_bench
            nodes[record] = Node(i, score or 0.0, sev, bool(nan), norm, cosine, n, bench, unmatched < n or no_bench)
        # modules of construct.json that hold no row of their own (a module level not dumped)
        for child, parent in parents.items():
            if child not in nodes:
                nodes[child] = Node()
            if parent is not None and parent not in nodes:
                nodes[parent] = Node()
        for name in nodes:
            parent = parents.get(name)
            if parent == name:
                parent = None
            t.children.setdefault(parent, []).append(name)
        t._rollup()
        # bench records no target record matched: compare's summary lists them per rank pair
        pairs = data.summary.get("pairs") or []
        if cell < len(pairs) and isinstance(pairs[cell], dict):
            unmatched_b = (pairs[cell].get("unmatched") or {}).get("bench") or []
            t.bench_only = [str(n) for n in unmatched_b][:1000]
        return t

    def _rollup(self) -> None:
        """Each node's subtree figures, children in execution order (first row of their subtree)."""
        nodes, children = self.nodes, self.children
        # post-order without recursion (deep trees); a cycle in a broken construct.json is cut
        done: set = set()
        stack: list = [(n, False) for n in children.get(None, [])]
        while stack:
            name, expanded = stack.pop()
            if not expanded:
                if name in done:
                    continue
                done.add(name)
                stack.append((name, True))
                stack.extend((k, False) for k in children.get(name, ()) if k not in done)
                continue
            node = nodes[name]
            for k in children.get(name, ()):
                kn = nodes[k]
                if kn.worst > node.worst:
                    node.worst = kn.worst
                if kn.worst_sev > node.worst_sev:
                    node.worst_sev = kn.worst_sev
                node.worst_nan = node.worst_nan or kn.worst_nan
                if kn.worst_norm is not None and (node.worst_norm is None or kn.worst_norm > node.worst_norm):
                    node.worst_norm = kn.worst_norm
                if kn.first is not None and (node.first is None or kn.first < node.first):
                    node.first = kn.first
        big = 1 << 60
        for kids in children.values():
            kids.sort(key=lambda n: (nodes[n].first if nodes[n].first is not None else big, n))

    def view(self, name: str) -> dict:
        n = self.nodes[name]
        return {"name": name, "i": n.i, "rows": n.rows, "bench": n.bench, "matched": n.matched,
                "result": _SEV[n.sev], "worst": n.worst, "worst_result": _SEV[n.worst_sev],
                "nan_inf": n.worst_nan, "norm_rel": n.norm, "worst_norm_rel": n.worst_norm,
                "cosine": n.cosine, "children": len(self.children.get(name, []))}

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
