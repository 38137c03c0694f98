// CUDA reductions against the CPU ops on the same inputs: every dtype, layout and dim set,
// long rows (block per row, split across blocks), many short rows (warp per row), column
// reductions (split and not), ties, NaN, empty tensors; the differentiable reductions,
// forward values and gradients (tests/gpu/autograd_check.h).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/cumsum.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/cumsum.h"
#include "tensor/ops/reduce.h"
#include "tests/gpu/autograd_check.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// kFloatTypes in the order this file's seeds are drawn in.
const DType kTypesInSeedOrder[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

/// GPU sums accumulate in float (CPU: double); allow for R roundings of the accumulator
/// on top of the output's own rounding.
double sum_atol(DType dt, int64_t R) { return (dt == kFloat64 ? 1e-15 : 2.4e-7) * double(R); }

int64_t reduced_count(const Shape& s, const std::vector<int64_t>& dims) {
  if (dims.empty()) return numel_of(s);
  int64_t r = 1;
  for (int64_t d : dims) r *= s[size_t(d < 0 ? d + int64_t(s.size()) : d)];
  return r;
}

void check_all_reductions(const DevicePair& x, const std::vector<int64_t>& dims, bool keepdim,
                          const std::string& what) {
  const DType dt = x.cpu.dtype();
  const int64_t R = reduced_count(x.cpu.sizes(), dims);
  const double rtol = std::max(default_rtol(dt), 1e-5);
  check_same(ops::sum(x.gpu, dims, keepdim), ops::sum(x.cpu, dims, keepdim), rtol, sum_atol(dt, R), "sum " + what);
  check_same(ops::mean(x.gpu, dims, keepdim), ops::mean(x.cpu, dims, keepdim), rtol, sum_atol(dt, R) / double(R),
             "mean " + what);
  check_same(ops::amax(x.gpu, dims, keepdim), ops::amax(x.cpu, dims, keepdim), 0, 0, "amax " + what);
  check_same(ops::amin(x.gpu, dims, keepdim), ops::amin(x.cpu, dims, keepdim), 0, 0, "amin " + what);
  check_same(ops::var(x.gpu, dims, 1, keepdim), ops::var(x.cpu, dims, 1, keepdim), rtol, dt == kFloat64 ? 1e-12 : 1e-5,
             "var " + what);
  // Products: each multiplication rounds (float on the GPU, double on the CPU) relative to
  // the value; long ones go to 0 on both (the atol covers their last subnormals).
  const double prod_rtol = 2 * rtol + (dt == kFloat64 ? 2.3e-16 : 1.2e-7) * double(R);
  check_same(ops::prod(x.gpu, dims, keepdim), ops::prod(x.cpu, dims, keepdim), prod_rtol, 1e-30, "prod " + what);
}

void check_arg_reductions(const DevicePair& x, int64_t dim, bool keepdim, const std::string& what) {
  const ops::ValuesIndices g = ops::max(x.gpu, dim, keepdim), c = ops::max(x.cpu, dim, keepdim);
  check_same(g.values, c.values, 0, 0, "max values " + what);
  check_same(g.indices, c.indices, 0, 0, "max indices " + what);
  const ops::ValuesIndices gn = ops::min(x.gpu, dim, keepdim), cn = ops::min(x.cpu, dim, keepdim);
  check_same(gn.values, cn.values, 0, 0, "min values " + what);
  check_same(gn.indices, cn.indices, 0, 0, "min indices " + what);
  check_same(ops::argmax(x.gpu, dim, keepdim), ops::argmax(x.cpu, dim, keepdim), 0, 0, "argmax " + what);
  check_same(ops::argmin(x.gpu, dim, keepdim), ops::argmin(x.cpu, dim, keepdim), 0, 0, "argmin " + what);
}

/// Integer-valued random data in [-4, 4): many ties for the arg reductions.
std::vector<double> tied_values(int64_t n, uint64_t seed) {
  std::vector<double> v = random_values(n, seed, -4, 4);
  for (double& e : v) e = std::floor(e);
  return v;
}

}  // namespace

TEST_CASE("cuda reduce: sum/mean/amax/amin/var match the CPU (dtypes x layouts x dims x keepdim)") {
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {-1}, {1}, {0, 2}, {0, 1}, {0, 1, 2}};
  uint64_t seed = 1;
  for (DType dt : kTypesInSeedOrder) {
    for (Layout layout : kAllLayouts) {
      for (const auto& dims : dim_sets) {
        for (bool keepdim : {false, true}) {
          const DevicePair x = random_pair({4, 5, 6}, dt, seed++, layout);
          check_all_reductions(x, dims, keepdim,
                               std::string(dtype_name(dt)) + " " + layout_name(layout) + " dims " + shape_str(dims));
        }
      }
    }
  }
}

TEST_CASE("cuda reduce: long rows, many short rows, split rows and split columns") {
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
    const char* name;
  };
  const Case cases[] = {
      {{3, 50000}, {1}, "3 rows of 50000 (block per row, split)"},
      {{300, 50000}, {1}, "300 rows of 50000 (block per row)"},
      {{20000, 7}, {1}, "20000 rows of 7 (warp per row)"},
      {{1000, 300}, {1}, "1000 rows of 300"},
      {{1 << 22}, {}, "full sum of 2^22 (split)"},
      {{100000, 40}, {0}, "columns: sum over 100000 rows (split)"},
      {{64, 512, 96}, {0, 1}, "columns: bias gradient of (64, 512, 96)"},
      {{30, 700, 50}, {1}, "columns: middle dim"},
      {{50000, 3}, {1}, "short rows of 3"},
      {{7, 9, 5000}, {0, 2}, "non-adjacent dims (copy path)"},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    for (DType dt : kTypesInSeedOrder) {
      const DevicePair x = random_pair(c.shape, dt, seed++);
      check_all_reductions(x, c.dims, false, std::string(dtype_name(dt)) + " " + c.name);
    }
    // Transposed storage of the same shape (a 2-d case flips rows and columns).
    if (c.shape.size() >= 2) {
      const DevicePair xt = random_pair(c.shape, kFloat32, seed++, Layout::Transposed);
      check_all_reductions(xt, c.dims, true, std::string("transposed float32 ") + c.name);
    }
  }
}

TEST_CASE("cuda reduce: sum of 2^20 floats is accurate against float64") {
  const int64_t n = int64_t(1) << 20;
  const DevicePair x = random_pair({n}, kFloat32, 42, Layout::Contiguous, 0, 1);
  double exact = 0;
  for (double e : values_of(x.cpu)) exact += e;
  CHECK(std::fabs(ops::sum(x.gpu).item<double>() - exact) <= 1e-6 * exact);
  CHECK(ops::sum(ones({4096}, {kFloat16, cuda()})).item<double>() == 4096.0);
  const auto cols = values_of(ops::sum(ones({1 << 16, 8}, {kBFloat16, cuda()}), {0}));
  for (double c : cols) CHECK(c == 65536.0);
}

TEST_CASE("cuda reduce: integer and bool dtypes are exact") {
  for (DType dt : {kInt32, kInt64}) {
    for (const auto& [shape, dim] :
         std::vector<std::pair<Shape, int64_t>>{{{6, 7, 8}, 1}, {{5, 40000}, 1}, {{40000, 5}, 0}}) {
      const DevicePair x = on_both(tied_values(numel_of(shape), 7), shape, dt, Layout::Transposed);
      const std::string what = std::string(dtype_name(dt)) + " " + shape_str(shape);
      const Tensor s = ops::sum(x.gpu, {dim});
      CHECK(s.dtype() == kInt64);
      check_same(s, ops::sum(x.cpu, {dim}), 0, 0, "sum " + what);
      check_same(ops::sum(x.gpu), ops::sum(x.cpu), 0, 0, "sum all " + what);
      check_same(ops::amax(x.gpu, {dim}), ops::amax(x.cpu, {dim}), 0, 0, "amax " + what);
      check_same(ops::prod(x.gpu, {dim}), ops::prod(x.cpu, {dim}), 0, 0, "prod " + what);  // int64, wrapping alike
      check_arg_reductions(x, dim, false, what);
    }
  }
  std::vector<double> bits = random_values(3 * 70000, 5, 0, 1);
  for (double& b : bits) b = b > 0.7;
  const DevicePair m = on_both(bits, {3, 70000}, kBool);
  check_same(ops::sum(m.gpu, {1}), ops::sum(m.cpu, {1}), 0, 0, "bool count");
  check_same(ops::amax(m.gpu, {0}), ops::amax(m.cpu, {0}), 0, 0, "bool amax");
  check_same(ops::argmax(m.gpu, 1), ops::argmax(m.cpu, 1), 0, 0, "bool argmax");
}

TEST_CASE("cuda reduce: max/min/argmax/argmin with ties agree with the CPU exactly (first occurrence)") {
  uint64_t seed = 300;
  for (DType dt : kTypesInSeedOrder) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim : {0, 1, -1}) {
        const DevicePair x = on_both(tied_values(4 * 5 * 13, seed++), {4, 5, 13}, dt, layout);
        check_arg_reductions(x, dim, dim == 1, std::string(dtype_name(dt)) + " " + layout_name(layout));
      }
    }
    // Long rows (split across blocks) and long columns: ties between blocks.
    check_arg_reductions(on_both(tied_values(4 * 200000, seed++), {4, 200000}, dt), 1, false, "long rows");
    check_arg_reductions(on_both(tied_values(3000 * 33, seed++), {3000, 33}, dt), 0, false, "long columns");
    check_arg_reductions(on_both(tied_values(20000 * 9, seed++), {20000, 9}, dt), 1, false, "short rows");
  }
}

TEST_CASE("cuda reduce: NaN propagates and argmax finds the first NaN") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : kTypesInSeedOrder) {
    std::vector<double> v = random_values(6 * 3000, 9);
    v[5] = v[1700] = v[3000 + 2999] = nan;        // rows 0 and 1
    v[4 * 3000 + 10] = v[4 * 3000 + 2000] = nan;  // row 4
    const DevicePair x = on_both(v, {6, 3000}, dt);
    check_arg_reductions(x, 1, false, std::string("NaN rows ") + dtype_name(dt));
    check_arg_reductions(x, 0, false, std::string("NaN columns ") + dtype_name(dt));
    check_same(ops::amax(x.gpu, {1}), ops::amax(x.cpu, {1}), 0, 0, "amax NaN");
    check_same(ops::amin(x.gpu, {0}), ops::amin(x.cpu, {0}), 0, 0, "amin NaN");
    CHECK(std::isnan(ops::sum(x.gpu).item<double>()));
    CHECK(std::isnan(ops::amax(x.gpu).item<double>()));
  }
}

TEST_CASE("cuda reduce: empty and 0-d tensors, errors") {
  const Tensor e = empty({0, 3}, {kFloat32, cuda()});
  CHECK(ops::sum(e, {0}).device() == cuda());
  CHECK(values_of(ops::sum(e, {0})) == std::vector<double>{0, 0, 0});
  for (double m : values_of(ops::mean(e, {0}))) CHECK(std::isnan(m));
  CHECK(ops::amax(e, {1}).sizes() == Shape{0});
  check_error([&] { ops::amax(e, {0}); }, {"amax", "zero-size", "cuda"});
  check_error([&] { ops::sum(e, {2}); }, {"sum", "dim 2", "[0, 3]"});
  const Tensor s = scalar_tensor(4.0, {kFloat32, cuda()});
  CHECK(ops::sum(s).item<float>() == 4.0f);
  CHECK(ops::argmax(s, 0).item<int64_t>() == 0);
}

TEST_CASE("cuda reduce: views no single layout merges match the CPU (the layouts that wrote past the output)") {
  // The CPU side is checked against loops over the raw data in the cpu suite; the layout
  // is built by the shared front end, so the same views go through the CUDA kernels here.
  const DevicePair x4 = random_pair({2, 3, 4, 5}, kFloat32, 1);
  check_all_reductions({x4.cpu.narrow(3, 0, 3), x4.gpu.narrow(3, 0, 3)}, {0}, false, "narrow(3, 0, 3) over 0");
  check_all_reductions({x4.cpu.narrow(1, 1, 2), x4.gpu.narrow(1, 1, 2)}, {3}, true, "narrow(1, 1, 2) over 3");
  const DevicePair x5 = random_pair({2, 3, 2, 4, 3}, kFloat32, 2);
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{0}, {1}, {2}, {3}, {4}, {1, 3}, {0, 4}})
    check_all_reductions({x5.cpu.transpose(3, 4), x5.gpu.transpose(3, 4)}, dims, false,
                         "5-d transpose(3, 4) over " + shape_str(dims));
  for (int64_t nd = 5; nd <= 12; ++nd) {
    Shape shape(size_t(nd), 2);
    shape[1] = 3;
    const DevicePair t = random_pair(shape, kFloat32, uint64_t(nd));
    check_all_reductions({t.cpu.transpose(0, nd - 1), t.gpu.transpose(0, nd - 1)}, {1}, false,
                         std::to_string(nd) + "-d transpose(0, -1) over 1");
  }
}

// ---- the differentiable ops on CUDA: autograd/ops/reduce.h ------------------------------

namespace {

std::vector<AutogradCase> autograd_reduce_cases() {
  using L = const TensorList&;
  const Shape s{6, 37, 50};
  std::vector<AutogradCase> cases;
  for (bool keepdim : {false, true}) {
    const std::string k = keepdim ? " keepdim" : "";
    cases.push_back({"sum" + k, {grad_input(s)}, [=](L in) { return sum(in[0], {0, 2}, keepdim); }});
    cases.push_back({"sum all" + k, {grad_input(s)}, [=](L in) { return sum(in[0], {}, keepdim); }});
    cases.push_back({"mean" + k, {grad_input(s)}, [=](L in) { return mean(in[0], {1}, keepdim); }});
    cases.push_back({"var" + k, {grad_input(s)}, [=](L in) { return var(in[0], {-1}, 1, keepdim); }, 2.0});
    cases.push_back({"amax" + k, {grad_input(s)}, [=](L in) { return amax(in[0], {1, 2}, keepdim); }});
    cases.push_back({"amin" + k, {grad_input(s)}, [=](L in) { return amin(in[0].transpose(0, 2), {0}, keepdim); }});
    cases.push_back({"max" + k, {grad_input(s)}, [=](L in) { return max(in[0], 1, keepdim).values; }});
    cases.push_back({"min" + k, {grad_input(s)}, [=](L in) { return min(in[0], -1, keepdim).values; }});
    // Factors near 1 keep the products of 37 and 300 finite.
    cases.push_back({"prod" + k, {grad_input(s, 0.5, 1.5)}, [=](L in) { return prod(in[0], {1}, keepdim); }});
    cases.push_back({"prod over 2 dims" + k, {grad_input(s, 0.8, 1.2)}, [=](L in) {
                       return prod(in[0].transpose(0, 1), {1, 2}, keepdim);
                     }});
  }
  cases.push_back({"cumprod", {grad_input(s, 0.5, 1.5)}, [=](L in) { return cumprod(in[0], 1); }});
  cases.push_back({"cummax", {grad_input(s)}, [=](L in) { return cummax(in[0], 2).values; }});
  cases.push_back({"cummin of a view", {grad_input(s)}, [=](L in) { return cummin(in[0].transpose(0, 1), 0).values; }});
  cases.push_back({"logcumsumexp", {grad_input(s)}, [=](L in) { return logcumsumexp(in[0], -1); }});
  cases.push_back(
      {"cumprod of a view", {grad_input(s, 0.8, 1.2)}, [=](L in) { return cumprod(in[0].transpose(1, 2), 0); }});
  // Zeros in some lines: cumprod's and prod's gradients take their masked forms.
  cases.push_back({"cumprod with zeros", {grad_input(s, 0.5, 1.5)}, [=](L in) {
                     return cumprod(mul(in[0], ops::gt(in[0], 0.52).to(in[0].dtype())), -1);
                   }});
  cases.push_back({"prod with zeros", {grad_input(s, 0.5, 1.5)}, [=](L in) {
                     return prod(mul(in[0], ops::gt(in[0], 0.52).to(in[0].dtype())), {1});
                   }});
  return cases;
}

}  // namespace

TEST_CASE("cuda autograd ops: reductions forward and gradients match the CPU") {
  run_autograd_cases(autograd_reduce_cases());
}

// Both backends sum each line in the same chunked order in the same accumulator type
// (Note [Cumulative sum order]), so CUDA must match the CPU exactly: rows through the 32 x 32
// tile (inner == 1: row counts and lengths off the tile's multiples), lines along inner dims,
// few lines longer than a chunk (summed chunk by chunk in parallel; 1100000 entries: 34
// spans, more than one warp's worth of span carries) and many (one pass, the carry crossing
// chunk and span boundaries), both directions, every dtype; cumprod runs the same kernels with
// * in place of +.
TEST_CASE("cumsum, reverse_cumsum, cumprod, cummax and cummin on CUDA match the CPU exactly; logcumsumexp closely") {
  struct Case {
    Shape shape;
    int64_t dim;
    bool all_dtypes;
  };
  const std::vector<Case> cases = {{{70, 100}, 1, true},
                                   {{33, 31}, -1, true},
                                   {{1, 5000}, 1, true},
                                   {{3, 1}, 1, true},
                                   {{2, 45, 3}, 1, true},
                                   {{64, 64}, 0, true},
                                   {{5, 7, 9}, 2, true},
                                   {{130, 2}, 1, true},
                                   {{7}, 0, true},
                                   {{}, 0, true},
                                   {{3, 20000}, 1, true},
                                   {{9000, 3}, 0, true},
                                   {{2, 8193, 2}, 1, true},
                                   {{65600, 1100}, 1, false},
                                   {{1100, 65600}, 0, false},
                                   // few rows by chunk (through tiles), and lines of more than one span of chunks:
                                   {{2, 70001}, 1, true},
                                   {{31, 2049}, 1, true},
                                   {{1, 1100000}, 1, false},
                                   {{40, 40000}, 1, false},
                                   {{3, 70000, 2}, 1, false},
                                   {{100000, 2}, 0, false}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
      if (!c.all_dtypes && dt != kFloat32) continue;
      CAPTURE(shape_str(c.shape));
      CAPTURE(c.dim);
      CAPTURE(dtype_name(dt));
      const Layout layout = c.all_dtypes ? Layout::Transposed : Layout::Contiguous;
      const DevicePair x = is_floating(dt) ? random_pair(c.shape, dt, ++seed, layout)
                                           : random_pair(c.shape, dt, ++seed, layout, -1000, 1000);
      check_same(ops::cumsum(x.gpu, c.dim), ops::cumsum(x.cpu, c.dim), 0.0, "cumsum");
      check_same(ops::reverse_cumsum(x.gpu, c.dim), ops::reverse_cumsum(x.cpu, c.dim), 0.0, "reverse_cumsum");
      // Floating factors near 1 keep long products off 0 and inf, so the carries count.
      const DevicePair f = is_floating(dt) ? random_pair(c.shape, dt, seed, layout, 0.999, 1.001) : x;
      check_same(ops::cumprod(f.gpu, c.dim), ops::cumprod(f.cpu, c.dim), 0.0, "cumprod");
      // Running extremes are exact; log-add-exp runs log1p and exp, whose last bits differ
      // between the CPU's and CUDA's math libraries.
      for (bool is_max : {true, false}) {
        const ops::ValuesIndices g = is_max ? ops::cummax(x.gpu, c.dim) : ops::cummin(x.gpu, c.dim);
        const ops::ValuesIndices h = is_max ? ops::cummax(x.cpu, c.dim) : ops::cummin(x.cpu, c.dim);
        check_same(g.values, h.values, 0.0, is_max ? "cummax" : "cummin");
        check_same(g.indices, h.indices, 0.0, is_max ? "cummax indices" : "cummin indices");
      }
      if (is_floating(dt)) {
        const double tol = dt == kFloat64   ? 1e-12
                           : dt == kFloat32 ? 1e-5
                                            : 4 * default_rtol(dt);  // 16-bit: one rounding apart
        check_same(ops::logcumsumexp(x.gpu, c.dim), ops::logcumsumexp(x.cpu, c.dim), tol, tol, "logcumsumexp");
      }
    }
  }
  const DevicePair h = random_pair({40, 50}, kFloat16, 7);
  check_same(ops::cumsum(h.gpu, 1, kFloat32), ops::cumsum(h.cpu, 1, kFloat32), 0.0, "dtype=float32");
}
