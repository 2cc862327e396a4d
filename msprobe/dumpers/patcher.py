"""The reversible API patcher shared by the framework dumpers.

``ApiPatcher.install(handler)`` replaces each listed attribute with a thin wrapper
calling ``handler(orig, api_key, args, kwargs)``; ``uninstall()`` puts the originals
back. While the handler runs, the framework's thread-local ``guard`` (``guard.inside``)
sends nested API calls (those the API makes itself, and the dumper's own statistics)
straight to the originals; ``guard.on = False`` turns every wrapper into a pass-through.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

__all__ = ["ApiPatcher"]

#: id(guard) -> the patcher whose wrappers are installed now, per framework (its guard): a newer
#: install takes the APIs over from one never uninstalled (a dumper dropped without close()), whose
#: wrappers would otherwise stay in place and keep every later dumper from seeing a call
_ACTIVE: dict = {}


class ApiPatcher:
    """``namespaces()`` -> {yaml key: (record prefix, [objects whose attributes are wrapped])}."""

    def __init__(self, api_list: dict, namespaces: Callable[[], dict], guard, extra: Optional[dict] = None):
        self.api_list = api_list
        self.namespaces = namespaces
        self.guard = guard
        self.extra = extra or {}
        self._saved: list = []
        self._handler: Optional[Callable] = None
        # (id(original), api key) -> its wrapper: a function reached through two modules
        # (``dist.isend`` and ``distributed_c10d.isend``) gets one wrapper, so identity checks
        # such as ``P2POp``'s ``op in [isend, irecv]`` still hold
        self._made: dict = {}

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(self, handler: Callable) -> None:
        """``handler(orig, api_key, args, kwargs)`` is called for each wrapped API call."""
        if self._saved:
            return
        previous = _ACTIVE.get(id(self.guard))
        if previous is not None and previous is not self:
            previous.uninstall()
        _ACTIVE[id(self.guard)] = self
        self._handler = handler
        for key, (prefix, targets) in self.namespaces().items():
            for name in self.api_list.get(key, []):
                # a dotted name (``linalg.vector_norm``) is the attribute of a submodule; its record
                # takes the last part (``Torch.vector_norm``), as msprobe names it
                sub, _, attr = name.rpartition(".")
                for target in targets:
                    owner = getattr(target, sub, None) if sub else target
                    if (id(owner), attr) in self.extra:  # a custom API (register_custom_api) takes its place
                        continue
                    orig = getattr(owner, attr, None) if owner is not None else None
                    if orig is None or not callable(orig) or getattr(orig, "__msprobe_wrapped__", False):
                        continue
                    self._wrap(owner, attr, orig, f"{prefix}.{attr}", handler)
        for (_, name), (target, api_key) in self.extra.items():
            orig = getattr(target, name, None)
            if orig is not None and not getattr(orig, "__msprobe_wrapped__", False):
                self._wrap(target, name, orig, api_key, handler)

    def originals(self) -> dict:
        """id(original function) -> its record prefix and name (``Functional.gelu``), of the APIs wrapped now."""
        out = {}
        for target, name, orig, _ in self._saved:
            fn = orig.__func__ if isinstance(orig, staticmethod) else orig
            out[id(fn)] = getattr(getattr(target, name, None), "__msprobe_key__", name)
        return out

    def _wrap(self, target, name: str, orig, api_key: str, handler: Callable) -> None:
        made = self._made.get((id(orig), api_key))
        wrapper = made[1] if made is not None and made[0] is orig and made[2] is handler else \
            self._new_wrapper(orig, api_key, handler)
        owned = not isinstance(target, type) or name in target.__dict__
        new_attr: Any  # the wrapper, or a staticmethod of it
        if owned and isinstance(target, type) and isinstance(target.__dict__[name], staticmethod):
            orig_attr, new_attr = target.__dict__[name], staticmethod(wrapper)  # Tensor.from_numpy
        else:
            orig_attr, new_attr = orig, wrapper
        try:
            setattr(target, name, new_attr)
        except (AttributeError, TypeError):
            return
        self._saved.append((target, name, orig_attr, owned))

    def _new_wrapper(self, orig, api_key: str, handler: Callable) -> Callable:
        guard = self.guard

        def wrapper(*args, **kwargs):
            state = guard.__dict__  # (this thread's: one look-up of the thread-local guard)
            if state.get("inside", False) or not state.get("on", True):
                return orig(*args, **kwargs)
            return handler(orig, api_key, args, kwargs)

        try:
            functools.update_wrapper(wrapper, orig)
        except (AttributeError, TypeError):
            pass
        wrapper.__msprobe_wrapped__ = True  # type: ignore[attr-defined]
        wrapper.__msprobe_key__ = api_key  # type: ignore[attr-defined]
        self._made[(id(orig), api_key)] = (orig, wrapper, handler)
        return wrapper

    def _listed_key(self, target, name: str) -> Optional[str]:
        for key, (prefix, targets) in self.namespaces().items():
            if name in self.api_list.get(key, []) and any(t is target for t in targets):
                return f"{prefix}.{name}"
        return None

    def _unwrap(self, target, name: str) -> None:
        for i, (t, n, orig, owned) in enumerate(self._saved):
            if t is target and n == name:
                if owned:
                    setattr(target, name, orig)
                else:
                    delattr(target, name)
                del self._saved[i]
                return

    def set_custom(self, target, name: str, api_key: str) -> None:
        """register_custom_api: ``target.name`` is recorded as ``api_key`` (instead of its listed name)."""
        self.extra[(id(target), name)] = (target, api_key)
        if self._saved and self._handler is not None:  # installed (install sets the handler first)
            self._unwrap(target, name)
            self._wrap(target, name, getattr(target, name), api_key, self._handler)

    def drop_custom(self, target, name: str) -> None:
        """restore_custom_api: ``target.name`` is the original again, or its listed wrapper when listed."""
        self.extra.pop((id(target), name), None)
        self._unwrap(target, name)
        key = self._listed_key(target, name) if self._saved else None
        if key is not None and self._handler is not None:
            self._wrap(target, name, getattr(target, name), key, self._handler)

    def uninstall(self) -> None:
        if _ACTIVE.get(id(self.guard)) is self:
            del _ACTIVE[id(self.guard)]
        self._made.clear()
        for target, name, orig, owned in reversed(self._saved):
            try:
                if owned:
                    setattr(target, name, orig)
                else:  # the attribute was inherited (a base class): remove our shadow
                    delattr(target, name)
            except (AttributeError, TypeError):
                pass
        self._saved = []
