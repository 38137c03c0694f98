// sort, argsort and topk on CUDA (tensor/cuda/sort.cu) against the CPU op: the same values and
// indices, bit for bit (Note [Sort order] defines one order), in every dtype, along every dim,
// for every path of Note [CUDA sort paths] and the lengths on either side of each switch (the
// bitonic network to 256, the block radix sorts to 4096, the device-wide radix sorts beyond, one
// row or several), with ties, NaN, -0 and infinities; k from 0 to the size; empty tensors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "tensor/factory.h"
#include "tensor/ops/sort.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// Values with ties (rounded), NaN, -0 and infinities sprinkled in (integers: rounded only).
std::vector<double> tricky_values(int64_t n, uint64_t seed, bool integral) {
  std::vector<double> v = random_values(n, seed, -20, 20);
  const double specials[] = {std::nan(""), -0.0, 0.0, std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity()};
  for (int64_t i = 0; i < n; ++i) {
    v[size_t(i)] = std::round(v[size_t(i)]);
    if (!integral && i % 7 == 3) v[size_t(i)] = specials[(i / 7) % 5];
  }
  return v;
}

void check_same_sort(const Tensor& x_cpu, int64_t k, int64_t dim, bool descending, const std::string& what) {
  const Tensor xg = x_cpu.to(kGpu);
  const ops::ValuesIndices c = ops::topk(x_cpu, k, dim, descending), g = ops::topk(xg, k, dim, descending);
  REQUIRE_MESSAGE(g.values.device() == kGpu, what);
  CHECK_MESSAGE(bytes_of(g.values.cpu()) == bytes_of(c.values), what, " values");
  CHECK_MESSAGE(bytes_of(g.indices.cpu()) == bytes_of(c.indices), what, " indices");
}

}  // namespace

TEST_CASE("cuda sort: the CPU's values and indices bit for bit, short and long rows, every dtype") {
  uint64_t seed = 1;
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64})
    for (int64_t L : {1, 2, 7, 32, 100, 256, 257, 512, 513, 1000, 1024, 1025, 2048, 2049, 4096, 4097, 20000})
      for (bool descending : {false, true}) {
        const bool integral = t == kInt32 || t == kInt64;
        const int64_t rows = L > 4096 ? 3 : 5;
        const Tensor x = make_tensor(tricky_values(rows * L, ++seed, integral), {rows, L}, t);
        const std::string what = std::string(dtype_name(t)) + " L=" + std::to_string(L) + (descending ? " desc" : "");
        check_same_sort(x, L, -1, descending, "sort " + what);
        check_same_sort(x, std::min<int64_t>(L, 5), -1, descending, "topk 5 " + what);
        check_same_sort(x, 0, -1, descending, "topk 0 " + what);
      }
}

TEST_CASE("cuda sort: topk of long rows in two block passes, at their limits and past them") {
  // Note [CUDA topk of long rows]: S segments of at most 4096, S k candidates of at most 4096.
  uint64_t seed = 900;
  struct Case {
    int64_t L, k;  // (k past the limit: the full device sort)
  };
  for (const Case c : {Case{32000, 512}, Case{32000, 513}, Case{32000, 50}, Case{8193, 1365}, Case{8193, 1366},
                       Case{4097, 1}, Case{131072, 128}})
    for (DType t : {kFloat32, kFloat16, kInt64})
      for (bool largest : {true, false}) {
        const Tensor x = make_tensor(tricky_values(2 * c.L, ++seed, t == kInt64), {2, c.L}, t);
        check_same_sort(x, c.k, -1, largest,
                        "topk " + std::to_string(c.k) + " of " + std::to_string(c.L) + " " + dtype_name(t));
      }
}

TEST_CASE("cuda sort: along every dim of a transposed 3-D tensor; many rows; empty tensors; argsort") {
  const Tensor x = make_tensor(tricky_values(6 * 9 * 40, 3, false), {6, 9, 40}, kFloat32, Layout::Transposed);
  for (int64_t dim = 0; dim < 3; ++dim)
    for (bool descending : {false, true})
      check_same_sort(x, x.size(dim), dim, descending, "dim " + std::to_string(dim));
  const Tensor many = make_tensor(tricky_values(70000 * 3, 4, false), {70000, 3}, kFloat32);
  check_same_sort(many, 2, 1, true, "70000 rows of 3");
  CHECK(ops::sort(zeros({0, 4}, {kFloat32, kGpu}), 1).values.sizes() == Shape{0, 4});
  CHECK(ops::topk(zeros({3, 4}, {kFloat32, kGpu}), 0).indices.sizes() == Shape{3, 0});
  const Tensor y = make_tensor(tricky_values(4 * 300, 5, false), {4, 300}, kFloat16);
  CHECK(bytes_of(ops::argsort(y.to(kGpu), 1, true).cpu()) == bytes_of(ops::argsort(y, 1, true)));
  // One long row: the device-wide sort without the second, by-row one.
  const Tensor row = make_tensor(tricky_values(70000, 7, false), {70000}, kBFloat16);
  for (bool descending : {false, true}) check_same_sort(row, 70000, 0, descending, "one row of 70000");
  check_same_sort(row, 17, 0, true, "topk 17 of one row of 70000");
  // argsort writes indices only, in every kernel (the device-wide sorts above 4096 elements a row).
  const Tensor z = make_tensor(tricky_values(3 * 5000, 6, false), {3, 5000}, kFloat32);
  CHECK(bytes_of(ops::argsort(z.to(kGpu), 1).cpu()) == bytes_of(ops::argsort(z, 1)));
  CHECK(bytes_of(ops::argsort(z.to(kGpu), 0, true).cpu()) == bytes_of(ops::argsort(z, 0, true)));
}
