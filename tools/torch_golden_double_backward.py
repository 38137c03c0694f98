#!/usr/bin/env python3
"""Prints PyTorch's values for tests/cpu/test_double_backward.cpp's gradient penalty and
physics-informed loss (float64, create_graph=True). Inputs are wave(): 0.1 sin(1.3 i + phase)
in row-major order, as the test builds them."""
import math

import torch

torch.set_default_dtype(torch.float64)


def wave(shape, phase, requires_grad=True):
    n = math.prod(shape)
    t = torch.tensor([0.1 * math.sin(1.3 * i + phase) for i in range(n)]).reshape(shape)
    return t.requires_grad_(requires_grad)


def fmt(t):
    return ", ".join(f"{v:.12g}" for v in t.detach().reshape(-1).tolist())


# WGAN-GP: critic linear(4, 8) -> leaky_relu(0.2) -> linear(8, 1) at 3 samples.
w1, b1, w2, b2 = wave((8, 4), 0.0), wave((8,), 1.0), wave((1, 8), 2.0), wave((1,), 3.0)
x = (wave((3, 4), 4.0, False) * 10.0).requires_grad_()
critic = torch.nn.functional.linear(torch.nn.functional.leaky_relu(torch.nn.functional.linear(x, w1, b1), 0.2), w2, b2)
(gx,) = torch.autograd.grad(critic, x, torch.ones_like(critic), create_graph=True)
penalty = ((gx.square().sum(1).sqrt() - 1.0) ** 2).mean()
g = torch.autograd.grad(penalty, (w1, b1, w2), allow_unused=True)
print("penalty", f"{penalty.item():.13g}")
print("d w1 rows 0-1:", fmt(g[0][:2]))
print("d b1 sum:", "None" if g[1] is None else f"{g[1].sum().item():.6g}")
print("d w2:", fmt(g[2]))

# PINN: u(t) = linear(6, 1)(tanh(linear(1, 6)(t))), residual mean((u'' + u)^2) at 5 points.
v1, c1, v2 = wave((6, 1), 5.0), wave((6,), 6.0), wave((1, 6), 7.0)
t = (wave((5, 1), 8.0, False) * 10.0).requires_grad_()
u = torch.nn.functional.linear(torch.tanh(torch.nn.functional.linear(t, v1, c1)), v2)
(ut,) = torch.autograd.grad(u, t, torch.ones_like(u), create_graph=True)
(utt,) = torch.autograd.grad(ut, t, torch.ones_like(ut), create_graph=True)
residual = (utt + u).square().mean()
gr = torch.autograd.grad(residual, (v1, c1, v2))
print("residual", f"{residual.item():.13g}")
print("d v1:", fmt(gr[0]))
print("d v2:", fmt(gr[2]))
