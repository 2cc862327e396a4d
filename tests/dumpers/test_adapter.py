"""The framework adapter suite (msprobe.testing.AdapterTests) on PyTorch's dumper."""
from __future__ import annotations

import torch

from msprobe.dumpers.adapter import ApiCall
from msprobe.dumpers.pytorch._dumper import TorchDumper
from msprobe.testing import AdapterTests


class TestTorchAdapter(AdapterTests):
    framework = "pytorch"
    collective_key = "Distributed.all_reduce"
    plain_key = "Torch.relu"

    def make_dumper(self, config):
        return TorchDumper(config)

    def tensor(self, values):
        return torch.tensor(values, dtype=torch.float32)

    def to_numpy(self, t):
        return t.detach().numpy()

    def relu(self, x):
        return torch.relu(x)

    def assign(self, t, value):
        t.fill_(value)

    def grad_of(self, fn, x):
        x = x.clone().requires_grad_(True)
        fn(x).sum().backward()
        return x.grad

    def test_stat_handles_of_the_python_path(self, dumper, monkeypatch):
        """With the C entry off (the path of subclasses, ``MSPROBE_LAKE_NATIVE=0``) a 0-d tensor's
        statistics wait for the batch as a typed handle (a CPU tensor's of more elements are computed
        at once); with it on, both are computed at once (the suite's test above, no handle)."""
        from msprobe.dumpers.pytorch import _encode

        monkeypatch.setattr(_encode, "NATIVE_ENTRY", False)
        made = self.check_stat_handles(dumper)
        assert [entry["shape"] for entry, _ in made] == [[]]

    def test_a_receive_buffer_is_no_data(self, dumper):
        """Who a collective's peers are decides its receive buffers (``receive_buffers``): a ``recv``'s
        tensor before the call is written null, after it (its output) the data received."""
        assert dumper.receive_buffers(ApiCall(None, "Distributed.recv", (torch.zeros(1),), {"src": 1},
                                              "Distributed.recv.0", None, True)) == {0}
        x = torch.zeros(2)
        dumper.start()
        dumper.on_api(lambda t, src: t.fill_(5.0), "Distributed.recv", (x,), {"src": 1})
        dumper.on_api(lambda t, src: t.fill_(6.0), "Distributed.broadcast", (x,), {"src": 1})
        dumper.stop()
        data = self.dump_json(dumper)["data"]
        recv, bcast = data["Distributed.recv.0.forward"], data["Distributed.broadcast.0.forward"]
        assert recv["input_args"] == [None] and recv["output"][0]["Max"] == 5.0
        # a broadcast's tensor on a non-root is a buffer that 26.2.0 records all the same (format.comm)
        assert bcast["input_args"][0]["Max"] == 5.0 and bcast["output"][0]["Max"] == 6.0
