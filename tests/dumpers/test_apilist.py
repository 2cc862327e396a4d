"""support_wrap_ops.yaml is read as YAML (PyYAML): any valid spelling of a list of API names
works; what is not a list of names is refused with a one-line ConfigError."""
from __future__ import annotations

import pytest

from msprobe.dumpers.apilist import load_api_list
from msprobe.errors import ConfigError


def _write(tmp_path, text: str) -> str:
    p = tmp_path / "support_wrap_ops.yaml"
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_every_valid_spelling_is_read(tmp_path):
    path = _write(tmp_path, "\n".join([
        "# a comment",
        "functional: [linear, relu]   # a flow list",
        "tensor:",
        '  - "__mul__"',
        "  - '__add__'",
        "  - add  # trailing comment",
        "torch: []",
        "vf:",
        "distributed: all_reduce",
        "'mint.nn.functional':",
        "- gelu",
        "",
    ]))
    assert load_api_list(path) == {
        "functional": ["linear", "relu"], "tensor": ["__mul__", "__add__", "add"], "torch": [], "vf": [],
        "distributed": ["all_reduce"], "mint.nn.functional": ["gelu"],
    }


def test_the_shipped_lists_load():
    import os

    import msprobe.dumpers

    base = os.path.dirname(msprobe.dumpers.__file__)
    pt = load_api_list(os.path.join(base, "pytorch", "support_wrap_ops.yaml"))
    ms = load_api_list(os.path.join(base, "mindspore", "support_wrap_ops.yaml"))
    assert "linear" in pt["functional"] and "__mul__" in pt["tensor"]
    assert all(isinstance(n, str) and n for names in (*pt.values(), *ms.values()) for n in names)
    assert ms["ops"]


@pytest.mark.parametrize("text, match", [
    ("functional:\n  - linear\n  - 3\n", r"functional: 3 is not an API name"),
    ("functional:\n  linear: 1\n", r"functional: expected a list of API names, got a dict"),
    ("- linear\n", r"expected a mapping of namespace"),
    ("functional: [linear\n", r"not valid YAML \(line \d+, column \d+\)"),
    ("functional:\n  - ''\n", r"'' is not an API name"),
])
def test_what_is_not_a_list_of_names_is_refused(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match) as exc:
        load_api_list(_write(tmp_path, text))
    assert "\n" not in str(exc.value)


def test_an_empty_file_is_an_empty_list(tmp_path):
    assert load_api_list(_write(tmp_path, "# nothing wrapped\n")) == {}
