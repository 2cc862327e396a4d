"""Result and metric rules against the real tool (26.2.0) on crafted statistics dumps.

``tests/fixtures/real/compare_outputs/result_rule/make_dumps.py`` writes the dumps (rebuilt here
from the same code); the CSV beside it is what ``msprobe compare`` 26.2.0 wrote for them. The rules
were derived from that output: the output-vs-input Norm rule (largest output relative Norm error
> 10x the largest input one, floor 0.01, first output row marked), scalar-argument errors, ``inf``
relative errors against a zero bench, ``Diff`` for bools and strings, no warning from the size of
a statistic's relative error alone."""
from __future__ import annotations

import csv
import glob
import importlib.util
import os

from test_compare_real import _check

from msprobe.compare import compare

HERE = os.path.dirname(os.path.abspath(__file__))
RULE = os.path.join(os.path.dirname(HERE), "fixtures", "real", "compare_outputs", "result_rule")


def _make(root: str) -> None:
    spec = importlib.util.spec_from_file_location("make_rule_dumps", os.path.join(RULE, "make_dumps.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(root)


def test_result_rules_match_real_tool(tmp_path):
    _make(str(tmp_path))
    s = compare(str(tmp_path / "target" / "step0"), str(tmp_path / "bench" / "step0"), str(tmp_path / "out"),
                plot=False, progress=False)
    (real,) = glob.glob(os.path.join(RULE, "compare_result_*.csv"))
    ours = s["pairs"][0]["files"][0]
    _check(ours, real, "statistics")
    with open(real, encoding="utf-8") as f:
        rows = {r["NPU Name"]: r for r in csv.DictReader(f)}
    # the fixture holds the cases the rules were derived from
    assert rows["Functional.second_output.0.forward.output.0"]["Result"] == "warning"
    assert rows["Functional.mean_or_max.0.forward.output.0"]["Result"] == "pass"
    assert rows["Functional.zero_out_0_09.0.forward.output.0"]["Result"] == "pass"
    assert rows["Functional.zero_out_0_11.0.forward.output.0"]["Result"] == "warning"
    assert rows["Functional.big_rel_norm.0.forward.output.0"]["Result"] == "pass"
    assert rows["Functional.scalars.0.forward.input.1"]["Result"] == "error"
    # module parameters count as inputs, and their rows come before the outputs
    assert rows["Module.pm.Linear.forward.0.output.0"]["Result"] == "pass"
    assert list(rows).index("Module.pm.Linear.forward.0.parameters.bias") < \
        list(rows).index("Module.pm.Linear.forward.0.output.0")
    assert s["pairs"][0]["results"] == {"pass": 115, "warning": 18, "error": 6}
