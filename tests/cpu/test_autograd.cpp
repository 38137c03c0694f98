// The autograd engine: graph recording, backward, accumulation, retain_graph,
// version checks, grad mode, views, deep graphs, anomaly mode, gradcheck itself.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/meta.h"  // register_hook
#include "autograd/ops/all.h"
#include "memory/allocator.h"
#include "tensor/ops/binary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::gradcheck;

namespace {
Tensor leaf(const Shape& s, uint64_t seed, Layout layout = Layout::Contiguous) {
  Tensor t = random_tensor(s, kFloat64, seed, layout);
  if (!t.is_contiguous()) t = t.contiguous();
  t.requires_grad_();
  return t;
}
}  // namespace

TEST_CASE("autograd: a leaf used twice through a view; as_strided is a clear error, integer to() has no grad") {
  // Gradchecks of each view, clone and to(): the differentiable op table (tests/cpu/test_grad_table.cpp).
  Tensor x = leaf({4, 6}, 7);
  auto r = gradcheck([](const TensorList& in) { return matmul(in[0].t().contiguous(), in[0]); }, {x});
  CHECK_MESSAGE(r.ok, r.report);
  check_error([&] { x.as_strided({2}, {1}, 0); }, {"as_strided", "not differentiable"});
  const Tensor as_int = x.to(kInt32);  // PyTorch's x.int(): a result without a gradient
  CHECK(as_int.dtype() == kInt32);
  CHECK_FALSE(as_int.requires_grad());
}

TEST_CASE("autograd: leaves accumulate, graphs are freed unless retained") {
  Tensor a = leaf({2, 3}, 1), b = leaf({3, 2}, 2);
  Tensor y = matmul(a, b);
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  CHECK(y.grad_fn_name() == "MatmulBackward");
  Tensor g = ones({2, 2}, kFloat64);
  y.backward(g, /*retain_graph=*/true);
  const std::vector<double> ga1 = values_of(a.grad());
  // d(sum(a @ b))/da[i][k] = sum_j b[k][j]
  const std::vector<double> bv = values_of(b);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 3; ++k) CHECK(ga1[i * 3 + k] == doctest::Approx(bv[k * 2] + bv[k * 2 + 1]));
  y.backward(g);  // accumulates
  const std::vector<double> ga2 = values_of(a.grad());
  for (size_t i = 0; i < ga1.size(); ++i) CHECK(ga2[i] == doctest::Approx(2 * ga1[i]));
  check_error([&] { y.backward(g); }, {"MatmulBackward", "retain_graph"});
  check_error([&] { matmul(a, b).backward(); }, {"backward", "scalar", "[2, 2]"});
  check_error([&] { zeros({2}).backward(); }, {"backward", "does not require grad"});
}

TEST_CASE("autograd: a tensor saved for backward and modified in place is caught") {
  Tensor a = leaf({2, 3}, 1);
  Tensor b = random_tensor({3, 2}, kFloat64, 2);
  b.requires_grad_();
  Tensor y = matmul(a, b);
  ops::add_(b.detach(), 1.0);  // the same storage, so the same version counter
  check_error([&] { y.backward(ones({2, 2}, kFloat64)); }, {"MatmulBackward", "modified by an in-place", "version"});
}

TEST_CASE("autograd: NoGradGuard, detach and retain_grad") {
  Tensor a = leaf({2, 2}, 1);
  {
    NoGradGuard guard;
    Tensor y = matmul(a, a);
    CHECK_FALSE(y.requires_grad());
    {
      autograd::EnableGradGuard enable;
      CHECK(matmul(a, a).requires_grad());
    }
  }
  Tensor d = a.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.shares_storage(a));
  Tensor h = matmul(a, a);
  h.retain_grad();
  Tensor out = matmul(h, a);
  out.backward(ones({2, 2}, kFloat64));
  REQUIRE(h.grad().defined());
  // d out / d h = ones @ a^T
  const std::vector<double> av = values_of(a), hg = values_of(h.grad());
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) CHECK(hg[i * 2 + j] == doctest::Approx(av[j * 2] + av[j * 2 + 1]));
  check_error([] { zeros({2}, kInt64).requires_grad_(); }, {"requires_grad_", "int64"});
  check_error([&] { h.requires_grad_(false); }, {"non-leaf"});
}

TEST_CASE("autograd: autograd::grad returns gradients without touching .grad") {
  Tensor a = leaf({3, 3}, 1), b = leaf({3, 3}, 2);
  Tensor h = matmul(a, b);
  h.retain_grad();
  TensorList g = autograd::grad({matmul(h, b)}, {a, h}, {ones({3, 3}, kFloat64)});
  // Only the nodes on a path to a or h ran: b's AccumulateGrad did not (it used to set
  // b.grad), nor did h's retain_grad.
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
  CHECK_FALSE(h.grad().defined());
  const std::vector<double> gh = values_of(g[1]), bv = values_of(b);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) CHECK(gh[i * 3 + j] == doctest::Approx(bv[j * 3] + bv[j * 3 + 1] + bv[j * 3 + 2]));
  // d/da of sum((a b) b) = ones (b b)^T.
  const std::vector<double> ga = values_of(g[0]), bb = values_of(matmul(b, b).detach());
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) CHECK(ga[i * 3 + j] == doctest::Approx(bb[j * 3] + bb[j * 3 + 1] + bb[j * 3 + 2]));
}

TEST_CASE("autograd: autograd::grad of an input the outputs do not use throws unless allow_unused") {
  Tensor x = leaf({3}, 1), w = leaf({3}, 2), unused = leaf({2}, 3);
  const Tensor y = sum(x * w);
  check_error(
      [&] {
        autograd::grad({y}, {x, unused}, {}, /*retain_graph=*/true);
      },
      {"grad", "input 1", "float64[2]", "allow_unused"});
  const TensorList g = autograd::grad({y}, {x, unused}, {}, /*retain_graph=*/false, /*allow_unused=*/true);
  CHECK(values_of(g[0]) == values_of(w));
  CHECK_FALSE(g[1].defined());
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("autograd: autograd::grad through a checkpoint reaches the region's parameters, touching no .grad") {
  Tensor x = leaf({2, 3}, 1), w = leaf({3, 3}, 2);
  auto block = [&](const TensorList& in) { return TensorList{tanh(matmul(in[0], w))}; };
  const Tensor g = random_tensor({2, 3}, kFloat64, 3);
  const TensorList got = autograd::grad({autograd::checkpoint(block, {x})[0]}, {x, w}, {g});
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  autograd::backward({block({x})[0]}, {g});  // the plain graph, into .grad
  check_close(values_of(got[0]), values_of(x.grad()), 1e-12, 1e-12);
  check_close(values_of(got[1]), values_of(w.grad()), 1e-12, 1e-12);
}

TEST_CASE("autograd: copy_ is differentiable (the destination's old history gets zeros, the source the gradient)") {
  // The case: h no longer depends on w once overwritten, so w's gradient is 0 (it
  // was 20: the copy was invisible to autograd).
  Tensor w = leaf({3}, 1);
  {
    Tensor h = w * 2.0;
    h.copy_(full({3}, 5.0, kFloat64));
    sum(h * h).backward();
    CHECK(values_of(w.grad()) == std::vector<double>(3, 0.0));
  }
  // The source gets d/dsrc: broadcast back to its shape, in its own dtype.
  Tensor src = random_tensor({3}, kFloat32, 2);
  src.requires_grad_();
  Tensor h = zeros({2, 3}, kFloat64);
  h.copy_(src);
  CHECK(h.grad_fn_name() == "CopyBackward");
  const Tensor g = random_tensor({2, 3}, kFloat64, 3);
  (h * 1.0).backward(g);
  REQUIRE(src.grad().dtype() == kFloat32);
  const std::vector<double> gv = values_of(g);
  check_close(values_of(src.grad()), {gv[0] + gv[3], gv[1] + gv[4], gv[2] + gv[5]}, 1e-6, 1e-6);
  // gradcheck: y = (x * 3) with its values replaced by a's, then multiplied by x.
  auto r = gradcheck(
      [](const TensorList& in) {
        Tensor t = in[0] * 3.0;
        t.copy_(in[1]);
        return t * in[0];
      },
      {leaf({2, 3}, 4), leaf({2, 3}, 5)});
  CHECK_MESSAGE(r.ok, r.report);
}

TEST_CASE("autograd: copy_ into a leaf that requires grad, or into a view, throws while autograd records") {
  Tensor w = leaf({3}, 1);
  check_error([&] { w.copy_(zeros({3}, kFloat64)); }, {"copy_", "leaf", "float64[3]"});
  {
    autograd::NoGradGuard no_grad;  // an optimizer step or an initialisation may
    w.copy_(full({3}, 2.0, kFloat64));
  }
  CHECK(values_of(w) == std::vector<double>(3, 2.0));
  Tensor buffer = zeros({2, 3}, kFloat64);
  check_error([&] { buffer.narrow(0, 0, 1).copy_(w.unsqueeze(0)); }, {"copy_", "view"});
  // Nothing requires grad: a plain copy, no history.
  Tensor plain = zeros({3}, kFloat64);
  plain.copy_(w.detach());
  CHECK(plain.grad_fn_name().empty());
  CHECK(values_of(plain) == std::vector<double>(3, 2.0));
}

TEST_CASE("autograd: deep graphs run and tear down without recursion") {
  Tensor x = leaf({4}, 1);
  Tensor y = x;
  for (int i = 0; i < 10000; ++i) y = (i % 2 ? y.view({2, 2}) : y.view({4}));
  y.view({4}).backward(ones({4}, kFloat64));
  CHECK(values_of(x.grad()) == std::vector<double>(4, 1.0));
  // A 200k-node chain, never run, destroyed at once.
  Tensor z = x;
  for (int i = 0; i < 200000; ++i) z = z.unsqueeze(0).squeeze(0);
  z = Tensor();
  CHECK(x.requires_grad());
}

TEST_CASE("autograd: anomaly mode names the op whose backward made a NaN") {
  Tensor a = leaf({2, 2}, 1);
  Tensor b = from_vector(std::vector<double>{1, std::numeric_limits<double>::quiet_NaN(), 1, 1}, {2, 2});
  Tensor y = matmul(a, b);
  {
    autograd::AnomalyGuard anomaly;
    check_error([&] { y.backward(ones({2, 2}, kFloat64), true); }, {"anomaly", "MatmulBackward", "Matmul"});
  }
  y.backward(ones({2, 2}, kFloat64));  // without anomaly mode the NaN just flows
  CHECK(std::isnan(values_of(a.grad())[0]));
}

TEST_CASE("autograd: gradcheck catches a wrong backward") {
  // linear without its bias gradient check passes; a function that hides a
  // non-differentiable step (a raw copy) must fail.
  Tensor x = leaf({3}, 1);
  auto broken = [](const TensorList& in) {
    Tensor raw = zeros({3}, kFloat64);
    raw.copy_(in[0].detach());                                      // value flows, gradient does not
    return matmul(in[0].unsqueeze(0), raw.unsqueeze(1)).squeeze();  // x.x with one factor frozen
  };
  auto r = gradcheck(broken, {x});
  CHECK_FALSE(r.ok);
  CHECK(r.report.find("analytic") != std::string::npos);
}

TEST_CASE("autograd: threads that create autograd tensors and views at once each get their own right gradients") {
  // Every first autograd tensor of a thread used to rewrite the process-wide view hook
  // (a data race, as TSan reports; tools/sanitize.sh tsan runs this case).
  constexpr int kThreads = 4;
  std::vector<std::vector<double>> grads(kThreads);
  std::vector<std::thread> threads;
  for (int r = 0; r < kThreads; ++r)
    threads.emplace_back([r, &grads] {
      for (int i = 0; i < 50; ++i) {
        Tensor x = leaf({2, 3}, uint64_t(r * 100 + i));
        sum(x.t().reshape({6}) * double(r + 1)).backward();
        grads[size_t(r)] = values_of(x.grad());
      }
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kThreads; ++r) CHECK(grads[size_t(r)] == std::vector<double>(6, double(r + 1)));
}

TEST_CASE("engine: a tensor used twice sums its gradients in place when nothing else holds the first") {
  // w feeds two products, as a tied embedding feeds the embedding and the output projection:
  // the sum of its two (1000, 100) gradients must not be a third buffer of that size.
  Tensor w = random_tensor({1000, 100}, kFloat32, 3).requires_grad_();
  const Tensor a = random_tensor({8, 1000}, kFloat32, 4), b = random_tensor({100, 8}, kFloat32, 5);
  const Tensor y = add(sum(matmul(a, w)), sum(matmul(w, b)));
  const int64_t before = memory::stats(kCPU).allocated_bytes.current;
  memory::reset_peak(kCPU);
  y.backward();
  const int64_t grad_bytes = 1000 * 100 * 4;
  CHECK(memory::stats(kCPU).allocated_bytes.peak - before < 2 * grad_bytes + grad_bytes / 2);  // two, not three
  // The values: a^T 1 + 1 b^T (float64 loops).
  const std::vector<double> av = values_of(a), bv = values_of(b), got = values_of(w.grad());
  double worst = 0;
  for (int64_t i = 0; i < 1000; ++i)
    for (int64_t j = 0; j < 100; ++j) {
      double want = 0;
      for (int64_t r = 0; r < 8; ++r) want += av[size_t(r * 1000 + i)] + bv[size_t(j * 8 + r)];
      worst = std::max(worst, std::abs(got[size_t(i * 100 + j)] - want));
    }
  CHECK(worst < 1e-4);
  // A hook on the twice-used tensor sees the sum, and what it keeps is not written afterwards.
  Tensor v = random_tensor({4}, kFloat32, 6).requires_grad_();
  const Tensor h = mul(v, 1.0);
  Tensor kept;
  autograd::register_hook(h, [&](const Tensor& g) {
    kept = g;
    return Tensor();
  });
  add(sum(mul(h, 2.0)), sum(mul(h, 3.0))).backward();
  CHECK(values_of(kept) == std::vector<double>{5, 5, 5, 5});
  CHECK(values_of(v.grad()) == std::vector<double>{5, 5, 5, 5});
}
