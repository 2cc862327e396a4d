"""torch_npu (Ascend) support, imported only when torch_npu is: NPU operators, seeds, kernel dump.

Nothing here imports torch_npu at module import time. ``torch_npu_module()`` returns the module when
it is already imported or importable (an installed torch_npu that fails to import, e.g. without the
CANN libraries, counts as absent), else None.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Optional

__all__ = ["torch_npu_module", "npu_available", "set_npu_seeds"]

_CACHE: dict = {}


def torch_npu_module() -> Optional[Any]:
    mod = sys.modules.get("torch_npu")
    if mod is not None:
        return mod
    if "absent" in _CACHE:
        return None
    try:
        if importlib.util.find_spec("torch_npu") is None:
            _CACHE["absent"] = True
            return None
        return importlib.import_module("torch_npu")
    except Exception:  # noqa: BLE001 - installed but unusable (no CANN): as if absent
        _CACHE["absent"] = True
        return None


def npu_available() -> bool:
    """True when torch_npu is importable and reports a usable NPU (``torch.npu.is_available()``)."""
    mod = torch_npu_module()
    if mod is None:
        return False
    try:
        return bool(mod.npu.is_available())
    except Exception:  # noqa: BLE001 - torch_npu without a usable device: as if absent
        return False


def set_npu_seeds(seed: int, mode: bool) -> bool:
    """Seed every NPU and, with ``mode``, make LCCL collectives deterministic (seed_all sets
    HCCL_DETERMINISTIC itself); False without torch_npu."""
    mod = torch_npu_module()
    if mod is None:
        return False
    import os

    npu = mod.npu
    npu.manual_seed(seed)
    npu.manual_seed_all(seed)
    if mode:
        os.environ["LCCL_DETERMINISTIC"] = "1"  # deterministic communication operators
    return True
