"""The MindSpore API list (support_wrap_ops.yaml) and its patcher.

Listed attributes of ``mindspore.ops`` (record prefix ``Functional``), ``mindspore.Tensor``
(``Tensor``), ``mindspore.mint`` (``Mint``), ``mindspore.mint.nn.functional``
(``MintFunctional``), ``mindspore.communication.comm_func`` (``Distributed``) and
``mindspore.mint.distributed`` (``MintDistributed``) are wrapped.
"""
from __future__ import annotations

import os
import threading
from typing import Optional

from msprobe.dumpers.apilist import load_api_list as _load_api_list
from msprobe.dumpers.patcher import ApiPatcher as _ApiPatcher

__all__ = ["load_api_list", "ApiPatcher", "GUARD", "namespaces", "import_first"]

_YAML = os.path.join(os.path.dirname(__file__), "support_wrap_ops.yaml")

GUARD = threading.local()


def import_first(*candidates: tuple):
    """The first ``(module, attribute)`` of ``candidates`` that imports (MindSpore moves its
    internals between releases), else None."""
    import importlib

    for module, attr in candidates:
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    return None


PIJIT_CONTEXT = (("mindspore.graph._utils.pijit_context", "PIJitCaptureContext"),
                 ("mindspore.common._pijit_context", "PIJitCaptureContext"))


def load_api_list(path: Optional[str] = None) -> dict:
    return _load_api_list(path or _YAML)


def namespaces() -> dict:
    """YAML key -> (record prefix, [objects whose attributes are wrapped])."""
    import mindspore
    from mindspore import mint, ops

    ns = {"ops": ("Functional", [ops]), "tensor": ("Tensor", [mindspore.Tensor]), "mint": ("Mint", [mint])}
    optional = (("mint.nn.functional", "MintFunctional", "mindspore.mint.nn.functional"),
                ("communication.comm_func", "Distributed", "mindspore.communication.comm_func"),
                ("mint.distributed", "MintDistributed", "mindspore.mint.distributed"))
    import importlib

    for key, prefix, modname in optional:
        try:
            ns[key] = (prefix, [importlib.import_module(modname)])
        except ImportError:
            pass
    return ns


class ApiPatcher(_ApiPatcher):
    def __init__(self, api_list: Optional[dict] = None, extra: Optional[dict] = None):
        super().__init__(api_list or load_api_list(), namespaces, GUARD, extra)
