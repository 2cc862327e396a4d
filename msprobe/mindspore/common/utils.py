"""``from msprobe.mindspore.common.utils import MsprobeStep`` as the docs write it."""
from msprobe.dumpers.mindspore import MsprobeStep

__all__ = ["MsprobeStep"]
