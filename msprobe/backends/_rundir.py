"""claim_run_dir: many runs, one dump root, no silent overwrite."""
from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import uuid
from typing import TYPE_CHECKING, Any, Mapping

from msprobe.backends._keys import validate_key
from msprobe.backends._retry import RetryPolicy, put_retrying
from msprobe.errors import ConfigError, StoragePermissionError

if TYPE_CHECKING:
    from msprobe.backends._base import Store

__all__ = ["claim_run_dir", "CLAIM_MARKER", "CLAIM_POLICIES"]

#: The object whose exclusive creation claims a run directory.
CLAIM_MARKER = ".msprobe-run.json"
CLAIM_POLICIES = ("refuse", "new")


def claim_run_dir(
    store: "Store",
    name: str,
    policy: str = "refuse",
    *,
    max_siblings: int = 10_000,
    info: Mapping[str, Any] | None = None,
    retry_policy: RetryPolicy | None = None,
) -> str:
    """Claim the directory ``name`` of ``store`` for one run and return the claimed name.

    A directory is free when it holds nothing (or does not exist). It is
    claimed by the exclusive creation of ``<name>/.msprobe-run.json`` (host,
    pid, time, a random token and ``info``), which works on local and shared
    directories (``os.link``) and on object stores (``If-None-Match``), so of
    several runs racing for one name exactly one wins.

    ``policy='refuse'``: if ``name`` is taken (claimed, or holds anything),
    raise :class:`StoragePermissionError` naming it. ``policy='new'``: claim
    the first free sibling of ``name``, ``.1``, ``.2``, ... and return it.
    """
    if policy not in CLAIM_POLICIES:
        raise ConfigError(f"claim_run_dir policy={policy!r} is not valid; valid values: {list(CLAIM_POLICIES)}")
    name = validate_key(name.rstrip("/"))
    store.check_writable()
    body = json.dumps(
        {
            "token": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            **dict(info or {}),
        },
        sort_keys=True,
    ).encode()
    policy_obj = retry_policy or RetryPolicy()
    for n in range(max_siblings + 1):
        candidate = name if n == 0 else f"{name}.{n}"
        if _try_claim(store, candidate, body, policy_obj):
            return candidate
        if policy == "refuse":
            raise StoragePermissionError(
                f"dump root {store.url.rstrip('/')}/{candidate} already holds another run; "
                "refusing to overwrite it (choose another path, or policy='new' to use a fresh sibling)"
            )
    raise StoragePermissionError(f"no free sibling of {store.url.rstrip('/')}/{name} among {max_siblings}")


def _try_claim(store: "Store", directory: str, body: bytes, policy: RetryPolicy) -> bool:
    if store.list_dir(directory):
        return False
    marker = f"{directory}/{CLAIM_MARKER}"
    try:
        put_retrying(store, marker, body, overwrite=False, policy=policy)
    except StoragePermissionError:
        if store.exists(marker):
            return False  # another run won the race
        raise  # a real refusal (403, read-only), not a taken name
    return True
