// cat, stack, split, split_with_sizes, chunk against naive index loops in double; the
// differentiable ops (autograd/ops/join.h) through gradcheck in float64, split outputs used
// partially, and split's backward without a copy.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/join.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/ops/join.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

// Reference cat: out[idx] = inputs[j][idx with idx[dim] - start_j], walking the output row-major.
std::vector<double> cat_reference(const std::vector<std::vector<double>>& values, const std::vector<Shape>& shapes,
                                  int64_t dim) {
  Shape out = shapes[0];
  out[size_t(dim)] = 0;
  for (const Shape& s : shapes) out[size_t(dim)] += s[size_t(dim)];
  std::vector<double> ref(size_t(numel_of(out)));
  for (int64_t i = 0; i < numel_of(out); ++i) {
    std::vector<int64_t> idx = unravel(i, out);
    size_t j = 0;
    while (idx[size_t(dim)] >= shapes[j][size_t(dim)]) idx[size_t(dim)] -= shapes[j++][size_t(dim)];
    int64_t lin = 0;
    for (size_t d = 0; d < idx.size(); ++d) lin = lin * shapes[j][d] + idx[d];
    ref[size_t(i)] = values[j][size_t(lin)];
  }
  return ref;
}

// Reference narrow along dim: elements of x (values, shape) with start <= idx[dim] < start + len.
std::vector<double> narrow_reference(const std::vector<double>& values, const Shape& shape, int64_t dim, int64_t start,
                                     int64_t len) {
  std::vector<double> out;
  for (int64_t i = 0; i < numel_of(shape); ++i) {
    const std::vector<int64_t> idx = unravel(i, shape);
    if (idx[size_t(dim)] >= start && idx[size_t(dim)] < start + len) out.push_back(values[size_t(i)]);
  }
  return out;
}

constexpr DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

}  // namespace

TEST_CASE("join: cat on every dim, every layout, every float dtype") {
  const Shape base = {3, 4, 5};
  for (DType dt : kFloatTypes) {
    for (int64_t dim = -3; dim < 3; ++dim) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      std::vector<Tensor> inputs;
      std::vector<std::vector<double>> values;
      std::vector<Shape> shapes;
      int k = 0;
      for (Layout layout : kAllLayouts) {
        for (int64_t len : {2, 1, 3}) {
          Shape s = base;
          s[size_t(d)] = len;
          inputs.push_back(random_tensor(s, dt, uint64_t(100 * k + d), layout));
          values.push_back(values_of(inputs.back()));
          shapes.push_back(s);
          ++k;
        }
      }
      const Tensor out = ops::cat(inputs, dim);
      CAPTURE(dtype_name(dt));
      CAPTURE(dim);
      CHECK(out.dtype() == dt);
      CHECK(out.is_contiguous());
      Shape expected = base;
      expected[size_t(d)] = 18;
      CHECK(out.sizes() == expected);
      check_close(out, cat_reference(values, shapes, d), 0.0, 0.0, "cat");
    }
  }
}

TEST_CASE("join: cat promotes mixed dtypes as PyTorch") {
  struct Case {
    DType a, b, expected;
  };
  const Case cases[] = {{kFloat16, kFloat32, kFloat32}, {kFloat16, kBFloat16, kFloat32},
                        {kInt32, kFloat64, kFloat64},   {kInt32, kInt64, kInt64},
                        {kBool, kInt32, kInt32},        {kBFloat16, kBFloat16, kBFloat16}};
  for (const Case& c : cases) {
    for (int64_t dim : {0, 1, -1}) {
      const Shape sa = {2, 3}, sb = dim == 0 ? Shape{4, 3} : Shape{2, 5};
      // Integer-valued inputs, so every dtype holds them exactly; y is transposed (not contiguous).
      std::vector<double> va = random_values(numel_of(sa), 7, 0.0, c.a == kBool ? 2.0 : 50.0);
      for (double& v : va) v = std::floor(v);
      const Tensor x = make_tensor(va, sa, c.a);
      std::vector<double> vb = random_values(numel_of(sb), 9, 0.0, 50.0);
      for (double& v : vb) v = std::floor(v);
      const Tensor y = make_tensor(vb, sb, c.b, Layout::Transposed);
      const Tensor out = ops::cat({x, y}, dim);
      CAPTURE(dtype_name(c.a));
      CAPTURE(dtype_name(c.b));
      CHECK(out.dtype() == c.expected);
      check_close(out, cat_reference({values_of(x), values_of(y)}, {sa, sb}, dim < 0 ? dim + 2 : dim), 0.0, 0.0,
                  "cat mixed");
    }
  }
}

TEST_CASE("join: cat of many inputs, empties and the legacy (0,) rule") {
  // 70 inputs: more than one batch of the CUDA kernel; lengths 0..3 along dim 1.
  std::vector<Tensor> inputs;
  std::vector<std::vector<double>> values;
  std::vector<Shape> shapes;
  int64_t total = 0;
  for (int i = 0; i < 70; ++i) {
    const Shape s = {2, i % 4, 3};
    total += i % 4;
    inputs.push_back(random_tensor(s, kFloat32, uint64_t(i), i % 3 == 0 ? Layout::Strided : Layout::Contiguous));
    values.push_back(values_of(inputs.back()));
    shapes.push_back(s);
  }
  const Tensor out = ops::cat(inputs, 1);
  CHECK(out.sizes() == Shape{2, total, 3});
  check_close(out, cat_reference(values, shapes, 1), 0.0, 0.0, "cat 70");

  // A (0,) tensor is skipped whatever the other shapes; its dtype still promotes.
  const Tensor x = random_tensor({2, 3}, kFloat32, 1);
  const Tensor y = ops::cat({empty({0}, kFloat64), x, empty({0}, kFloat32)}, 1);
  CHECK(y.dtype() == kFloat64);
  CHECK(y.sizes() == Shape{2, 3});
  check_close(y, values_of(x), 0.0, 0.0, "cat skip");
  // Only (0,) tensors: a (0,) result.
  const Tensor z = ops::cat({empty({0}), empty({0})});
  CHECK(z.sizes() == Shape{0});
  // Other empty tensors are joined by the usual rules.
  CHECK(ops::cat({empty({0, 3}), empty({0, 3})}, 0).sizes() == Shape{0, 3});
  CHECK(ops::cat({empty({2, 0}), empty({2, 0})}, 0).sizes() == Shape{4, 0});
  const Tensor w = ops::cat({empty({2, 0}), x}, 1);
  check_close(w, values_of(x), 0.0, 0.0, "cat (2, 0)");
  // One input: a copy, not the input itself.
  const Tensor c = ops::cat({x});
  CHECK_FALSE(c.shares_storage(x));
  check_close(c, values_of(x), 0.0, 0.0, "cat one");
}

TEST_CASE("join: large cat (threaded copy) matches the reference") {
  const Tensor a = random_tensor({300, 700}, kFloat32, 1);
  const Tensor b = random_tensor({300, 500}, kFloat32, 2, Layout::Transposed);
  const Tensor c = random_tensor({300, 300}, kFloat32, 3);
  const Tensor out = ops::cat({a, b, c}, 1);
  check_close(out, cat_reference({values_of(a), values_of(b), values_of(c)}, {{300, 700}, {300, 500}, {300, 300}}, 1),
              0.0, 0.0, "large cat");
}

TEST_CASE("join: stack on every dim, layouts and 0-d inputs") {
  const Shape s = {3, 4};
  for (DType dt : kFloatTypes) {
    for (int64_t dim = -3; dim <= 2; ++dim) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      std::vector<Tensor> inputs;
      std::vector<std::vector<double>> values;
      int k = 0;
      for (Layout layout : kAllLayouts) {
        inputs.push_back(random_tensor(s, dt, uint64_t(k++), layout));
        values.push_back(values_of(inputs.back()));
      }
      const Tensor out = ops::stack(inputs, dim);
      Shape expected = s;
      expected.insert(expected.begin() + d, 3);
      CHECK(out.sizes() == expected);
      std::vector<double> ref(size_t(out.numel()));
      for (int64_t i = 0; i < out.numel(); ++i) {
        std::vector<int64_t> idx = unravel(i, expected);
        const int64_t j = idx[size_t(d)];
        idx.erase(idx.begin() + d);
        ref[size_t(i)] = values[size_t(j)][size_t(idx[0] * s[1] + idx[1])];
      }
      CAPTURE(dim);
      check_close(out, ref, 0.0, 0.0, "stack");
    }
  }
  const Tensor a = scalar_tensor(1.5), b = scalar_tensor(-2.0, kFloat64);
  const Tensor st = ops::stack({a, b});
  CHECK(st.sizes() == Shape{2});
  CHECK(st.dtype() == kFloat64);
  check_close(st, {1.5, -2.0}, 0.0, 0.0, "stack 0-d");
}

TEST_CASE("join: split, split_with_sizes and chunk return views of the right sizes") {
  const Shape shape = {4, 10, 3};
  const Tensor x = random_tensor(shape, kFloat32, 5, Layout::Transposed);
  const std::vector<double> vx = values_of(x);
  auto check_pieces = [&](const std::vector<Tensor>& pieces, const std::vector<int64_t>& lens, int64_t dim) {
    REQUIRE(pieces.size() == lens.size());
    int64_t start = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      CHECK(pieces[i].shares_storage(x));
      CHECK(pieces[i].size(dim) == lens[i]);
      check_close(pieces[i], narrow_reference(vx, shape, dim, start, lens[i]), 0.0, 0.0, "piece");
      start += lens[i];
    }
  };
  check_pieces(ops::split(x, 4, 1), {4, 4, 2}, 1);
  check_pieces(ops::split(x, 5, -2), {5, 5}, 1);
  check_pieces(ops::split(x, 20, 1), {10}, 1);
  check_pieces(ops::split(x, 1, 0), {1, 1, 1, 1}, 0);
  check_pieces(ops::split_with_sizes(x, {3, 0, 7}, 1), {3, 0, 7}, 1);
  check_pieces(ops::split_with_sizes(x, {2, 1}, -1), {2, 1}, 2);
  check_pieces(ops::chunk(x, 3, 1), {4, 4, 2}, 1);
  check_pieces(ops::chunk(x, 4, 2), {1, 1, 1}, 2);  // fewer chunks than asked, as torch.chunk
  check_pieces(ops::chunk(x, 6, 1), {2, 2, 2, 2, 2}, 1);
  check_pieces(ops::chunk(x, 1, 0), {4}, 0);

  // Empty dims: split gives one piece (split_size 0 allowed), chunk gives `chunks` pieces.
  const Tensor e = empty({2, 0});
  CHECK(ops::split(e, 0, 1).size() == 1);
  CHECK(ops::split(e, 3, 1).size() == 1);
  const auto ec = ops::chunk(e, 3, 1);
  CHECK(ec.size() == 3);
  for (const Tensor& t : ec) CHECK(t.sizes() == Shape{2, 0});

  // A split piece is a view: writing through it changes x.
  const Tensor y = random_tensor({6}, kFloat32, 3);
  ops::split(y, 4)[1].copy_(full({2}, 9.0));
  const std::vector<double> vy = values_of(y);
  CHECK(vy[4] == 9.0);
  CHECK(vy[5] == 9.0);
}

TEST_CASE("join: errors name the op, shapes and positions") {
  const Tensor a = zeros({2, 3}), b = zeros({3, 4}), c = zeros({2}), s = scalar_tensor(1.0);
  check_error([] { ops::cat({}); }, {"cat", "non-empty"});
  check_error([&] { ops::cat({a, b}, 1); }, {"cat", "float32[2, 3] cpu", "float32[3, 4] cpu", "position 1", "dim 0"});
  check_error([&] { ops::cat({a, b}, 0); }, {"cat", "match except in dim 0", "dim 1: 3 vs 4"});
  check_error([&] { ops::cat({a, c}, 0); }, {"cat", "same number of dims", "float32[2] cpu"});
  check_error([&] { ops::cat({a, s}, 0); }, {"cat", "zero-dimensional", "position 1"});
  check_error([&] { ops::cat({a, a}, 2); }, {"cat", "dim 2 out of range"});
  check_error([&] { ops::cat({a, a}, -3); }, {"cat", "dim -3"});
  check_error([&] { ops::cat({a, Tensor()}, 0); }, {"cat", "undefined", "position 1"});
  check_error([] { ops::stack({}); }, {"stack", "non-empty"});
  check_error([&] { ops::stack({a, b}); }, {"stack", "float32[2, 3] cpu", "float32[3, 4] cpu", "position 1"});
  check_error([&] { ops::stack({a, a}, 3); }, {"stack", "dim 3 out of range"});
  check_error([&] { ops::split(a, -1, 0); }, {"split", "split_size", "-1"});
  check_error([&] { ops::split(a, 0, 1); }, {"split", "split_size", "float32[2, 3] cpu"});
  check_error([&] { ops::split(s, 1, 0); }, {"split", "at least one dim"});
  check_error([&] { ops::split(a, 1, 2); }, {"split", "dim 2 out of range"});
  check_error([&] { ops::split_with_sizes(a, {1, 1}, 1); }, {"split_with_sizes", "[1, 1]", "sum to 2", "size 3"});
  check_error([&] { ops::split_with_sizes(a, {4, -1}, 1); }, {"split_with_sizes", "non-negative"});
  check_error([&] { ops::chunk(a, 0, 0); }, {"chunk", "positive", "0"});
  check_error([&] { ops::chunk(s, 2, 0); }, {"chunk", "at least one dim"});
}

TEST_CASE("join: sizes that add up past int64 are rejected, huge split sizes do not overflow") {
  const int64_t k62 = int64_t(1) << 62, kMax = std::numeric_limits<int64_t>::max();
  const Tensor big = ones({1}, kBool).expand({k62});  // a view: no memory behind its 2^62 bytes
  check_error([&] { ops::cat({big, big}, 0); }, {"cat", "add up past 2^63 - 1"});
  const Tensor x = from_vector(std::vector<float>{1, 2, 3});
  // (n + split_size - 1) / split_size once overflowed: one piece holding everything.
  const std::vector<Tensor> pieces = ops::split(x, kMax, 0);
  REQUIRE(pieces.size() == 1);
  CHECK(values_of(pieces[0]) == std::vector<double>{1, 2, 3});
  CHECK(ops::split(x, 2, 0).size() == 2);
  check_error(
      [&] {
        ops::split_with_sizes(x, {kMax, kMax, 5}, 0);
      },
      {"split_with_sizes", "add up to at most 2^63 - 1"});
}

// ---- the differentiable ops: autograd/ops/join.h ----------------------------------------

TEST_CASE("autograd shape: cat skips (0,) inputs and gives mixed-dtype inputs their gradients in their dtypes") {
  // Gradchecks of cat and stack in random layouts: the differentiable op table.
  const Tensor frozen = random_tensor({2, 3}, kFloat64, 40);
  // A (0,) input is skipped by cat and gets an empty gradient.
  check_gradcheck(
      [&](const TensorList& in) {
        return cat({in[0], in[1], frozen}, 1);
      },
      {leaf({0}, 45), leaf({2, 2}, 46)});
  check_gradcheck([&](const TensorList& in) { return cat({in[0], in[1]}, 0); }, {leaf({0}, 47), leaf({3}, 48)});
  // Mixed dtypes: the gradient of each input in its dtype.
  Tensor a = random_tensor({2}, kFloat32, 51), b = random_tensor({3}, kFloat16, 52);
  a.requires_grad_();
  b.requires_grad_();
  cat({a, b}).backward(from_vector(std::vector<double>{1, 2, 3, 4, 5}, {5}, kFloat32));
  CHECK(a.grad().dtype() == kFloat32);
  CHECK(b.grad().dtype() == kFloat16);
  CHECK(values_of(b.grad()) == std::vector<double>{3, 4, 5});
}

TEST_CASE("autograd shape: split, split_with_sizes and chunk are views with one node, unused pieces get zeros") {
  // Gradchecks with pieces left unused: the differentiable op table.
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
