#!/usr/bin/env python3
"""ResNet-50's convolutions on the CPU in PyTorch (oneDNN), the rows of build/bench/bench_conv_cpu:
float32 NCHW, forward, input gradient and weight gradient (torch.ops.aten.convolution_backward,
what autograd calls), the fastest of repeated calls, and the network's sum.

    /usr/bin/python3 tools/bench_conv_cpu_torch.py [--batch 8] [--reps 5] [--threads 2] [--image-size 224] [--cpu-time]
"""
import argparse
import time

LAYERS = [  # (C, H, K, R, stride, count), as bench/bench_conv_cpu.cpp
    (3, 224, 64, 7, 2, 1), (64, 56, 64, 1, 1, 1), (256, 56, 64, 1, 1, 2), (64, 56, 64, 3, 1, 3),
    (64, 56, 256, 1, 1, 4), (256, 56, 128, 1, 1, 1), (128, 56, 128, 3, 2, 1), (256, 56, 512, 1, 2, 1),
    (128, 28, 512, 1, 1, 4), (512, 28, 128, 1, 1, 3), (128, 28, 128, 3, 1, 3), (512, 28, 256, 1, 1, 1),
    (256, 28, 256, 3, 2, 1), (512, 28, 1024, 1, 2, 1), (256, 14, 1024, 1, 1, 6), (1024, 14, 256, 1, 1, 5),
    (256, 14, 256, 3, 1, 5), (1024, 14, 512, 1, 1, 1), (512, 14, 512, 3, 2, 1), (1024, 14, 2048, 1, 2, 1),
    (512, 7, 2048, 1, 1, 3), (2048, 7, 512, 1, 1, 2), (512, 7, 512, 3, 1, 2),
]


CLOCK = time.perf_counter


def min_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = CLOCK()
        fn()
        times.append((CLOCK() - t) * 1e3)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--cpu-time", action="store_true", help="time by the process's CPU time (as bench_conv_cpu --cpu-time)")
    args = ap.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    import torch
    torch.set_num_threads(args.threads)
    conv_bw = torch.ops.aten.convolution_backward
    print(f"ResNet-50 convolutions in torch {torch.__version__} on cpu, float32 NCHW, batch {args.batch} (fastest ms)")
    print(f"  {'layer':24s} {'count':>5s} {'forward':>8s} {'grad_x':>8s} {'grad_w':>8s}")
    total = [0.0, 0.0, 0.0]
    for c, h, k, r, s, count in LAYERS:
        h = h * args.image_size // 224
        x, w = torch.randn(args.batch, c, h, h), torch.randn(k, c, r, r)
        pad = r // 2
        y = torch.nn.functional.conv2d(x, w, None, s, pad)
        gy = torch.randn_like(y)
        f = min_ms(lambda: torch.nn.functional.conv2d(x, w, None, s, pad), args.reps)

        def bw(mask):
            return lambda: conv_bw(gy, x, w, None, [s, s], [pad, pad], [1, 1], False, [0, 0], 1, mask)
        bi = 0.0 if c == 3 else min_ms(bw([True, False, False]), args.reps)
        bwt = min_ms(bw([False, True, False]), args.reps)
        total = [total[0] + count * f, total[1] + count * bi, total[2] + count * bwt]
        print(f"  {f'{r}x{r} {c}->{k}/{s} @{h}':24s} {count:5d} {f:8.2f} {bi:8.2f} {bwt:8.2f}")
    print(f"  {'network':24s} {53:5d} {total[0]:8.1f} {total[1]:8.1f} {total[2]:8.1f}")
    print(f"conv_forward_ms: {total[0]:.3f}\nconv_grad_x_ms: {total[1]:.3f}\nconv_grad_w_ms: {total[2]:.3f}")
    print(f"conv_total_ms: {sum(total):.3f}")


if __name__ == "__main__":
    main()
