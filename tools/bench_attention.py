#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention at the shapes of bench/bench_attention.cpp
(BERT-base, ViT-B/16, T=2048), forward and forward+backward, float16 and bfloat16, timed with
CUDA events (median after warm-up), FLOPs counted as the C++ benchmark counts them.

  python3 tools/bench_attention.py [--quick] [--frugal build/bench/bench_attention]

With --frugal it also runs frugal's benchmark and prints frugal's speed over torch's
(torch ms / frugal ms: above 1 means frugal is faster).
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
]
DTYPES = [(torch.float16, "float16"), (torch.bfloat16, "bfloat16")]


def torch_rows(quick):
    reps = 5 if quick else 20
    rows = {}
    for dtype, dname in DTYPES:
        for name, key, B, H, T, E, causal, p in SHAPES:
            q, k, v, g = (torch.randn(B, H, T, E, device="cuda", dtype=dtype) for _ in range(4))
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            mask = None
            if key == "bert_padding":  # as bench_attention.cpp: odd batches lose their last quarter
                mask = torch.ones(B, 1, 1, T, dtype=torch.bool, device="cuda")
                mask[1::2, ..., T * 3 // 4:] = False
            flops = 4.0 * B * H * T * T * E * (0.5 if causal else 1.0)

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)

            def fwd_bwd():
                out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, dropout_p=p, is_causal=causal)
                torch.autograd.grad(out, (qg, kg, vg), g)

            f_ms, fb_ms = median_ms(fwd, 3, reps), median_ms(fwd_bwd, 3, reps)
            rows[(key, dname)] = (name, f_ms, flops / f_ms * 1e-9, fb_ms, 3.5 * flops / fb_ms * 1e-9)
    return rows


def frugal_figures(binary, quick):
    out = subprocess.run([binary] + (["--quick"] if quick else []), check=True, capture_output=True, text=True).stdout
    print(out)
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(flash_\S+): ([0-9.eE+-]+)$", out, re.M)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--frugal", help="path of frugal's bench_attention binary, to print the ratio")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    rows = torch_rows(args.quick)
    ours = frugal_figures(args.frugal, args.quick) if args.frugal else {}
    head = f"{'shape':<24} {'dtype':<9} {'fwd ms':>8} {'TF/s':>6} {'fwd+bwd ms':>10} {'TF/s':>6}"
    if ours:
        head += f" {'fwd x torch':>11} {'f+b x torch':>11}"
    print("\ntorch scaled_dot_product_attention" + (" vs frugal flash attention" if ours else ""))
    print(head)
    print("-" * len(head))
    for (key, dname), (name, f_ms, f_tf, fb_ms, fb_tf) in rows.items():
        line = f"{name:<24} {dname:<9} {f_ms:8.3f} {f_tf:6.0f} {fb_ms:10.3f} {fb_tf:6.0f}"
        if ours:
            pre = f"flash_{key}_{dname}"
            line += f" {f_ms / ours[pre + '_fwd_ms']:11.2f} {fb_ms / ours[pre + '_fwd_bwd_ms']:11.2f}"
        print(line)


if __name__ == "__main__":
    main()
