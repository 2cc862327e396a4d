"""The seeded model and training loop the in-process reliability tests dump."""
from __future__ import annotations


def train(dbg, steps=2, seed=11, iters=2):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 6), nn.LayerNorm(6), nn.Linear(6, 3))
    for _ in range(steps):
        x = torch.randn(5, 12)
        dbg.start(model)
        for _ in range(iters):
            loss = F.cross_entropy(model(x), torch.zeros(5, dtype=torch.long))
            loss.backward()
        with torch.no_grad():  # plain SGD: torch.optim imports torch._dynamo (seconds)
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
        dbg.stop()
        dbg.step()
    return model
