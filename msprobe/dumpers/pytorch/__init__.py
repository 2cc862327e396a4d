"""The PyTorch dumper (imports torch; torch_npu only when it is installed and used)."""
from typing import Any

from msprobe.dumpers.pytorch._debugger import PrecisionDebugger, module_dump, module_dump_end, seed_all
from msprobe.dumpers.pytorch._npu import npu_available

__all__ = ["PrecisionDebugger", "seed_all", "module_dump", "module_dump_end", "npu_available", "tensor_bytes"]


def __getattr__(name: str) -> Any:
    """``tensor_bytes`` (a tensor's raw bytes, convert's encoder) imports torch on first use: the
    MindSpore dumper builds on this package's debugger in a venv without torch."""
    if name == "tensor_bytes":
        from msprobe.dumpers.pytorch._encode import tensor_bytes

        return tensor_bytes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
