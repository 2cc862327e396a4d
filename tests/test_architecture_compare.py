"""compare's engine is split along its four jobs (issue 42): the plan, the frame, the metric kernels
and the float text each live in a module of their own, and ``_columnar.py`` only drives the blocks.
Read from the AST: which module defines each job's names at top level."""
from __future__ import annotations

import ast
from pathlib import Path

COMPARE = Path(__file__).resolve().parents[1] / "msprobe" / "compare"

#: each job's module and the names that make it
JOBS = {
    "_plan.py": {"PairContext", "Leaves", "Plan", "plan_rows", "bench_counterpart", "load_side"},
    "_frame.py": {"Frame"},
    "_kernels.py": {"KERNELS", "METRIC_COUNT", "statistics_kernel", "md5_kernel", "tensor_kernel"},
    "_floattext.py": {"number_columns", "_reprs", "_percents", "_texts", "_float_writer"},
}
#: the driver's size bound (it held all four jobs in 959 lines before the split)
DRIVER_MAX_LINES = 300


def defined(path: Path) -> set:
    """The names a module defines at top level (functions, classes, assignments)."""
    out = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return out


def test_each_job_lives_in_its_module():
    for module, names in JOBS.items():
        missing = names - defined(COMPARE / module)
        assert not missing, f"{module} does not define {sorted(missing)}"


def test_the_driver_defines_none_of_the_jobs():
    driver = COMPARE / "_columnar.py"
    held = defined(driver) & set().union(*JOBS.values())
    assert not held, f"_columnar.py defines {sorted(held)} (it imports them from their modules)"
    assert len(driver.read_text(encoding="utf-8").splitlines()) <= DRIVER_MAX_LINES
    assert "columnar_pair" in defined(driver)


def test_no_job_module_is_defined_twice():
    seen: dict = {}
    for module in list(JOBS) + ["_columnar.py"]:
        for name in defined(COMPARE / module):
            if not name.startswith("__"):
                assert name not in seen or name in {"_NA", "_STATISTICS"}, \
                    f"{name} defined in {seen.get(name)} and {module}"
                seen[name] = module
