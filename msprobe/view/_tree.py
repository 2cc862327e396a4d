"""The model trees of one cell: the target's and the bench's construct.json hierarchies side by side.

Each node is a record or a module with its worst error rolled up from its children. A node's
``peer`` is its counterpart on the other side (the record compare matched it to, or the module of
the same name); a node without one is ``matched=False`` (marked in the page). The bench tree is
the bench dump's own hierarchy; its nodes carry their target peer's figures, so both sides are
coloured alike.
"""
from __future__ import annotations

from sys import intern
from typing import Any, Optional

from msprobe.errors import MsprobeError

__all__ = ["Tree", "Node", "build_pair"]

_SEV = {3: "error", 2: "warning", 1: "pass", 0: ""}


class Node:
    """One record or module: its own figures, then its subtree's (``worst*``, ``first``)."""

    __slots__ = ("i", "score", "sev", "nan", "norm_rel", "cosine", "rows", "bench", "matched",
                 "worst", "worst_sev", "worst_nan", "worst_norm", "first", "ranks", "bench_ranks", "suspects")

    def __init__(self, i: Optional[int] = None, score: float = 0.0, sev: int = 0, nan: bool = False,
                 norm_rel: Optional[float] = None, cosine: Optional[float] = None, rows: int = 0,
                 bench: Optional[str] = None, matched: bool = True) -> None:
        self.i = self.first = i
        self.score = self.worst = score
        self.sev = self.worst_sev = sev
        self.nan = self.worst_nan = nan
        self.norm_rel = self.worst_norm = norm_rel
        self.cosine = cosine
        self.rows = rows
        self.bench = bench
        self.matched = matched
        # a merged parallel layout: the ranks holding the record (its bench record's), the suspects
        self.ranks: Optional[str] = None
        self.bench_ranks: Optional[str] = None
        self.suspects: Optional[str] = None

    def copy_figures(self, other: "Node") -> None:
        """Take ``other``'s own figures (a bench node shows its target peer's comparison)."""
        self.i = self.first = other.i
        self.score = self.worst = other.score
        self.sev = self.worst_sev = other.sev
        self.nan = self.worst_nan = other.nan
        self.norm_rel = self.worst_norm = other.norm_rel
        self.cosine = other.cosine
        self.rows = other.rows


class Tree:
    """Nodes are records (modules and APIs); a node's ``worst`` is the highest row score below it.
    ``Node.bench`` holds the node's peer on the other side (for the bench tree: its target peer)."""

    def __init__(self, side: str = "target") -> None:
        self.side = side
        self.nodes: dict = {}  # name -> Node
        self.children: dict = {None: []}  # parent name (None: the roots) -> [child names], execution order
        self.bench_only: list = []
        self.other: Optional["Tree"] = None  # the other side's tree, when there is a bench
        self._up: Optional[dict] = None  # child -> parent, made on first use

    @staticmethod
    def parents_of(src: Any) -> dict:
        """child -> parent of a rank source's construct.json ({} when it has none or cannot be read)."""
        if src is None:
            return {}
        try:
            found = src.parents() or {}
        except (MsprobeError, OSError, ValueError):
            return {}
        # interned: the two trees and their peers share one string per name (150,000-node trees)
        return {intern(str(child)): (intern(str(parent)) if parent is not None else None)
                for child, parent in found.items()}

    @classmethod
    def build(cls, data: Any, cell: int) -> "Tree":
        """The target tree of ``cell`` (its bench tree, when there is a bench: :func:`build_pair`)."""
        model = cls("target")
        cur = data.cursor()
        try:
            recs = cur.execute("""SELECT record, min(i), max(score), bool_or(nan_inf), count(*),
                max(CASE result WHEN 'error' THEN 3 WHEN 'warning' THEN 2 WHEN 'pass' THEN 1 ELSE 0 END),
                max(norm_rel) FILTER (WHERE NOT isnan(norm_rel)), min(cosine),
                count(*) FILTER (WHERE bench_name IS NULL OR bench_name = 'N/A'),
                min(name) FILTER (WHERE bench_name IS NOT NULL AND bench_name <> 'N/A'),
                min(bench_name) FILTER (WHERE bench_name IS NOT NULL AND bench_name <> 'N/A'),
                min(ranks), min(bench_ranks), min(suspects)
                FROM rows WHERE cell = ? AND record <> 'N/A' GROUP BY record ORDER BY 2""", [cell]).fetchall()
        finally:
            cur.close()
        no_bench = not data.bench
        for record, first, score, nan, count, sev, norm, cosine, unmatched, a_name, a_bench, *ranks in recs:
            peer = None
            if a_name and a_bench:
                suffix = a_name[len(record):]
                peer = a_bench[: len(a_bench) - len(suffix)] if suffix and a_bench.endswith(suffix) else a_bench
            if peer is not None:
                peer = intern(peer)
            node = model.nodes[intern(record)] = Node(first, score or 0.0, sev, bool(nan), norm, cosine, count, peer,
                                                      unmatched < count or no_bench)
            node.ranks, node.bench_ranks, node.suspects = ranks
        model.link(cls.parents_of(data.source("target", cell)))
        # bench records no target record matched: compare's summary lists them per rank pair
        pairs = data.summary.get("pairs") or []
        if cell < len(pairs) and isinstance(pairs[cell], dict):
            unmatched_bench = (pairs[cell].get("unmatched") or {}).get("bench") or []
            model.bench_only = [str(name) for name in unmatched_bench][:1000]
        return model

    def link(self, parents: dict) -> None:
        """Modules of construct.json that hold no row (a level not dumped) become nodes; then each
        node goes under its parent and the figures are rolled up."""
        nodes = self.nodes
        for child, parent in parents.items():
            if child not in nodes:
                nodes[child] = Node()
            if parent is not None and parent not in nodes:
                nodes[parent] = Node()
        for name in nodes:
            parent = parents.get(name)
            if parent == name or parent not in nodes:
                parent = None
            self.children.setdefault(parent, []).append(name)
        self._rollup()

    def _rollup(self) -> None:
        """Each node's subtree figures, children in execution order (first row of their subtree)."""
        nodes, children = self.nodes, self.children
        # breadth-first from the roots, then back up: every node after its children (no recursion for
        # deep trees; a cycle in a broken construct.json is cut where it closes)
        order: list = list(children.get(None, []))
        seen: set = set(order)
        for name in order:  # grows while it is walked
            for kid in children.get(name, ()):
                if kid not in seen:
                    seen.add(kid)
                    order.append(kid)
        for name in reversed(order):
            kids = children.get(name)
            if not kids:
                continue
            node = nodes[name]
            for kid in kids:
                below = nodes[kid]
                if below.worst > node.worst:
                    node.worst = below.worst
                if below.worst_sev > node.worst_sev:
                    node.worst_sev = below.worst_sev
                if below.worst_nan:
                    node.worst_nan = True
                if below.worst_norm is not None and (node.worst_norm is None or below.worst_norm > node.worst_norm):
                    node.worst_norm = below.worst_norm
                if below.first is not None and (node.first is None or below.first < node.first):
                    node.first = below.first
        big = 1 << 60
        for kids in children.values():
            kids.sort(key=lambda name: (nodes[name].first if nodes[name].first is not None else big, name))

    def view(self, name: str) -> dict:
        node = self.nodes[name]
        return {"name": name, "side": self.side, "i": node.i, "rows": node.rows,
                "bench": node.bench if self.side == "target" else name,
                "peer": node.bench, "matched": node.matched,
                "result": _SEV[node.sev], "worst": node.worst, "worst_result": _SEV[node.worst_sev],
                "nan_inf": node.worst_nan, "norm_rel": node.norm_rel, "worst_norm_rel": node.worst_norm,
                "cosine": node.cosine, "children": len(self.children.get(name, [])),
                "ranks": node.ranks, "suspects": node.suspects}

    def kids(self, parent: Optional[str], begin: int = 0, end: int = 500) -> dict:
        if parent is not None and parent not in self.nodes:
            raise KeyError(parent)
        names = self.children.get(parent, [])
        return {"parent": parent, "side": self.side, "total": len(names), "begin": begin,
                "nodes": [self.view(name) for name in names[begin:end]]}

    def path(self, name: str) -> list:
        """The ancestors of ``name``, root first, then ``name`` itself."""
        if self._up is None:
            self._up = {kid: parent for parent, kids in self.children.items() for kid in kids}
        parent_of = self._up
        out: list = []
        cur: Optional[str] = name
        while cur is not None and cur not in out:
            out.append(cur)
            cur = parent_of.get(cur)
        return out[::-1]


def build_pair(data: Any, cell: int) -> tuple:
    """(target tree, bench tree or None) of ``cell``: the bench tree is the bench dump's own
    construct.json hierarchy over the bench records compare matched and the bench-only ones."""
    target = Tree.build(data, cell)
    if not data.bench:
        return target, None
    bench = Tree("bench")
    bench_parents = Tree.parents_of(data.source("bench", cell))
    for name, node in target.nodes.items():  # the matched records, under their bench names
        if node.bench and node.matched and node.bench not in bench.nodes:
            twin = Node(bench=name)
            twin.copy_figures(node)
            twin.ranks = node.bench_ranks
            bench.nodes[node.bench] = twin
    # bench-only records, and the modules of the bench hierarchy holding no row (their peer: the
    # target node of the same name, below)
    for names in (target.bench_only, bench_parents, bench_parents.values()):
        for name in names:
            if name is not None and name not in bench.nodes:
                bench.nodes[name] = Node(matched=False)
    listed = set(target.bench_only)
    for name, twin in bench.nodes.items():
        mine = target.nodes.get(name)
        if twin.bench is None and mine is not None and name not in listed and (mine.bench is None or mine.bench == name):
            twin.bench, twin.matched = name, True
            twin.copy_figures(mine)
            twin.ranks = mine.bench_ranks
            mine.bench = name
    bench.link(bench_parents)
    known = bool(bench_parents)  # without the bench's hierarchy, a target module's peer is unknown, not missing
    for node in target.nodes.values():
        if node.bench is not None and node.bench not in bench.nodes:
            node.bench = None
        if node.bench is None and (node.rows or known):
            node.matched = False
    target.other, bench.other = bench, target
    return target, bench
