"""Where a path or URL is: the questions callers would otherwise answer by reading its scheme.

Only :mod:`msprobe.backends` reads a location's text (``open_store`` picks the store by it);
the rest of msprobe asks here, so a protocol registered with :func:`register_store` is the
store's everywhere, never mistaken for a local path or a remote one by a string test.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from msprobe.backends._open import _REGISTERED, open_store, protocol_of

__all__ = ["local_path_of", "shares_options", "url_path", "join_location", "upload_files"]

_LOCAL_PROTOCOLS = {"", "file", "local"}


def _text(location: Any) -> str:
    return os.fspath(location) if not isinstance(location, str) else location


def local_path_of(location: Any) -> Optional[str]:
    """The file-system path a plain path or a ``file://`` / ``local://`` URL names; ``None`` for
    anything :func:`open_store` opens as another store (a remote URL, a chained fsspec URL, a
    protocol registered with :func:`register_store`): callers then go through that store."""
    text = _text(location)
    protocol = protocol_of(text)
    if protocol not in _LOCAL_PROTOCOLS or protocol in _REGISTERED:
        return None
    return text.split("://", 1)[1] if protocol else text


def shares_options(location: Any, other: Any) -> bool:
    """Whether the storage options given for ``other`` apply to ``location`` too: both are
    opened by the same kind of store through options (the same protocol, not a local path,
    which takes none)."""
    first, second = protocol_of(_text(location)), protocol_of(_text(other))
    return first == second and local_path_of(location) is None


def url_path(location: Any) -> str:
    """The path part of a location: ``s3://bucket/a/run1`` -> ``bucket/a/run1``, a plain path
    as it is (no trailing slash either way): the names of the directories it goes through."""
    text = _text(location)
    return (text.split("://", 1)[1] if "://" in text else text).rstrip("/")


def join_location(base: Any, name: str) -> str:
    """``name`` below ``base``: a path joined by the file system's rules for a local base, else
    a ``/``-joined URL."""
    text = _text(base)
    if local_path_of(text) is not None and "://" not in text:
        return os.path.join(text, name)
    return f"{text.rstrip('/')}/{name}"


def upload_files(location: str, local_dir: str, names: list, storage_options: Optional[Mapping[str, Any]]) -> list:
    """Publish the files ``names`` of the local directory ``local_dir`` into the store at
    ``location`` (each atomically, streamed); their locations there."""
    store = open_store(location, storage_options)
    out = []
    for name in names:
        with open(os.path.join(local_dir, name), "rb") as handle:
            store.put_stream(name, handle)
        out.append(join_location(location, name))
    return out
