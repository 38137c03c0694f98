// layer_norm: the raw op against float64 loops written here (its Jacobian by hand for the
// backward), the differentiable op (autograd/ops/norm.h) through gradcheck in float64, empty
// inputs and every error path.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops/norm.h"
#include "tensor/factory.h"
#include "tensor/ops/norm.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

/// Absolute tolerance for O(1) results stored in dt.
double atol_for(DType dt) { return dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : default_rtol(dt); }

// ---- layer norm reference -----------------------------------------------------

struct LayerNormRef {
  std::vector<double> y, mean, rstd;
};

/// x: (M, N) row-major; w, b: (N) or empty.
LayerNormRef ref_layer_norm(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                            int64_t M, int64_t N, double eps) {
  LayerNormRef r{std::vector<double>(x.size()), std::vector<double>(size_t(M)), std::vector<double>(size_t(M))};
  for (int64_t i = 0; i < M; ++i) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < N; ++j) mu += x[size_t(i * N + j)];
    mu /= double(N);
    for (int64_t j = 0; j < N; ++j) var += (x[size_t(i * N + j)] - mu) * (x[size_t(i * N + j)] - mu);
    var /= double(N);
    r.mean[size_t(i)] = mu;
    r.rstd[size_t(i)] = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < N; ++j) {
      const double xhat = (x[size_t(i * N + j)] - mu) * r.rstd[size_t(i)];
      r.y[size_t(i * N + j)] = xhat * (w.empty() ? 1.0 : w[size_t(j)]) + (b.empty() ? 0.0 : b[size_t(j)]);
    }
  }
  return r;
}

/// dx by the full Jacobian: d xhat_j / d x_k = rstd * (delta_jk - 1/N - xhat_j xhat_k / N).
std::vector<double> ref_layer_norm_dx(const std::vector<double>& x, const std::vector<double>& g,
                                      const std::vector<double>& w, int64_t M, int64_t N, double eps) {
  const LayerNormRef f = ref_layer_norm(x, {}, {}, M, N, eps);  // f.y = xhat
  std::vector<double> dx(x.size(), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < N; ++k)
      for (int64_t j = 0; j < N; ++j) {
        const double xj = f.y[size_t(i * N + j)], xk = f.y[size_t(i * N + k)];
        const double jac = f.rstd[size_t(i)] * ((j == k ? 1.0 : 0.0) - 1.0 / double(N) - xj * xk / double(N));
        dx[size_t(i * N + k)] += g[size_t(i * N + j)] * (w.empty() ? 1.0 : w[size_t(j)]) * jac;
      }
  return dx;
}

}  // namespace

TEST_CASE("nn_functional: layer_norm matches float64 loops in every dtype, layout and affine case") {
  struct Case {
    Shape x, normalized;
  };
  uint64_t seed = 1;
  for (const Case& c : {Case{{5, 7}, {7}}, Case{{2, 3, 4, 6}, {4, 6}}, Case{{3, 1500}, {1500}}, Case{{6, 1}, {1}}}) {
    const int64_t N = numel_of(c.normalized), M = numel_of(c.x) / N;
    for (DType dt : kFloatTypes) {
      for (Layout layout : kAllLayouts) {
        for (int affine = 0; affine < 4; ++affine) {
          const std::string what = name_of(dt, layout) + " " + shape_str(c.x) + " affine " + std::to_string(affine);
          const Tensor x = random_tensor(c.x, dt, seed++, layout, -3, 5);
          const Tensor w = affine & 1 ? random_tensor(c.normalized, dt, seed++) : Tensor();
          const Tensor b = affine & 2 ? random_tensor(c.normalized, dt, seed++) : Tensor();
          const double eps = affine == 3 ? 1e-2 : 1e-5;
          const ops::LayerNormResult r = ops::layer_norm(x, c.normalized, w, b, eps);
          const LayerNormRef ref = ref_layer_norm(values_of(x), w.defined() ? values_of(w) : std::vector<double>{},
                                                  b.defined() ? values_of(b) : std::vector<double>{}, M, N, eps);
          CHECK(r.out.sizes() == c.x);
          CHECK(r.out.dtype() == dt);
          CHECK(r.mean.sizes() == Shape(c.x.begin(), c.x.end() - int64_t(c.normalized.size())));
          CHECK(r.mean.dtype() == (dt == kFloat64 ? kFloat64 : kFloat32));
          check_close(r.out, ref.y, default_rtol(dt), atol_for(dt), "y " + what);
          check_close(r.mean, ref.mean, dt == kFloat64 ? 1e-12 : 1e-6, 1e-6, "mean " + what);
          check_close(r.rstd, ref.rstd, dt == kFloat64 ? 1e-12 : 1e-5, 0, "rstd " + what);
        }
      }
    }
  }
}

TEST_CASE("nn_functional: layer_norm_backward matches the Jacobian by hand") {
  uint64_t seed = 100;
  for (DType dt : kFloatTypes) {
    for (bool with_w : {false, true}) {
      const int64_t M = 6, N = 9;
      const std::string what = name_of(dt) + (with_w ? " weight" : " no weight");
      const Tensor x = random_tensor({2, 3, N}, dt, seed++, Layout::Contiguous, -2, 3);
      const Tensor g = random_tensor({2, 3, N}, dt, seed++, Layout::Strided);
      const Tensor w = with_w ? random_tensor({N}, dt, seed++) : Tensor();
      const ops::LayerNormResult f = ops::layer_norm(x, {N}, w, Tensor(), 1e-5);
      const ops::LayerNormGrads gr = ops::layer_norm_backward(g, x, {N}, f.mean, f.rstd, w, /*has_bias=*/true);
      const std::vector<double> xv = values_of(x), gv = values_of(g);
      const std::vector<double> wv = with_w ? values_of(w) : std::vector<double>{};
      const std::vector<double> dx = ref_layer_norm_dx(xv, gv, wv, M, N, 1e-5);
      const LayerNormRef xhat = ref_layer_norm(xv, {}, {}, M, N, 1e-5);
      std::vector<double> dw(size_t(N), 0.0), db(size_t(N), 0.0);
      for (int64_t i = 0; i < M * N; ++i) {
        dw[size_t(i % N)] += gv[size_t(i)] * xhat.y[size_t(i)];
        db[size_t(i % N)] += gv[size_t(i)];
      }
      const double rtol = dt == kFloat64 ? 1e-10 : default_rtol(dt) * 4, atol = dt == kFloat64 ? 1e-10 : rtol * 4;
      check_close(gr.x, dx, rtol, atol, "dx " + what);
      CHECK(gr.weight.defined() == with_w);
      if (with_w) check_close(gr.weight, dw, rtol, atol, "dweight " + what);
      check_close(gr.bias, db, rtol, atol, "dbias " + what);
      // Only what is asked for.
      const ops::LayerNormGrads only_x =
          ops::layer_norm_backward(g, x, {N}, f.mean, f.rstd, w, true, {.x = true, .weight = false, .bias = false});
      CHECK_FALSE(only_x.weight.defined());
      CHECK_FALSE(only_x.bias.defined());
      check_close(only_x.x, dx, rtol, atol, "dx only " + what);
    }
  }
}

TEST_CASE("nn_functional: layer_norm_apply writes layer_norm's output from its statistics") {
  // Bitwise the forward's (Note [Recomputable outputs] regenerates outputs with it), in every
  // dtype, affine or not, over one or two normalized dims, from a strided input.
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16})
    for (bool affine : {false, true})
      for (const Shape& ns : std::vector<Shape>{{6}, {4, 6}}) {
        CAPTURE(dtype_name(dt));
        CAPTURE(affine);
        const Tensor x = random_tensor({3, 4, 6}, dt, 1, Layout::Strided);
        const Tensor w = affine ? random_tensor(ns, dt, 2) : Tensor(), b = affine ? random_tensor(ns, dt, 3) : Tensor();
        const ops::LayerNormResult r = ops::layer_norm(x, ns, w, b);
        CHECK(values_of(ops::layer_norm_apply(x, ns, r.mean, r.rstd, w, b)) == values_of(r.out));
      }
  check_error(
      [] {
        const Tensor x = zeros({3, 4});
        ops::layer_norm_apply(x, {4}, zeros({4}), zeros({3}));
      },
      {"layer_norm_apply: mean and rstd must be statistics of shape [3] and dtype float32", "float32[4] cpu"});
}

TEST_CASE("nn_functional: layer_norm on empty inputs and its errors") {
  const ops::LayerNormResult e = ops::layer_norm(zeros({0, 4}), {4}, ones({4}), zeros({4}));
  CHECK(e.out.sizes() == Shape{0, 4});
  CHECK(e.mean.sizes() == Shape{0});
  const ops::LayerNormGrads eg =
      ops::layer_norm_backward(zeros({0, 4}), zeros({0, 4}), {4}, e.mean, e.rstd, ones({4}), true);
  check_close(eg.weight, {0, 0, 0, 0}, 0, 0, "empty dweight");
  check_close(eg.bias, {0, 0, 0, 0}, 0, 0, "empty dbias");
  const Tensor x = zeros({2, 3});
  check_error([&] { ops::layer_norm(x, {4}); }, {"layer_norm", "float32[2, 3] cpu", "[4]"});
  check_error([&] { ops::layer_norm(x, {2, 3, 1}); }, {"layer_norm", "normalized_shape"});
  check_error([&] { ops::layer_norm(x, {}); }, {"layer_norm", "at least one dim"});
  check_error([&] { ops::layer_norm(x, {3}, ones({4})); }, {"layer_norm", "weight", "float32[4] cpu", "[3]"});
  check_error([&] { ops::layer_norm(x, {3}, Tensor(), ones({3}, kFloat64)); }, {"layer_norm", "bias", "float64"});
  check_error([&] { ops::layer_norm(zeros({2, 3}, kInt64), {3}); }, {"layer_norm", "floating", "int64"});
  check_error([&] { layer_norm(x, {3}, ones({2})); }, {"layer_norm", "weight"});
  const ops::LayerNormResult f = ops::layer_norm(x, {3});
  check_error(
      [&] {
        ops::layer_norm_backward(zeros({2, 4}), x, {3}, f.mean, f.rstd, Tensor(), false);
      },
      {"layer_norm_backward", "grad_out", "float32[2, 4] cpu"});
  check_error([&] { ops::layer_norm_backward(x, x, {3}, zeros({3}), f.rstd, Tensor(), false); },
              {"layer_norm_backward", "mean and rstd"});
}
