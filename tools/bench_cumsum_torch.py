#!/usr/bin/env python3
"""PyTorch's torch.cumsum on the shapes of bench_ops' cumsum rows (bench/bench_ops_cuda.cpp):
256 MiB of float32 as (n/4096, 4096) along the last dim, (4096, n/4096) along dim 0, and one
line of n. GB/s of bytes read + written from the median of 30 timed runs (CUDA events) after 3
warm-up runs, printed in bench_ops' units so the two tables compare row by row.

    python3 tools/bench_cumsum_torch.py
"""
import statistics

import torch


def gbs(fn, nbytes, reps=30):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * nbytes / statistics.median(times) * 1e-9


def main():
    n = (256 << 20) // 4
    a = torch.randn(n, device="cuda")
    rows, columns = a.view(n // 4096, 4096), a.view(4096, n // 4096)
    print("torch.cumsum on 256 MiB float32 (GB/s of bytes read + written, median)")
    for name, fn in [("cumsum, last dim of (n/4096, 4096)", lambda: torch.cumsum(rows, 1)),
                     ("cumsum, dim 0 of (4096, n/4096)", lambda: torch.cumsum(columns, 0)),
                     ("cumsum, one line of n", lambda: torch.cumsum(a, 0))]:
        print(f"  {name:36s} {gbs(fn, n * 4):6.0f}")


if __name__ == "__main__":
    main()
