#!/usr/bin/env python3
"""PyTorch's torch.sort(stable=True), torch.argsort(stable=True) and torch.topk on the cases of
bench/bench_sort.cpp (the CPU takes an eighth of the rows). Milliseconds, the median of --reps
timed calls after 3 warm-up calls (host clock, synchronized on CUDA), as the frugal program
prints them.

    python3 tools/bench_sort_torch.py [--device cpu|cuda] [--reps N] [--threads N]
"""
import argparse

import torch

from cuda_timing import host_median_ms

# name, rows, length, dtype, k (0: sort, > 0: topk, < 0: argsort)
CASES = [("sort rows of 128", 8192, 128, torch.float32, 0), ("sort rows of 2048", 2048, 2048, torch.float32, 0),
         ("sort rows of 32768", 64, 32768, torch.float32, 0), ("sort one row of 4M", 1, 1 << 22, torch.float32, 0),
         ("argsort rows of 512", 4096, 512, torch.float16, -1), ("topk 50 of 32000", 256, 32000, torch.float32, 50),
         ("topk 10 of 2048", 4096, 2048, torch.float32, 10),
         ("sort int64 rows of 1024", 2048, 1024, torch.int64, 0)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    gpu = a.device == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    div = 1 if gpu else 8
    print(f"torch {torch.__version__} sort on {a.device} (ms, median of {a.reps})")
    print(f"  {'case':24s} {'shape':14s} {'dtype':8s} {'ms':>8s}")
    for name, rows, length, dtype, k in CASES:
        rows = max(rows // div, 1) if rows > 1 else 1
        length = length // div if rows == 1 else length
        if dtype == torch.int64:
            x = torch.randint(0, 1000, (rows, length), device=a.device)
        else:
            x = torch.randn(rows, length, device=a.device, dtype=dtype)
        if k > 0:
            fn = lambda: torch.topk(x, k)
        elif k < 0:
            fn = lambda: torch.argsort(x, stable=True)
        else:
            fn = lambda: torch.sort(x, stable=True)
        ms = host_median_ms(fn, a.reps, sync)
        print(f"  {name:24s} {str([rows, length]):14s} {str(dtype)[6:]:8s} {ms:8.3f}")


if __name__ == "__main__":
    main()
