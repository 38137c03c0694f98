#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention at the shapes of bench/bench_attention.cpp
(BERT-base, ViT-B/16, T=2048, T=4096), forward and forward+backward, float16 and bfloat16, timed
with CUDA events (median after warm-up), FLOPs counted as the C++ benchmark counts them.

  python3 tools/bench_attention.py [--quick] [--frugal build/bench/bench_attention]

With --frugal it also runs frugal's benchmark twice, with --backend flash (frugal's own
kernels) and --backend cudnn (cuDNN's fused engines, Note [cuDNN attention]), and prints
frugal's speed over torch's (torch ms / frugal ms: above 1 means frugal is faster): over torch's
default choice at every shape, and at the four headline shapes (BERT, ViT, T=2048, T=4096
E=128) over each of torch's SDPA backends forced in turn (cuDNN, flash, memory-efficient).
"""
import argparse
import re
import subprocess

import torch
import torch.nn.functional as F

from cuda_timing import median_ms

# name, key, B, H, T, E, causal, dropout (the rows of bench_attention.cpp)
SHAPES = [
    ("BERT-base", "bert", 64, 12, 128, 64, False, 0.0),
    ("BERT-base, dropout 0.1", "bert_dropout", 64, 12, 128, 64, False, 0.1),
    ("BERT-base, padding mask", "bert_padding", 64, 12, 128, 64, False, 0.0),
    ("ViT-B/16", "vit", 128, 12, 197, 64, False, 0.0),
    ("T=2048", "t2048", 4, 16, 2048, 64, False, 0.0),
    ("T=2048 causal", "t2048_causal", 4, 16, 2048, 64, True, 0.0),
    ("T=2048 E=128", "t2048_e128", 2, 16, 2048, 128, False, 0.0),
    ("T=4096 E=128", "t4096_e128", 2, 16, 4096, 128, False, 0.0),
]
HEADLINE = ["bert", "vit", "t2048", "t4096_e128"]  # compared with each torch backend
DTYPES = [(torch.float16, "float16"), (torch.bfloat16, "bfloat16")]
FRUGAL_BACKENDS = ["flash", "cudnn"]


def torch_backends():
    """(label, context factory) of torch's default choice and of each backend forced alone."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    return [
        ("default", nullcontext),
        ("cudnn", lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
        ("flash", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
        ("efficient", lambda: sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)),
    ]


def time_shape(B, H, T, E, causal, p, key, dtype, reps, context):
    """(fwd ms, fwd+bwd ms) of torch's sdpa under `context`, or None where that backend refuses."""
    q, k, v, g = (torch.randn(B, H, T, E, device="cuda", dtype=dtype) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    mask = None
    if key == "bert_padding":  # as bench_attention.cpp: odd batches lose their last quarter
        mask = torch.ones(B, 1, 1, T, dtype=torch.bool, device="cuda")
        mask[1::2, ..., T * 3 // 4:] = False

    def fwd():
        with context(), torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)

    def fwd_bwd():
        with context():
            out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, dropout_p=p, is_causal=causal)
        torch.autograd.grad(out, (qg, kg, vg), g)

    try:
        return median_ms(fwd, 3, reps), median_ms(fwd_bwd, 3, reps)
    except RuntimeError:  # "No available kernel" for this backend and shape
        return None


def torch_rows(quick):
    """{(key, dtype name): {torch backend: (fwd ms, fwd+bwd ms) or None}}; forced backends at
    the headline shapes only."""
    reps = 5 if quick else 20
    rows = {}
    for dtype, dname in DTYPES:
        for name, key, B, H, T, E, causal, p in SHAPES:
            rows[(key, dname)] = {
                label: time_shape(B, H, T, E, causal, p, key, dtype, reps, context)
                for label, context in torch_backends()
                if label == "default" or key in HEADLINE
            }
    return rows


def frugal_figures(binary, backend, quick):
    cmd = [binary, "--backend", backend] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    print(out)
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(flash_\S+): ([0-9.eE+-]+)$", out, re.M)}


def ratio(torch_ms, ours, name):
    return f"{torch_ms / ours[name]:.2f}" if torch_ms is not None and name in ours else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--frugal", help="path of frugal's bench_attention binary, to print the ratios")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    rows = torch_rows(args.quick)
    ours = {b: frugal_figures(args.frugal, b, args.quick) for b in FRUGAL_BACKENDS} if args.frugal else {}
    names = {key: name for name, key, *_ in SHAPES}

    head = f"{'shape':<24} {'dtype':<9} {'fwd ms':>8} {'TF/s':>6} {'fwd+bwd ms':>10} {'TF/s':>6}"
    for b in ours:
        head += f" {'fwd x ' + b:>11} {'f+b x ' + b:>11}"
    print("\ntorch scaled_dot_product_attention (its default backend)" + (" vs frugal" if ours else ""))
    print(head)
    print("-" * len(head))
    for name, key, B, H, T, E, causal, p in SHAPES:
        flops = 4.0 * B * H * T * T * E * (0.5 if causal else 1.0)
        for _, dname in DTYPES:
            timed = rows[(key, dname)]["default"]
            if timed is None:
                continue
            f_ms, fb_ms = timed
            line = f"{name:<24} {dname:<9} {f_ms:8.3f} {flops / f_ms * 1e-9:6.0f} {fb_ms:10.3f}"
            line += f" {3.5 * flops / fb_ms * 1e-9:6.0f}"
            for b, figures in ours.items():
                pre = f"flash_{key}_{dname}"
                line += f" {ratio(f_ms, figures, pre + '_fwd_ms'):>11} {ratio(fb_ms, figures, pre + '_fwd_bwd_ms'):>11}"
            print(line)

    labels = [label for label, _ in torch_backends()]
    print("\nforward+backward ms at the headline shapes, torch's backends forced one at a time")
    head = f"{'shape':<14} {'dtype':<9}" + "".join(f" {'torch ' + l:>15}" for l in labels)
    head += "".join(f" {'frugal ' + b:>13}" for b in ours)
    print(head)
    print("-" * len(head))
    for key in HEADLINE:
        for _, dname in DTYPES:
            timed = rows[(key, dname)]
            line = f"{names[key]:<14} {dname:<9}"
            line += "".join(f" {timed[l][1]:15.3f}" if timed.get(l) else f" {'-':>15}" for l in labels)
            line += "".join(f" {ours[b].get(f'flash_{key}_{dname}_fwd_bwd_ms', float('nan')):13.3f}" for b in ours)
            print(line)
    if not ours:
        return
    print("\nfrugal's speed over each torch backend (torch ms / frugal ms), forward+backward [forward]")
    head = f"{'shape':<14} {'dtype':<9} {'frugal':<7}" + "".join(f" {'x torch ' + l:>19}" for l in labels)
    print(head)
    print("-" * len(head))
    for key in HEADLINE:
        for _, dname in DTYPES:
            timed = rows[(key, dname)]
            for b, figures in ours.items():
                pre = f"flash_{key}_{dname}"
                line = f"{names[key]:<14} {dname:<9} {b:<7}"
                for l in labels:
                    t = timed.get(l)
                    cell = "-" if t is None else (
                        f"{ratio(t[1], figures, pre + '_fwd_bwd_ms')} [{ratio(t[0], figures, pre + '_fwd_ms')}]")
                    line += f" {cell:>19}"
                print(line)


if __name__ == "__main__":
    main()
