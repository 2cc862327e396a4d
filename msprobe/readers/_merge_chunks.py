"""Virtual pipeline stages (Megatron's interleaved schedule, ``vpp``): each rank of a pipeline
holds ``vpp`` model chunks (``Module.0.``, ``Module.1.``, ...), chunk ``c`` of pipeline rank ``p``
being virtual stage ``c * pp + p`` of the model (spec/FORMAT.md section 26.5).

:func:`virtual_stages` splits each rank's records by chunk into :class:`ChunkSource` views, one per
virtual stage, that the merge of :mod:`msprobe.readers._merged` takes as it takes plain stages:

* a module record belongs to the chunk its name carries (the view names it without the chunk:
  ``Module.1.decoder.layers.0...`` is ``Module.decoder.layers.0...`` of its virtual stage);
* an API record to its nearest module ancestor's chunk (construct.json), a backward record
  without one to its forward call's chunk, any other record to the chunk before it;
* a send to the chunk of the record that made the tensor it sends, a receive to the chunk of the
  record that takes the tensor it receives (their statistics are the same tensor's; where they
  are not unique, the record before a send and the record after a receive), and each point-to-point
  call to its virtual peer: the next virtual stage forward, the previous one backward;
* the records after the rank's last backward record (the optimizer's updates, the clip, the loss
  scaler), which carry no module, to the chunk of the parameters and gradients they take (followed
  from the parameters and parameter gradients each chunk's records hold, through the records'
  outputs): a pass over the rank's parameters is split where it goes from one chunk's parameters
  to the next; a record of the whole rank goes with the chunk of its inputs; a collective there is
  in every chunk (one moment for all of them).
"""
from __future__ import annotations

import re
from typing import Any, Optional

from msprobe.errors import ConfigError
from msprobe.format.comm import comm_api, comm_call
from msprobe.format.documents import DumpDocument
from msprobe.readers._merge_leaf import _is_backward, _last_backward, _leaves, _signature

__all__ = ["ChunkSource", "virtual_stages", "chunk_count"]

_CHUNK = re.compile(r"^Module\.(\d+)\.")


def _chunk_of_name(name: Optional[str]) -> Optional[int]:
    found = _CHUNK.match(name or "")
    return int(found.group(1)) if found else None


def _stripped(name: str) -> str:
    """A record's name in its chunk's view: ``Module.1.x`` -> ``Module.x``."""
    return _CHUNK.sub("Module.", name, count=1)


def chunk_count(data: dict) -> int:
    """How many model chunks a rank's records carry (1 when none do)."""
    return len({c for c in (_chunk_of_name(name) for name in data) if c is not None}) or 1


class ChunkSource:
    """The records of one model chunk of one rank: a record source (like a rank's) whose document
    holds them under their names in the chunk (:func:`_stripped`), in the rank's order.
    ``full``: all the rank's records (what the partial sums of its all_reduce calls are read from);
    ``order_hints``: (the virtual stage of each point-to-point call's peer, the tail's names)."""

    def __init__(self, source: Any, chunk: int, names: list, peers: dict, tail: set, full: dict):
        self.source, self.chunk = source, chunk
        self.rank, self.step, self.url = source.rank, source.step, source.url
        self.rank_dir = getattr(source, "rank_dir", None)
        self.full = full
        self.original = {_stripped(name): name for name in names}
        raw = dict(source.document().raw)
        raw["data"] = {_stripped(name): full[name] for name in names}
        self._document = DumpDocument(raw)
        self.order_hints = ({_stripped(name): peer for name, peer in peers.items()},
                            {_stripped(name) for name in tail})
        parents = _parents(source)
        self._parents = {_stripped(name): (_stripped(parents[name]) if parents[name] is not None else None)
                         for name in names if name in parents}

    def document(self) -> DumpDocument:
        return self._document

    def parents(self) -> dict:
        return self._parents

    def frames_of(self, name: str) -> Optional[list]:
        return self.source.frames_of(self.original.get(name, name))


def _parents(source: Any) -> dict:
    try:
        return source.parents() or {}
    except Exception:  # noqa: BLE001 - no construct.json: no tree
        return {}


def _forward_of(name: str) -> Optional[str]:
    return name[: -len(".backward")] + ".forward" if name.endswith(".backward") else None


class _Split:
    """The chunk of each record of one rank (see the module's docstring)."""

    def __init__(self, data: dict, parents: dict, stage: int, pp: int, vpp: int):
        self.data, self.parents = data, parents
        self.stage, self.pp, self.vpp = stage, pp, vpp
        self.names = list(data)
        last = _last_backward(self.names)
        self.tail = {name for name in self.names[last + 1:]} if last >= 0 else set()
        self.chunk: dict = {}
        self.peers: dict = {}

    def run(self) -> tuple:
        """({chunk: [names]}, {name: virtual peer stage or None})."""
        for name in self.names:
            if name not in self.tail and comm_api(name) is None:
                found = self._own(name)
                if found is not None:
                    self.chunk[name] = found
        self._fill_untied()
        self._tail()
        self._comm()
        out: dict = {c: [] for c in range(self.vpp)}
        for name in self.names:
            for c in self.chunk.get(name, ()) if isinstance(self.chunk.get(name), tuple) else (self.chunk[name],):
                out[c].append(name)
        return out, self.peers

    def _own(self, name: str) -> Optional[int]:
        """The chunk a record names, or its nearest module ancestor's, or its forward call's."""
        seen = 0
        current: Optional[str] = name
        while current is not None and seen < 256:
            found = _chunk_of_name(current)
            if found is not None:
                return found
            current = self.parents.get(current)
            seen += 1
        forward = _forward_of(name)
        if forward is not None and forward in self.data:
            return self._own(forward)
        return None

    def _fill_untied(self) -> None:
        """Records (other than communication and the tail) of no module: the chunk before them."""
        previous: Optional[int] = None
        pending: list = []
        for name in self.names:
            if name in self.tail or comm_api(name) is not None:
                continue
            if name in self.chunk:
                previous = self.chunk[name]
                for waiting in pending:
                    self.chunk[waiting] = previous
                pending = []
            elif previous is not None:
                self.chunk[name] = previous
            else:
                pending.append(name)
        for waiting in pending:
            self.chunk[waiting] = 0

    def _tail(self) -> None:
        """The tail's records by the chunk of the tensors they take (see the module's docstring)."""
        known: dict = {}
        for name, chunk in self.chunk.items():
            for _, leaf in _leaves(self.data[name]):
                known.setdefault(_signature(leaf), set()).add(chunk)
        unique = {sig: next(iter(chunks)) for sig, chunks in known.items() if sig is not None and len(chunks) == 1}
        previous = 0
        for name in self.names:
            if name not in self.tail or comm_api(name) is not None:
                continue
            record = self.data[name]
            inputs = [leaf for key in ("input_args", "input_kwargs") for _, leaf in
                      _leaves(record.get(key) if isinstance(record, dict) else None)]
            big = {unique[s] for s in (_signature(leaf) for leaf in inputs if _numel(leaf) > 1) if s in unique}
            small = {unique[s] for s in (_signature(leaf) for leaf in inputs) if s in unique}
            chunk = max(big) if big else (max(small) if small else previous)
            self.chunk[name] = previous = chunk
            for _, leaf in _leaves(record.get("output") if isinstance(record, dict) else None):
                unique[_signature(leaf)] = chunk

    def _comm(self) -> None:
        """Each communication record's chunk and, for a point-to-point call, its virtual peer."""
        made: dict = {}
        taken: dict = {}
        for name, chunk in self.chunk.items():
            record = self.data[name]
            if not isinstance(record, dict):
                continue
            back = _is_backward(name)
            for key, into in (("output", made), ("input_args", taken), ("input_kwargs", taken)):
                for _, leaf in _leaves(record.get(key)):
                    into.setdefault(_signature(leaf), set()).add((chunk, back))
        everywhere = tuple(range(self.vpp))
        for index, name in enumerate(self.names):
            if comm_api(name) is None:
                continue
            call = comm_call(name, self.data[name], -1, index)
            if name in self.tail and (call is None or call.kind not in ("send", "recv")):
                self.chunk[name] = everywhere  # a collective of the tail: one moment for every chunk
                continue
            if call is None or call.kind not in ("send", "recv"):
                self.chunk[name] = self._near(index, -1)[0]
                continue
            send = call.kind == "send"
            record = self.data[name]
            leaves = _leaves(record.get("input_args" if send else "output")) if isinstance(record, dict) else []
            hits = {found for _, leaf in leaves for found in (made if send else taken).get(_signature(leaf), ())}
            chunk, back = next(iter(hits)) if len(hits) == 1 else self._near(index, -1 if send else 1)
            self.chunk[name] = chunk
            virtual = chunk * self.pp + self.stage
            step = -1 if back else 1
            peer = virtual + step if send else virtual - step
            self.peers[name] = peer if 0 <= peer < self.pp * self.vpp else None

    def _near(self, index: int, direction: int) -> tuple:
        """(chunk, backward) of the nearest record with a chunk before (-1) or after (+1) ``index``
        (the other way when there is none)."""
        for way in (direction, -direction):
            at = index + way
            while 0 <= at < len(self.names):
                name = self.names[at]
                if comm_api(name) is None and isinstance(self.chunk.get(name), int):
                    return self.chunk[name], _is_backward(name)
                at += way
        return 0, False


def _numel(leaf: Any) -> int:
    total = 1
    for size in leaf.get("shape") or ():
        total *= int(size)
    return total


def virtual_stages(stages: list, vpp: int) -> list:
    """[[ChunkSource of each tensor-parallel rank] per virtual stage] of ``stages`` ([[source of
    each tensor-parallel rank] per pipeline stage]): virtual stage ``c * pp + p`` is chunk ``c`` of
    pipeline stage ``p``. ConfigError when a rank's records carry no model chunks to split by."""
    pp = len(stages)
    out: list = [[] for _ in range(pp * vpp)]
    for p, stage in enumerate(stages):
        for source in stage:
            try:
                data = source.document().data
            except Exception:  # noqa: BLE001 - a rank without a document holds no records
                data = {}
            held = chunk_count(data)
            if held != vpp:
                raise ConfigError(f"layout vpp={vpp}: rank {source.rank}'s module records carry {held} model "
                                  f"chunk(s) (Module.0., Module.1., ...): a virtual pipeline is split by its chunks' "
                                  f"module records (dump at level L0 or mix)")
            split = _Split(data, _parents(source), p, pp, vpp)
            chunks, peers = split.run()
            for c in range(vpp):
                names = chunks[c]
                held_here = set(names)
                mine = {name: peer for name, peer in peers.items() if name in held_here}
                out[c * pp + p].append(ChunkSource(source, c, names, mine, split.tail & held_here, data))
    return out
