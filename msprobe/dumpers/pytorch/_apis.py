"""The editable list of wrapped APIs (support_wrap_ops.yaml) and the patcher that wraps them.

Wrapping is reversible: ``ApiPatcher.install(handler)`` replaces each listed
attribute with a thin wrapper; ``uninstall()`` puts the originals back. While
the handler runs, a thread-local flag sends nested API calls (those made by
the API itself, and those made by the dumper's own statistics) straight to the
originals, the guarantee TorchFunctionMode gives by popping the mode.
"""
from __future__ import annotations

import os
import threading
from typing import Optional

import torch

from msprobe.dumpers.apilist import load_api_list as _load_api_list
from msprobe.dumpers.patcher import ApiPatcher as _ApiPatcher
from msprobe.dumpers.pytorch._npu import torch_npu_module

__all__ = ["load_api_list", "ApiPatcher", "GUARD", "NAMESPACES"]

_YAML = os.path.join(os.path.dirname(__file__), "support_wrap_ops.yaml")

GUARD = threading.local()


def load_api_list(path: Optional[str] = None) -> dict:
    """The wrapped-API list (``support_wrap_ops.yaml`` next to this module unless ``path``)."""
    return _load_api_list(path or _YAML)


def _namespaces() -> dict:
    import torch.nn.functional as F
    from torch import _VF as variable_functions  # torch functions not exported at the top

    ns = {
        "functional": ("Functional", [F]),
        "tensor": ("Tensor", [torch.Tensor]),
        "torch": ("Torch", [torch]),
        "vf": ("VF", [variable_functions]),
    }
    try:
        import torch.distributed as dist

        if dist.is_available():
            ns["distributed"] = ("Distributed", [dist, dist.distributed_c10d])
    except Exception:  # noqa: BLE001 - torch.distributed unusable here: its APIs are not wrapped
        pass

    torch_npu = torch_npu_module()
    if torch_npu is not None:  # its public operators: torch_npu.npu_* (torch.ops.npu.* underneath)
        ns["npu"] = ("NPU", [torch_npu])
    return ns


NAMESPACES = _namespaces


class ApiPatcher(_ApiPatcher):
    def __init__(self, api_list: Optional[dict] = None, extra: Optional[dict] = None):
        super().__init__(api_list or load_api_list(), NAMESPACES, GUARD, extra)
