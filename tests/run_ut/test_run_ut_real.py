"""run_ut on the real tool's dumps: the same API set and SKIP causes as the real 26.2.0 checker,
and an injected error is caught."""
from __future__ import annotations

import csv
import glob
import os
import shutil

import pytest

torch = pytest.importorskip("torch")

from msprobe.run_ut import run_ut  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(HERE, "..", "fixtures", "real")
SCEN = ("L1_statistics", "L1_tensor")

# the real tool's reason -> the cause it stands for; ours must give the same cause
REAL_CAUSES = {
    "Bench output is None": "no_value",
    "Multiple backward is not supported": "multi_output",
    "in black list or not in white list": "filtered",
    "There is not bench calculation result": "empty",
}
OUR_CAUSES = {
    "No benchmark value": "no_value",
    "several outputs": "multi_output",
    "not replayable": "filtered",
    "filtered out": "filtered",
    "Empty tensor": "empty",
}


def cause(msg: str, table: dict) -> str:
    for k, v in table.items():
        if k in msg:
            return v
    return "other:" + msg[:60]


def read(path: str) -> list:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return list(csv.reader(fh))


def dump_json(scen: str) -> str:
    return glob.glob(os.path.join(REAL, "ms26", scen, "step0", "*", "dump.json"))[0]


def real_csv(scen: str, kind: str) -> str:
    return glob.glob(os.path.join(REAL, "acc_check_outputs", scen, f"accuracy_checking_{kind}_*.csv"))[0]


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    out = {}
    for scen in SCEN:
        d = tmp_path_factory.mktemp(scen)
        # statistics in this process, tensor through one worker process (both paths covered)
        s = run_ut(dump_json(scen), str(d), workers=0 if scen == "L1_statistics" else 1, progress=False)
        out[scen] = s
    return out


@pytest.mark.parametrize("scen", SCEN)
def test_same_api_set_and_statuses(ours, scen):
    real = read(real_csv(scen, "result"))
    mine = read(ours[scen]["result_csv"])
    assert mine[0] == ["API name", "Forward Test Success", "Backward Test Success", "Message"]
    assert [r[0] for r in mine[1:]] == [r[0] for r in real[1:]]
    for r, m in zip(real[1:], mine[1:]):
        r = (r + ["", "", ""])[:4]
        assert m[1] == r[1], (m, r)
        assert m[2].strip() == r[2].strip(), (m, r)
        if r[1] == "SKIP" or r[2] == "SKIP":
            assert cause(m[3], OUR_CAUSES) == cause(r[3], REAL_CAUSES), (m, r)


@pytest.mark.parametrize("scen", SCEN)
def test_same_detail_rows_and_skip_causes(ours, scen):
    real = read(real_csv(scen, "details"))
    mine = read(ours[scen]["details_csv"])
    assert mine[0] == real[0]  # the docs' columns, same spelling
    assert [r[0] for r in mine[1:]] == [r[0] for r in real[1:]]
    st = real[0].index("Status")
    for r, m in zip(real[1:], mine[1:]):
        assert m[st] == r[st], (m[0], m[st], r[st], m[-1])
        if r[st] == "SKIP":
            assert cause(m[-1], OUR_CAUSES) == cause(r[-1], REAL_CAUSES), (m[0], m[-1], r[-1])
        # dtypes and shapes are the real checker's
        assert m[1:4] == r[1:4] or r[st] == "SKIP", (m[:4], r[:4])


def test_injected_error_is_caught(tmp_path, ours):
    src = os.path.dirname(dump_json("L1_tensor"))
    dst = tmp_path / "dump"
    shutil.copytree(src, dst)
    target = dst / "dump_tensor_data" / "Functional.relu.0.forward.output.0.pt"
    t = torch.load(target, weights_only=True)
    torch.save(t + 0.5 * torch.randn_like(t), target)
    s = run_ut(str(dst / "dump.json"), str(tmp_path / "out"), workers=0, progress=False, save_error_data_flag=True)
    saved = sorted(os.listdir(s["error_data"]))  # -save_error_data: the failing API only
    assert "Functional.relu.0.forward.input.0.pt" in saved and "Functional.relu.0.forward.output.bench.pt" in saved
    assert all(f.startswith("Functional.relu.0.") for f in saved)
    bad = {r[0]: r for r in read(s["result_csv"])[1:]}
    good = {r[0]: r for r in read(ours["L1_tensor"]["result_csv"])[1:]}
    assert bad["Functional.relu.0"][1] == "error"
    assert set(bad) == set(good)
    for name, row in good.items():
        if name != "Functional.relu.0":
            assert bad[name][1:3] == row[1:3], name
    det = {r[0]: r for r in read(s["details_csv"])[1:]}
    assert "dumped output differs" in det["Functional.relu.0.forward.output.0"][-1]
