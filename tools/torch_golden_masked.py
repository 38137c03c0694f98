#!/usr/bin/env python3
"""PyTorch's values for tests/cpu/test_masked_ops.cpp (isnan/isinf/isfinite, nonzero,
masked_select and lerp, values and gradients). The inputs are small formulas the test
rebuilds; this prints the expected results as C++ initializers to paste into the test.

    /usr/bin/python3 tools/torch_golden_masked.py    (PyTorch 1.13, CPU)
"""
import math

import torch


def lst(t):
    return "{" + ", ".join(fmt(v) for v in t.reshape(-1).tolist()) + "}"


def fmt(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "kNaN"
    if math.isinf(v):
        return "kInf" if v > 0 else "-kInf"
    return repr(float(v))


def special():
    """The 12 values of the classification and nonzero cases, as a (3, 4) tensor."""
    inf, nan = float("inf"), float("nan")
    return torch.tensor([[0.0, -0.0, 1.5, nan], [inf, -inf, 0.0, -2.0], [nan, 3.0, -0.0, 1e-40]], dtype=torch.float64)


def ramp(shape, dtype=torch.float64):
    """Values 0.25 * (i % 7) - 0.6 in row-major order (never 0)."""
    n = math.prod(shape)
    return torch.tensor([0.25 * (i % 7) - 0.6 for i in range(n)], dtype=dtype).reshape(shape)


def main():
    x = special()
    for name in ("isnan", "isinf", "isfinite"):
        for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
            pass  # the same answer in every floating dtype; printed once below
        print(f"// {name}(special().t())", lst(getattr(torch, name)(x.t())))
    print("// nonzero(special().t())", lst(torch.nonzero(x.t())))
    print("// nonzero(special()[:, ::2])", lst(torch.nonzero(x[:, ::2])))
    # masked_select: x (2, 3, 4) viewed transposed (4, 3, 2), mask (3, 1) broadcast
    xs = ramp((2, 3, 4)).requires_grad_()
    mask = torch.tensor([[True], [False], [True]])
    y = torch.masked_select(xs.transpose(0, 2), mask)
    g = ramp((y.numel(),)) * 2.0
    y.backward(g)
    print("// masked_select(ramp(2,3,4).transpose(0,2), [[1],[0],[1]])", lst(y.detach()))
    # PyTorch 1.13's gradient of masked_select on a non-contiguous input is wrong: it scatters g in
    # the input's memory order, not its logical order (here xs.grad[0, 0, 1] = g[1], where y[4]
    # is xs[0, 0, 1]). The same selection through a contiguous copy, or boolean indexing
    # xs.transpose(0, 2)[mask.expand(4, 3, 2)], gives the right gradient, printed here.
    wrong = xs.grad.clone()
    xs.grad = None
    yc = torch.masked_select(xs.transpose(0, 2).contiguous(), mask)
    assert torch.equal(yc, y)
    yc.backward(g)
    xi = ramp((2, 3, 4)).requires_grad_()
    xi.transpose(0, 2)[mask.expand(4, 3, 2)].backward(g)
    assert torch.equal(xi.grad, xs.grad) and not torch.equal(wrong, xs.grad)
    print("// its gradient for g = 2 ramp(n)", lst(xs.grad))
    # x broadcast by the mask: x (3, 1), mask (2, 3, 4)
    xb = ramp((3, 1)).requires_grad_()
    mb = torch.tensor([(i * 5) % 3 == 0 for i in range(24)]).reshape(2, 3, 4)
    yb = torch.masked_select(xb, mb)
    yb.backward(ramp((yb.numel(),)))
    print("// masked_select(ramp(3,1), mask (i*5)%3==0 of (2,3,4))", lst(yb.detach()))
    print("// its gradient for g = ramp(n)", lst(xb.grad))
    # lerp, tensor weight, float64, broadcast: start (3, 4), end (4,), weight (3, 1)
    s = ramp((3, 4)).requires_grad_()
    e = (ramp((4,)) * 3.0 + 0.1).requires_grad_()
    w = torch.tensor([[-0.7], [0.3], [1.25]], dtype=torch.float64, requires_grad=True)
    out = torch.lerp(s, e, w)
    out.backward(ramp((3, 4)) + 1.0)
    print("// lerp(ramp(3,4), 3 ramp(4) + 0.1, [[-0.7],[0.3],[1.25]])", lst(out.detach()))
    print("// grads start, end, weight for g = ramp(3,4) + 1:", lst(s.grad), lst(e.grad), lst(w.grad))
    # lerp, scalar weights, float32 and bfloat16: start = ramp(8), end = 5 ramp(8) + 0.3
    for dt in (torch.float32, torch.bfloat16, torch.float64):
        for wv in (-0.7, 0.3, 0.5, 0.7, 1.3):
            r = torch.lerp(ramp((8,), dt), ramp((8,), dt) * 5.0 + 0.3, wv)
            print(f"// lerp {dt} w={wv}", lst(r.double()))
    # lerp with non-finite values (float64, weight 0.3 and 0.7)
    a = torch.tensor([0.0, -0.0, float("inf"), 1.0, float("nan"), -float("inf"), 2.0], dtype=torch.float64)
    b = torch.tensor([-0.0, -0.0, 1.0, float("inf"), 1.0, float("inf"), float("nan")], dtype=torch.float64)
    for wv in (0.0, 0.3, 0.7, 1.0):
        print(f"// lerp special w={wv}", lst(torch.lerp(a, b, wv)))


if __name__ == "__main__":
    main()
