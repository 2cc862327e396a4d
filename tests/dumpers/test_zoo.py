"""The conformance zoo: ten small models beyond the tiny fixture model (tests/fixtures/real/scripts/
zoo.py), each dumped by the real msprobe 26.2.0 (committed under tests/fixtures/real/zoo26, made by
generate_zoo.py) and here by ours, with the same config. Same record names in the same order, same
argument encodings, statistics within 1e-5 (relative), same tensor files, same construct.json parents
of forward records (at L0 and mix, from the first backward record on, where 26.2.0's gradients are its
own reordered sums, the structure only and of the values what no summation order changes: spec/PRODUCER.md
§20 item 43 (d), tests/dumpers/test_wild_zoo.py); the only differences allowed are the documented ones
of spec/FORMAT.md and PRODUCER.md §20, each counted by kind (with MSPROBE_CONFORMANCE_FIGURES=FILE the figures go to FILE, and
`python tests/dumpers/test_zoo.py FILE` prints the table of docs/conformance.md).

The checksums of floating-point tensors (the ``md5`` runs) are the CPU kernels' bits: they are
compared with the real tool run live on this machine, not with the committed dump (see
tests/dumpers/test_conformance.py and tests/fixtures/real/README.md)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REAL = os.path.join(ROOT, "tests", "fixtures", "real")
sys.path.insert(0, HERE)
sys.path.insert(0, REAL)
import zoo_compare as zoo  # noqa: E402
from generate_zoo import OUT, SCRIPT, config, runs  # noqa: E402
from test_conformance import (  # noqa: E402
    _INPLACE,
    compare_values,
    doc,
    float_checksums_in,
    later_checksums,
    normalize_real,
    rank_dirs,
)

RUNS = runs()


def run_zoo(tmp_path, run: str, model: str, cfg: str, python: str = sys.executable, ours: bool = True) -> str:
    """Run one zoo config in ``tmp_path`` with our msprobe, or (``ours=False``) with the real one
    of the venv ``python`` (without PYTHONPATH, from a folder outside the project)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{run}.json"
    path.write_text(json.dumps(config(run, model, cfg)))
    # 2 intra-op threads, as the fixtures were made (CPU reductions change their low bits with it)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", **({"PYTHONPATH": ROOT} if ours else {}))
    out = subprocess.run([python, SCRIPT, "--model", model, "--config", str(path)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return str(tmp_path / run)


def run_ours(tmp_path, run: str, model: str, cfg: str) -> str:
    return run_zoo(tmp_path, run, model, cfg)


def compare_run(real_root: str, ours_root: str, float_checksums: bool = False) -> dict:
    """Compare one run with a real dump (committed: ``float_checksums`` False, the checksums of
    float tensors left out; live: True); returns the figures, with the problems found under
    "problems" and the float checksums compared under "float_checksums"."""
    fig = {"records": 0, "equal": 0, "values": 0, "tensor_files": 0, "problems": [],
           "module_backward_kept": 0, "module_cut_short": 0, "float_checksums": 0, "raced": [],
           "values_perturbed": 0}
    real_ranks, our_ranks = rank_dirs(real_root, 0), rank_dirs(ours_root, 0)
    assert list(real_ranks) == list(our_ranks) == [None], (real_ranks, our_ranks)
    rp, op = real_ranks[None], our_ranks[None]
    _, rdoc = doc(rp)
    _, odoc = doc(op)
    fig["problems"].extend(zoo.header_problems(rdoc, odoc))
    real = {normalize_real(n): v for n, v in rdoc["data"].items()}
    ours = dict(odoc["data"])
    fig["records"] = len(real)
    kept = zoo.module_backward_kept(real, ours)
    cut, after = zoo.cut_short(real, ours)  # §20 item 27
    fig["module_backward_kept"], fig["module_cut_short"], fig["api_after_cut_short"] = len(kept), len(cut), len(after)
    ours = {n: v for n, v in ours.items() if n not in kept and n not in after}
    real_cmp = {n: v for n, v in real.items() if n not in cut}
    fig["problems"].extend(zoo.name_problems(real_cmp, ours))
    # L0/mix: from the first backward record on, 26.2.0's gradients are its own reordered sums (spec/PRODUCER.md §20
    # item 43 (d)): the structure is compared, of the values only what no summation order changes
    perturbed = zoo.reached(rdoc["level"], real_cmp)
    for n in real_cmp:
        if n not in ours:
            continue
        before = len(fig["problems"])
        inplace = bool(_INPLACE.match(n))
        a, b = (zoo.unvalued(real_cmp[n]), zoo.unvalued(ours[n])) if perturbed[n] else (real_cmp[n], ours[n])
        compare_values(a, b, n, fig["problems"], {
            "inplace": inplace, "float_checksums": float_checksums, "raced": fig["raced"],
            "later": later_checksums(ours, n) if float_checksums else ()})
        fig["float_checksums"] += float_checksums_in(real_cmp[n]) if float_checksums and not inplace and \
            not perturbed[n] else 0
        fig["equal"] += len(fig["problems"]) == before
        not_compared = zoo.values_in(real_cmp[n]) if perturbed[n] else 0
        fig["values"] += len(re.findall(r'"(?:Max|Min|Mean|Norm|md5|value)"', json.dumps(real_cmp[n]))) - not_compared
        fig["values_perturbed"] += not_compared
    # tensor files: ours has each file the real dump has, with the same values
    rdir, odir = os.path.join(rp, "dump_tensor_data"), os.path.join(op, "dump_tensor_data")
    real_files = sorted(os.listdir(rdir)) if os.path.isdir(rdir) else []
    our_files = sorted(os.listdir(odir)) if os.path.isdir(odir) else []
    real_files = [normalize_real(f[:-3]) + ".pt" if "parameters_grad" in f else f for f in real_files]
    if real_files != our_files:
        fig["problems"].append(("tensor files", sorted(set(real_files) ^ set(our_files))))
    for f in set(real_files) & set(our_files):
        a = torch.load(os.path.join(rdir, f), weights_only=True)
        b = torch.load(os.path.join(odir, f), weights_only=True)
        valued = not any(perturbed[n] for n in real_cmp if f.startswith(n + "."))  # (the record the file is of)
        if a.dtype != b.dtype or a.shape != b.shape or (
                valued and not torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)):
            fig["problems"].append(("tensor file", f))
        fig["tensor_files"] += 1
    # construct.json parents of forward records
    fig["problems"].extend(("construct", *found) for found in zoo.construct_problems(rp, op, lambda child: child in cut))
    return fig


@pytest.mark.real_fixture
@pytest.mark.parametrize("run,model,cfg", [pytest.param(*r, marks=pytest.mark.real_tool) if r[2] == "md5" else r
                                           for r in RUNS], ids=[r for r, _, _ in RUNS])
def test_zoo_same_records_as_real_msprobe_26(tmp_path, request, run, model, cfg):
    """Ours against the committed real dump; the md5 runs also against the real tool run live
    here, float checksums included."""
    real_root = os.path.join(OUT, run)
    assert os.path.isdir(real_root), f"no real fixture {run}: run tests/fixtures/real/generate_zoo.py"
    ours_root = run_ours(tmp_path / "ours", run, model, cfg)
    if cfg == "md5":
        live_root = run_zoo(tmp_path / "real", run, model, cfg, python=request.getfixturevalue("real_tool"),
                            ours=False)
        live = compare_run(live_root, ours_root, float_checksums=True)
        assert not live["problems"], ("against the live real run", live["problems"][:20])
        assert live["float_checksums"] > 20, live["float_checksums"]
        assert len(live["raced"]) <= max(2, live["float_checksums"] // 10), live["raced"]
    fig = compare_run(real_root, ours_root)
    zoo.write_figures(fig, run)
    assert not fig["problems"], fig["problems"][:20]
    assert fig["equal"] == fig["records"] - fig["module_cut_short"]


def table(lines: list) -> str:
    """The markdown table of docs/conformance.md from the figures the test wrote."""
    figs = sorted((json.loads(ln) for ln in lines if ln.strip()), key=lambda f: [r for r, _, _ in RUNS].index(f["run"]))
    out = ["| run | records (26.2.0) | equal | values compared | values not compared (past 26.2.0's perturbation) "
           "| tensor files | §20 differences |", "|---|---|---|---|---|---|---|"]
    for f in figs:
        out.append(f"| {f['run']} | {f['records']} | {f['equal']} | {f['values']} | {f['values_perturbed']} | "
                   f"{f['tensor_files']} | {zoo.notes_of(f, _NOTES)} |")
    return "\n".join(out)


#: the §20 differences counted by the zoo, as the table shows them
_NOTES = [("module_backward_kept", "module backward kept (item 10)"),
          ("module_cut_short", "cut-short module not written (item 27)"),
          ("api_after_cut_short", "API forward records after the cut-short call kept (item 27)")]


if __name__ == "__main__":  # python tests/dumpers/test_zoo.py FIGURES.jsonl: the table of docs/conformance.md
    zoo.print_table(table)
