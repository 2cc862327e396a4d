"""The dumpers' per-tensor kernels alone, one torch thread, best of 5 (process CPU microseconds per call).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_kernels.py

Statistics: the C one-pass kernel (msprobe/dumpers/_fastpath.c) against the torch reductions it
replaces (aminmax + mean + vector_norm) and against one sum (the floor); CRC-32: the PCLMUL kernel
against zlib.crc32 over the same memory; a classic .pt file: msprobe/dumpers/pytorch/_ptfile.py
(copy in + finish) against clone + torch.save into bytes.
"""
import io
import time

import torch

from msprobe.dumpers.fastpath import DTYPE_CODES, native
from msprobe.dumpers.pytorch._ptfile import PtFile


def best_us(f, k=30):
    f()
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(k):
            f()
        best = min(best, (time.process_time() - t0) / k * 1e6)
    return best


def main():
    import zlib

    torch.set_num_threads(1)
    fast = native()
    if fast is None:
        raise SystemExit("the extension is not available (MSPROBE_LAKE_NATIVE=0, or no compiler)")
    print(f"SIMD kernels: {bool(fast.SIMD)}, PCLMUL CRC: {bool(fast.HAVE_CLMUL)}")
    print("| tensor | one-pass C | aminmax+mean+norm | one sum | C CRC-32 | zlib.crc32 | .pt ours | clone+torch.save |")
    print("|---|---|---|---|---|---|---|---|")
    for n, dtype in [(256, torch.float32), (256 * 1024, torch.float32), (1024 * 1024, torch.float32),
                     (4 * 1024 * 1024, torch.float32), (1024 * 1024, torch.bfloat16), (1024 * 1024, torch.float16)]:
        x = torch.randn(n).to(dtype)
        code = DTYPE_CODES[str(dtype).replace("torch.", "")]
        nb = x.numel() * x.element_size()
        mv = memoryview(x.view(torch.uint8).numpy())

        def torch3():
            torch.aminmax(x)
            x.mean()
            torch.linalg.vector_norm(x)

        def save():
            b = io.BytesIO()
            torch.save(x.clone(), b)
            return b.getvalue()

        k = 200 if nb < 65536 else 20
        row = [best_us(lambda: fast.stats(x.data_ptr(), n, code), k), best_us(torch3, k), best_us(lambda: x.sum(), k),
               best_us(lambda: fast.crc32(x.data_ptr(), nb), k), best_us(lambda: zlib.crc32(mv), k),
               best_us(lambda: PtFile(x).finish(), k), best_us(save, k)]
        print(f"| {str(dtype)[6:]} x {n} ({nb // 1024} KiB) | " + " | ".join(f"{v:.1f} us" for v in row) + " |")


if __name__ == "__main__":
    main()
