"""The PyTorch dumper (imports torch; torch_npu only when it is installed and used)."""
from msprobe.dumpers.pytorch._debugger import PrecisionDebugger, module_dump, module_dump_end, seed_all
from msprobe.dumpers.pytorch._npu import npu_available

__all__ = ["PrecisionDebugger", "seed_all", "module_dump", "module_dump_end", "npu_available"]
