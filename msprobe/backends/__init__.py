"""Storage backends: the only part of msprobe-lake that touches storage.

One small :class:`Store` ABC with a local implementation (:class:`LocalStore`,
also for NFS-style shared directories) and an fsspec one
(:class:`FsspecStore`: s3, gcs, azure, memory, ...), opened by
:func:`open_store`. On top of it: :class:`BackgroundWriter` (bounded,
retrying background writes), :class:`Journal` / :func:`read_journal`
(append-only crash-safe logs), :func:`claim_run_dir` (many runs, one root)
and :func:`retry` (transient vs permanent errors).

Importing this package imports neither s3fs nor torch, pyarrow, zarr or dask.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from msprobe._lazy import lazy_names

if TYPE_CHECKING:
    from msprobe.backends._base import Store
    from msprobe.backends._fsspec import FsspecStore, mtime_of
    from msprobe.backends._journal import Journal, JournalTruncatedWarning, read_journal
    from msprobe.backends._keys import TEMP_MARKER, is_temp_name, validate_key, validate_prefix
    from msprobe.backends._local import LocalStore
    from msprobe.backends._open import bound_store, bounded_storage_options, open_store, redact_options, register_store
    from msprobe.backends._retry import (
        Breaker,
        RetryPolicy,
        StoreLike,
        classify_error,
        is_disk_full,
        is_transient,
        put_retrying,
        retry,
        translate_error,
    )
    from msprobe.backends._rundir import CLAIM_MARKER, claim_run_dir
    from msprobe.backends._where import join_location, local_path_of, shares_options, upload_files, url_path
    from msprobe.backends._writer import BackgroundWriter, Digested, WriterStats, append_log_line

#: each public name's submodule, imported on first use (msprobe._lazy)
__getattr__, __dir__ = lazy_names(__name__, {
    "_base": ("Store",),
    "_fsspec": ("FsspecStore", "mtime_of"),
    "_journal": ("Journal", "JournalTruncatedWarning", "read_journal"),
    "_keys": ("TEMP_MARKER", "is_temp_name", "validate_key", "validate_prefix"),
    "_local": ("LocalStore",),
    "_open": ("bound_store", "bounded_storage_options", "open_store", "redact_options", "register_store"),
    "_retry": ("Breaker", "RetryPolicy", "StoreLike", "classify_error", "is_disk_full", "is_transient", "put_retrying", "retry", "translate_error"),
    "_rundir": ("CLAIM_MARKER", "claim_run_dir"),
    "_where": ("join_location", "local_path_of", "shares_options", "upload_files", "url_path"),
    "_writer": ("BackgroundWriter", "Digested", "WriterStats", "append_log_line"),
})

__all__ = [
    "Store",
    "LocalStore",
    "FsspecStore",
    "mtime_of",
    "open_store",
    "register_store",
    # where a path or URL is (callers never read a scheme themselves)
    "local_path_of",
    "shares_options",
    "url_path",
    "join_location",
    "upload_files",
    "redact_options",
    "validate_key",
    "validate_prefix",
    "is_temp_name",
    "TEMP_MARKER",
    "BackgroundWriter",
    "Digested",
    "WriterStats",
    "append_log_line",
    "Journal",
    "JournalTruncatedWarning",
    "read_journal",
    "claim_run_dir",
    "CLAIM_MARKER",
    "RetryPolicy",
    "retry",
    "is_transient",
    "classify_error",
    "translate_error",
    "is_disk_full",
    # a writer whose every storage operation ends within a deadline (the dumper's session)
    "bound_store",
    "bounded_storage_options",
    "Breaker",
    "StoreLike",
    "put_retrying",
]
