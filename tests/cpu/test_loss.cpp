// cross_entropy and mse_loss: the raw ops against PyTorch's formulas in float64 (label
// smoothing, ignore_index, every reduction, spatial dims), the differentiable ops
// (autograd/ops/loss.h) through gradcheck in float64, and every error path.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops/loss.h"
#include "tensor/factory.h"
#include "tensor/ops/loss.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

/// Absolute tolerance for O(1) results stored in dt.
double atol_for(DType dt) { return dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : default_rtol(dt); }

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

}  // namespace

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
