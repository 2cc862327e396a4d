"""spec/FORMAT.md quotes the code: the regular expressions and constants it states are the
ones msprobe/format uses."""
from __future__ import annotations

import re

import pytest
from _fmt_support import SPEC

from msprobe.format import dialects, layout, naming
from msprobe.format.documents import MAX_JSON_DEPTH
from msprobe.format.model import TENSOR_TYPES

TEXT = (SPEC / "FORMAT.md").read_text(encoding="utf-8")
PRODUCER = (SPEC / "PRODUCER.md").read_text(encoding="utf-8")


def _spec_form(pattern: str) -> str:
    return pattern.replace(naming._SEG, "SEG").replace(naming._IDENT, "IDENT")


@pytest.mark.parametrize("name", ["API_NAME_RE", "MODULE_NAME_RE", "PARAMS_GRAD_NAME_RE", "DEBUG_NAME_RE",
                                  "DATA_NAME_RE"])
def test_naming_regex_is_quoted(name):
    assert _spec_form(getattr(naming, name).pattern) in TEXT, f"FORMAT.md does not quote {name}"


@pytest.mark.parametrize("name", ["STEP_DIR_RE", "RANK_DIR_RE"])
def test_layout_regex_is_quoted(name):
    assert getattr(layout, name).pattern in TEXT


def test_segment_and_identifier_are_defined():
    assert f"`{naming._SEG}`" in TEXT and f"`{naming._IDENT}`" in TEXT


def test_constants_are_stated():
    assert f"**{naming.MAX_FILE_NAME_LENGTH}**" in TEXT
    assert f"deeper than {MAX_JSON_DEPTH} levels" in TEXT
    assert f"version\n**{layout.FORMAT_VERSION}**" in TEXT or f"**{layout.FORMAT_VERSION}**" in TEXT
    for t in TENSOR_TYPES:
        assert f"`{t}`" in TEXT
    for prefix in naming.PYTORCH_API_PREFIXES + naming.MINDSPORE_API_PREFIXES:
        assert f"`{prefix}`" in TEXT


def test_every_dialect_is_in_the_table():
    row = re.search(r"^\| topic \|(.+)\|$", TEXT, re.M)
    assert row
    for name in dialects.DIALECTS:
        assert f"`{name}`" in row.group(1)


def test_deliberate_differences_section_is_marked_for_extension():
    assert "<!-- BEGIN deliberate-differences" in PRODUCER and "<!-- END deliberate-differences -->" in PRODUCER
