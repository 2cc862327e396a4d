"""Key validation as a property: a key that validates never leaves the store root."""
from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from msprobe.backends import LocalStore, validate_key
from msprobe.errors import UnsafePathError

segment = st.one_of(
    st.sampled_from(["..", ".", "", "a", "b.pt", "..a", "a..", "~", "C:", "\\", "\x00", "/"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=6),
)
keys = st.one_of(st.lists(segment, min_size=1, max_size=5).map("/".join), st.text(max_size=20))


@settings(max_examples=400, deadline=None)
@given(key=keys)
def test_valid_keys_stay_below_the_root(tmp_path_factory, key: str) -> None:
    root = str(tmp_path_factory.getbasetemp() / "keys-root")
    try:
        validate_key(key)
    except UnsafePathError:
        return
    path = LocalStore(root, create=False if os.path.isdir(root) else True).local_path(key)
    assert os.path.commonpath([os.path.realpath(root), os.path.realpath(path)]) == os.path.realpath(root)
    assert os.path.realpath(path) != os.path.realpath(root)
    assert ".." not in key.split("/") and "\\" not in key and "\x00" not in key
