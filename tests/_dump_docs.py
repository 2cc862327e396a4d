"""The dump.json documents of the tests' fixtures, parsed (for tests that hold two implementations
equal on every one of them)."""
from __future__ import annotations

import glob
import os
from typing import Iterator

from msprobe.format.fastjson import loads_json_bytes

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
DOCS = sorted(glob.glob(os.path.join(FIXTURES, "**", "dump.json"), recursive=True))


def fixture_data() -> Iterator[tuple]:
    """(path, the document's ``data`` object) of every fixture dump.json whose ``data`` is an object."""
    assert len(DOCS) > 20, "the fixtures' dump.json documents are missing"
    for path in DOCS:
        with open(path, "rb") as handle:
            doc = loads_json_bytes(handle.read())
        data = doc.get("data") if isinstance(doc, dict) else None
        if isinstance(data, dict):
            yield path, data
