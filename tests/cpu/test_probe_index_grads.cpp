// Probes of the index and scan ops' gradients (2026-12-05 findings): scatter_add with a 0-d
// index or src (the forward treats 0-d as 1-d, the backward did not: one case threw, one gave
// every src element the gradient of src[0]), and cumsum into a 16-bit dtype (the gradient's
// prefix sums were rounded to 16 bits). Expected values are PyTorch 1.13's (written beside
// them) or worked by hand.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {
Tensor leaf(const std::vector<double>& v, const Shape& s) { return from_vector<double>(v, s).requires_grad_(); }
Tensor ints(const std::vector<int64_t>& v, const Shape& s) { return from_vector<int64_t>(v, s); }
}  // namespace

TEST_CASE("probe index grads: scatter_add with a 0-d src or index back-propagates as its 1-d form") {
  const Tensor w = from_vector<double>({1, 2, 3}, {3});
  SUBCASE("0-d src, one-element index") {
    // torch: x.scatter_add(0, tensor([2]), s) with s = tensor(5.): s.grad = 3, x.grad = w.
    const Tensor x = leaf({1, 2, 3}, {3}), s = leaf({5}, {});
    const Tensor y = scatter_add(x, 0, ints({2}, {1}), s);
    CHECK(y.tolist<double>() == std::vector<double>{1, 2, 8});
    sum(mul(y, w)).backward();
    CHECK(s.grad().sizes() == Shape{});
    CHECK(s.grad().item<double>() == 3.0);
    CHECK(x.grad().tolist<double>() == std::vector<double>{1, 2, 3});
  }
  SUBCASE("0-d index, 1-d src: only src[0] is used, so only it gets a gradient") {
    // The forward adds s[0] alone ({1, 2, 8}); torch 1.13 refuses this backward, {3, 0} is exact.
    const Tensor x = leaf({1, 2, 3}, {3}), s = leaf({5, 6}, {2});
    const Tensor y = scatter_add(x, 0, ints({2}, {}), s);
    CHECK(y.tolist<double>() == std::vector<double>{1, 2, 8});
    sum(mul(y, w)).backward();
    CHECK(s.grad().tolist<double>() == std::vector<double>{3, 0});
  }
  SUBCASE("0-d self, 0-d index, 1-d src") {
    const Tensor x = leaf({1}, {}), s = leaf({5, 6}, {2});
    const Tensor y = scatter_add(x, 0, ints({0}, {}), s);
    CHECK(y.item<double>() == 6.0);
    mul(y, 4.0).backward();
    CHECK(s.grad().tolist<double>() == std::vector<double>{4, 0});
    CHECK(x.grad().item<double>() == 4.0);
  }
  SUBCASE("0-d everything") {
    const Tensor x = leaf({1}, {}), s = leaf({5}, {});
    mul(scatter_add(x, 0, ints({0}, {}), s), 2.0).backward();
    CHECK(s.grad().item<double>() == 2.0);
  }
}

TEST_CASE("probe index grads: cumsum into a 16-bit dtype sums the gradient in the input's precision") {
  // torch: cumsum(x float64, 0, dtype=bfloat16).backward([0.01, 0.01, 0.01, 256] in bfloat16)
  // gives x.grad = [256.03, 256.02, 256.01, 256] (the bfloat16 values of 0.01 summed in float64).
  const Tensor x = leaf({1, 2, 3, 4}, {4});
  const Tensor g = from_vector<double>({0.01, 0.01, 0.01, 256}, {4}).to(kBFloat16);
  cumsum(x, 0, kBFloat16).backward(g);
  const double c = from_vector<double>({0.01}, {1}).to(kBFloat16).to(kFloat64).item<double>();
  const std::vector<double> want = {256 + 3 * c, 256 + 2 * c, 256 + c, 256};
  const std::vector<double> got = x.grad().tolist<double>();
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-15));

  // float32 into float16: the exact gradient {2050, 2049, 2048}, not float16's {2050, 2048, 2048}.
  const Tensor y = from_vector<float>({1, 2, 3}, {3}).requires_grad_();
  cumsum(y, 0, kFloat16).backward(from_vector<float>({1, 1, 2048}, {3}).to(kFloat16));
  CHECK(y.grad().tolist<float>() == std::vector<float>{2050, 2049, 2048});
}
