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

from typing import TYPE_CHECKING

from msprobe._lazy import lazy_names

if TYPE_CHECKING:
    from msprobe.index.rows import COLUMNS
    from msprobe.readers._api import (
        ENGINES,
        Engine,
        IndexEngine,
        MsprobeEngine,
        guess_engine,
        list_engines,
        looks_like_dump,
        open,
    )
    from msprobe.readers._dump import ANY, AmbiguousRecordError, Dump
    from msprobe.readers._merged import merge_dump_step, other_shapes_of, shapes_of
    from msprobe.readers._record import DumpRecord, TensorRef
    from msprobe.readers._replay import InputTooLargeError
    from msprobe.readers._source import RankSource, records_of, task_of
    from msprobe.readers._store import arrow_location
    from msprobe.readers._tables import table_to_pandas
    from msprobe.readers._tensor import load_tensor_file
    from msprobe.readers.index import build_index, write_rank_index

#: each public name's submodule, imported on first use (msprobe._lazy)
__getattr__, __dir__ = lazy_names(__name__, {
    "msprobe.index.rows": ("COLUMNS",),
    "_api": ("ENGINES", "Engine", "IndexEngine", "MsprobeEngine", "guess_engine", "list_engines", "looks_like_dump", "open"),
    "_dump": ("ANY", "AmbiguousRecordError", "Dump"),
    "_merged": ("merge_dump_step", "other_shapes_of", "shapes_of"),
    "_record": ("DumpRecord", "TensorRef"),
    "_replay": ("InputTooLargeError",),
    "_source": ("RankSource", "records_of", "task_of"),
    "_store": ("arrow_location",),
    "_tables": ("table_to_pandas",),
    "_tensor": ("load_tensor_file",),
    "index": ("build_index", "write_rank_index"),
})

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
    # one rank directory, read raw (its documents, records and tensor files)
    "RankSource",
    "records_of",
    "task_of",
    "looks_like_dump",
    "load_tensor_file",
    "InputTooLargeError",
    # the merged logical model of a parallel run's step (compare --layout)
    "merge_dump_step",
    "other_shapes_of",
    "shapes_of",
    # Arrow/pandas access to a store's files
    "arrow_location",
    "table_to_pandas",
]
