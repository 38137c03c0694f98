// cummax, cummin and logcumsumexp (the raw ops in tensor/ops/cumsum.h and the differentiable
// ones in autograd/ops/cumsum.h) against float64 loops written here, as PyTorch's CPU kernels
// step (an element takes the running value when it is NaN or not beaten, so ties and NaN go
// to the latest index), over dtypes, layouts and dims; infinities and NaN; size-0 and 0-d
// inputs; gradients by gradcheck and gradgradcheck; autocast; errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/cumsum.h"
#include "tensor/factory.h"
#include "tensor/ops/cumsum.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

/// What a scan along dim of a row-major `shape` computes at each entry, from the line so far.
struct Line {
  int64_t outer = 1, n = 1, inner = 1;
  Line(const Shape& shape, int64_t dim) {
    for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
      if (d < dim) outer *= shape[size_t(d)];
      if (d == dim) n = shape[size_t(d)];
      if (d > dim) inner *= shape[size_t(d)];
    }
  }
  size_t at(int64_t o, int64_t k, int64_t i) const { return size_t((o * n + k) * inner + i); }
};

/// PyTorch's cummax / cummin step: values and indices.
void ref_cumextreme(const std::vector<double>& x, const Shape& shape, int64_t dim, bool is_max,
                    std::vector<double>& values, std::vector<double>& indices) {
  const Line l(shape, dim);
  values.assign(x.size(), 0.0);
  indices.assign(x.size(), 0.0);
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i) {
      double best = 0, where = 0;
      for (int64_t k = 0; k < l.n; ++k) {
        const double v = x[l.at(o, k, i)];
        if (k == 0 || std::isnan(v) || (!std::isnan(best) && (is_max ? v >= best : v <= best))) best = v, where = k;
        values[l.at(o, k, i)] = best;
        indices[l.at(o, k, i)] = where;
      }
    }
}

/// log(sum of exp) of each prefix in float64, by the running maximum.
std::vector<double> ref_logcumsumexp(const std::vector<double>& x, const Shape& shape, int64_t dim) {
  const Line l(shape, dim);
  std::vector<double> out(x.size());
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i)
      for (int64_t k = 0; k < l.n; ++k) {
        double m = -kInf;
        for (int64_t j = 0; j <= k; ++j) m = std::max(m, x[l.at(o, j, i)]);
        double s = 0;
        for (int64_t j = 0; j <= k; ++j) s += std::exp(x[l.at(o, j, i)] - m);
        out[l.at(o, k, i)] = std::isinf(m) ? m : m + std::log(s);
      }
  return out;
}

}  // namespace

TEST_CASE("scans: cummax and cummin along every dim, dtype and layout, ties to the latest index") {
  const Shape shape = {3, 4, 5};
  uint64_t seed = 1;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim = -3; dim < 3; ++dim) {
        // Few distinct values, so ties are common.
        std::vector<double> v = random_values(60, seed++, -3, 3);
        for (double& e : v) e = dt == kBool ? double(e > 0) : std::floor(e);
        if (is_floating(dt)) v[size_t(seed % 60)] = kNaN;
        const Tensor x = make_tensor(v, shape, dt, layout);
        for (bool is_max : {true, false}) {
          const std::string what =
              name_of(dt, layout) + " dim " + std::to_string(dim) + (is_max ? " cummax" : " cummin");
          const ValuesIndices r = is_max ? cummax(x, dim) : cummin(x, dim);
          std::vector<double> values, indices;
          ref_cumextreme(values_of(x), shape, dim < 0 ? dim + 3 : dim, is_max, values, indices);
          CHECK(r.values.dtype() == dt);
          CHECK(r.indices.dtype() == kInt64);
          CHECK(r.values.sizes() == shape);
          check_close(r.values, values, 0.0, 0.0, what + " values");
          check_close(r.indices, indices, 0.0, 0.0, what + " indices");
        }
      }
    }
  }
}

TEST_CASE("scans: cummax and cummin as PyTorch 1.13 gives them, with NaN, 0-d and size-0 inputs") {
  const ValuesIndices m = cummax(make_tensor({1, kNaN, 3, kNaN, 2}, {5}, kFloat32), 0);
  CHECK(std::isnan(values_of(m.values)[1]));
  CHECK(std::isnan(values_of(m.values)[4]));
  CHECK(m.indices.tolist<int64_t>() == std::vector<int64_t>{0, 1, 1, 3, 3});
  const ValuesIndices n = cummin(make_tensor({3, 1, 1, 2, 0, 0}, {6}, kFloat32), 0);
  check_close(n.values, {3, 1, 1, 1, 0, 0}, 0, 0, "cummin values");
  CHECK(n.indices.tolist<int64_t>() == std::vector<int64_t>{0, 1, 2, 2, 4, 5});
  const ValuesIndices b = cummax(make_tensor({1, 0, 1}, {3}, kBool), 0);
  CHECK(b.values.tolist<bool>() == std::vector<bool>{true, true, true});
  CHECK(b.indices.tolist<int64_t>() == std::vector<int64_t>{0, 0, 2});
  const ValuesIndices s = cummax(scalar_tensor(2.5), -1);
  CHECK(s.values.dim() == 0);
  CHECK(s.values.item<float>() == 2.5f);
  CHECK(s.indices.item<int64_t>() == 0);
  const ValuesIndices e = cummin(zeros({2, 0}), 1);
  CHECK(e.values.sizes() == Shape{2, 0});
  CHECK(e.indices.sizes() == Shape{2, 0});
  // Past a chunk (Note [Cumulative sum order]): the running maximum of an increasing line.
  const ValuesIndices longer = ops::cummax(arange(3000, {kInt64}).to(kFloat32), 0);
  CHECK(longer.indices.tolist<int64_t>().back() == 2999);
  check_error([] { cummax(zeros({2, 3}), 2); }, {"cummax", "dim 2", "float32[2, 3]"});
  check_error([] { cummin(Tensor(), 0); }, {"cummin", "undefined"});
}

TEST_CASE("scans: logcumsumexp along every dim, dtype and layout, and at infinities and NaN") {
  const Shape shape = {3, 4, 5};
  uint64_t seed = 20;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim = -3; dim < 3; ++dim) {
        const Tensor x = random_tensor(shape, dt, seed++, layout, -5, 5);
        const Tensor out = logcumsumexp(x, dim);
        CHECK(out.dtype() == dt);
        check_close(out, ref_logcumsumexp(values_of(x), shape, dim < 0 ? dim + 3 : dim), 2 * default_rtol(dt),
                    2 * default_rtol(dt), name_of(dt, layout) + " dim " + std::to_string(dim));
      }
    }
  }
  // PyTorch 1.13: [-inf, -inf, 0, inf, 1, nan, 2] -> [-inf, -inf, 0, inf, inf, nan, nan].
  const std::vector<double> got =
      values_of(logcumsumexp(make_tensor({-kInf, -kInf, 0, kInf, 1, kNaN, 2}, {7}, kFloat32), 0));
  CHECK(got[0] == -kInf);
  CHECK(got[1] == -kInf);
  CHECK(got[2] == 0.0);
  CHECK(got[3] == kInf);
  CHECK(got[4] == kInf);
  CHECK(std::isnan(got[5]));
  CHECK(std::isnan(got[6]));
  // Large values do not overflow: log(2 e^1000) = 1000 + log 2.
  check_close(logcumsumexp(make_tensor({1000, 1000}, {2}, kFloat32), 0), {1000, 1000 + std::log(2.0)}, 1e-6, 0,
              "large");
  // A long line, in float64: the chunked order stays within rounding of the loop.
  const int64_t n = 70000;
  const Tensor y = random_tensor({n}, kFloat64, 31, Layout::Contiguous, -3, 3);
  const std::vector<double> ys = values_of(y), lse = values_of(logcumsumexp(y, 0));
  double m = -kInf, s = 0;
  double worst = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double v = ys[size_t(k)];
    if (v > m) s = s * std::exp(m - v) + 1, m = v;
    else s += std::exp(v - m);
    worst = std::max(worst, std::fabs(lse[size_t(k)] - (m + std::log(s))));
  }
  CHECK(worst < 1e-12);
  CHECK(logcumsumexp(scalar_tensor(1.5), 0).item<float>() == 1.5f);
  CHECK(logcumsumexp(zeros({0, 3}), 0).sizes() == Shape{0, 3});
  check_error([] { logcumsumexp(zeros({2}, kInt64), 0); }, {"logcumsumexp", "floating", "int64[2]"});
  check_error([] { logcumsumexp(zeros({2}), 1); }, {"logcumsumexp", "dim 1"});
}

TEST_CASE("scans: gradients of cummax, cummin and logcumsumexp, first and second order") {
  const Tensor x = leaf({4, 5}, 40);
  for (int64_t dim : {0, 1}) {
    CAPTURE(dim);
    check_gradcheck([dim](const TensorList& in) { return cummax(in[0], dim).values; }, {x});
    check_gradcheck([dim](const TensorList& in) { return cummin(in[0].transpose(0, 1), dim).values; }, {x});
    check_gradcheck([dim](const TensorList& in) { return logcumsumexp(in[0], dim); }, {x});
    const autograd::GradcheckResult gg =
        autograd::gradgradcheck([dim](const TensorList& in) { return logcumsumexp(in[0], dim); }, {x});
    CHECK_MESSAGE(gg.ok, gg.report);
    const autograd::GradcheckResult gm =
        autograd::gradgradcheck([dim](const TensorList& in) { return cummax(in[0], dim).values; }, {x});
    CHECK_MESSAGE(gm.ok, gm.report);
  }
  // PyTorch 1.13: logcumsumexp([0.5, -1, 2]).backward([1, -2, 0.5]) = [-0.5475, -0.3453, 0.3928].
  const Tensor y = make_tensor({0.5, -1, 2}, {3}, kFloat64).requires_grad_();
  logcumsumexp(y, 0).backward(make_tensor({1, -2, 0.5}, {3}, kFloat64));
  check_close(y.grad(), {-0.5475, -0.3453, 0.3928}, 2e-4, 2e-4, "PyTorch's gradient");
  Tensor c = logcumsumexp(y, 0);
  CHECK(c.grad_fn_name() == "LogcumsumexpBackward");
  // The running maximum's gradient goes to the element it came from, the latest of ties.
  const Tensor z = make_tensor({1, 3, 3, 2}, {4}, kFloat64).requires_grad_();
  cummax(z, 0).values.backward(ones({4}, kFloat64));
  check_close(z.grad(), {1, 1, 2, 0}, 0, 0, "to the indices");
}

TEST_CASE("scans: autocast runs float16 logcumsumexp in float32; cummax keeps the dtype") {
  const Tensor x = make_tensor({1, 2, 3}, {3}, kFloat16);
  AutocastGuard guard(kCPU, kFloat16);
  CHECK(logcumsumexp(x, 0).dtype() == kFloat32);
  CHECK(cummax(x, 0).values.dtype() == kFloat16);
}
