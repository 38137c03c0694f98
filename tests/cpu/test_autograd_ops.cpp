// Differentiable elementwise ops (autograd/ops/elementwise.h), the Tensor operators and
// in-place ops: gradcheck in float64 (broadcast and non-contiguous inputs), gradients
// of mixed dtypes, ties, and the in-place rules. Reductions, softmax and the shape/index
// ops are in test_autograd_ops_reduce_shape.cpp.
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
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::gradcheck;
using autograd::GradcheckOptions;

namespace {

/// A contiguous float64 leaf that requires grad, values in [lo, hi).
Tensor leaf(const Shape& s, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  Tensor t = random_tensor(s, kFloat64, seed, Layout::Contiguous, lo, hi);
  t.requires_grad_();
  return t;
}

void expect_gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                      const GradcheckOptions& options = {}) {
  const autograd::GradcheckResult r = gradcheck(f, inputs, options);
  CHECK_MESSAGE(r.ok, r.report);
}

std::vector<double> scaled(std::vector<double> v, double s) {
  for (double& x : v) x *= s;
  return v;
}

struct UnaryGradCase {
  std::string name;
  std::function<Tensor(const Tensor&)> f;
  double lo = -2.0, hi = 2.0;
};

std::vector<UnaryGradCase> unary_grad_cases() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"exp", [](const Tensor& x) { return frugal::exp(x); }},
      {"log", [](const Tensor& x) { return frugal::log(x); }, 0.2, 3.0},
      {"sqrt", [](const Tensor& x) { return frugal::sqrt(x); }, 0.2, 3.0},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.2, 3.0},
      {"tanh", [](const Tensor& x) { return frugal::tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu_tanh(x); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"abs", [](const Tensor& x) { return frugal::abs(x); }},
      {"square", [](const Tensor& x) { return square(x); }},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, 0.3, 3.0},
      {"sin", [](const Tensor& x) { return frugal::sin(x); }},
      {"cos", [](const Tensor& x) { return frugal::cos(x); }},
      {"pow(3)", [](const Tensor& x) { return frugal::pow(x, 3.0); }},
      {"pow(2)", [](const Tensor& x) { return frugal::pow(x, 2.0); }},
      {"pow(-1.5)", [](const Tensor& x) { return frugal::pow(x, -1.5); }, 0.3, 3.0},
      {"affine", [](const Tensor& x) { return affine(x, -1.5, 0.25); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }},
  };
}

}  // namespace

TEST_CASE("autograd ops: every unary op passes gradcheck, contiguous and through a transposed view") {
  for (const UnaryGradCase& c : unary_grad_cases()) {
    CAPTURE(c.name);
    expect_gradcheck([&](const TensorList& in) { return c.f(in[0]); }, {leaf({3, 4}, 1, c.lo, c.hi)});
    expect_gradcheck([&](const TensorList& in) { return c.f(in[0].t()); }, {leaf({4, 3}, 2, c.lo, c.hi)});
    expect_gradcheck([&](const TensorList& in) { return c.f(in[0].slice(1, 0, 6, 2)); }, {leaf({2, 6}, 3, c.lo, c.hi)});
  }
}

TEST_CASE("autograd ops: unary nodes are named, keep x or y, and work on 0-d and empty tensors") {
  Tensor x = leaf({3}, 4);
  CHECK(gelu(x).grad_fn_name() == "GeluBackward");
  CHECK(gelu_tanh(x).grad_fn_name() == "GeluTanhBackward");
  CHECK(frugal::pow(x, 2.0).grad_fn_name() == "PowBackward");
  CHECK(relu(x).grad_fn_name() == "ReluBackward");
  // exp keeps its output: changing it in place is caught in backward.
  Tensor y = frugal::exp(x);
  ops::mul_(y, 2.0);
  check_error([&] { sum(y).backward(); }, {"ExpBackward", "modified by an in-place"});
  // ... while gelu keeps its input, so its output may change.
  Tensor z = gelu(x);
  ops::mul_(z, 2.0);
  sum(z).backward();
  CHECK(x.grad().defined());
  Tensor s = leaf({}, 5);
  expect_gradcheck([](const TensorList& in) { return silu(in[0]); }, {s});
  Tensor e = zeros({0, 2}, kFloat64);
  e.requires_grad_();
  Tensor ye = sigmoid(e);
  ye.backward(zeros({0, 2}, kFloat64));
  CHECK(e.grad().sizes() == Shape{0, 2});
  // Without grad mode or inputs that require grad nothing is recorded.
  CHECK_FALSE(relu(x.detach()).requires_grad());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(relu(x).requires_grad());
  }
  // Integer tensors pass through the ops that take them.
  CHECK(values_of(frugal::abs(from_vector(std::vector<int64_t>{-3, 2}, {2}))) == std::vector<double>{3, 2});
}

TEST_CASE("autograd ops: binary ops pass gradcheck with broadcasting and non-contiguous inputs") {
  struct BinaryCase {
    std::string name;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
    double lo_b = -2.0;  // the second operand's range (div and pow need it away from 0 / positive)
  };
  const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, -2.5); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"sub alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, 0.5); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, 0.5},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
      {"pow", [](const Tensor& a, const Tensor& b) { return frugal::pow(frugal::abs(a) + 0.5, b); }},
  };
  struct Shapes {
    Shape a, b;
  };
  for (const BinaryCase& c : cases) {
    for (const Shapes& s : {Shapes{{3, 4}, {3, 4}}, Shapes{{3, 1}, {1, 4}}, Shapes{{2, 3, 4}, {4}},
                            Shapes{{2, 1, 4}, {3, 1}}, Shapes{{}, {2, 3}}, Shapes{{2, 3}, {}}}) {
      CAPTURE(c.name);
      CAPTURE(shape_str(s.a));
      CAPTURE(shape_str(s.b));
      Tensor a = leaf(s.a, 10), b = leaf(s.b, 20, c.lo_b, 2.0);
      expect_gradcheck([&](const TensorList& in) { return c.f(in[0], in[1]); }, {a, b});
    }
    // Non-contiguous: both operands transposed views.
    CAPTURE(c.name);
    Tensor a = leaf({4, 3}, 30), b = leaf({4, 3}, 31, c.lo_b, 2.0);
    expect_gradcheck([&](const TensorList& in) { return c.f(in[0].t(), in[1].t()); }, {a, b});
    // Only one operand requires grad.
    Tensor frozen = random_tensor({3, 4}, kFloat64, 32, Layout::Contiguous, c.lo_b, 2.0);
    expect_gradcheck([&](const TensorList& in) { return c.f(in[0], frozen); }, {leaf({3, 4}, 33)});
    expect_gradcheck([&](const TensorList& in) { return c.f(frozen, in[0]); }, {leaf({3, 4}, 34, c.lo_b, 2.0)});
  }
}

TEST_CASE("autograd ops: scalar forms, rsub, rdiv, where and masked_fill pass gradcheck") {
  Tensor x = leaf({3, 4}, 40), p = leaf({3, 4}, 41, 0.5, 2.0);
  expect_gradcheck([](const TensorList& in) { return add(in[0], 1.5); }, {x});
  expect_gradcheck([](const TensorList& in) { return sub(in[0], -0.5); }, {x});
  expect_gradcheck([](const TensorList& in) { return mul(in[0], -3.0); }, {x});
  expect_gradcheck([](const TensorList& in) { return div(in[0], 4.0); }, {x});
  expect_gradcheck([](const TensorList& in) { return rsub(in[0], 2.0); }, {x});
  expect_gradcheck([](const TensorList& in) { return rdiv(in[0], 3.0); }, {p});
  expect_gradcheck([](const TensorList& in) { return rdiv(in[0], 1.0); }, {p});
  const Tensor cond = ops::gt(random_tensor({3, 1}, kFloat64, 42), 0.0);  // broadcasts against (3, 4)
  expect_gradcheck([&](const TensorList& in) { return where(cond, in[0], in[1]); },
                   {leaf({1, 4}, 43), leaf({3, 4}, 44)});
  expect_gradcheck([&](const TensorList& in) { return where(cond, in[0].t(), 2.0 * in[1]); },
                   {leaf({4, 3}, 45), leaf({3, 4}, 46)});
  const Tensor mask = ops::gt(random_tensor({3, 4}, kFloat64, 47), 0.5);
  expect_gradcheck([&](const TensorList& in) { return masked_fill(in[0], mask, -7.0); }, {x});
  expect_gradcheck([&](const TensorList& in) { return masked_fill(in[0], mask, 0.0); },
                   {leaf({4}, 48)});  // x broadcast
  // Values: where picks, masked_fill fills.
  Tensor w = where(cond, x, p);
  const std::vector<double> wv = values_of(w), xv = values_of(x), pv = values_of(p), cv = values_of(cond);
  for (int i = 0; i < 12; ++i) CHECK(wv[size_t(i)] == (cv[size_t(i / 4)] ? xv[size_t(i)] : pv[size_t(i)]));
}

TEST_CASE("autograd ops: maximum and minimum split the gradient on ties, as PyTorch") {
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}), b = from_vector(std::vector<double>{1, 0, 5}, {3});
  a.requires_grad_();
  b.requires_grad_();
  sum(maximum(a, b)).backward();
  CHECK(values_of(a.grad()) == std::vector<double>{0.5, 1, 0});
  CHECK(values_of(b.grad()) == std::vector<double>{0.5, 0, 1});
  a.set_grad(Tensor());
  b.set_grad(Tensor());
  sum(minimum(a, b)).backward();
  CHECK(values_of(a.grad()) == std::vector<double>{0.5, 0, 1});
  CHECK(values_of(b.grad()) == std::vector<double>{0.5, 1, 0});
}

TEST_CASE("autograd ops: mixed dtypes give each input its gradient in its own dtype") {
  // f32 (4) + f16 (3, 1) -> f32 (3, 4); g = ones.
  Tensor a = random_tensor({4}, kFloat32, 50), b = random_tensor({3, 1}, kFloat16, 51);
  a.requires_grad_();
  b.requires_grad_();
  Tensor y = add(a, b, 2.0);
  REQUIRE(y.dtype() == kFloat32);
  y.backward(ones({3, 4}));
  REQUIRE(a.grad().dtype() == kFloat32);
  REQUIRE(b.grad().dtype() == kFloat16);
  CHECK(values_of(a.grad()) == std::vector<double>(4, 3.0));
  CHECK(values_of(b.grad()) == std::vector<double>(3, 8.0));
  // mul: grad_a = sum over rows of b, grad_b = sum over columns of a (in f16).
  a.set_grad(Tensor());
  b.set_grad(Tensor());
  mul(a, b).backward(ones({3, 4}));
  REQUIRE(a.grad().dtype() == kFloat32);
  REQUIRE(b.grad().dtype() == kFloat16);
  const std::vector<double> av = values_of(a), bv = values_of(b);
  check_close(a.grad(), std::vector<double>(4, bv[0] + bv[1] + bv[2]), 1e-6, 1e-6, "mul grad a");
  check_close(b.grad(), std::vector<double>(3, av[0] + av[1] + av[2] + av[3]), 2e-3, 2e-3, "mul grad b");
  // div with an f64 numerator that does not require grad and an f32 denominator that does.
  Tensor d = random_tensor({3}, kFloat32, 52, Layout::Contiguous, 1.0, 2.0);
  d.requires_grad_();
  Tensor n = random_tensor({3}, kFloat64, 53);
  Tensor q = div(n, d);
  REQUIRE(q.dtype() == kFloat64);
  sum(q).backward();
  REQUIRE(d.grad().dtype() == kFloat32);
  const std::vector<double> dv = values_of(d), nv = values_of(n);
  check_close(d.grad(), {-nv[0] / (dv[0] * dv[0]), -nv[1] / (dv[1] * dv[1]), -nv[2] / (dv[2] * dv[2])}, 1e-6, 1e-6,
              "div grad");
  // A root gradient in another dtype than its tensor is converted on the way.
  Tensor h = random_tensor({2}, kFloat16, 54);
  h.requires_grad_();
  gelu(h).backward(ones({2}, kFloat32));
  CHECK(h.grad().dtype() == kFloat16);
}

TEST_CASE("autograd ops: operators equal the named functions, values and gradients") {
  Tensor a = leaf({3, 4}, 60), b = leaf({4}, 61, 0.5, 2.0);
  auto same = [](const Tensor& x, const Tensor& y) { CHECK(values_of(x) == values_of(y)); };
  same(a + b, add(a, b));
  same(a - b, sub(a, b));
  same(a * b, mul(a, b));
  same(a / b, div(a, b));
  same(-a, neg(a));
  same(a + 2.0, add(a, 2.0));
  same(2.0 + a, add(a, 2.0));
  same(a - 2.0, sub(a, 2.0));
  same(a * 3.0, mul(a, 3.0));
  same(3.0 * a, mul(a, 3.0));
  same(a / 4.0, div(a, 4.0));
  same(2.0 - a, rsub(a, 2.0));
  same(3.0 / b, rdiv(b, 3.0));
  CHECK((a + b).grad_fn_name() == "AddBackward");
  CHECK((a - 1.0).grad_fn_name() == "SubBackward");
  CHECK((2.0 * a).grad_fn_name() == "MulBackward");
  CHECK((1.0 / b).grad_fn_name() == "ReciprocalBackward");
  // Values against a naive loop.
  const std::vector<double> av = values_of(a), bv = values_of(b), rv = values_of(2.0 - a), qv = values_of(3.0 / b);
  for (size_t i = 0; i < av.size(); ++i) CHECK(rv[i] == doctest::Approx(2.0 - av[i]));
  for (size_t i = 0; i < bv.size(); ++i) CHECK(qv[i] == doctest::Approx(3.0 / bv[i]));
  // A whole expression through the operators.
  expect_gradcheck(
      [](const TensorList& in) {
        const Tensor& x = in[0];
        const Tensor& y = in[1];
        return (x - 1.5) * y / (2.0 + x * x) - 0.5 * y + 1.0 / y - (-x) / 3.0 + (1.0 - y) * 2.0;
      },
      {a, b});
  // Integer operands keep PyTorch's promotion: int - 0.5 is float, 2 / int is float.
  const Tensor i = from_vector(std::vector<int32_t>{1, 2}, {2});
  CHECK((0.5 - i).dtype() == kFloat32);
  CHECK(values_of(2.0 / i) == std::vector<double>{2.0, 1.0});
  CHECK((3.0 - i).dtype() == kInt32);
}

TEST_CASE("autograd ops: comparisons and logical ops are re-exported, not differentiable") {
  Tensor a = leaf({4}, 70), b = leaf({4}, 71);
  Tensor m = gt(a, b);
  CHECK(m.dtype() == kBool);
  CHECK_FALSE(m.requires_grad());
  CHECK(values_of(logical_or(eq(a, a), lt(a, 0.0))) == std::vector<double>(4, 1.0));
  CHECK(values_of(logical_not(ne(a, a))) == std::vector<double>(4, 1.0));
  CHECK(values_of(logical_and(ge(a, b), le(a, b))) == values_of(eq(a, b)));
}

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
  expect_gradcheck(f, {leaf({3, 4}, 91), leaf({4}, 92), leaf({3, 4}, 93), leaf({3, 1}, 94, 0.5, 2.0)});
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
  expect_gradcheck(
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
