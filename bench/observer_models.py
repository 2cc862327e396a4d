"""Observe without changing (issue 40): train a small model 3 steps with or without a dumper and print
a fingerprint of the training's numbers (each step's loss and gradients, every parameter's bytes after
the last step, the RNG state), as one JSON line on stdout.

    python bench/observer_models.py --model llama [--level L0 --task statistics --dump-path DIR]

Run by whichever msprobe is importable (ours with PYTHONPATH, the real one in its venv): without
``--level`` no tool is imported at all. One torch thread, ``torch.use_deterministic_algorithms(True)``,
fixed seeds: two runs without a tool agree bitwise, so a run with the dumper must too.

  llama    transformers LlamaForCausalLM, tiny (RMSNorm, rotary, grouped KV heads), AdamW
  bert     transformers BertForSequenceClassification, tiny, dropout 0.1 on, a padded batch, AdamW
  bnhook   Linear, BatchNorm1d, ReLU, Linear with a user's full backward hook on the BatchNorm, SGD
  resnet   a small ResNet (BatchNorm2d, in-place ReLU, residual additions, a downsampling shortcut), SGD
  identity modules that hand a tensor through unchanged (nn.Identity shortcuts added in place, p=0
           dropouts, one input through several identity adapters, a top-level one whose input was used
           before it) and module outputs used as they are (.to() of a router's logits), SGD
"""
import argparse
import hashlib
import json
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

STEPS = 3
SEED = 1234
V = 64
MODELS = ("llama", "bert", "bnhook", "resnet", "identity")
MARK = "OBSERVER-FINGERPRINT "


def fingerprint_of(stdout: str) -> dict:
    """The fingerprint a run printed (the tools may print lines of their own)."""
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        raise ValueError("no fingerprint in the output: " + stdout[-2000:])
    return json.loads(lines[-1][len(MARK):])


def differences(base: dict, run: dict) -> dict:
    """What ``run`` changed against ``base``: losses, gradients (per step, by name), parameters, RNG."""
    grads = sum(a[n] != b.get(n) for a, b in zip(base["grads"], run["grads"]) for n in a)
    params = sum(base["params"][n] != run["params"].get(n) for n in base["params"])
    return {"losses": sum(x != y for x, y in zip(base["losses"], run["losses"])), "gradients": grads,
            "parameters": params, "buffers": base["buffers"] != run["buffers"], "rng": base["rng"] != run["rng"],
            "grad_norm_0": [base["grad_norms"][0], run["grad_norms"][0]]}


def same(base: dict, run: dict) -> bool:
    d = differences(base, run)
    return not (d["losses"] or d["gradients"] or d["parameters"] or d["buffers"] or d["rng"])


def _seed() -> None:
    random.seed(SEED)
    torch.manual_seed(SEED)
    try:
        import numpy as np

        np.random.seed(SEED)
    except ImportError:  # pragma: no cover
        pass


def _llama():
    import transformers as T

    model = T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32, pad_token_id=0, eos_token_id=1, bos_token_id=2))

    def batch():
        ids = torch.randint(3, V, (2, 8))
        return dict(input_ids=ids, labels=ids)

    return model, batch, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _bert():
    import transformers as T

    model = T.BertForSequenceClassification(T.BertConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, type_vocab_size=2, num_labels=3, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1))

    def batch():
        x = torch.randint(3, V, (2, 8))
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, 5:] = 0
        return dict(input_ids=x * mask, attention_mask=mask, labels=torch.tensor([0, 2]))

    return model, batch, torch.optim.AdamW(model.parameters(), lr=1e-2)


class _BnNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.bn(self.fc1(x))
        return self.fc2(self.act(h) + h)  # the BatchNorm's output used inside and outside the next module


def _bnhook():
    model = _BnNet()
    seen = []
    model.bn.register_full_backward_hook(lambda m, gin, gout: seen.append(gout[0].shape) and None)

    def batch():
        return dict(x=torch.randn(16, 8), target=torch.randint(0, 4, (16,)))

    return model, batch, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


class _Block(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else torch.nn.Sequential(
            torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x if self.down is None else self.down(x)
        return self.relu(out)


class _ResNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(8),
                                         torch.nn.ReLU(inplace=True))
        self.layer1 = _Block(8, 8, 1)
        self.layer2 = _Block(8, 16, 2)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layer2(self.layer1(self.stem(x)))), 1))


def _resnet():
    model = _ResNet()

    def batch():
        return dict(x=torch.randn(4, 3, 8, 8), target=torch.randint(0, 5, (4,)))

    return model, batch, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


class _Adapter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.base, self.drop = torch.nn.Linear(8, 8), torch.nn.Identity()
        self.a, self.b = torch.nn.Linear(8, 2, bias=False), torch.nn.Linear(2, 8, bias=False)

    def forward(self, x):
        return self.base(x) + self.b(self.a(self.drop(x)))


class _Router(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.out, self.shortcut = torch.nn.Linear(8, 4), torch.nn.Linear(8, 8), torch.nn.Identity()

    def forward(self, h):
        logits = self.gate(h)
        out = self.out(h) * torch.softmax(logits, -1).sum(-1, keepdim=True)
        out += self.shortcut(h)
        return out, logits


class _Identity(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.norm, self.drop = torch.nn.Embedding(V, 8), torch.nn.LayerNorm(8), torch.nn.Dropout(0.0)
        self.q, self.k, self.router = _Adapter(), _Adapter(), _Router()
        self.side, self.passed, self.fc = torch.nn.Linear(8, 8), torch.nn.Identity(), torch.nn.Linear(8, 5)

    def forward(self, x):
        h = self.drop(self.norm(self.embed(x)))
        h = self.q(h) * torch.sigmoid(self.k(h))
        h, logits = self.router(h)
        h = self.side(h) + self.passed(h) * 2.0
        return self.fc(h.mean(1)), logits


def _identity():
    model = _Identity()

    def batch():
        return dict(x=torch.randint(0, V, (4, 6)), target=torch.randint(0, 5, (4,)))

    return model, batch, torch.optim.SGD(model.parameters(), lr=0.05)


def _loss(name: str, model, b):
    if name in ("llama", "bert"):
        return model(**b).loss
    if name == "identity":
        out, logits = model(b["x"])
        return torch.nn.functional.cross_entropy(out, b["target"]) + logits.to(out.device).pow(2).mean()
    return torch.nn.functional.cross_entropy(model(b["x"]), b["target"])


def _sha(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t is not None else b"none")
    return h.hexdigest()[:16]


def train(name: str, debugger=None, seeded: bool = False) -> dict:
    """The fingerprint of 3 training steps of model ``name`` (under ``debugger`` when given; ``seeded``:
    seeded by msprobe's ``seed_all`` (deterministic mode, dropout removed) instead of by hand)."""
    if seeded:
        from msprobe.pytorch import seed_all

        seed_all(SEED, mode=True, rm_dropout=True)
    else:
        _seed()
    model, batch, opt = {"llama": _llama, "bert": _bert, "bnhook": _bnhook, "resnet": _resnet,
                         "identity": _identity}[name]()
    model.train()
    fp: dict = {"losses": [], "grad_norms": [], "grads": []}
    for _ in range(STEPS):
        b = batch()
        if debugger is not None:
            debugger.start(model)
        loss = _loss(name, model, b)
        loss.backward()
        if debugger is not None:
            debugger.stop()
        named = [(n, p.grad) for n, p in model.named_parameters()]
        fp["losses"].append(loss.item())
        fp["grad_norms"].append(sum(float(g.double().pow(2).sum()) for _, g in named if g is not None) ** 0.5)
        fp["grads"].append({n: _sha([g]) for n, g in named})
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.step()
    fp["params"] = {n: _sha([p]) for n, p in model.named_parameters()}
    fp["buffers"] = _sha([b for _, b in model.named_buffers()])
    fp["rng"] = _sha([torch.get_rng_state()])
    return fp


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--level", choices=("L0", "L1", "mix"))
    ap.add_argument("--task", default="statistics", choices=("statistics", "md5", "tensor"))
    ap.add_argument("--dump-path", default="./observer_dump")
    ap.add_argument("--seed-all", action="store_true", help="seed with msprobe's seed_all (mode, rm_dropout)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    debugger = None
    if a.level:
        from msprobe.pytorch import PrecisionDebugger

        cfg = {"task": "statistics" if a.task == "md5" else a.task, "dump_path": a.dump_path, "rank": [],
               "step": [], "level": a.level, "enable_dataloader": False}
        cfg[cfg["task"]] = {"scope": [], "list": [], "data_mode": ["all"],
                            **({"summary_mode": "md5"} if a.task == "md5" else {})}
        path = os.path.join(os.path.dirname(os.path.abspath(a.dump_path)) or ".",
                            f"observer_{a.model}_{a.level}_{a.task}.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        debugger = PrecisionDebugger(config_path=path)  # before the model, as the docs show
    print(MARK + json.dumps(train(a.model, debugger, a.seed_all)))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
