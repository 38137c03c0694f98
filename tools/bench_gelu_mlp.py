#!/usr/bin/env python3
"""PyTorch eager's MLP block with the tanh GELU, F.linear(F.gelu(F.linear(x, w1, b1),
approximate='tanh'), w2, b2), forward and forward+backward at the shapes of bench/bench_gelu_mlp.cpp
(GPT-2 small and medium, 8 x 1024 tokens), float16 and bfloat16, timed with CUDA events (median
after warm-up), and with --frugal that program's variants (gelu_mlp with both, the forward, the
backward or no GEMM epilogue; the block of separate ops), each with torch ms / frugal ms (above
1: frugal is faster).

  python3 tools/bench_gelu_mlp.py [--quick] [--frugal build/bench/bench_gelu_mlp]
"""
import argparse
import re
import subprocess

import torch
import torch.nn.functional as F

from cuda_timing import median_ms

BLOCKS = [("GPT-2 small MLP", "gpt2", 8192, 768, 3072), ("GPT-2 medium MLP", "gpt2_medium", 8192, 1024, 4096)]
DTYPES = [(torch.float16, "float16"), (torch.bfloat16, "bfloat16")]
# bench_gelu_mlp.cpp's variants: gelu_mlp with both, the forward, the backward or no epilogue;
# linear, gelu_tanh, linear as separate ops
VARIANTS = ["both", "forward", "backward", "none", "composed"]


def time_block(tokens, width, hidden, dtype, reps):
    """(fwd ms, fwd+bwd ms) of PyTorch eager's composed block."""
    opts = dict(device="cuda", dtype=dtype)
    x = torch.randn(tokens, width, **opts).requires_grad_()
    w1 = (torch.randn(hidden, width, **opts) * 0.02).requires_grad_()
    w2 = (torch.randn(width, hidden, **opts) * 0.02).requires_grad_()
    b1, b2 = torch.zeros(hidden, **opts).requires_grad_(), torch.zeros(width, **opts).requires_grad_()
    g = torch.randn(tokens, width, **opts)

    def forward():
        return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)

    def forward_backward():
        for t in (x, w1, b1, w2, b2):
            t.grad = None
        forward().backward(g)

    with torch.no_grad():
        fwd = median_ms(forward, 3, reps)
    return fwd, median_ms(forward_backward, 3, reps)


def frugal_figures(binary, quick):
    out = subprocess.run([binary] + (["--quick"] if quick else []), check=True, capture_output=True, text=True).stdout
    return {m[1]: float(m[2]) for m in re.finditer(r"^(gelu_mlp_\w+): ([\d.]+)$", out, re.M)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--frugal", help="path of bench_gelu_mlp")
    a = ap.parse_args()
    figures = frugal_figures(a.frugal, a.quick) if a.frugal else {}
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; forward+backward ms, and torch ms / frugal ms")
    header = f"{'block':<18} {'dtype':<9} {'torch':>7}" + "".join(f" {v:>9} {'x':>5}" for v in VARIANTS)
    print(header + "\n" + "-" * len(header))
    for dtype, dname in DTYPES:
        for name, key, tokens, width, hidden in BLOCKS:
            _, fb = time_block(tokens, width, hidden, dtype, 5 if a.quick else 20)
            line = f"{name:<18} {dname:<9} {fb:>7.3f}"
            for v in VARIANTS:
                ms = figures.get(f"gelu_mlp_{key}_{dname}_{v}_fwd_bwd_ms")
                line += f" {ms:>9.3f} {fb / ms:>5.2f}" if ms else f" {'-':>9} {'-':>5}"
            print(line)


if __name__ == "__main__":
    main()
