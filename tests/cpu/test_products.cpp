// cumprod (the raw op and the differentiable one) against float64 loops over dtypes, layouts
// and dims; the gradients of prod and cumprod (Note [Product gradients]) by gradcheck and
// gradgradcheck at inputs with no zero, one zero and several zeros per line, a third
// derivative through cumprod's zeros, 16-bit gradients computed in float32, autocast, errors.
// prod's forward is in test_reduce.cpp with the other reductions.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/cumsum.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tensor/ops/cumsum.h"
#include "tensor/ops/reduce.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// Running products of x (row-major, `shape`) along dim, in float64.
std::vector<double> ref_cumprod(const std::vector<double>& x, const Shape& shape, int64_t dim) {
  if (shape.empty()) return x;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    if (d < dim) outer *= shape[size_t(d)];
    if (d > dim) inner *= shape[size_t(d)];
  }
  const int64_t n = shape[size_t(dim)];
  std::vector<double> out(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double p = 1.0;
      for (int64_t k = 0; k < n; ++k) {
        const size_t at = size_t((o * n + k) * inner + i);
        p *= x[at];
        out[at] = p;
      }
    }
  }
  return out;
}

/// A float64 leaf of `shape` in [0.5, 1.5) with zeros at the row-major positions `zero_at`.
Tensor leaf_with_zeros(const Shape& shape, uint64_t seed, const std::vector<int64_t>& zero_at) {
  std::vector<double> v = random_values(numel_of(shape), seed, 0.5, 1.5);
  for (int64_t k : zero_at) v[size_t(k)] = 0.0;
  Tensor t = make_tensor(v, shape, kFloat64);
  t.requires_grad_();
  return t;
}

void check_gradgradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs) {
  const autograd::GradcheckResult r = autograd::gradgradcheck(f, inputs);
  CHECK_MESSAGE(r.ok, r.report);
}

}  // namespace

TEST_CASE("products: cumprod along every dim, dtype and layout matches a float64 loop") {
  const Shape shape = {3, 4, 5};
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim = -3; dim < 3; ++dim) {
        CAPTURE(name_of(dt, layout));
        CAPTURE(dim);
        const Tensor x = random_tensor(shape, dt, 11, layout);
        const Tensor out = ops::cumprod(x, dim);
        CHECK(out.dtype() == dt);
        CHECK(out.sizes() == shape);
        // 16-bit: multiplied in float32, each output rounded once.
        check_close(out, ref_cumprod(values_of(x), shape, dim < 0 ? dim + 3 : dim), default_rtol(dt),
                    4 * default_rtol(dt));
        check_close(cumprod(x, dim), values_of(out), 0.0, 0.0, "differentiable cumprod");
      }
    }
  }
}

TEST_CASE("products: cumprod of integers and bool gives int64, wrapping as PyTorch's") {
  const std::vector<double> v = {3, -1, 7, 60000, 70000, -5};
  for (DType dt : {kInt32, kInt64}) {
    const Tensor x = make_tensor(v, {2, 3}, dt, Layout::Transposed);
    for (int64_t dim : {0, 1}) {
      const Tensor out = cumprod(x, dim);
      CHECK(out.dtype() == kInt64);
      check_close(out, ref_cumprod(v, {2, 3}, dim), 0.0, 0.0, name_of(dt));  // 60000 * 70000: no int32 wrap
    }
  }
  uint64_t wrapped = 1;
  for (int k = 0; k < 41; ++k) wrapped *= 3u;
  CHECK(ops::cumprod(full({41}, 3, kInt64), 0).tolist<int64_t>().back() == int64_t(wrapped));
  const Tensor b = ops::cumprod(make_tensor({1, 1, 0, 1}, {4}, kBool), 0);
  CHECK(b.dtype() == kInt64);
  CHECK(b.tolist<int64_t>() == std::vector<int64_t>{1, 1, 0, 0});
  // dtype converts first, as torch.cumprod(dtype=).
  const Tensor f = ops::cumprod(make_tensor({60000, 70000}, {2}, kInt32), 0, kFloat32);
  CHECK(f.dtype() == kFloat32);
  CHECK(f.tolist<float>() == std::vector<float>{60000.0f, 4.2e9f});
}

TEST_CASE("products: cumprod of 16-bit values multiplies in float32") {
  // 300 * 300 overflows float16 (65504), and * 0.001 brings it back: float32 running products
  // give 90 at the third entry where float16 ones give inf.
  const Tensor x = make_tensor({300, 300, 0.001}, {3}, kFloat16);
  const std::vector<double> v = values_of(ops::cumprod(x, 0));
  CHECK(std::isinf(v[1]));
  CHECK(v[2] == doctest::Approx(90.0).epsilon(1e-3));
}

TEST_CASE("products: cumprod of 0-d and size-0 tensors, and its errors") {
  const Tensor s = scalar_tensor(2.5, kFloat32);
  CHECK(ops::cumprod(s, 0).dim() == 0);
  CHECK(cumprod(s, -1).item<float>() == 2.5f);
  for (int64_t dim : {0, 1, 2}) CHECK(ops::cumprod(zeros({2, 0, 3}), dim).sizes() == Shape{2, 0, 3});
  check_error([&] { ops::cumprod(s, 1); }, {"cumprod", "dim 1", "float32[]"});
  check_error([&] { cumprod(zeros({2, 3}), 2); }, {"cumprod", "dim 2", "float32[2, 3]"});
  check_error([&] { cumprod(Tensor(), 0); }, {"cumprod", "undefined"});
  const Tensor h = make_tensor({1, 2}, {2}, kFloat32).requires_grad_();
  check_error([&] { cumprod(h, 0, kInt64); }, {"cumprod", "requires grad", "int64"});
}

TEST_CASE("products: prod's gradient is each entry's product of the others, exact at zeros") {
  // No zero, one zero (its gradient is the product of the rest) and two zeros (all zero).
  const Tensor x = make_tensor({2, 3, 4, 0, 5, 6, 0, 7, 0}, {3, 3}, kFloat64).requires_grad_();
  sum(prod(x, {1})).backward();
  check_close(x.grad(), {12, 8, 6, 30, 0, 0, 0, 0, 0}, 0.0, 0.0, "prod over rows");
  const Tensor y = make_tensor({2, 3, 0, 5}, {4}, kFloat64).requires_grad_();
  prod(y).backward();
  check_close(y.grad(), {0, 0, 30, 0}, 0.0, 0.0, "prod of all");
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}, {0, 2}, {1, 2}}) {
    CAPTURE(shape_str(dims));
    for (bool keepdim : {false, true}) {
      check_gradcheck([&](const TensorList& in) { return prod(in[0].transpose(0, 2), dims, keepdim); },
                      {leaf({3, 2, 4}, 40, 0.5, 1.5)});
    }
    // A zero in some slices, two in others: gradients and their derivatives stay exact.
    const Tensor z = leaf_with_zeros({3, 2, 4}, 41, {1, 6, 7, 20});
    check_gradcheck([&](const TensorList& in) { return prod(in[0], dims); }, {z});
    check_gradgradcheck([&](const TensorList& in) { return prod(in[0], dims); }, {z});
  }
  const Tensor s = leaf({}, 42);
  prod(s).backward();
  check_close(s.grad(), {1.0}, 0.0, 0.0, "0-d");
  const Tensor e = make_tensor({}, {0, 3}, kFloat64).requires_grad_();
  sum(prod(e, {0})).backward();
  CHECK(e.grad().sizes() == Shape{0, 3});
}

TEST_CASE("products: cumprod's gradient at no zero, one zero and several zeros per line, to the third order") {
  for (int64_t dim : {0, 1, -1}) {
    CAPTURE(dim);
    check_gradcheck([dim](const TensorList& in) { return cumprod(in[0].transpose(0, 1), dim); },
                    {leaf({5, 4}, 50, 0.5, 1.5)});
    // Row-major zeros of a (4, 6): one per row in row 0, two in row 1, three in row 2.
    const Tensor z = leaf_with_zeros({4, 6}, 51, {2, 7, 10, 12, 13, 17});
    check_gradcheck([dim](const TensorList& in) { return cumprod(in[0], dim); }, {z});
    check_gradgradcheck([dim](const TensorList& in) { return cumprod(in[0], dim); }, {z});
  }
  // The third order: gradgradcheck of x -> d(u . cumprod(x)) / dx, which has zeros in a row.
  const Tensor u = random_tensor({6}, kFloat64, 52);
  check_gradgradcheck(
      [&u](const TensorList& in) {
        const Tensor y = cumprod(in[0], 0);
        return autograd::grad({sum(mul(y, u))}, {in[0]}, {}, {.create_graph = true})[0];
      },
      {leaf_with_zeros({6}, 53, {1, 4})});
  // A zero first, and at the end; the closed forms: d/dx_k sum(cumprod(x)).
  const Tensor x = make_tensor({0, 2, 3}, {3}, kFloat64).requires_grad_();
  sum(cumprod(x, 0)).backward();
  check_close(x.grad(), {1 + 2 + 6, 0, 0}, 0.0, 0.0, "zero first");
  const Tensor w = make_tensor({2, 3, 0}, {3}, kFloat64).requires_grad_();
  sum(cumprod(w, 0)).backward();
  check_close(w.grad(), {1 + 3, 2, 6}, 0.0, 0.0, "zero last");
  Tensor c = cumprod(w, 0);
  CHECK(c.grad_fn_name() == "CumprodBackward");
}

TEST_CASE("products: 16-bit gradients are computed in float32 and returned in the input's dtype") {
  // d prod / d x_3 = 300 * 300 * 0.001 = 90: float16 exclusive products would overflow at 90000.
  for (DType dt : {kFloat16, kBFloat16}) {
    const Tensor x = make_tensor({300, 300, 0.001, 1}, {4}, dt).requires_grad_();
    prod(x).backward();
    CHECK(x.grad().dtype() == dt);
    CHECK(values_of(x.grad())[3] == doctest::Approx(values_of(prod(x.detach()).to(kFloat64))[0]).epsilon(1e-2));
    CHECK(std::isfinite(values_of(x.grad())[3]));
    // d cumprod_2 / d x_0 = 300 * 0.001: float16 running products would be inf from 90000.
    const Tensor y = make_tensor({300, 300, 0.001}, {3}, dt).requires_grad_();
    cumprod(y, 0).backward(make_tensor({0, 0, 1}, {3}, dt));
    CHECK(values_of(y.grad())[0] == doctest::Approx(0.3).epsilon(1e-2));
  }
}

TEST_CASE("products: autocast runs float16 prod and cumprod in float32, as torch.autocast") {
  const Tensor x = make_tensor({1, 2, 3}, {3}, kFloat16);
  AutocastGuard guard(kCPU, kFloat16);
  CHECK(prod(x).dtype() == kFloat32);
  CHECK(cumprod(x, 0).dtype() == kFloat32);
}
