"""Links to the explorer's views, and the running ``msprobe view`` servers other commands can name.

A view's link is the server's URL with a fragment naming the view (the page's format, docs/explorer.md
"Links"): ``#view=record&run=&step=&rank=&record=&row=``. The fragment is the same in a report
(``report.html#view=…``).

``msprobe view`` registers itself while it serves: one file per server, ``<port>.json`` (its URL with
the access token, its process id, the paths it shows), in a directory only this user can read
(``$MSPROBE_VIEW_REGISTRY``, or ``msprobe-view`` under ``$XDG_RUNTIME_DIR`` or ``~/.cache``); the file
is removed when the server stops, and a file whose process is gone is skipped and removed. A command
that answers with a place (``compare``'s origin and first divergence, ``lake nan``'s origins) asks
:func:`link_to` for the link of a server showing its input, and prints it when there is one.

Standard library only: importing this module imports nothing heavy.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional
from urllib.parse import urlencode

from msprobe.backends import local_path_of

__all__ = ["fragment", "register", "unregister", "servers", "link_to"]


def fragment(view: str = "record", *, run: Any = None, step: Any = None, rank: Any = None, record: Any = None,
             row: Any = None) -> str:
    """``#view=…`` naming a view of the explorer (values left out match any cell)."""
    pairs = [("view", view)]
    for key, value in (("run", run), ("step", step), ("rank", rank), ("record", record), ("row", row)):
        if value is not None and value != "":
            pairs.append((key, str(value)))
    return "#" + urlencode(pairs)


def _registry() -> str:
    given = os.environ.get("MSPROBE_VIEW_REGISTRY")
    if given:
        return given
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "msprobe-view")


def _key(path: Any) -> Optional[str]:
    """A local path as a comparable key (a URL such as ``s3://…`` as given, without a trailing slash)."""
    if not path:
        return None
    text = str(path)
    local = local_path_of(text)
    return text.rstrip("/") if local is None else os.path.realpath(local)


def register(url: str, paths: Iterable[Any]) -> Optional[str]:
    """Record a running server (``url``: its URL with the token); the file's path, None when the
    registry cannot be written (the server serves all the same)."""
    folder = _registry()
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        port = url.split("/")[2].rsplit(":", 1)[-1]  # the server's own http://host:port/...
        path = os.path.join(folder, f"{port}.json")
        tmp = f"{path}.{os.getpid()}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"url": url, "pid": os.getpid(), "paths": [k for k in map(_key, paths) if k]}, handle)
        os.replace(tmp, path)
        return path
    except OSError:
        return None


def unregister(path: Optional[str]) -> None:
    if path:
        try:
            os.remove(path)
        except OSError:
            pass


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


def servers() -> list:
    """The registered servers whose process still runs: ``[{url, pid, paths}]``."""
    folder = _registry()
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as handle:
                entry = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and _alive(entry.get("pid")):
            out.append(entry)
        elif isinstance(entry, dict):
            unregister(path)  # its server is gone
    return out


def link_to(paths: Iterable[Any], frag: str) -> Optional[str]:
    """The link to the view ``frag`` on a running server that shows one of ``paths`` (a dump, a
    lake root or one of its runs), or None."""
    wanted = {k for k in map(_key, paths) if k}
    for entry in servers():
        if wanted & set(entry.get("paths") or ()):
            return str(entry["url"]) + frag
    return None
