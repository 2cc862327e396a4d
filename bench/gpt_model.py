"""A GPT-2-like model for the dumper benchmarks (our own code; runs under any msprobe)."""
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=1000, hidden=256, heads=4, layers=4, seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


SIZES = {
    "gpt2": dict(vocab=1000, hidden=256, heads=4, layers=4, seq=128, batch=8),
    "opheavy": dict(vocab=1000, hidden=32, heads=4, layers=4, seq=32, batch=4),
    # about 1.07 B parameters (18 x 12 x 2048^2 in the blocks, 2 x 32000 x 2048 in the embedding and head),
    # for bench/gpu/run.sh on a CUDA device
    "1b": dict(vocab=32000, hidden=2048, heads=16, layers=18, seq=512, batch=1),
}


def timed_steps(model, opt, size: dict, batch: int, steps: int, dbg=None, optimizer_in_window: bool = True,
                device: str = "cpu"):
    """Run ``steps`` training steps of ``model`` on random ids (under ``dbg``, a PrecisionDebugger, when
    given); return the wall and process-CPU milliseconds of each step. ``optimizer_in_window=False``
    stops the dump after the backward (the optimizer step runs outside it, as in the docs' example).
    On a CUDA ``device`` each step ends with ``torch.cuda.synchronize()`` (its kernels are in its time)."""
    wall, cpu = [], []
    cuda = device.startswith("cuda")
    for _ in range(steps):
        ids = torch.randint(0, size["vocab"], (batch, size["seq"]), device=device)
        if cuda:
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        if dbg is not None:
            dbg.start(model)
        logits = model(ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, size["vocab"]), ids[:, 1:].reshape(-1))
        loss.backward()
        if dbg is not None and not optimizer_in_window:
            dbg.stop()
        opt.step()
        opt.zero_grad()
        if dbg is not None:
            if optimizer_in_window:
                dbg.stop()
            dbg.step()
        if cuda:
            torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return wall, cpu
