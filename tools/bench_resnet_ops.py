#!/usr/bin/env python3
"""PyTorch's side of bench/bench_resnet_ops.cpp (Note [ResNet op benchmark] there).

Times the same ResNet-50 layers - bias-free conv (float32 weights under float16
autocast), BatchNorm2d in training mode and ReLU, or for a bottleneck's last conv
relu(bn(conv(x)) + residual) - forward and backward, in channels_last (and NCHW),
median of CUDA-event-timed steps after warm-up, cudnn.benchmark on; and the stem's
max pool (3x3, stride 2, padding 1, float16): torch.nn.functional.max_pool2d's forward,
its backward op (max_pool2d_with_indices_backward) and both through autograd. Given the path of
frugal's bench_resnet_ops (--frugal), runs it with the same batch and prints the
frugal / PyTorch ratio per layer from its key figures.

    python3 tools/bench_resnet_ops.py --frugal /tmp/b/bench/bench_resnet_ops [--batch 128] [--quick]
"""
import argparse
import re
import subprocess
import sys

from cuda_timing import median_ms

# name, C, H, K, R, stride, tail: as kLayers in bench/bench_resnet_ops.cpp (same names)
LAYERS = [
    ("stem 7x7/2 3->64 @224", 3, 224, 64, 7, 2, False),
    ("1x1 256->64 @56", 256, 56, 64, 1, 1, False),
    ("3x3 64->64 @56", 64, 56, 64, 3, 1, False),
    ("1x1 64->256 @56 +add", 64, 56, 256, 1, 1, True),
    ("3x3/2 128->128 @56", 128, 56, 128, 3, 2, False),
    ("3x3 128->128 @28", 128, 28, 128, 3, 1, False),
    ("1x1 512->1024/2 @28", 512, 28, 1024, 1, 2, False),
    ("3x3 256->256 @14", 256, 14, 256, 3, 1, False),
    ("1x1 256->1024 @14 +add", 256, 14, 1024, 1, 1, True),
    ("3x3 512->512 @7", 512, 7, 512, 3, 1, False),
    ("1x1 512->2048 @7 +add", 512, 7, 2048, 1, 1, True),
]

# The stem max pool's rows: as kPoolRows in bench/bench_resnet_ops.cpp (same names)
POOL_ROWS = ["max_pool2d 3x3/2 64 @112 forward", "max_pool2d 3x3/2 64 @112 backward",
             "max_pool2d 3x3/2 64 @112 fwd+bwd"]


def time_max_pool(torch, batch, channels_last, reps):
    """Milliseconds of the stem max pool's forward, backward and forward + backward (POOL_ROWS)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    F = torch.nn.functional
    x = torch.randn(batch, 64, 112, 112, device="cuda", dtype=torch.float16).to(memory_format=fmt)
    x.requires_grad_()
    grad = torch.randn(batch, 64, 56, 56, device="cuda", dtype=torch.float16).to(memory_format=fmt)
    inp = x.detach()
    _, indices = F.max_pool2d(inp, 3, 2, 1, return_indices=True)

    def forward():
        F.max_pool2d(x, 3, 2, 1)

    def backward():
        torch.ops.aten.max_pool2d_with_indices_backward(grad, inp, [3, 3], [2, 2], [1, 1], [1, 1], False, indices)

    def step():
        F.max_pool2d(x, 3, 2, 1).backward(grad)
        x.grad = None

    return [median_ms(f, 5, reps) for f in (forward, backward, step)]


def time_layer(torch, layer, batch, channels_last, reps):
    name, C, H, K, R, stride, tail = layer
    dev = "cuda"
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    pad = R // 2
    OH = (H + 2 * pad - R) // stride + 1
    conv = torch.nn.Conv2d(C, K, R, stride=stride, padding=pad, bias=False).to(dev, memory_format=fmt)
    bn = torch.nn.BatchNorm2d(K).to(dev)
    x = torch.randn(batch, C, H, H, device=dev, dtype=torch.float16).to(memory_format=fmt)
    x.requires_grad_(C != 3)  # the stem's input (the image) needs no gradient
    residual = torch.randn(batch, K, OH, OH, device=dev, dtype=torch.float16).to(memory_format=fmt)
    grad = torch.randn(batch, K, OH, OH, device=dev, dtype=torch.float16).to(memory_format=fmt)
    params = [p for p in list(conv.parameters()) + list(bn.parameters())] + ([x] if x.requires_grad else [])

    def step():
        with torch.autocast("cuda", dtype=torch.float16):
            y = bn(conv(x))
            y = torch.relu(y + residual) if tail else torch.relu(y)
        y.backward(grad)
        for p in params:
            p.grad = None

    return median_ms(step, 5, reps)


def frugal_figures(path, batch, quick):
    cmd = [path, "--batch", str(batch)] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    print(out)
    figures = {}
    for line in out.splitlines():
        m = re.match(r"^(nhwc_ms|nchw_ms) (.+): ([0-9.]+)$", line)
        if m:
            figures[(m.group(1), m.group(2))] = float(m.group(3))
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="fewer timed steps")
    ap.add_argument("--frugal", help="path of frugal's bench_resnet_ops, for the ratio")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_resnet_ops.py: PyTorch is not installed; nothing to compare")
        return 0
    if not torch.cuda.is_available():
        print("bench_resnet_ops.py: no CUDA device")
        return 1
    torch.backends.cudnn.benchmark = True
    reps = 5 if args.quick else 20
    figures = frugal_figures(args.frugal, args.batch, args.quick) if args.frugal else {}

    header = ["layer", "torch NCHW", "torch NHWC"] + (["frugal NHWC", "frugal/torch NHWC"] if figures else [])
    rows = []
    total = {"nchw": 0.0, "nhwc": 0.0, "frugal": 0.0}
    for layer in LAYERS:
        nchw = time_layer(torch, layer, args.batch, False, reps)
        nhwc = time_layer(torch, layer, args.batch, True, reps)
        total["nchw"] += nchw
        total["nhwc"] += nhwc
        row = [layer[0], f"{nchw:.3f}", f"{nhwc:.3f}"]
        if figures:
            ours = figures.get(("nhwc_ms", layer[0]), float("nan"))
            total["frugal"] += ours
            row += [f"{ours:.3f}", f"{ours / nhwc:.2f}"]
        rows.append(row)
    last = ["sum of rows", f"{total['nchw']:.3f}", f"{total['nhwc']:.3f}"]
    if figures:
        last += [f"{total['frugal']:.3f}", f"{total['frugal'] / total['nhwc']:.2f}"]
    rows.append(last)
    pool_nchw = time_max_pool(torch, args.batch, False, reps)
    pool_nhwc = time_max_pool(torch, args.batch, True, reps)
    for name, nchw, nhwc in zip(POOL_ROWS, pool_nchw, pool_nhwc):
        row = [name, f"{nchw:.3f}", f"{nhwc:.3f}"]
        if figures:
            ours = figures.get(("nhwc_ms", name), float("nan"))
            row += [f"{ours:.3f}", f"{ours / nhwc:.2f}"]
        rows.append(row)

    print(f"\nPyTorch {torch.__version__} ResNet-50 layers, forward + backward, float16 autocast, "
          f"batch {args.batch}, and the stem max pool (ms, median; ratio < 1: frugal faster)")
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for i, r in enumerate([header] + rows):
        print("  " + "  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            print("  " + "-" * (sum(widths) + 2 * (len(widths) - 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
