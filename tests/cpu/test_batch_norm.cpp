// Batch norm: batch_norm in training and eval against its formulas in float64, the
// running statistics, the backward and gradcheck, parameter dtypes, errors; the
// BatchNorm2d module.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "autograd/gradcheck.h"
#include "autograd/ops/all.h"
#include "autograd/ops/batch_norm.h"
#include "nn/batch_norm.h"
#include "nn/container.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/binary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::gradcheck;

namespace {

constexpr DType kAllFloat[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

struct BnRef {
  std::vector<double> y, mean, invstd, rm, rv;
};

/// Batch norm by its definition in float64: x (N, C, *), optional weight/bias, running stats.
BnRef naive_bn(const std::vector<double>& x, const Shape& xs, const std::vector<double>* w,
               const std::vector<double>* b, std::vector<double> rm, std::vector<double> rv, bool training,
               double momentum, double eps) {
  const int64_t N = xs[0], C = xs[1], L = numel_of(xs) / (N * C);
  BnRef r;
  r.y.resize(x.size());
  for (int64_t c = 0; c < C; ++c) {
    double mean, var;
    if (training) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < L; ++j) s += x[size_t((n * C + c) * L + j)];
      mean = s / double(N * L);
      double ss = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < L; ++j) ss += std::pow(x[size_t((n * C + c) * L + j)] - mean, 2);
      var = ss / double(N * L);
      if (!rm.empty()) {
        rm[size_t(c)] = (1 - momentum) * rm[size_t(c)] + momentum * mean;
        rv[size_t(c)] = (1 - momentum) * rv[size_t(c)] + momentum * ss / double(N * L - 1);
      }
    } else {
      mean = rm[size_t(c)], var = rv[size_t(c)];
    }
    r.mean.push_back(mean);
    r.invstd.push_back(1.0 / std::sqrt(var + eps));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < L; ++j) {
        const size_t i = size_t((n * C + c) * L + j);
        r.y[i] = (x[i] - mean) / std::sqrt(var + eps) * (w ? (*w)[size_t(c)] : 1.0) + (b ? (*b)[size_t(c)] : 0.0);
      }
  }
  r.rm = rm, r.rv = rv;
  return r;
}

}  // namespace

TEST_CASE("batch_norm: training normalizes with batch statistics and updates the running ones") {
  uint64_t seed = 500;
  for (const Shape& xs : {Shape{4, 3, 5, 6}, Shape{8, 5}, Shape{3, 4, 7}, Shape{2, 2, 3, 3}})
    for (DType t : kAllFloat)
      for (bool float_params : {false, true})
        for (bool affine : {true, false}) {
          if (float_params && (t == kFloat32 || t == kFloat64)) continue;
          CAPTURE(shape_str(xs));
          CAPTURE(dtype_name(t));
          CAPTURE(float_params);
          CAPTURE(affine);
          const int64_t C = xs[1];
          const DType pt = float_params ? kFloat32 : t;
          const Tensor x = random_tensor(xs, t, ++seed, Layout::Transposed, -1.0, 3.0);
          const Tensor w = affine ? random_tensor({C}, pt, ++seed) : Tensor();
          const Tensor b = affine ? random_tensor({C}, pt, ++seed) : Tensor();
          Tensor rm = random_tensor({C}, pt, ++seed), rv = random_tensor({C}, pt, ++seed, Layout::Strided, 0.5, 2.0);
          const std::vector<double> wv = affine ? values_of(w) : std::vector<double>(), bv = affine ? values_of(b) : wv;
          const BnRef ref = naive_bn(values_of(x), xs, affine ? &wv : nullptr, affine ? &bv : nullptr, values_of(rm),
                                     values_of(rv), true, 0.2, 1e-3);
          const uint64_t version = rm.version();
          const ops::BatchNormResult r = ops::batch_norm(x, rm, rv, w, b, true, 0.2, 1e-3);
          CHECK(r.out.dtype() == t);
          CHECK(r.mean.dtype() == (t == kFloat64 ? kFloat64 : kFloat32));
          const double tol = default_rtol(t) * 4;
          check_close(r.out, ref.y, tol, tol, "y");
          check_close(r.mean, ref.mean, 1e-5, 1e-6, "mean");
          check_close(r.invstd, ref.invstd, 1e-5, 1e-6, "invstd");
          check_close(rm, ref.rm, default_rtol(pt), 1e-6, "running_mean");
          check_close(rv, ref.rv, default_rtol(pt), 1e-6, "running_var");
          CHECK(rm.version() > version);
        }
}

TEST_CASE("batch_norm: eval normalizes with the running statistics and leaves them alone") {
  uint64_t seed = 600;
  for (DType t : kAllFloat) {
    CAPTURE(dtype_name(t));
    const Shape xs{3, 4, 5, 5};
    const Tensor x = random_tensor(xs, t, ++seed);
    const Tensor w = random_tensor({4}, t, ++seed), b = random_tensor({4}, t, ++seed);
    const DType st = t == kFloat64 ? kFloat64 : kFloat32;  // running statistics in the compute dtype
    const Tensor rm = random_tensor({4}, st, ++seed), rv = random_tensor({4}, st, ++seed, {}, 0.5, 2.0);
    const std::vector<double> wv = values_of(w), bv = values_of(b), rmv = values_of(rm), rvv = values_of(rv);
    const BnRef ref = naive_bn(values_of(x), xs, &wv, &bv, rmv, rvv, false, 0.1, 1e-5);
    const ops::BatchNormResult r = ops::batch_norm(x, rm, rv, w, b, false);
    check_close(r.out, ref.y, 4 * default_rtol(t), 4 * default_rtol(t), "eval y");
    check_close(r.mean, rmv, 0, 0, "eval mean is running_mean");
    check_close(r.invstd, ref.invstd, 1e-6, 0, "eval invstd");
    check_close(rm, rmv, 0, 0, "running_mean untouched");
    check_close(rv, rvv, 0, 0, "running_var untouched");
    CHECK_FALSE(r.mean.shares_storage(rm));  // a copy: see Note [Batch norm statistics]
  }
}

TEST_CASE("batch_norm: backward matches the formula, and passes gradcheck in training and eval") {
  // The raw backward against its formula written out in float64.
  const Shape xs{3, 2, 4};
  const Tensor x = random_tensor(xs, kFloat64, 1), g = random_tensor(xs, kFloat64, 2),
               w = random_tensor({2}, kFloat64, 3);
  const ops::BatchNormResult r = ops::batch_norm(x, Tensor(), Tensor(), w, Tensor(), true);
  const ops::BatchNormGrads gr = ops::batch_norm_backward(g, x, w, r.mean, r.invstd, true);
  const std::vector<double> xv = values_of(x), gv = values_of(g), wv = values_of(w), mv = values_of(r.mean),
                            iv = values_of(r.invstd);
  std::vector<double> gx(xv.size()), gw(2, 0.0), gb(2, 0.0);
  for (int c = 0; c < 2; ++c) {
    for (int n = 0; n < 3; ++n)
      for (int j = 0; j < 4; ++j) {
        const size_t i = size_t((n * 2 + c) * 4 + j);
        gb[size_t(c)] += gv[i];
        gw[size_t(c)] += gv[i] * (xv[i] - mv[size_t(c)]) * iv[size_t(c)];
      }
    for (int n = 0; n < 3; ++n)
      for (int j = 0; j < 4; ++j) {
        const size_t i = size_t((n * 2 + c) * 4 + j);
        const double xhat = (xv[i] - mv[size_t(c)]) * iv[size_t(c)];
        gx[i] = wv[size_t(c)] * iv[size_t(c)] * (gv[i] - gb[size_t(c)] / 12 - xhat * gw[size_t(c)] / 12);
      }
  }
  check_close(gr.x, gx, 1e-12, 1e-12, "grad_x");
  check_close(gr.weight, gw, 1e-12, 1e-12, "grad_weight");
  check_close(gr.bias, gb, 1e-12, 1e-12, "grad_bias");

  Tensor xl = leaf({4, 3, 3, 2}, 10), wl = leaf({3}, 11), bl = leaf({3}, 12);
  const Tensor rm = random_tensor({3}, kFloat64, 13), rv = random_tensor({3}, kFloat64, 14, {}, 0.5, 2.0);
  for (bool training : {true, false}) {
    CAPTURE(training);
    auto r1 = gradcheck(
        [&](const TensorList& in) { return batch_norm(in[0], rm.clone(), rv.clone(), in[1], in[2], training); },
        {xl, wl, bl});
    CHECK_MESSAGE(r1.ok, r1.report);
    auto r2 =
        gradcheck([&](const TensorList& in) { return batch_norm(in[0], rm, rv, Tensor(), Tensor(), training); }, {xl});
    CHECK_MESSAGE(r2.ok, r2.report);
  }
  // (N, C) input without running statistics, and a non-contiguous one.
  Tensor x2 = leaf({6, 3}, 15);
  auto r3 = gradcheck([&](const TensorList& in) { return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true); },
                      {x2, wl, bl});
  CHECK_MESSAGE(r3.ok, r3.report);
  Tensor x3 = leaf({3, 2, 3, 4}, 16);
  auto r4 = gradcheck(
      [&](const TensorList& in) {
        return batch_norm(in[0].transpose(0, 1), Tensor(), Tensor(), Tensor(), in[1], true);
      },
      {x3, leaf({3}, 17)});
  CHECK_MESSAGE(r4.ok, r4.report);
}

TEST_CASE("batch_norm: parameter gradients come back in the parameters' dtype") {
  Tensor x = random_tensor({4, 3, 2, 2}, kFloat16, 1);
  x.requires_grad_();
  Tensor w = random_tensor({3}, kFloat32, 2), b = random_tensor({3}, kFloat32, 3);
  w.requires_grad_();
  b.requires_grad_();
  Tensor y = batch_norm(x, Tensor(), Tensor(), w, b, true);
  CHECK(y.dtype() == kFloat16);
  CHECK(y.grad_fn_name() == "BatchNormBackward");
  y.backward(ones_like(y));
  CHECK(x.grad().dtype() == kFloat16);
  CHECK(w.grad().dtype() == kFloat32);
  CHECK(b.grad().dtype() == kFloat32);
  check_close(b.grad(), {16, 16, 16}, 1e-3, 0, "grad_bias = sum of ones");
}

TEST_CASE("batch_norm_apply: the forward's output from its statistics, NCHW and channels-last, every dtype") {
  // Bitwise the forward's (the same arithmetic; a channels-last x is read in place as rows of
  // C), and close to the definition in float64 on the rounded inputs.
  for (DType dt : kAllFloat)
    for (bool channels_last : {false, true})
      for (bool residual : {false, true})
        for (bool relu : {false, true}) {
          CAPTURE(dtype_name(dt));
          CAPTURE(channels_last);
          CAPTURE(residual);
          CAPTURE(relu);
          const DType compute = dt == kFloat64 ? kFloat64 : kFloat32;
          Tensor x = random_tensor({2, 3, 4, 5}, dt, 1), r = random_tensor({2, 3, 4, 5}, dt, 2);
          if (channels_last) x = to_channels_last(x), r = to_channels_last(r);
          const Tensor w = random_tensor({3}, compute, 3), b = random_tensor({3}, compute, 4);
          const Tensor res = residual ? r : Tensor();
          const ops::BatchNormResult f = relu ? ops::batch_norm_add_relu(x, res, Tensor(), Tensor(), w, b, true)
                                              : ops::batch_norm(x, Tensor(), Tensor(), w, b, true);
          const Tensor y = ops::batch_norm_apply(x, res, relu, f.mean, f.invstd, w, b);
          CHECK(suggests_channels_last(y) == channels_last);
          if (!residual || relu) CHECK(values_of(y) == values_of(f.out));
          const std::vector<double> xv = values_of(x), rv = values_of(r), m = values_of(f.mean),
                                    is = values_of(f.invstd), wv = values_of(w), bv = values_of(b);
          std::vector<double> want(xv.size());
          for (size_t i = 0; i < xv.size(); ++i) {
            const size_t c = (i / 20) % 3;
            double v = (xv[i] - m[c]) * is[c] * wv[c] + bv[c] + (residual ? rv[i] : 0.0);
            want[i] = relu && v < 0 ? 0.0 : v;
          }
          check_close(values_of(y), want, default_rtol(dt), 8 * default_rtol(dt), "batch_norm_apply");
        }
  check_error(
      [] {
        const Tensor x = zeros({2, 3, 4});
        ops::batch_norm_apply(x, Tensor(), false, zeros({3}, kFloat64), ones({3}), Tensor(), Tensor());
      },
      {"batch_norm_apply: mean and invstd must be statistics of shape [3] and dtype float32"});
}

TEST_CASE("batch_norm: errors") {
  const Tensor x = zeros({4, 3, 2, 2});
  check_error(
      [&] {
        ops::batch_norm(zeros({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {"batch_norm", "more than 1 value per channel", "[1, 3]"});
  check_error([&] { ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false); }, {"batch_norm", "eval mode"});
  check_error([&] { ops::batch_norm(x, zeros({3}), Tensor(), Tensor(), Tensor(), true); }, {"batch_norm", "both"});
  check_error([&] { ops::batch_norm(x, Tensor(), Tensor(), zeros({4}), Tensor(), true); },
              {"batch_norm", "weight", "[4]", "[3]"});
  check_error([&] { ops::batch_norm(x, Tensor(), Tensor(), zeros({3}, kFloat64), Tensor(), true); },
              {"batch_norm", "weight", "float64", "float32"});
  check_error([&] { ops::batch_norm(zeros({4}), Tensor(), Tensor(), Tensor(), Tensor(), true); },
              {"batch_norm", "at least 2 dims"});
  check_error(
      [&] {
        ops::batch_norm(zeros({4, 3}, kInt64), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {"batch_norm", "floating-point"});
  const ops::BatchNormResult r = ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  check_error(
      [&] {
        ops::batch_norm_backward(zeros({4, 3}), x, Tensor(), r.mean, r.invstd, true);
      },
      {"batch_norm_backward", "grad_out"});
  check_error([&] { ops::batch_norm_backward(x, x, Tensor(), r.mean.to(kFloat64), r.invstd, true); },
              {"batch_norm_backward", "mean and invstd"});
  // An empty batch in eval normalizes nothing; its parameter gradients are zeros.
  const ops::BatchNormResult e = ops::batch_norm(zeros({0, 3, 2}), zeros({3}), ones({3}), ones({3}), zeros({3}), false);
  CHECK(e.out.sizes() == Shape{0, 3, 2});
  const ops::BatchNormGrads eg =
      ops::batch_norm_backward(zeros({0, 3, 2}), zeros({0, 3, 2}), ones({3}), e.mean, e.invstd, false);
  check_close(eg.weight, {0, 0, 0}, 0, 0, "empty grad_weight");
}

namespace {

/// The folded affine map of a batch norm ((C), compute dtype): scale = weight invstd, shift =
/// bias - mean scale (weight 1, bias 0 where undefined), formed with the raw ops.
std::pair<Tensor, Tensor> fold(const ops::BatchNormResult& r, const Tensor& w, const Tensor& b) {
  const DType compute = r.mean.dtype();
  const Tensor scale = w.defined() ? ops::mul(w.to(compute), r.invstd) : r.invstd.clone();
  const Tensor bias = b.defined() ? b.to(compute) : zeros(r.mean.sizes(), compute);
  return {scale, ops::sub(bias, ops::mul(r.mean, scale))};
}

struct GradRef {
  std::vector<double> x, weight, bias;
};

/// The backward of relu(x scale + shift) = relu(bn(x)) by its definition, in float64 from the
/// values of g, x (N, C, *) and the (C) tensors; ReLU's mask formed as the op forms it: a
/// multiply then an add, each rounded, in the compute dtype (f32: float, else double).
GradRef naive_relu_affine_backward(const Tensor& g, const Tensor& x, const Tensor& scale, const Tensor& shift,
                                   const Tensor& w, const Tensor& mean, const Tensor& invstd, bool training) {
  const int64_t N = x.size(0), C = x.size(1), L = N * C == 0 ? 0 : x.numel() / (N * C), M = N * L;
  const bool f32 = mean.dtype() == kFloat32;
  const std::vector<double> gv = values_of(g), xv = values_of(x), sc = values_of(scale), sh = values_of(shift),
                            m = values_of(mean), is = values_of(invstd);
  const std::vector<double> wv = w.defined() ? values_of(w) : std::vector<double>(size_t(C), 1.0);
  GradRef r{std::vector<double>(xv.size()), std::vector<double>(size_t(C)), std::vector<double>(size_t(C))};
  std::vector<double> gz(xv.size());
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0, sum_xmu = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < L; ++j) {
        const size_t i = size_t((n * C + c) * L + j);
        double a;
        if (f32) {
          const float p = float(xv[i]) * float(sc[size_t(c)]);
          a = double(p + float(sh[size_t(c)]));
        } else {
          const double p = xv[i] * sc[size_t(c)];
          a = p + sh[size_t(c)];
        }
        gz[i] = a <= 0 ? 0.0 : gv[i];
        sum += gz[i], sum_xmu += gz[i] * (xv[i] - m[size_t(c)]);
      }
    r.bias[size_t(c)] = sum;
    r.weight[size_t(c)] = sum_xmu * is[size_t(c)];
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < L; ++j) {
        const size_t i = size_t((n * C + c) * L + j);
        const double k = wv[size_t(c)] * is[size_t(c)];
        r.x[i] = training ? k * (gz[i] - sum / double(M) -
                                 (xv[i] - m[size_t(c)]) * is[size_t(c)] * is[size_t(c)] * sum_xmu / double(M))
                          : k * gz[i];
      }
  }
  return r;
}

/// |actual - expected| <= rtol * max |expected| for every entry (sums in another order).
void check_scaled(const Tensor& actual, const std::vector<double>& expected, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(actual.defined(), what);
  double emax = 0;
  for (double e : expected) emax = std::max(emax, std::fabs(e));
  check_close(actual, expected, rtol, rtol * emax, what);
}

}  // namespace

TEST_CASE("batch_norm_relu_backward_affine: the backward of relu(x scale + shift) by its definition") {
  uint64_t seed = 900;
  for (const Shape& xs : {Shape{2, 3, 4, 5}, Shape{3, 4, 7}, Shape{5, 2}})
    for (DType t : kAllFloat)
      for (bool training : {true, false})
        for (bool affine : {true, false})
          for (bool channels_last : {false, true}) {
            if (channels_last && xs.size() != 4) continue;
            CAPTURE(shape_str(xs));
            CAPTURE(dtype_name(t));
            CAPTURE(training);
            CAPTURE(affine);
            CAPTURE(channels_last);
            const int64_t C = xs[1];
            const DType compute = t == kFloat64 ? kFloat64 : kFloat32;
            Tensor x = random_tensor(xs, t, ++seed, Layout::Contiguous, -1.0, 3.0), g = random_tensor(xs, t, ++seed);
            if (channels_last) x = to_channels_last(x);
            const Tensor w = affine ? random_tensor({C}, compute, ++seed) : Tensor();
            const Tensor b = affine ? random_tensor({C}, compute, ++seed) : Tensor();
            const Tensor rm = random_tensor({C}, compute, ++seed), rv = random_tensor({C}, compute, ++seed, {}, 0.5, 2);
            const ops::BatchNormResult f = ops::batch_norm(x, rm, rv, w, b, training);
            const auto [scale, shift] = fold(f, w, b);
            const ops::BatchNormGrads gr =
                ops::batch_norm_relu_backward_affine(g, x, scale, shift, w, f.mean, f.invstd, training);
            CHECK(gr.x.dtype() == t);
            CHECK(suggests_channels_last(gr.x) == channels_last);
            CHECK(gr.weight.dtype() == compute);
            CHECK_FALSE(gr.residual.defined());
            // (a) the definition in float64
            const GradRef ref = naive_relu_affine_backward(g, x, scale, shift, w, f.mean, f.invstd, training);
            check_scaled(gr.x, ref.x, 4 * default_rtol(t), "grad_x");
            check_scaled(gr.weight, ref.weight, 4 * default_rtol(compute), "grad_weight");
            check_scaled(gr.bias, ref.bias, 4 * default_rtol(compute), "grad_bias");
            // (b) batch_norm_add_relu_backward given out = relu(bn(x)) formed in float64: the same mask
            std::vector<double> out(ref.x.size());
            const std::vector<double> xv = values_of(x), m = values_of(f.mean), is = values_of(f.invstd);
            const std::vector<double> wv = affine ? values_of(w) : std::vector<double>(),
                                      bv = affine ? values_of(b) : wv;
            const int64_t L = x.numel() / (xs[0] * C);
            for (size_t i = 0; i < out.size(); ++i) {
              const size_t c = size_t((int64_t(i) / L) % C);
              const double y = (xv[i] - m[c]) * is[c] * (affine ? wv[c] : 1.0) + (affine ? bv[c] : 0.0);
              out[i] = y > 0 ? y : 0.0;
            }
            Tensor out_t = make_tensor(out, xs, t);
            if (channels_last) out_t = to_channels_last(out_t);
            ops::BatchNormSaved saved;
            saved.residual = false;
            const ops::BatchNormGrads ga =
                ops::batch_norm_add_relu_backward(g, x, out_t, w, b, f.mean, f.invstd, training, {}, saved);
            CHECK_FALSE(ga.residual.defined());
            check_scaled(gr.x, values_of(ga.x), default_rtol(t), "grad_x vs batch_norm_add_relu_backward");
            check_scaled(gr.weight, values_of(ga.weight), default_rtol(compute), "grad_weight vs add_relu");
            check_scaled(gr.bias, values_of(ga.bias), default_rtol(compute), "grad_bias vs add_relu");
          }
}

TEST_CASE("batch_norm_relu_backward_affine: masks, an empty batch, errors") {
  const Shape xs{4, 3, 2, 2};
  const Tensor x = random_tensor(xs, kFloat32, 1), g = random_tensor(xs, kFloat32, 2),
               w = random_tensor({3}, kFloat32, 3);
  const ops::BatchNormResult f = ops::batch_norm(x, Tensor(), Tensor(), w, Tensor(), true);
  const auto [scale, shift] = fold(f, w, Tensor());
  const ops::BatchNormGrads all = ops::batch_norm_relu_backward_affine(g, x, scale, shift, w, f.mean, f.invstd, true);
  // Only the parameters' grads, or only x's: the same values.
  const ops::BatchNormGrads params = ops::batch_norm_relu_backward_affine(g, x, scale, shift, w, f.mean, f.invstd, true,
                                                                          {.x = false, .weight = true, .bias = true});
  CHECK_FALSE(params.x.defined());
  CHECK(values_of(params.weight) == values_of(all.weight));
  CHECK(values_of(params.bias) == values_of(all.bias));
  const ops::BatchNormGrads only_x = ops::batch_norm_relu_backward_affine(g, x, scale, shift, w, f.mean, f.invstd, true,
                                                                          {.x = true, .weight = false, .bias = false});
  CHECK_FALSE(only_x.weight.defined());
  CHECK_FALSE(only_x.bias.defined());
  CHECK(values_of(only_x.x) == values_of(all.x));

  // An empty batch: grad_x is empty, the parameter gradients are sums over nothing.
  for (bool training : {true, false}) {
    const Tensor e = zeros({0, 3, 2, 2});
    const ops::BatchNormGrads eg =
        ops::batch_norm_relu_backward_affine(e, e, scale, shift, Tensor(), f.mean, f.invstd, training);
    CHECK(eg.x.sizes() == Shape{0, 3, 2, 2});
    check_close(eg.weight, {0, 0, 0}, 0, 0, "empty grad_weight");
    check_close(eg.bias, {0, 0, 0}, 0, 0, "empty grad_bias");
  }

  constexpr const char* op = "batch_norm_relu_backward_affine";
  check_error([&] { ops::batch_norm_relu_backward_affine(g, x, zeros({4}), shift, w, f.mean, f.invstd, true); },
              {op, "scale", "[4]", "must have shape [3]", "[4, 3, 2, 2]"});
  check_error(
      [&] {
        ops::batch_norm_relu_backward_affine(g, x, scale, zeros({3, 1}), w, f.mean, f.invstd, true);
      },
      {op, "shift", "[3, 1]", "must have shape [3]"});
  check_error([&] { ops::batch_norm_relu_backward_affine(g, x, scale.to(kFloat64), shift, w, f.mean, f.invstd, true); },
              {op, "scale", "float64", "dtype float32"});
  const Tensor xh = x.to(kFloat16);
  check_error(
      [&] {
        ops::batch_norm_relu_backward_affine(g.to(kFloat16), xh, scale, shift.to(kFloat16), w, f.mean, f.invstd, true);
      },
      {op, "shift", "float16", "dtype float32", "compute dtype"});
  check_error([&] { ops::batch_norm_relu_backward_affine(g, x, Tensor(), shift, w, f.mean, f.invstd, true); },
              {op, "scale", "undefined"});
  check_error([&] { ops::batch_norm_relu_backward_affine(g.to(kFloat64), x, scale, shift, w, f.mean, f.invstd, true); },
              {op, "grad_out", "must match the input"});
  check_error([&] { ops::batch_norm_relu_backward_affine(g, x, scale, shift, w, f.mean.to(kFloat64), f.invstd, true); },
              {op, "mean and invstd"});
  check_error([&] { ops::batch_norm_relu_backward_affine(g, x, scale, shift, zeros({2}), f.mean, f.invstd, true); },
              {op, "weight", "[2]"});
}

TEST_CASE("nn: BatchNorm2d has torchvision's names, tracks batches, and switches statistics with the mode") {
  nn::BatchNorm2d bn(3);
  std::vector<std::string> keys;
  for (const auto& [k, v] : bn.state_dict()) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"});
  CHECK(bn.named_parameters().size() == 2);
  CHECK(bn.num_batches_tracked.dtype() == kInt64);
  CHECK(bn.num_batches_tracked.dim() == 0);
  check_close(bn.weight, {1, 1, 1}, 0, 0, "weight starts at one");
  check_close(bn.running_var, {1, 1, 1}, 0, 0, "running_var starts at one");
  CHECK(bn.extra_repr() == "3, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true");

  const Tensor x = random_tensor({4, 3, 5, 5}, kFloat32, 1, Layout::Contiguous, 0.0, 4.0);
  const std::vector<double> xv = values_of(x);
  const Tensor y = bn(x);  // training
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);
  const BnRef ref = naive_bn(xv, x.sizes(), nullptr, nullptr, {0, 0, 0}, {1, 1, 1}, true, 0.1, 1e-5);
  check_close(y, ref.y, 1e-4, 1e-5, "training forward");
  check_close(bn.running_mean, ref.rm, 1e-5, 1e-6, "running_mean");
  check_close(bn.running_var, ref.rv, 1e-5, 1e-6, "running_var");
  y.backward(ones_like(y));
  CHECK(bn.weight.grad().defined());

  bn.eval();
  const Tensor ye = bn(x);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);
  const BnRef refe = naive_bn(xv, x.sizes(), nullptr, nullptr, ref.rm, ref.rv, false, 0.1, 1e-5);
  check_close(ye, refe.y, 1e-4, 1e-5, "eval forward");

  // momentum = None: a cumulative average of the batch statistics.
  nn::BatchNorm2d cum(3, {.momentum = std::nullopt});
  const Tensor x2 = random_tensor({4, 3, 5, 5}, kFloat32, 2);
  cum(x);
  cum(x2);
  const BnRef r1 = naive_bn(xv, x.sizes(), nullptr, nullptr, {0, 0, 0}, {1, 1, 1}, true, 1.0, 1e-5);
  const BnRef r2 = naive_bn(values_of(x2), x.sizes(), nullptr, nullptr, r1.rm, r1.rv, true, 0.5, 1e-5);
  check_close(cum.running_mean, r2.rm, 1e-5, 1e-6, "cumulative running_mean");
  CHECK(cum.num_batches_tracked.item<int64_t>() == 2);
  CHECK(cum.extra_repr().find("momentum=None") != std::string::npos);

  // Without running statistics: no buffers, batch statistics in eval too; without affine: no parameters.
  nn::BatchNorm2d plain(3, {.affine = false, .track_running_stats = false});
  CHECK(plain.state_dict().empty());
  plain.eval();
  check_close(plain(x), ref.y, 1e-4, 1e-5, "batch statistics in eval");

  // torchvision-style checkpoint keys load; half conversion keeps the counter int64.
  nn::Sequential seq({std::make_shared<nn::BatchNorm2d>(3)});
  std::map<std::string, Tensor> state = {{"0.weight", full({3}, 2.0)},
                                         {"0.bias", full({3}, 0.5)},
                                         {"0.running_mean", full({3}, 1.0)},
                                         {"0.running_var", full({3}, 4.0)},
                                         {"0.num_batches_tracked", full({}, 7.0, kInt64)}};
  seq.load_state_dict(state);
  seq.eval();
  const Tensor ys = seq.forward(full({2, 3, 1, 1}, 3.0));
  check_close(ys, std::vector<double>(6, 2.0 * (3.0 - 1.0) / std::sqrt(4.0 + 1e-5) + 0.5), 1e-6, 0, "loaded");
  seq.to(kFloat16);
  CHECK(seq.state_dict().back().second.dtype() == kInt64);
  CHECK(seq.state_dict().back().second.item<int64_t>() == 7);
  check_error([&] { bn(zeros({4, 2, 5, 5})); }, {"BatchNorm2d", "[4, 2, 5, 5]"});
}

// PyTorch's golden (torch 1.13, float64): BatchNorm1d(3) with weight (1.5, -0.5, 2), bias (0.1,
// 0.2, -0.3) on a (4, 3) batch, training; the backward of sum(y * arange(12).view(4, 3)).
TEST_CASE("nn: BatchNorm1d normalizes (N, C) and (N, C, L) as PyTorch's; BatchNorm3d (N, C, D, H, W)") {
  nn::BatchNorm1d bn(3);
  CHECK(bn.type_name() == "BatchNorm1d");
  bn.weight.detach().copy_(from_vector(std::vector<double>{1.5, -0.5, 2.0}, {3}, kFloat32));
  bn.bias.detach().copy_(from_vector(std::vector<double>{0.1, 0.2, -0.3}, {3}, kFloat32));
  bn.to(kFloat64);
  const Tensor x =
      from_vector(std::vector<double>{1.0, -2.0, 0.5, 3.0, 4.0, -1.5, 0.25, 2.0, 2.5, -1.0, 0.0, 1.0}, {4, 3}, kFloat64)
          .requires_grad_(true);
  const Tensor y = bn(x);
  check_close(y,
              {0.29382826270776974, 0.8708197254107821, -0.4747403964069171, 2.3613297156960753, -0.4708197194503177,
               -3.2705865481827283, -0.48148478216284485, -0.023606571163284407, 2.321105755368894, -1.7736731902805358,
               0.4236065771237489, 0.22422114153703565},
              1e-12, 1e-12, "BatchNorm1d (N, C) training output");
  check_close(bn.running_mean, {0.08125, 0.1, 0.0625}, 1e-12, 0, "running_mean");
  check_close(bn.running_var, {1.1807291666666666, 1.5666666666666669, 1.1729166666666666}, 1e-12, 0,
              "running_var (unbiased)");
  sum(mul(y, arange(12, kFloat64).view({4, 3}))).backward();
  check_close(x.grad(),
              {-4.349809686427292, 0.8049840694076884, -6.114580421150831, 1.9735073762167175, 0.5366553754534115,
               0.8963635320287839, 0.6444203413520431, -0.2683280231358961, -0.5442166913392963, 1.731881968858532,
               -1.0733114217252038, 5.762433580461344},
              1e-10, 1e-12, "BatchNorm1d input gradient");
  check_close(bn.weight.grad(), {-9.045318856823839, 2.6832788897221995, 5.76643268803761}, 1e-10, 1e-12,
              "BatchNorm1d weight gradient");

  // (N, C, L) and (N, C, D, H, W): the statistics run over every dim but C, as the float64 definition.
  for (const Shape& xs : {Shape{3, 4, 5}, Shape{1, 4, 2}, Shape{2, 4, 3, 2, 3}}) {
    CAPTURE(xs);
    std::unique_ptr<nn::BatchNorm> m;
    if (xs.size() == 3) m = std::make_unique<nn::BatchNorm1d>(4);
    else m = std::make_unique<nn::BatchNorm3d>(4);
    const Tensor xi = random_tensor(xs, kFloat32, 7, Layout::Strided, -1.0, 3.0);  // a non-contiguous view
    const std::vector<double> xv = values_of(xi);
    const BnRef train = naive_bn(xv, xs, nullptr, nullptr, {0, 0, 0, 0}, {1, 1, 1, 1}, true, 0.1, 1e-5);
    check_close((*m)(xi), train.y, 1e-4, 1e-5, "training");
    check_close(m->running_var, train.rv, 1e-5, 1e-6, "running_var");
    m->eval();
    check_close((*m)(xi), naive_bn(xv, xs, nullptr, nullptr, train.rm, train.rv, false, 0.1, 1e-5).y, 1e-4, 1e-5,
                "eval");
  }

  // The ranks PyTorch accepts, and one value per channel in training, refused by name.
  check_error([&] { bn(zeros({2, 3, 4, 5}, kFloat64)); }, {"BatchNorm1d", "(N, C) or (N, C, L)", "[2, 3, 4, 5]"});
  check_error([&] { bn(zeros({2, 4}, kFloat64)); }, {"BatchNorm1d", "C = 3", "[2, 4]"});
  check_error([&] { bn(zeros({1, 3}, kFloat64)); }, {"more than 1 value per channel", "[1, 3]"});
  check_error([&] { nn::BatchNorm3d(2)(zeros({2, 2, 3, 3})); }, {"BatchNorm3d", "(N, C, D, H, W)", "[2, 2, 3, 3]"});
  check_error([&] { nn::BatchNorm2d(2)(zeros({2, 2, 9})); }, {"BatchNorm2d", "(N, C, H, W)", "[2, 2, 9]"});
  check_error([] { nn::BatchNorm1d(0); }, {"BatchNorm1d", "num_features must be positive"});
}
