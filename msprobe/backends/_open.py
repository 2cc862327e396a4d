"""open_store: the one URL factory of msprobe-lake."""
from __future__ import annotations

import inspect
import os
import re
from typing import Any, Callable, Mapping

from msprobe.backends._base import Store
from msprobe.backends._local import LocalStore
from msprobe.errors import ConfigError, MissingDependencyError, StorageNotFoundError

__all__ = ["open_store", "redact_options", "bound_store", "bounded_storage_options"]

#: protocol -> the msprobe-lake extra that installs its fsspec implementation
EXTRAS = {
    "s3": "s3", "s3a": "s3",
    "gs": "gcs", "gcs": "gcs",
    "az": "azure", "abfs": "azure", "abfss": "azure", "adl": "azure",
}
_LOCAL_PROTOCOLS = {"file", "local"}
_FSSPEC_BASE_OPTIONS = {
    "skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths",
    "asynchronous", "loop", "batch_size",
}
#: options a file system takes through ``**kwargs`` and passes on (s3fs: to AioSession)
_PASSTHROUGH = {
    "s3": {"profile", "session_vars", "event_hooks", "include_builtin_handlers"},
    "s3a": {"profile", "session_vars", "event_hooks", "include_builtin_handlers"},
}
_SECRET_KEY_RE = re.compile(
    r"key|secret|token|passw|credential|auth|signature|sas|session|private|cert|connection_string|account_key",
    re.IGNORECASE,
)
_NOT_SECRET = {"endpoint_url", "region_name", "use_ssl", "requester_pays", "anon", "key_prefix"}
_USERINFO_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@]*@")


def redact_options(options: Any) -> Any:
    """A copy of ``options`` with the values of secret-looking keys replaced by '***'."""
    if isinstance(options, Mapping):
        return {
            key: ("***" if isinstance(key, str) and _SECRET_KEY_RE.search(key) and key not in _NOT_SECRET
                else redact_options(value))
            for key, value in options.items()
        }
    if isinstance(options, (list, tuple)):
        return type(options)(redact_options(value) for value in options)
    return options


def _secret_values(options: Any) -> list[str]:
    """Every string value of a secret-looking key, at any depth (for scrubbing messages)."""
    found: list[str] = []
    if isinstance(options, Mapping):
        for key, value in options.items():
            if (isinstance(key, str) and _SECRET_KEY_RE.search(key) and key not in _NOT_SECRET
                    and isinstance(value, str)):
                found.append(value)
            else:
                found.extend(_secret_values(value))
    elif isinstance(options, (list, tuple)):
        for value in options:
            found.extend(_secret_values(value))
    return found


def _strip_userinfo(url: str) -> str:
    return _USERINFO_RE.sub(r"\1", url)


def _missing_dependency(protocol: str, exc: BaseException | None = None) -> MissingDependencyError:
    extra = EXTRAS.get(protocol)
    if extra:
        return MissingDependencyError(
            f"the {protocol}:// protocol needs an optional dependency: pip install 'msprobe-lake[{extra}]'"
        )
    if exc is not None:  # fsspec knows the protocol; its package is missing
        return MissingDependencyError(f"the {protocol}:// protocol needs a package that is not installed: {exc}")
    known = ", ".join(f"{known_protocol}:// (pip install 'msprobe-lake[{e}]')" for known_protocol, e in EXTRAS.items()
                      if known_protocol in {"s3", "gs", "az"})
    return MissingDependencyError(
        f"no storage backend for the {protocol!r} protocol; supported: local paths, file://, memory://, {known}, "
        "and any other protocol that fsspec knows once its package is installed"
    )


def _check_options(cls: type, protocol: str, options: Mapping[str, Any]) -> None:
    """Reject storage options the file system class would silently ignore."""
    try:
        # __init__'s own parameters: fsspec's caching metaclass hides them from signature(cls)
        params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    except (TypeError, ValueError):
        return
    if protocol not in _PASSTHROUGH and any(param.kind is param.VAR_KEYWORD for param in params.values()):
        return  # this class forwards unknown options somewhere we cannot check
    accepted = {option for option, param in params.items()
                if param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL)} - {"self"}
    accepted |= _PASSTHROUGH.get(protocol, set())
    unknown = sorted(key for key in options if key not in accepted and key not in _FSSPEC_BASE_OPTIONS)
    if unknown:
        raise ConfigError(
            f"unknown storage_options for {protocol}://: {unknown}; accepted: {sorted(accepted | _FSSPEC_BASE_OPTIONS)}"
        )


#: protocol -> opener of the stores registered with :func:`register_store`
_REGISTERED: dict[str, Callable[..., Store]] = {}


def register_store(protocol: str, opener: Callable[..., Store]) -> None:
    """Open ``protocol://...`` URLs with ``opener(url, storage_options, read_only=, create=)``
    (a backend that is neither a local directory nor an fsspec file system); everything that
    takes a dump path or a lake root then accepts such URLs."""
    _REGISTERED[protocol.lower()] = opener


def open_store(
    url_or_path: str | os.PathLike[str] | Store,
    storage_options: Mapping[str, Any] | None = None,
    *,
    read_only: bool = False,
    create: bool = True,
) -> Store:
    """Open the store at ``url_or_path``.

    Accepted inputs:

    * a plain path (relative or absolute, ``str`` or ``os.PathLike``) or a
      ``file://`` URL: a :class:`LocalStore` (also right for NFS-style shared
      directories). ``create=True`` creates the directory unless ``read_only``;
      a missing directory otherwise raises :class:`StorageNotFoundError`.
      ``storage_options`` are rejected (:class:`ConfigError`).
    * ``memory://name``: the process-wide fsspec memory file system (tests).
    * ``s3://bucket/prefix`` (needs ``msprobe-lake[s3]``), ``gs://`` / ``gcs://``
      (``[gcs]``), ``az://`` / ``abfs://`` (``[azure]``), or any other fsspec
      URL, chained ones included: an :class:`FsspecStore` made by
      ``fsspec.url_to_fs(url, **storage_options)``. Options the file system
      does not accept raise :class:`ConfigError`; a protocol whose package is
      missing, or that fsspec does not know, raises
      :class:`MissingDependencyError` naming the ``pip install``.
      ``create=False`` requires the prefix to exist already (hold an object).
    * a protocol registered with :func:`register_store`: its opener's store.
    * a :class:`Store`: returned as is (``storage_options`` must be empty).

    Errors and ``repr`` never show storage options; secret values (keys,
    tokens, passwords, credentials) are scrubbed from error messages.
    """
    options = dict(storage_options or {})
    if isinstance(url_or_path, Store):
        if options:
            raise ConfigError(f"storage_options {sorted(options)} given with an already opened store")
        return url_or_path
    url = os.fspath(url_or_path)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"a store location must be a non-empty path or URL, got {url_or_path!r}")
    protocol = protocol_of(url)
    if protocol in _REGISTERED:
        return _REGISTERED[protocol](url, options, read_only=read_only, create=create)
    if protocol == "" or protocol in _LOCAL_PROTOCOLS:
        if options:
            raise ConfigError(
                f"storage_options {sorted(options)} are not used for the local path {_strip_userinfo(url)}; "
                "remove them or use a remote URL (s3://, gs://, ...)"
            )
        path = url.split("://", 1)[1] if protocol else url
        return LocalStore(path, read_only=read_only, create=create)
    return _open_fsspec(url, protocol, options, read_only=read_only, create=create)


def protocol_of(url: str) -> str:
    """The protocol that picks the store of ``url`` (lower case): ``""`` for a plain path, the
    first of a chained fsspec URL's (``simplecache::s3://...``: ``simplecache``)."""
    head = url.split("::", 1)[0]
    if "://" in head:
        return head.split("://", 1)[0].lower()
    return head.lower() if "::" in url else ""


def _open_fsspec(url: str, protocol: str, options: dict[str, Any], *, read_only: bool, create: bool) -> Store:
    import fsspec
    from fsspec.registry import get_filesystem_class, known_implementations, registry

    if protocol not in known_implementations and protocol not in registry:
        raise _missing_dependency(protocol)
    secrets = _secret_values(options)
    clean_url = _strip_userinfo(url)

    def scrub(text: str) -> str:
        for s in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
            text = text.replace(s, "***")
        return text

    try:
        cls = get_filesystem_class(protocol)
    except ImportError as exc:
        raise _missing_dependency(protocol, exc) from None
    except ValueError:
        raise _missing_dependency(protocol) from None
    if "::" not in url:
        _check_options(cls, protocol, options)
    try:
        fs, path = fsspec.url_to_fs(url, **options)
    except ImportError as exc:
        raise _missing_dependency(protocol, exc) from None
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"invalid storage_options for {protocol}:// ({type(exc).__name__}: {scrub(str(exc))}); "
            f"given keys: {sorted(options)}"
        ) from None
    from msprobe.backends._fsspec import FsspecStore  # its retries and logging: only for a URL

    store = FsspecStore(fs, path, read_only=read_only, url=clean_url.split("?", 1)[0], secrets=secrets)
    if not create and not store.list_dir(""):
        raise StorageNotFoundError(f"store {store.url} does not exist or is empty (create=False)")
    return store


def bounded_storage_options(url: str, storage_options: Mapping[str, Any] | None, deadline: float) -> dict[str, Any] | None:
    """``storage_options`` for a writer whose every operation must end within ``deadline``
    seconds: for s3:// the client's own connect/read timeouts are capped at the deadline and
    its own retries turned off (the caller's :class:`RetryPolicy` retries, within the
    deadline), so retries no longer stack. Other protocols are returned unchanged."""
    if storage_options is None and not isinstance(url, str):
        return None
    head = str(url).split("::", 1)[0]
    protocol = head.split("://", 1)[0].lower() if "://" in head else ""
    if protocol not in ("s3", "s3a"):
        return dict(storage_options) if storage_options is not None else None
    options = dict(storage_options or {})
    config = dict(options.get("config_kwargs") or {})
    limit = max(1.0, float(deadline))
    config["connect_timeout"] = min(float(config.get("connect_timeout", 5)), limit)
    config["read_timeout"] = min(float(config.get("read_timeout", 20)), limit)
    config["retries"] = {"total_max_attempts": 1, "mode": "standard"}
    options["config_kwargs"] = config
    options.setdefault("skip_instance_cache", True)  # a private instance: its retries are set below
    return options


def bound_store(store: Store, deadline: float | None = None, breaker: Any = None) -> Store:
    """The store of a deadline-bounded writer (see :func:`bounded_storage_options`): an s3fs
    file system makes one attempt per request (s3fs otherwise retries some errors 5 times);
    calls made outside a retrying operation are limited to ``deadline`` and obey ``breaker``."""
    from msprobe.backends._fsspec import FsspecStore

    if isinstance(store, FsspecStore):
        store.op_timeout, store.breaker = deadline, breaker
    fs = getattr(store, "fs", None)
    if fs is not None and getattr(fs, "retries", None) is not None and _protocol_of(fs) in ("s3", "s3a"):
        fs.retries = 1
    return store


def _protocol_of(fs: Any) -> str:
    proto = getattr(fs, "protocol", "")
    return proto if isinstance(proto, str) else (proto[0] if proto else "")
