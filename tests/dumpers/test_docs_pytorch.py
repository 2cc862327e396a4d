"""The PyTorch dump docs as tests: every code example of the seeds' 05.data_dump_PyTorch.md (and
the 8.1.1 docs 05, 02.config_introduction.md, 28.debugger_save_instruction.md it links to) and
every config key/value they document, run as the docs write them (tests/dumpers/docs/
pt_examples.py, in a subprocess of its own, so that atexit and the one-debugger-per-process rule
are the real ones), with the records each must produce.

The expected record lists were checked against the real mindstudio-probe 26.2.0 running the same
script and config (``risk_level: ALL``); ``test_expected_records_are_the_real_tools`` runs it again
for the cases it can run. Where the docs (or 8.1.1) and 26.2.0 differ, the case says which §20
item of spec/FORMAT.md lists the difference. ``Torch.randn`` (called by the examples inside the
dump window) is left out of the comparison: which creation ops are wrapped is the API lists'
business (issue 18 item 10), not these semantics.
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "dumpers", "docs", "pt_examples.py")

# --- building blocks of the expected records (the docs' ModuleOP: linear_1, linear_2, relu) ----
LIN = ["Functional.linear.0.forward", "Functional.linear.1.forward", "Functional.relu.0.forward"]
BWD = ["Functional.relu.0.backward", "Functional.linear.1.backward", "Functional.linear.0.backward"]
CE_F, CE_B = ["Functional.cross_entropy.0.forward"], ["Functional.cross_entropy.0.backward"]
SUM = ["Tensor.sum.0.forward", "Tensor.sum.0.backward"]
OPT = [f"Tensor.add_.{i}.forward" for i in range(4)]  # SGD's step on the 4 parameters
M1F, M2F = "Module.linear_1.Linear.forward.0", "Module.linear_2.Linear.forward.0"
M1B, M2B = "Module.linear_1.Linear.backward.0", "Module.linear_2.Linear.backward.0"
P1, P2 = "Module.linear_1.Linear.parameters_grad", "Module.linear_2.Linear.parameters_grad"
MIX_FWD = ["Functional.linear.0.forward", M1F, "Functional.linear.1.forward", M2F, "Functional.relu.0.forward"]
MIX_BWD = ["Functional.relu.0.backward", "Functional.linear.1.backward", P2, M2B, M1B, "Functional.linear.0.backward", P1]
L0 = [M1F, M2F, P2, M2B, M1B, P1]
STEP_L1 = LIN + CE_F + CE_B + BWD + OPT  # config_run: one training step at L1

BASE = {"task": "statistics", "dump_path": "./dump_path", "rank": [], "step": [], "level": "L1",
        "risk_level": "ALL"}  # risk_level: a 26.x key (ALL: every wrapped API), ignored by ours


def cfg(**kw) -> dict:
    c = dict(BASE)
    section = kw.pop("section", None)
    c.update(kw)
    if section is not None:
        c[c["task"]] = section
    return c


# id: (example, config or None, env, expected {step: records}, real 26.2.0 comparison: True or why not)
CASES = {
    # 快速上手 (8.1.1): PrecisionDebugger() with no config, start(model), stop(), no step()
    "quick_start": ("quick_start", None, {}, {0: LIN + SUM + BWD}, True),
    "quick_start_config": ("quick_start", cfg(), {}, {0: LIN + SUM + BWD}, True),
    # 2.1 采集完整的前反向数据, at each documented level
    "full_L1": ("full_forward_backward", cfg(), {}, {0: LIN + CE_F + CE_B + BWD, 1: LIN + CE_F + CE_B + BWD}, True),
    "full_mix": ("full_forward_backward", cfg(level="mix"), {},
                 {0: MIX_FWD + CE_F + CE_B + MIX_BWD, 1: MIX_FWD + CE_F + CE_B + MIX_BWD}, True),
    "full_L0": ("full_forward_backward", cfg(level="L0"), {}, {0: L0, 1: L0}, True),
    # 1.3 stop: before loss.backward() with step() after it -> forward and backward of the window
    "stop_before_backward_L1": ("stop_before_backward", cfg(), {}, {0: LIN + BWD, 1: LIN + BWD}, True),
    "stop_before_backward_mix": ("stop_before_backward", cfg(level="mix"), {},
                                 {0: MIX_FWD + MIX_BWD, 1: MIX_FWD + MIX_BWD},
                                 "26.2.0 drops the modules' backward records (§20, 'stop() before the backward')"),
    # 2.2 forward_backward_dump_end(): the same as stop
    "forward_backward_dump_end": ("forward_backward_dump_end", cfg(), {}, {0: LIN + BWD, 1: LIN + BWD},
                                  "26.2.0 removed forward_backward_dump_end (§20, 'forward_backward_dump_end()')"),
    # 2.3 module_dump / module_dump_end
    "module_dump": ("module_dump", cfg(), {},
                    {0: ["Tensor.__mul__.0.forward", "Module.MyModuleOP.ModuleOP.forward.0"] + SUM
                     + ["Module.MyModuleOP.ModuleOP.backward.0"]}, True),
    # 2.4 跨文件采集数据: PrecisionDebugger.start()/stop() inside forward, no step()
    "cross_file": ("cross_file", cfg(), {}, {0: ["Functional.linear.0.forward", "Functional.linear.0.backward"]},
                   True),
    # 1.11/1.12 register_custom_api(torch, "matmul", "torch") / restore_custom_api
    "custom_api": ("custom_api", cfg(), {},
                   {0: ["Tensor.t.0.forward", "torch.matmul.0.forward", "Tensor.t.1.forward", "Torch.matmul.0.forward"]},
                   True),
    # 28 单点保存: level debug, with the docs' config.json and without one
    "debug_save": ("debug_save", cfg(level="debug", section={"summary_mode": "statistics"}), {},
                   {0: ["dict_variable.0.debug", "y.0.debug", "y_grad.0.debug"],
                    1: ["dict_variable.0.debug", "y.0.debug", "y_grad.0.debug"]}, True),
    "debug_save_no_config": ("debug_save", None, {},
                             {0: ["dict_variable.0.debug", "y.0.debug", "y_grad.0.debug"],
                              1: ["dict_variable.0.debug", "y.0.debug", "y_grad.0.debug"]}, True),
    # 02 step: a list, a range string
    "step_list": ("config_run", cfg(step=[1]), {}, {1: STEP_L1}, True),
    "step_range": ("config_run", cfg(step=["0-1"]), {}, {0: STEP_L1, 1: STEP_L1}, True),
    # 02 list: full API names (forward and backward), an API kind, a module at mix, a substring at mix
    "list_names": ("config_run", cfg(step=[0], section={"list": ["Functional.linear.1.forward",
                                                                  "Functional.relu.0.backward"]}), {},
                   {0: ["Functional.linear.1.forward", "Functional.relu.0.backward"]}, True),
    "list_backward_name": ("config_run", cfg(step=[0], section={"list": ["Functional.relu.0.backward"]}), {},
                           {0: ["Functional.relu.0.backward"]}, True),
    "list_kind": ("config_run", cfg(step=[0], section={"list": ["relu"]}), {},
                  {0: ["Functional.relu.0.forward", "Functional.relu.0.backward"]}, True),
    "list_mix_module": ("config_run", cfg(level="mix", step=[0], section={"list": [M2F]}), {},
                        {0: ["Functional.linear.1.forward", M2F]}, True),
    "list_mix_substring": ("config_run", cfg(level="mix", step=[0], section={"list": ["linear_2"]}), {},
                           {0: ["Functional.linear.1.forward", M2F, "Functional.linear.1.backward", P2, M2B]}, True),
    # 02 scope: an API range, scope + list (their intersection), a mix range ending at a module
    "scope_api": ("config_run", cfg(step=[0], section={"scope": ["Functional.linear.1.forward",
                                                                  "Functional.cross_entropy.0.forward"]}), {},
                  {0: ["Functional.linear.1.forward", "Functional.relu.0.forward", "Functional.cross_entropy.0.forward"]},
                  True),
    "scope_and_list": ("config_run", cfg(step=[0], section={"scope": ["Functional.linear.0.forward",
                                                                       "Functional.relu.0.forward"],
                                                             "list": ["linear"]}), {},
                       {0: ["Functional.linear.0.forward", "Functional.linear.1.forward"]}, True),
    "scope_L0_modules": ("config_run", cfg(level="L0", step=[0], section={"scope": [M1F, M2B]}), {},
                         {0: [M1F, M2F, P2, M2B]}, True),
    "scope_mix_module_end": ("config_run", cfg(level="mix", step=[0], section={"scope": [M1F, M2F]}), {},
                             {0: ["Functional.linear.0.forward", M1F, "Functional.linear.1.forward", M2F]},
                             "26.2.0 leaves the end module's inner APIs out (§20, 'A mix scope ending at a module')"),
    # 02 data_mode
    "data_mode_backward": ("config_run", cfg(step=[0], section={"data_mode": ["backward"]}), {}, {0: CE_B + BWD}, True),
    "data_mode_backward_mix": ("config_run", cfg(level="mix", step=[0], section={"data_mode": ["backward"]}), {},
                               {0: CE_B + MIX_BWD}, True),
    "data_mode_forward_input": ("config_run", cfg(step=[0], section={"data_mode": ["forward", "input"]}), {},
                                {0: LIN + CE_F + OPT}, True),
    "data_mode_output": ("config_run", cfg(step=[0], section={"data_mode": ["output"]}), {}, {0: STEP_L1}, True),
    # 02 summary_mode, task tensor, tensor_list, async_dump
    "summary_md5": ("config_run", cfg(step=[0], section={"summary_mode": "md5"}), {}, {0: STEP_L1}, True),
    "tensor": ("config_run", cfg(task="tensor", step=[0], section={"data_mode": ["all"]}), {}, {0: STEP_L1}, True),
    "tensor_list": ("config_run", cfg(step=[0], section={"tensor_list": ["relu"]}), {}, {0: STEP_L1}, True),
    "async_dump": ("config_run", cfg(async_dump=True, step=[0]), {}, {0: STEP_L1}, True),
    # 02 structure: records none, construct.json only (at L1: mix, as 8.1.1 and 26.2.0)
    "structure_mix": ("config_run", cfg(task="structure", level="mix", step=[0]), {}, {0: []}, True),
    "structure_L1": ("config_run", cfg(task="structure", step=[0]), {}, {0: []}, True),
    # 02 overflow_check: overflow_nums counted over the run (an inf input in both steps)
    "overflow_check": ("config_run", cfg(task="overflow_check", section={"overflow_nums": 3}),
                       {"DOC_INJECT_INF": "0,1"}, {0: LIN},
                       "26.2.0 has no PyTorch overflow_check task (§20, 'PyTorch overflow_check')"),
    "overflow_check_unlimited": ("config_run", cfg(task="overflow_check", section={"overflow_nums": -1}),
                                 {"DOC_INJECT_INF": "1"}, {1: LIN + CE_F + BWD + OPT},  # NLL's grads are finite
                                 "26.2.0 has no PyTorch overflow_check task (§20, 'PyTorch overflow_check')"),
}

_PGRAD_COUNT = re.compile(r"\.parameters_grad\.\d+$")


def run_example(where, example: str, config, env: dict, python: str = sys.executable, ours: bool = True):
    """Runs one example in ``where``; returns (the process, {step: [record names]}, the rank dirs)."""
    os.makedirs(where, exist_ok=True)
    args = [python, SCRIPT, example]
    if config is not None:
        with open(os.path.join(where, "config.json"), "w") as f:
            json.dump(config, f)
        args.append("config.json")
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    e.update(env, OMP_NUM_THREADS="2")
    if ours:
        e["PYTHONPATH"] = ROOT
    proc = subprocess.run(args, cwd=where, env=e, capture_output=True, text=True, timeout=600)
    records, dirs = {}, {}
    for doc in sorted(glob.glob(os.path.join(where, "dump_path", "step*", "*", "*.json"))):
        if os.path.basename(doc) not in ("dump.json", "debug.json"):
            continue
        step = int(doc.split(os.sep)[-3][4:])
        with open(doc) as f:
            data = json.load(f)["data"]
        records[step] = [_PGRAD_COUNT.sub(".parameters_grad", n) for n in data if not n.startswith("Torch.randn.")]
        dirs[step] = os.path.dirname(doc)
    return proc, records, dirs


@pytest.mark.parametrize("case", sorted(CASES))
def test_doc_example_records(tmp_path, case):
    example, config, env, expected, _ = CASES[case]
    proc, records, dirs = run_example(str(tmp_path), example, config, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert records == expected
    for step, d in dirs.items():  # every dump is final, step() called or not (the process ended)
        with open(os.path.join(d, "msprobe_lake.json")) as f:
            assert json.load(f)["final"] is True, d
        assert not os.path.exists(os.path.join(d, ".journal")), d
        with open(os.path.join(d, "debug.json" if os.path.exists(os.path.join(d, "debug.json")) else "dump.json")) as f:
            data = json.load(f)["data"]
        assert all(rec != {} for rec in data.values()), [n for n, r in data.items() if r == {}]


REAL_CASES = sorted(c for c, v in CASES.items() if v[4] is True)


@pytest.mark.real_tool
@pytest.mark.parametrize("case", ["quick_start", "full_mix", "full_L0", "stop_before_backward_L1", "module_dump",
                                  "custom_api", "debug_save", "list_backward_name", "scope_and_list",
                                  "data_mode_backward_mix", "list_mix_substring", "structure_L1"])
def test_expected_records_are_the_real_tools(tmp_path, real_tool, case):
    """The expected lists above are what the real 26.2.0 writes for the same script and config
    (the run from a directory outside the project, whose msprobe/ would shadow the real one)."""
    assert case in REAL_CASES
    example, config, env, expected, _ = CASES[case]
    proc, records, _ = run_example(str(tmp_path / "real"), example, config, env, python=real_tool, ours=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert records == expected


# --- the documented semantics in detail -------------------------------------------------------
def _load(d, name="dump.json"):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def test_module_dump_records_the_module_alone(tmp_path):
    """1.6/1.7: the module's own forward (inputs, outputs, parameters) and backward records; its
    children and APIs neither recorded nor counted; dumping resumes after module_dump_end."""
    proc, records, dirs = run_example(str(tmp_path), "module_dump", cfg(level="mix"), {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert records == CASES["module_dump"][3]  # at mix too: no linear_1/linear_2 or their APIs
    data = _load(dirs[0])["data"]
    fwd = data["Module.MyModuleOP.ModuleOP.forward.0"]
    assert fwd["input_args"][0]["shape"] == [10, 8] and fwd["output"][0]["shape"] == [10, 2]
    bwd = data["Module.MyModuleOP.ModuleOP.backward.0"]
    assert bwd["input"][0]["shape"] == [10, 2]


def test_data_mode_writes_only_the_chosen_parts(tmp_path):
    proc, _, dirs = run_example(str(tmp_path), "config_run", CASES["data_mode_forward_input"][1], {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = _load(dirs[0])["data"]
    assert all(set(rec) == {"input_args", "input_kwargs"} for rec in data.values()), data


def test_overflow_check_saves_the_overflowing_tensors(tmp_path):
    """02 1.5: "检测到溢出 API 对应的 输入输出 数据均 dump"; overflow_nums over the run."""
    proc, records, dirs = run_example(str(tmp_path), "config_run", CASES["overflow_check"][1],
                                      CASES["overflow_check"][2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert records == {0: LIN}  # 3 overflows in step 0; step 1 has none left to report
    data = _load(dirs[0])["data"]
    files = sorted(os.listdir(os.path.join(dirs[0], "dump_tensor_data")))
    named = sorted(re.findall(r'"data_name": "([^"]+)"', json.dumps(data)))
    assert named == files and "Functional.linear.0.forward.input.0.pt" in files
    x = torch.load(os.path.join(dirs[0], "dump_tensor_data", "Functional.linear.0.forward.input.0.pt"))
    assert torch.isinf(x[0, 0]) and x.shape == (10, 8)


def test_structure_at_l1_warns_and_uses_mix(tmp_path):
    proc, records, dirs = run_example(str(tmp_path), "config_run", CASES["structure_L1"][1], {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "level 'mix' is used" in proc.stderr
    construct = _load(dirs[0], "construct.json")
    assert construct["Functional.linear.1.forward"] == M2F and construct["Functional.linear.1.backward"] == M2B
    assert _load(dirs[0])["level"] == "mix"


@pytest.mark.parametrize("task", ["free_benchmark", "grad_probe", "run_ut", "acc_check"])
def test_tasks_the_debugger_does_not_run_are_refused(tmp_path, task, fresh_debugger):
    from msprobe.errors import ConfigError

    p = tmp_path / "c.json"
    p.write_text(json.dumps({"task": task, "dump_path": str(tmp_path / "d"), "level": "L1", task: {}}))
    with pytest.raises(ConfigError, match=f"task '{task}'"):
        fresh_debugger(config_path=str(p))


def test_enable_dataloader_true_is_refused(tmp_path, fresh_debugger):
    from msprobe.errors import ConfigError

    p = tmp_path / "c.json"
    p.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "enable_dataloader": True}))
    with pytest.raises(ConfigError, match="enable_dataloader"):
        fresh_debugger(config_path=str(p))
    p.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "enable_dataloader": False}))
    fresh_debugger(config_path=str(p))


def test_seed_all_follows_the_docs_table(monkeypatch):
    """1.8: seed_all(seed=1234, mode=False, rm_dropout=True); the table's rows; is_enhanced."""
    import random

    import numpy as np

    from msprobe.pytorch import seed_all

    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    cudnn = (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    try:
        seed_all()
        assert os.environ["PYTHONHASHSEED"] == "1234" and os.environ["HCCL_DETERMINISTIC"] == "False"
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.enabled is False  # "torch.backends.cudnn.enable=False: 关闭 cuDNN"
        assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is True
        x = torch.ones(1000)
        assert torch.equal(torch.nn.functional.dropout(x, p=0.5, training=True), x)  # rm_dropout=True default
        assert torch.equal(torch.nn.Dropout(p=0.5).train()(x), x)
        seed_all(99, mode=True, rm_dropout=False, is_enhanced=True)
        assert os.environ["HCCL_DETERMINISTIC"] == "True" and torch.are_deterministic_algorithms_enabled()
        # is_enhanced: each random call starts from the state seed_all left
        a, b = torch.rand(3), torch.rand(3)
        assert torch.equal(a, b) and random.random() == random.random()
        assert np.random.rand() == np.random.rand()
    finally:
        import msprobe.dumpers.pytorch._debugger as dbg_mod

        for mod_name, names in dbg_mod._RANDOM_APIS:  # undo the fixation for the other tests
            owner = torch.Tensor if mod_name == "torch.Tensor" else __import__("importlib").import_module(mod_name)
            for n in names:
                fn = getattr(owner, n, None)
                if fn is not None and hasattr(fn, "__msprobe_fixed_random__"):
                    setattr(owner, n, fn.__msprobe_fixed_random__)
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn


def test_seed_all_rejects_bad_is_enhanced():
    from msprobe.errors import ConfigError
    from msprobe.pytorch import seed_all

    with pytest.raises(ConfigError, match="is_enhanced"):
        seed_all(1, is_enhanced="yes")


def test_quick_start_dump_is_final_without_step(tmp_path):
    """The docs' quick start ends with stop(), no step(): when the process exits the dump is
    final (no .journal/, "final": true), and valid."""
    from msprobe.backends import open_store
    from msprobe.readers.validate import validate_store

    proc, records, dirs = run_example(str(tmp_path), "quick_start", None, {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = dirs[0]
    assert _load(d, "msprobe_lake.json")["final"] is True and not os.path.exists(os.path.join(d, ".journal"))
    report = validate_store(open_store(str(tmp_path / "dump_path"), read_only=True, create=False))
    assert report.ok, [str(p) for p in report.errors]


def test_structure_warning_is_a_python_warning(tmp_path, fresh_debugger):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg = fresh_debugger(task="structure", level="L1", dump_path=str(tmp_path / "d"))
    assert dbg.config.level == "mix" and any("'mix' is used" in str(w.message) for w in caught)
