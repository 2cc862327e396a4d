"""A float16 overflow in a transformers Llama, as users meet one: 2 steps under torch.autocast
(float16) with layer 1's ``mlp.up_proj`` weight scaled by SCALE (1 for the healthy run; 1e6 makes
that linear overflow to +inf and -inf, and the next one, ``down_proj``, turns them into NaN).

usage: python overflow_llama.py OUT SCALE
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
import transformers as T

from msprobe.pytorch import PrecisionDebugger, seed_all


def main(out: str, scale: float) -> None:
    torch.set_num_threads(1)
    seed_all(1234)
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=out)
    model = T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32, use_cache=False))
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(scale)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(7)
    for _ in range(2):
        x = torch.randint(3, 64, (2, 8), generator=g)
        debugger.start(model=model)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
