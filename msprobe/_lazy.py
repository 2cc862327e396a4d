"""A package's public names imported on first use (PEP 562's module ``__getattr__``).

A package ``__init__`` lists, per submodule, the names it re-exports; importing the package
imports none of them, and the first ``package.name`` (or ``from package import name``) imports
that submodule alone. A command then pays only for the modules its path takes (``msprobe
compare`` of two local dumps loads neither fsspec's store nor the index writer, the
journal or the tensor store). The names are typed for mypy under ``TYPE_CHECKING`` in the
package itself.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping, Sequence


def lazy_names(package: str, names: Mapping[str, Sequence[str]]) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """(``__getattr__``, ``__dir__``) for ``package`` whose ``names[submodule]`` are that
    submodule's public names (``submodule`` relative: ``"_api"``, ``"index"``; or a module of another
    package, named in full: ``"msprobe.index.rows"``)."""
    where = {name: sub for sub, listed in names.items() for name in listed}

    def __getattr__(name: str) -> Any:
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = sub if sub.startswith("msprobe.") else f"{package}.{sub}"
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # the next access is a plain attribute
        return value

    def __dir__() -> list:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
