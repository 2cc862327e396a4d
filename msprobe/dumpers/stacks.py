"""The call stack of a record: captured cheaply at the call (the user's frames, the package's
own left out), rendered into stack.json's lines at publish."""
from __future__ import annotations

import linecache
import os
import types
from sys import _getframe  # CPython's frames: the cheap way to the caller's stack
from typing import Optional

__all__ = ["capture_stack", "render_stack", "walk_stack"]

_PKG_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)
#: the C fast path's capture_stack (None: not looked up yet; False: not there, MSPROBE_LAKE_NATIVE=0)
_NATIVE: list = [None]


def capture_stack() -> tuple:
    """(filename, lineno, function) of the user frames, innermost first; code lines are read at publish
    (the C fast path's walk when it is there, the same frames: :func:`walk_stack`)."""
    native = _NATIVE[0]
    if native is None:
        from msprobe.dumpers.fastpath import native as load

        mod = load()
        native = _NATIVE[0] = getattr(mod, "capture_stack", False) if mod is not None else False
    if native:
        return native(2, _PKG_DIRS)  # (from this frame's caller's caller, as _getframe(2) here)
    return walk_stack(_getframe(2))


def walk_stack(frame: Optional[types.FrameType]) -> tuple:
    """The user frames from ``frame`` outwards: those of this package's files and of ``<string>`` left out."""
    frames = []
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PKG_DIRS) and filename != "<string>":
            frames.append((filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(frames)


#: frames tuple -> its rendered lines: a call site's stack is rendered once per process, not twice a step
#: (its journal line and stack.json); the code lines are linecache's, read once per file as before
_RENDERED: dict = {}
_RENDERED_MAX = 4096


def render_stack(frames: tuple) -> list:
    """stack.json's lines of ``frames`` (a new list each call: the caller may keep it)."""
    done = _RENDERED.get(frames)
    if done is None:
        if len(_RENDERED) >= _RENDERED_MAX:
            _RENDERED.clear()
        done = _RENDERED[frames] = tuple(
            f"File {filename}, line {lineno}, in {func}, \n {linecache.getline(filename, lineno).strip()}"
            for filename, lineno, func in frames)
    return list(done)
