"""MindSpore dumper features beyond the fixtures (runs in the MindSpore venv, see ms_venv.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest


def test_package_imports_under_numpy_1():
    import importlib

    assert np.__version__ < "2"
    for mod in ("msprobe", "msprobe.format", "msprobe.backends", "msprobe.readers", "msprobe.dumpers.session",
                "msprobe.compare", "msprobe.cli", "msprobe.mindspore", "msprobe.mindspore.common.utils"):
        importlib.import_module(mod)
    from msprobe.mindspore import MsprobeStep, PrecisionDebugger, seed_all  # noqa: F401
    from msprobe.mindspore.common.utils import MsprobeStep as Step2

    assert Step2 is MsprobeStep
