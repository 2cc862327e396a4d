"""Fault injection for the localisation benchmark (bench/bench_localisation.py) and its small
version in the tests (tests/compare/test_localisation.py).

:func:`train` trains one of a few small models of our own for some steps under
msprobe.pytorch's PrecisionDebugger (statistics, level mix, Adam) with one known fault injected,
and returns where the fault is: the module (or API) it lives in, the step and the rank. The
healthy run (``fault="none"``) with the same seed and data is the bench.

Fault kinds (:data:`KINDS`):

* ``weight_scale``: a layer's weight multiplied by 1.05 from the first step on;
* ``dtype_lower``: one layer computes in bfloat16 (its input and parameters cast, its output cast back);
* ``nan`` / ``inf``: one weight element set to NaN / +inf before one step (of one rank);
* ``api_wrong``: one API replaced by a slightly wrong one (``gelu``: the tanh approximation,
  ``tanh``: both computed in bfloat16, ~0.4 % off), recorded under the API's own name;
* ``rank_wrong``: a 2-rank gloo DDP run where one rank's weight is off by 1 % at one step;
* ``layer_skip``: a layer left out of the forward pass.

Run as a script (``python bench/faults.py MODEL FAULT OUT``) it trains one run (the DDP runs
spawn their ranks this way: ``--rank R --world 2``).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any, Optional

KINDS = ("weight_scale", "dtype_lower", "nan", "inf", "api_wrong", "rank_wrong", "layer_skip")
MODELS = ("gpt", "tfm", "mlp")
#: Hugging Face transformers models as users train them (tiny configs, no downloads)
HF_MODELS = ("llama", "bert")
STEPS = 3


def _models() -> dict:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attn(nn.Module):
        """Causal self-attention; ``full_mask``: the mask is ``torch.full(-inf).triu(1)`` added to
        the scores (else ``masked_fill(-inf)``)."""

        def __init__(self, h: int, heads: int, full_mask: bool):
            super().__init__()
            self.heads, self.full_mask = heads, full_mask
            self.qkv = nn.Linear(h, 3 * h)
            self.proj = nn.Linear(h, h)

        def forward(self, x: Any) -> Any:
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(c, dim=2)
            q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
            att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(c // self.heads)
            if self.full_mask:
                att = att + torch.full((t, t), float("-inf")).triu(1)
            else:
                att = att.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
            y = torch.matmul(F.softmax(att, dim=-1), v).transpose(1, 2).reshape(b, t, c)
            return self.proj(y)

    class Block(nn.Module):
        def __init__(self, h: int, heads: int, full_mask: bool):
            super().__init__()
            self.ln1 = nn.LayerNorm(h)
            self.attn = Attn(h, heads, full_mask)
            self.ln2 = nn.LayerNorm(h)
            self.fc = nn.Linear(h, 4 * h)
            self.out = nn.Linear(4 * h, h)

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self, full_mask: bool, vocab: int = 64, h: int = 32, layers: int = 3):
            super().__init__()
            self.tok = nn.Embedding(vocab, h)
            self.blocks = nn.ModuleList(Block(h, 2, full_mask) for _ in range(layers))
            self.ln_f = nn.LayerNorm(h)
            self.head = nn.Linear(h, vocab, bias=False)
            self.skip: Optional[int] = None

        def forward(self, ids: Any) -> Any:
            x = self.tok(ids)
            for i, blk in enumerate(self.blocks):
                if i != self.skip:
                    x = blk(x)
            return self.head(self.ln_f(x))

        def batch(self, g: Any) -> Any:
            return torch.randint(0, 64, (4, 12), generator=g)

        def loss(self, out: Any, ids: Any) -> Any:
            return F.cross_entropy(out[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
            self.head = nn.Linear(16, 1)
            self.skip: Optional[int] = None

        def forward(self, x: Any) -> Any:
            for i, lin in enumerate(self.blocks):
                if i != self.skip:
                    x = torch.tanh(lin(x))
            return self.head(x)

        def batch(self, g: Any) -> Any:
            return torch.randn(8, 16, generator=g)

        def loss(self, out: Any, x: Any) -> Any:
            return (out.squeeze(-1) - x.sum(-1)).pow(2).mean()

    return {"gpt": lambda: LM(False), "tfm": lambda: LM(True), "mlp": MLP, "llama": _hf_llama, "bert": _hf_bert}


def _hf_llama() -> Any:
    """transformers' LlamaForCausalLM (3 layers, hidden 32), next-token loss on its logits."""
    import torch
    import torch.nn.functional as F
    import transformers as T

    model = T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        use_cache=False))
    model.batch = lambda g: torch.randint(3, 64, (4, 8), generator=g)
    model.loss = lambda out, x: F.cross_entropy(out.logits[:, :-1].reshape(-1, 64), x[:, 1:].reshape(-1))
    return model


def _hf_bert() -> Any:
    """transformers' BertForSequenceClassification (3 layers, hidden 32), 3 classes."""
    import torch
    import torch.nn.functional as F
    import transformers as T

    model = T.BertForSequenceClassification(T.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    model.batch = lambda g: torch.randint(3, 64, (4, 8), generator=g)
    model.loss = lambda out, x: F.cross_entropy(out.logits, x[:, 0] % 3)
    return model


def _layer(model_name: str) -> tuple:
    """(module path of the faulty layer, the API replaced by api_wrong, the block skipped)."""
    if model_name == "mlp":
        return "blocks.1", "tanh", "blocks.2"
    if model_name == "llama":
        return "model.layers.1.mlp.down_proj", "silu", "model.layers.1"
    if model_name == "bert":
        return "bert.encoder.layer.1.intermediate.dense", "gelu", "bert.encoder.layer.1"
    return "blocks.1.fc", "gelu", "blocks.1"


def place(model_name: str, kind: str, world: int = 1) -> dict:
    """Where ``kind`` is injected: {module, api, step, rank} (module: the module path, e.g.
    ``blocks.1.fc``; api: the replaced API's name for api_wrong)."""
    layer, api, skipped = _layer(model_name)
    step = {"nan": 1, "inf": 2, "rank_wrong": 1}.get(kind, 0)
    rank = 1 if kind == "rank_wrong" else (0 if world > 1 else None)
    return {"kind": kind, "model": model_name, "module": skipped if kind == "layer_skip" else layer,
            "api": api if kind == "api_wrong" else None, "step": step, "rank": rank}


def _wrong_api(api: str) -> None:
    """Replace torch's ``api`` by a slightly wrong one (before the debugger wraps it)."""
    import torch
    import torch.nn.functional as F

    if api == "gelu":  # the tanh approximation, computed in bfloat16 (a kernel of lower precision)
        right = F.gelu
        F.gelu = lambda x, approximate="none": right(x.bfloat16(), approximate="tanh").to(x.dtype)  # type: ignore[assignment]
    elif api == "silu":  # computed in bfloat16
        silu = F.silu
        F.silu = lambda x, inplace=False: silu(x.bfloat16()).to(x.dtype)  # type: ignore[assignment]
    else:  # computed in bfloat16
        right = torch.tanh
        torch.tanh = lambda x, *a, **k: right(x.bfloat16(), *a, **k).to(x.dtype)  # type: ignore[assignment]


def train(model_name: str, fault: str, out: str, *, rank: Optional[int] = None, world: int = 1,
          steps: Optional[int] = None, task: str = "statistics") -> dict:
    """Train ``model_name`` with ``fault`` ("none" for the bench), dumping into ``out`` (``task``
    "tensor": one step, with the tensors, for run_ut); returns :func:`place` (None for "none")."""
    where = place(model_name, fault, world) if fault != "none" else None
    if fault == "api_wrong":
        _wrong_api(where["api"])  # type: ignore[index]
    import torch

    from msprobe.pytorch import PrecisionDebugger, seed_all

    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world)
    seed_all(1234)
    torch.set_num_threads(1)
    # before the model, as msprobe's docs show: a model that keeps a function at construction
    # (transformers' GELUActivation holds F.gelu) then keeps the wrapped one
    debugger = PrecisionDebugger(task=task, level="mix", dump_path=out)
    model = _models()[model_name]()
    layer = model.get_submodule(where["module"]) if where else None
    if fault == "weight_scale":
        with torch.no_grad():
            layer.weight.mul_(1.05)  # type: ignore[union-attr]
    if fault == "dtype_lower":
        import torch.nn.functional as F

        def lowered(x: Any) -> Any:
            w, b = layer.weight, layer.bias  # type: ignore[union-attr]
            return F.linear(x.bfloat16(), w.bfloat16(), None if b is None else b.bfloat16()).float()

        layer.forward = lowered  # type: ignore[union-attr,method-assign]
    if fault == "layer_skip" and model_name in HF_MODELS:  # the layer hands its input on, its children unrun
        layer.forward = lambda hidden_states, *a, **k: hidden_states  # type: ignore[union-attr,method-assign]
    elif fault == "layer_skip":
        model.skip = int(where["module"].split(".")[1])  # type: ignore[index]
    net: Any = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(7 + (rank or 0))
    for step in range(steps or (1 if task == "tensor" else STEPS)):
        if fault in ("nan", "inf", "rank_wrong") and step == where["step"] \
                and (where["rank"] is None or where["rank"] == rank):  # type: ignore[index]
            with torch.no_grad():
                w = layer.weight  # type: ignore[union-attr]
                if fault == "rank_wrong":
                    w.mul_(1.01)
                else:
                    w[0, 0] = float("nan") if fault == "nan" else float("inf")
        x = model.batch(g)
        debugger.start(net)
        loss = model.loss(net(x), x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return where  # type: ignore[return-value]


def run(model_name: str, fault: str, out: str, *, world: int = 1, python: str = sys.executable,
        task: str = "statistics") -> Optional[dict]:
    """:func:`train` in fresh processes (one per rank; 2-rank gloo for rank_wrong)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 2000), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                     env.get("PYTHONPATH")) if p)
    cmd = [python, os.path.abspath(__file__), model_name, fault, out, "--world", str(world), "--task", task]
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(world)]
    for p in procs:
        o, e = p.communicate(timeout=600)
        if p.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {e[-2000:]}")
    return place(model_name, fault, world) if fault != "none" else None


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=MODELS + HF_MODELS)
    ap.add_argument("fault", choices=("none",) + KINDS)
    ap.add_argument("out")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--task", default="statistics", choices=("statistics", "tensor"))
    a = ap.parse_args()
    res = train(a.model, a.fault, a.out, rank=a.rank if a.world > 1 else None, world=a.world, task=a.task)
    print(json.dumps(res))
