"""The shared reversible API patcher (msprobe/dumpers/patcher.py) on plain Python objects: each
listed attribute goes through the handler, nested calls under the guard go straight to the
original, static methods stay static (``Tensor.from_numpy``), uninstall restores every attribute."""
from __future__ import annotations

import inspect
import threading
import types

from msprobe.dumpers.patcher import ApiPatcher


class Box:
    def double(self, x):
        return 2 * x

    @staticmethod
    def make(x):
        return [x]


def _patcher(mod):
    guard = threading.local()
    return ApiPatcher({"mod": ["triple"], "box": ["double", "make"]},
                      lambda: {"mod": ("Functional", [mod]), "box": ("Box", [Box])}, guard), guard


def test_wrap_call_and_restore():
    mod = types.SimpleNamespace(triple=lambda x: 3 * x)
    orig_triple, orig_make, orig_double = mod.triple, inspect.getattr_static(Box, "make"), Box.__dict__["double"]
    patcher, guard = _patcher(mod)
    calls = []

    def handler(orig, key, args, kwargs):
        calls.append(key)
        guard.inside = True  # what the dumpers do: nested API calls are not recorded
        try:
            return orig(*args, **kwargs)
        finally:
            guard.inside = False

    patcher.install(handler)
    try:
        assert isinstance(inspect.getattr_static(Box, "make"), staticmethod)
        assert mod.triple(2) == 6 and Box().double(4) == 8
        assert Box.make(1) == [1] and Box().make(5) == [5]  # static through the class and an instance
        assert calls == ["Functional.triple", "Box.double", "Box.make", "Box.make"]
        guard.on = False  # every wrapper passes through
        assert Box.make(2) == [2] and calls[-1] == "Box.make" and len(calls) == 4
    finally:
        patcher.uninstall()
    assert mod.triple is orig_triple
    assert inspect.getattr_static(Box, "make") is orig_make
    assert Box.__dict__["double"] is orig_double
    assert not patcher.installed


def test_a_newer_install_takes_over_from_a_patcher_never_uninstalled():
    """A dumper dropped without close() left its wrappers in place: the next dumper's install saw them
    as already wrapped and skipped them, so it never saw a call (its step 'recorded nothing')."""
    mod = types.SimpleNamespace(triple=lambda x: 3 * x)
    orig_triple = mod.triple
    guard = threading.local()
    spec = ({"mod": ["triple"]}, lambda: {"mod": ("Functional", [mod])}, guard)
    old, new = ApiPatcher(*spec), ApiPatcher(*spec)
    seen: list = []
    old.install(lambda orig, key, a, k: seen.append(("old", key)) or orig(*a, **k))
    new.install(lambda orig, key, a, k: seen.append(("new", key)) or orig(*a, **k))
    assert mod.triple(2) == 6 and seen == [("new", "Functional.triple")]
    old.uninstall()  # the dropped one, closed late: the newer wrappers stay
    assert mod.triple(1) == 3 and seen[-1] == ("new", "Functional.triple")
    new.uninstall()
    assert mod.triple is orig_triple
