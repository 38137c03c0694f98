// Probes for silent wrong answers in the autograd engine itself, on the CPU, against
// PyTorch's documented semantics: higher order (without create_graph), post-accumulate
// hooks, tensor hooks (register_hook) and retain_grad (order, count, values), graph lifetime (freed buffers,
// retain_graph, in-place writes between backwards, roots and their gradients), .grad accumulation (views, broadcasts,
// two branches, 16-bit and size-0 leaves, zero_grad), autograd::grad (several outputs, grad_outputs, view and non-leaf
// inputs, no side effects), grad modes (nesting, threads), requires_grad through integer/bool ops, detach and
// requires_grad_, views taken before an in-place write to their base (with a view node, or without: taken while the
// base needed no grad or under NoGradGuard), 100k-node graphs, anomaly mode. Every value is checked against a float64
// reference computed here (closed forms, naive loops, central differences); the PyTorch behaviour each case expects was
// checked with torch 1.13 (CPU). A failing case here is a finding.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "autograd/ops/all.h"
#include "nn/linear.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Values = std::vector<double>;

Tensor leaf_of(const Values& v, const Shape& shape, DType dtype = kFloat64) {
  Tensor t = from_vector(v, shape, TensorOptions(dtype));
  t.requires_grad_();
  return t;
}

Tensor f64(const Values& v, const Shape& shape) { return from_vector(v, shape, TensorOptions(kFloat64)); }

}  // namespace

// ============================================================================================
// Higher order
// ============================================================================================

TEST_CASE("probe autograd: gradients are first order: results of grad()/backward carry no graph, and say so") {
  // Without create_graph (tests/cpu/test_double_backward.cpp has it) backward formulas run
  // under no-grad, so a gradient is a constant. What must never happen is a silent zero second
  // derivative: a gradient that looks differentiable, or a backward from one that runs.
  const Tensor x = leaf_of({0.5, -1.0, 2.0}, {3});
  const Tensor y = sum(mul(mul(x, x), x));  // dy/dx = 3 x^2
  const TensorList g = autograd::grad({y}, {x}, {}, /*retain_graph=*/true);
  check_close(g[0], {0.75, 3.0, 12.0}, 1e-15, 0, "dy/dx");
  CHECK_FALSE(g[0].requires_grad());
  CHECK(g[0].is_leaf());
  check_error([&] { sum(g[0]).backward(); }, {"backward", "does not require grad"});
  y.backward();
  CHECK_FALSE(x.grad().requires_grad());
  check_error([&] { sum(x.grad()).backward(); }, {"backward", "does not require grad"});
  // A first-order gradient treated as a constant in a new graph is what PyTorch gives
  // without create_graph: d/dx sum(stop(3 x^2) * x) = 3 x^2.
  const Tensor z = sum(mul(g[0], x));
  check_close(autograd::grad({z}, {x})[0], {0.75, 3.0, 12.0}, 1e-15, 0, "constant gradient times x");
}

// ============================================================================================
// Hooks and retain_grad
// ============================================================================================

TEST_CASE("probe autograd: post-accumulate hooks: once per backward per leaf, in order, after accumulation") {
  const Tensor x = leaf_of({1.0, 2.0, 3.0}, {3});
  const Tensor w = f64({0.5, -1.0, 4.0}, {3});
  std::vector<std::string> calls;
  std::vector<Values> seen;
  const uint64_t h1 = autograd::register_post_accumulate_grad_hook(x, [&](const Tensor& leaf) {
    calls.push_back("first");
    seen.push_back(values_of(leaf.grad()));
  });
  autograd::register_post_accumulate_grad_hook(x, [&](const Tensor& leaf) {
    calls.push_back("second");
    autograd::NoGradGuard no_grad;
    ops::mul_(leaf.grad(), 0.5);  // a hook may rewrite .grad in place (a clipping hook does)
  });
  // x used three times: directly, through a view and through a broadcast.
  auto loss = [&] {
    return add(sum(mul(x, w)), add(sum(mul(x.view({3, 1}), x.view({3, 1}))), sum(x.unsqueeze(0).expand({2, 3}))));
  };
  // d/dx = w + 2 x + 2
  const Values gx = {0.5 + 2 + 2, -1.0 + 4 + 2, 4.0 + 6 + 2};
  loss().backward();
  REQUIRE(calls == std::vector<std::string>{"first", "second"});
  check_close(seen[0], gx, 1e-15, 0, "the hook sees the accumulated gradient");
  check_close(x.grad(), {gx[0] / 2, gx[1] / 2, gx[2] / 2}, 1e-15, 0, "halved by the second hook");
  // The next backward accumulates onto the halved .grad, and the hooks run once more.
  loss().backward();
  REQUIRE(calls.size() == 4);
  check_close(seen[1], {1.5 * gx[0], 1.5 * gx[1], 1.5 * gx[2]}, 1e-15, 0, "second accumulation");
  // grad() touches no .grad, so no post-accumulate hook runs.
  autograd::grad({loss()}, {x});
  CHECK(calls.size() == 4);
  // A removed hook runs no more; a backward that does not reach x runs none.
  autograd::remove_post_accumulate_grad_hook(x, h1);
  loss().backward();
  CHECK(calls == std::vector<std::string>{"first", "second", "first", "second", "second"});
  const Tensor other = leaf_of({1.0}, {1});
  sum(other).backward();
  CHECK(calls.size() == 5);
  check_error([&] { autograd::register_post_accumulate_grad_hook(mul(x, 2.0), [](const Tensor&) {}); },
              {"register_post_accumulate_grad_hook", "leaf"});
}

TEST_CASE("probe autograd: register_hook on leaves and op outputs, as torch.Tensor.register_hook") {
  // torch: x = [1, 2] (leaf); h = x * 3; h.register_hook(lambda g: g * 10);
  // x.register_hook(lambda g: g + 1); (h * [1, 2]).sum().backward() gives x.grad = [31, 61];
  // the hook on h sees [1, 2], the one on x sees [30, 60].
  const Tensor x = leaf_of({1.0, 2.0}, {2});
  Tensor h = mul(x, 3.0);
  std::vector<Values> seen_h, seen_x;
  const uint64_t hid = autograd::register_hook(h, [&](const Tensor& g) {
    seen_h.push_back(values_of(g));
    return mul(g, 10.0);
  });
  const uint64_t xid = autograd::register_hook(x, [&](const Tensor& g) {
    seen_x.push_back(values_of(g));
    return add(g, 1.0);
  });
  h.retain_grad();
  sum(mul(h, f64({1.0, 2.0}, {2}))).backward(Tensor(), /*retain_graph=*/true);
  REQUIRE(seen_h.size() == 1);
  CHECK(seen_h[0] == Values{1.0, 2.0});
  REQUIRE(seen_x.size() == 1);
  CHECK(seen_x[0] == Values{30.0, 60.0});
  check_close(x.grad(), {31.0, 61.0}, 0, 0, "hooked leaf gradient");
  check_close(h.grad(), {10.0, 20.0}, 0, 0, "retain_grad sees the hooked gradient (torch 2: it runs last)");
  // grad(): the hooks run too, before the capture, and .grad is left alone (torch 2's engine
  // calls tensor pre-hooks before captures, "We always want to call tensor pre-hooks": [31, 61];
  // Debian's torch 1.13 returned [30, 60]).
  const TensorList g = autograd::grad({sum(mul(h, f64({1.0, 2.0}, {2})))}, {x}, {}, /*retain_graph=*/true);
  check_close(g[0], {31.0, 61.0}, 0, 0, "grad() through both hooks");
  check_close(x.grad(), {31.0, 61.0}, 0, 0, ".grad untouched by grad()");
  // Removed hooks no longer run; a hook returning nothing observes only.
  autograd::remove_hook(h, hid);
  autograd::remove_hook(x, xid);
  int observed = 0;
  autograd::register_hook(x, [&](const Tensor&) {
    ++observed;
    return Tensor();
  });
  x.set_grad(Tensor());
  sum(mul(h, f64({1.0, 2.0}, {2}))).backward();
  CHECK(observed == 1);
  check_close(x.grad(), {3.0, 6.0}, 0, 0, "after remove_hook");
  // Errors: no grad, and a hook that changes the shape.
  check_error([] { autograd::register_hook(f64({1.0}, {1}), [](const Tensor& g) { return g; }); },
              {"register_hook", "does not require grad"});
  const Tensor y = leaf_of({1.0, 2.0}, {2});
  Tensor z = mul(y, 2.0);
  autograd::register_hook(z, [](const Tensor& g) { return sum(g); });
  check_error([&] { sum(z).backward(); }, {"register_hook", "MulBackward", "keep the shape"});
}

TEST_CASE("probe autograd: retain_grad: roots, intermediates used twice, accumulation, dtypes, unreached outputs") {
  const Tensor x = leaf_of({1.0, -2.0, 0.5}, {3});
  Tensor h = mul(x, 3.0);
  h.retain_grad();
  Tensor y = add(mul(h, h), h);  // dy/dh = 2 h + 1
  y.retain_grad();
  const Tensor gy = f64({1.0, 2.0, -1.0}, {3});
  y.backward(gy, /*retain_graph=*/true);
  const Values hv = values_of(h);
  Values gh;
  for (size_t i = 0; i < 3; ++i) gh.push_back((2 * hv[i] + 1) * values_of(gy)[i]);
  check_close(y.grad(), values_of(gy), 0, 0, "the root's retained grad is grad_output");
  check_close(h.grad(), gh, 1e-15, 0, "an intermediate used twice");
  CHECK(y.grad().impl_ptr() != gy.impl_ptr());
  CHECK_FALSE(y.grad().shares_storage(gy));  // writing into .grad must not write the user's tensor
  y.backward(gy);
  check_close(h.grad(), {2 * gh[0], 2 * gh[1], 2 * gh[2]}, 1e-15, 0, "retained grads accumulate, as leaves do");
  // A float32 intermediate of a float64 graph keeps a float32 .grad.
  const Tensor a = leaf_of({0.25, 0.75}, {2});
  Tensor a32 = a.to(kFloat32);
  a32.retain_grad();
  sum(mul(a32.to(kFloat64), f64({2.0, 3.0}, {2}))).backward();
  CHECK(a32.grad().dtype() == kFloat32);
  check_close(a32.grad(), {2.0, 3.0}, 0, 0, "float32 retained grad");
  // An output no gradient reached keeps an undefined .grad (PyTorch: None), also the
  // unused piece of a multi-output op: zeros would claim it does not affect the loss.
  const Tensor b = leaf_of({1.0, 2.0, 3.0, 4.0}, {4});
  Tensor unused = mul(b, 2.0);
  unused.retain_grad();
  std::vector<Tensor> pieces = split(mul(b, 1.0), 2);
  pieces[0].retain_grad();
  pieces[1].retain_grad();
  sum(mul(pieces[0], pieces[0])).backward();
  CHECK_FALSE(unused.grad().defined());
  check_close(pieces[0].grad(), {2.0, 4.0}, 0, 0, "the used piece");
  CHECK_MESSAGE(!pieces[1].grad().defined(), "the unused piece got a retained grad of ",
                pieces[1].grad().defined() ? pieces[1].grad().str() : "");
  check_close(b.grad(), {2.0, 4.0, 0.0, 0.0}, 0, 0, "the leaf still gets zeros for the unused piece");
  check_error([&] { ones({2}, kFloat64).retain_grad(); }, {"retain_grad", "does not require grad"});
}

TEST_CASE("probe autograd: a leaf whose requires_grad was turned off after the forward gets no .grad") {
  // PyTorch's AccumulateGrad: `if (!variable.requires_grad()) return {};` (torch 1.13: x.grad
  // is None). Freezing a parameter between forward and backward must freeze it.
  const Tensor x = leaf_of({1.0, 2.0}, {2}), w = leaf_of({3.0, 4.0}, {2});
  Tensor y = sum(mul(x, w));
  x.requires_grad_(false);
  y.backward();
  CHECK_MESSAGE(!x.grad().defined(), "a frozen leaf received ", x.grad().defined() ? x.grad().str() : "");
  check_close(w.grad(), {1.0, 2.0}, 0, 0, "the other leaf");
  // Turned back on, the next graph reaches it again.
  x.requires_grad_(true);
  sum(mul(x, w)).backward();
  check_close(x.grad(), {3.0, 4.0}, 0, 0, "unfrozen");
}

// ============================================================================================
// Graph lifetime and roots
// ============================================================================================

TEST_CASE("probe autograd: graph lifetime: freed buffers, retain_graph, in-place writes between backwards") {
  const Tensor x = leaf_of({0.5, 1.5}, {2});
  Tensor e = exp(x);  // saves its output
  Tensor y = sum(mul(e, e));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward(Tensor(), /*retain_graph=*/true);
  const Values xv = values_of(x);
  check_close(x.grad(), {4 * std::exp(2 * xv[0]), 4 * std::exp(2 * xv[1])}, 1e-14, 0, "twice 2 e^2x");
  {  // a write to a saved tensor between two backwards: the second throws, naming the node
    autograd::NoGradGuard no_grad;
    ops::add_(e, 1.0);
  }
  check_error([&] { y.backward(Tensor(), true); }, {"Backward", "modified by an in-place", "version"});
  // retain_graph=false frees the saved tensors: a second run is refused, naming the node.
  const Tensor a = leaf_of({2.0, 3.0}, {2});
  Tensor z = sum(mul(a, a));
  z.backward();
  check_error([&] { z.backward(); }, {"Backward", "retain_graph"});
  check_error([&] { autograd::grad({z}, {a}); }, {"Backward", "retain_graph"});
  // Nodes that saved nothing freed nothing: torch runs them again. sum(a + b) backward twice
  // gives a.grad = [2, 2]; sum(a * 3 + b) through grad() then backward gives a.grad = 3.
  {
    const Tensor p = leaf_of({1.0, 2.0}, {2}), q = leaf_of({3.0, 4.0}, {2});
    Tensor s2 = sum(add(p, q));
    s2.backward();
    s2.backward();
    check_close(p.grad(), {2.0, 2.0}, 0, 0, "add and sum, twice");
    Tensor s3 = sum(add(mul(p, 3.0), q));
    const TensorList gq = autograd::grad({s3}, {q});
    check_close(gq[0], {1.0, 1.0}, 0, 0, "grad() first");
    p.set_grad(Tensor());
    s3.backward();
    check_close(p.grad(), {3.0, 3.0}, 0, 0, "then backward");
  }
  // Roots: a non-scalar needs a gradient of its shape; errors name both shapes.
  Tensor m = mul(a.unsqueeze(0).expand({3, 2}), 2.0);
  check_error([&] { m.backward(); }, {"backward", "[3, 2]"});
  check_error([&] { m.backward(ones({2, 3}, kFloat64)); }, {"[2, 3]", "[3, 2]"});
  check_error([&] { m.backward(ones({6}, kFloat64)); }, {"[6]", "[3, 2]"});
  check_error([&] { ones({1}, kFloat64).backward(); }, {"backward", "does not require grad"});
  {
    autograd::NoGradGuard no_grad;
    const Tensor made = mul(a, 2.0);
    check_error([&] { sum(made).backward(); }, {"backward", "does not require grad"});
  }
  // The same root twice, or two roots of one node: their gradients add.
  const Tensor b = leaf_of({1.0, -1.0}, {2});
  Tensor r = mul(b, 3.0);
  autograd::backward({r, r}, {f64({1.0, 2.0}, {2}), f64({10.0, 20.0}, {2})});
  check_close(b.grad(), {33.0, 66.0}, 0, 0, "one root given twice");
  // After a backward that threw, grad mode is back on and a fresh graph runs.
  CHECK(autograd::is_grad_enabled());
  CHECK(mul(b, 2.0).requires_grad());
}

TEST_CASE("probe autograd: a grad_output of another dtype is converted to the root's, as PyTorch does") {
  // torch: (x * 2).backward(torch.tensor([1, 2, 3])) gives x.grad = [2, 4, 6] in x's dtype;
  // a bool gradient [True, False, True] gives [2, 0, 2].
  const Tensor x = leaf_of({1.0, 2.0, 3.0}, {3});
  mul(x, 2.0).backward(from_vector(std::vector<int64_t>{1, 2, 3}, {3}));
  CHECK(x.grad().dtype() == kFloat64);
  check_close(x.grad(), {2.0, 4.0, 6.0}, 0, 0, "int64 grad_output");
  x.set_grad(Tensor());
  mul(x, 2.0).backward(gt(f64({1.0, 0.0, 1.0}, {3}), 0.5));
  check_close(x.grad(), {2.0, 0.0, 2.0}, 0, 0, "bool grad_output");
  // Through ops whose backward divides or multiplies by the gradient.
  const Tensor w = f64({2.0, 4.0, 8.0}, {3});
  const Tensor gi = from_vector(std::vector<int64_t>{3, 5, 7}, {3});
  x.set_grad(Tensor());
  div(x, w).backward(gi);
  check_close(x.grad(), {1.5, 1.25, 0.875}, 1e-15, 0, "div with an int64 gradient");
  x.set_grad(Tensor());
  matmul(x.unsqueeze(0), f64({1, 2, 3, 4, 5, 6}, {3, 2})).backward(from_vector(std::vector<int64_t>{1, 2}, {1, 2}));
  check_close(x.grad(), {5.0, 11.0, 17.0}, 1e-15, 0, "matmul with an int64 gradient");
  // A retained root's .grad has the root's dtype.
  Tensor h = mul(x, 2.0);
  h.retain_grad();
  h.backward(full({3}, 0.5, kFloat32));
  CHECK(h.grad().dtype() == kFloat64);
  const TensorList g = autograd::grad({mul(x, 2.0)}, {x}, {gi});
  CHECK(g[0].dtype() == kFloat64);
  check_close(g[0], {6.0, 10.0, 14.0}, 0, 0, "grad() with an int64 grad_output");
}

// ============================================================================================
// Accumulation
// ============================================================================================

TEST_CASE("probe autograd: a leaf reached through views, broadcasts and two branches gets the sum, accumulated") {
  const Values xv = random_values(12, 7);
  const Tensor x = leaf_of(xv, {3, 4});
  // f = sum(x.t() * c) + sum(x[1] * x[2]) + sum(x[:, ::2].expand(2, 3, 2)) + sum(x.view(12)[5:9]^2)
  const Values c = random_values(12, 8);  // (4, 3)
  auto f = [&] {
    const Tensor t1 = sum(mul(x.t(), f64(c, {4, 3})));
    const Tensor t2 = sum(mul(x.select(0, 1), x.select(0, 2)));
    const Tensor t3 = sum(x.slice(1, 0, 4, 2).unsqueeze(0).expand({2, 3, 2}));
    const Tensor v = x.view({12}).narrow(0, 5, 4);
    return add(add(t1, t2), add(t3, sum(mul(v, v))));
  };
  Values ref(12, 0.0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) ref[size_t(i * 4 + j)] += c[size_t(j * 3 + i)];
  for (int j = 0; j < 4; ++j) ref[size_t(4 + j)] += xv[size_t(8 + j)], ref[size_t(8 + j)] += xv[size_t(4 + j)];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; j += 2) ref[size_t(i * 4 + j)] += 2.0;
  for (int k = 5; k < 9; ++k) ref[size_t(k)] += 2 * xv[size_t(k)];
  f().backward();
  check_close(x.grad(), ref, 1e-13, 1e-13, "one backward");
  f().backward();
  Values twice;
  for (double v : ref) twice.push_back(2 * v);
  check_close(x.grad(), twice, 1e-13, 1e-13, "accumulated over two backwards");
  check_gradcheck(
      [&](const TensorList& in) {
        return in[0].t().select(1, 2).unsqueeze(1).expand({4, 3});
      },
      {leaf_of(xv, {3, 4})});
}

TEST_CASE("probe autograd: 16-bit leaves get .grad in their own dtype, accumulated in it") {
  for (DType dt : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const Values xv = {0.5, -1.25, 2.0, 3.0};
    const Tensor x = leaf_of(xv, {4}, dt);
    const Tensor w = f64({1.0, 2.0, -0.5, 0.25}, {4});
    sum(mul(x.to(kFloat64), w)).backward();  // through a cast
    REQUIRE(x.grad().dtype() == dt);
    check_close(x.grad(), values_of(w), 0, 0, "through a cast");
    sum(mul(x, x)).backward();  // in the 16-bit dtype itself
    REQUIRE(x.grad().dtype() == dt);
    Values ref;
    for (size_t i = 0; i < 4; ++i) ref.push_back(values_of(w)[i] + 2 * xv[i]);
    check_close(x.grad(), ref, default_rtol(dt), 0, "accumulated");
    const TensorList g = autograd::grad({sum(mul(x, w.to(dt)))}, {x});
    CHECK(g[0].dtype() == dt);
    check_close(g[0], values_of(w), 0, 0, "grad()");
    Tensor h = mul(x, 2.0);
    h.retain_grad();
    sum(mul(h.to(kFloat32), 3.0)).backward();
    CHECK(h.grad().dtype() == dt);
    check_close(h.grad(), {3.0, 3.0, 3.0, 3.0}, 0, 0, "retained 16-bit grad");
  }
}

TEST_CASE("probe autograd: size-0 leaves and broadcasts to size 0 get gradients of their shape") {
  const Tensor e = leaf_of({}, {0, 3});
  sum(mul(e, 2.0)).backward();
  REQUIRE(e.grad().defined());
  CHECK(e.grad().sizes() == Shape{0, 3});
  CHECK(e.grad().dtype() == kFloat64);
  // torch: x (1, 3) expanded to (0, 3) and summed: x.grad = zeros(1, 3).
  const Tensor x = leaf_of({1.0, 2.0, 3.0}, {1, 3});
  sum(x.expand({0, 3})).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().sizes() == Shape{1, 3});
  check_close(x.grad(), {0.0, 0.0, 0.0}, 0, 0, "expand to size 0");
  // K = 0 matmul: the output is zeros (2, 2), both gradients are empty.
  const Tensor a = leaf_of({}, {2, 0}), b = leaf_of({}, {0, 2});
  sum(matmul(a, b)).backward();
  CHECK(a.grad().sizes() == Shape{2, 0});
  CHECK(b.grad().sizes() == Shape{0, 2});
  const TensorList g = autograd::grad({sum(mul(e, e))}, {e});
  CHECK(g[0].sizes() == Shape{0, 3});
  // Two sums of one size-0 leaf: each gradient is an expanded (stride 0) empty tensor, which
  // counts as contiguous; the engine's in-place sum of the two threw "cannot write in place into
  // an expanded view" (found by op_fuzz --grad --gradgrad).
  const Tensor twice = leaf_of({}, {3, 0});
  sum(add(sum(twice), sum(twice, {1}))).backward();
  REQUIRE(twice.grad().defined());
  CHECK(twice.grad().sizes() == Shape{3, 0});
}

TEST_CASE("probe autograd: zero_grad(set_to_none) starts a fresh .grad; zero_grad(false) zeroes it in place") {
  nn::Linear fc(3, 2);
  const Tensor x = f64({1.0, 2.0, 3.0}, {1, 3}).to(kFloat32);
  auto step = [&] { sum(fc.forward(x)).backward(); };
  step();
  const Tensor held = fc.bias.grad();
  check_close(held, {1.0, 1.0}, 0, 0, "bias grad");
  fc.zero_grad(/*set_to_none=*/false);
  check_close(held, {0.0, 0.0}, 0, 0, "zeroed in place: a held .grad sees it");
  step();
  CHECK(fc.bias.grad().impl_ptr() == held.impl_ptr());
  check_close(held, {1.0, 1.0}, 0, 0, "accumulated into the zeroed buffer");
  fc.zero_grad();
  CHECK_FALSE(fc.bias.grad().defined());
  step();
  check_close(fc.bias.grad(), {1.0, 1.0}, 0, 0, "after set_to_none");
  check_close(held, {1.0, 1.0}, 0, 0, "the old .grad is left alone");
  check_close(fc.weight.grad(), {1, 2, 3, 1, 2, 3}, 0, 0, "weight grad");
}

TEST_CASE("probe autograd: a .grad set in another dtype is never accumulated into silently") {
  // PyTorch refuses the assignment ("assigned grad has data of a different type"); frugal's
  // set_grad allows it (optimizers test their own dtype checks with it), so backward must
  // refuse to accumulate a float64 gradient into a float32 .grad, rounding it.
  const Tensor x = leaf_of({1.0, 2.0, 3.0}, {3});
  check_error([&] { x.set_grad(zeros({2}, kFloat64)); }, {"set_grad", "float64[2]", "float64[3]"});
  x.set_grad(zeros({3}, kFloat32));
  check_error([&] { sum(mul(x, 1.0 / 3.0)).backward(); }, {"AccumulateGrad", "float32[3]", "float64[3]"});
  check_close(x.grad(), {0.0, 0.0, 0.0}, 0, 0, "left as it was");
  x.set_grad(full({3}, 0.25, kFloat64));
  sum(mul(x, 1.0 / 3.0)).backward();
  CHECK(x.grad().dtype() == kFloat64);
  check_close(x.grad(), {0.25 + 1.0 / 3.0, 0.25 + 1.0 / 3.0, 0.25 + 1.0 / 3.0}, 1e-16, 0, "accumulated in float64");
}

// ============================================================================================
// autograd::grad
// ============================================================================================

TEST_CASE("probe autograd: grad() with several outputs, grad_outputs, view and non-leaf inputs, no side effects") {
  const Values xv = {0.5, -1.0, 2.0, 1.5, -0.25, 0.75};
  const Tensor x = leaf_of(xv, {2, 3});
  const Tensor w = leaf_of({2.0, -1.0, 0.5}, {3});
  const Tensor unrelated = leaf_of({1.0}, {1});
  Tensor v = x.t();        // a view input: (3, 2)
  Tensor h = mul(v, 2.0);  // a non-leaf input
  h.retain_grad();
  Tensor y1 = mul(h, w.unsqueeze(1));  // (3, 2): 2 x[j][i] w[i]
  Tensor y2 = sum(mul(h, h));          // scalar: 4 sum x^2
  const Tensor g1 = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  const TensorList g = autograd::grad({y1, y2}, {v, x, h, w}, {g1, Tensor()}, /*retain_graph=*/true);
  // dL/dh[i][j] = g1[i][j] w[i] + 2 h[i][j]; dL/dv = 2 dL/dh; dL/dx = (dL/dv)^T
  const Values g1v = values_of(g1), wv = values_of(w), hv = values_of(h);
  Values gh(6), gv(6), gx(6);
  double gw[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      const size_t k = size_t(i * 2 + j);
      gh[k] = g1v[k] * wv[size_t(i)] + 2 * hv[k];
      gv[k] = 2 * gh[k];
      gx[size_t(j * 3 + i)] = gv[k];
      gw[i] += g1v[k] * hv[k];
    }
  check_close(g[0], gv, 1e-14, 0, "view input");
  check_close(g[1], gx, 1e-14, 0, "leaf input");
  check_close(g[2], gh, 1e-14, 0, "non-leaf input");
  check_close(g[3], {gw[0], gw[1], gw[2]}, 1e-14, 0, "second leaf");
  for (const Tensor& t : {x, w, unrelated, Tensor(h)}) CHECK_FALSE(t.grad().defined());
  // Again on the retained graph: the same values; then backward fills .grad with them.
  const TensorList again = autograd::grad({y1, y2}, {x}, {g1, Tensor()}, true);
  CHECK(values_of(again[0]) == values_of(g[1]));
  autograd::backward({y1, y2}, {g1, Tensor()});
  check_close(x.grad(), gx, 1e-14, 0, "backward after grad()");
  check_close(h.grad(), gh, 1e-14, 0, "retained after grad()");
  CHECK_FALSE(unrelated.grad().defined());
  // allow_unused: None for the unrelated leaf, values for the rest.
  const TensorList u = autograd::grad({sum(mul(x, x))}, {unrelated, x}, {}, false, /*allow_unused=*/true);
  CHECK_FALSE(u[0].defined());
  check_close(u[1], {1.0, -2.0, 4.0, 3.0, -0.5, 1.5}, 0, 0, "2 x");
  CHECK_FALSE(unrelated.grad().defined());
}

// ============================================================================================
// Modes
// ============================================================================================

TEST_CASE("probe autograd: grad mode guards nest and restore, and are per thread") {
  const Tensor x = leaf_of({1.0}, {1});
  CHECK(autograd::is_grad_enabled());
  {
    NoGradGuard a;
    CHECK_FALSE(mul(x, 2.0).requires_grad());
    {
      autograd::EnableGradGuard b;
      CHECK(mul(x, 2.0).requires_grad());
      {
        NoGradGuard c;
        CHECK_FALSE(autograd::is_grad_enabled());
      }
      CHECK(autograd::is_grad_enabled());
    }
    CHECK_FALSE(autograd::is_grad_enabled());
    // A thread started under no_grad records (torch: is_grad_enabled() is True in a new
    // thread), and what it sets stays on it.
    bool thread_enabled = false, thread_records = false;
    std::thread t([&] {
      thread_enabled = autograd::is_grad_enabled();
      thread_records = mul(x, 2.0).requires_grad();
      autograd::set_grad_enabled(false);
    });
    t.join();
    CHECK(thread_enabled);
    CHECK(thread_records);
    CHECK_FALSE(autograd::is_grad_enabled());
  }
  CHECK(autograd::is_grad_enabled());
  // A guard unwound by an exception restores the mode.
  try {
    NoGradGuard g;
    throw std::runtime_error("unwind");
  } catch (const std::runtime_error&) {}
  CHECK(autograd::is_grad_enabled());
  // Anomaly mode is per thread too.
  autograd::AnomalyGuard anomaly;
  bool other_thread_anomaly = true;
  std::thread t([&] { other_thread_anomaly = autograd::is_anomaly_enabled(); });
  t.join();
  CHECK_FALSE(other_thread_anomaly);
}

TEST_CASE("probe autograd: integer, bool, comparison and argmax results never require grad; int operands") {
  const Tensor x = leaf_of({-1.0, 2.0, 0.5, -3.0}, {4});
  for (const Tensor& t :
       {gt(x, 0.0), eq(x, x), lt(x, mul(x, 2.0)), logical_not(gt(x, 0.0)), argmax(x, 0), argmin(x.view({2, 2}), 1)})
    CHECK_FALSE(t.requires_grad());
  // An integer conversion is not differentiable: no grad and no error, as PyTorch's x.long().
  const Tensor as_int = x.to(kInt64);
  CHECK_FALSE(as_int.requires_grad());
  CHECK(as_int.tolist<int64_t>() == std::vector<int64_t>{-1, 2, 0, -3});
  check_error([] { zeros({2}, kBool).requires_grad_(); }, {"requires_grad_", "bool"});
  // relu by where(x > 0, x, 0) and a product with an int tensor: gradients through the
  // float operand only.
  const Tensor k = from_vector(std::vector<int64_t>{3, -2, 5, 7}, {4});
  const Tensor y = add(sum(where(gt(x, 0.0), x, zeros({}, kFloat64))), sum(mul(x, k)));
  CHECK(y.dtype() == kFloat64);
  y.backward();
  check_close(x.grad(), {0 + 3.0, 1 - 2.0, 1 + 5.0, 0 + 7.0}, 0, 0, "where + int product");
  // An int tensor used with a leaf never gains history.
  CHECK_FALSE(k.requires_grad());
  CHECK(k.is_leaf());
}

TEST_CASE("probe autograd: detach shares storage and version; requires_grad_ on non-leaves; in place on leaves") {
  const Tensor x = leaf_of({1.0, 2.0, 3.0}, {3});
  const Tensor d = x.detach();
  CHECK(d.shares_storage(x));
  CHECK_FALSE(d.requires_grad());
  const uint64_t v0 = x.version();
  Tensor y = sum(mul(x, x));  // saves x
  ops::mul_(d, 2.0);          // d is not a leaf that requires grad: allowed, bumps the shared version
  CHECK(x.version() == v0 + 1);
  check_close(x, {2.0, 4.0, 6.0}, 0, 0, "the write shows through x");
  check_error([&] { y.backward(); }, {"MulBackward", "modified by an in-place", "version"});
  // requires_grad_(true) on a non-leaf is harmless; (false) is refused (torch: "you can only
  // change requires_grad flags of leaf variables").
  Tensor h = mul(x, 2.0);
  h.requires_grad_(true);
  CHECK_FALSE(h.is_leaf());
  check_error([&] { h.requires_grad_(false); }, {"requires_grad_", "non-leaf"});
  sum(h).backward();
  check_close(x.grad(), {2.0, 2.0, 2.0}, 0, 0, "h's history kept");
  // In place on a leaf that requires grad, or on a view of one: refused while recording.
  check_error([&] { add_(x, 1.0); }, {"add_", "leaf"});
  check_error([&] { add_(x.narrow(0, 0, 2), 1.0); }, {"add_"});
  // The detached handle made a new leaf: its own .grad, not x's.
  const Tensor d2 = x.detach().requires_grad_();
  sum(mul(d2, 5.0)).backward();
  check_close(d2.grad(), {5.0, 5.0, 5.0}, 0, 0, "detached leaf");
  check_close(x.grad(), {2.0, 2.0, 2.0}, 0, 0, "x untouched");
}

TEST_CASE("probe autograd: a view taken before an in-place write to its base is not silently stale") {
  // torch: h = x * 2; v = h.view(2, 2); h.mul_(3); (v * w).sum().backward() gives
  // x.grad = 6 w (v now holds 6 x). Backward through v's old history would give 2 w.
  const Values xv = {1.0, 2.0, 3.0, 4.0}, wv = {1.0, 2.0, 3.0, 4.0};
  const Tensor w = f64(wv, {2, 2});
  auto check_right_or_refused = [&](const char* what, auto&& body) {
    const Tensor x = leaf_of(xv, {4});
    bool refused = false;
    try {
      body(x);
    } catch (const Error& e) {
      refused = true;
      CHECK_MESSAGE(std::string(e.what()).find("in-place") != std::string::npos, what, ": ", e.what());
    }
    if (!refused) check_close(x.grad(), {6 * wv[0], 6 * wv[1], 6 * wv[2], 6 * wv[3]}, 1e-15, 0, what);
  };
  check_right_or_refused("view, then mul_ on the base", [&](const Tensor& x) {
    Tensor h = mul(x, 2.0);
    Tensor v = h.view({2, 2});
    mul_(h, 3.0);
    sum(mul(v, w)).backward();
  });
  check_right_or_refused("transpose of a reshape, then mul_ on the base", [&](const Tensor& x) {
    Tensor h = mul(x, 2.0);
    Tensor v = h.view({2, 2}).t().t();
    mul_(h, 3.0);
    sum(mul(v, w)).backward();
  });
  check_right_or_refused("split pieces, then mul_ on the base", [&](const Tensor& x) {
    Tensor h = mul(x, 2.0);
    std::vector<Tensor> pieces = split(h, 2);
    mul_(h, 3.0);
    sum(mul(cat({pieces[0], pieces[1]}, 0).view({2, 2}), w)).backward();
  });
  check_right_or_refused("view, then copy_ into the base", [&](const Tensor& x) {
    Tensor h = mul(x, 2.0);
    Tensor v = h.view({2, 2});
    h.copy_(mul(x, 6.0));
    sum(mul(v, w)).backward();
  });
  // A view of a leaf whose values an optimizer step changed under no_grad stays right:
  // its history (a view of the leaf) is still true, so it must not be refused.
  const Tensor p = leaf_of(xv, {4});
  const Tensor pt = p.view({2, 2}).t();
  {
    NoGradGuard no_grad;
    ops::mul_(p, 3.0);
  }
  sum(mul(pt, w)).backward();
  check_close(p.grad(), {1.0, 3.0, 2.0, 4.0}, 0, 0, "a view of a leaf stepped under no_grad");
  // A view taken after the write is of course fine.
  const Tensor x = leaf_of(xv, {4});
  Tensor h = mul(x, 2.0);
  mul_(h, 3.0);
  sum(mul(h.view({2, 2}), w)).backward();
  check_close(x.grad(), {6 * wv[0], 6 * wv[1], 6 * wv[2], 6 * wv[3]}, 1e-15, 0, "view after the write");
}

TEST_CASE("probe autograd: a view taken while its base needed no grad is refused after a recorded write") {
  // torch: buf = ones(3); v = buf[1:]; buf.add_(w); (v * [5, 7]).sum() + buf.sum() gives
  // w.grad = [1, 6, 8]: v's grad_fn is regenerated. frugal's v has no view node, so without
  // Note [Views without history] the loss saw v as a constant and w.grad was [1, 1, 1].
  const Values wv = {1.0, 2.0, 3.0};
  const Tensor scale = f64({5.0, 7.0}, {2});
  {
    const Tensor w = leaf_of(wv, {3});
    Tensor buf = ones({3}, kFloat64);
    const Tensor v = buf.narrow(0, 1, 2);
    add_(buf, w);
    check_error([&] { (void)mul(v, scale); }, {"Views without history", "taken while its base needed no grad"});
    check_error([&] { (void)v.view({2, 1}); }, {"view:", "Views without history"});  // a Tensor method too
    check_error([&] { (void)v.clone(); }, {"to/clone:", "Views without history"});
    {
      NoGradGuard no_grad;  // reading it as a constant is what NoGradGuard asks for
      check_close(mul(v, scale), {15.0, 28.0}, 0, 0, "the view's values under NoGradGuard");
    }
    const Tensor after = buf.narrow(0, 1, 2);  // taken after the write: tracked
    (sum(mul(after, scale)) + sum(buf)).backward();
    check_close(w.grad(), {1.0, 6.0, 8.0}, 0, 0, "a view taken after the write: torch's gradient");
  }
  {  // copy_ into a preallocated buffer (torch: w.grad = [4, 4, 4])
    const Tensor w = leaf_of(wv, {3});
    Tensor buf = zeros({3}, kFloat64);
    const Tensor v = buf.view({3});
    buf.copy_(mul(w, 2.0));
    check_error([&] { (void)(sum(mul(v, ones({3}, kFloat64))) + sum(buf)); }, {"Views without history"});
  }
  {  // a view of the stale view under NoGradGuard keeps the stamp: still refused afterwards
    const Tensor w = leaf_of(wv, {3});
    Tensor buf = ones({3}, kFloat64);
    const Tensor v = buf.view({3});
    add_(buf, w);
    Tensor vv;
    {
      NoGradGuard no_grad;
      vv = v.narrow(0, 0, 2);
    }
    check_error([&] { (void)mul(vv, 2.0); }, {"Views without history"});
  }
  {  // a write nobody records (no operand requires grad) leaves such views usable
    Tensor buf = ones({3}, kFloat64);
    const Tensor v = buf.view({3});
    add_(buf, f64({1.0, 1.0, 1.0}, {3}));
    const Tensor w = leaf_of(wv, {3});
    sum(mul(v, w)).backward();
    check_close(w.grad(), {2.0, 2.0, 2.0}, 0, 0, "an unrecorded write");
  }
}

TEST_CASE("probe autograd: a view taken under NoGradGuard of a tensor that requires grad is not written with grad on") {
  // torch: "A view was created in no_grad mode and is being modified inplace with grad mode enabled".
  const Tensor a = leaf_of({1.0, 2.0, 3.0}, {3});
  Tensor v;
  {
    NoGradGuard no_grad;
    v = a.view({3});
  }
  check_error([&] { mul_(v, 3.0); }, {"mul_", "taken under NoGradGuard", "Views without history"});
  check_error([&] { (void)v.narrow(0, 0, 2).copy_(f64({0.0, 0.0}, {2})); }, {"taken under NoGradGuard"});
  check_close(a, {1.0, 2.0, 3.0}, 0, 0, "the leaf is unchanged");
  {
    NoGradGuard no_grad;  // as an optimizer step writes it
    mul_(v, 3.0);
  }
  check_close(a, {3.0, 6.0, 9.0}, 0, 0, "written under NoGradGuard");
}

// ============================================================================================
// Deep graphs, anomaly mode
// ============================================================================================

TEST_CASE("probe autograd: 100k-node graphs run backward and grad(), and tear down, without recursion") {
  constexpr int kN = 100000;
  const Tensor x = leaf_of({0.5, 2.0}, {2});
  {  // y = x * (1 + 1e-6)^N + N * c, through alternating mul and add nodes
    Tensor y = x;
    for (int i = 0; i < kN; ++i) y = (i % 2) ? mul(y, 1.0 + 1e-6) : add(y, 1e-3);
    const double factor = std::pow(1.0 + 1e-6, kN / 2);
    const TensorList g = autograd::grad({sum(y)}, {x}, {}, /*retain_graph=*/true);
    check_close(g[0], {factor, factor}, 1e-10, 0, "grad() through 100k nodes");
    sum(y).backward();
    check_close(x.grad(), {factor, factor}, 1e-10, 0, "backward through 100k nodes");
  }  // the chain is destroyed here
  {  // 100k in-place ops on one non-leaf: each rebases its history
    Tensor h = mul(x, 1.0);
    for (int i = 0; i < kN; ++i) add_(h, 1.0);
    check_close(h, {0.5 + kN, 2.0 + kN}, 0, 0, "values");
    x.set_grad(Tensor());
    sum(h).backward();
    check_close(x.grad(), {1.0, 1.0}, 0, 0, "through 100k in-place nodes");
  }
  {  // a wide-then-deep graph: the leaf used by every one of 100k nodes
    Tensor y = mul(x, 0.0);
    for (int i = 0; i < kN; ++i) y = add(y, x);
    x.set_grad(Tensor());
    sum(y).backward();
    check_close(x.grad(), {double(kN), double(kN)}, 0, 0, "leaf used 100k times");
  }
  CHECK(x.requires_grad());
}

TEST_CASE("probe autograd: anomaly mode names the op in grad() runs too; without it the NaN flows") {
  const Tensor x = leaf_of({0.0, 1.0}, {2});
  {
    autograd::AnomalyGuard anomaly;
    Tensor y = sum(sqrt(x));  // d sqrt/dx at 0 = inf
    check_error([&] { autograd::grad({y}, {x}, {}, true); }, {"anomaly", "SqrtBackward"});
    check_error([&] { y.backward(); }, {"anomaly", "SqrtBackward"});
    // Finite gradients pass.
    sum(mul(x, 3.0)).backward();
    check_close(x.grad(), {3.0, 3.0}, 0, 0, "finite");
  }
  const TensorList g = autograd::grad({sum(sqrt(x))}, {x});
  CHECK(std::isinf(values_of(g[0])[0]));
  check_close(std::vector<double>{values_of(g[0])[1]}, {0.5}, 1e-15, 0, "d sqrt at 1");
}
