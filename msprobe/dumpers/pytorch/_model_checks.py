"""What ``start(model=...)`` says about a model before dumping it: APIs captured before the wrappers
went in (a warning), a ``torch.compile``d model (refused), FSDP2 modules (a warning)."""
from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from msprobe.errors import ConfigError

__all__ = ["warn_captured_apis", "refuse_compiled", "warn_fsdp2"]


def warn_captured_apis(model: Any, patcher: Any, checked: set) -> None:
    """Warn (once per model) about module attributes holding an API as it was before the wrappers
    went in (a model built before ``PrecisionDebugger(...)``: ``self.act = F.gelu``, a
    ``functools.partial`` of it): those calls cannot be recorded."""
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    todo = [root for root in models if isinstance(root, torch.nn.Module) and id(root) not in checked]
    if not todo or not patcher.installed:
        return
    checked.update(id(root) for root in todo)
    originals = patcher.originals()
    found = []
    for root in todo:
        for path, sub in root.named_modules():
            for attr, value in vars(sub).items():
                func = value.func if isinstance(value, functools.partial) else value
                key = originals.get(id(func)) if callable(func) else None
                if key is not None:
                    found.append(f"{path + '.' if path else ''}{attr} ({key})")
    if found:
        warnings.warn(f"msprobe: {len(found)} module attribute(s) hold an API captured before PrecisionDebugger "
                      f"was created, whose calls are not dumped: {', '.join(found[:5])}"
                      f"{', ...' if len(found) > 5 else ''}; create the debugger before the model",
                      stacklevel=4)


def refuse_compiled(model: Any) -> None:
    """A ``torch.compile``d model runs graphs the API wrappers and hooks cannot see into (TorchDynamo
    traces them, and fails on the dumper's reads): refused with a ConfigError before anything runs."""
    for m in model if isinstance(model, (list, tuple)) else [model]:
        if type(m).__name__ == "OptimizedModule" and hasattr(m, "_orig_mod"):
            raise ConfigError("start(model=...) got a torch.compile'd model: msprobe dumps eager execution; "
                              "pass and call the model itself (model._orig_mod), without torch.compile, "
                              "while dumping")


def warn_fsdp2(model: Any, seen: set) -> None:
    """FSDP2 (``fully_shard``) is not what 26.2.0 or we dump faithfully: said once per model, never a
    silent partial dump (spec/PRODUCER.md §20 item 42)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return
    for m in model if isinstance(model, (list, tuple)) else [model]:
        key = ("fsdp2", id(m))
        if not isinstance(m, torch.nn.Module) or key in seen:
            continue
        seen.add(key)
        if any(isinstance(sub, FSDPModule) for sub in m.modules()):
            warnings.warn("msprobe: start(model=...) got FSDP2 (fully_shard) modules: their parameters are written "
                          "as the gathered full tensors (as 26.2.0 does), but their parameters_grad records hold "
                          "this rank's unreduced gradients under another name, and FSDP2's own split/view_as calls "
                          "around its all-gather are recorded (spec/PRODUCER.md section 20 item 42)",
                          RuntimeWarning, stacklevel=3)
