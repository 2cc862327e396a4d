"""The record entry of a numpy array argument or output, shared by the framework encoders."""
from __future__ import annotations

from typing import Any

__all__ = ["ndarray_entry", "is_ndarray"]


def is_ndarray(value: Any) -> bool:
    """True for a numpy array, without importing numpy for the values that are not one."""
    if type(value).__module__ != "numpy":
        return False
    import numpy as np

    return isinstance(value, np.ndarray)


def ndarray_entry(a: Any) -> dict:
    """A numpy array (``Tensor.numpy()``'s output, ``Tensor.from_numpy``'s input): numpy's dtype name
    and numpy's own max/min/mean/2-norm in the array's dtype (as 26.2.0 writes them); never saved
    as a file."""
    import numpy as np

    from msprobe.format.stats import null_stats, stats_dict

    entry: dict = {"type": "numpy.ndarray", "dtype": str(a.dtype), "shape": list(a.shape), **null_stats()}
    if a.size and a.dtype.kind in "biuf":
        entry.update(stats_dict((a.max().item(), a.min().item(), a.mean().item(), np.linalg.norm(a.ravel()).item())))
    return entry
