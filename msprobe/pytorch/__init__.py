"""Drop-in import path of msprobe's PyTorch API: ``from msprobe.pytorch import PrecisionDebugger``."""
from msprobe.dumpers.pytorch import PrecisionDebugger, module_dump, module_dump_end, seed_all

__all__ = ["PrecisionDebugger", "seed_all", "module_dump", "module_dump_end"]
