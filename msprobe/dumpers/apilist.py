"""The editable API lists (``support_wrap_ops.yaml``) shared by the framework dumpers.

The file is YAML read with PyYAML's safe loader, so any valid spelling works (block or
flow lists, quoted names, comments, an empty or ``null`` namespace); what is valid YAML
but not a list of API names (a number, a nested mapping) is refused with a
:class:`~msprobe.errors.ConfigError` naming the file and the namespace.
"""
from __future__ import annotations

from msprobe.errors import ConfigError

__all__ = ["load_api_list"]


def load_api_list(path: str) -> dict:
    """{namespace: [API name, ...]} from the YAML file at ``path``."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # safe; C when built
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the API list {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of namespace -> list of API names, "
                          f"got a {type(data).__name__}")
    out: dict = {}
    for key, names in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"{path}: namespace {key!r} is not a name")
        if names is None:
            names = []
        elif isinstance(names, str):
            names = [names]
        if not isinstance(names, list):
            raise ConfigError(f"{path}: {key}: expected a list of API names, got a {type(names).__name__}")
        for n in names:
            if not isinstance(n, str) or not n:
                raise ConfigError(f"{path}: {key}: {n!r} is not an API name (a non-empty string)")
        out[key] = list(names)
    return out
