"""The statistics are data of the format layer (docs/architecture.md, "Recipe: add a statistic").

Measured from the AST of every ``msprobe`` module outside ``msprobe/format/``: a string constant
(an f-string's literal parts included) that *is* a statistic's name in one of its spellings
(``"Max"``, ``"norm"``, ``"l2norm"``, ``"NPU max"``, ``"Bench l2norm"``, ``"Max diff"``,
``"npu_norm"``...) spells the list again. Every consumer reads ``msprobe.format.stats`` instead;
at most two modules may still spell one (a pandas or matplotlib argument that happens to be
the same word). The relative-error names are left out of the measure: tensor mode's
``MaxRelativeErr`` is a tensor metric, not the statistic.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests._ast_measure import listing, modules_with

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "msprobe"
FORMAT = PKG / "format"
DOC = ROOT / "docs" / "architecture.md"

#: the most modules outside msprobe/format/ that may spell a statistic's name (issue 42's figure)
MAX_SPELLING_MODULES = 2
#: the most files the recipe "add a statistic" may touch
MAX_RECIPE_FILES = 5

_SPELLING = re.compile(r"(?:npu[ _]|bench[ _])?(?:max|min|mean|norm|l2norm)(?: diff)?", re.IGNORECASE)


def spellings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string constant of ``source`` that spells a statistic's name."""
    return sorted((node.lineno, node.value) for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and _SPELLING.fullmatch(node.value.strip()))


def spelling_modules() -> dict[str, list[tuple[int, str]]]:
    return modules_with(spellings, outside=FORMAT)


def test_statistics_are_spelled_in_few_modules_outside_the_format_layer():
    found = spelling_modules()
    assert len(found) <= MAX_SPELLING_MODULES, (
        f"{len(found)} modules outside msprobe/format/ spell a statistic's name (at most "
        f"{MAX_SPELLING_MODULES}); read msprobe.format.stats (STATISTICS, STAT_KEYS, STAT_COLUMNS, CSV_*):\n"
        f"{listing(found)}")


def test_the_measure_sees_every_spelling():
    source = '''
x = {"Max": 1}
y = ["NPU max", "Bench l2norm", " Norm ", "npu_mean", "L2norm diff"]
z = f"shape {1} Norm {2}"
w = ("maximum", "Max_except_inf_nan", "MaxRelativeErr", "norm_rel", "the norm of x")
'''
    assert sorted(text for _, text in spellings(source)) == sorted(
        ["Max", "NPU max", "Bench l2norm", " Norm ", "npu_mean", "L2norm diff", " Norm "])


def test_the_table_gives_every_layer_its_names():
    from msprobe.compare._rows import COLUMNS
    from msprobe.format.stats import (
        CSV_BENCH,
        CSV_DIFF,
        CSV_RELATIVE,
        CSV_TARGET,
        STAT_COLUMNS,
        STAT_KEYS,
        STATISTICS,
        null_stats,
        stats_dict,
    )
    from msprobe.index.rows import TENSOR_COLUMNS, arrow_schema

    assert STAT_KEYS == ("Max", "Min", "Mean", "Norm") and STAT_COLUMNS == ("max", "min", "mean", "norm")
    assert list(null_stats()) == list(STAT_KEYS) and stats_dict(range(4)) == dict(zip(STAT_KEYS, range(4)))
    head = COLUMNS["statistics"][8:]
    assert head[:16] == [*CSV_DIFF, *CSV_RELATIVE, *CSV_TARGET, *CSV_BENCH]
    assert CSV_TARGET == ("NPU max", "NPU min", "NPU mean", "NPU l2norm")
    assert set(STAT_COLUMNS) <= set(TENSOR_COLUMNS) and set(STAT_COLUMNS) <= set(arrow_schema().names)
    # each statistic merges shards by its own rule (format.parallel.merge_shard_stats)
    merged = {s.key: s.merge([3.0, 4.0], [1, 3]) for s in STATISTICS}
    assert merged == {"Max": 4.0, "Min": 3.0, "Mean": 3.75, "Norm": 5.0}


def _recipe() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"^## Recipe: add a statistic\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, "docs/architecture.md has no section '## Recipe: add a statistic'"
    return match.group(1)


def test_the_recipe_names_at_most_five_real_files():
    recipe = _recipe()
    steps = re.findall(r"^\d+\. `([^`]+)`", recipe, re.MULTILINE)
    assert steps, "the recipe's steps start with the file they touch: 1. `msprobe/...`"
    assert len(set(steps)) <= MAX_RECIPE_FILES, steps
    for path in steps:
        assert (ROOT / path).is_file(), path
    assert steps[0] == "msprobe/format/stats.py"
