// Functional ops for nn layers: layer_norm, cross_entropy, dropout, mse_loss,
// masked_softmax and scaled_dot_product_attention. The raw ops against float64 loops
// written here (layer_norm's Jacobian by hand, PyTorch's cross-entropy formula, the
// Philox mask formula), the differentiable ops through gradcheck in float64, and
// every error path.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/dropout.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/masked_softmax.h"
#include "autograd/ops/norm.h"
#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/norm.h"
#include "tensor/philox.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::gradcheck;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

std::string name_of(DType dt, Layout l = Layout::Contiguous) {
  return std::string(dtype_name(dt)) + " " + layout_name(l);
}

/// Absolute tolerance for O(1) results stored in dt.
double atol_for(DType dt) { return dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : default_rtol(dt); }

Tensor leaf(const Shape& s, uint64_t seed, double lo = -2, double hi = 2) {
  Tensor t = random_tensor(s, kFloat64, seed, Layout::Contiguous, lo, hi);
  t.requires_grad_();
  return t;
}

void check_gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& in) {
  const auto r = gradcheck(f, in);
  CHECK_MESSAGE(r.ok, r.report);
}

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

// ---- cross entropy reference --------------------------------------------------

struct CrossEntropyRef {
  std::vector<double> rows;  // per-row loss, 0 where ignored
  double sum = 0, count = 0;
  std::vector<double> grad;  // d(sum of row losses)/d logits, per row unscaled
};

/// PyTorch's formula: (1 - e) * nll + (e / C) * sum_c(-log_softmax), rows with
/// target == ignore_index contribute nothing. x: (R, C) row-major.
CrossEntropyRef ref_cross_entropy(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t R, int64_t C,
                                  int64_t ignore, double e) {
  CrossEntropyRef r{std::vector<double>(size_t(R), 0.0), 0, 0, std::vector<double>(x.size(), 0.0)};
  for (int64_t i = 0; i < R; ++i) {
    if (t[size_t(i)] == ignore) continue;
    double m = -kInf, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[size_t(i * C + c)]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[size_t(i * C + c)] - m);
    const double lse = m + std::log(s);
    double smooth = 0;
    for (int64_t c = 0; c < C; ++c) smooth -= x[size_t(i * C + c)] - lse;
    const double nll = -(x[size_t(i * C + t[size_t(i)])] - lse);
    r.rows[size_t(i)] = (1 - e) * nll + e / double(C) * smooth;
    r.sum += r.rows[size_t(i)];
    r.count += 1;
    for (int64_t c = 0; c < C; ++c) {
      const double p = std::exp(x[size_t(i * C + c)] - lse);
      r.grad[size_t(i * C + c)] = (1 - e) * (p - (c == t[size_t(i)] ? 1.0 : 0.0)) + e / double(C) * (double(C) * p - 1);
    }
  }
  return r;
}

// ---- masked softmax reference -------------------------------------------------

/// softmax(scale * x + mask) over rows of S; mask(row, s) returns the additive value
/// (-inf for masked); rows without a finite entry give zeros.
template <typename MaskFn>
std::vector<double> ref_masked_softmax(const std::vector<double>& x, int64_t rows, int64_t S, double scale,
                                       MaskFn mask) {
  std::vector<double> y(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> z(static_cast<size_t>(S));
    double m = -kInf;
    for (int64_t s = 0; s < S; ++s) {
      z[size_t(s)] = scale * x[size_t(r * S + s)] + mask(r, s);
      m = std::max(m, z[size_t(s)]);
    }
    if (m == -kInf) continue;
    double sum = 0;
    for (int64_t s = 0; s < S; ++s) sum += std::exp(z[size_t(s)] - m);
    for (int64_t s = 0; s < S; ++s) y[size_t(r * S + s)] = std::exp(z[size_t(s)] - m) / sum;
  }
  return y;
}

}  // namespace

// =================================== layer_norm ===================================

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

TEST_CASE("nn_functional: layer_norm passes gradcheck with and without affine, non-contiguous input") {
  const Tensor x = leaf({3, 2, 5}, 1), w = leaf({2, 5}, 2), b = leaf({2, 5}, 3);
  check_gradcheck([](const TensorList& in) { return layer_norm(in[0], {2, 5}, in[1], in[2]); }, {x, w, b});
  check_gradcheck([](const TensorList& in) { return layer_norm(in[0], {5}, Tensor(), Tensor(), 1e-3); }, {x});
  const Tensor w5 = leaf({5}, 4);
  check_gradcheck([](const TensorList& in) { return layer_norm(in[0], {5}, in[1]); }, {x, w5});
  const Tensor xt = leaf({6, 4}, 5), w6 = leaf({6}, 6), b6 = leaf({6}, 7);
  check_gradcheck([](const TensorList& in) { return layer_norm(in[0].t(), {6}, in[1], in[2]); }, {xt, w6, b6});
  // Gradients only for some inputs: a frozen weight.
  check_gradcheck([&](const TensorList& in) { return layer_norm(in[0], {6}, w6.detach(), in[1]); },
                  {leaf({3, 6}, 8), b6});
}

// ================================= cross_entropy ==================================

TEST_CASE("nn_functional: cross_entropy matches PyTorch's formula (smoothing, ignore_index, reductions)") {
  uint64_t seed = 200;
  const int64_t R = 7, C = 5;
  const std::vector<int64_t> t = {0, 4, -100, 2, 2, 1, -100};
  for (DType dt : kFloatTypes) {
    for (double e : {0.0, 0.1, 0.35}) {
      for (Layout layout : {Layout::Contiguous, Layout::Transposed}) {
        const std::string what = name_of(dt, layout) + " smoothing " + std::to_string(e);
        const Tensor x = random_tensor({R, C}, dt, seed++, layout, -4, 4);
        const Tensor target = from_vector(t, {R});
        const CrossEntropyRef ref = ref_cross_entropy(values_of(x), t, R, C, -100, e);
        const double rtol = std::max(default_rtol(dt), 1e-6), atol = dt == kFloat64 ? 1e-12 : 1e-6;
        const auto none = ops::cross_entropy(x, target, {.label_smoothing = e, .reduction = Reduction::None});
        CHECK(none.loss.sizes() == Shape{R});
        CHECK(none.loss.dtype() == dt);
        check_close(none.loss, ref.rows, rtol, atol, "none " + what);
        const auto sum = ops::cross_entropy(x, target, {.label_smoothing = e, .reduction = Reduction::Sum});
        CHECK(sum.loss.dim() == 0);
        check_close(sum.loss, {ref.sum}, rtol, atol, "sum " + what);
        const auto mean = ops::cross_entropy(x, target, {.label_smoothing = e});
        check_close(mean.loss, {ref.sum / ref.count}, rtol, atol, "mean " + what);
        check_close(mean.count, {ref.count}, 0, 0, "count " + what);
        // Backward: g per row (None), or one g scaled by 1 / count (Mean).
        const Tensor g = random_tensor({R}, dt, seed++);
        const std::vector<double> gv = values_of(g);
        std::vector<double> want(size_t(R * C));
        for (int64_t i = 0; i < R * C; ++i) want[size_t(i)] = gv[size_t(i / C)] * ref.grad[size_t(i)];
        const double grtol = dt == kFloat64 ? 1e-10 : default_rtol(dt), gatol = dt == kFloat64 ? 1e-12 : 1e-6;
        check_close(ops::cross_entropy_backward(g, x, target, none.lse, Tensor(),
                                                {.label_smoothing = e, .reduction = Reduction::None}),
                    want, grtol, gatol, "grad none " + what);
        const Tensor g0 = full({}, 0.75, dt);
        for (int64_t i = 0; i < R * C; ++i) want[size_t(i)] = 0.75 / ref.count * ref.grad[size_t(i)];
        check_close(ops::cross_entropy_backward(g0, x, target, mean.lse, mean.count, {.label_smoothing = e}), want,
                    grtol, gatol, "grad mean " + what);
      }
    }
  }
}

TEST_CASE("nn_functional: cross_entropy with spatial dims, 1-D logits, int32 targets, all ignored, large C") {
  // (N, C, d1, d2): classes at dim 1, as PyTorch.
  const int64_t N = 2, C = 4, d1 = 3, d2 = 2;
  const Tensor x = random_tensor({N, C, d1, d2}, kFloat64, 300, Layout::Contiguous, -3, 3);
  const Tensor t = random_tensor({N, d1, d2}, kFloat64, 301, Layout::Contiguous, 0, 4).to(kInt64);
  const std::vector<double> xv = values_of(x);
  const std::vector<int64_t> tv = t.tolist<int64_t>();
  std::vector<double> rows_x;  // (N, d1, d2, C) row-major
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < d1 * d2; ++i)
      for (int64_t c = 0; c < C; ++c) rows_x.push_back(xv[size_t((n * C + c) * d1 * d2 + i)]);
  const CrossEntropyRef ref = ref_cross_entropy(rows_x, tv, N * d1 * d2, C, -100, 0.2);
  const auto none = ops::cross_entropy(x, t, {.label_smoothing = 0.2, .reduction = Reduction::None});
  CHECK(none.loss.sizes() == Shape{N, d1, d2});
  check_close(none.loss, ref.rows, 1e-12, 1e-12, "spatial none");
  check_close(ops::cross_entropy(x, t, {.label_smoothing = 0.2}).loss, {ref.sum / ref.count}, 1e-12, 1e-12,
              "spatial mean");
  check_gradcheck([&](const TensorList& in) { return cross_entropy(in[0], t, {.label_smoothing = 0.2}); },
                  {leaf({N, C, d1, d2}, 302)});
  // 1-D logits with a 0-d target.
  const Tensor x1 = random_tensor({6}, kFloat64, 303);
  const CrossEntropyRef r1 = ref_cross_entropy(values_of(x1), {3}, 1, 6, -100, 0.0);
  const auto l1 = ops::cross_entropy(x1, full({}, 3, kInt64), {.reduction = Reduction::None});
  CHECK(l1.loss.dim() == 0);
  check_close(l1.loss, r1.rows, 1e-12, 1e-12, "1-D");
  // int32 targets.
  const Tensor x2 = random_tensor({3, 4}, kFloat32, 304);
  check_close(ops::cross_entropy(x2, from_vector<int32_t>({1, 3, 0}, {3})).loss,
              values_of(ops::cross_entropy(x2, from_vector<int64_t>({1, 3, 0}, {3})).loss), 0, 0, "int32 target");
  // Every target ignored: Mean is 0 / 0 = NaN (as PyTorch), Sum is 0, and the gradient is 0.
  const Tensor ign = from_vector<int64_t>({7, 7}, {2});
  const Tensor x3 = random_tensor({2, 3}, kFloat64, 305);
  CHECK(std::isnan(ops::cross_entropy(x3, ign, {.ignore_index = 7}).loss.item<double>()));
  CHECK(ops::cross_entropy(x3, ign, {.ignore_index = 7, .reduction = Reduction::Sum}).loss.item<double>() == 0.0);
  const auto s3 = ops::cross_entropy(x3, ign, {.ignore_index = 7, .reduction = Reduction::Sum});
  check_close(ops::cross_entropy_backward(full({}, 1.0, kFloat64), x3, ign, s3.lse, Tensor(),
                                          {.ignore_index = 7, .reduction = Reduction::Sum}),
              std::vector<double>(6, 0.0), 0, 0, "ignored grad");
  // A vocabulary-sized row, and an empty batch.
  const int64_t V = 3000;
  const Tensor xl = random_tensor({2, V}, kFloat32, 306, Layout::Contiguous, -5, 5);
  const std::vector<int64_t> tl = {17, V - 1};
  const CrossEntropyRef rl = ref_cross_entropy(values_of(xl), tl, 2, V, -100, 0.1);
  check_close(ops::cross_entropy(xl, from_vector(tl, {2}), {.label_smoothing = 0.1}).loss, {rl.sum / 2}, 1e-6, 1e-6,
              "large C");
  CHECK(ops::cross_entropy(zeros({0, 5}), zeros({0}, kInt64), {.reduction = Reduction::None}).loss.numel() == 0);
}

TEST_CASE("nn_functional: cross_entropy errors: bad target, shapes, dtypes, smoothing") {
  const Tensor x = zeros({3, 5});
  check_error(
      [&] {
        ops::cross_entropy(x, from_vector<int64_t>({0, 5, 1}, {3}));
      },
      {"cross_entropy", "target 5", "5 classes", "[1]", "int64[3] cpu"});
  check_error(
      [&] {
        ops::cross_entropy(x, from_vector<int64_t>({0, 1, -1}, {3}));
      },
      {"cross_entropy", "target -1", "[2]"});
  check_error(
      [&] {
        cross_entropy(x, from_vector<int64_t>({0, 1}, {2}));
      },
      {"cross_entropy", "int64[2] cpu", "float32[3, 5] cpu", "[3]"});
  check_error([&] { ops::cross_entropy(x, zeros({3})); }, {"cross_entropy", "class indices", "float32[3] cpu"});
  check_error([&] { ops::cross_entropy(zeros({3}, kInt64), zeros({}, kInt64)); }, {"cross_entropy", "floating"});
  check_error([&] { ops::cross_entropy(x, zeros({3}, kInt64), {.label_smoothing = 1.5}); },
              {"cross_entropy", "label_smoothing", "1.5"});
  const auto f = ops::cross_entropy(x, zeros({3}, kInt64));
  check_error([&] { ops::cross_entropy_backward(zeros({3}), x, zeros({3}, kInt64), f.lse, f.count); },
              {"cross_entropy_backward", "grad_loss", "float32[3] cpu"});
}

TEST_CASE("nn_functional: cross_entropy passes gradcheck for every reduction and option") {
  const Tensor target = from_vector<int64_t>({2, 0, -100, 3, 1}, {5});
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    for (double e : {0.0, 0.25}) {
      CAPTURE(int(red));
      CAPTURE(e);
      check_gradcheck(
          [&](const TensorList& in) { return cross_entropy(in[0], target, {.label_smoothing = e, .reduction = red}); },
          {leaf({5, 4}, 310, -3, 3)});
    }
  }
  // Non-contiguous logits and a custom ignore_index.
  const Tensor t2 = from_vector<int64_t>({1, 1, 2}, {3});
  check_gradcheck([&](const TensorList& in) { return cross_entropy(in[0].t(), t2, {.ignore_index = 2}); },
                  {leaf({4, 3}, 311)});
}

// ==================================== dropout =====================================

TEST_CASE("nn_functional: dropout mask is Philox's formula, scaled, Bernoulli(1 - p), replayable") {
  const double p = 0.3;
  const int64_t n = 20000;
  Generator gen(1234);
  gen.set_state(1234, 77);
  const ops::DropoutResult r = ops::dropout(ones({n}, kFloat64), p, &gen);
  CHECK(r.range.seed == 1234);
  CHECK(r.range.counter == 77);
  CHECK(gen.offset() == 77 + uint64_t(n + 3) / 4);
  const std::vector<double> y = values_of(r.out);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const PhiloxResult w = philox4x32(1234, 77 + uint64_t(i) / 4);
    const bool keep = philox_uniform(w.x[i % 4]) < float(1.0 - p);
    REQUIRE_MESSAGE(y[size_t(i)] == (keep ? 1.0 / (1.0 - p) : 0.0), "element ", i);
    kept += keep;
  }
  // Kept fraction within 5 standard deviations of 1 - p.
  const double frac = double(kept) / double(n), sd = std::sqrt(p * (1 - p) / double(n));
  CHECK(std::fabs(frac - (1 - p)) < 5 * sd);
  // Same generator state: the same mask; the next state: a different one.
  gen.set_state(1234, 77);
  CHECK(values_of(ops::dropout(ones({n}, kFloat64), p, &gen).out) == y);
  CHECK(values_of(ops::dropout(ones({n}, kFloat64), p, &gen).out) != y);
  // dropout_with_range re-creates it on other values.
  const Tensor x = random_tensor({n}, kFloat32, 400);
  const std::vector<double> xv = values_of(x), yr = values_of(ops::dropout_with_range(x, p, r.range));
  for (int64_t i = 0; i < n; ++i)
    REQUIRE(yr[size_t(i)] == (y[size_t(i)] == 0 ? 0.0 : double(float(float(xv[size_t(i)]) * float(1.0 / (1.0 - p))))));
}

TEST_CASE("nn_functional: dropout in every dtype, non-contiguous, p = 0 and 1, eval, errors") {
  const double p = 0.5;
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      const Tensor x = random_tensor({6, 9}, dt, 410, layout);
      Generator gen(9);
      const ops::DropoutResult r = ops::dropout(x, p, &gen);
      CHECK(r.out.is_contiguous());
      const std::vector<double> xv = values_of(x), y = values_of(r.out);
      for (int64_t i = 0; i < x.numel(); ++i) {  // element i is row-major in x's shape
        const PhiloxResult w = philox4x32(9, uint64_t(i) / 4);
        const bool keep = philox_uniform(w.x[i % 4]) < 0.5f;
        CHECK_MESSAGE(y[size_t(i)] == (keep ? 2.0 * xv[size_t(i)] : 0.0), name_of(dt, layout), " element ", i);
      }
    }
  }
  Generator gen(3);
  const Tensor x = random_tensor({4, 5}, kFloat32, 420);
  check_close(ops::dropout(x, 0.0, &gen).out, values_of(x), 0, 0, "p = 0");
  check_close(ops::dropout(x, 1.0, &gen).out, std::vector<double>(20, 0.0), 0, 0, "p = 1");
  CHECK(gen.offset() == 0);  // neither drew counters
  CHECK(dropout(x, 0.5, /*training=*/false).shares_storage(x));
  CHECK(dropout(x, 0.0).shares_storage(x));
  CHECK(ops::dropout(zeros({0, 3}), 0.5, &gen).out.sizes() == Shape{0, 3});
  check_error([&] { ops::dropout(x, 1.5); }, {"dropout", "[0, 1]", "1.5", "float32[4, 5] cpu"});
  check_error([&] { dropout(x, -0.1); }, {"dropout", "[0, 1]"});
  check_error([&] { ops::dropout(zeros({3}, kInt32), 0.5); }, {"dropout", "floating", "int32"});
}

TEST_CASE("nn_functional: dropout passes gradcheck with a fixed generator state; backward replays the mask") {
  Generator gen(55);
  for (double p : {0.2, 0.6, 1.0}) {
    CAPTURE(p);
    check_gradcheck(
        [&](const TensorList& in) {
          gen.set_state(55, 10);  // the same mask at every evaluation of f
          return dropout(in[0], p, true, &gen);
        },
        {leaf({5, 7}, 430)});
  }
  // The backward uses the forward's range even after the generator moved on.
  const Tensor x = leaf({300}, 431);
  gen.set_state(8, 0);
  const Tensor y = dropout(x, 0.4, true, &gen);
  CHECK(y.grad_fn_name() == "DropoutBackward");
  ops::dropout(ones({1000}), 0.4, &gen);  // advance
  y.backward(ones({300}, kFloat64));
  const std::vector<double> yv = values_of(y), xv = values_of(x), gx = values_of(x.grad());
  for (size_t i = 0; i < yv.size(); ++i) CHECK(gx[i] == (yv[i] == 0.0 && xv[i] != 0.0 ? 0.0 : 1.0 / (1.0 - 0.4)));
}

// ==================================== mse_loss ====================================

TEST_CASE("nn_functional: mse_loss matches loops, broadcasts, passes gradcheck") {
  for (DType dt : kFloatTypes) {
    const Tensor a = random_tensor({3, 4}, dt, 500, Layout::Transposed), b = random_tensor({4}, dt, 501);
    const std::vector<double> av = values_of(a), bv = values_of(b);
    std::vector<double> sq(12);
    double s = 0;
    for (int64_t i = 0; i < 12; ++i) {
      sq[size_t(i)] = (av[size_t(i)] - bv[size_t(i % 4)]) * (av[size_t(i)] - bv[size_t(i % 4)]);
      s += sq[size_t(i)];
    }
    const double rtol = default_rtol(dt) * 2, atol = atol_for(dt);
    check_close(ops::mse_loss(a, b, Reduction::None), sq, rtol, atol, "none " + name_of(dt));
    check_close(ops::mse_loss(a, b, Reduction::Sum), {s}, rtol, atol, "sum " + name_of(dt));
    check_close(mse_loss(a, b), {s / 12}, rtol, atol, "mean " + name_of(dt));
  }
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum})
    check_gradcheck([&](const TensorList& in) { return mse_loss(in[0].t(), in[1], red); },
                    {leaf({4, 3}, 510), leaf({4}, 511)});
  check_error([&] { mse_loss(zeros({3}), zeros({4})); }, {"mse_loss", "[3]", "[4]"});
  check_error([&] { mse_loss(zeros({3}), zeros({3}, kFloat64)); }, {"mse_loss", "float32[3] cpu", "float64[3] cpu"});
}

// ================================= masked_softmax =================================

TEST_CASE("nn_functional: masked_softmax matches loops: bool, float, causal masks, scale, fully masked rows") {
  const int64_t B = 2, H = 3, L = 4, S = 5;
  const Shape shape{B, H, L, S};
  const int64_t rows = B * H * L;
  uint64_t seed = 600;
  for (DType dt : kFloatTypes) {
    const Tensor x = random_tensor(shape, dt, seed++, Layout::Transposed, -3, 3);
    const std::vector<double> xv = values_of(x);
    const double rtol = default_rtol(dt), atol = dt == kFloat64 ? 1e-14 : rtol * 0.1;
    const auto idx = [&](int64_t r) { return unravel(r, {B, H, L}); };
    // Padding mask (B, 1, 1, S): batch 1 hides its last two keys; batch 0 row 2 of head... none.
    std::vector<double> pad(size_t(B * S), 1.0);
    pad[size_t(S + 3)] = pad[size_t(S + 4)] = 0;
    const Tensor bool_mask = from_vector(pad, {B, 1, 1, S}).to(kBool);
    check_close(ops::masked_softmax(x, bool_mask, false, 0.7),
                ref_masked_softmax(xv, rows, S, 0.7,
                                   [&](int64_t r, int64_t s) { return pad[size_t(idx(r)[0] * S + s)] ? 0.0 : -kInf; }),
                rtol, atol, "bool " + name_of(dt));
    // Additive (L, S) mask, with one row fully -inf (zeros out), and causal.
    std::vector<double> add = random_values(L * S, seed++, -1, 1);
    for (int64_t s = 0; s < S; ++s) add[size_t(2 * S + s)] = -kInf;
    const Tensor float_mask = make_tensor(add, {L, S}, dt);
    const std::vector<double> addv = values_of(float_mask);
    check_close(ops::masked_softmax(x, float_mask, false, 1.0),
                ref_masked_softmax(xv, rows, S, 1.0, [&](int64_t r, int64_t s) { return addv[size_t(r % L * S + s)]; }),
                rtol, atol, "float " + name_of(dt));
    check_close(ops::masked_softmax(x, Tensor(), true, 0.5),
                ref_masked_softmax(xv, rows, S, 0.5, [&](int64_t r, int64_t s) { return s <= r % L ? 0.0 : -kInf; }),
                rtol, atol, "causal " + name_of(dt));
    check_close(ops::masked_softmax(x), ref_masked_softmax(xv, rows, S, 1.0, [](int64_t, int64_t) { return 0.0; }),
                rtol, atol, "plain " + name_of(dt));
    // A bool mask that hides everything: zeros, not NaN.
    check_close(ops::masked_softmax(x, zeros({1}, kBool)), std::vector<double>(xv.size(), 0.0), 0, 0,
                "all masked " + name_of(dt));
  }
  // A long row (S > 1024) and a causal mask with L != S.
  const Tensor xl = random_tensor({3, 1500}, kFloat32, seed++);
  check_close(
      ops::masked_softmax(xl, Tensor(), true, 2.0),
      ref_masked_softmax(values_of(xl), 3, 1500, 2.0, [](int64_t r, int64_t s) { return s <= r ? 0.0 : -kInf; }), 1e-5,
      1e-8, "long causal");
  check_error(
      [&] {
        ops::masked_softmax(zeros({2, 3}), zeros({2, 2}, kBool));
      },
      {"masked_softmax", "bool[2, 2] cpu", "float32[2, 3] cpu"});
  check_error([&] { ops::masked_softmax(zeros({2, 3}), zeros({3}, kInt64)); }, {"masked_softmax", "bool or"});
  check_error([&] { ops::masked_softmax(zeros({2, 3}), zeros({3}, kFloat64)); }, {"masked_softmax", "float64[3]"});
  check_error([&] { ops::masked_softmax(zeros({3}), Tensor(), true); }, {"masked_softmax", "is_causal"});
}

TEST_CASE("nn_functional: masked_softmax passes gradcheck (scores and a float mask), bool and causal masks") {
  const Tensor bmask = from_vector<double>({1, 1, 0, 1, 0, 1, 1, 1}, {2, 1, 4}).to(kBool);
  check_gradcheck([&](const TensorList& in) { return masked_softmax(in[0], bmask, false, 0.3); },
                  {leaf({2, 3, 4}, 700)});
  check_gradcheck([](const TensorList& in) { return masked_softmax(in[0], in[1], false, 1.5); },
                  {leaf({2, 3, 4}, 701), leaf({3, 4}, 702)});
  check_gradcheck([](const TensorList& in) { return masked_softmax(in[0].transpose(-1, -2), Tensor(), true); },
                  {leaf({2, 5, 3}, 703)});
  // Fully masked rows have zero gradients.
  const Tensor x = leaf({2, 3}, 704);
  masked_softmax(x, from_vector<double>({0, 0, 0}, {3}).to(kBool)).backward(ones({2, 3}, kFloat64));
  check_close(x.grad(), std::vector<double>(6, 0.0), 0, 0, "masked grad");
}

// ========================== scaled_dot_product_attention ==========================

TEST_CASE("nn_functional: scaled_dot_product_attention matches loops and passes gradcheck") {
  const int64_t B = 2, H = 2, L = 3, S = 4, E = 5, Ev = 3;
  const Tensor q = random_tensor({B, H, L, E}, kFloat64, 800), k = random_tensor({B, H, S, E}, kFloat64, 801),
               v = random_tensor({B, H, S, Ev}, kFloat64, 802);
  const std::vector<double> qv = values_of(q), kv = values_of(k), vv = values_of(v);
  const Tensor pad = from_vector<double>({1, 1, 1, 0, 1, 0, 1, 1}, {B, 1, 1, S}).to(kBool);
  const std::vector<double> padv = values_of(pad);
  for (int mode = 0; mode < 3; ++mode) {  // plain, bool padding mask, causal
    CAPTURE(mode);
    const double scale = mode == 1 ? 1.0 / std::sqrt(double(E)) : 0.25;
    std::vector<double> want(size_t(B * H * L * Ev), 0.0);
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t l = 0; l < L; ++l) {
        std::vector<double> z(static_cast<size_t>(S));
        double m = -kInf, sum = 0;
        for (int64_t s = 0; s < S; ++s) {
          double d = 0;
          for (int64_t e = 0; e < E; ++e) d += qv[size_t((bh * L + l) * E + e)] * kv[size_t((bh * S + s) * E + e)];
          const bool keep = mode == 1 ? padv[size_t(bh / H * S + s)] != 0 : mode == 2 ? s <= l : true;
          z[size_t(s)] = keep ? d * scale : -kInf;
          m = std::max(m, z[size_t(s)]);
        }
        for (int64_t s = 0; s < S; ++s) sum += std::exp(z[size_t(s)] - m);
        for (int64_t s = 0; s < S; ++s)
          for (int64_t j = 0; j < Ev; ++j)
            want[size_t((bh * L + l) * Ev + j)] += std::exp(z[size_t(s)] - m) / sum * vv[size_t((bh * S + s) * Ev + j)];
      }
    const Tensor mask = mode == 1 ? pad : Tensor();
    const std::optional<double> sc = mode == 1 ? std::optional<double>() : std::optional<double>(scale);
    const Tensor out = scaled_dot_product_attention(q, k, v, mask, mode == 2, 0.0, sc);
    CHECK(out.sizes() == Shape{B, H, L, Ev});
    check_close(out, want, 1e-12, 1e-12, "sdpa");
    check_gradcheck(
        [&](const TensorList& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], mask, mode == 2, 0.0, sc);
        },
        {leaf({B, H, L, E}, 810), leaf({B, H, S, E}, 811), leaf({B, H, S, Ev}, 812)});
  }
  // A float mask that requires grad, broadcast batch dims (k, v shared across heads), and dropout
  // with a fixed generator state.
  Generator gen(5);
  check_gradcheck(
      [&](const TensorList& in) {
        gen.set_state(5, 0);
        return scaled_dot_product_attention(in[0], in[1], in[2], in[3], false, 0.3, {}, &gen);
      },
      {leaf({B, H, L, E}, 820), leaf({B, 1, S, E}, 821), leaf({B, 1, S, Ev}, 822), leaf({L, S}, 823)});
  // 2-D (unbatched) inputs.
  check_gradcheck([](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
                  {leaf({L, E}, 830), leaf({S, E}, 831), leaf({S, Ev}, 832)});
}

TEST_CASE("nn_functional: scaled_dot_product_attention errors") {
  const Tensor q = zeros({2, 3, 4}), k = zeros({2, 5, 4}), v = zeros({2, 5, 6});
  check_error(
      [&] {
        scaled_dot_product_attention(q, zeros({2, 5, 3}), v);
      },
      {"scaled_dot_product_attention", "float32[2, 3, 4] cpu", "float32[2, 5, 3] cpu", "embedding"});
  check_error(
      [&] {
        scaled_dot_product_attention(q, k, zeros({2, 4, 6}));
      },
      {"scaled_dot_product_attention", "sequence length"});
  check_error(
      [&] {
        scaled_dot_product_attention(q, k, v, zeros({3, 5}, kBool), true);
      },
      {"scaled_dot_product_attention", "is_causal"});
  check_error(
      [&] {
        scaled_dot_product_attention(q, k, v, zeros({4, 5}, kBool));
      },
      {"masked_softmax", "bool[4, 5] cpu", "float32[2, 3, 5] cpu"});
  check_error([&] { scaled_dot_product_attention(q, k, v.to(kFloat64)); }, {"scaled_dot_product_attention", "dtype"});
  check_error([&] { scaled_dot_product_attention(zeros({4}), k, v); }, {"scaled_dot_product_attention", "2-D"});
}
