// Diagonals (diagonal, diag_embed, diag, trace: autograd/ops/diagonal.h), the tensor products
// (outer, kron, tensordot, cross: autograd/ops/tensor_products.h) and cdist, against index
// loops in float64 written here, over layouts, offsets, dims and broadcasts; diagonal's view
// semantics; gradients by gradcheck and gradgradcheck; errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/diagonal.h"
#include "autograd/ops/distance.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/tensor_products.h"
#include "tensor/factory.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// torch.diagonal of x (row-major `shape`) by index loops.
std::vector<double> ref_diagonal(const std::vector<double>& x, const Shape& shape, int64_t offset, int64_t d1,
                                 int64_t d2, Shape& out_shape) {
  const int64_t n = std::max<int64_t>(
      0, std::min(shape[size_t(d1)] - std::max<int64_t>(-offset, 0), shape[size_t(d2)] - std::max<int64_t>(offset, 0)));
  Shape rest;
  for (size_t d = 0; d < shape.size(); ++d)
    if (int64_t(d) != d1 && int64_t(d) != d2) rest.push_back(shape[d]);
  out_shape = rest;
  out_shape.push_back(n);
  std::vector<double> out;
  for (int64_t r = 0; r < numel_of(rest); ++r) {
    const std::vector<int64_t> ri = unravel(r, rest);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int64_t> idx;
      for (size_t d = 0, k = 0; d < shape.size(); ++d) {
        if (int64_t(d) == d1) idx.push_back(i + std::max<int64_t>(-offset, 0));
        else if (int64_t(d) == d2) idx.push_back(i + std::max<int64_t>(offset, 0));
        else idx.push_back(ri[k++]);
      }
      out.push_back(x[size_t(ravel(idx, shape))]);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("tensor products: diagonal is a view of any offset and dims, on every layout") {
  const Shape shape = {3, 4, 5};
  for (Layout layout : kAllLayouts) {
    for (const auto& [d1, d2] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {2, 0}, {-1, -3}, {1, 0}}) {
      for (int64_t offset : {-4, -2, -1, 0, 1, 3, 6}) {
        CAPTURE(layout_name(layout));
        CAPTURE(offset);
        const Tensor x = random_tensor(shape, kFloat32, 7, layout);
        Shape eshape;
        const int64_t w1 = d1 < 0 ? d1 + 3 : d1, w2 = d2 < 0 ? d2 + 3 : d2;
        const std::vector<double> expected = ref_diagonal(values_of(x), shape, offset, w1, w2, eshape);
        const Tensor out = diagonal(x, offset, d1, d2);
        CHECK(out.sizes() == eshape);
        CHECK(out.shares_storage(x));
        check_close(out, expected, 0, 0, "diagonal");
        // diag_embed puts it back: its diagonal there is the same values.
        const Tensor back = diag_embed(out, offset, w1 < w2 ? w1 : w2, w1 < w2 ? w2 : w1);
        check_close(diagonal(back, offset, w1 < w2 ? w1 : w2, w1 < w2 ? w2 : w1), expected, 0, 0, "round trip");
      }
    }
  }
  // A write through the view lands in x, as torch.diagonal's.
  const Tensor m = zeros({3, 3});
  diagonal(m).copy_(ones({3}));
  check_close(m, {1, 0, 0, 0, 1, 0, 0, 0, 1}, 0, 0, "written through");
}

TEST_CASE("tensor products: diag_embed, diag and trace") {
  const Tensor v = make_tensor({1, 2, 3}, {3}, kFloat64);
  check_close(diag(v), {1, 0, 0, 0, 2, 0, 0, 0, 3}, 0, 0, "diag of a vector");
  const Tensor up = diag(v, 1);
  CHECK(up.sizes() == Shape{4, 4});
  check_close(up, {0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 3, 0, 0, 0, 0}, 0, 0, "diag offset 1");
  const Tensor m = make_tensor({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32, Layout::Transposed);
  check_close(diag(m), {1, 5}, 0, 0, "diag of a matrix");
  check_close(diag(m, -1), {4}, 0, 0, "below");
  CHECK(!diag(m).shares_storage(m));  // a new tensor, as torch.diag
  CHECK(trace(m).item<float>() == 6.0f);
  CHECK(trace(make_tensor({1, 2, 3, 4}, {2, 2}, kInt32)).dtype() == kInt64);
  // diag_embed of a batch: (2, 3) -> (2, 3, 3) with dims -2, -1; and into dims 0 and 2.
  const Tensor b = random_tensor({2, 3}, kFloat64, 3);
  const Tensor e = diag_embed(b);
  CHECK(e.sizes() == Shape{2, 3, 3});
  check_close(diagonal(e, 0, 1, 2), values_of(b), 0, 0, "batched");
  CHECK(sum(e).item<double>() == doctest::Approx(sum(b).item<double>()));
  CHECK(diag_embed(b, -1, 0, 2).sizes() == Shape{4, 2, 4});
  check_error([] { diagonal(zeros({3}), 0); }, {"diagonal", "2 dims", "float32[3]"});
  check_error([] { diagonal(zeros({3, 3}), 0, 1, 1); }, {"diagonal", "same dim"});
  check_error([] { diagonal(zeros({3, 3}), 0, 0, 2); }, {"diagonal", "out of range"});
  check_error([] { diag(zeros({2, 2, 2})); }, {"diag", "1-d or 2-d", "[2, 2, 2]"});
  check_error([] { trace(zeros({3})); }, {"trace", "matrix", "float32[3]"});
}

TEST_CASE("tensor products: outer, kron, tensordot and cross against index loops") {
  const Tensor a = random_tensor({3}, kFloat64, 1), b = random_tensor({4}, kFloat64, 2);
  std::vector<double> o;
  for (double x : values_of(a))
    for (double y : values_of(b)) o.push_back(x * y);
  check_close(outer(a, b), o, 1e-15, 0, "outer");
  // kron of (2, 3) and (2, 2): out[i * 2 + k, j * 2 + l] = A[i, j] B[k, l].
  const Tensor A = random_tensor({2, 3}, kFloat64, 3, Layout::Transposed), B = random_tensor({2, 2}, kFloat64, 4);
  const std::vector<double> av = values_of(A), bv = values_of(B);
  std::vector<double> kv(24);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k)
        for (int64_t l = 0; l < 2; ++l)
          kv[size_t((i * 2 + k) * 6 + j * 2 + l)] = av[size_t(i * 3 + j)] * bv[size_t(k * 2 + l)];
  const Tensor K = kron(A, B);
  CHECK(K.sizes() == Shape{4, 6});
  check_close(K, kv, 1e-15, 0, "kron");
  CHECK(kron(random_tensor({2}, kFloat32, 5), random_tensor({3, 2}, kFloat32, 6)).sizes() == Shape{3, 4});
  // tensordot of (2, 3, 4) and (4, 3, 5) over a's dims (1, 2) and b's (1, 0).
  const Tensor X = random_tensor({2, 3, 4}, kFloat64, 7), Y = random_tensor({4, 3, 5}, kFloat64, 8, Layout::Strided);
  const std::vector<double> xv = values_of(X), yv = values_of(Y);
  std::vector<double> tv(10, 0.0);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t n = 0; n < 5; ++n)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t k = 0; k < 4; ++k)
          tv[size_t(i * 5 + n)] += xv[size_t((i * 3 + j) * 4 + k)] * yv[size_t((k * 3 + j) * 5 + n)];
  check_close(tensordot(X, Y, {1, 2}, {1, 0}), tv, 1e-13, 1e-13, "tensordot");
  CHECK(tensordot(X, random_tensor({3, 4, 6}, kFloat64, 9)).sizes() == Shape{2, 6});  // the last 2 against the first 2
  CHECK(tensordot(X, Y, 0).sizes() == Shape{2, 3, 4, 4, 3, 5});
  // cross of broadcast 3-vectors along dim 0 and the last dim.
  const Tensor u = random_tensor({3, 4}, kFloat64, 10), w = random_tensor({3, 1}, kFloat64, 11);
  const std::vector<double> uv = values_of(u), wv = values_of(w);
  std::vector<double> cv(12);
  for (int64_t c = 0; c < 4; ++c) {
    const auto U = [&](int64_t i) { return uv[size_t(i * 4 + c)]; };
    const auto W = [&](int64_t i) { return wv[size_t(i)]; };
    cv[size_t(0 * 4 + c)] = U(1) * W(2) - U(2) * W(1);
    cv[size_t(1 * 4 + c)] = U(2) * W(0) - U(0) * W(2);
    cv[size_t(2 * 4 + c)] = U(0) * W(1) - U(1) * W(0);
  }
  check_close(cross(u, w, 0), cv, 1e-15, 1e-15, "cross");
  check_close(cross(make_tensor({1, 0, 0}, {3}, kFloat32), make_tensor({0, 1, 0}, {3}, kFloat32)), {0, 0, 1}, 0, 0,
              "x cross y");
  check_error([&] { outer(X, b); }, {"outer", "1-d", "[2, 3, 4]"});
  check_error([&] { tensordot(X, Y, {1}, {2}); }, {"tensordot", "size 3", "size 5"});
  check_error([&] { tensordot(X, Y, {1, 1}, {0, 1}); }, {"tensordot", "twice"});
  check_error([&] { cross(u, w, 1); }, {"cross", "size 3"});
}

TEST_CASE("tensor products: cdist in both forms against a float64 loop, and its gradient at distance 0") {
  for (const auto& [P, R] : std::vector<std::pair<int64_t, int64_t>>{{3, 4}, {30, 5}, {2, 40}}) {
    for (double p : {0.0, 1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
      CAPTURE(P);
      CAPTURE(R);
      CAPTURE(p);
      const Tensor x1 = random_tensor({2, P, 5}, kFloat64, 20), x2 = random_tensor({1, R, 5}, kFloat64, 21);
      const std::vector<double> a = values_of(x1), b = values_of(x2);
      std::vector<double> expected;
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t i = 0; i < P; ++i)
          for (int64_t j = 0; j < R; ++j) {
            double acc = 0, top = 0;
            for (int64_t k = 0; k < 5; ++k) {
              const double d = std::fabs(a[size_t((n * P + i) * 5 + k)] - b[size_t(j * 5 + k)]);
              acc += p == 0 ? double(d != 0) : std::pow(d, p);
              top = std::max(top, d);
            }
            expected.push_back(std::isinf(p) ? top : p == 0 ? acc : std::pow(acc, 1 / p));
          }
      const Tensor out = cdist(x1, x2, p);
      CHECK(out.sizes() == Shape{2, P, R});
      check_close(out, expected, 1e-10, 1e-10, "cdist");
    }
  }
  // The matmul form (R > 25) at a row equal to one of x2's: distance 0, gradient 0, not NaN.
  const Tensor x2 = random_tensor({30, 4}, kFloat64, 30);
  const Tensor x1 = x2.narrow(0, 3, 2).clone().requires_grad_();
  sum(cdist(x1, x2)).backward();
  for (double g : values_of(x1.grad())) CHECK(std::isfinite(g));
  check_gradcheck([](const TensorList& in) { return cdist(in[0], in[1], 2.0); },
                  {leaf({2, 30, 3}, 31), leaf({2, 4, 3}, 32)});
  check_gradcheck([](const TensorList& in) { return cdist(in[0], in[1], 1.5); }, {leaf({3, 3}, 33), leaf({4, 3}, 34)});
  check_error([] { cdist(zeros({3}), zeros({3})); }, {"cdist", "(..., P, M)"});
  check_error([] { cdist(zeros({2, 3}), zeros({2, 4})); }, {"cdist", "same M"});
  check_error([] { cdist(zeros({2, 3}), zeros({2, 3}, kFloat64)); }, {"cdist", "dtype"});
}

TEST_CASE("tensor products: gradients, first and second order") {
  const Tensor x = leaf({3, 4, 5}, 40);
  check_gradcheck([](const TensorList& in) { return diagonal(in[0], 1, 2, 0); }, {x});
  check_gradcheck([](const TensorList& in) { return diag_embed(in[0].select(0, 1), -1, 0, 2); }, {x});
  check_gradcheck([](const TensorList& in) { return trace(in[0].select(2, 0)); }, {x});
  check_gradcheck([](const TensorList& in) { return diag(in[0].select(0, 0).select(0, 0), 2); }, {x});
  check_gradcheck([](const TensorList& in) { return outer(in[0], in[1]); }, {leaf({3}, 41), leaf({2}, 42)});
  check_gradcheck([](const TensorList& in) { return kron(in[0], in[1]); }, {leaf({2, 3}, 43), leaf({3}, 44)});
  check_gradcheck([](const TensorList& in) { return tensordot(in[0], in[1], {0}, {1}); },
                  {leaf({3, 2}, 45), leaf({4, 3}, 46)});
  check_gradcheck([](const TensorList& in) { return cross(in[0], in[1]); }, {leaf({2, 3}, 47), leaf({3}, 48)});
  for (const auto& f : std::vector<std::function<Tensor(const TensorList&)>>{
           [](const TensorList& in) { return diagonal(in[0], -1, 0, 2); },
           [](const TensorList& in) { return diag_embed(in[0], 1); },
           [](const TensorList& in) {
             return mul(cross(in[0].narrow(1, 0, 3), in[0].narrow(1, 1, 3), 1), in[0].narrow(1, 1, 3));
           },
       }) {
    const autograd::GradcheckResult gg = autograd::gradgradcheck(f, {leaf({3, 4, 3}, 49)});
    CHECK_MESSAGE(gg.ok, gg.report);
  }
}
