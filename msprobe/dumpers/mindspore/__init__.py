"""The MindSpore dumper (imports mindspore; PyNative mode)."""
from msprobe.dumpers.mindspore._debugger import MsprobeInitStep, MsprobeStep, PrecisionDebugger, seed_all

__all__ = ["PrecisionDebugger", "seed_all", "MsprobeStep", "MsprobeInitStep"]
