"""The code examples of the PyTorch dump docs (seeds 05.data_dump_PyTorch.md, 8.1.1 docs 05 and
28.debugger_save_instruction.md), written as the docs write them, runnable with whichever
``msprobe`` is importable (ours, or the real mindstudio-probe in its venv).

usage: python pt_examples.py EXAMPLE [CONFIG_JSON]   (run in the directory the dump goes to)

Each example is one function below named after the docs' section; the records each one must
produce are in tests/dumpers/test_docs_pytorch.py.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

EXAMPLES = {}


def example(fn):
    EXAMPLES[fn.__name__] = fn
    return fn


class ModuleOP(nn.Module):  # the docs' network
    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features=8, out_features=4)
        self.linear_2 = nn.Linear(in_features=4, out_features=2)

    def forward(self, x):
        x1 = self.linear_1(x)
        x2 = self.linear_2(x1)
        r1 = F.relu(x2)
        return r1


def _loader(n=2):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(10, 8, generator=g), torch.randint(0, 2, (10,), generator=g)) for _ in range(n)]


@example
def quick_start(config):
    """'快速上手' (8.1.1): PrecisionDebugger() with no config (or config_path), start(model), stop, no step()."""
    from msprobe.pytorch import PrecisionDebugger, seed_all
    seed_all()
    debugger = PrecisionDebugger(config_path=config) if config else PrecisionDebugger()
    module = ModuleOP()
    debugger.start(model=module)
    x = torch.randn(10, 8)
    out = module(x)
    loss = out.sum()
    loss.backward()
    debugger.stop()


@example
def full_forward_backward(config):
    """2.1 '采集完整的前反向数据': start / forward / backward / stop / step per batch."""
    from msprobe.pytorch import PrecisionDebugger, seed_all
    seed_all()
    debugger = PrecisionDebugger(config_path=config, dump_path="./dump_path")
    model = ModuleOP()
    for data, label in _loader():
        debugger.start(model=model)
        output = model(data)
        loss = F.cross_entropy(output, label)
        loss.backward()
        debugger.stop()
        debugger.step()


@example
def stop_before_backward(config):
    """1.3 stop: 'stop before the backward code needs step() after the backward code' to collect
    the forward and backward of the calls between start and stop."""
    from msprobe.pytorch import PrecisionDebugger, seed_all
    seed_all()
    debugger = PrecisionDebugger(config_path=config, dump_path="./dump_path")
    model = ModuleOP()
    for data, label in _loader():
        debugger.start(model=model)
        output = model(data)
        debugger.stop()
        loss = F.cross_entropy(output, label)
        loss.backward()
        debugger.step()


@example
def forward_backward_dump_end(config):
    """2.2 '采集指定代码块的前反向数据': forward_backward_dump_end() after the forward, step() after backward."""
    from msprobe.pytorch import PrecisionDebugger, seed_all
    seed_all()
    debugger = PrecisionDebugger(config_path=config, dump_path="./dump_path")
    model = ModuleOP()
    for data, label in _loader():
        debugger.start(model=model)
        output = model(data)
        debugger.forward_backward_dump_end()
        loss = F.cross_entropy(output, label)
        loss.backward()
        debugger.step()


@example
def module_dump(config):
    """2.3 '采集函数模块化数据': module_dump(module, "MyModuleOP") / module_dump_end() inside start/stop."""
    from msprobe.pytorch import PrecisionDebugger, module_dump, module_dump_end
    debugger = PrecisionDebugger(config_path=config)
    module = ModuleOP()
    debugger.start()
    x = torch.randn(10, 8)
    x = x * 2                          # between start and module_dump: dumped as usual
    module_dump(module, "MyModuleOP")
    out = module(x)                    # the module's children and APIs: not dumped
    module_dump_end()
    loss = out.sum()                   # between module_dump_end and stop: dumped as usual
    loss.backward()
    debugger.stop()


@example
def cross_file(config):
    """2.4 '跨文件采集数据': PrecisionDebugger created in train.py, PrecisionDebugger.start()/stop()
    called inside the model's forward in module.py; no step()."""
    from msprobe.pytorch import PrecisionDebugger
    debugger = PrecisionDebugger(config_path=config)  # noqa: F841 (train.py)

    class CrossFileModuleOP(ModuleOP):  # module.py
        def forward(self, x):
            PrecisionDebugger.start()
            x1 = self.linear_1(x)
            PrecisionDebugger.stop()
            x2 = self.linear_2(x1)
            r1 = F.relu(x2)
            return r1

    module = CrossFileModuleOP()
    x = torch.randn(10, 8)
    out = module(x)
    loss = out.sum()
    loss.backward()


@example
def debug_save(config):
    """28 '单点保存': level debug, PrecisionDebugger.save of the docs' dict, and of a tensor with its grad."""
    from msprobe.pytorch import PrecisionDebugger
    if config:
        debugger = PrecisionDebugger(config)
    else:
        debugger = PrecisionDebugger(dump_path="dump_path", level="debug")
    w = torch.ones(3, requires_grad=True)
    for step in range(2):
        dict_variable = {"key1": "value1", "key2": [1, 2]}
        PrecisionDebugger.save(dict_variable, "dict_variable", save_backward=False)
        y = w * (step + 2)
        PrecisionDebugger.save(y, "y")
        y.sum().backward()
        debugger.step()


@example
def custom_api(config):
    """1.11/1.12 register_custom_api(torch, "matmul", "torch") / restore_custom_api(torch, "matmul")."""
    from msprobe.pytorch import PrecisionDebugger
    debugger = PrecisionDebugger(config_path=config)
    debugger.register_custom_api(torch, "matmul", "torch")
    a = torch.randn(3, 4)
    debugger.start()
    torch.matmul(a, a.t())
    debugger.stop()
    debugger.restore_custom_api(torch, "matmul")
    debugger.start()
    torch.matmul(a, a.t())
    debugger.stop()
    debugger.step()


@example
def config_run(config):
    """Any config.json of 02.config_introduction on a model with every kind of record (for the
    config-key tests): 2 steps of start(model) / forward / backward / optimizer step / stop / step."""
    from msprobe.pytorch import PrecisionDebugger, seed_all
    seed_all()
    debugger = PrecisionDebugger(config_path=config)
    model = ModuleOP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (data, label) in enumerate(_loader()):
        if str(step) in os.environ.get("DOC_INJECT_INF", "").split(","):  # overflow_check: an inf input
            data = data.clone()
            data[0, 0] = float("inf")
        debugger.start(model=model)
        output = model(data)
        loss = F.cross_entropy(output, label)
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()


if __name__ == "__main__":
    EXAMPLES[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2 else None)
    print(json.dumps({"done": sys.argv[1]}))
