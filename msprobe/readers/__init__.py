"""Read msprobe dumps of every dialect, from any storage, lazily.

>>> import msprobe.readers
>>> d = msprobe.readers.open("s3://bucket/run1", storage_options={...})   # doctest: +SKIP
>>> d.steps, d.ranks, d.framework, d.task, d.level                          # doctest: +SKIP
>>> rec = d.record("Functional.linear.0.forward", step=0, rank=None)        # doctest: +SKIP
>>> rec.input_args[0].load()                                                # doctest: +SKIP
>>> d.to_pandas()                                                           # doctest: +SKIP

Opening costs directory listings only; dump.json is parsed per rank on first use,
or not at all when a Parquet index answers (``msprobe.readers.index``). Tensors
are read one at a time, safely (``torch.load(weights_only=True)``,
``numpy.load(allow_pickle=False)``), and checked against their record.

Importing this package imports neither torch nor pyarrow nor pandas.
"""
from __future__ import annotations

from msprobe.index.rows import COLUMNS
from msprobe.readers._api import ENGINES, Engine, IndexEngine, MsprobeEngine, guess_engine, list_engines, open
from msprobe.readers._dump import ANY, AmbiguousRecordError, Dump
from msprobe.readers._record import DumpRecord, TensorRef
from msprobe.readers.index import build_index, write_rank_index

__all__ = [
    "open",
    "Dump",
    "DumpRecord",
    "TensorRef",
    "ANY",
    "AmbiguousRecordError",
    "COLUMNS",
    "ENGINES",
    "Engine",
    "MsprobeEngine",
    "IndexEngine",
    "guess_engine",
    "list_engines",
    "build_index",
    "write_rank_index",
]
