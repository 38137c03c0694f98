// Order statistics (kthvalue, median, nanmedian, quantile, nanquantile), nansum and nanmean,
// any, all and count_nonzero (autograd/ops/statistics.h) against float64 references written
// here (a stable sort with NaN last, PyTorch's rank formula), over dtypes, layouts, dims and
// keepdim; NaN; size-0 and 0-d inputs; gradients by gradcheck; errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/statistics.h"
#include "tensor/factory.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The slices of x (row-major `shape`) along dim: each slice's values in order along dim.
std::vector<std::vector<double>> slices(const std::vector<double>& x, const Shape& shape, int64_t dim) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    if (d < dim) outer *= shape[size_t(d)];
    if (d > dim) inner *= shape[size_t(d)];
  }
  const int64_t n = shape.empty() ? 1 : shape[size_t(dim)];
  std::vector<std::vector<double>> out;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<double> s;
      for (int64_t k = 0; k < n; ++k) s.push_back(x[size_t((o * n + k) * inner + i)]);
      out.push_back(s);
    }
  return out;
}

/// The indices of v in ascending order, NaN last, equal values in input order.
std::vector<int64_t> stable_order(const std::vector<double>& v) {
  std::vector<int64_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const double x = v[size_t(a)], y = v[size_t(b)];
    if (std::isnan(x)) return false;
    return std::isnan(y) || x < y;
  });
  return order;
}

int64_t nan_count(const std::vector<double>& v) {
  return std::count_if(v.begin(), v.end(), [](double e) { return std::isnan(e); });
}

enum class Stat { Kth, Median, NanMedian };

/// The position in the stable order that stat picks from slice v (k from 1 for Kth).
int64_t position(Stat stat, const std::vector<double>& v, int64_t k) {
  const int64_t n = int64_t(v.size()), nans = nan_count(v);
  switch (stat) {
    case Stat::Kth: return k - 1;
    case Stat::Median: return nans > 0 ? n - nans : (n - 1) / 2;
    case Stat::NanMedian: return std::max<int64_t>((n - nans - 1) / 2, 0);
  }
  return 0;
}

ValuesIndices run(Stat stat, const Tensor& x, int64_t k, int64_t dim, bool keepdim) {
  switch (stat) {
    case Stat::Kth: return kthvalue(x, k, dim, keepdim);
    case Stat::Median: return median(x, dim, keepdim);
    case Stat::NanMedian: return nanmedian(x, dim, keepdim);
  }
  return {};
}

/// Checks stat of x along dim (values and indices, exactly) against the stable order.
void check_order_stat(Stat stat, const Tensor& x, int64_t k, int64_t dim, bool keepdim, const std::string& what) {
  const int64_t nd = std::max<int64_t>(x.dim(), 1), d = dim < 0 ? dim + nd : dim;
  const ValuesIndices r = run(stat, x, k, dim, keepdim);
  std::vector<double> values, indices;
  for (const std::vector<double>& v : slices(values_of(x), x.sizes(), x.dim() == 0 ? 0 : d)) {
    const int64_t i = stable_order(v)[size_t(position(stat, v, k))];
    values.push_back(v[size_t(i)]);
    indices.push_back(double(i));
  }
  Shape expected = x.sizes();
  if (!expected.empty()) {
    if (keepdim) expected[size_t(d)] = 1;
    else expected.erase(expected.begin() + d);
  }
  CHECK_MESSAGE(r.values.sizes() == expected, what);
  CHECK(r.values.dtype() == x.dtype());
  CHECK(r.indices.dtype() == kInt64);
  check_close(r.values, values, 0.0, 0.0, what + " values");
  check_close(r.indices, indices, 0.0, 0.0, what + " indices");
}

/// torch.quantile's value for sorted-ready slice v, in float64.
double ref_quantile(std::vector<double> v, double q, const std::string& mode, bool skip_nan) {
  const int64_t n = int64_t(v.size()), nans = nan_count(v);
  std::sort(v.begin(), v.end(), [](double a, double b) { return !std::isnan(a) && (std::isnan(b) || a < b); });
  double rank = skip_nan ? std::max(0.0, q * double(n - nans - 1)) : nans > 0 ? double(n - 1) : q * double(n - 1);
  if (mode == "lower") rank = std::floor(rank);
  if (mode == "higher") rank = std::ceil(rank);
  if (mode == "nearest") rank = std::nearbyint(rank);  // ties to even, as torch.round
  const double lo = v[size_t(std::floor(rank))], hi = v[size_t(std::ceil(rank))];
  if (mode == "linear") return lo + (rank - std::floor(rank)) * (hi - lo);
  if (mode == "midpoint") return lo + 0.5 * (hi - lo);
  return lo;
}

}  // namespace

TEST_CASE("statistics: kthvalue, median and nanmedian along every dim, dtype and layout") {
  const Shape shape = {3, 4, 5};
  uint64_t seed = 1;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim = -3; dim < 3; ++dim) {
        const Tensor x = is_floating(dt) ? random_tensor(shape, dt, seed++, layout)
                                         : make_tensor(random_values(60, seed++, -9, 9), shape, dt, layout);
        const std::string what = name_of(dt, layout) + " dim " + std::to_string(dim);
        const int64_t n = shape[size_t(dim < 0 ? dim + 3 : dim)];
        for (bool keepdim : {false, true}) {
          for (int64_t k : {int64_t(1), (n + 1) / 2, n}) check_order_stat(Stat::Kth, x, k, dim, keepdim, what + " kth");
          check_order_stat(Stat::Median, x, 0, dim, keepdim, what + " median");
          check_order_stat(Stat::NanMedian, x, 0, dim, keepdim, what + " nanmedian");
        }
      }
    }
  }
}

TEST_CASE("statistics: NaN in a slice, as PyTorch 1.13") {
  const Tensor x = make_tensor({1, kNaN, 3, kNaN, 0.5}, {5}, kFloat32);
  const ValuesIndices m = median(x, 0), nm = nanmedian(x, 0);
  CHECK(std::isnan(m.values.item<float>()));
  CHECK(m.indices.item<int64_t>() == 1);  // the first NaN
  CHECK(nm.values.item<float>() == 1.0f);
  CHECK(nm.indices.item<int64_t>() == 0);
  const ValuesIndices all_nan = nanmedian(make_tensor({kNaN, kNaN}, {2}, kFloat32), 0);
  CHECK(std::isnan(all_nan.values.item<float>()));
  CHECK(all_nan.indices.item<int64_t>() == 0);
  const ValuesIndices kth = kthvalue(make_tensor({1, kNaN, 3, 0}, {4}, kFloat64), 4);
  CHECK(std::isnan(kth.values.item<double>()));
  CHECK(kth.indices.item<int64_t>() == 1);
  CHECK(median(make_tensor({4, 1, 3, 2}, {4}, kFloat32), 0).values.item<float>() == 2.0f);  // the lower median
  // With NaN in some slices of a 2-d input, every dim.
  std::vector<double> v = random_values(30, 7);
  for (size_t i : {1u, 7u, 8u, 22u, 23u, 24u, 25u, 26u}) v[i] = kNaN;
  const Tensor y = make_tensor(v, {5, 6}, kFloat64, Layout::Transposed);
  for (int64_t dim : {0, 1}) {
    check_order_stat(Stat::Median, y, 0, dim, false, "median with NaN");
    check_order_stat(Stat::NanMedian, y, 0, dim, true, "nanmedian with NaN");
    check_order_stat(Stat::Kth, y, 3, dim, false, "kthvalue with NaN");
  }
}

TEST_CASE("statistics: median(x) of every element shares its gradient among equal elements, as PyTorch") {
  const Tensor x = make_tensor({3, 1, 2, 2}, {4}, kFloat64).requires_grad_();
  const Tensor m = median(x);
  CHECK(m.dim() == 0);
  CHECK(m.item<double>() == 2.0);
  m.backward();
  check_close(x.grad(), {0, 0, 0.5, 0.5}, 0.0, 0.0, "shared gradient");
  const Tensor y = make_tensor({kNaN, 1, 5, 3}, {2, 2}, kFloat64).requires_grad_();
  CHECK(std::isnan(median(y).item<double>()));
  const Tensor nm = nanmedian(y);
  CHECK(nm.item<double>() == 3.0);
  nm.backward();
  check_close(y.grad(), {0, 0, 0, 1}, 0.0, 0.0, "nanmedian's gradient skips the NaN");
  CHECK(std::isnan(median(zeros({0})).item<float>()));
  CHECK(median(make_tensor({7}, {1, 1}, kInt64)).item<int64_t>() == 7);
  check_error([] { median(zeros({0}, kInt32)); }, {"median", "empty", "int32"});
}

TEST_CASE("statistics: quantile and nanquantile in every interpolation, q scalar and 1-d, dim or all") {
  const Shape shape = {3, 4, 5};
  const std::vector<double> qs = {0.0, 0.25, 0.4, 0.5, 1.0};
  uint64_t seed = 40;
  for (DType dt : {kFloat32, kFloat64}) {
    for (const char* mode : {"linear", "lower", "higher", "midpoint", "nearest"}) {
      for (bool skip_nan : {false, true}) {
        std::vector<double> v = random_values(60, seed++);
        for (size_t i : {3u, 17u, 18u, 41u}) v[i] = kNaN;
        const Tensor x = make_tensor(v, shape, dt, Layout::Transposed);
        const Tensor q = make_tensor(qs, {5}, dt);
        const auto quant = [&](const Tensor& t, const Tensor& qq, std::optional<int64_t> dim, bool keep) {
          return skip_nan ? nanquantile(t, qq, dim, keep, mode) : quantile(t, qq, dim, keep, mode);
        };
        const std::string what = std::string(dtype_name(dt)) + " " + mode + (skip_nan ? " nanquantile" : " quantile");
        const double tol = dt == kFloat64 ? 1e-12 : 1e-6;
        for (int64_t dim : {0, 2, -2}) {
          const int64_t d = dim < 0 ? dim + 3 : dim;
          const auto lines = slices(values_of(x), shape, d);
          std::vector<double> expected;  // (q, the other dims)
          for (double qv : qs)
            for (const auto& line : lines) expected.push_back(ref_quantile(line, qv, mode, skip_nan));
          const Tensor out = quant(x, q, dim, false);
          Shape eshape = {5};
          for (int64_t e = 0; e < 3; ++e)
            if (e != d) eshape.push_back(shape[size_t(e)]);
          CHECK(out.sizes() == eshape);
          check_close(out, expected, tol, tol, what + " dim " + std::to_string(dim));
          Shape kshape = {5, 3, 4, 5};
          kshape[size_t(d + 1)] = 1;
          CHECK(quant(x, q, dim, true).sizes() == kshape);
          // A 0-d q: the q = 0.4 entries.
          const Tensor one = quant(x, make_tensor({0.4}, {}, dt), dim, false);
          check_close(one,
                      std::vector<double>(expected.begin() + int64_t(2 * lines.size()),
                                          expected.begin() + int64_t(3 * lines.size())),
                      tol, tol, what + " 0-d q");
        }
        // Every element.
        std::vector<double> flat;
        for (double qv : qs) flat.push_back(ref_quantile(values_of(x), qv, mode, skip_nan));
        check_close(quant(x, q, std::nullopt, false), flat, tol, tol, what + " all");
        CHECK(quant(x, q, std::nullopt, true).sizes() == Shape{5, 1, 1, 1});
        const Tensor scalar =
            skip_nan ? nanquantile(x, 0.4, std::nullopt, false, mode) : quantile(x, 0.4, {}, false, mode);
        CHECK(scalar.dim() == 0);
        check_close(scalar, {flat[2]}, tol, tol, what + " double q");
      }
    }
  }
  // PyTorch 1.13: quantile([1, 2, 3, 4], [0.5, 0.25], interpolation='nearest') = [3, 2].
  const Tensor t = make_tensor({1, 2, 3, 4}, {4}, kFloat32);
  check_close(quantile(t, make_tensor({0.5, 0.25}, {2}, kFloat32), std::nullopt, false, "nearest"), {3, 2}, 0, 0,
              "nearest");
  CHECK(quantile(scalar_tensor(2.5), 0.3, 0).item<float>() == 2.5f);
  CHECK(quantile(make_tensor({1, 2}, {2}, kFloat16), 0.5).dtype() == kFloat16);
}

TEST_CASE("statistics: gradients of the order statistics go to the picked elements") {
  const Tensor x = leaf({4, 5}, 60);
  check_gradcheck([](const TensorList& in) { return kthvalue(in[0], 2, 1).values; }, {x});
  check_gradcheck([](const TensorList& in) { return median(in[0].transpose(0, 1), 1, true).values; }, {x});
  check_gradcheck([](const TensorList& in) { return nanmedian(in[0], 0).values; }, {x});
  check_gradcheck([](const TensorList& in) { return median(in[0]); }, {x});
  for (const char* mode : {"linear", "lower", "higher", "midpoint", "nearest"}) {
    CAPTURE(mode);
    const Tensor q = make_tensor({0.1, 0.5, 0.77}, {3}, kFloat64);
    check_gradcheck([&](const TensorList& in) { return quantile(in[0], q, 1, false, mode); }, {x});
    check_gradcheck([&](const TensorList& in) { return nanquantile(in[0], 0.3, std::nullopt, false, mode); }, {x});
  }
  const autograd::GradcheckResult gg =
      autograd::gradgradcheck([](const TensorList& in) { return quantile(in[0], 0.35, 0); }, {x});
  CHECK_MESSAGE(gg.ok, gg.report);
  // PyTorch 1.13: quantile([1, 2, 3, 4], 0.4) backward gives [0, 0.8, 0.2, 0].
  const Tensor y = make_tensor({1, 2, 3, 4}, {4}, kFloat64).requires_grad_();
  quantile(y, 0.4).backward();
  check_close(y.grad(), {0, 0.8, 0.2, 0}, 1e-12, 1e-12, "quantile's two neighbours");
}

TEST_CASE("statistics: nansum and nanmean skip NaN, and so do their gradients") {
  std::vector<double> v = random_values(24, 70);
  for (size_t i : {0u, 5u, 6u, 13u}) v[i] = kNaN;
  for (DType dt : {kFloat32, kFloat64, kFloat16}) {
    const Tensor x = make_tensor(v, {4, 6}, dt, Layout::Transposed);
    for (int64_t dim : {0, 1}) {
      std::vector<double> sums, means;
      for (const auto& line : slices(values_of(x), {4, 6}, dim)) {
        double s = 0;
        int64_t c = 0;
        for (double e : line)
          if (!std::isnan(e)) s += e, ++c;
        sums.push_back(s);
        means.push_back(s / double(c));
      }
      const double tol = 4 * default_rtol(dt);
      check_close(nansum(x, {dim}), sums, tol, tol, name_of(dt) + " nansum");
      check_close(nanmean(x, {dim}, true), means, tol, tol, name_of(dt) + " nanmean");
    }
  }
  const Tensor y = make_tensor({1, kNaN, 2, 4}, {4}, kFloat64).requires_grad_();
  nanmean(y).backward();
  check_close(y.grad(), {1.0 / 3, 0, 1.0 / 3, 1.0 / 3}, 1e-15, 0, "nanmean's gradient");
  CHECK(std::isnan(nanmean(make_tensor({kNaN, kNaN}, {2}, kFloat32)).item<float>()));
  CHECK(nansum(make_tensor({kNaN}, {1}, kFloat32)).item<float>() == 0.0f);
  CHECK(nansum(make_tensor({3, 4}, {2}, kInt32)).dtype() == kInt64);
  check_error([] { nanmean(zeros({2}, kInt64)); }, {"nanmean", "floating", "int64[2]"});
}

TEST_CASE("statistics: any, all and count_nonzero over dims, size-0 slices, NaN and bool") {
  const std::vector<double> v = {0, 1, 0, 0, 0, 0, 0, 0, kNaN, 3, -1, 5};
  const Tensor x = make_tensor(v, {3, 4}, kFloat32, Layout::Transposed);
  CHECK(any(x, {1}).tolist<bool>() == std::vector<bool>{true, false, true});
  CHECK(all(x, {1}).tolist<bool>() == std::vector<bool>{false, false, true});
  CHECK(any(x, {0}, true).sizes() == Shape{1, 4});
  CHECK(any(x).item<bool>());
  CHECK(!all(x).item<bool>());
  CHECK(count_nonzero(x, {1}).tolist<int64_t>() == std::vector<int64_t>{1, 0, 4});  // NaN is nonzero
  CHECK(count_nonzero(x).item<int64_t>() == 5);
  CHECK(count_nonzero(x, {0, 1}).dtype() == kInt64);
  const Tensor e = zeros({0, 3});
  CHECK(any(e, {0}).tolist<bool>() == std::vector<bool>{false, false, false});
  CHECK(all(e, {0}).tolist<bool>() == std::vector<bool>{true, true, true});
  CHECK(any(e, {1}).sizes() == Shape{0});
  const Tensor b = make_tensor({1, 0, 1, 1}, {2, 2}, kBool);
  CHECK(all(b, {1}).tolist<bool>() == std::vector<bool>{false, true});
  CHECK(any(make_tensor({0, -2}, {2}, kInt64)).item<bool>());
  CHECK(all(scalar_tensor(0.5)).item<bool>());
  check_error([&] { any(x, {2}); }, {"any", "dim 2", "[3, 4]"});
  check_error([&] { count_nonzero(x, {0, 0}); }, {"count_nonzero", "more than once"});
}

TEST_CASE("statistics: errors name the op, the argument and the shapes") {
  const Tensor x = zeros({3, 4});
  check_error([&] { kthvalue(x, 5, 1); }, {"kthvalue", "k = 5", "size 4", "[3, 4]"});
  check_error([&] { kthvalue(x, 0); }, {"kthvalue", "k = 0"});
  check_error([&] { median(zeros({3, 0}), 1); }, {"median", "size 0", "[3, 0]"});
  check_error([&] { nanmedian(x, 2); }, {"nanmedian", "dim 2", "[3, 4]"});
  check_error([&] { quantile(x, 1.5); }, {"quantile", "[0, 1]", "1.5"});
  check_error([&] { quantile(x, make_tensor({0.5, 1.2}, {2}, kFloat32)); }, {"quantile", "[0, 1]"});
  check_error([&] { quantile(x, make_tensor({0.5}, {1}, kFloat64)); }, {"quantile", "dtype", "float64[1]"});
  check_error([&] { quantile(x, make_tensor({0.5}, {1, 1}, kFloat32)); }, {"quantile", "1-d", "[1, 1]"});
  check_error([&] { quantile(zeros({0}), 0.5); }, {"quantile", "non-empty"});
  check_error([&] { quantile(zeros({2}, kInt64), 0.5); }, {"quantile", "floating", "int64[2]"});
  check_error([&] { nanquantile(x, 0.5, 0, false, "cubic"); }, {"nanquantile", "interpolation", "cubic"});
  check_error([&] { quantile(x, 0.5, 3); }, {"quantile", "dim 3"});
}
