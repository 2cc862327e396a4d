"""Dump to s3:// on the local S3 server, read it back with msprobe.readers."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("s3fs")
import torch.nn as nn  # noqa: E402

from msprobe.pytorch import PrecisionDebugger  # noqa: E402
from tests.conftest_s3 import s3_storage_options  # noqa: E402

pytestmark = [pytest.mark.s3, pytest.mark.usefixtures("fresh_debugger")]


def test_tensor_dump_to_s3_round_trip(s3_server, s3_bucket_url):
    import msprobe.readers
    from msprobe.backends import open_store
    from msprobe.readers.validate import validate_store

    opts = s3_storage_options(s3_server)
    url = f"{s3_bucket_url}/runs/run1"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    dbg = PrecisionDebugger(dump_path=url, task="tensor", level="mix", storage_options=opts)
    x = torch.randn(3, 6)
    seen = {}
    hook = model[0].register_forward_hook(lambda m, a, out: seen.update(h=out.detach().clone()))
    dbg.start(model)
    y = model(x)
    y.sum().backward()
    dbg.stop()
    dbg.step()
    hook.remove()
    dbg.dumper.close()

    report = validate_store(open_store(url, storage_options=opts, read_only=True))
    assert report.ok, [str(p) for p in report.errors]
    d = msprobe.readers.open(url, storage_options=opts)
    assert d.steps == [0] and d.task == "tensor" and d.level == "mix"
    rec = d.record("Functional.linear.0.forward", step=0)
    out = rec.output[0].load()
    assert torch.allclose(torch.as_tensor(out), seen["h"])
    inp = d.record("Module.0.Linear.forward.0", step=0).input_args[0].load(framework="torch")
    assert torch.equal(inp, x)
    w = d.record("Module.0.Linear.parameters_grad", step=0).parameters["weight"]
    assert torch.allclose(torch.as_tensor(w[0].load() if isinstance(w, list) else w.load()), model[0].weight.grad)
    # the credentials are nowhere in what was written
    fs = open_store(url, storage_options=opts).child("")
    for key in fs.list_prefix(""):
        if key.endswith(".json"):
            assert b"testing" not in fs.get(key) or key.endswith("stack.json")
