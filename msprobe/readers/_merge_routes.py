"""The single card's order of the MoE layers' tokens under expert x tensor parallelism (tensor mode,
spec/FORMAT.md 26.8): recomputed from each rank's routing as the dispatcher runs it. Each rank (tp
rank t of expert-parallel rank e) holds ``b`` samples of ``s`` tokens of its piece of the sequence,
flattened sample by sample; the card holds the ``E x b`` samples of ``T x s`` tokens one after the
other, so the rank's token j is the card's token ``(e b + j // s) T s + t s + j % s``. A merged dense
token tensor is the ranks' pieces joined (ep rank, then tp rank); an expert's tokens are those
its rank received from every (tp source, ep source), tp outermost, each source's in its token order,
where the card's are in token order; the experts' container holds every expert's, expert by expert.
"""
from __future__ import annotations

import re
from typing import Any, Optional

__all__ = ["TokenRoutes"]

_LAYER = re.compile(r"^[^.]+\.forward\.(\d+)$")


def _layer_call(rest: str) -> Optional[int]:
    found = _LAYER.match(rest)
    return int(found.group(1)) if found else None


class TokenRoutes:
    """The token orders of one expert-parallel group's merged model; ``ranks[e][t]``: the rank
    source (a tensor view) of expert-parallel rank e, tp rank t; ``experts``: the number of experts."""

    def __init__(self, ranks: list, tensors: Any, experts: int):
        self.ranks, self.tensors, self.experts = ranks, tensors, experts
        self._routes: dict = {}

    def _route(self, moe: str, mb: int) -> Optional[tuple]:
        """(b, s, [[chosen experts of each token of rank (e, t)]]) of layer ``moe``'s call ``mb``."""
        key = (moe, mb)
        if key not in self._routes:
            self._routes[key] = self._read(moe, mb)
        return self._routes[key]

    def _read(self, moe: str, mb: int) -> Optional[tuple]:
        import numpy as np

        shape, chosen = None, []
        for row in self.ranks:
            found = []
            for source in row:
                data = source.document().data
                layer = next((name for name in data if name.startswith(moe + ".") and
                              _layer_call(name[len(moe) + 1:]) == mb), None)
                router = next((name for name in data if name.startswith(moe + ".router.") and
                               name.endswith(f".forward.{mb}") and name.count(".") == moe.count(".") + 4), None)
                if layer is None or router is None:
                    return None
                args, outputs = data[layer].get("input_args") or [], data[router].get("output") or []
                if not args or len(outputs) < 2 or not isinstance(outputs[1], dict):
                    return None
                dims = tuple(args[0].get("shape") or ())
                if len(dims) < 3 or (shape is not None and dims[:2] != shape):
                    return None
                shape = dims[:2]
                index = np.asarray(self.tensors.array(outputs[1].get("data_name"), router))
                if index.ndim != 2 or index.shape[0] != shape[0] * shape[1]:
                    return None
                found.append(index)
            chosen.append(found)
        return (shape[0], shape[1], chosen) if shape is not None else None

    def _card(self, moe: str, mb: int) -> Optional[tuple]:
        """(b, s, T, [(e, t, card token index of each token of rank (e, t))])."""
        route = self._route(moe, mb)
        if route is None:
            return None
        b, s, chosen = route
        tp = len(chosen[0])
        return b, s, tp, chosen

    def dense(self, moe: str, mb: int) -> Optional[list]:
        """The order putting a merged dense token tensor (the ranks' pieces, ep rank then tp rank) in
        the card's: the merged row of each card row."""
        found = self._card(moe, mb)
        if found is None:
            return None
        b, s, tp, chosen = found
        tokens = [(e * b + j // s) * tp * s + t * s + j % s
                  for e in range(len(chosen)) for t in range(tp) for j in range(b * s)]
        return sorted(range(len(tokens)), key=tokens.__getitem__)

    def expert(self, moe: str, expert: int, mb: int) -> Optional[list]:
        """The order putting expert ``expert``'s merged tokens (as its rank received them) in the card's."""
        found = self._card(moe, mb)
        if found is None:
            return None
        b, s, tp, chosen = found
        tokens = [(e * b + j // s) * tp * s + t * s + j % s
                  for t in range(tp) for e in range(len(chosen))
                  for j in range(b * s) if expert in chosen[e][t][j].tolist()]
        return sorted(range(len(tokens)), key=tokens.__getitem__)

    def container(self, moe: str, mb: int) -> Optional[list]:
        """The order of the experts' container's tokens: every expert's in turn."""
        out: list = []
        for expert in range(self.experts):
            order = self.expert(moe, expert, mb)
            if order is None:
                return None
            offset = len(out)
            out.extend(offset + i for i in order)
        return out
