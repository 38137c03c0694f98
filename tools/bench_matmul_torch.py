#!/usr/bin/env python3
"""PyTorch's CPU matmul on the sizes of `build/bench/bench_ops` (float32 or bfloat16, square n x n).

Prints one line per size: GFLOP/s, the median of the same number of timed runs after a
warm-up, at the thread count frugal uses (OMP_NUM_THREADS, else every core this process may
run on). Which BLAS PyTorch calls is its build's: Debian's python3-torch calls the system
libblas.so.3, the reference BLAS unless OpenBLAS is installed (`apt-get install
libopenblas0-pthread` makes it the alternative), and the script prints which one it loaded.

    /usr/bin/python3 tools/bench_matmul_torch.py [--quick] [--dtype float32|bfloat16]

bfloat16 runs on oneDNN where the CPU has AVX512-BF16 (bench_ops' bfloat16 table).
"""
import argparse
import os
import statistics
import time

import torch


def blas_in_use():
    """The libblas this process mapped (Linux), e.g. openblas-pthread/libblas.so.3."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line}
        return ", ".join(sorted(libs)) or "unknown"
    except OSError:
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", len(os.sched_getaffinity(0))))
    torch.set_num_threads(threads)
    sizes = [256, 512, 1024] if args.quick else [256, 512, 1024, 2048]
    torch.randn(8, 8) @ torch.randn(8, 8)  # loads the BLAS
    print(f"torch {torch.__version__}, {threads} threads, BLAS: {blas_in_use()}")
    for n in sizes:
        reps = 60 if n <= 256 else 25 if n <= 512 else 11 if n <= 1024 else 5
        if args.quick:
            reps = max(3, reps // 3)
        dtype = getattr(torch, args.dtype)
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        a @ b  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        print(f"n={n} runs={reps} {args.dtype} torch GFLOP/s {2 * n**3 / statistics.median(times) * 1e-9:.1f}")


if __name__ == "__main__":
    main()
