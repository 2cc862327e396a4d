"""The editable list of wrapped APIs (support_wrap_ops.yaml) and the patcher that wraps them.

Wrapping is reversible: ``ApiPatcher.install(handler)`` replaces each listed
attribute with a thin wrapper; ``uninstall()`` puts the originals back. While
the handler runs, a thread-local flag sends nested API calls (those made by
the API itself, and those made by the dumper's own statistics) straight to the
originals, the guarantee TorchFunctionMode gives by popping the mode.
"""
from __future__ import annotations

import functools
import os
import threading
from typing import Callable, Optional

import torch

__all__ = ["load_api_list", "ApiPatcher", "GUARD", "NAMESPACES"]

_YAML = os.path.join(os.path.dirname(__file__), "support_wrap_ops.yaml")

GUARD = threading.local()


def load_api_list(path: Optional[str] = None) -> dict:
    """Parse the YAML subset we ship (``key:`` then ``  - name`` lines); no PyYAML needed."""
    out: dict = {}
    key = None
    with open(path or _YAML, encoding="utf-8") as f:
        for line in f:
            s = line.split("#", 1)[0].rstrip()
            if not s:
                continue
            if not s.startswith(" ") and s.endswith(":") or s.endswith(": []"):
                key = s.split(":", 1)[0].strip()
                out[key] = []
            elif s.lstrip().startswith("- ") and key is not None:
                out[key].append(s.lstrip()[2:].strip())
    return out


def _namespaces() -> dict:
    import torch.nn.functional as F

    ns = {
        "functional": ("Functional", [F]),
        "tensor": ("Tensor", [torch.Tensor]),
        "torch": ("Torch", [torch]),
        "vf": ("VF", [torch._VF]),
    }
    try:
        import torch.distributed as dist

        if dist.is_available():
            ns["distributed"] = ("Distributed", [dist, dist.distributed_c10d])
    except Exception:
        pass
    from msprobe.dumpers.pytorch._npu import torch_npu_module

    torch_npu = torch_npu_module()
    if torch_npu is not None:  # its public operators: torch_npu.npu_* (torch.ops.npu.* underneath)
        ns["npu"] = ("NPU", [torch_npu])
    return ns


NAMESPACES = _namespaces


class ApiPatcher:
    def __init__(self, api_list: Optional[dict] = None, extra: Optional[dict] = None):
        self.api_list = api_list or load_api_list()
        self.extra = extra or {}
        self._saved: list = []

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(self, handler: Callable) -> None:
        """``handler(orig, api_key, args, kwargs)`` is called for each wrapped API call."""
        if self._saved:
            return
        for key, (prefix, targets) in NAMESPACES().items():
            for name in self.api_list.get(key, []):
                for target in targets:
                    orig = getattr(target, name, None)
                    if orig is None or getattr(orig, "__msprobe_wrapped__", False):
                        continue
                    self._wrap(target, name, orig, f"{prefix}.{name}", handler)
        for (_, name), (target, api_key) in self.extra.items():
            orig = getattr(target, name, None)
            if orig is not None and not getattr(orig, "__msprobe_wrapped__", False):
                self._wrap(target, name, orig, api_key, handler)

    def _wrap(self, target, name: str, orig, api_key: str, handler: Callable) -> None:
        guard = GUARD

        def wrapper(*args, **kwargs):
            if getattr(guard, "inside", False) or not guard.__dict__.get("on", True):
                return orig(*args, **kwargs)
            return handler(orig, api_key, args, kwargs)

        try:
            functools.update_wrapper(wrapper, orig)
        except (AttributeError, TypeError):
            pass
        wrapper.__msprobe_wrapped__ = True  # type: ignore[attr-defined]
        owned = not isinstance(target, type) or name in target.__dict__
        try:
            setattr(target, name, wrapper)
        except (AttributeError, TypeError):
            return
        self._saved.append((target, name, orig, owned))

    def uninstall(self) -> None:
        for target, name, orig, owned in reversed(self._saved):
            try:
                if owned:
                    setattr(target, name, orig)
                else:  # the attribute was inherited (TensorBase): remove our shadow
                    delattr(target, name)
            except (AttributeError, TypeError):
                pass
        self._saved = []
