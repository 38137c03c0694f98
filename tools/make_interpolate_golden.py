#!/usr/bin/env python3
"""Writes tests/cpu/interpolate_golden.h: torch.nn.functional.interpolate's outputs and input
gradients (PyTorch's CPU kernels) for the cases tests/cpu/test_interpolate.cpp checks frugal
against. Inputs and output gradients are formulas both sides compute:
x[i] = 2 sin(0.731 i), grad_out[i] = cos(0.413 i) (float64, then the case's dtype).

    python3 tools/make_interpolate_golden.py > tests/cpu/interpolate_golden.h
"""
import math

import torch
import torch.nn.functional as F

# name, input shape, interpolate kwargs, dtype
CASES = [
    ("up_size_nearest", (1, 2, 7, 9), dict(size=(13, 5), mode="nearest"), torch.float32),
    ("up_size_bilinear", (1, 2, 7, 9), dict(size=(13, 5), mode="bilinear", align_corners=False), torch.float32),
    ("up_size_bilinear_ac", (1, 2, 7, 9), dict(size=(13, 5), mode="bilinear", align_corners=True), torch.float32),
    ("scale_nearest", (1, 2, 7, 9), dict(scale_factor=1.7, mode="nearest"), torch.float32),
    ("scale_bilinear", (1, 2, 7, 9), dict(scale_factor=1.7, mode="bilinear", align_corners=False), torch.float32),
    ("scale_bilinear_ac", (1, 2, 7, 9), dict(scale_factor=1.7, mode="bilinear", align_corners=True), torch.float32),
    ("scale_bilinear_recompute", (1, 2, 7, 9),
     dict(scale_factor=1.7, mode="bilinear", align_corners=False, recompute_scale_factor=True), torch.float32),
    ("down_nearest", (1, 2, 10, 11), dict(size=(4, 3), mode="nearest"), torch.float32),
    ("down_bilinear", (1, 2, 10, 11), dict(size=(4, 3), mode="bilinear", align_corners=False), torch.float32),
    ("down_bilinear_ac", (1, 2, 10, 11), dict(size=(4, 3), mode="bilinear", align_corners=True), torch.float32),
    ("per_dim_nearest", (1, 1, 5, 6), dict(scale_factor=(0.5, 2.5), mode="nearest"), torch.float32),
    ("per_dim_bilinear", (1, 1, 5, 6), dict(scale_factor=(0.5, 2.5), mode="bilinear", align_corners=False),
     torch.float32),
    ("same_size_nearest", (1, 1, 7, 7), dict(scale_factor=1.1, mode="nearest"), torch.float32),
    ("same_size_bilinear", (1, 1, 7, 7), dict(scale_factor=1.1, mode="bilinear", align_corners=False), torch.float32),
    ("one_row_bilinear_ac", (1, 1, 3, 4), dict(size=(1, 7), mode="bilinear", align_corners=True), torch.float32),
    ("up_size_bilinear_f64", (1, 2, 7, 9), dict(size=(13, 5), mode="bilinear", align_corners=False), torch.float64),
    ("up_size_bicubic", (1, 2, 7, 9), dict(size=(13, 5), mode="bicubic", align_corners=False), torch.float32),
    ("up_size_bicubic_ac", (1, 2, 7, 9), dict(size=(13, 5), mode="bicubic", align_corners=True), torch.float32),
    ("scale_bicubic", (1, 2, 7, 9), dict(scale_factor=1.7, mode="bicubic", align_corners=False), torch.float32),
    ("down_bicubic", (1, 2, 10, 11), dict(size=(4, 3), mode="bicubic", align_corners=False), torch.float32),
    ("down_bicubic_ac", (1, 2, 10, 11), dict(size=(4, 3), mode="bicubic", align_corners=True), torch.float32),
    ("same_size_bicubic", (1, 1, 7, 7), dict(scale_factor=1.1, mode="bicubic", align_corners=False), torch.float32),
    ("tiny_bicubic", (1, 1, 2, 1), dict(size=(5, 3), mode="bicubic", align_corners=False), torch.float32),
    ("up_size_bicubic_f64", (1, 2, 7, 9), dict(size=(13, 5), mode="bicubic", align_corners=False), torch.float64),
    ("pos_embed_bicubic_ac_f64", (1, 2, 6, 6), dict(size=(10, 10), mode="bicubic", align_corners=True),
     torch.float64),
    ("up_size_nearest_exact", (1, 2, 7, 9), dict(size=(13, 5), mode="nearest-exact"), torch.float32),
    ("scale_nearest_exact", (1, 2, 7, 9), dict(scale_factor=1.7, mode="nearest-exact"), torch.float32),
    ("down_nearest_exact", (1, 2, 10, 11), dict(size=(4, 3), mode="nearest-exact"), torch.float32),
    ("same_size_nearest_exact", (1, 1, 7, 7), dict(scale_factor=1.1, mode="nearest-exact"), torch.float32),
    ("double_nearest_exact", (1, 1, 5, 6), dict(scale_factor=2.0, mode="nearest-exact"), torch.float32),
    ("down_area", (1, 2, 10, 11), dict(size=(4, 3), mode="area"), torch.float32),
    ("up_area", (1, 2, 7, 9), dict(size=(13, 5), mode="area"), torch.float32),
    ("scale_area", (1, 2, 7, 9), dict(scale_factor=0.6, mode="area"), torch.float32),
]

# 3-D (N, C, L) inputs: interpolate_goldens_1d() (Note [1-D interpolation as 2-D]).
CASES_1D = [
    ("linear_up_size", (2, 3, 7), dict(size=13, mode="linear", align_corners=False), torch.float32),
    ("linear_up_size_ac", (2, 3, 7), dict(size=13, mode="linear", align_corners=True), torch.float32),
    ("linear_scale", (2, 3, 7), dict(scale_factor=1.7, mode="linear", align_corners=False), torch.float32),
    ("linear_scale_ac", (2, 3, 7), dict(scale_factor=1.7, mode="linear", align_corners=True), torch.float32),
    ("linear_scale_recompute", (2, 3, 7),
     dict(scale_factor=1.7, mode="linear", align_corners=False, recompute_scale_factor=True), torch.float32),
    ("linear_down", (1, 2, 11), dict(size=4, mode="linear", align_corners=False), torch.float32),
    ("linear_down_ac", (1, 2, 11), dict(size=4, mode="linear", align_corners=True), torch.float32),
    ("linear_same_size", (1, 1, 7), dict(scale_factor=1.1, mode="linear", align_corners=False), torch.float32),
    ("linear_one_output_ac", (1, 1, 4), dict(size=1, mode="linear", align_corners=True), torch.float32),
    ("linear_x2_f64", (1, 2, 9), dict(scale_factor=2.0, mode="linear", align_corners=False), torch.float64),
    ("nearest_up_size", (2, 3, 7), dict(size=13, mode="nearest"), torch.float32),
    ("nearest_scale", (2, 3, 7), dict(scale_factor=1.7, mode="nearest"), torch.float32),
    ("nearest_down", (1, 2, 11), dict(size=4, mode="nearest"), torch.float32),
    ("nearest_x2", (1, 2, 5), dict(scale_factor=2.0, mode="nearest"), torch.float32),
    ("nearest_exact_scale", (2, 3, 7), dict(scale_factor=1.7, mode="nearest-exact"), torch.float32),
    ("nearest_exact_down", (1, 2, 11), dict(size=4, mode="nearest-exact"), torch.float32),
    ("area_down", (1, 2, 11), dict(size=4, mode="area"), torch.float32),
    ("area_up", (2, 3, 7), dict(size=13, mode="area"), torch.float32),
]

MODES = {"nearest": "Nearest", "bilinear": "Bilinear", "bicubic": "Bicubic", "nearest-exact": "NearestExact",
         "area": "Area", "linear": "Linear"}


def c_kwargs(kw):
    parts = []
    if "size" in kw:
        size = kw["size"]
        parts.append(".size = Int2{%d}" % size if isinstance(size, int) else ".size = Int2{%d, %d}" % size)
    if "scale_factor" in kw:
        s = kw["scale_factor"]
        s = s if isinstance(s, tuple) else (s, s)
        parts.append(".scale_factor = Scale2{%r, %r}" % s)
    parts.append(".mode = InterpolateMode::" + MODES[kw["mode"]])
    if "align_corners" in kw:
        parts.append(".align_corners = " + ("true" if kw["align_corners"] else "false"))
    if kw.get("recompute_scale_factor"):
        parts.append(".recompute_scale_factor = true")
    return "{" + ", ".join(parts) + "}"


def values(t, indent=8, width=118):
    """The values as C++ initializers, wrapped at `width` columns."""
    fmt = "%.17g" if t.dtype == torch.float64 else "%.9g"
    lines, line = [], ""
    for text in (fmt % v for v in t.flatten().tolist()):
        if line and indent + len(line) + len(text) + 2 > width:
            lines.append(line.rstrip())
            line = ""
        line += text + ", "
    lines.append(line.rstrip().rstrip(","))
    return ("\n" + " " * indent).join(lines)


def main():
    print("// Generated by tools/make_interpolate_golden.py with torch %s (CPU): do not edit." % torch.__version__)
    print("// torch.nn.functional.interpolate's output y and input gradient gx for x[i] = 2 sin(0.731 i),")
    print("// grad_out[i] = cos(0.413 i).")
    print("#pragma once")
    print("#include <vector>\n")
    print('#include "tensor/ops/interpolate.h"\n')
    print("namespace frugal::testing {\n")
    print("struct InterpolateGolden {")
    print("  const char* name;")
    print("  Shape x, y;")
    print("  DType dtype;")
    print("  InterpolateOptions options;")
    print("  std::vector<double> y_values, gx;")
    print("};\n")
    print("// clang-format off")
    print_cases("interpolate_goldens", CASES)
    print_cases("interpolate_goldens_1d", CASES_1D)
    print("// clang-format on\n")
    print("}  // namespace frugal::testing")


def print_cases(function, cases):
    print("inline const std::vector<InterpolateGolden>& %s() {" % function)
    print("  static const std::vector<InterpolateGolden> cases = {")
    for name, shape, kw, dt in cases:
        n = math.prod(shape)
        x = (2 * torch.sin(torch.arange(n, dtype=torch.float64) * 0.731)).to(dt).reshape(shape).requires_grad_()
        y = F.interpolate(x, **kw)
        gy = torch.cos(torch.arange(y.numel(), dtype=torch.float64) * 0.413).to(dt).reshape(y.shape)
        y.backward(gy)
        print('      {"%s", {%s}, {%s}, %s,' % (name, ", ".join(map(str, shape)), ", ".join(map(str, y.shape)),
                                              "kFloat32" if dt == torch.float32 else "kFloat64"))
        print("       %s," % c_kwargs(kw))
        print("       {%s}," % values(y.detach()))
        print("       {%s}}," % values(x.grad))
    print("  };")
    print("  return cases;")
    print("}")


if __name__ == "__main__":
    main()
