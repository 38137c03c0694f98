// Reductions (sum, prod, mean, amax, amin, var, max/min/argmax/argmin) against naive float64
// loops written here, over dtypes, layouts, dim sets and keepdim; the differentiable
// reductions (autograd/ops/reduce.h) through gradcheck in float64, and their ties.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tensor/ops/reduce.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class Stat { Sum, Prod, Mean, Max, Min, Var, ArgMax, ArgMin };

/// The values of each output of reducing `shape` over `mask`, in input order.
std::vector<std::vector<double>> groups(const std::vector<double>& v, const Shape& shape,
                                        const std::vector<bool>& mask) {
  int64_t nout = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (!mask[d]) nout *= shape[d];
  std::vector<std::vector<double>> g(size_t(std::max<int64_t>(nout, 0)));
  for (int64_t i = 0; i < int64_t(v.size()); ++i) {
    const std::vector<int64_t> idx = unravel(i, shape);
    int64_t o = 0;
    for (size_t d = 0; d < shape.size(); ++d)
      if (!mask[d]) o = o * shape[d] + idx[d];
    g[size_t(o)].push_back(v[size_t(i)]);
  }
  return g;
}

double stat_of(const std::vector<double>& xs, Stat s, int64_t correction = 1) {
  const double n = double(xs.size());
  switch (s) {
    case Stat::Sum:
    case Stat::Mean: {
      double t = 0;
      for (double x : xs) t += x;
      return s == Stat::Sum ? t : t / n;
    }
    case Stat::Prod: {
      double p = 1;
      for (double x : xs) p *= x;
      return p;
    }
    case Stat::Var: {
      double m = 0;
      for (double x : xs) m += x;
      m /= n;
      double q = 0;
      for (double x : xs) q += (x - m) * (x - m);
      return q / std::max(0.0, n - double(correction));
    }
    case Stat::Max:
    case Stat::Min:
    case Stat::ArgMax:
    case Stat::ArgMin: {
      const bool is_max = s == Stat::Max || s == Stat::ArgMax;
      size_t best = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        if (std::isnan(xs[best])) break;
        if (std::isnan(xs[i]) || (is_max ? xs[i] > xs[best] : xs[i] < xs[best])) best = i;
      }
      return (s == Stat::ArgMax || s == Stat::ArgMin) ? double(best) : xs[best];
    }
  }
  return 0;
}

std::vector<double> reference(const Tensor& x, const std::vector<bool>& mask, Stat s, int64_t correction = 1) {
  std::vector<double> out;
  for (const auto& g : groups(values_of(x), x.sizes(), mask)) out.push_back(stat_of(g, s, correction));
  return out;
}

std::vector<bool> mask_of(int64_t ndim, const std::vector<int64_t>& dims) {
  std::vector<bool> m(size_t(ndim), dims.empty());
  for (int64_t d : dims) m[size_t(d < 0 ? d + ndim : d)] = true;
  return m;
}

Shape expected_shape(const Shape& s, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < s.size(); ++d) {
    if (!mask[d]) out.push_back(s[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

std::string dims_str(const std::vector<int64_t>& dims) { return shape_str(dims); }

const std::vector<std::vector<int64_t>> kDimSets = {{}, {0}, {-1}, {1}, {0, 2}, {0, 1}, {-1, -3}, {0, 1, 2}};
const DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

}  // namespace

TEST_CASE("reduce: sum, prod, mean, amax, amin, var match float64 loops (dtypes x layouts x dims x keepdim)") {
  const Shape shape = {4, 5, 6};
  uint64_t seed = 1;
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      for (const auto& dims : kDimSets) {
        for (bool keepdim : {false, true}) {
          const Tensor x = random_tensor(shape, dt, seed++, layout);
          const auto mask = mask_of(3, dims);
          const std::string what = std::string(dtype_name(dt)) + " " + layout_name(layout) + " dims " + dims_str(dims) +
                                   (keepdim ? " keepdim" : "");
          const double rtol = default_rtol(dt), atol = dt == kFloat64 ? 1e-12 : rtol * 0.5;
          const Shape eshape = expected_shape(shape, mask, keepdim);
          struct Case {
            const char* name;
            Tensor got;
            Stat stat;
          };
          const Case cases[] = {
              {"sum", ops::sum(x, dims, keepdim), Stat::Sum},    {"mean", ops::mean(x, dims, keepdim), Stat::Mean},
              {"amax", ops::amax(x, dims, keepdim), Stat::Max},  {"amin", ops::amin(x, dims, keepdim), Stat::Min},
              {"var", ops::var(x, dims, 1, keepdim), Stat::Var}, {"prod", ops::prod(x, dims, keepdim), Stat::Prod},
          };
          for (const Case& c : cases) {
            CHECK(c.got.sizes() == eshape);
            CHECK(c.got.dtype() == dt);
            CHECK(c.got.is_contiguous());
            check_close(c.got, reference(x, mask, c.stat), rtol, atol, std::string(c.name) + " " + what);
          }
          check_close(ops::var(x, dims, 0, keepdim), reference(x, mask, Stat::Var, 0), rtol, atol, "var(c=0) " + what);
        }
      }
    }
  }
}

TEST_CASE("reduce: a 4-d input on every layout path (one run, permuted view, copy)") {
  const Shape shape = {3, 4, 5, 2};
  const std::vector<std::vector<int64_t>> dim_sets = {{1, 3}, {0, 2}, {1, 2}, {2, 3}, {0, 3}, {0, 1, 3}, {-2}};
  uint64_t seed = 100;
  for (Layout layout : kAllLayouts) {
    for (const auto& dims : dim_sets) {
      const Tensor x = random_tensor(shape, kFloat64, seed++, layout);
      const auto mask = mask_of(4, dims);
      const std::string what = std::string(layout_name(layout)) + " dims " + dims_str(dims);
      check_close(ops::sum(x, dims), reference(x, mask, Stat::Sum), 1e-12, 1e-12, "sum " + what);
      check_close(ops::var(x, dims), reference(x, mask, Stat::Var), 1e-12, 1e-12, "var " + what);
      check_close(ops::amax(x, dims, true), reference(x, mask, Stat::Max), 0, 0, "amax " + what);
      check_close(ops::prod(x, dims), reference(x, mask, Stat::Prod), 1e-12, 1e-300, "prod " + what);
    }
  }
  // A permuted (not transposed-last-two) view: dims (2, 0, 3, 1) of a contiguous tensor.
  const Tensor base = random_tensor({4, 3, 2, 5}, kFloat32, 7);
  const Tensor x = base.permute({2, 0, 3, 1});
  for (const auto& dims : dim_sets) {
    const auto mask = mask_of(4, dims);
    check_close(ops::sum(x, dims), reference(x, mask, Stat::Sum), 1e-5, 1e-5, "permuted sum " + dims_str(dims));
    check_close(ops::amin(x, dims), reference(x, mask, Stat::Min), 0, 0, "permuted amin " + dims_str(dims));
  }
}

TEST_CASE("reduce: broadcast (stride-0) inputs") {
  const Tensor row = random_tensor({1, 6}, kFloat32, 3);
  const Tensor x = row.expand({5, 6});
  for (const auto& dims : std::vector<std::vector<int64_t>>{{0}, {1}, {}}) {
    const auto mask = mask_of(2, dims);
    check_close(ops::sum(x, dims), reference(x, mask, Stat::Sum), 1e-6, 1e-6, "expanded sum " + dims_str(dims));
    check_close(ops::var(x, dims), reference(x, mask, Stat::Var), 1e-5, 1e-6, "expanded var " + dims_str(dims));
    const int64_t dim = dims.empty() ? 0 : dims[0];
    check_close(ops::argmax(x, dim), reference(x, mask_of(2, {dim}), Stat::ArgMax), 0, 0, "expanded argmax");
  }
}

TEST_CASE("reduce: integer and bool dtypes") {
  const std::vector<double> v = {3, -1, 4, 1, -5, 9, 2, -6, 5, 3, 5, -8};
  const Tensor xi = make_tensor(v, {3, 4}, kInt32, Layout::Transposed);
  const Tensor s = ops::sum(xi, {1});
  CHECK(s.dtype() == kInt64);
  CHECK(s.tolist<int64_t>() == std::vector<int64_t>{7, 0, 5});
  CHECK(ops::sum(xi).item<int64_t>() == 12);
  const Tensor big = full({3}, 2e9, kInt64);
  CHECK(ops::sum(big).item<int64_t>() == int64_t(6e9));
  const Tensor mx = ops::amax(xi, {0});
  CHECK(mx.dtype() == kInt32);
  CHECK(mx.tolist<int32_t>() == std::vector<int32_t>{5, 9, 5, 1});
  CHECK(ops::amin(xi).item<int32_t>() == -8);
  const ops::ValuesIndices m = ops::min(make_tensor(v, {3, 4}, kInt64), 0);
  CHECK(m.values.tolist<int64_t>() == std::vector<int64_t>{-5, -1, 2, -8});
  CHECK(m.indices.tolist<int64_t>() == std::vector<int64_t>{1, 0, 1, 2});
  const Tensor mask = make_tensor({1, 0, 1, 1, 0, 1}, {2, 3}, kBool);
  const Tensor count = ops::sum(mask, {1});
  CHECK(count.dtype() == kInt64);
  CHECK(count.tolist<int64_t>() == std::vector<int64_t>{2, 2});
  CHECK(ops::amax(mask, {0}).tolist<bool>() == std::vector<bool>{true, false, true});
  CHECK(ops::argmax(mask, 1).tolist<int64_t>() == std::vector<int64_t>{0, 0});
  // prod: int64 results, wrapping around past its range as PyTorch's (3^41 mod 2^64, signed).
  const Tensor p = ops::prod(xi, {1});
  CHECK(p.dtype() == kInt64);
  CHECK(p.tolist<int64_t>() == std::vector<int64_t>{-12, 540, -600});
  CHECK(ops::prod(mask, {1}).tolist<int64_t>() == std::vector<int64_t>{0, 0});
  CHECK(ops::prod(make_tensor({1, 1, 1}, {3}, kBool)).item<int64_t>() == 1);
  uint64_t wrapped = 1;
  for (int k = 0; k < 41; ++k) wrapped *= 3u;
  CHECK(ops::prod(full({41}, 3, kInt64)).item<int64_t>() == int64_t(wrapped));
  CHECK(ops::prod(full({64}, 2, kInt32)).item<int64_t>() == 0);  // 2^64 wraps to 0
}

TEST_CASE("reduce: max/min/argmax/argmin with indices vs float64 loops") {
  uint64_t seed = 500;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim : {0, 1, 2, -1}) {
        for (bool keepdim : {false, true}) {
          // Integer-valued inputs in a small range: plenty of ties.
          std::vector<double> v = random_values(4 * 5 * 13, seed++, -4, 4);
          for (double& e : v) e = std::floor(e);
          const Tensor x = make_tensor(v, {4, 5, 13}, dt, layout);
          const auto mask = mask_of(3, {dim});
          const std::string what = std::string(dtype_name(dt)) + " " + layout_name(layout) + " dim " +
                                   std::to_string(dim) + (keepdim ? " keepdim" : "");
          const Shape eshape = expected_shape({4, 5, 13}, mask, keepdim);
          const ops::ValuesIndices mx = ops::max(x, dim, keepdim), mn = ops::min(x, dim, keepdim);
          CHECK(mx.values.sizes() == eshape);
          CHECK(mx.indices.sizes() == eshape);
          CHECK(mx.values.dtype() == dt);
          CHECK(mx.indices.dtype() == kInt64);
          check_close(mx.values, reference(x, mask, Stat::Max), 0, 0, "max values " + what);
          check_close(mx.indices, reference(x, mask, Stat::ArgMax), 0, 0, "max indices " + what);
          check_close(mn.values, reference(x, mask, Stat::Min), 0, 0, "min values " + what);
          check_close(mn.indices, reference(x, mask, Stat::ArgMin), 0, 0, "min indices " + what);
          check_close(ops::argmax(x, dim, keepdim), reference(x, mask, Stat::ArgMax), 0, 0, "argmax " + what);
          check_close(ops::argmin(x, dim, keepdim), reference(x, mask, Stat::ArgMin), 0, 0, "argmin " + what);
        }
      }
    }
  }
}

TEST_CASE("reduce: ties go to the first occurrence, in rows, columns and split rows") {
  // A long row: the 8-lane fold sees the ties in different lanes.
  std::vector<double> row(100, 0.0);
  row[63] = row[7] = row[15] = 5.0;
  row[9] = row[90] = -3.0;
  const Tensor r = make_tensor(row, {100}, kFloat32);
  CHECK(ops::argmax(r, 0).item<int64_t>() == 7);
  CHECK(ops::argmin(r, 0).item<int64_t>() == 9);
  // Columns: reducing dim 0 of (10, 4).
  std::vector<double> col(40, 1.0);
  col[3 * 4 + 2] = col[8 * 4 + 2] = 7.0;
  CHECK(ops::argmax(make_tensor(col, {10, 4}, kFloat64), 0).tolist<int64_t>() == std::vector<int64_t>{0, 0, 3, 0});
  // One row long enough to be cut into chunks across threads.
  const int64_t n = 300000;
  std::vector<double> longrow(size_t(n), 0.0);
  longrow[size_t(n - 5)] = longrow[10] = longrow[size_t(n / 2)] = 2.0;
  longrow[size_t(n - 7)] = longrow[size_t(n / 2 + 1)] = -2.0;
  const Tensor lr = make_tensor(longrow, {n}, kFloat32);
  CHECK(ops::argmax(lr, 0).item<int64_t>() == 10);
  CHECK(ops::argmin(lr, 0).item<int64_t>() == n / 2 + 1);
  CHECK(ops::max(lr, 0).values.item<float>() == 2.0f);
  // Long columns (R cut into chunks across threads): ties in different chunks.
  std::vector<double> lc(size_t(3 * 70000), 0.0);
  lc[10 * 3 + 1] = lc[60000 * 3 + 1] = lc[35000 * 3 + 1] = 3.0;
  lc[69999 * 3 + 2] = lc[40000 * 3 + 2] = -3.0;
  const Tensor c = make_tensor(lc, {70000, 3}, kFloat64);
  CHECK(ops::argmax(c, 0).tolist<int64_t>() == std::vector<int64_t>{0, 10, 0});
  CHECK(ops::argmin(c, 0).tolist<int64_t>() == std::vector<int64_t>{0, 0, 40000});
}

TEST_CASE("reduce: NaN propagates through max/min/amax/amin/sum/var; argmax points at the first NaN") {
  const std::vector<double> v = {1, kNaN, 3, kNaN, 2, 0, 9, -1, -4, 5, 6, 7};
  for (DType dt : kFloatTypes) {
    const Tensor x = make_tensor(v, {3, 4}, dt);
    const ops::ValuesIndices m = ops::max(x, 1);
    const auto mv = values_of(m.values);
    CHECK(std::isnan(mv[0]));
    CHECK(mv[1] == 9);
    CHECK(m.indices.tolist<int64_t>() == std::vector<int64_t>{1, 2, 3});
    CHECK(ops::argmin(x, 1).tolist<int64_t>() == std::vector<int64_t>{1, 3, 0});
    CHECK(std::isnan(ops::amax(x).item<double>()));
    CHECK(std::isnan(ops::amin(x).item<double>()));
    const auto cols = values_of(ops::amax(x, {0}));
    CHECK(cols[0] == 2);
    CHECK(std::isnan(cols[1]));
    CHECK(ops::argmax(x, 0).tolist<int64_t>() == std::vector<int64_t>{1, 0, 1, 0});
    CHECK(std::isnan(values_of(ops::sum(x, {1}))[0]));
    CHECK(std::isnan(values_of(ops::var(x, {1}))[0]));
  }
}

TEST_CASE("reduce: sum of 2^20 floats is accurate") {
  const int64_t n = int64_t(1) << 20;
  const std::vector<double> v = random_values(n, 42, 0.0, 1.0);
  const Tensor x = make_tensor(v, {n}, kFloat32);
  double exact = 0;
  for (double e : values_of(x)) exact += e;  // the float32-rounded inputs, summed in double
  const double got = ops::sum(x).item<double>();
  CHECK(std::fabs(got - exact) <= 1e-6 * exact);
  CHECK(std::fabs(ops::mean(x).item<double>() - exact / double(n)) <= 1e-6 * exact / double(n));
  // The same values as columns: (2^16, 16) summed over dim 0 (the bias-gradient shape).
  const Tensor cols = x.view({n / 16, 16});
  const auto got_cols = values_of(ops::sum(cols, {0}));
  const auto xs = values_of(x);
  for (int64_t j = 0; j < 16; ++j) {
    double e = 0;
    for (int64_t i = 0; i < n / 16; ++i) e += xs[size_t(i * 16 + j)];
    CHECK(std::fabs(got_cols[size_t(j)] - e) <= 1e-6 * e);
  }
  // float16: 4096 ones sum to 4096 (accumulating in half would stall at 2048).
  CHECK(ops::sum(ones({4096}, kFloat16)).item<double>() == 4096.0);
  CHECK(ops::sum(ones({4096, 3}, kBFloat16), {0}).tolist<double>() == std::vector<double>{4096, 4096, 4096});
  // var of values with a large mean and a small spread (cancellation-prone).
  std::vector<double> w = random_values(100000, 9, -1.0, 1.0);
  for (double& e : w) e += 1e4;
  const Tensor xw = make_tensor(w, {100000}, kFloat32);
  check_close(ops::var(xw), reference(xw, {true}, Stat::Var), 1e-5, 0, "var with mean 1e4");
}

TEST_CASE("reduce: prod of long rows and of few long columns (the chunked paths) matches a float64 loop") {
  // Values near 1 keep 2^20 factors finite; float64 in and out, so only the order of the
  // multiplications differs from the loop's.
  const int64_t n = int64_t(1) << 20;
  const std::vector<double> v = random_values(n, 77, 0.999, 1.001);
  const Tensor x = make_tensor(v, {n}, kFloat64);
  check_close(ops::prod(x), reference(x, {true}, Stat::Prod), 1e-10, 0, "one row of 2^20");
  const Tensor cols = x.view({n / 8, 8});
  check_close(ops::prod(cols, {0}), reference(cols, mask_of(2, {0}), Stat::Prod), 1e-10, 0, "8 columns");
  const Tensor f = make_tensor(v, {n}, kFloat32);  // float32: multiplied in float64, rounded once
  check_close(ops::prod(f), reference(f, {true}, Stat::Prod), 1e-7, 0, "float32 row");
}

TEST_CASE("reduce: empty tensors and 0-d tensors") {
  const Tensor e = empty({0, 3});
  CHECK(ops::sum(e, {0}).tolist<float>() == std::vector<float>{0, 0, 0});
  CHECK(ops::sum(e).item<float>() == 0.0f);
  CHECK(ops::sum(e).dim() == 0);
  CHECK(ops::sum(empty({0}, kInt32)).item<int64_t>() == 0);
  for (double m : values_of(ops::mean(e, {0}))) CHECK(std::isnan(m));
  CHECK(std::isnan(ops::var(e).item<double>()));
  CHECK(ops::sum(e, {1}).sizes() == Shape{0});
  CHECK(ops::amax(e, {1}).sizes() == Shape{0});
  CHECK(ops::amax(e, {1}, true).sizes() == Shape{0, 1});
  const ops::ValuesIndices m = ops::max(e, 1);
  CHECK(m.values.sizes() == Shape{0});
  CHECK(m.indices.sizes() == Shape{0});
  CHECK(ops::mean(empty({2, 0, 4}), {0, 2}).sizes() == Shape{0});
  CHECK(ops::prod(e, {0}).tolist<float>() == std::vector<float>{1, 1, 1});  // the empty product
  CHECK(ops::prod(empty({0}, kInt32)).item<int64_t>() == 1);
  // 0-d: reducing "all dims" or dim 0 / -1 returns the value.
  const Tensor s = scalar_tensor(2.5);
  CHECK(ops::sum(s).dim() == 0);
  CHECK(ops::sum(s).item<float>() == 2.5f);
  CHECK(ops::sum(s, {0}, true).dim() == 0);
  CHECK(ops::amax(s, {-1}).item<float>() == 2.5f);
  CHECK(ops::prod(s).item<float>() == 2.5f);
  CHECK(ops::argmax(s, 0).item<int64_t>() == 0);
  CHECK(std::isnan(ops::var(s).item<double>()));  // one element, correction 1: 0/0
  CHECK(ops::var(s, {}, 0).item<float>() == 0.0f);
  // Size-1 dims everywhere.
  const Tensor x = random_tensor({1, 3, 1}, kFloat32, 5);
  check_close(ops::sum(x, {0, 2}), values_of(x), 0, 0, "sum over size-1 dims");
  check_close(ops::sum(x, {1}, true), reference(x, mask_of(3, {1}), Stat::Sum), 1e-6, 1e-6, "sum of 1x3x1");
}

TEST_CASE("reduce: var with correction larger than the count gives inf, as PyTorch") {
  const Tensor x = make_tensor({1, 3}, {2}, kFloat32);
  CHECK(std::isinf(ops::var(x, {}, 2).item<double>()));
  CHECK(ops::var(x, {}, 1).item<float>() == 2.0f);
}

TEST_CASE("reduce: errors name the op, the dim and the shape") {
  const Tensor x = zeros({4, 5, 6});
  check_error([&] { ops::sum(x, {3}); }, {"sum", "dim 3", "[4, 5, 6]"});
  check_error([&] { ops::mean(x, {-4}); }, {"mean", "dim -4", "[4, 5, 6]"});
  check_error([&] { ops::amax(x, {0, 0}); }, {"amax", "more than once", "[4, 5, 6]"});
  check_error([&] { ops::var(x, {1, -2}); }, {"var", "more than once"});
  check_error([&] { ops::prod(x, {2, -1}); }, {"prod", "more than once", "[4, 5, 6]"});
  check_error([&] { ops::amin(x, {7}); }, {"amin", "dim 7"});
  check_error([&] { ops::max(x, 3); }, {"max", "dim 3", "[4, 5, 6]"});
  check_error([&] { ops::min(x, -4); }, {"min", "dim -4"});
  check_error([&] { ops::argmax(x, 5); }, {"argmax", "dim 5"});
  check_error([&] { ops::argmin(x, 3, true); }, {"argmin", "dim 3"});
  check_error([&] { ops::sum(scalar_tensor(1.0), {1}); }, {"sum", "dim 1"});
  check_error([&] { ops::mean(zeros({2}, kInt32)); }, {"mean", "floating-point", "int32[2]"});
  check_error([&] { ops::var(zeros({2}, kInt64)); }, {"var", "floating-point", "int64[2]"});
  check_error([&] { ops::var(x, {}, -1); }, {"var", "correction"});
  const Tensor e = empty({0, 3});
  check_error([&] { ops::amax(e, {0}); }, {"amax", "zero-size", "[0, 3]"});
  check_error([&] { ops::amin(e); }, {"amin", "zero-size"});
  check_error([&] { ops::max(e, 0); }, {"max", "size 0", "[0, 3]"});
  check_error([&] { ops::argmin(e, 0); }, {"argmin", "size 0"});
  check_error([&] { ops::sum(Tensor()); }, {"sum", "undefined"});
}

namespace {

/// x's elements in logical row-major order, read through its raw data and strides (no
/// frugal op: contiguous() is a kernel of its own). x: float64 on the CPU.
std::vector<double> raw_values(const Tensor& x) {
  const double* base = x.data_ptr<double>();
  std::vector<double> out;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const std::vector<int64_t> idx = unravel(i, x.sizes());
    int64_t at = 0;
    for (int64_t d = 0; d < x.dim(); ++d) at += idx[size_t(d)] * x.stride(d);
    out.push_back(base[at]);
  }
  return out;
}

/// Checks sum, mean, amax and amin of `x` over `dims` against loops over its raw data.
void check_against_raw(const Tensor& x, const std::vector<int64_t>& dims) {
  const std::vector<bool> mask = mask_of(x.dim(), dims);
  const auto gs = groups(raw_values(x), x.sizes(), mask);
  const std::pair<Stat, Tensor> results[] = {{Stat::Sum, ops::sum(x, dims)},
                                             {Stat::Mean, ops::mean(x, dims)},
                                             {Stat::Max, ops::amax(x, dims)},
                                             {Stat::Min, ops::amin(x, dims)}};
  for (const auto& [stat, out] : results) {
    INFO("shape ", shape_str(x.sizes()), " strides ", shape_str(x.strides()), " dims ", dims_str(dims));
    REQUIRE(out.numel() == int64_t(gs.size()));
    std::vector<double> expected;
    for (const auto& g : gs) expected.push_back(stat_of(g, stat));
    check_close(raw_values(out), expected, 1e-12, 1e-12);
  }
}

}  // namespace

TEST_CASE("reduce: views no single layout merges (regression: a stale inner size wrote past the output)") {
  // The inputs of the issue that found it: a narrow of the last dim, a 5-d transpose of
  // the two last dims, and a sum over dim 1 of a transposed tensor of 5..12 dims (which
  // wrote outer * inner results into an output of outer elements, and crashed from 12).
  const Tensor x4 = random_tensor({2, 3, 4, 5}, kFloat64, 1);
  check_against_raw(x4.narrow(3, 0, 3), {0});
  check_against_raw(x4.narrow(3, 1, 3), {0, 2});
  check_against_raw(x4.narrow(1, 1, 2), {3});
  const Tensor x5 = random_tensor({2, 3, 2, 4, 3}, kFloat64, 2).transpose(3, 4);
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{0}, {1}, {2}, {3}, {4}, {1, 3}, {0, 4}})
    check_against_raw(x5, dims);
  for (int64_t nd = 5; nd <= 12; ++nd) {
    Shape shape(size_t(nd), 2);
    shape[1] = 3;
    const Tensor t = random_tensor(shape, kFloat64, uint64_t(nd)).transpose(0, nd - 1);
    check_against_raw(t, {1});
    check_against_raw(t, {0, 2});
  }
}

// ---- the differentiable ops: autograd/ops/reduce.h --------------------------------------

TEST_CASE("autograd reduce: sum's gradient is a broadcast, mean's is g / N, amax shares ties") {
  Tensor x = leaf({2, 3}, 10);
  Tensor g = from_vector(std::vector<double>{1, 2}, {2});
  sum(x, {1}).backward(g);
  CHECK(values_of(x.grad()) == std::vector<double>{1, 1, 1, 2, 2, 2});
  x.set_grad(Tensor());
  mean(x, {1}).backward(g);
  check_close(x.grad(), {1.0 / 3, 1.0 / 3, 1.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3}, 1e-15, 0, "mean");
  // Ties: amax/amin share evenly (PyTorch), max/min give it to the first index only.
  Tensor t = from_vector(std::vector<double>{1, 3, 3, 2, 0, 0, -1, 0}, {2, 4});
  t.requires_grad_();
  amax(t, {1}).backward(ones({2}, kFloat64));
  CHECK(values_of(t.grad()) == std::vector<double>{0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 0, 1.0 / 3});
  t.set_grad(Tensor());
  amin(t, {}).backward();
  CHECK(values_of(t.grad()) == std::vector<double>{0, 0, 0, 0, 0, 0, 1, 0});
  t.set_grad(Tensor());
  ValuesIndices m = max(t, 1);
  CHECK(values_of(m.indices) == std::vector<double>{1, 0});
  CHECK_FALSE(m.indices.requires_grad());
  m.values.backward(ones({2}, kFloat64));
  CHECK(values_of(t.grad()) == std::vector<double>{0, 1, 0, 0, 1, 0, 0, 0});
  t.set_grad(Tensor());
  min(t, 0, /*keepdim=*/true).values.backward(ones({1, 4}, kFloat64));
  CHECK(values_of(t.grad()) == std::vector<double>{0, 0, 0, 0, 1, 1, 1, 1});
  // argmax/argmin are re-exported.
  CHECK(values_of(argmax(t, 1)) == std::vector<double>{1, 0});
  CHECK(values_of(argmin(t, 1)) == std::vector<double>{0, 2});
}

// ---- std and vector_norm ------------------------------------------------------------------

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Float64 references over the last dim of a (rows, n) row-major list: torch.std and
/// torch.linalg.vector_norm written from their definitions.
std::vector<double> ref_row_norms(const std::vector<double>& x, int64_t rows, int64_t n, double ord) {
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r) {
    double acc = ord == -kInf ? kInf : 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const double a = std::fabs(x[size_t(r * n + j)]);
      if (ord == kInf) acc = std::max(acc, a);
      else if (ord == -kInf) acc = std::min(acc, a);
      else if (ord == 0.0) acc += a != 0.0;
      else acc += std::pow(a, ord);
    }
    out.push_back(std::isinf(ord) || ord == 0.0 ? acc : std::pow(acc, 1.0 / ord));
  }
  return out;
}

}  // namespace

TEST_CASE("std is sqrt(var) over dims, corrections and layouts; its gradient by central differences") {
  for (Layout layout : kAllLayouts) {
    const Tensor x = random_tensor({3, 5}, kFloat64, 41, layout);
    const std::vector<double> v = values_of(x);
    for (int64_t correction : {0, 1, 2}) {
      std::vector<double> expected;
      for (int64_t r = 0; r < 3; ++r) {
        double m = 0, ss = 0;
        for (int64_t j = 0; j < 5; ++j) m += v[size_t(r * 5 + j)] / 5.0;
        for (int64_t j = 0; j < 5; ++j) ss += (v[size_t(r * 5 + j)] - m) * (v[size_t(r * 5 + j)] - m);
        expected.push_back(std::sqrt(ss / double(5 - correction)));
      }
      check_close(frugal::std(x, {1}, correction), expected, 1e-12, 1e-12, "std over the last dim");
      CHECK(frugal::std(x, {-1}, correction, true).sizes() == Shape{3, 1});
    }
  }
  check_gradcheck([](const TensorList& in) { return frugal::std(in[0].t(), {0}); }, {leaf({4, 3}, 42)});
  check_gradcheck([](const TensorList& in) { return frugal::std(in[0]); }, {leaf({2, 3, 2}, 43)});
  check_error([] { frugal::std(zeros({3}, kInt64)); }, {"std", "floating", "int64[3]"});
  // A slice of equal values: deviation 0, gradient 0 there (PyTorch's std_backward), not NaN.
  const Tensor flat = make_tensor({2.0, 2.0, 2.0, 1.0, 3.0, 5.0}, {2, 3}, kFloat64).requires_grad_();
  sum(frugal::std(flat, {1})).backward();
  CHECK(frugal::std(flat, {1}).grad_fn_name() == "StdBackward");
  check_close(flat.grad(), {0.0, 0.0, 0.0, -0.5, 0.0, 0.5}, 1e-15, 1e-15, "equal values");
}

TEST_CASE("vector_norm matches float64 sums for every ord, dims, keepdim and layout") {
  for (Layout layout : kAllLayouts) {
    const Tensor x = random_tensor({4, 6}, kFloat32, 44, layout);
    const std::vector<double> v = values_of(x);
    for (double ord : {2.0, 1.0, 3.0, 0.5, -1.0, 0.0, kInf, -kInf}) {
      CAPTURE(ord);
      CAPTURE(std::string(layout_name(layout)));
      const Tensor out = vector_norm(x, ord, {-1});
      CHECK(out.dtype() == kFloat32);
      CHECK(out.sizes() == Shape{4});
      check_close(out, ref_row_norms(v, 4, 6, ord), 2e-6, 1e-6, "rows");
      CHECK(vector_norm(x, ord, {1}, true).sizes() == Shape{4, 1});
      check_close(vector_norm(x, ord), ref_row_norms(v, 1, 24, ord), 2e-6, 1e-6, "every dim");
    }
  }
  // float16: summed in float32, rounded once (a float16 sum of 4096 squares of 1 would overflow).
  const Tensor h = ones({4096}, kFloat16);
  CHECK(vector_norm(h).dtype() == kFloat16);
  CHECK(vector_norm(h).item<float>() == 64.0f);
  CHECK(vector_norm(ones({70000}, kFloat16), 2.0).item<float>() == doctest::Approx(std::sqrt(70000.0)).epsilon(1e-3));
  // Empty slices: an identity for ord >= 0, an error otherwise (as PyTorch).
  CHECK(vector_norm(zeros({2, 0}), 2.0, {1}).tolist<float>() == std::vector<float>{0.0f, 0.0f});
  check_error([] { vector_norm(zeros({2, 0}), -1.0, {1}); }, {"vector_norm", "empty", "float32[2, 0]"});
  check_error([] { vector_norm(zeros({0}), kInf); }, {"vector_norm", "empty"});
  check_error([] { vector_norm(zeros({3}, kInt32)); }, {"vector_norm", "floating", "int32[3]"});
  check_error([] { vector_norm(zeros({3}), 2.0, {1}); }, {"vector_norm", "dim"});
}

TEST_CASE("vector_norm's gradient: central differences, and PyTorch's 0 where the norm or x is 0") {
  for (double ord : {2.0, 1.0, 3.0, 1.5, 0.5, -1.0, kInf, -kInf}) {
    CAPTURE(ord);
    check_gradcheck([ord](const TensorList& in) { return vector_norm(in[0].t(), ord, {0}); }, {leaf({5, 3}, 45)});
    check_gradcheck([ord](const TensorList& in) { return vector_norm(in[0], ord, {}, true); }, {leaf({2, 3}, 46)});
  }
  // A norm of zeros: gradient 0, not the NaN of pow(sum(pow(|x|, p)), 1/p).
  for (double ord : {2.0, 3.0, 1.5, 1.0}) {
    CAPTURE(ord);
    const Tensor z = zeros({2, 3}, kFloat64).requires_grad_();
    sum(vector_norm(z, ord, {1})).backward();
    check_close(z.grad(), std::vector<double>(6, 0.0), 0.0, 0.0, "zeros");
  }
  // An entry of 0 in a nonzero slice: gradient 0 there for ord < 2 too (sgn(0) = 0).
  for (double ord : {1.5, 0.5}) {
    CAPTURE(ord);
    const Tensor x = make_tensor({0.0, 3.0, -4.0}, {3}, kFloat64).requires_grad_();
    vector_norm(x, ord).backward();
    const double n = std::pow(std::pow(3.0, ord) + std::pow(4.0, ord), 1.0 / ord);
    // d/dx_i = sgn(x_i) |x_i|^(ord - 1) n^(1 - ord)
    check_close(x.grad(), {0.0, std::pow(3.0, ord - 1) * std::pow(n, 1 - ord), -std::pow(4.0, ord - 1) * std::pow(n, 1 - ord)},
                1e-12, 1e-12, "an entry of 0");
  }
  // ord 0 counts: no gradient flows.
  const Tensor c = make_tensor({0.0, 2.0, -1.0}, {3}, kFloat64).requires_grad_();
  CHECK(vector_norm(c, 0.0).item<double>() == 2.0);
  // float16 leaf: the gradient comes back in float16.
  const Tensor hl = make_tensor({3.0, 4.0}, {2}, kFloat16).requires_grad_();
  vector_norm(hl).backward();
  CHECK(hl.grad().dtype() == kFloat16);
  check_close(hl.grad(), {0.6, 0.8}, 1e-3, 1e-3, "float16 gradient");
}

TEST_CASE("var's gradient on 16-bit inputs centres x in float32: two adjacent float16 values share it evenly") {
  // float16's mean of 1 and 1 + 2^-10 rounds onto one of them; x - mean in float16 would give
  // gradients 0 and 2^-10 where the exact ones are -2^-11 and 2^-11.
  const Tensor x = make_tensor({1.0, 1.0 + 0x1p-10}, {2}, kFloat16).requires_grad_();
  var(x, {}, 0).backward();
  CHECK(x.grad().dtype() == kFloat16);
  check_close(x.grad(), {-0x1p-11, 0x1p-11}, 0.0, 0.0, "var");
  const Tensor y = make_tensor({1.0, 1.0 + 0x1p-7}, {2}, kBFloat16).requires_grad_();
  frugal::std(y, {}, 0).backward();
  check_close(y.grad(), {-0.5, 0.5}, 0.0, 0.0, "std: (x - mean) / (n std) = -+1/2 for two values");
}
