#!/usr/bin/env python3
"""PyTorch's F.interpolate, forward and the input gradient, on the cases of
bench/bench_interpolate.cpp: (32, 64, 128, 128) on CUDA (float32 and float16) or (4, 64, 128,
128) on the CPU (float32), contiguous and channels-last, scaled by 2 (nearest, bilinear,
bicubic) and 0.6 (bilinear, bicubic). Milliseconds, the median of --reps timed calls after 3
warm-up calls (host clock, synchronized on CUDA), as the frugal program prints them. The
backward is timed alone: torch.autograd.grad of y with a given grad_output, y computed once.

    python3 tools/bench_interpolate_torch.py [--device cpu|cuda] [--reps N] [--threads N]
"""
import argparse

import torch
import torch.nn.functional as F

from cuda_timing import host_median_ms

CASES = [("nearest x2", 2.0, "nearest"), ("bilinear x2", 2.0, "bilinear"), ("bicubic x2", 2.0, "bicubic"),
         ("bilinear x0.6", 0.6, "bilinear"), ("bicubic x0.6", 0.6, "bicubic")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    gpu = a.device == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    shape = (32, 64, 128, 128) if gpu else (4, 64, 128, 128)
    print(f"torch {torch.__version__} F.interpolate on {a.device} of {list(shape)} (ms, median of {a.reps})")
    print(f"  {'case':14s} {'dtype':8s} {'layout':14s} {'forward':>8s} {'backward':>8s}")
    for dtype in ([torch.float32, torch.float16] if gpu else [torch.float32]):
        for nhwc in (False, True):
            fmt = torch.channels_last if nhwc else torch.contiguous_format
            x = torch.randn(shape, device=a.device, dtype=dtype).contiguous(memory_format=fmt)
            xg = x.clone().requires_grad_()
            for name, scale, mode in CASES:
                fwd = host_median_ms(lambda: F.interpolate(x, scale_factor=scale, mode=mode), a.reps, sync)
                y = F.interpolate(xg, scale_factor=scale, mode=mode)
                gy = torch.randn_like(y)
                bwd = host_median_ms(lambda: torch.autograd.grad(y, xg, gy, retain_graph=True), a.reps, sync)
                layout = "channels-last" if nhwc else "contiguous"
                print(f"  {name:14s} {str(dtype)[6:]:8s} {layout:14s} {fwd:8.3f} {bwd:8.3f}")


if __name__ == "__main__":
    main()
