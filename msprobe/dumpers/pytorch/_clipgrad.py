"""The pseudo-modules of the optimizer's calls: ``optimizer`` (set by the optimizer step hooks) and
``clip_grad`` (gradient clipping functions wrapped while the dump is on), as msprobe 26 scopes them."""
from __future__ import annotations

import functools
from typing import Any

__all__ = ["clip_grad_functions", "ClipGradPatch"]


def clip_grad_functions() -> list:
    """(owner, attribute) of the gradient clipping functions 26.2.0 scopes as 'clip_grad': those of
    ``torch.nn.utils`` (a call through a name imported before the debugger is not seen, as in 26.2.0)
    and Megatron's, where it is installed."""
    import torch.nn.utils as utils

    found = [(utils, name) for name in ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_")
             if callable(getattr(utils, name, None))]
    try:
        from megatron.core.optimizer import MegatronOptimizer
    except Exception:  # noqa: BLE001 - absent, or failing to import: nothing to scope
        return found
    if callable(getattr(MegatronOptimizer, "clip_grad_norm", None)):
        found.append((MegatronOptimizer, "clip_grad_norm"))
    return found


class ClipGradPatch:
    """One gradient clipping function replaced by a wrapper that puts its calls under the
    pseudo-module 'clip_grad' while the dump is on; ``remove()`` puts the function back (unless
    someone replaced it since)."""

    def __init__(self, core_ref: Any, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name
        self.original = original = getattr(owner, name)

        @functools.wraps(original)
        def clip_grad(*args: Any, **kwargs: Any) -> Any:
            core = core_ref()
            if core is None or not core.is_on():
                return original(*args, **kwargs)
            core.enter_module("clip_grad")  # the calls map to the pseudo-module "clip_grad" in construct.json
            try:
                return original(*args, **kwargs)
            finally:
                core.leave_module("clip_grad")

        self.wrapper = clip_grad
        setattr(owner, name, clip_grad)

    def remove(self) -> None:
        if getattr(self.owner, self.name, None) is self.wrapper:
            setattr(self.owner, self.name, self.original)
