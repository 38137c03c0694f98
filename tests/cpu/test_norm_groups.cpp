// rms_norm and group_norm (autograd/ops/rms_norm.h, group_norm.h; tensor/ops/rms_norm.h) and
// nn::RMSNorm, nn::GroupNorm: forward and backward against float64 loops written here (the
// Jacobians by hand), gradcheck on strided inputs, 16-bit inputs, empty batches, what the
// backward keeps, and every error path.
#include <doctest/doctest.h>

#include <algorithm>
#include <any>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/group_norm.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/rms_norm.h"
#include "autograd/recompute_cheap.h"
#include "autograd/saved_tensor.h"
#include "nn/group_norm.h"
#include "nn/rms_norm.h"
#include "tensor/factory.h"
#include "tensor/ops/rms_norm.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Values = std::vector<double>;

const DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

/// torch.finfo(torch.float32).eps and torch.finfo(torch.float64).eps.
constexpr double kFloat32Eps = 1.1920928955078125e-07, kFloat64Eps = 2.220446049250313e-16;

/// Tolerances for O(1) results stored in dt, from inputs rounded to dt.
double rtol_for(DType dt) { return dt == kFloat64 ? 1e-12 : default_rtol(dt); }
double atol_for(DType dt) { return dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : default_rtol(dt); }

Values values_or_none(const Tensor& t) { return t.defined() ? values_of(t) : Values{}; }

// ---- rms norm reference ---------------------------------------------------------

struct RmsNormRef {
  Values y, rstd;
};

/// x: (M, N) row-major; w: (N) or empty. rstd = 1 / sqrt(mean of squares + eps).
RmsNormRef ref_rms_norm(const Values& x, const Values& w, int64_t M, int64_t N, double eps) {
  RmsNormRef r{Values(x.size()), Values(size_t(M))};
  for (int64_t i = 0; i < M; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < N; ++j) ss += x[size_t(i * N + j)] * x[size_t(i * N + j)];
    r.rstd[size_t(i)] = 1.0 / std::sqrt(ss / double(N) + eps);
    for (int64_t j = 0; j < N; ++j)
      r.y[size_t(i * N + j)] = x[size_t(i * N + j)] * r.rstd[size_t(i)] * (w.empty() ? 1.0 : w[size_t(j)]);
  }
  return r;
}

/// dx by the full Jacobian: d xhat_j / d x_k = rstd * (delta_jk - xhat_j xhat_k / N), xhat = x rstd.
Values ref_rms_norm_dx(const Values& x, const Values& g, const Values& w, int64_t M, int64_t N, double eps) {
  const RmsNormRef f = ref_rms_norm(x, {}, M, N, eps);  // f.y = xhat
  Values dx(x.size(), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < N; ++k)
      for (int64_t j = 0; j < N; ++j) {
        const double xj = f.y[size_t(i * N + j)], xk = f.y[size_t(i * N + k)];
        const double jac = f.rstd[size_t(i)] * ((j == k ? 1.0 : 0.0) - xj * xk / double(N));
        dx[size_t(i * N + k)] += g[size_t(i * N + j)] * (w.empty() ? 1.0 : w[size_t(j)]) * jac;
      }
  return dx;
}

// ---- group norm reference -------------------------------------------------------

/// x: (N, C, S) row-major (S: the spatial positions); w, b: (C) or empty. Each (n, group of
/// C / G channels) normalized by its mean and biased variance over C / G * S values.
Values ref_group_norm(const Values& x, const Values& w, const Values& b, int64_t N, int64_t C, int64_t S, int64_t G,
                      double eps) {
  Values y(x.size());
  const int64_t cg = C / G;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t base = (n * C + g * cg) * S, count = cg * S;
      double mu = 0, var = 0;
      for (int64_t i = 0; i < count; ++i) mu += x[size_t(base + i)];
      mu /= double(count);
      for (int64_t i = 0; i < count; ++i) var += (x[size_t(base + i)] - mu) * (x[size_t(base + i)] - mu);
      var /= double(count);
      const double rstd = 1.0 / std::sqrt(var + eps);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t c = g * cg + i / S;
        y[size_t(base + i)] =
            (x[size_t(base + i)] - mu) * rstd * (w.empty() ? 1.0 : w[size_t(c)]) + (b.empty() ? 0.0 : b[size_t(c)]);
      }
    }
  return y;
}

/// Total bytes of the tensors the ops run in `body` save for backward (a pack hook that
/// counts and keeps each one as it is).
template <typename F>
int64_t saved_bytes(F&& body) {
  int64_t bytes = 0;
  autograd::SavedTensorHooks hooks(
      [&](const Tensor& t) -> autograd::PackedTensor {
        bytes += t.numel() * int64_t(element_size(t.dtype()));
        return t;
      },
      [](const autograd::PackedTensor& p) { return std::any_cast<Tensor>(p); });
  body();
  return bytes;
}

}  // namespace

// ---- rms_norm -------------------------------------------------------------------

TEST_CASE("norm_groups: rms_norm matches float64 loops in every dtype, layout, weight and eps") {
  struct Case {
    Shape x, normalized;
  };
  uint64_t seed = 1;
  for (const Case& c : {Case{{5, 7}, {7}}, Case{{2, 3, 4, 6}, {4, 6}}, Case{{3, 1500}, {1500}}, Case{{6, 1}, {1}},
                        Case{{4, 3}, {3}}, Case{{2, 1031}, {1031}}}) {
    const int64_t N = numel_of(c.normalized), M = numel_of(c.x) / N;
    for (DType dt : kFloatTypes)
      for (Layout layout : kAllLayouts)
        for (int variant = 0; variant < 4; ++variant) {  // bit 0: weight; bit 1: eps given
          const std::string what =
              name_of(dt, layout) + " " + shape_str(c.x) + " variant " + std::to_string(variant);
          const Tensor x = random_tensor(c.x, dt, seed++, layout, -3, 2);
          const Tensor w = variant & 1 ? random_tensor(c.normalized, dt, seed++) : Tensor();
          const std::optional<double> eps = variant & 2 ? std::optional<double>(1e-2) : std::nullopt;
          const double eps_used = eps ? *eps : dt == kFloat64 ? kFloat64Eps : kFloat32Eps;
          const ops::RmsNormResult r = ops::rms_norm(x, c.normalized, w, eps);
          const RmsNormRef ref = ref_rms_norm(values_of(x), values_or_none(w), M, N, eps_used);
          CHECK(r.out.sizes() == c.x);
          CHECK(r.out.dtype() == dt);
          CHECK(r.rstd.sizes() == Shape(c.x.begin(), c.x.end() - int64_t(c.normalized.size())));
          CHECK(r.rstd.dtype() == (dt == kFloat64 ? kFloat64 : kFloat32));
          check_close(r.out, ref.y, rtol_for(dt), atol_for(dt), "y " + what);
          check_close(r.rstd, ref.rstd, dt == kFloat64 ? 1e-12 : 1e-5, 0, "rstd " + what);
          check_close(rms_norm(x, c.normalized, w, eps), ref.y, rtol_for(dt), atol_for(dt), "frugal::rms_norm " + what);
        }
  }
}

TEST_CASE("norm_groups: rms_norm's default eps is the compute type's epsilon, as torch's") {
  // Rows of tiny values, where mean(x^2) ~ 1e-8 is comparable to float32's epsilon: the
  // result tells which eps was added.
  CHECK(ops::rms_norm_default_eps(kFloat32) == kFloat32Eps);
  CHECK(ops::rms_norm_default_eps(kFloat16) == kFloat32Eps);
  CHECK(ops::rms_norm_default_eps(kBFloat16) == kFloat32Eps);
  CHECK(ops::rms_norm_default_eps(kFloat64) == kFloat64Eps);
  const Values xv = random_values(2 * 8, 5, 1e-4, 3e-4);
  for (DType dt : {kFloat32, kFloat64}) {
    const Tensor x = make_tensor(xv, {2, 8}, dt);
    const double eps = dt == kFloat64 ? kFloat64Eps : kFloat32Eps;
    check_close(ops::rms_norm(x, {8}).rstd, ref_rms_norm(values_of(x), {}, 2, 8, eps).rstd, 1e-6, 0,
                "default eps " + name_of(dt));
  }
  // eps 0 is allowed (torch takes it): plain x / rms(x).
  const Tensor x = make_tensor({3, 4}, {1, 2}, kFloat64);
  check_close(ops::rms_norm(x, {2}, Tensor(), 0.0).out, {3 / std::sqrt(12.5), 4 / std::sqrt(12.5)}, 1e-15, 0, "eps 0");
}

TEST_CASE("norm_groups: rms_norm_backward matches the Jacobian by hand") {
  uint64_t seed = 100;
  for (DType dt : kFloatTypes)
    for (bool with_w : {false, true})
      for (const int64_t N : {1, 3, 9, 1100}) {
        const int64_t M = 6;
        const std::string what = name_of(dt) + (with_w ? " weight" : " no weight") + " N " + std::to_string(N);
        const Tensor x = random_tensor({2, 3, N}, dt, seed++, Layout::Contiguous, -2, 3);
        const Tensor g = random_tensor({2, 3, N}, dt, seed++, Layout::Strided);
        const Tensor w = with_w ? random_tensor({N}, dt, seed++) : Tensor();
        const double eps = 1e-5;
        const ops::RmsNormResult f = ops::rms_norm(x, {N}, w, eps);
        const ops::RmsNormGrads gr = ops::rms_norm_backward(g, x, {N}, f.rstd, w);
        const Values xv = values_of(x), gv = values_of(g), wv = values_or_none(w);
        const Values dx = ref_rms_norm_dx(xv, gv, wv, M, N, eps);
        const RmsNormRef xhat = ref_rms_norm(xv, {}, M, N, eps);
        Values dw(size_t(N), 0.0);
        for (int64_t i = 0; i < M * N; ++i) dw[size_t(i % N)] += gv[size_t(i)] * xhat.y[size_t(i)];
        const double rtol = dt == kFloat64 ? 1e-10 : default_rtol(dt) * 4, atol = dt == kFloat64 ? 1e-10 : rtol * 4;
        check_close(gr.x, dx, rtol, atol, "dx " + what);
        CHECK(gr.weight.defined() == with_w);
        if (with_w) check_close(gr.weight, dw, rtol, atol * 4, "dweight " + what);
        const ops::RmsNormGrads only_w = ops::rms_norm_backward(g, x, {N}, f.rstd, w, {.x = false, .weight = true});
        CHECK_FALSE(only_w.x.defined());
        if (with_w) check_close(only_w.weight, dw, rtol, atol * 4, "dweight only " + what);
      }
}

TEST_CASE("norm_groups: rms_norm gradients match central differences on strided inputs") {
  uint64_t seed = 200;
  struct Case {
    Shape x, normalized;
  };
  for (const Case& c : {Case{{3, 5}, {5}}, Case{{2, 3, 2, 4}, {2, 4}}, Case{{4, 1}, {1}}, Case{{2, 2, 3}, {3}}})
    for (bool with_w : {false, true})
      for (bool permuted : {false, true}) {
        CAPTURE(shape_str(c.x));
        CAPTURE(with_w);
        CAPTURE(permuted);
        // The leaf holds x with its dims reversed; the op sees a permuted (non-contiguous) view.
        Shape stored = c.x;
        if (permuted) std::reverse(stored.begin(), stored.end());
        std::vector<int64_t> rev(c.x.size());
        for (size_t d = 0; d < rev.size(); ++d) rev[d] = int64_t(rev.size() - 1 - d);
        TensorList in = {leaf(stored, seed++, -2, 2)};
        if (with_w) in.push_back(leaf(c.normalized, seed++));
        const Shape ns = c.normalized;
        check_gradcheck(
            [&](const TensorList& t) {
              return rms_norm(permuted ? t[0].permute(rev) : t[0], ns, with_w ? t[1] : Tensor(), 1e-3);
            },
            in);
      }
}

TEST_CASE("norm_groups: rms_norm_apply writes rms_norm's output from its rstd") {
  // Bitwise the forward's (Note [Recomputable outputs] regenerates outputs with it).
  for (DType dt : kFloatTypes)
    for (bool with_w : {false, true}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(with_w);
      const Tensor x = random_tensor({3, 4, 6}, dt, 1, Layout::Strided);
      const Tensor w = with_w ? random_tensor({4, 6}, dt, 2) : Tensor();
      const ops::RmsNormResult r = ops::rms_norm(x, {4, 6}, w);
      CHECK(values_of(ops::rms_norm_apply(x, {4, 6}, r.rstd, w)) == values_of(r.out));
    }
}

TEST_CASE("norm_groups: rms_norm keeps x, weight and one float per row for backward; its output is recomputable") {
  // float16 x (64, 48): backward keeps x (2 bytes a value), the weight and rstd (float32, 4
  // bytes a row), never the output.
  Tensor x = random_tensor({64, 48}, kFloat16, 3);
  Tensor w = random_tensor({48}, kFloat16, 4);
  x.requires_grad_();
  w.requires_grad_();
  const int64_t bytes = saved_bytes([&] { rms_norm(x, {48}, w); });
  CHECK(bytes == 64 * 48 * 2 + 48 * 2 + 64 * 4);
  // Under RecomputeCheapOutputs the output is a recipe; gradients through a consumer that
  // saves it (a product) equal the plain ones.
  const Tensor v = random_tensor({5, 7}, kFloat64, 7);
  const auto grads = [&](bool recompute) {
    const Tensor xd = leaf({5, 7}, 5), wd = leaf({7}, 6);
    std::optional<autograd::RecomputeCheapOutputs> guard;
    if (recompute) guard.emplace();
    const Tensor y = rms_norm(xd, {7}, wd);
    if (recompute) CHECK(autograd::recompute::is_recomputable(y));
    const Tensor loss = sum(y * y * v);
    guard.reset();
    loss.backward();
    Values out = values_of(xd.grad());
    const Values gw = values_of(wd.grad());
    out.insert(out.end(), gw.begin(), gw.end());
    return out;
  };
  check_close(grads(true), grads(false), 0, 0, "recomputed rms_norm output");
}

TEST_CASE("norm_groups: rms_norm under autocast runs in float32 and returns 16-bit gradients") {
  for (DType low : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(low));
    Tensor x = random_tensor({3, 8}, low, 11);
    Tensor w = random_tensor({8}, kFloat32, 12);
    x.requires_grad_();
    w.requires_grad_();
    Tensor y;
    {
      AutocastGuard amp(kCPU, low);
      y = rms_norm(x, {8}, w);
    }
    CHECK(y.dtype() == kFloat32);
    // The float32 op on x's (rounded) values, with float32's eps.
    check_close(y, ref_rms_norm(values_of(x), values_of(w), 3, 8, kFloat32Eps).y, 1e-5, 1e-5, "autocast y");
    sum(y).backward();
    CHECK(x.grad().dtype() == low);
    CHECK(w.grad().dtype() == kFloat32);
  }
}

TEST_CASE("norm_groups: rms_norm on empty inputs and its errors") {
  const ops::RmsNormResult e = ops::rms_norm(zeros({0, 4}), {4}, ones({4}));
  CHECK(e.out.sizes() == Shape{0, 4});
  CHECK(e.rstd.sizes() == Shape{0});
  const ops::RmsNormGrads eg = ops::rms_norm_backward(zeros({0, 4}), zeros({0, 4}), {4}, e.rstd, ones({4}));
  check_close(eg.weight, {0, 0, 0, 0}, 0, 0, "empty dweight");
  CHECK(eg.x.sizes() == Shape{0, 4});
  // Through autograd: an empty batch gives a zero weight gradient.
  Tensor x0 = zeros({0, 3, 4}, kFloat64), w0 = ones({4}, kFloat64);
  x0.requires_grad_();
  w0.requires_grad_();
  sum(rms_norm(x0, {4}, w0)).backward();
  check_close(w0.grad(), {0, 0, 0, 0}, 0, 0, "empty batch dweight");
  CHECK(x0.grad().sizes() == Shape{0, 3, 4});
  // Empty rows: the mean of no squares is NaN, as torch's.
  const ops::RmsNormResult er = ops::rms_norm(zeros({2, 0}), {0});
  CHECK(er.out.sizes() == Shape{2, 0});
  CHECK(std::isnan(values_of(er.rstd)[0]));

  const Tensor x = zeros({2, 3});
  check_error([&] { ops::rms_norm(x, {4}); }, {"rms_norm", "float32[2, 3] cpu", "does not end with normalized_shape [4]"});
  check_error([&] { ops::rms_norm(x, {2, 3, 1}); }, {"rms_norm", "normalized_shape"});
  check_error([&] { ops::rms_norm(x, {}); }, {"rms_norm", "at least one dim"});
  check_error([&] { ops::rms_norm(x, {3}, ones({4})); }, {"rms_norm", "weight", "float32[4] cpu", "[3]"});
  check_error([&] { ops::rms_norm(x, {3}, ones({3}, kFloat64)); }, {"rms_norm", "weight", "float64"});
  check_error([&] { ops::rms_norm(zeros({2, 3}, kInt64), {3}); }, {"rms_norm", "floating", "int64"});
  check_error([&] { ops::rms_norm(x, {3}, Tensor(), -1.0); }, {"rms_norm", "eps"});
  check_error([&] { rms_norm(x, {3}, ones({2})); }, {"rms_norm", "weight"});
  check_error([&] { rms_norm(x, {2}); }, {"rms_norm", "normalized_shape"});
  const ops::RmsNormResult f = ops::rms_norm(x, {3});
  check_error([&] { ops::rms_norm_backward(zeros({2, 4}), x, {3}, f.rstd, Tensor()); },
              {"rms_norm_backward", "grad_out", "float32[2, 4] cpu"});
  check_error([&] { ops::rms_norm_backward(x, x, {3}, zeros({3}), Tensor()); }, {"rms_norm_backward", "rstd"});
  check_error([&] { ops::rms_norm_apply(x, {3}, zeros({2}, kFloat64)); }, {"rms_norm_apply", "rstd", "float64"});
}

TEST_CASE("norm_groups: nn::RMSNorm has a ones weight, calls rms_norm, and prints as torch") {
  nn::RMSNorm norm({4, 3});
  CHECK(names_of(norm.named_parameters()) == std::vector<std::string>{"weight"});
  check_close(norm.weight, Values(12, 1.0), 0, 0, "initial weight");
  CHECK(norm.extra_repr() == "[4, 3], eps=None, elementwise_affine=true");
  const Tensor x = random_tensor({2, 4, 3}, kFloat32, 21, Layout::Transposed);
  norm.weight.detach().copy_(random_tensor({4, 3}, kFloat32, 22));
  check_close(norm(x), ref_rms_norm(values_of(x), values_of(norm.weight), 2, 12, kFloat32Eps).y, 1e-5, 1e-5,
              "RMSNorm forward");
  nn::RMSNorm plain({3}, {.eps = 1e-3, .elementwise_affine = false});
  CHECK(plain.named_parameters().empty());
  CHECK_FALSE(plain.weight.defined());
  CHECK(plain.extra_repr() == "[3], eps=0.001, elementwise_affine=false");
  const Tensor x3 = random_tensor({5, 3}, kFloat64, 23);
  check_close(plain(x3), ref_rms_norm(values_of(x3), {}, 5, 3, 1e-3).y, 1e-12, 1e-12, "RMSNorm without weight");
  check_error([] { nn::RMSNorm({}); }, {"RMSNorm", "normalized_shape"});
}

// ---- group_norm -----------------------------------------------------------------

TEST_CASE("norm_groups: group_norm matches float64 loops in every dtype, layout, group count and affine case") {
  struct Case {
    Shape x;
    int64_t groups;
  };
  uint64_t seed = 300;
  for (const Case& c : {Case{{2, 6, 4, 5}, 3}, Case{{2, 6, 4, 5}, 1}, Case{{2, 6, 4, 5}, 6}, Case{{3, 4}, 2},
                        Case{{2, 4, 7}, 4}, Case{{1, 2, 1100}, 1}, Case{{3, 3, 1}, 3}})
    for (DType dt : kFloatTypes)
      for (Layout layout : kAllLayouts)
        for (int affine = 0; affine < 4; ++affine) {
          const int64_t N = c.x[0], C = c.x[1], S = numel_of(c.x) / (N * C);
          const std::string what = name_of(dt, layout) + " " + shape_str(c.x) + " groups " +
                                   std::to_string(c.groups) + " affine " + std::to_string(affine);
          const Tensor x = random_tensor(c.x, dt, seed++, layout, -3, 5);
          const Tensor w = affine & 1 ? random_tensor({C}, dt, seed++) : Tensor();
          const Tensor b = affine & 2 ? random_tensor({C}, dt, seed++) : Tensor();
          const double eps = affine == 3 ? 1e-2 : 1e-5;
          const Tensor y = group_norm(x, c.groups, w, b, eps);
          CHECK(y.sizes() == c.x);
          CHECK(y.dtype() == dt);
          // 16-bit: the normalized value is rounded, then scaled and shifted in the input dtype.
          const double rtol = rtol_for(dt) * (dt == kFloat64 || dt == kFloat32 ? 1 : 2);
          check_close(y, ref_group_norm(values_of(x), values_or_none(w), values_or_none(b), N, C, S, c.groups, eps),
                      rtol, atol_for(dt) * 4, "y " + what);
        }
}

TEST_CASE("norm_groups: group_norm gradients match central differences on strided inputs") {
  uint64_t seed = 400;
  struct Case {
    Shape x;
    int64_t groups;
  };
  for (const Case& c : {Case{{2, 4, 3}, 2}, Case{{2, 6, 2, 2}, 3}, Case{{3, 4}, 4}, Case{{1, 3, 5}, 1}})
    for (int affine = 0; affine < 4; ++affine)
      for (bool permuted : {false, true}) {
        CAPTURE(shape_str(c.x));
        CAPTURE(c.groups);
        CAPTURE(affine);
        CAPTURE(permuted);
        Shape stored = c.x;
        if (permuted) std::reverse(stored.begin(), stored.end());
        std::vector<int64_t> rev(c.x.size());
        for (size_t d = 0; d < rev.size(); ++d) rev[d] = int64_t(rev.size() - 1 - d);
        const int64_t C = c.x[1];
        TensorList in = {leaf(stored, seed++, -2, 2), leaf({C}, seed++), leaf({C}, seed++)};
        const int64_t G = c.groups;
        check_gradcheck(
            [&](const TensorList& t) {
              return group_norm(permuted ? t[0].permute(rev) : t[0], G, affine & 1 ? t[1] : Tensor(),
                                affine & 2 ? t[2] : Tensor(), 1e-3);
            },
            in);
      }
}

TEST_CASE("norm_groups: group_norm keeps x, weight and two floats per group for backward, not its output") {
  Tensor x = random_tensor({4, 6, 8, 8}, kFloat32, 31, Layout::Transposed);  // reshaped by a copy
  Tensor w = random_tensor({6}, kFloat32, 32), b = random_tensor({6}, kFloat32, 33);
  x.requires_grad_();
  w.requires_grad_();
  b.requires_grad_();
  Tensor y;
  const int64_t bytes = saved_bytes([&] { y = group_norm(x, 3, w, b); });
  CHECK(bytes == (4 * 6 * 8 * 8 + 6 + 2 * 4 * 3) * 4);
  // The backward's gradients from what it kept, against float64 sums of the reference's
  // output: the bias gradient of sum(y * v) is sum over (N, H, W) of v.
  const Tensor v = random_tensor({4, 6, 8, 8}, kFloat32, 34);
  sum(y * v).backward();
  const Values vv = values_of(v);
  Values db(6, 0.0);
  for (size_t i = 0; i < vv.size(); ++i) db[(i / 64) % 6] += vv[i];
  check_close(b.grad(), db, 1e-5, 1e-4, "dbias");
}

TEST_CASE("norm_groups: group_norm on an empty batch, under autocast, and its errors") {
  Tensor x0 = zeros({0, 4, 3}, kFloat64), w0 = ones({4}, kFloat64), b0 = zeros({4}, kFloat64);
  for (Tensor* t : {&x0, &w0, &b0}) t->requires_grad_();
  const Tensor y0 = group_norm(x0, 2, w0, b0);
  CHECK(y0.sizes() == Shape{0, 4, 3});
  sum(y0).backward();
  CHECK(x0.grad().sizes() == Shape{0, 4, 3});
  check_close(w0.grad(), {0, 0, 0, 0}, 0, 0, "empty batch dweight");
  check_close(b0.grad(), {0, 0, 0, 0}, 0, 0, "empty batch dbias");
  // No spatial positions (N, C, 0): an empty output.
  CHECK(group_norm(zeros({2, 4, 0}), 2).sizes() == Shape{2, 4, 0});

  for (DType low : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(low));
    Tensor x = random_tensor({2, 4, 3}, low, 41);
    x.requires_grad_();
    const Tensor w = random_tensor({4}, kFloat32, 42);
    Tensor y;
    {
      AutocastGuard amp(kCPU, low);
      y = group_norm(x, 2, w);
    }
    CHECK(y.dtype() == kFloat32);
    check_close(y, ref_group_norm(values_of(x), values_of(w), {}, 2, 4, 3, 2, 1e-5), 1e-5, 1e-5, "autocast y");
    sum(y).backward();
    CHECK(x.grad().dtype() == low);
  }

  const Tensor x = zeros({2, 6, 4});
  check_error([&] { group_norm(x, 4); }, {"group_norm", "C = 6", "divisible by num_groups = 4", "float32[2, 6, 4] cpu"});
  check_error([&] { group_norm(x, 0); }, {"group_norm", "num_groups", "positive"});
  check_error([&] { group_norm(x, 3, ones({3})); }, {"group_norm", "weight", "float32[3] cpu", "[6]"});
  check_error([&] { group_norm(x, 3, Tensor(), ones({6, 1})); }, {"group_norm", "bias", "float32[6, 1] cpu"});
  check_error([&] { group_norm(x, 3, ones({6}, kFloat64)); }, {"group_norm", "weight", "float64", "dtype"});
  check_error([&] { group_norm(zeros({6}), 3); }, {"group_norm", "at least 2 dims", "float32[6] cpu"});
  check_error([&] { group_norm(zeros({2, 6}, kInt64), 3); }, {"group_norm", "floating", "int64"});
  check_error([&] { group_norm(x, 3, Tensor(), Tensor(), std::nan("")); }, {"group_norm", "eps"});
}

TEST_CASE("norm_groups: nn::GroupNorm has ones/zeros parameters, calls group_norm, and prints as torch") {
  nn::GroupNorm norm(2, 6);
  CHECK(names_of(norm.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  check_close(norm.weight, Values(6, 1.0), 0, 0, "initial weight");
  check_close(norm.bias, Values(6, 0.0), 0, 0, "initial bias");
  CHECK(norm.extra_repr() == "2, 6, eps=1e-05, affine=true");
  norm.weight.detach().copy_(random_tensor({6}, kFloat32, 51));
  norm.bias.detach().copy_(random_tensor({6}, kFloat32, 52));
  const Tensor x = random_tensor({3, 6, 5}, kFloat32, 53, Layout::Strided);
  for (bool training : {true, false}) {  // the same in eval: no running statistics
    norm.train(training);
    check_close(norm(x),
                ref_group_norm(values_of(x), values_of(norm.weight), values_of(norm.bias), 3, 6, 5, 2, 1e-5), 1e-5,
                1e-5, "GroupNorm forward");
  }
  nn::GroupNorm plain(3, 3, {.eps = 1e-3, .affine = false});
  CHECK(plain.named_parameters().empty());
  CHECK(plain.extra_repr() == "3, 3, eps=0.001, affine=false");
  const Tensor x2 = random_tensor({2, 3, 4}, kFloat64, 54);
  check_close(plain(x2), ref_group_norm(values_of(x2), {}, {}, 2, 3, 4, 3, 1e-3), 1e-12, 1e-12, "GroupNorm plain");
  check_error([] { nn::GroupNorm(4, 6); }, {"GroupNorm", "num_channels 6", "divisible by num_groups 4"});
  check_error([] { nn::GroupNorm(0, 6); }, {"GroupNorm", "positive"});
}
