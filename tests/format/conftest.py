"""Fixtures of the format tests."""
from __future__ import annotations

import json

import pytest
from _fmt_support import SCHEMA_FILES, SPEC


@pytest.fixture(scope="session")
def schema_validators():
    """doc kind -> a Draft 2020-12 validator with every spec schema registered (for $ref)."""
    jsonschema = pytest.importorskip("jsonschema")
    from referencing import Registry, Resource

    schemas = {k: json.loads((SPEC / "schemas" / f).read_text()) for k, f in SCHEMA_FILES.items()}
    registry = Registry().with_resources([(s["$id"], Resource.from_contents(s)) for s in schemas.values()])
    return {k: jsonschema.Draft202012Validator(s, registry=registry) for k, s in schemas.items()}
