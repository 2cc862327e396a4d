"""Drop-in import path of msprobe's MindSpore API: ``from msprobe.mindspore import PrecisionDebugger``."""
from msprobe.dumpers.mindspore import MsprobeInitStep, MsprobeStep, PrecisionDebugger, seed_all

__all__ = ["PrecisionDebugger", "seed_all", "MsprobeStep", "MsprobeInitStep"]
