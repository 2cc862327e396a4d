"""Test suites for msprobe's extension points, to run with pytest on your own implementation.

:class:`StoreTests`: every :class:`msprobe.backends.Store` must pass it (see
docs/architecture.md, "Recipe: add a storage backend"). :class:`AdapterTests`: every framework adapter must pass it
(docs/architecture.md, "Recipe: add a framework"). Needs pytest and numpy; ``import msprobe`` does
not import this package.
"""
from __future__ import annotations

from msprobe.testing._adapter import AdapterTests
from msprobe.testing._store import BAD_KEYS, StoreTests
from msprobe.testing._store_caps import StoreCapabilityTests

__all__ = ["AdapterTests", "StoreTests", "StoreCapabilityTests", "BAD_KEYS"]
