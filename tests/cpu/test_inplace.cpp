// The rules of recorded in-place ops (Note [In-place ops and autograd] in
// autograd/ops/inplace.h): leaves that require grad, rebased histories through gradcheck
// in float64, self as the other operand, views and saved tensors.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/all.h"
#include "tensor/ops/binary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

std::vector<double> scaled(std::vector<double> v, double s) {
  for (double& x : v) x *= s;
  return v;
}

}  // namespace

TEST_CASE("autograd ops: in place on a leaf that requires grad throws unless grad mode is off") {
  Tensor x = leaf({3}, 80);
  const std::vector<double> before = values_of(x);
  check_error([&] { add_(x, 1.0); }, {"add_", "a leaf tensor that requires grad is used in an in-place operation"});
  check_error([&] { x *= 2.0; }, {"mul_", "leaf"});
  check_error([&] { mul_(x, x.detach()); }, {"mul_", "leaf"});
  CHECK(values_of(x) == before);  // nothing was written
  {
    NoGradGuard no_grad;  // an optimizer step
    const uint64_t v = x.version();
    x -= 1.0;
    sub_(x, ones({3}, kFloat64));
    CHECK(x.version() > v);
    CHECK(x.is_leaf());
  }
  const std::vector<double> after = values_of(x);
  for (size_t i = 0; i < 3; ++i) CHECK(after[i] == doctest::Approx(before[i] - 2.0));
}

TEST_CASE("autograd ops: in-place ops on non-leaves rebase the history and pass gradcheck") {
  // y starts as a fresh non-leaf and is then rewritten in place by every recorded op.
  const Tensor mask = ops::gt(random_tensor({3, 4}, kFloat64, 90), 0.3);
  auto f = [&](const TensorList& in) {
    Tensor y = mul(in[0], 2.0);
    add_(y, in[1]);       // + (broadcast (4))
    sub_(y, in[2], 0.5);  // - 0.5 * (3, 4)
    mul_(y, in[2]);       // * needs y's old value for in[2]'s gradient
    div_(y, in[3]);       // / (3, 1)
    y += 1.0;
    y -= in[1];
    y *= -1.5;
    y /= 2.0;
    masked_fill_(y, mask, 0.25);
    return y;
  };
  check_gradcheck(f, {leaf({3, 4}, 91), leaf({4}, 92), leaf({3, 4}, 93), leaf({3, 1}, 94, 0.5, 2.0)});
  // The same tensor handle carries the new history; its version moved on.
  Tensor x = leaf({3}, 95);
  Tensor y = mul(x, 3.0);
  const uint64_t v = y.version();
  y += x;
  CHECK(y.grad_fn_name() == "AddBackward");
  CHECK(y.version() > v);
  sum(y).backward();
  CHECK(values_of(x.grad()) == std::vector<double>(3, 4.0));
}

TEST_CASE("autograd ops: in place with self as the other operand, and into a tensor without grad") {
  Tensor x = leaf({3}, 100);
  Tensor y = mul(x, 1.0);
  mul_(y, y);  // y = x^2 via its own old value
  sum(y).backward();
  const std::vector<double> xv = values_of(x);
  check_close(x.grad(), {2 * xv[0], 2 * xv[1], 2 * xv[2]}, 1e-12, 1e-12, "x.mul_(x)");
  check_gradcheck(
      [](const TensorList& in) {
        Tensor t = add(in[0], 1.0);
        div_(t, t);  // 1, gradient 0
        Tensor u = exp(in[0]) + 0.0;
        add_(u, u, 2.0);
        return add(t, u);
      },
      {leaf({4}, 101)});
  // A buffer that does not require grad becomes part of the graph.
  Tensor acc = zeros({3}, kFloat64);
  Tensor w = leaf({3}, 102);
  acc += w * 2.0;
  acc += w;
  CHECK(acc.requires_grad());
  CHECK_FALSE(acc.is_leaf());
  sum(acc).backward();
  CHECK(values_of(w.grad()) == std::vector<double>(3, 3.0));
  // retain_grad follows the new value.
  Tensor z = mul(w, 2.0);
  z.retain_grad();
  z += 1.0;
  sum(mul(z, z)).backward();
  check_close(z.grad(), scaled(values_of(z), 2.0), 1e-12, 0, "retained grad of the new value");
}

TEST_CASE("autograd ops: in place through a view or on a saved tensor is refused or caught") {
  Tensor x = leaf({4, 3}, 110);
  Tensor y = mul(x, 2.0);
  check_error([&] { add_(y.slice(0, 0, 2), 1.0); }, {"add_", "view", "SliceBackward", "clone()"});
  check_error([&] { y.t() *= 2.0; }, {"mul_", "view", "PermuteBackward"});
  check_error([&] { mul_(y.view({12}), y.view({12})); }, {"mul_", "ViewBackward"});
  check_error([&] { split(y, 2)[0] += 1.0; }, {"add_", "SplitBackward"});
  // A slice of a plain buffer that would receive a gradient-carrying value.
  Tensor buf = zeros({4, 3}, kFloat64);
  check_error([&] { add_(buf.narrow(0, 1, 2), x.narrow(0, 0, 2)); }, {"add_", "part of a larger tensor"});
  // Without grad anywhere these are plain in-place ops.
  add_(buf.narrow(0, 1, 2), 1.0);
  CHECK(values_of(buf)[3] == 1.0);
  // sigmoid keeps its output: writing it in place is caught in backward, naming the node.
  Tensor s = sigmoid(x);
  s *= 2.0;
  check_error([&] { sum(s).backward(); }, {"SigmoidBackward", "modified by an in-place operation"});
}
