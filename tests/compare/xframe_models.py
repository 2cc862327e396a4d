"""The same three tiny models in MindSpore and in PyTorch, with the same weights and inputs, dumped
by our dumpers: the cross-framework compare pairs (tests/compare/test_compare_xframe.py).

usage: python xframe_models.py --framework mindspore|pytorch --model mlp|block|conv
       --task statistics|md5|tensor --level L1|L0|mix --out DIR

Runs one training step (forward, a mean-squared loss, backward) under the debugger, started with
the model. The weights and the input come from a seeded numpy generator, so both frameworks
start from the same values. Run the MindSpore side in the MindSpore venv (tests/dumpers/mindspore/
ms_venv.py), the PyTorch side in the test environment.
"""
import argparse
import json
import os

import numpy as np

D, H, FF, SEQ, BATCH = 8, 2, 16, 4, 2


def weights(model: str) -> dict:
    """{parameter: array} of ``model``, the PyTorch names (MindSpore's gamma/beta renamed)."""
    rng = np.random.default_rng({"mlp": 11, "block": 12, "conv": 13}[model])

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    if model == "mlp":
        return {"fc1.weight": w(16, 8), "fc1.bias": w(16), "fc2.weight": w(4, 16), "fc2.bias": w(4)}
    if model == "conv":
        return {"conv.weight": w(3, 1, 3, 3), "conv.bias": w(3), "fc.weight": w(2, 3 * 4 * 4), "fc.bias": w(2)}
    out = {}
    for name in ("q", "k", "v", "o"):
        out[f"attn.{name}.weight"], out[f"attn.{name}.bias"] = w(D, D), w(D)
    out.update({"ln1.weight": 1 + w(D), "ln1.bias": w(D), "ln2.weight": 1 + w(D), "ln2.bias": w(D),
                "ff1.weight": w(FF, D), "ff1.bias": w(FF), "ff2.weight": w(D, FF), "ff2.bias": w(D)})
    return out


def batch(model: str) -> np.ndarray:
    rng = np.random.default_rng(99)
    shape = {"mlp": (BATCH, 8), "conv": (BATCH, 1, 4, 4), "block": (BATCH, SEQ, D)}[model]
    return rng.standard_normal(shape).astype(np.float32)


def torch_model(model: str):
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.relu, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)

        def forward(self, x):
            return torch.tanh(self.fc2(self.relu(self.fc1(x))))

    class Conv(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.relu, self.fc = nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Linear(48, 2)

        def forward(self, x):
            h = self.relu(self.conv(x))
            return self.fc(h.reshape(h.shape[0], -1))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = (p(x).reshape(b, s, H, D // H).transpose(1, 2) for p in (self.q, self.k, self.v))
            scores = torch.matmul(q, k.transpose(-1, -2)) / float(np.sqrt(D // H))
            att = torch.matmul(torch.softmax(scores, dim=-1), v)
            return self.o(att.transpose(1, 2).reshape(b, s, D))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm(D), Attention(), nn.LayerNorm(D)
            self.ff1, self.ff2 = nn.Linear(D, FF), nn.Linear(FF, D)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.ff2(torch.nn.functional.gelu(self.ff1(self.ln2(x))))

    net = {"mlp": MLP, "conv": Conv, "block": Block}[model]()
    with torch.no_grad():
        for name, param in net.named_parameters():
            param.copy_(torch.from_numpy(weights(model)[name]))
    return net


def ms_model(model: str):
    import mindspore
    from mindspore import mint, nn, ops

    class MLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1, self.relu, self.fc2 = nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4)

        def construct(self, x):
            return ops.tanh(self.fc2(self.relu(self.fc1(x))))

    class Conv(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 3, 3, pad_mode="pad", padding=1, has_bias=True)
            self.relu, self.fc = nn.ReLU(), nn.Dense(48, 2)

        def construct(self, x):
            h = self.relu(self.conv(x))
            return self.fc(h.reshape(h.shape[0], -1))

    class Attention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = nn.Dense(D, D), nn.Dense(D, D), nn.Dense(D, D), nn.Dense(D, D)

        def construct(self, x):
            b, s, _ = x.shape
            q = self.q(x).reshape(b, s, H, D // H).swapaxes(1, 2)
            k = self.k(x).reshape(b, s, H, D // H).swapaxes(1, 2)
            v = self.v(x).reshape(b, s, H, D // H).swapaxes(1, 2)
            scores = mint.matmul(q, k.swapaxes(-1, -2)) / float(np.sqrt(D // H))
            att = mint.matmul(mint.softmax(scores, dim=-1), v)
            return self.o(att.swapaxes(1, 2).reshape(b, s, D))

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm((D,), epsilon=1e-5), Attention(), nn.LayerNorm((D,), epsilon=1e-5)
            self.ff1, self.ff2 = nn.Dense(D, FF), nn.Dense(FF, D)

        def construct(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.ff2(ops.gelu(self.ff1(self.ln2(x)), approximate="none"))

    net = {"mlp": MLP, "conv": Conv, "block": Block}[model]()
    values = weights(model)
    for param in net.get_parameters():
        name = param.name.replace(".gamma", ".weight").replace(".beta", ".bias")
        param.set_data(mindspore.Tensor(values[name]))
    return net


def run_torch(model: str, config: str) -> None:
    import torch

    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    net = torch_model(model)
    debugger = PrecisionDebugger(config_path=config)
    x = torch.from_numpy(batch(model))
    debugger.start(model=net)
    loss = (net(x) ** 2).mean()
    loss.backward()
    debugger.stop()
    debugger.step()
    print(f"loss {float(loss):.6f}")


def run_mindspore(model: str, config: str) -> None:
    import mindspore
    from mindspore import Tensor

    from msprobe.mindspore import PrecisionDebugger

    mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")
    net = ms_model(model)
    debugger = PrecisionDebugger(config_path=config)

    def forward(x):
        return (net(x) ** 2).mean()

    grad_fn = mindspore.value_and_grad(forward, None, net.trainable_params())
    debugger.start(model=net)
    loss, _ = grad_fn(Tensor(batch(model)))
    debugger.stop()
    debugger.step()
    print(f"loss {float(loss.asnumpy()):.6f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", required=True, choices=["mindspore", "pytorch"])
    ap.add_argument("--model", required=True, choices=["mlp", "block", "conv"])
    ap.add_argument("--task", default="statistics", choices=["statistics", "md5", "tensor"])
    ap.add_argument("--level", default="mix", choices=["L0", "L1", "mix"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    config = os.path.join(args.out, "config.json")
    task = "statistics" if args.task == "md5" else args.task
    cfg = {"task": task, "dump_path": args.out, "rank": [], "step": [], "level": args.level,
           task: {"scope": [], "list": [], "data_mode": ["all"]}}
    if args.task == "md5":
        cfg[task]["summary_mode"] = "md5"
    with open(config, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    (run_mindspore if args.framework == "mindspore" else run_torch)(args.model, config)


if __name__ == "__main__":
    main()
