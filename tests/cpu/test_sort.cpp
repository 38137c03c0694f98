// sort, argsort and topk (Note [Sort order]) against an insertion sort written from the rule
// (NaN above everything, -0 == +0, ties in index order), in every dtype and layout and along
// every dim, rows long enough to run in parallel chunks (1 and 2 threads give the same bytes);
// 0-d and size-0 inputs; the gradient reaching the positions the values came from; errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "autograd/ops/operators.h"
#include "autograd/ops/sort.h"
#include "core/threads.h"
#include "tensor/ops/sort.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// a strictly before b (ascending): NaN above every number.
bool below(double a, double b) { return !std::isnan(a) && (std::isnan(b) || a < b); }

/// The indices of one row in the order, by insertion: an element moves before the ones it is
/// strictly before (in the direction asked), so equal ones keep their input order.
std::vector<int64_t> reference_order(const std::vector<double>& row, bool descending) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < int64_t(row.size()); ++i) {
    size_t at = order.size();
    while (at > 0) {
      const double prev = row[size_t(order[at - 1])], v = row[size_t(i)];
      if (!(descending ? below(prev, v) : below(v, prev))) break;
      --at;
    }
    order.insert(order.begin() + ptrdiff_t(at), i);
  }
  return order;
}

/// values and indices of x (N, L) sorted along dim 1, first k of each row, by the reference.
void check_rows(const Tensor& x, const ValuesIndices& r, int64_t k, bool descending, const std::string& what) {
  const std::vector<double> xv = values_of(x), vv = values_of(r.values), iv = values_of(r.indices);
  const int64_t N = x.size(0), L = x.size(1);
  REQUIRE(r.values.sizes() == Shape{N, k});
  REQUIRE(r.indices.dtype() == kInt64);
  int64_t bad = 0;
  for (int64_t n = 0; n < N; ++n) {
    const std::vector<double> row(xv.begin() + n * L, xv.begin() + (n + 1) * L);
    const std::vector<int64_t> order = reference_order(row, descending);
    for (int64_t j = 0; j < k; ++j) {
      const double want = row[size_t(order[size_t(j)])], got = vv[size_t(n * k + j)];
      if (iv[size_t(n * k + j)] != double(order[size_t(j)])) ++bad;
      if (!(got == want || (std::isnan(got) && std::isnan(want))) || std::signbit(got) != std::signbit(want)) ++bad;
    }
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " entries differ from the reference");
}

}  // namespace

TEST_CASE("sort and topk: the reference order in every dtype, with ties, NaN, -0 and infinities") {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const std::vector<double> special = {1, 3, 3, 0, 3, nan, -0.0, 0.0, 2, -inf, inf, nan, -2, 0.5, 3, -0.0};
  uint64_t seed = 1;
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64})
    for (Layout layout : kAllLayouts)
      for (bool descending : {false, true}) {
        CAPTURE(name_of(t, layout));
        CAPTURE(descending);
        const bool integral = t == kInt32 || t == kInt64;
        // Rows of the special values (integers: their finite ones) and rows of rounded randoms (ties).
        std::vector<double> v;
        for (int r = 0; r < 3; ++r)
          for (double s : special) v.push_back(integral && !std::isfinite(s) ? double(r) : s);
        for (double r : random_values(5 * 16, ++seed, -4, 4)) v.push_back(std::round(r));
        const Tensor x = make_tensor(v, {8, 16}, t, layout);
        check_rows(x, ops::sort(x, 1, descending), 16, descending, "sort");
        check_rows(x, ops::topk(x, 5, -1, descending), 5, descending, "topk");
        CHECK(values_of(ops::argsort(x, 1, descending)) == values_of(ops::sort(x, 1, descending).indices));
        CHECK(values_of(ops::argsort(x, 0, descending)) == values_of(ops::sort(x, 0, descending).indices));
      }
  // argsort makes no values (the kernel writes indices only): 0-d and empty inputs too.
  const Tensor s = ops::argsort(scalar_tensor(2.5, kFloat32));
  CHECK(s.dim() == 0);
  CHECK(s.dtype() == kInt64);
  CHECK(s.item<int64_t>() == 0);
  CHECK(ops::argsort(zeros({0, 3}, kFloat32), 0).sizes() == Shape{0, 3});
}

TEST_CASE("sort and topk: along every dim of a 3-D tensor, as the last dim of its transpose") {
  const Tensor x = random_tensor({3, 4, 5}, kFloat32, 7, Layout::Transposed);
  for (int64_t dim = 0; dim < 3; ++dim)
    for (bool descending : {false, true}) {
      CAPTURE(dim);
      const ValuesIndices r = ops::sort(x, dim, descending);
      const ValuesIndices moved = ops::sort(x.transpose(dim, 2).contiguous(), 2, descending);
      CHECK(r.values.sizes() == x.sizes());
      check_close(r.values, values_of(moved.values.transpose(dim, 2)), 0, 0, "values");
      CHECK(values_of(r.indices) == values_of(moved.indices.transpose(dim, 2)));
      const ValuesIndices t = ops::topk(x, 2, dim - 3, descending);
      CHECK(values_of(t.values) == values_of(r.values.narrow(dim, 0, 2)));
      CHECK(values_of(t.indices) == values_of(r.indices.narrow(dim, 0, 2)));
    }
}

TEST_CASE("sort: long rows run in parallel chunks; one and two threads give the same bytes") {
  std::vector<double> v = random_values(64 * 1000, 11, -50, 50);
  for (double& e : v) e = std::round(e);  // many ties
  const Tensor x = make_tensor(v, {64, 1000}, kFloat32);
  auto run = [&](int threads) {
    const int before = get_num_threads();
    set_num_threads(threads);
    const ValuesIndices r = ops::sort(x, -1, true);
    const ValuesIndices t = ops::topk(x, 10, -1, false);
    set_num_threads(before);
    return std::vector<std::vector<double>>{values_of(r.values), values_of(r.indices), values_of(t.indices)};
  };
  const auto one = run(1), two = run(2);
  CHECK(one == two);
  check_rows(x, ops::topk(x, 10, -1, false), 10, false, "topk of long rows");
}

TEST_CASE("sort and topk: 0-d and size-0 inputs, k = 0 and k = the size") {
  const Tensor s = make_tensor({2.5}, {}, kFloat32);
  const ValuesIndices r = ops::sort(s);
  CHECK(r.values.dim() == 0);
  CHECK(r.values.item<float>() == 2.5f);
  CHECK(r.indices.item<int64_t>() == 0);
  CHECK(ops::topk(s, 1).values.item<float>() == 2.5f);
  CHECK(ops::sort(zeros({0, 3}), 0).values.sizes() == Shape{0, 3});
  CHECK(ops::sort(zeros({2, 0}), 1).indices.sizes() == Shape{2, 0});
  const Tensor x = random_tensor({2, 5}, kFloat32, 3);
  CHECK(ops::topk(x, 0).values.sizes() == Shape{2, 0});
  check_close(ops::topk(x, 5).values, values_of(ops::sort(x, -1, true).values), 0, 0, "k = size");
}

TEST_CASE("sort and topk: the gradient reaches the positions the values came from; gradcheck") {
  // Ties: the gradient of each sorted slot goes to the index sort reports, nowhere else.
  Tensor x = make_tensor({2, 1, 2, 3}, {4}, kFloat64);
  x.requires_grad_();
  const ValuesIndices r = sort(x, 0, true);  // 3, 2 (index 0), 2 (index 2), 1
  CHECK(values_of(r.indices) == std::vector<double>{3, 0, 2, 1});
  r.values.backward(make_tensor({10, 20, 30, 40}, {4}, kFloat64));
  CHECK(values_of(x.grad()) == std::vector<double>{20, 40, 30, 10});
  CHECK(argsort(x).requires_grad() == false);
  check_gradcheck([](const TensorList& v) { return sort(v[0], 1).values; }, {leaf({3, 5}, 4)});
  check_gradcheck([](const TensorList& v) { return topk(v[0], 2, 0, false).values; }, {leaf({4, 3}, 5)});
  const autograd::GradcheckResult gg = autograd::gradgradcheck(
      [](const TensorList& v) { return topk(v[0], 3).values * v[0].narrow(1, 0, 3); }, {leaf({2, 6}, 6)});
  CHECK_MESSAGE(gg.ok, gg.report);
}

TEST_CASE("sort and topk: errors name the op, the tensor and the setting") {
  const Tensor x = zeros({2, 5});
  check_error([&] { ops::topk(x, 6); }, {"topk", "k=6", "between 0 and the size 5", "[2, 5]"});
  check_error([&] { ops::topk(x, -1, 0); }, {"topk", "k=-1", "size 2"});
  check_error([&] { ops::sort(x, 2); }, {"sort", "dim", "2"});
  check_error([&] { ops::sort(zeros({3}, kBool)); }, {"sort", "floating-point or integer", "bool"});
  check_error([&] { sort(make_tensor({1.0}, {}, kFloat32), 1); }, {"sort", "0-d"});
}
