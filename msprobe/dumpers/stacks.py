"""The call stack of a record: captured cheaply at the call (the user's frames, the package's
own left out), rendered into stack.json's lines at publish."""
from __future__ import annotations

import linecache
import os
import types
from sys import _getframe  # CPython's frames: the cheap way to the caller's stack
from typing import Optional

__all__ = ["capture_stack", "render_stack"]

_PKG_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)


def capture_stack() -> tuple:
    """(filename, lineno, function) of the user frames, innermost first; code lines are read at publish."""
    frame: Optional[types.FrameType] = _getframe(2)
    frames = []
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PKG_DIRS) and filename != "<string>":
            frames.append((filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(frames)


def render_stack(frames: tuple) -> list:
    return [f"File {filename}, line {lineno}, in {func}, \n {linecache.getline(filename, lineno).strip()}"
            for filename, lineno, func in frames]
