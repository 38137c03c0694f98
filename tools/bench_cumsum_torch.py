#!/usr/bin/env python3
"""PyTorch's torch.cumsum on the shapes of bench/bench_cumsum.cpp (the first, third and last are
bench_ops' cumsum rows): 256 MiB of float32 and float16 as (n/4096, 4096) and (n/65536, 65536)
along the last dim, (4096, n/4096) along dim 0, (8, n/8) along the last dim, and one line of
n. GB/s of bytes read + written from the median of 30 timed runs (CUDA events) after 3
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
    print("torch.cumsum on 256 MiB (GB/s of bytes read + written, median)")
    for dtype in (torch.float32, torch.float16):
        n = (256 << 20) // torch.finfo(dtype).bits * 8
        a = torch.randn(n, device="cuda", dtype=dtype)
        for name, x, dim in [("(n/4096, 4096), last dim", a.view(n // 4096, 4096), 1),
                             ("(n/65536, 65536), last dim", a.view(n // 65536, 65536), 1),
                             ("(4096, n/4096), dim 0", a.view(4096, n // 4096), 0),
                             ("(8, n/8), last dim", a.view(8, n // 8), 1),
                             ("one line of n", a, 0)]:
            print(f"  {name:28s} {str(dtype)[6:]:8s} {gbs(lambda: torch.cumsum(x, dim), n * a.element_size()):6.0f}")


if __name__ == "__main__":
    main()
