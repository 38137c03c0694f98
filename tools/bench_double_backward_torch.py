#!/usr/bin/env python3
"""PyTorch's time for bench/bench_double_backward.cpp's WGAN-GP critic step (same sizes, same
threads): median step time in ms. Run next to build/bench/bench_double_backward."""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--in", dest="inp", type=int, default=784)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)

    def param(*shape, scale):
        return (torch.randn(*shape) * scale).to(dev).requires_grad_()

    w1, b1 = param(a.width, a.inp, scale=0.03), param(a.width, scale=0.0)
    w2, b2 = param(a.width, a.width, scale=0.04), param(a.width, scale=0.0)
    w3, b3 = param(1, a.width, scale=0.04), param(1, scale=0.0)
    params = [w1, b1, w2, b2, w3, b3]
    F = torch.nn.functional

    def critic(x):
        h1 = F.leaky_relu(F.linear(x, w1, b1), 0.2)
        h2 = F.leaky_relu(F.linear(h1, w2, b2), 0.2)
        return F.linear(h2, w3, b3)

    real, fake = torch.randn(a.batch, a.inp).to(dev), torch.randn(a.batch, a.inp).to(dev)

    def step():
        eps = torch.rand(a.batch, 1).to(dev)
        mixed = (real * eps + fake * (1 - eps)).detach().requires_grad_()
        score = critic(mixed)
        (gx,) = torch.autograd.grad(score, mixed, torch.ones_like(score), create_graph=True)
        penalty = ((gx.square().sum(1).sqrt() - 1.0) ** 2).mean()
        loss = critic(fake).mean() - critic(real).mean() + 10.0 * penalty
        for p in params:
            p.grad = None
        loss.backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    print(f"torch {torch.__version__} WGAN-GP critic step, batch {a.batch}, {a.device}, {a.threads} threads: "
          f"median {1e3 * times[len(times) // 2]:.2f} ms over {a.steps} steps")


if __name__ == "__main__":
    main()
