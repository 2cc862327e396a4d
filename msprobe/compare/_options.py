"""What one compare is asked to do, as frozen values: :class:`CompareOptions` (the options every
rank pair shares) and :class:`PairJob` (one rank pair as a pool or Dask task)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Optional, Union

from msprobe.errors import ConfigError
from msprobe.execution import Outbox

__all__ = ["CompareOptions", "PairJob", "MODES"]

#: the compare modes (``auto`` picks one of them from the dumps)
MODES = ("statistics", "md5", "tensor")


@dataclass(frozen=True)
class CompareOptions:
    """The options of one rank pair's compare (see :func:`msprobe.compare.compare`):

    ``mode`` statistics / md5 / tensor; ``timestamp`` in the CSV names; ``multi_step``: the CSV
    names carry the step; ``xlsx``: an .xlsx beside each CSV; ``structural``, ``fuzzy``: how records
    match; ``stack``: the NPU_Stack_Info column; ``mapping``: {target row: bench row};
    ``threshold``: the NormRelativeErr of a divergence (None: the Result column decides);
    ``chunks``: forked processes sharing one rank pair's records; ``xframe``: MindSpore target against
    PyTorch bench, {"api": {...}, "cell": {...}, "layer": {...}} (:mod:`msprobe.compare._xframe`)."""

    mode: str
    timestamp: str
    multi_step: bool = False
    xlsx: bool = False
    structural: Any = "auto"
    fuzzy: bool = False
    stack: bool = True
    mapping: Optional[dict] = None
    threshold: Optional[float] = None
    chunks: int = 1
    xframe: Optional[dict] = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}: statistics, md5, tensor or auto")
        threshold = self.threshold
        if threshold is not None and not (isinstance(threshold, (int, float)) and threshold >= 0):
            raise ConfigError(f"the divergence threshold must be a number >= 0, not {threshold!r}")
        if self.structural not in ("auto", True, False):
            raise ConfigError(f"structural must be 'auto', True or False, not {self.structural!r}")

    @classmethod
    def of(cls, options: Union["CompareOptions", dict]) -> "CompareOptions":
        """``options`` as CompareOptions: itself, or from :func:`compare_pair`'s keywords
        (``ts`` for ``timestamp``; ``engine`` is accepted and ignored: there is one engine)."""
        if isinstance(options, CompareOptions):
            return options
        known = {field.name for field in fields(cls)}
        given = dict(options)
        given.pop("engine", None)
        if "ts" in given:
            given["timestamp"] = given.pop("ts")
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(f"unknown compare option(s): {', '.join(unknown)}")
        return cls(**given)

    def with_chunks(self, chunks: int) -> "CompareOptions":
        return replace(self, chunks=chunks)


@dataclass(frozen=True)
class PairJob:
    """One rank pair as a process-pool or Dask task: its two rank directories' URLs, the
    storage options, where the files go and the compare's options (:class:`CompareOptions`, or
    :func:`msprobe.compare.compare_pair`'s keyword arguments as a dict). ``outbox``: the
    caller's folder ``out_dir`` as a Dask task sees it (its files then come back with the
    result where the worker's machine does not share the caller's disk)."""

    target_url: str
    bench_url: str
    storage_options: Optional[dict]
    out_dir: str
    options: Union[CompareOptions, dict]
    outbox: Optional[Outbox] = None
