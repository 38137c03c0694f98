// layer_norm on CUDA against the CPU op on the same inputs: forward and backward in
// float32, float64, float16 and bfloat16 (the 16-bit types compute in float on both
// sides), the warp-per-row and block-per-row kernel paths, the differentiable op's
// gradients, and mismatched devices.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops/norm.h"
#include "tensor/factory.h"
#include "tensor/ops/norm.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda nn_functional: layer_norm forward and backward match the CPU (warp and block rows)") {
  struct Case {
    Shape x, normalized;
  };
  uint64_t seed = 1;
  for (const Case& c : {Case{{5, 7}, {7}}, Case{{4, 33, 768}, {768}}, Case{{3, 1500}, {1500}},
                        Case{{2, 3, 4, 6}, {4, 6}}, Case{{700, 40}, {40}}}) {
    for (DType dt : kFloatTypes) {
      for (Layout layout : {Layout::Contiguous, Layout::Transposed}) {
        for (bool affine : {false, true}) {
          const std::string what = name_of(dt, c.x) + " " + layout_name(layout) + (affine ? " affine" : "");
          const DevicePair x = random_pair(c.x, dt, seed++, layout, -3, 5);
          const DevicePair w = affine ? random_pair(c.normalized, dt, seed++) : DevicePair{};
          const DevicePair b = affine ? random_pair(c.normalized, dt, seed++) : DevicePair{};
          const auto rc = ops::layer_norm(x.cpu, c.normalized, w.cpu, b.cpu);
          const auto rg = ops::layer_norm(x.gpu, c.normalized, w.gpu, b.gpu);
          check_same(rg.out, rc.out, tol(dt), tol(dt), "y " + what);
          check_same(rg.mean, rc.mean, tol(kFloat32), tol(kFloat32), "mean " + what);
          check_same(rg.rstd, rc.rstd, tol(kFloat32), 0, "rstd " + what);
          const DevicePair g = random_pair(c.x, dt, seed++);
          const auto gc = ops::layer_norm_backward(g.cpu, x.cpu, c.normalized, rc.mean, rc.rstd, w.cpu, affine);
          const auto gg = ops::layer_norm_backward(g.gpu, x.gpu, c.normalized, rg.mean, rg.rstd, w.gpu, affine);
          const int64_t M = x.cpu.numel() / numel_of(c.normalized);
          check_same(gg.x, gc.x, tol(dt, 4), tol(dt, 4), "dx " + what);
          // Column sums over M rows: allow for M roundings of the float accumulator.
          const double sum_atol = tol(dt, 4) * std::sqrt(double(M)) * 4;
          check_same(gg.weight, gc.weight, tol(dt, 4), sum_atol, "dweight " + what);
          check_same(gg.bias, gc.bias, tol(dt, 4), sum_atol, "dbias " + what);
        }
      }
    }
  }
}

TEST_CASE("cuda nn_functional: differentiable layer_norm: CUDA gradients match the CPU") {
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const DevicePair x = random_pair({6, 64}, dt, 10), w = random_pair({64}, dt, 11), b = random_pair({64}, dt, 12);
    const DevicePair g = random_pair({6, 64}, dt, 13);
    TensorList grads[2];
    for (int side = 0; side < 2; ++side) {
      const Tensor xs = (side ? x.gpu : x.cpu).detach().requires_grad_();
      const Tensor ws = (side ? w.gpu : w.cpu).detach().requires_grad_();
      const Tensor bs = (side ? b.gpu : b.cpu).detach().requires_grad_();
      layer_norm(xs, {64}, ws, bs).backward(side ? g.gpu : g.cpu);
      grads[side] = {xs.grad(), ws.grad(), bs.grad()};
    }
    check_same(grads[1][0], grads[0][0], tol(dt, 4), tol(dt, 4), "layer_norm dx");
    check_same(grads[1][1], grads[0][1], tol(dt, 4), tol(dt, 8), "layer_norm dweight");
    check_same(grads[1][2], grads[0][2], tol(dt, 4), tol(dt, 8), "layer_norm dbias");
  }
}

TEST_CASE("cuda nn_functional: layer_norm on mismatched devices is an error naming both tensors") {
  const Tensor xg = zeros({2, 3}, {kFloat32, kGpu}), wc = ones({3});
  check_error([&] { ops::layer_norm(xg, {3}, wc); }, {"layer_norm", "one device", "cuda:0", "float32[3] cpu"});
}
