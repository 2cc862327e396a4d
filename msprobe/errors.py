"""The error hierarchy of msprobe-lake.

Every error the package raises on purpose derives from :class:`MsprobeError`
(itself a ``ValueError``), and each subtype also inherits the built-in that
matches its meaning, so callers can catch either.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Optional, TypeVar

__all__ = [
    "MsprobeError",
    "FormatError",
    "NameFormatError",
    "DocumentError",
    "UnknownDialectError",
    "UnsafePathError",
    "ConfigError",
    "StorageError",
    "StorageNotFoundError",
    "StoragePermissionError",
    "StorageTransientError",
    "MissingDependencyError",
    "TensorLoadError",
    "RecordNotFoundError",
    "invalid_value",
    "read_json_object",
]


class MsprobeError(ValueError):
    """Root of every error raised by msprobe-lake."""


class FormatError(MsprobeError):
    """Something does not follow the dump format.

    ``file`` and ``location`` (a JSON path such as ``$.data["Torch.add.0.forward"]``)
    say where, when known.
    """

    def __init__(self, message: str, *, file: str | None = None, location: str | None = None):
        self.message = message
        self.file = file
        self.location = location
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.file:
            where = str(self.file)
        if self.location:
            where = f"{where}:{self.location}" if where else self.location
        return f"{where}: {self.message}" if where else self.message


class NameFormatError(FormatError):
    """A record or data name does not follow the naming grammar."""


class DocumentError(FormatError):
    """A JSON document (dump.json, stack.json, construct.json, ...) is malformed."""


class UnknownDialectError(FormatError):
    """The layout or document does not match any dialect we know."""


#: an error that is an OSError too (its ``__new__`` is OSError's)
_OSE = TypeVar("_OSE", bound=OSError)


class UnsafePathError(FormatError, PermissionError):
    """A name would escape its directory (``..``, absolute path, separator, symlink)."""

    def __new__(cls: type[_OSE], *args: Any, **kwargs: Any) -> _OSE:
        """OSError's, as construction uses (see :meth:`StorageError.__new__`)."""
        return OSError.__new__(cls, *args)


class ConfigError(MsprobeError):
    """An invalid configuration value; the message names key, value and valid values."""


class StorageError(MsprobeError, OSError):
    """A storage operation failed."""

    def __new__(cls: type[_OSE], *args: Any, **kwargs: Any) -> _OSE:
        """OSError's, as construction uses. Without it ``cls.__new__`` resolves to ValueError's,
        which refuses this layout: unpickling through tblib (as Dask sends a task's error back)
        failed, and the client got a bare Exception."""
        return OSError.__new__(cls, *args)


class StorageNotFoundError(StorageError, FileNotFoundError):
    """The key, file or bucket does not exist."""


class StoragePermissionError(StorageError, PermissionError):
    """Permanent refusal by the storage (403, read-only store, would overwrite)."""


class StorageTransientError(StorageError):
    """A failure worth retrying (timeout, 5xx, throttling, connection reset)."""


class MissingDependencyError(MsprobeError, ImportError):
    """An optional dependency is missing; the message names the pip install that fixes it."""


class TensorLoadError(MsprobeError):
    """A tensor file is missing, truncated, unsafe or does not match its record."""


class RecordNotFoundError(MsprobeError, KeyError):
    """No record of that name in the dump."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def require(module: str, extra: str):
    """Import an optional dependency or raise MissingDependencyError naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{module} is required for this feature: pip install 'msprobe-lake[{extra}]'"
        ) from exc


def invalid_value(key: str, value: Any, valid: Any) -> ConfigError:
    """The one-line error of a configuration key with a bad value: it names the key, the value
    and what is valid (every config reader raises this shape)."""
    return ConfigError(f"invalid config value {key}={value!r}; valid: {valid}")


#: a configuration file larger than this is refused before it is read (they are a few KiB)
MAX_CONFIG_BYTES = 16 << 20


def read_json_object(path: str, what: str, *, preprocess: Optional[Callable[[str], str]] = None) -> dict:
    """The JSON object in the file ``path`` (config.json, compare.json...); ``what`` names it in
    errors (``"config_path"``, ``"-config"``, ``"-i"``). ``preprocess`` edits the text before it
    is parsed (compare.json's ``#`` comments). :class:`ConfigError` in one line when the file is
    missing, unreadable, larger than :data:`MAX_CONFIG_BYTES`, not UTF-8 JSON, or not an object."""
    where = f"{what} {str(path)!r}"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a directory, not a file") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_CONFIG_BYTES >> 20} MiB; not a configuration file")
    try:
        text = raw.decode("utf-8-sig")
        obj = json.loads(preprocess(text) if preprocess is not None else text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: the top level must be a JSON object, not {type(obj).__name__}")
    return obj
