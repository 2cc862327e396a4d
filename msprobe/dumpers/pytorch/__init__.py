"""The PyTorch dumper (imports torch)."""
from msprobe.dumpers.pytorch._debugger import PrecisionDebugger, module_dump, module_dump_end, seed_all

__all__ = ["PrecisionDebugger", "seed_all", "module_dump", "module_dump_end"]
