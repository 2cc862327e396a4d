"""The documents of one step as they are built: the records (dump.json's ``data``), the parents
of construct.json, the stack table of stack.json, the statistics still on the device, and the
tensor files named (with mapping.csv's long names)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

from msprobe.format.naming import converted_file_name, needs_mapping
from msprobe.format.stats import STAT_KEYS

__all__ = ["PendingStats", "StackTable", "StatsFetchError", "StepDocuments"]


class StatsFetchError(Exception):
    """Raised by a ``fetch_stats`` whose batch met the failure of the computation behind a
    tensor (an asynchronous kernel error surfacing at the read): ``values`` holds the batch's
    statistics (None where unreadable) and ``error`` the framework's exception, which the
    session raises to the training script once the entries are filled: the dump never
    swallows an error the script would have seen without it."""

    def __init__(self, values: list, error: BaseException) -> None:
        super().__init__(str(error))
        self.values = values
        self.error = error


class PendingStats:
    """Tensor entries whose statistics are still on the device.

    ``extend(made)`` remembers the ``(entry, handle)`` pairs a record's encoder made (``take_stats``;
    ``add(entry, handle)`` one pair): an entry is a dict with Max/Min/Mean/Norm keys already in place,
    the handle adapter-specific; ``resolve(fn)`` fetches every handle in one batch via
    ``fn(handles) -> list[dict]`` and fills the entries in place.
    """

    __slots__ = ("pairs",)

    def __init__(self) -> None:
        self.pairs: list = []

    def add(self, entry: dict, handle: Any) -> None:
        self.pairs.append((entry, handle))

    def extend(self, made: list) -> None:
        """``(entry, handle)`` pairs, as an encoder hands them over (``take_stats``)."""
        self.pairs.extend(made)

    @property
    def handles(self) -> list:
        return [handle for _, handle in self.pairs]

    def __len__(self) -> int:
        return len(self.pairs)

    def resolve(self, fetch: Callable[[list], list]) -> None:
        pairs = self.pairs
        if not pairs:
            return
        error = None
        try:
            values = fetch([handle for _, handle in pairs])
        except StatsFetchError as exc:
            values, error = exc.values, exc.error
        for (entry, _), vals in zip(pairs, values):
            if "md5" in vals:
                entry["md5"] = vals["md5"]
            for stat in STAT_KEYS:
                if stat in entry:
                    entry[stat] = vals.get(stat)
        self.pairs = []
        if error is not None:
            raise error


class StackTable:
    """stack.json: each distinct stack stored once, records refer to it by id."""

    def __init__(self) -> None:
        self.ids: dict = {}  # frames tuple -> id
        self.names: dict = defaultdict(list)  # id -> record names
        self.frames: dict = {}  # id -> frames tuple

    def add(self, name: str, frames: tuple) -> tuple:
        """Returns (stack id, True when this stack is new)."""
        sid = self.ids.get(frames)
        new = sid is None
        if new:
            sid = self.ids[frames] = len(self.ids)
            self.frames[sid] = frames
        self.names[sid].append(name)
        return sid, new

    def to_json(self, render: Callable[[tuple], list]) -> dict:
        return {str(sid): [self.names[sid], render(self.frames[sid])] for sid in sorted(self.names)}

    def clear(self) -> None:
        self.ids.clear()
        self.names.clear()
        self.frames.clear()


class StepDocuments:
    """What the current step's documents hold so far (a new one each step)."""

    __slots__ = ("data", "construct", "stacks", "pending", "files", "mapping", "skipped", "encoded")

    def __init__(self) -> None:
        self.data: dict = {}
        self.construct: dict = {}
        self.stacks = StackTable()
        self.pending = PendingStats()
        self.files: set = set()  # tensor file (or payload) names of the step
        self.mapping: dict = {}  # data name -> its file name (the 255-character rule)
        self.skipped = 0  # tensor files of this step not written (the disk is full)
        #: record name -> (the record object, its JSON text) as journaled: publish writes the same text
        self.encoded: dict = {}

    def file_name(self, data_name: str) -> str:
        """The file name for ``data_name`` (the 255-character rule, recorded in mapping.csv)."""
        if not needs_mapping(data_name):
            return data_name
        short = converted_file_name(data_name)
        self.mapping[data_name] = short
        return short

    def rewrite_parents(self, fix: Callable[[Any, Callable[[Any], bool]], Any]) -> None:
        """Each parent of construct.json that is neither a record nor in construct.json replaced by
        ``fix(parent, known)``, where ``known(name)`` says whether ``name`` is one of them."""
        data, construct = self.data, self.construct

        def known(name: Any) -> bool:
            return name in data or name in construct

        for child, parent in list(construct.items()):
            if parent is not None and parent not in data and parent not in construct:  # (fix keeps a known one)
                construct[child] = fix(parent, known)
