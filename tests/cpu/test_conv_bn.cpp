// Convolution + batch-norm fusions (Note [Convolution batch-norm fusion]): the raw ops
// against float64 loops and batch_norm's own statistics, the differentiable ops against
// conv2d, batch_norm_relu and conv2d composed (values, running statistics, gradients), and
// gradcheck. On the CPU these run the separate ops; tests/gpu/test_conv_bn_cuda.cpp checks
// the fused cuDNN graphs against the same references.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/batch_norm.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/conv_bn.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/half.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/conv_bn.h"
#include "tensor/ops/unary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// Per-channel sum and sum of squares of y (N, C, H, W) in float64.
std::pair<std::vector<double>, std::vector<double>> naive_sums(const Tensor& y) {
  const std::vector<double> v = values_of(y);
  const int64_t N = y.size(0), C = y.size(1), HW = y.size(2) * y.size(3);
  std::vector<double> s(size_t(C), 0.0), sq(size_t(C), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < HW; ++i) {
        const double x = v[size_t((n * C + c) * HW + i)];
        s[size_t(c)] += x, sq[size_t(c)] += x * x;
      }
  return {s, sq};
}

/// A batch norm's (C) tensors in float64: weight, bias, running mean and variance.
struct Bn {
  Tensor weight, bias, running_mean, running_var;
  explicit Bn(int64_t C, uint64_t seed) {
    weight = random_tensor({C}, kFloat64, seed, Layout::Contiguous, 0.5, 1.5);
    bias = random_tensor({C}, kFloat64, seed + 1);
    running_mean = random_tensor({C}, kFloat64, seed + 2);
    running_var = random_tensor({C}, kFloat64, seed + 3, Layout::Contiguous, 0.5, 2.0);
  }
  Bn clone() const {
    Bn b = *this;
    for (Tensor* t : {&b.weight, &b.bias, &b.running_mean, &b.running_var}) *t = t->clone();
    return b;
  }
  BatchNormArgs args(bool training, double momentum = 0.1) const {
    return {running_mean, running_var, weight, bias, training, momentum, 1e-5};
  }
};

}  // namespace

TEST_CASE("conv_bn: batch_norm_finalize gives batch_norm's statistics and running update") {
  for (bool training : {true, false}) {
    CAPTURE(training);
    // A mean several times the standard deviation: the sums' formula holds in float64.
    const Tensor x = ops::add(random_tensor({4, 3, 5, 7}, kFloat64, 3), 4.0);
    Bn bn(3, 10);
    Bn ref = bn.clone();
    const ops::BatchNormResult r =
        ops::batch_norm(x, ref.running_mean, ref.running_var, ref.weight, ref.bias, training, 0.3, 1e-5);
    const ops::ConvStats s = ops::channel_sums(x);
    const ops::BatchNormAffine f = ops::batch_norm_finalize(s.sum, s.sq_sum, 4 * 5 * 7, kFloat64, bn.running_mean,
                                                            bn.running_var, bn.weight, bn.bias, training, 0.3, 1e-5);
    check_close(f.mean, values_of(r.mean), 1e-12, 1e-12, "mean");
    check_close(f.invstd, values_of(r.invstd), 1e-10, 0, "invstd");
    check_close(bn.running_mean, values_of(ref.running_mean), 1e-12, 1e-12, "running_mean");
    check_close(bn.running_var, values_of(ref.running_var), 1e-10, 0, "running_var");
    // scale and shift fold bn into x * scale + shift: batch_norm's output again.
    const std::vector<double> xv = values_of(x), sc = values_of(f.scale), sh = values_of(f.shift);
    std::vector<double> folded(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) folded[i] = xv[i] * sc[(i / 35) % 3] + sh[(i / 35) % 3];
    check_close(r.out, folded, 1e-10, 1e-10, "folded");
  }
  SUBCASE("no weight and bias, running statistics in the input's 16-bit dtype") {
    const Tensor sum = from_vector<float>({6.f, -2.f}, {2}), sq = from_vector<float>({20.f, 9.f}, {2});
    const Tensor rm = zeros({2}, kFloat16), rv = ones({2}, kFloat16);
    const ops::BatchNormAffine f =
        ops::batch_norm_finalize(sum, sq, 3, kFloat16, rm, rv, Tensor(), Tensor(), true, 0.5, 0.0);
    const double m0 = 2.0, v0 = 20.0 / 3 - 4, m1 = -2.0 / 3, v1 = 3 - 4.0 / 9;
    check_close(f.mean, {m0, m1}, 1e-6, 0);
    check_close(f.scale, {1 / std::sqrt(v0), 1 / std::sqrt(v1)}, 1e-6, 0);
    check_close(f.shift, {-m0 / std::sqrt(v0), -m1 / std::sqrt(v1)}, 1e-6, 0);
    check_close(rm, {0.5 * m0, 0.5 * m1}, 1e-3, 0);  // float16 storage
    check_close(rv, {0.5 + 0.5 * v0 * 1.5, 0.5 + 0.5 * v1 * 1.5}, 1e-3, 0);
    // half_affine: scale and shift rounded to float16 values, the rest as before.
    const ops::BatchNormAffine h =
        ops::batch_norm_finalize(sum, sq, 3, kFloat16, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.5, 0.0, true);
    const std::vector<double> sc = values_of(f.scale), sh = values_of(f.shift);
    check_close(h.scale, {float(Half(float(sc[0]))), float(Half(float(sc[1])))}, 0, 0, "half scale");
    check_close(h.shift, {float(Half(float(sh[0]))), float(Half(float(sh[1])))}, 0, 0, "half shift");
    CHECK(h.scale.dtype() == kFloat32);
    check_close(h.mean, values_of(f.mean), 0, 0, "mean unrounded");
  }
  SUBCASE("errors") {
    const Tensor sum = zeros({2}), sq = zeros({2});
    check_error([&] { ops::batch_norm_finalize(sum, sq, 1, kFloat32, {}, {}, {}, {}, true); },
                {"batch_norm_finalize", "more than 1 value per channel"});
    check_error([&] { ops::batch_norm_finalize(sum, zeros({3}), 4, kFloat32, {}, {}, {}, {}, true); },
                {"batch_norm_finalize", "sq_sum", "[2]"});
    check_error([&] { ops::batch_norm_finalize(sum, sq, 4, kFloat32, {}, {}, {}, {}, false); },
                {"batch_norm_finalize", "running statistics", "eval"});
    check_error([&] { ops::batch_norm_finalize(sum, sq, 4, kFloat32, zeros({2}), {}, {}, {}, true); },
                {"batch_norm_finalize", "both"});
  }
}

TEST_CASE("conv_bn: conv2d_stats and scale_bias_relu_conv2d against conv2d and float64 sums") {
  for (bool channels_last : {false, true}) {
    CAPTURE(channels_last);
    Tensor x = random_tensor({2, 4, 9, 7}, kFloat64, 5), w = random_tensor({6, 4, 3, 3}, kFloat64, 6);
    if (channels_last) x = to_channels_last(x), w = to_channels_last(w);
    const Conv2dOptions o{.stride = {2, 1}, .padding = 1};
    const ops::ConvStats r = ops::conv2d_stats(x, w, o);
    const Tensor y = ops::conv2d(x, w, Tensor(), o);
    check_close(r.out, values_of(y), 1e-12, 1e-12, "out");
    const auto [s, sq] = naive_sums(y);
    check_close(r.sum, s, 1e-12, 1e-12, "sum");
    check_close(r.sq_sum, sq, 1e-12, 1e-12, "sq_sum");
    CHECK(!ops::conv2d_stats(x, w, o, false).sum.defined());

    const Tensor scale = random_tensor({4}, kFloat64, 7), shift = random_tensor({4}, kFloat64, 8);
    const ops::ConvStats z = ops::scale_bias_relu_conv2d(x, scale, shift, w, o);
    const Tensor a = ops::relu(ops::add(ops::mul(x, scale.view({1, 4, 1, 1})), shift.view({1, 4, 1, 1})));
    const Tensor expect = ops::conv2d(a, w, Tensor(), o);
    check_close(z.out, values_of(expect), 1e-12, 1e-12, "sbr out");
    check_close(z.sum, naive_sums(expect).first, 1e-12, 1e-12, "sbr sum");
    CHECK(suggests_channels_last(z.out) == channels_last);
  }
  check_error(
      [] {
        ops::scale_bias_relu(zeros({1, 3, 2, 2}), zeros({3}), zeros({2}));
      },
      {"scale_bias_relu", "shift", "[3]"});
  check_error(
      [] {
        ops::scale_bias_relu(zeros({1, 3, 2, 2}), zeros({3}, kFloat64), zeros({3}));
      },
      {"scale_bias_relu", "scale", "float32"});
}

TEST_CASE("conv_bn: bn_relu_conv2d equals conv2d, batch_norm_relu and conv2d composed") {
  // x -> conv1 -> bn -> relu -> conv2, fused and composed, in float64: the output, its sums,
  // the running statistics and every gradient.
  for (bool training : {true, false}) {
    for (bool affine : {true, false}) {
      CAPTURE(training);
      CAPTURE(affine);
      const Tensor x = leaf({3, 4, 6, 5}, 1), w1 = leaf({8, 4, 1, 1}, 2), w2 = leaf({6, 8, 3, 3}, 3);
      Bn bn(8, 20), ref(8, 20);
      for (Tensor* t : {&bn.weight, &bn.bias, &ref.weight, &ref.bias}) {
        if (affine) t->requires_grad_();
        else *t = Tensor();
      }
      const Conv2dOptions o2{.stride = 2, .padding = 1};

      const ConvWithStats z = bn_relu_conv2d(conv2d_stats(x, w1), bn.args(training), w2, o2);
      const Tensor expect = conv2d(
          batch_norm_relu(conv2d(x, w1), ref.running_mean, ref.running_var, ref.weight, ref.bias, training, 0.1, 1e-5),
          w2, Tensor(), o2);
      check_close(z.out, values_of(expect), 1e-10, 1e-10, "out");
      check_close(z.sum, naive_sums(expect).first, 1e-10, 1e-10, "sum");
      check_close(bn.running_mean, values_of(ref.running_mean), 1e-12, 1e-12, "running_mean");
      check_close(bn.running_var, values_of(ref.running_var), 1e-10, 0, "running_var");

      const Tensor g = random_tensor(expect.sizes(), kFloat64, 30);
      const TensorList fused = autograd::grad({z.out}, {x, w1, w2}, {g});
      const TensorList plain = autograd::grad({expect}, {x, w1, w2}, {g});
      for (size_t i = 0; i < fused.size(); ++i) check_close(fused[i], values_of(plain[i]), 1e-9, 1e-10, "grad");
      if (affine) {
        const Tensor z2 = bn_relu_conv2d(conv2d_stats(x, w1), bn.args(training), w2, o2).out;
        const Tensor e2 = conv2d(batch_norm_relu(conv2d(x, w1), ref.running_mean, ref.running_var, ref.weight, ref.bias,
                                                 training, 0.1, 1e-5),
                                 w2, Tensor(), o2);
        const TensorList fp = autograd::grad({z2}, {bn.weight, bn.bias}, {g});
        const TensorList pp = autograd::grad({e2}, {ref.weight, ref.bias}, {g});
        check_close(fp[0], values_of(pp[0]), 1e-9, 1e-10, "grad bn weight");
        check_close(fp[1], values_of(pp[1]), 1e-9, 1e-10, "grad bn bias");
      }
    }
  }
}

TEST_CASE("conv_bn: bn_relu_conv2d takes fresh statistics of an input changed in place") {
  Tensor y = random_tensor({2, 3, 4, 4}, kFloat64, 40);
  const Tensor w = random_tensor({5, 3, 1, 1}, kFloat64, 41);
  const ops::ConvStats s = ops::channel_sums(y);
  const ConvWithStats stale{y, s.sum, s.sq_sum, y.version()};
  ops::mul_(y, 3.0);  // the sums no longer describe y
  Bn bn(3, 50), ref(3, 50);
  const Tensor z = bn_relu_conv2d(stale, bn.args(true), w).out;
  const Tensor expect =
      conv2d(batch_norm_relu(y, ref.running_mean, ref.running_var, ref.weight, ref.bias, true, 0.1, 1e-5), w);
  check_close(z, values_of(expect), 1e-10, 1e-10);
  check_close(bn.running_mean, values_of(ref.running_mean), 1e-12, 1e-12);
}

TEST_CASE("conv_bn: bn_relu_conv2d gradcheck") {
  const Tensor y = leaf({2, 3, 4, 5}, 60), gamma = leaf({3}, 61, 0.5, 1.5), beta = leaf({3}, 62),
               w = leaf({4, 3, 3, 3}, 63);
  check_gradcheck(
      [](const TensorList& in) {
        const ConvWithStats x{in[0], Tensor(), Tensor(), in[0].version()};  // no sums: taken afresh
        return bn_relu_conv2d(x, {Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-5}, in[3], {.padding = 1}).out;
      },
      {y, gamma, beta, w});
}
