"""Key validation: every key a store sees is a safe, '/'-separated relative path."""
from __future__ import annotations

import re

from msprobe.errors import UnsafePathError
from msprobe.format.layout import join_key  # the one key joiner; re-exported here for the stores

__all__ = ["validate_key", "validate_prefix", "join_key", "TEMP_MARKER", "is_temp_name"]

#: Infix of the temporary files that atomic local writes create next to their target.
TEMP_MARKER = ".msprobe-tmp-"
_TEMP_RE = re.compile(r"^\..*\.msprobe-tmp-[0-9a-f]{32}$")
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def is_temp_name(name: str) -> bool:
    """True for the name of an in-progress atomic write (never listed)."""
    return _TEMP_RE.match(name) is not None


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise :class:`UnsafePathError`.

    A key is a non-empty '/'-separated relative path with no empty, ``.`` or ``..``
    segment, no backslash, no NUL and no drive letter.
    """
    if not isinstance(key, str):
        raise UnsafePathError(f"a key must be a str, got {type(key).__name__}")
    if key == "":
        raise UnsafePathError("empty key")
    if "\x00" in key:
        raise UnsafePathError("NUL byte in key", file=key.replace("\x00", "\\0"))
    if "\\" in key:
        raise UnsafePathError("backslash in key (use '/')", file=key)
    if key.startswith("/") or _DRIVE_RE.match(key):
        raise UnsafePathError("absolute key (keys are relative to the store root)", file=key)
    for segment in key.split("/"):
        if segment == "":
            raise UnsafePathError("empty path segment in key", file=key)
        if segment in (".", ".."):
            raise UnsafePathError(f"'{segment}' segment in key", file=key)
    return key


def validate_prefix(prefix: str) -> str:
    """Validate a listing prefix: '' (the root) or a key, a trailing '/' allowed.

    Returns the prefix without its trailing '/'.
    """
    if not isinstance(prefix, str):
        raise UnsafePathError(f"a prefix must be a str, got {type(prefix).__name__}")
    stripped = prefix[:-1] if prefix.endswith("/") else prefix
    if stripped == "":
        if prefix == "/":
            raise UnsafePathError("absolute prefix '/' (use '' for the root)")
        return ""
    return validate_key(stripped)


