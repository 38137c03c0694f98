"""Does PyTorch's cuDNN 16-bit convolution backward-data round partial sums?

Runs torch.nn.grad.conv2d_input in bfloat16/float16 on CUDA over random inputs for a few
geometries (strided, grouped, like op_fuzz's draws) and counts elements whose error
exceeds what one float32 accumulation plus one final rounding allows (op_fuzz's
tol_sum). A nonzero count means cuDNN's chosen algorithm rounds intermediate sums to
the 16-bit type: op_fuzz must then allow for it rather than call frugal wrong.
Usage: python3 tools/torch_conv_rounding.py [trials]
"""
import sys

import torch

trials = int(sys.argv[1]) if len(sys.argv) > 1 else 300
geometries = [  # x shape, w shape, stride, padding, groups
    ((2, 4, 7, 5), (6, 2, 3, 1), (2, 2), (1, 0), 2),
    ((2, 4, 9, 9), (4, 4, 3, 3), (2, 2), (1, 1), 1),
    ((1, 6, 8, 8), (6, 1, 3, 3), (1, 1), (1, 1), 6),
    ((3, 8, 6, 6), (8, 8, 1, 1), (1, 1), (0, 0), 1),
]
print(f"{'dtype':9} {'x':16} {'w':14} {'stride':7} {'groups':6} {'elements':>9} {'off':>6} {'worst':>8}")
for dt, rtol, eps16 in ((torch.bfloat16, 1.6e-2, 2**-8), (torch.float16, 2e-3, 2**-11)):
    for xs, ws, stride, pad, groups in geometries:
        torch.manual_seed(0)
        off = total = 0
        worst = 0.0
        for _ in range(trials):
            w = (torch.rand(ws, device="cuda") * 4 - 2).to(dt)
            x = torch.zeros(xs, device="cuda", dtype=dt)
            gy_shape = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad, groups=groups).shape
            gy = (torch.rand(gy_shape, device="cuda") * 4 - 2).to(dt)
            got = torch.nn.grad.conv2d_input(xs, w, gy, stride=stride, padding=pad, groups=groups).double()
            ref = torch.nn.grad.conv2d_input(xs, w.double(), gy.double(), stride=stride, padding=pad, groups=groups)
            n = ws[0] // groups * ws[2] * ws[3] + 1
            atol = 2e-6 + 2 * 1.2e-7 * 4 * n
            tol = rtol * ref.abs() + atol
            err = (got - ref).abs()
            off += int((err > tol).sum())
            total += err.numel()
            worst = max(worst, float((err / tol).max()))
        print(f"{str(dt)[6:]:9} {str(xs):16} {str(ws):14} {str(stride):7} {groups:<6} {total:9} {off:6} {worst:8.2f}")
