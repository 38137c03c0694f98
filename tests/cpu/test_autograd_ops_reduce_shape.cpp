// Differentiable reductions, softmax (autograd/ops/reduce.h) and joining/splitting/
// indexing ops (autograd/ops/shape.h): gradcheck in float64 over dims, keepdim and
// non-contiguous inputs; ties; unused split outputs; embedding's padding row.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/all.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::gradcheck;
using autograd::GradcheckOptions;

namespace {

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

Tensor index_tensor(const std::vector<int64_t>& v, const Shape& shape) { return from_vector(v, shape); }

}  // namespace

TEST_CASE("autograd reduce: sum, mean, var, amax, amin pass gradcheck over dims and keepdim") {
  using Fn = std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)>;
  const std::vector<std::pair<std::string, Fn>> ops_ = {
      {"sum", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return sum(x, d, k); }},
      {"mean", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return mean(x, d, k); }},
      {"var", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return var(x, d, 1, k); }},
      {"var(correction 0)", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return var(x, d, 0, k); }},
      {"amax", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amax(x, d, k); }},
      {"amin", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amin(x, d, k); }},
  };
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {-1}, {1}, {0, 2}, {2, 0, 1}};
  for (const auto& [name, f] : ops_) {
    for (const auto& dims : dim_sets) {
      for (bool keepdim : {false, true}) {
        CAPTURE(name);
        CAPTURE(shape_str(dims));
        CAPTURE(keepdim);
        expect_gradcheck([&](const TensorList& in) { return f(in[0], dims, keepdim); }, {leaf({2, 3, 4}, 1)});
        // Non-contiguous input: a permuted view of a (4, 2, 3) leaf.
        expect_gradcheck(
            [&](const TensorList& in) {
              return f(in[0].permute({1, 2, 0}), dims, keepdim);
            },
            {leaf({4, 2, 3}, 2)});
      }
    }
  }
  // 0-d inputs.
  expect_gradcheck([](const TensorList& in) { return sum(in[0]); }, {leaf({}, 3)});
  expect_gradcheck([](const TensorList& in) { return mean(in[0], {0}, true); }, {leaf({}, 4)});
  CHECK(sum(leaf({2}, 5)).grad_fn_name() == "SumBackward");
}

TEST_CASE("autograd reduce: sum's gradient is a broadcast, mean's is g / N, amax shares ties") {
  Tensor x = leaf({2, 3}, 10);
  Tensor g = from_vector(std::vector<double>{1, 2}, {2});
  sum(x, {1}).backward(g);
  CHECK(values_of(x.grad()) == std::vector<double>{1, 1, 1, 2, 2, 2});
  x.set_grad(Tensor());
  mean(x, {1}).backward(g);
  check_close(x.grad(), {1.0 / 3, 1.0 / 3, 1.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3}, 1e-15, 0, "mean");
  // Ties: amax/amin share evenly (PyTorch), max/min give it to the first index only.
  Tensor t = from_vector(std::vector<double>{1, 3, 3, 2, 0, 0, -1, 0}, {2, 4});
  t.requires_grad_();
  amax(t, {1}).backward(ones({2}, kFloat64));
  CHECK(values_of(t.grad()) == std::vector<double>{0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 0, 1.0 / 3});
  t.set_grad(Tensor());
  amin(t, {}).backward();
  CHECK(values_of(t.grad()) == std::vector<double>{0, 0, 0, 0, 0, 0, 1, 0});
  t.set_grad(Tensor());
  ValuesIndices m = max(t, 1);
  CHECK(values_of(m.indices) == std::vector<double>{1, 0});
  CHECK_FALSE(m.indices.requires_grad());
  m.values.backward(ones({2}, kFloat64));
  CHECK(values_of(t.grad()) == std::vector<double>{0, 1, 0, 0, 1, 0, 0, 0});
  t.set_grad(Tensor());
  min(t, 0, /*keepdim=*/true).values.backward(ones({1, 4}, kFloat64));
  CHECK(values_of(t.grad()) == std::vector<double>{0, 0, 0, 0, 1, 1, 1, 1});
  // argmax/argmin are re-exported.
  CHECK(values_of(argmax(t, 1)) == std::vector<double>{1, 0});
  CHECK(values_of(argmin(t, 1)) == std::vector<double>{0, 2});
}

TEST_CASE("autograd reduce: max and min values pass gradcheck along every dim") {
  for (int64_t dim : {0, 1, 2, -1}) {
    for (bool keepdim : {false, true}) {
      CAPTURE(dim);
      CAPTURE(keepdim);
      expect_gradcheck([&](const TensorList& in) { return max(in[0], dim, keepdim).values; }, {leaf({2, 3, 4}, 20)});
      expect_gradcheck([&](const TensorList& in) { return min(in[0].transpose(0, 2), dim, keepdim).values; },
                       {leaf({4, 3, 2}, 21)});
    }
  }
  expect_gradcheck([](const TensorList& in) { return max(in[0], 0).values; }, {leaf({}, 22)});
}

TEST_CASE("autograd reduce: softmax and log_softmax pass gradcheck along every dim") {
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    CAPTURE(dim);
    expect_gradcheck([&](const TensorList& in) { return softmax(in[0], dim); }, {leaf({2, 3, 4}, 30)});
    expect_gradcheck([&](const TensorList& in) { return log_softmax(in[0], dim); }, {leaf({2, 3, 4}, 31)});
    expect_gradcheck(
        [&](const TensorList& in) {
          return softmax(in[0].permute({2, 0, 1}), dim);
        },
        {leaf({4, 2, 3}, 32)});
    expect_gradcheck(
        [&](const TensorList& in) {
          return log_softmax(in[0].permute({1, 2, 0}), dim);
        },
        {leaf({4, 2, 3}, 33)});
  }
  // Rows sum to 1, so a constant upstream gradient gives a zero input gradient.
  Tensor x = leaf({3, 5}, 34);
  softmax(x, 1).backward(ones({3, 5}, kFloat64));
  for (double v : values_of(x.grad())) CHECK(std::fabs(v) < 1e-14);
  CHECK(log_softmax(x, 0).grad_fn_name() == "LogSoftmaxBackward");
}

TEST_CASE("autograd shape: cat and stack pass gradcheck, with inputs that need no grad") {
  const Tensor frozen = random_tensor({2, 3}, kFloat64, 40);
  expect_gradcheck(
      [&](const TensorList& in) {
        return cat({in[0], frozen, in[1].t()}, 0);
      },
      {leaf({1, 3}, 41), leaf({3, 4}, 42)});
  expect_gradcheck([&](const TensorList& in) { return cat({in[0], in[1]}, -1); }, {leaf({2, 3}, 43), leaf({2, 1}, 44)});
  // A (0,) input is skipped by cat and gets an empty gradient.
  expect_gradcheck(
      [&](const TensorList& in) {
        return cat({in[0], in[1], frozen}, 1);
      },
      {leaf({0}, 45), leaf({2, 2}, 46)});
  expect_gradcheck([&](const TensorList& in) { return cat({in[0], in[1]}, 0); }, {leaf({0}, 47), leaf({3}, 48)});
  for (int64_t dim : {0, 1, 2, -1}) {
    CAPTURE(dim);
    expect_gradcheck(
        [&](const TensorList& in) {
          return stack({in[0], frozen, in[1].t()}, dim);
        },
        {leaf({2, 3}, 49), leaf({3, 2}, 50)});
  }
  // Mixed dtypes: the gradient of each input in its dtype.
  Tensor a = random_tensor({2}, kFloat32, 51), b = random_tensor({3}, kFloat16, 52);
  a.requires_grad_();
  b.requires_grad_();
  cat({a, b}).backward(from_vector(std::vector<double>{1, 2, 3, 4, 5}, {5}, kFloat32));
  CHECK(a.grad().dtype() == kFloat32);
  CHECK(b.grad().dtype() == kFloat16);
  CHECK(values_of(b.grad()) == std::vector<double>{3, 4, 5});
}

TEST_CASE("autograd shape: split, split_with_sizes and chunk with outputs used partially") {
  // The engine hands zeros to the pieces that got no gradient.
  expect_gradcheck([](const TensorList& in) { return mul(split(in[0], 2, 1)[1], 3.0); }, {leaf({3, 5}, 60)});
  expect_gradcheck([](const TensorList& in) { return split(in[0], 2, -1).back(); }, {leaf({3, 5}, 61)});
  expect_gradcheck(
      [](const TensorList& in) {
        std::vector<Tensor> p = split_with_sizes(in[0], {1, 2, 1}, 0);
        return add(p[0], p[2]);  // p[1] unused
      },
      {leaf({4, 3}, 62)});
  expect_gradcheck(
      [](const TensorList& in) {
        std::vector<Tensor> c = chunk(in[0].t(), 3, 1);
        return cat({square(c[2]), c[0]}, 1);
      },
      {leaf({5, 2}, 63)});
  Tensor x = leaf({4, 2}, 64);
  std::vector<Tensor> pieces = chunk(x, 2);
  CHECK(pieces[0].grad_fn_name() == "SplitBackward");
  CHECK(split_with_sizes(x, {3, 1}).front().grad_fn_name() == "SplitWithSizesBackward");
  CHECK(pieces[1].shares_storage(x));  // still views: no copies
  sum(pieces[1]).backward();
  CHECK(values_of(x.grad()) == std::vector<double>{0, 0, 0, 0, 1, 1, 1, 1});
}

TEST_CASE("autograd shape: split's backward views adjacent piece grads instead of concatenating") {
  // Note [Split backward without a copy]. cat's backward hands the pieces narrow views of
  // one gradient: in order they are adjacent, so x's grad is that gradient's storage.
  const Tensor x = leaf({2, 3, 6}, 70);
  const Tensor g = random_tensor({2, 3, 6}, kFloat64, 71);
  for (int64_t dim : {2, 1}) {
    CAPTURE(dim);
    const std::vector<Tensor> pieces = dim == 2 ? chunk(x, 3, dim) : split_with_sizes(x, {1, 2}, dim);
    const Tensor gx = autograd::grad({cat(pieces, dim)}, {x}, {g})[0];
    CHECK(gx.shares_storage(g));  // the zero-copy path was taken
    CHECK(gx.sizes() == x.sizes());
    CHECK(values_of(gx) == values_of(g));
  }
  // Non-contiguous adjacent grads: dim 1's pieces of a transposed gradient.
  const Tensor gt = random_tensor({2, 6, 3}, kFloat64, 72).transpose(1, 2);
  const Tensor gx = autograd::grad({cat(chunk(x, 2, 2), 2)}, {x}, {gt})[0];
  CHECK(gx.shares_storage(gt));
  CHECK(values_of(gx) == values_of(gt));
}

TEST_CASE("autograd shape: split's backward concatenates grads that are not adjacent views") {
  const Tensor x = leaf({2, 3, 6}, 73);
  const Tensor g = random_tensor({2, 3, 6}, kFloat64, 74);
  const Tensor g4 = random_tensor({2, 3, 4}, kFloat64, 75);
  const std::vector<double> gv = values_of(g);
  auto part = [](const Tensor& t, int64_t from, int64_t n) { return values_of(t.narrow(2, from, n).contiguous()); };
  auto zeros_of = [](size_t n) { return std::vector<double>(n, 0.0); };
  {  // out of order: piece i's grad lies elsewhere in g
    const std::vector<Tensor> p = chunk(x, 3, 2);
    const Tensor gx = autograd::grad({cat({p[1], p[0], p[2]}, 2)}, {x}, {g})[0];
    CHECK(!gx.shares_storage(g));
    check_close(gx.narrow(2, 0, 2), part(g, 2, 2), 0, 0, "piece 0");
    check_close(gx.narrow(2, 2, 2), part(g, 0, 2), 0, 0, "piece 1");
    check_close(gx.narrow(2, 4, 2), part(g, 4, 2), 0, 0, "piece 2");
  }
  {  // separately allocated grads (mul's backward makes each)
    const std::vector<Tensor> p = chunk(x, 3, 2);
    const Tensor gx = autograd::grad({cat({mul(p[0], 2.0), mul(p[1], 2.0), mul(p[2], 2.0)}, 2)}, {x}, {g})[0];
    CHECK(!gx.shares_storage(g));
    std::vector<double> want = gv;
    for (double& w : want) w *= 2.0;
    check_close(gx, want, 0, 0, "doubled");
  }
  {  // one piece unused: the engine gives it zeros, a separate tensor
    const std::vector<Tensor> p = chunk(x, 3, 2);
    const Tensor gx = autograd::grad({cat({p[0], p[1]}, 2)}, {x}, {g4})[0];
    CHECK(!gx.shares_storage(g4));
    check_close(gx.narrow(2, 0, 4), values_of(g4), 0, 0, "used pieces");
    check_close(gx.narrow(2, 4, 2), zeros_of(12), 0, 0, "unused piece");
  }
}

TEST_CASE("autograd shape: a leaf's .grad never keeps a larger buffer alive through a split's view") {
  // The joined view covers only part of cat's gradient (the third piece is another input's):
  // AccumulateGrad copies it rather than adopting the whole buffer.
  const Tensor x = leaf({4, 3}, 76);
  const std::vector<Tensor> p = chunk(x, 2, 0);
  const Tensor c = random_tensor({2, 3}, kFloat64, 77), w = random_tensor({6, 3}, kFloat64, 78);
  sum(mul(cat({p[0], p[1], mul(c, 2.0)}, 0), w)).backward();
  const Tensor gx = x.grad();
  CHECK(gx.storage_offset() == 0);
  CHECK(gx.impl().storage->nbytes == size_t(gx.numel()) * sizeof(double));
  check_close(gx, values_of(w.narrow(0, 0, 4).contiguous()), 0, 0, "x.grad");
}

TEST_CASE("autograd shape: index_select, gather, scatter_add and index_add with duplicate indices") {
  const Tensor idx = index_tensor({2, 0, 2, 1}, {4});
  expect_gradcheck([&](const TensorList& in) { return index_select(in[0], 1, idx); }, {leaf({2, 3}, 70)});
  expect_gradcheck([&](const TensorList& in) { return index_select(in[0].t(), 0, idx); }, {leaf({2, 3}, 71)});
  expect_gradcheck([&](const TensorList& in) { return index_select(in[0], 0, index_tensor({1}, {})); },
                   {leaf({3}, 72)});
  expect_gradcheck([&](const TensorList& in) { return index_select(in[0], 0, index_tensor({0}, {})); },
                   {leaf({}, 72)});  // 0-d input and index
  const Tensor gidx = index_tensor({0, 0, 1, 2, 2, 2}, {2, 3});
  expect_gradcheck([&](const TensorList& in) { return gather(in[0], 0, gidx); }, {leaf({3, 3}, 73)});
  expect_gradcheck([&](const TensorList& in) { return gather(in[0], -1, gidx); }, {leaf({2, 4}, 74)});
  // scatter_add: both self and src; src larger than the index (its extra part gets zeros).
  expect_gradcheck([&](const TensorList& in) { return scatter_add(in[0], 0, gidx, in[1]); },
                   {leaf({3, 4}, 75), leaf({3, 3}, 76)});
  expect_gradcheck([&](const TensorList& in) { return scatter_add(in[0], 1, gidx, in[1].t()); },
                   {leaf({2, 3}, 77), leaf({3, 2}, 78)});
  const Tensor aidx = index_tensor({1, 1, 0}, {3});
  expect_gradcheck([&](const TensorList& in) { return index_add(in[0], 0, aidx, in[1]); },
                   {leaf({2, 4}, 79), leaf({3, 4}, 80)});
  // Index gradients in numbers: index_select with duplicates accumulates.
  Tensor x = leaf({3}, 81);
  sum(index_select(x, 0, idx)).backward();
  CHECK(values_of(x.grad()) == std::vector<double>{1, 1, 2});
}

TEST_CASE("autograd shape: embedding accumulates duplicates and leaves the padding row at zero") {
  const Tensor ids = index_tensor({3, 1, 3, 0, 1, 3}, {2, 3});
  expect_gradcheck([&](const TensorList& in) { return embedding(in[0], ids); }, {leaf({5, 4}, 90)});
  Tensor w = leaf({5, 2}, 91);
  Tensor out = embedding(w, ids, /*padding_idx=*/1);
  CHECK(out.sizes() == Shape{2, 3, 2});
  // Forward still reads the padding row (PyTorch: padding_idx only affects the gradient).
  const std::vector<double> wv = values_of(w), ov = values_of(out);
  CHECK(ov[2] == wv[2]);
  CHECK(ov[3] == wv[3]);
  const Tensor g = random_tensor({2, 3, 2}, kFloat64, 92);
  out.backward(g);
  const std::vector<double> gv = values_of(g), gw = values_of(w.grad());
  // Row 3 appears at positions 0, 2, 5; row 0 at 3; row 1 (padding) at 1 and 4; rows 2, 4 never.
  for (int c = 0; c < 2; ++c) {
    CHECK(gw[size_t(3 * 2 + c)] ==
          doctest::Approx(gv[size_t(0 * 2 + c)] + gv[size_t(2 * 2 + c)] + gv[size_t(5 * 2 + c)]));
    CHECK(gw[size_t(0 * 2 + c)] == doctest::Approx(gv[size_t(3 * 2 + c)]));
    CHECK(gw[size_t(1 * 2 + c)] == 0.0);
    CHECK(gw[size_t(2 * 2 + c)] == 0.0);
    CHECK(gw[size_t(4 * 2 + c)] == 0.0);
  }
  check_error([&] { embedding(w, ids, 5); }, {"embedding", "padding_idx", "5"});
  check_error([&] { embedding(w, ids, -2); }, {"embedding", "padding_idx"});
  // one_hot is re-exported (not differentiable).
  CHECK(values_of(one_hot(index_tensor({1, 0}, {2}), 2)) == std::vector<double>{0, 1, 1, 0});
}
