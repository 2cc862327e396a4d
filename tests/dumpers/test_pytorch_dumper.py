"""The PyTorch dumper: what it writes, checked by the invariants of the format."""
from __future__ import annotations

import json
import os
import re
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from msprobe.backends import open_store  # noqa: E402
from msprobe.errors import ConfigError  # noqa: E402
from msprobe.format.naming import parse_record_name  # noqa: E402
from msprobe.pytorch import PrecisionDebugger, module_dump, module_dump_end, seed_all  # noqa: E402
from msprobe.readers.validate import validate_store  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_debugger")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        x = self.norm(self.emb(ids))
        x = x + self.conv(x.unsqueeze(1)).mean(dim=1)
        x = self.act(self.fc(x))
        a, b = torch.split(x, 4, dim=-1)
        x = torch.cat([b, a], dim=-1)
        s = torch.matmul(x, x.transpose(-1, -2)).masked_fill(ids.eq(0).unsqueeze(1), -1e4)
        x = torch.matmul(torch.softmax(s, dim=-1), x)
        return self.head(x).mean(dim=1)


def train(dbg, steps=2, model=None, start_model=True):
    seed_all(7)
    model = model or Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outs = []
    for step in range(steps):
        ids = torch.randint(0, 10, (2, 4))
        dbg.start(model if start_model else None)
        y = model(ids)
        loss = F.cross_entropy(y, torch.tensor([0, 2]))
        loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
        outs.append(y.detach())
    return model, outs


def load(path, step=0, rank_dir="rank", doc="dump.json"):
    with open(os.path.join(path, f"step{step}", rank_dir, doc)) as f:
        return json.load(f)


def check_invariants(root):
    """The invariants every dump of ours must hold (DESIGN.md)."""
    report = validate_store(open_store(str(root), read_only=True, create=False))
    assert report.ok, [str(p) for p in report.errors]
    for step_dir in sorted(os.listdir(root)):
        for rank_dir in os.listdir(os.path.join(root, step_dir)):
            base = os.path.join(root, step_dir, rank_dir)
            doc = "debug.json" if os.path.exists(os.path.join(base, "debug.json")) else "dump.json"
            data = json.load(open(os.path.join(base, doc)))["data"]
            last = defaultdict(lambda: -1)
            for name in data:
                rn = parse_record_name(name)
                if rn.kind == "api" and rn.direction == "forward":
                    key = (rn.prefix, rn.api_name)
                    assert rn.call_index > last[key], f"counter went backwards at {name}"
                    last[key] = rn.call_index
            files = set(os.listdir(os.path.join(base, "dump_tensor_data"))) if os.path.isdir(
                os.path.join(base, "dump_tensor_data")) else set()
            named = []
            for rec in data.values():
                named.extend(re.findall(r'"data_name": "([^"]+)"', json.dumps(rec)))
            assert len(named) == len(set(named)), "a tensor file named twice"
            mapping = {}
            if "mapping.csv" in files:
                with open(os.path.join(base, "dump_tensor_data", "mapping.csv")) as f:
                    mapping = {orig: conv for conv, orig in (line.strip().split(",") for line in f if line.strip())}
            named = {mapping.get(n, n) for n in named}
            assert named <= files, named - files
            assert files - {"mapping.csv"} <= named, "a tensor file named by no record"
            if doc == "dump.json":
                stack = json.load(open(os.path.join(base, "stack.json")))
                for sid, (names, frames) in stack.items():
                    assert all(n in data or not data for n in names)
                    assert all(isinstance(fr, str) and fr.startswith("File ") for fr in frames)
                construct = json.load(open(os.path.join(base, "construct.json")))
                for child, parent in construct.items():
                    assert parent is None or parent in data or parent in construct, (child, parent)
                    assert child in data or not data or child == "optimizer", child
            assert not os.path.exists(os.path.join(base, ".journal")) or not os.listdir(os.path.join(base, ".journal"))


def test_l1_statistics_records_and_stats(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="statistics")
    train(dbg)
    check_invariants(tmp_path)
    d = load(tmp_path)
    assert d["task"] == "statistics" and d["level"] == "L1" and d["framework"] == "pytorch"
    names = list(d["data"])
    assert "Functional.linear.0.forward" in names and "Functional.linear.0.backward" in names
    assert "Torch.matmul.1.forward" in names and "Tensor.masked_fill.0.forward" in names
    assert not any(n.startswith("Module.") for n in names)
    assert load(tmp_path, doc="construct.json") == {}
    emb = d["data"]["Functional.embedding.0.forward"]
    ids = emb["input_args"][0]
    assert ids["dtype"] == "torch.int64" and isinstance(ids["Max"], int) and ids["Mean"] is None
    mask = d["data"]["Tensor.masked_fill.0.forward"]["input_args"][1]
    assert mask["dtype"] == "torch.bool" and isinstance(mask["Max"], bool) and mask["Norm"] is None
    assert d["data"]["Torch.split.0.forward"]["input_kwargs"] == {"dim": {"type": "int", "value": -1}}
    # the second step has its own counters
    assert "Functional.linear.0.forward" in load(tmp_path, step=1)["data"]


def test_stats_equal_the_reference_definitions(tmp_path):
    from msprobe.format.stats import reference_stats

    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    train(dbg, steps=1)
    base = tmp_path / "step0" / "rank"
    data = load(tmp_path)["data"]
    checked = 0
    for rec in data.values():
        for entry in re.findall(r"\{[^{}]*\"data_name\"[^{}]*\}", json.dumps(rec)):
            e = json.loads(entry)
            t = torch.load(base / "dump_tensor_data" / e["data_name"], weights_only=True)
            assert list(t.shape) == e["shape"] and str(t.dtype) == e["dtype"]
            ref = reference_stats(t.numpy() if t.dtype != torch.bfloat16 else t.float().numpy())
            for k, r in zip(("Max", "Min", "Mean", "Norm"), ref):
                if r is None or e[k] is None:
                    assert r == e[k], (e["data_name"], k)
                else:
                    assert e[k] == pytest.approx(r, rel=1e-5, abs=1e-6), (e["data_name"], k)
            checked += 1
    assert checked > 50


def test_mix_modules_params_and_construct(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    train(dbg, steps=1)
    check_invariants(tmp_path)
    data = load(tmp_path)["data"]
    fwd = data["Module.fc.Linear.forward.0"]
    assert list(fwd) == ["input_args", "input_kwargs", "output", "parameters"]
    assert set(fwd["parameters"]) == {"weight", "bias"}
    assert data["Module.act.ReLU.forward.0"]["parameters"] == {}
    assert set(data["Module.fc.Linear.parameters_grad"]) == {"weight", "bias"}
    assert isinstance(data["Module.fc.Linear.parameters_grad"]["weight"], list)
    assert "Module.head.Linear.backward.0" in data
    construct = load(tmp_path, doc="construct.json")
    assert construct["Functional.linear.0.forward"] == "Module.fc.Linear.forward.0"
    assert construct["Module.fc.Linear.forward.0"] is None
    # optimizer APIs sit under the optimizer pseudo-module
    opt_apis = [n for n, p in construct.items() if p == "optimizer"]
    assert opt_apis and all(n.startswith("Tensor.") or n.startswith("Torch.") for n in opt_apis)


def test_mix_clip_grad_calls_sit_under_the_clip_grad_pseudo_module(tmp_path):
    """torch.nn.utils.clip_grad_norm_ / clip_grad_value_ inside the window: their calls map to
    "clip_grad" in construct.json (added as "clip_grad": null), as 26.2.0's; the functions are
    the originals again after close()."""
    originals = (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad_value_)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    dbg.start(model)
    model(torch.randn(5, 4)).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    dbg.stop()
    dbg.step()
    PrecisionDebugger._reset()  # the dumper closed (what the process end does)
    assert (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad_value_) == originals
    construct = load(tmp_path, doc="construct.json")
    data = load(tmp_path)["data"]
    assert construct["clip_grad"] is None and construct["optimizer"] is None
    clipped = [n for n, p in construct.items() if p == "clip_grad"]
    assert any(n.startswith("Torch._foreach_norm.") or ".norm." in n for n in clipped), clipped
    assert any("clamp" in n for n in clipped), clipped  # clip_grad_value_
    assert all(n in data for n in clipped)
    assert not set(clipped) & {n for n, p in construct.items() if p == "optimizer"}


def test_recomputed_forward_calls_take_the_running_backward_as_parent(tmp_path):
    """torch.utils.checkpoint (non-reentrant) recomputes a block's forward inside the backward of
    the first module needing a saved tensor: those forward calls map to that backward record in
    construct.json (26.2.0's module stack holds backwards too), not to null."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    head = nn.Linear(4, 2)
    model = nn.ModuleDict({"block": block, "head": head})
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    dbg.start(model)
    hidden = checkpoint(block, torch.randn(3, 4, requires_grad=True), use_reentrant=False)
    head(hidden).sum().backward()
    dbg.stop()
    dbg.step()
    PrecisionDebugger._reset()  # the dumper closed (what the process end does)
    construct = load(tmp_path, doc="construct.json")
    recomputed = [n for n in construct if n.startswith("Module.block.") and n.endswith(".forward.1")]
    assert recomputed, sorted(construct)
    tops = {construct[n] for n in recomputed if construct[n] is None or ".backward." in construct[n]}
    assert tops and all(parent is not None and ".backward." in parent for parent in tops), tops


def test_module_backward_grads_are_the_true_gradients(tmp_path):
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    model = nn.Sequential(lin)
    x = torch.randn(4, 3, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0", task="tensor")
    dbg.start(model)
    out = model(x)
    g = torch.randn_like(out)
    out.backward(g)
    dbg.stop()
    dbg.step()
    base = tmp_path / "step0" / "rank" / "dump_tensor_data"
    gin = torch.load(base / "Module.0.Linear.backward.0.input.0.pt", weights_only=True)
    gout = torch.load(base / "Module.0.Linear.backward.0.output.0.pt", weights_only=True)
    assert torch.equal(gin, g)
    assert torch.allclose(gout, g @ lin.weight.detach())
    w = torch.load(base / "Module.0.Linear.parameters_grad.weight.pt", weights_only=True)
    assert torch.allclose(w, lin.weight.grad)


def test_inplace_relu_module_does_not_break_training(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    x = torch.randn(3, 4)
    ref_model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    ref_model.load_state_dict(model.state_dict())
    dbg.start(model)
    model(x).sum().backward()
    dbg.stop()
    dbg.step()
    ref_model(x).sum().backward()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.allclose(p.grad, q.grad)
    check_invariants(tmp_path)


def test_tensor_task_files_and_training_unchanged(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    _, outs = train(dbg, steps=1)
    PrecisionDebugger._reset()
    _, ref = train(_NoDebugger(), steps=1)
    assert torch.equal(outs[0], ref[0])
    check_invariants(tmp_path)
    data = load(tmp_path)["data"]
    e = data["Functional.linear.0.forward"]["output"][0]
    assert e["data_name"] == "Functional.linear.0.forward.output.0.pt"
    t = torch.load(tmp_path / "step0" / "rank" / "dump_tensor_data" / e["data_name"], weights_only=True)
    assert t.max().item() == pytest.approx(e["Max"])
    assert load(tmp_path)["dump_data_dir"].endswith("dump_tensor_data")


class _NoDebugger:
    def start(self, *a, **k):
        pass

    stop = step = start


@pytest.mark.parametrize("mode", ["md5", "xor"])
def test_summary_modes(tmp_path, mode):
    import zlib

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1",
                               "statistics": {"summary_mode": mode}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    torch.relu(x)
    dbg.stop()
    dbg.step()
    e = load(tmp_path / "d")["data"]["Torch.relu.0.forward"]["input_args"][0]
    if mode == "md5":
        assert e["md5"] == f"{zlib.crc32(x.numpy().tobytes()):08x}" and e["Max"] == 11.0
    else:
        words = x.numpy().reshape(-1).view("<u8")
        v = 0
        for w in words:
            v ^= int(w)
        assert e["md5"] == f"0x{v:016x}" and "Max" not in e


def test_data_mode_list_and_scope(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1",
                               "statistics": {"list": ["linear", "Torch.matmul.1.forward"],
                                              "data_mode": ["forward", "output"]}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    train(dbg, steps=1, start_model=False)
    data = load(tmp_path / "d")["data"]
    assert set(data) == {"Functional.linear.0.forward", "Functional.linear.1.forward", "Torch.matmul.1.forward"}
    assert all(list(r) == ["output"] for r in data.values())


def test_scope_range(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1",
                               "statistics": {"scope": ["Torch.split.0.forward", "Torch.matmul.0.forward"]}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    train(dbg, steps=1, start_model=False)
    data = load(tmp_path / "d")["data"]
    assert list(data)[0] == "Torch.split.0.forward" and list(data)[-1] == "Torch.matmul.0.forward"


def test_step_filter_and_set_init_step(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", step=[1, "3-4"])
    dbg.set_init_step(1)
    train(dbg, steps=4, start_model=False)
    assert sorted(os.listdir(tmp_path)) == ["step1", "step3", "step4"]


def test_structure_task(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix", task="structure")
    train(dbg, steps=1)
    assert load(tmp_path)["data"] == {}
    check_invariants(tmp_path)
    stack = load(tmp_path, doc="stack.json")
    assert any("Module.fc.Linear.forward.0" in names for names, _ in stack.values())
    assert load(tmp_path, doc="construct.json")["Functional.linear.0.forward"] == "Module.fc.Linear.forward.0"


def test_debug_save(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="debug", task="tensor")
    dbg.start()
    x = torch.randn(2, 3, requires_grad=True)
    y = x * 2
    dbg.save(y, "y")
    dbg.save({"a": y.detach(), "n": 3, "lst": [y.detach(), None]}, "info", save_backward=False)
    y.sum().backward()
    dbg.save(y, "y")
    dbg.stop()
    dbg.step()
    data = load(tmp_path, doc="debug.json")["data"]
    # a gradient record takes its place at save() time and fills in when the gradient arrives
    assert list(data) == ["y.0.debug", "y_grad.0.debug", "info.0.debug", "y.1.debug", "y_grad.1.debug"]
    assert data["y_grad.1.debug"] is None  # saved after backward: no gradient ever arrives
    assert data["info.0.debug"]["n"] == {"type": "int", "value": 3}
    assert data["y_grad.0.debug"]["Max"] == pytest.approx(1.0)
    assert data["y.0.debug"]["data_name"] == "y.0.debug.pt"
    check_invariants(tmp_path)


def test_token_range(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4))
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    dbg.start(model, token_range=[1, 2])
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(1, 4))
    dbg.stop()
    dbg.step()
    data = load(tmp_path)["data"]
    # only forward passes 1 and 2 are dumped, and nothing outside the range counts (as msprobe does)
    assert [n for n in data if n.startswith("Functional.linear")] == [
        "Functional.linear.0.forward", "Functional.linear.1.forward"]


def test_overflow_check(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "overflow_check", "dump_path": str(tmp_path / "d"), "level": "L1",
                               "overflow_check": {"overflow_nums": 1}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    x = torch.ones(3)
    torch.exp(x)
    y = x / torch.zeros(3)
    torch.relu(y)
    torch.relu(y)
    dbg.stop()
    dbg.step()
    data = load(tmp_path / "d")["data"]
    assert list(data) == ["Tensor.__truediv__.0.forward"]


def test_module_dump(tmp_path):
    model = Net()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    dbg.start()
    module_dump(model.fc, "myfc")
    model(torch.randint(0, 10, (2, 4))).sum().backward()
    module_dump_end()
    dbg.stop()
    dbg.step()
    data = load(tmp_path)["data"]
    assert "Module.myfc.Linear.forward.0" in data


def test_singleton_and_config_errors(tmp_path):
    a = PrecisionDebugger(dump_path=str(tmp_path))
    assert PrecisionDebugger() is a
    PrecisionDebugger._reset()
    with pytest.raises(ConfigError, match="level"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L9")
    PrecisionDebugger._reset()
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "statistics": {"summary_mode": "sha"}}))
    with pytest.raises(ConfigError, match="summary_mode='sha'.*valid"):
        PrecisionDebugger(config_path=str(cfg))
    PrecisionDebugger._reset()
    cfg.write_text(json.dumps({"task": "statistics", "step": [1, "5-3"]}))
    with pytest.raises(ConfigError, match="step"):
        PrecisionDebugger(config_path=str(cfg))
    PrecisionDebugger._reset()
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "x"), "risk_level": "ALL",
                               "brand_new_key": 1}))
    with pytest.warns(UserWarning, match="brand_new_key"):
        PrecisionDebugger(config_path=str(cfg))
    PrecisionDebugger._reset()
    with pytest.raises(ConfigError, match="L2"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L2")
    PrecisionDebugger._reset()
    with pytest.raises(ConfigError, match="needs start\\(model"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L0").start()


def test_patches_are_removed_on_close(tmp_path):
    orig = (F.linear, torch.Tensor.__add__, torch.matmul)
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    dbg.start()
    assert F.linear is not orig[0]
    PrecisionDebugger._reset()
    assert (F.linear, torch.Tensor.__add__, torch.matmul) == orig
    assert "__add__" not in torch.Tensor.__dict__ or torch.Tensor.__add__ is orig[1]


def test_long_names_use_mapping_csv(tmp_path):
    long = "x" * 260
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="debug", task="tensor")
    dbg.start()
    dbg.save(torch.ones(2), long, save_backward=False)
    dbg.stop()
    dbg.step()
    base = tmp_path / "step0" / "rank" / "dump_tensor_data"
    rows = (base / "mapping.csv").read_text().strip().splitlines()
    short, orig = rows[0].split(",")  # converted name first, as the real tool writes it
    assert orig == f"{long}.0.debug.pt" and len(short) == 35 and (base / short).exists()
    check_invariants(tmp_path)


def test_second_run_into_same_root_refused(tmp_path):
    from msprobe.errors import StoragePermissionError

    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", run_dir_policy="refuse")
    train(dbg, steps=1, start_model=False)
    PrecisionDebugger._reset()
    before = (tmp_path / "step0" / "rank" / "dump.json").read_bytes()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", run_dir_policy="refuse")
    with pytest.raises(StoragePermissionError, match="already holds a dump"):
        dbg.start()
    assert (tmp_path / "step0" / "rank" / "dump.json").read_bytes() == before


def test_index_written_at_publish(tmp_path):
    pytest.importorskip("pyarrow")
    import msprobe.readers

    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix", index=True)
    train(dbg, steps=1)
    assert (tmp_path / "step0" / "rank" / "index" / "records.parquet").exists()
    d = msprobe.readers.open(str(tmp_path))
    df = d.to_pandas()
    data = load(tmp_path)["data"]
    assert set(df["record"]) == set(data)
    row = df[(df["record"] == "Functional.linear.0.forward") & (df["io"] == "output")].iloc[0]
    assert row["max"] == pytest.approx(data["Functional.linear.0.forward"]["output"][0]["Max"])


def test_register_custom_api(tmp_path):
    import types

    mod = types.SimpleNamespace(my_gelu=lambda x: F.gelu(x) * 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    dbg.register_custom_api(mod, "my_gelu", api_prefix="MyOps")
    dbg.start()
    mod.my_gelu(torch.ones(3))
    dbg.stop()
    dbg.restore_custom_api(mod, "my_gelu")
    dbg.step()
    data = load(tmp_path)["data"]
    assert "MyOps.my_gelu.0.forward" in data
    assert "Functional.gelu.0.forward" not in data  # the inner call belongs to the custom API
    assert not getattr(mod.my_gelu, "__msprobe_wrapped__", False)


@pytest.mark.parametrize("journal_fsync", [False, True])
def test_published_documents_are_fsynced_only_with_journal_fsync(tmp_path, monkeypatch, journal_fsync):
    """Documents and the marker are atomic (temp file + rename) either way; an fsync of each (3-9 ms of
    wall time per document on this disk) only with ``journal_fsync`` (power-loss safety), as the journal."""
    synced: list = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = str(tmp_path / "d")
    dbg = PrecisionDebugger(task="statistics", level="L1", dump_path=path, journal_fsync=journal_fsync)
    x = torch.randn(4, 4)
    for _ in range(2):
        dbg.start()
        torch.relu(torch.add(x, 1))
        dbg.stop()
        dbg.step()
    PrecisionDebugger._reset()
    monkeypatch.undo()
    names = {os.path.basename(p).split(".msprobe-tmp-")[0].lstrip(".") for p in synced}
    documents = {"dump.json", "stack.json", "construct.json", "msprobe_lake.json"}
    assert (documents <= names) is journal_fsync and (not (names & documents)) is (not journal_fsync), names
    for step in ("step0", "step1"):
        with open(os.path.join(path, step, "rank", "dump.json")) as f:
            assert list(json.load(f)["data"]) == ["Torch.add.0.forward", "Torch.relu.0.forward"]
    assert not [n for n in os.listdir(os.path.join(path, "step0", "rank")) if "msprobe-tmp" in n]
