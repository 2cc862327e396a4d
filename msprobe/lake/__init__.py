"""The lake: many runs x steps x ranks of msprobe dumps as one queryable dataset.

>>> import msprobe.lake
>>> lake = msprobe.lake.open("s3://team-dumps", storage_options={...})   # doctest: +SKIP
>>> lake.catalog                          # one row per run: framework, task, level, steps, ranks, bytes...
>>> lake.sql("SELECT run, count(*) FROM lake GROUP BY run")               # doctest: +SKIP
>>> lake.first_nan()                      # first NaN/Inf per run and rank                   # doctest: +SKIP
>>> lake.diverge("run_npu", "run_gpu")    # first record where two runs diverge (compare)   # doctest: +SKIP
>>> lake.disagree()                       # data-parallel ranks whose grad Norm differs     # doctest: +SKIP
>>> lake.trend("Module.fc.Linear.parameters_grad", stat="norm", plot="trend.png")        # doctest: +SKIP

Layout under the root (the dumps themselves are only read)::

    ROOT/<run>/step<N>/rank<R>/dump.json ...            the runs, any dialect
    ROOT/_lake/index/run=<run>/step=<N>/rank=<R>/records.parquet   one index per rank dir
    ROOT/_lake/index/run=<run>/step=<N>/_compact.parquet           a step's ranks merged
    ROOT/_lake/manifest.parquet                          one row per rank dir (what was indexed)
    ROOT/_lake/catalog.json, catalog.parquet             one row per run

The lake's own files (``ROOT/_lake/`` above) go where ``lake_dir=`` (``--lake-dir``) says;
by default under the root when it can be written (one probe object written and deleted),
else in a local cache directory (``$MSPROBE_LAKE_CACHE``, ``$XDG_CACHE_HOME/msprobe-lake``
or ``~/.cache/msprobe-lake``), said in ``lake.lake_note`` (the CLI prints it on stderr): a
read-only share or bucket, a run's own directory and an empty folder are never written.
With a remote Dask cluster, give a ``lake_dir`` the workers can write too.

Index files are :mod:`msprobe.index` files (same schema and metadata), so
``msprobe.readers.open(ROOT + "/_lake/index")`` reads the lake too. Importing this
package imports neither pyarrow nor duckdb nor dask.
"""
from __future__ import annotations

from typing import Any

from msprobe.lake._catalog import read_catalog as _read
from msprobe.lake._lake import Lake

__all__ = ["open", "Lake", "LAKE_DIR", "read_catalog", "has_runs"]

LAKE_DIR = "_lake"


def open(root: Any, storage_options: Any = None, client: Any = None, **kwargs: Any) -> Lake:  # noqa: A001
    """Open (and index what is missing of) the lake at ``root``; see :class:`Lake`.

    Example: ``with msprobe.lake.open("./lake") as lake: lake.catalog`` (``msprobe lake ls ./lake``)."""
    return Lake(root, storage_options=storage_options, client=client, **kwargs)


def has_runs(root: Any, storage_options: Any = None) -> bool:
    """Whether ``root`` holds at least one dump (searched as the lake does, 3 levels deep), without
    opening the lake or writing anything. Example: ``msprobe.lake.has_runs("./junk")`` -> ``False``."""
    from msprobe.backends import open_store
    from msprobe.lake._discover import discover_runs

    return bool(discover_runs(open_store(root, storage_options, read_only=True, create=False)))


def read_catalog(root: Any, storage_options: Any = None, lake_dir: Any = None,
                 lake_storage_options: Any = None) -> Any:
    """The persisted run catalog (a list of dicts) without opening the lake; None when absent.

    Example: ``msprobe.lake.read_catalog("./lake")`` -> ``[{"run": "run_npu", "steps": 2, ...}]``."""
    return _read(root, storage_options, lake_dir, lake_storage_options)
