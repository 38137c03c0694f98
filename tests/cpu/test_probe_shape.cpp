// Probes for silent wrong answers in the shape, join and index ops and their gradients:
// 0-d and size-0 tensors through every view method, view's refusal rule against a brute
// force search for strides, cat/stack/split/chunk on mixed layouts and dtypes, and
// gather/scatter_add/index_select/index_add/one_hot/embedding with int32, strided, 0-d,
// empty and smaller-than-input index tensors. References: float64 loops written here,
// PyTorch's documented behaviour (named where used), or finite differences (gradcheck).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/index.h"
#include "autograd/ops/join.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tensor/ops/index.h"
#include "tensor/ops/join.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// A contiguous float64 base of n seeded values and its host copy: views of it are read
/// back on the host through their own sizes, strides and offset (host_read).
struct Base {
  std::vector<double> v;
  Tensor t;
};
Base make_base(int64_t n, uint64_t seed) {
  std::vector<double> v = random_values(n, seed);
  return {v, from_vector(v, {n}, TensorOptions(kFloat64))};
}

/// The storage offset of every element of t, row-major.
std::vector<int64_t> offsets_of(const Tensor& t) {
  std::vector<int64_t> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const std::vector<int64_t> idx = unravel(i, t.sizes());
    int64_t off = t.storage_offset();
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
    out[size_t(i)] = off;
  }
  return out;
}

std::vector<double> host_read(const std::vector<double>& base, const Tensor& t) {
  std::vector<double> out;
  for (int64_t off : offsets_of(t)) out.push_back(base[size_t(off)]);
  return out;
}

/// Whether some strides make a tensor of `target` address exactly the storage elements
/// `offs` (row-major) does: the only candidate stride of a dim of size > 1 is the offset
/// step to its first neighbour; then every element is checked. A brute force, independent
/// of view()'s stride walk.
bool view_exists(const std::vector<int64_t>& offs, const Shape& target) {
  if (offs.empty()) return true;
  const Shape cs = contiguous_strides(target);
  Shape st(target.size(), 0);
  for (size_t d = 0; d < target.size(); ++d)
    if (target[d] > 1) st[d] = offs[size_t(cs[d])] - offs[0];
  for (size_t i = 0; i < offs.size(); ++i) {
    const std::vector<int64_t> idx = unravel(int64_t(i), target);
    int64_t off = offs[0];
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
    if (off != offs[i]) return false;
  }
  return true;
}

/// Every ordered factorization of n into `parts` factors (n > 0).
void factorizations(int64_t n, int parts, Shape& cur, std::vector<Shape>& out) {
  if (parts == 1) {
    cur.push_back(n);
    out.push_back(cur);
    cur.pop_back();
    return;
  }
  for (int64_t f = 1; f <= n; ++f) {
    if (n % f) continue;
    cur.push_back(f);
    factorizations(n / f, parts - 1, cur, out);
    cur.pop_back();
  }
}

/// n int64 values in [0, hi) as a vector.
std::vector<int64_t> random_indices(int64_t n, int64_t hi, uint64_t seed) {
  std::vector<int64_t> out;
  for (double v : random_values(n, seed, 0.0, double(hi))) out.push_back(std::min<int64_t>(int64_t(v), hi - 1));
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------------------

TEST_CASE("probe shape: 0-d tensors through size/stride/transpose/narrow/slice/unflatten/squeeze as PyTorch") {
  const Tensor s = scalar_tensor(2.5, kFloat64);
  // torch.Tensor.size(0) / stride(0) of a 0-d tensor: IndexError "dimension specified as 0
  // but tensor has no dimensions"; never a value read past the (empty) sizes.
  check_error([&] { (void)s.size(0); }, {"size", "0-d"});
  check_error([&] { (void)s.size(-1); }, {"size"});
  check_error([&] { (void)s.stride(0); }, {"stride"});
  // torch.transpose(t, 0, 0), (0, -1) on a 0-d tensor: the tensor itself (dims wrap as for
  // one dim); (0, 1) is out of range.
  CHECK(s.transpose(0, 0).dim() == 0);
  CHECK(s.transpose(-1, 0).item<double>() == 2.5);
  check_error([&] { s.transpose(0, 1); }, {"transpose"});
  // torch.narrow: "narrow() cannot be applied to a 0-dim tensor"; slicing (t[0:1]) a 0-d
  // tensor: "slice() cannot be applied to a 0-dim tensor"; unflatten needs a dim to split.
  check_error([&] { s.narrow(0, 0, 1); }, {"narrow", "0-d"});
  check_error([&] { s.narrow(-1, 0, 0); }, {"narrow", "0-d"});
  check_error([&] { s.slice(0, 0, 1); }, {"slice", "0-d"});
  check_error([&] { s.unflatten(0, {1}); }, {"unflatten", "0-d"});
  // torch.squeeze(t, 0 or -1) of a 0-d tensor is t; squeeze(t, 1) is "Dimension out of range
  // (expected to be in range of [-1, 0], but got 1)".
  CHECK(s.squeeze(0).dim() == 0);
  CHECK(s.squeeze(-1).dim() == 0);
  check_error([&] { s.squeeze(1); }, {"squeeze"});
  check_error([&] { s.squeeze(-2); }, {"squeeze"});
  check_error([&] { s.select(0, 0); }, {"select"});
  // What a 0-d tensor may do: unsqueeze at 0/-1, flatten to [1], expand, view/reshape to 1s, permute({}).
  CHECK(s.unsqueeze(0).sizes() == Shape{1});
  CHECK(s.unsqueeze(-1).sizes() == Shape{1});
  CHECK(s.flatten().sizes() == Shape{1});
  CHECK(s.permute({}).dim() == 0);
  CHECK(s.view({1, 1}).sizes() == Shape{1, 1});
  CHECK(s.reshape({-1}).sizes() == Shape{1});
  check_close(s.expand({2, 0, 3}), {}, 0, 0, "0-d expanded to a size-0 shape");
  check_close(s.expand({2, 3}), std::vector<double>(6, 2.5), 0, 0, "0-d expanded");
  // Gradient of a 0-d leaf through the view methods that accept it: d/ds sum(expand(s, 2, 3)) * 3.
  const Tensor leaf0 = leaf({}, 3);
  check_gradcheck(
      [](const TensorList& in) {
        return in[0].transpose(0, -1).unsqueeze(-1).expand({2, 3}).flatten().view({3, 2}).permute({1, 0});
      },
      {leaf0});
}

TEST_CASE("probe shape: view succeeds exactly where strides exist (brute force); reshape aliases then, else copies") {
  const Base base = make_base(720, 21);
  // Layouts users make: permutes, step slices, offsets, expands (stride 0), size-1 dims with odd strides.
  const Tensor x = base.t.view({4, 5, 6, 6});
  const std::vector<std::pair<std::string, Tensor>> layouts = {
      {"contiguous slice", x.narrow(0, 1, 2)},
      {"permute", x.narrow(2, 0, 2).permute({2, 0, 3, 1})},
      {"transpose last", x.select(0, 1).transpose(-1, -2)},
      {"step slice inner", x.select(1, 2).slice(-1, 1, 6, 2)},
      {"step slice outer", x.slice(0, 0, 4, 2).select(1, 0)},
      {"row slice", x.select(0, 3).narrow(1, 2, 3)},
      {"expand leading", x.select(0, 0).select(0, 1).narrow(0, 0, 1).expand({3, 6})},
      {"expand middle", x.select(0, 2).narrow(0, 0, 2).narrow(1, 0, 1).expand({2, 4, 6})},
      {"size-1 dims", x.narrow(0, 2, 1).narrow(2, 3, 1).permute({3, 2, 1, 0})},
      {"permute 3-d", x.select(3, 5).permute({1, 0, 2})},
      {"slice of transpose", x.select(0, 1).select(0, 1).t().narrow(0, 1, 4)},
  };
  int64_t views = 0, copies = 0;
  for (const auto& [name, t] : layouts) {
    const std::vector<int64_t> offs = offsets_of(t);
    const std::vector<double> ref = host_read(base.v, t);
    std::vector<Shape> targets;
    for (int parts = 1; parts <= 4; ++parts) {
      Shape cur;
      factorizations(t.numel(), parts, cur, targets);
    }
    for (const Shape& target : targets) {
      CAPTURE(name);
      CAPTURE(shape_str(target));
      const bool possible = view_exists(offs, target);
      bool viewed = true;
      Tensor v;
      try {
        v = t.view(target);
      } catch (const Error&) { viewed = false; }
      CHECK(viewed == possible);
      if (viewed) {
        CHECK(v.shares_storage(t));
        CHECK(host_read(base.v, v) == ref);  // the same elements, read through v's own strides
      }
      const Tensor r = t.reshape(target);
      CHECK(r.sizes() == target);
      CHECK(r.shares_storage(t) == possible);  // torch.reshape: a view when possible, else a copy
      check_close(r, ref, 0, 0, "reshape values");
      (possible ? views : copies) += 1;
    }
  }
  CHECK(views > 50);  // both branches were exercised
  CHECK(copies > 50);
}

TEST_CASE("probe shape: size-0 tensors through view(-1), reshape, flatten, unflatten, squeeze, permute, expand(-1)") {
  const Tensor z = zeros({2, 0, 3}, kFloat64).transpose(0, 2);  // (3, 0, 2), non-contiguous strides
  // torch: view(-1) of 0 elements is (0,); view(-1, 2) infers 0; view(0, -1) is ambiguous
  // ("shape '[0, -1]' is invalid for input of size 0").
  CHECK(z.view({-1}).sizes() == Shape{0});
  CHECK(z.view({-1, 2}).sizes() == Shape{0, 2});
  CHECK(z.reshape({3, -1}).sizes() == Shape{3, 0});
  check_error([&] { z.view({0, -1}); }, {"view"});
  check_error([&] { z.reshape({-1, 0}); }, {"reshape"});
  CHECK(z.view({5, 0, 7}).sizes() == Shape{5, 0, 7});
  CHECK(z.flatten().sizes() == Shape{0});
  CHECK(z.flatten(1).sizes() == Shape{3, 0});
  CHECK(z.flatten(0, 1).sizes() == Shape{0, 2});
  // torch.unflatten of a size-0 dim: (0, 4) and (4, 0) are fine, (-1, 4) infers 0.
  CHECK(z.unflatten(1, {0, 4}).sizes() == Shape{3, 0, 4, 2});
  CHECK(z.unflatten(1, {-1, 4}).sizes() == Shape{3, 0, 4, 2});
  CHECK(z.unflatten(0, {1, 3}).sizes() == Shape{1, 3, 0, 2});
  // squeeze keeps size-0 dims; squeeze(dim) of a size-0 dim is a no-op (torch).
  const Tensor z1 = zeros({1, 0, 1, 3}, kFloat64);
  CHECK(z1.squeeze().sizes() == Shape{0, 3});
  CHECK(z1.squeeze(1).sizes() == Shape{1, 0, 1, 3});
  CHECK(z1.squeeze(-2).sizes() == Shape{1, 0, 3});
  CHECK(z1.unsqueeze(2).sizes() == Shape{1, 0, 1, 1, 3});
  CHECK(z1.permute({3, 1, 0, 2}).sizes() == Shape{3, 0, 1, 1});
  CHECK(z1.permute({3, 1, 0, 2}).contiguous().sizes() == Shape{3, 0, 1, 1});
  // expand: -1 keeps a size (also 0); a size-1 dim may expand to 0; a new leading dim may be 0
  // but not -1 (torch: "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension").
  CHECK(z1.expand({2, -1, 0, 0, -1}).sizes() == Shape{2, 1, 0, 0, 3});
  CHECK(z1.expand({0, 1, 0, 1, 3}).sizes() == Shape{0, 1, 0, 1, 3});
  check_error([&] { z1.expand({-1, 1, 0, 1, 3}); }, {"expand"});
  check_error([&] { z1.expand({1, 2, 1, 3}); }, {"expand"});
  // Gradients through size-0 views: the leaf's grad has its shape and is all zero where nothing
  // flowed; a leaf of (1, 3) expanded to (0, 3) gets a zero gradient (sum over an empty dim).
  const Tensor w = leaf({1, 3}, 5);
  sum(mul(w.expand({0, 3}).t().reshape({-1}), 2.0)).backward();
  REQUIRE(w.grad().defined());
  check_close(w.grad(), {0, 0, 0}, 0, 0, "grad through expand to size 0");
}

TEST_CASE("probe shape: narrow/select/slice with negative starts and their gradients") {
  const Base base = make_base(60, 31);
  const Tensor x = base.t.view({3, 4, 5}).permute({2, 0, 1});  // (5, 3, 4)
  auto hv = [&](const Tensor& t) { return host_read(base.v, t); };
  // torch.narrow(x, 0, -2, 2) is x[-2:] ; narrow(x, -1, -4, 3) is x[..., 0:3].
  CHECK(hv(x.narrow(0, -2, 2)) == hv(x.slice(0, 3, 5)));
  CHECK(hv(x.narrow(-1, -4, 3)) == hv(x.slice(2, 0, 3)));
  CHECK(x.narrow(0, -5, 0).sizes() == Shape{0, 3, 4});
  check_error([&] { x.narrow(0, -6, 1); }, {"narrow"});
  check_error([&] { x.narrow(0, -2, 3); }, {"narrow"});
  // python slices: x[-3:-1], x[-100:2], x[1:-1:2], x[4:-4] (empty).
  CHECK(hv(x.slice(0, -3, -1)) == hv(x.slice(0, 2, 4)));
  CHECK(hv(x.slice(0, -100, 2)) == hv(x.slice(0, 0, 2)));
  CHECK(x.slice(0, 4, -4).sizes() == Shape{0, 3, 4});
  {
    const Tensor s = x.slice(-1, 1, -1, 2);  // x[..., 1:3:2] -> column 1
    REQUIRE(s.sizes() == Shape{5, 3, 1});
    std::vector<double> ref;
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 3; ++j) ref.push_back(base.v[size_t((j * 4 + 1) * 5 + i)]);
    CHECK(hv(s) == ref);
  }
  CHECK(hv(x.select(-2, -1)) == hv(x.select(1, 2)));
  // Gradients of chains with negative arguments, checked by finite differences.
  check_gradcheck(
      [](const TensorList& in) {
        const Tensor v = in[0].permute({2, 0, 1});
        return cat({v.narrow(0, -2, 2).select(-1, -1), v.slice(1, -2, 100, 1).select(0, -5)}, -1);
      },
      {leaf({3, 4, 5}, 32)});
}

// ---------------------------------------------------------------------------------------
// Joins and splits
// ---------------------------------------------------------------------------------------

TEST_CASE("probe join: cat of one input is a fresh copy; cat of mixed layouts, (0,) inputs and dtypes at dim -1") {
  const Base base = make_base(200, 41);
  // torch.cat([x]) returns a new tensor: writing x afterwards does not change it.
  Tensor x = base.t.narrow(0, 10, 12).view({3, 4});
  const Tensor c1 = ops::cat({x}, -1);
  CHECK_FALSE(c1.shares_storage(x));
  const Tensor c1t = ops::cat({x.t()}, 0);  // a transposed single input
  check_close(c1t, host_read(base.v, x.t()), 0, 0, "cat of one transposed input");
  const std::vector<double> before = host_read(base.v, x);
  x.copy_(zeros({3, 4}, kFloat64));
  check_close(c1, before, 0, 0, "cat([x]) after writing x");
  // Mixed: contiguous float64, transposed float32, expanded int32, (0,) float16 (skipped but
  // promoting: torch.cat's result type is torch.result_type over all inputs), (3, 0) bool.
  const Base b2 = make_base(200, 42);
  const Tensor a = b2.t.narrow(0, 0, 6).view({3, 2});
  const Tensor t = b2.t.narrow(0, 20, 12).view({4, 3}).t().to(kFloat32);  // (3, 4)
  const Tensor e = from_vector(std::vector<int32_t>{7, -8}, {1, 2}, kInt32).expand({3, 2});
  const Tensor skip = zeros({0}, kFloat16);
  const Tensor z = zeros({3, 0}, kBool);
  const Tensor out = ops::cat({a, skip, t, z, e}, -1);
  CHECK(out.dtype() == kFloat64);
  REQUIRE(out.sizes() == Shape{3, 8});
  const std::vector<double> av = host_read(b2.v, a);
  const std::vector<double> tv = values_of(t);
  std::vector<double> ref;
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 2; ++j) ref.push_back(av[size_t(i * 2 + j)]);
    for (int64_t j = 0; j < 4; ++j) ref.push_back(tv[size_t(i * 4 + j)]);
    ref.push_back(7);
    ref.push_back(-8);
  }
  check_close(out, ref, 0, 0, "cat mixed");
  // float16 + float32 -> float32; int32 + int64 -> int64; bool + int32 -> int32; a (0,) float64
  // among float32 inputs promotes the result to float64 (torch.result_type).
  CHECK(ops::cat({t.to(kFloat16), t}, 0).dtype() == kFloat32);
  CHECK(ops::cat({e, e.to(kInt64)}, 0).dtype() == kInt64);
  CHECK(ops::cat({z, e}, 1).dtype() == kInt32);
  CHECK(ops::cat({t, zeros({0}, kFloat64)}, 1).dtype() == kFloat64);
  // stack: a single input, 0-d inputs, (0,) inputs (not skipped: torch.stack of two (0,) is (2, 0)).
  CHECK(ops::stack({x}, -1).sizes() == Shape{3, 4, 1});
  check_close(ops::stack({scalar_tensor(1.0, kFloat64), scalar_tensor(2, kInt64)}, -1), {1, 2}, 0, 0, "stack 0-d");
  CHECK(ops::stack({zeros({0}), zeros({0})}, 0).sizes() == Shape{2, 0});
  CHECK(ops::stack({zeros({0}), zeros({0})}, -1).sizes() == Shape{0, 2});
  check_error([&] { ops::stack({zeros({2}), zeros({2})}, 2); }, {"stack"});
  check_error([&] { ops::cat({zeros({2}), scalar_tensor(1.0)}, 0); }, {"cat", "position 1"});
}

TEST_CASE("probe join: cat/stack gradients with transposed, expanded, repeated and mixed-dtype inputs") {
  // d/dx of cat(x.t(), y.expand, x) at -1, and of stack at every dim, by finite differences.
  check_gradcheck(
      [](const TensorList& in) {
        const Tensor xt = in[0].t();                    // (3, 2)
        const Tensor ye = in[1].expand({3, 4});         // (1, 4) -> (3, 4)
        const Tensor xs = in[0].view({3, 2});           // x again, other layout
        return cat({xt, zeros({0}, kFloat64), ye, xs, in[0].reshape({3, 2})}, -1);
      },
      {leaf({2, 3}, 51), leaf({1, 4}, 52)});
  for (int64_t dim = -3; dim <= 2; ++dim) {
    CAPTURE(dim);
    check_gradcheck([dim](const TensorList& in) { return stack({in[0], in[1].t(), in[0]}, dim); },
                    {leaf({2, 3}, 53), leaf({3, 2}, 54)});
  }
  // A float32 input among float64 ones gets its gradient in float32, with the float64 values
  // rounded once (the promoted result is float64): g = 3 everywhere here.
  const Tensor f = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}, kFloat32);
  f.requires_grad_();
  const Tensor d = leaf({2, 1}, 55);
  const Tensor out = cat({f.t(), d}, 1);
  CHECK(out.dtype() == kFloat64);
  sum(mul(out, 3.0)).backward();
  CHECK(f.grad().dtype() == kFloat32);
  check_close(f.grad(), {3, 3, 3, 3}, 0, 0, "float32 input grad");
  check_close(d.grad(), {3, 3}, 0, 0, "float64 input grad");
}

TEST_CASE("probe join: chunk and split piece counts and sizes follow torch's rules for every n and count") {
  for (int64_t n = 0; n <= 13; ++n) {
    const Tensor x = arange(n * 2).view({2, n}).t();  // (n, 2), non-contiguous
    for (int64_t chunks = 1; chunks <= 7; ++chunks) {
      CAPTURE(n);
      CAPTURE(chunks);
      // torch.chunk: split_size = ceil(n / chunks); pieces = ceil(n / split_size) for n > 0,
      // `chunks` empty pieces for n == 0 (so chunk(6, 4) gives 3 pieces of 2, not 4).
      const auto pieces = ops::chunk(x, chunks, 0);
      std::vector<int64_t> expected;
      if (n == 0) {
        expected.assign(size_t(chunks), 0);
      } else {
        const int64_t s = (n + chunks - 1) / chunks;
        for (int64_t start = 0; start < n; start += s) expected.push_back(std::min(s, n - start));
      }
      REQUIRE(pieces.size() == expected.size());
      int64_t start = 0;
      for (size_t i = 0; i < pieces.size(); ++i) {
        CHECK(pieces[i].sizes() == Shape{expected[i], 2});
        CHECK(pieces[i].shares_storage(x));
        std::vector<int64_t> ref;
        for (int64_t r = start; r < start + expected[i]; ++r) ref.insert(ref.end(), {r, n + r});
        CHECK(pieces[i].tolist<int64_t>() == ref);
        start += expected[i];
      }
      // torch.split(x, k): pieces of k, a shorter last; one empty piece when n == 0.
      const auto sp = ops::split(x, chunks, -2);
      const size_t count = n == 0 ? 1 : size_t((n + chunks - 1) / chunks);
      REQUIRE(sp.size() == count);
      if (n > 0) CHECK(sp.back().size(0) == n - int64_t(count - 1) * chunks);
    }
  }
}

TEST_CASE("probe join: split/chunk gradients with pieces reordered, reused, partly unused, in float64 and float32") {
  // Pieces joined back in another order or along another dim are not adjacent views of one
  // buffer; pieces joined in order are (Note [Split backward without a copy]). Both must match
  // finite differences.
  check_gradcheck(
      [](const TensorList& in) {
        const auto p = chunk(in[0].t(), 4, 0);  // (7, 3) -> 2, 2, 2, 1
        return cat({p[3], p[1], p[0], p[1]}, 0);
      },
      {leaf({3, 7}, 61)});
  check_gradcheck(
      [](const TensorList& in) {
        const auto p = split(in[0], 2, -1);  // (3, 5) -> 2, 2, 1 columns
        return cat({p[0], p[1], p[2]}, -1);  // adjacent, in order
      },
      {leaf({3, 5}, 62)});
  check_gradcheck(
      [](const TensorList& in) {
        const auto p = split_with_sizes(in[0], {1, 0, 3, 2}, 1);  // (2, 6)
        return add(mul(p[2].narrow(1, 0, 2), p[3]), p[0].expand({2, 2}));
      },
      {leaf({2, 6}, 63)});
  check_gradcheck(
      [](const TensorList& in) {
        const auto p = chunk(in[0], 3, 0);  // (6, 2) -> 2, 2, 2 rows
        return cat({p[0], p[1], p[2]}, 1);  // in order, but along another dim
      },
      {leaf({6, 2}, 64)});
  // float32 input: every piece's gradient lands in its rows, unused pieces get zeros.
  const Tensor x = from_vector(std::vector<double>(10, 1.0), {5, 2}, kFloat32);
  x.requires_grad_();
  const auto p = chunk(x, 3, 0);  // 2, 2, 1
  REQUIRE(p.size() == 3);
  sum(add(mul(p[2], 5.0), mul(p[0].narrow(0, 1, 1), 2.0))).backward();
  check_close(x.grad(), {0, 0, 2, 2, 0, 0, 0, 0, 5, 5}, 0, 0, "chunk grad");
  CHECK(x.grad().dtype() == kFloat32);
}

// ---------------------------------------------------------------------------------------
// Index ops
// ---------------------------------------------------------------------------------------

TEST_CASE("probe index: gather with an int32 transposed index smaller than the input, longer along dim; gradient") {
  const Base base = make_base(200, 71);
  const Tensor x = base.t.narrow(0, 5, 60).view({5, 3, 4}).permute({1, 2, 0});  // (3, 4, 5)
  const std::vector<double> xv = host_read(base.v, x);
  auto xat = [&](int64_t i, int64_t j, int64_t k) { return xv[size_t((i * 4 + j) * 5 + k)]; };
  // torch.gather: index.size(d) <= input.size(d) for d != dim; along dim any length.
  for (int64_t dim : {0, 1, 2, -1}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    const Shape xs = x.sizes();
    Shape is = {2, 3, 2};
    is[size_t(d)] = 7;  // longer than x along dim
    // Build the index transposed in memory: int32 values in [0, xs[d]).
    const Shape ist = {is[2], is[1], is[0]};
    const std::vector<int64_t> iv64 = random_indices(numel_of(is), xs[size_t(d)], uint64_t(72 + d));
    std::vector<int32_t> iv(iv64.begin(), iv64.end());
    const Tensor idx = from_vector(iv, ist, kInt32).permute({2, 1, 0});  // shape `is`, strided
    const std::vector<int64_t> ivals = idx.tolist<int64_t>();
    const Tensor out = ops::gather(x, dim, idx);
    REQUIRE(out.sizes() == is);
    std::vector<double> ref;
    for (int64_t i = 0; i < numel_of(is); ++i) {
      std::vector<int64_t> id = unravel(i, is);
      id[size_t(d)] = ivals[size_t(i)];
      ref.push_back(xat(id[0], id[1], id[2]));
    }
    CAPTURE(dim);
    check_close(out, ref, 0, 0, "gather");
    // Gradient: scatter-add of g at the gathered positions, duplicates accumulating.
    check_gradcheck([dim, idx](const TensorList& in) { return gather(in[0].permute({1, 2, 0}), dim, idx); },
                    {leaf({5, 3, 4}, 73)});
  }
  // torch.gather refuses negative indices ("index -1 is out of bounds for dimension 0 with size 5").
  check_error([&] { ops::gather(x, 2, full({1, 1, 1}, -1.0, kInt32)); }, {"gather", "-1"});
  // A larger index than the input in a non-gathered dim is refused.
  check_error([&] { ops::gather(x, 2, zeros({4, 1, 1}, kInt32)); }, {"gather"});
}

TEST_CASE("probe index: scatter_add with an index smaller than src and self; gradients of self and src") {
  const Base base = make_base(100, 81);
  const Tensor self = base.t.narrow(0, 0, 20).view({5, 4}).t();  // (4, 5), transposed
  const Tensor src = base.t.narrow(0, 40, 18).view({3, 6});      // (3, 6): larger than index
  const Tensor idx = from_vector(std::vector<int64_t>{3, 3, 0, 1, 3, 0, 4, 4}, {2, 4}, kInt64);  // dim 1 values < 5
  // torch.scatter_add(self, 1, idx, src): self[i][idx[i][j]] += src[i][j] for idx's extent.
  const Tensor out = ops::scatter_add(self, 1, idx, src);
  std::vector<double> ref = host_read(base.v, self);
  const std::vector<double> sv = host_read(base.v, src);
  const std::vector<int64_t> iv = idx.tolist<int64_t>();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 4; ++j) ref[size_t(i * 5 + iv[size_t(i * 4 + j)])] += sv[size_t(i * 6 + j)];
  check_close(out, ref, 1e-15, 1e-15, "scatter_add");
  // dim 0 with a (2, 3) int32 index on a (4, 5) self: columns 3, 4 untouched.
  const Tensor idx0 = from_vector(std::vector<int32_t>{3, 0, 3, 3, 1, 0}, {2, 3}, kInt32);
  const Tensor out0 = ops::scatter_add(self, -2, idx0, src);
  std::vector<double> ref0 = host_read(base.v, self);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) ref0[size_t(idx0.tolist<int32_t>()[size_t(i * 3 + j)] * 5 + j)] += sv[size_t(i * 6 + j)];
  check_close(out0, ref0, 1e-15, 1e-15, "scatter_add dim -2");
  // Gradients: self gets g, src gets g gathered at idx and zeros beyond idx's extent.
  check_gradcheck([idx](const TensorList& in) { return scatter_add(in[0].t(), 1, idx, in[1]); },
                  {leaf({5, 4}, 82), leaf({3, 6}, 83)});
  check_gradcheck([idx0](const TensorList& in) { return scatter_add(in[0], -2, idx0, in[1].t()); },
                  {leaf({4, 5}, 84), leaf({6, 3}, 85)});
  // An empty index leaves self as it was (a copy), and src's gradient all zero.
  const Tensor e = ops::scatter_add(self, 0, zeros({0, 5}, kInt64), src.narrow(1, 0, 5));
  check_close(e, host_read(base.v, self), 0, 0, "scatter_add with an empty index");
  CHECK_FALSE(e.shares_storage(self));
  check_gradcheck([](const TensorList& in) { return scatter_add(in[0], 1, zeros({2, 0}, kInt32), in[1]); },
                  {leaf({2, 3}, 86), leaf({2, 2}, 87)});
}

TEST_CASE("probe index: index_select/index_add with int32 strided and 0-d indices, 0-d inputs; gradients") {
  const Base base = make_base(100, 91);
  const Tensor x = base.t.narrow(0, 0, 24).view({4, 6}).t();  // (6, 4)
  const std::vector<double> xv = host_read(base.v, x);
  // An int32 index read through a step-3 view, with repeats.
  const Tensor idx =
      from_vector(std::vector<int32_t>{5, -9, -9, 0, -9, -9, 5, -9, -9, 2, -9, -9}, {12}, kInt32).slice(0, 0, 12, 3);
  const std::vector<int64_t> iv = {5, 0, 5, 2};
  const Tensor sel = ops::index_select(x, 0, idx);
  std::vector<double> ref;
  for (int64_t k : iv)
    for (int64_t c = 0; c < 4; ++c) ref.push_back(xv[size_t(k * 4 + c)]);
  check_close(sel, ref, 0, 0, "index_select int32 strided");
  // A 0-d index keeps the dim with size 1 (torch.index_select(x, 1, tensor(3)) is (6, 1)).
  const Tensor s0 = ops::index_select(x, -1, scalar_tensor(3, kInt32));
  REQUIRE(s0.sizes() == Shape{6, 1});
  std::vector<double> ref0;
  for (int64_t r = 0; r < 6; ++r) ref0.push_back(xv[size_t(r * 4 + 3)]);
  check_close(s0, ref0, 0, 0, "index_select 0-d index");
  // A 0-d input with a one-element index gives a 0-d result.
  const Tensor z = ops::index_select(scalar_tensor(4.5, kFloat64), 0, from_vector(std::vector<int64_t>{0}, {1}));
  CHECK(z.dim() == 0);
  CHECK(z.item<double>() == 4.5);
  // index_add of a transposed src with repeats along dim 1, 0-d index.
  const Tensor src = base.t.narrow(0, 50, 24).view({4, 6}).t();  // (6, 4)
  const std::vector<double> srcv = host_read(base.v, src);
  const Tensor ia = ops::index_add(x, 1, from_vector(std::vector<int32_t>{3, 0, 3, 3}, {4}, kInt32), src);
  std::vector<double> iaref = xv;
  const int64_t cols[] = {3, 0, 3, 3};
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t k = 0; k < 4; ++k) iaref[size_t(r * 4 + cols[k])] += srcv[size_t(r * 4 + k)];
  check_close(ia, iaref, 1e-15, 1e-15, "index_add");
  const Tensor ia0 = ops::index_add(x, 0, scalar_tensor(2, kInt64), src.narrow(0, 1, 1));
  std::vector<double> ia0ref = xv;
  for (int64_t c = 0; c < 4; ++c) ia0ref[size_t(2 * 4 + c)] += srcv[size_t(1 * 4 + c)];
  check_close(ia0, ia0ref, 1e-15, 1e-15, "index_add 0-d index");
  // Gradients by finite differences, incl. the 0-d input and index.
  check_gradcheck([idx](const TensorList& in) { return index_select(in[0].t(), 0, idx); }, {leaf({4, 6}, 92)});
  check_gradcheck([](const TensorList& in) { return index_select(in[0], -1, scalar_tensor(0, kInt32)); },
                  {leaf({}, 93)});
  check_gradcheck(
      [](const TensorList& in) {
        return index_add(in[0].t(), 1, from_vector(std::vector<int32_t>{3, 0, 3, 3}, {4}, kInt32), in[1].t());
      },
      {leaf({4, 6}, 94), leaf({4, 6}, 95)});
  check_gradcheck([](const TensorList& in) { return index_add(in[0], 0, scalar_tensor(2, kInt64), in[1]); },
                  {leaf({3, 2}, 96), leaf({1, 2}, 97)});
}

TEST_CASE("probe index: empty index tensors give torch's shapes and zero gradients; empty sources still check indices") {
  const Tensor x = leaf({3, 4}, 101);
  // torch.index_select(x, 0, empty) is (0, 4); its gradient is zero.
  const Tensor sel = index_select(x, 0, zeros({0}, kInt32));
  CHECK(sel.sizes() == Shape{0, 4});
  sum(sel).backward();
  REQUIRE(x.grad().defined());
  check_close(x.grad(), std::vector<double>(12, 0.0), 0, 0, "index_select empty grad");
  // gather with an empty index: (3, 0); embedding of (2, 0) indices: (2, 0, D).
  CHECK(ops::gather(x.detach(), 1, zeros({3, 0}, kInt64)).sizes() == Shape{3, 0});
  CHECK(ops::gather(x.detach(), 0, zeros({0, 4}, kInt64)).sizes() == Shape{0, 4});
  CHECK(ops::embedding(x.detach(), zeros({2, 0}, kInt32)).sizes() == Shape{2, 0, 4});
  CHECK(ops::embedding(x.detach(), scalar_tensor(2, kInt32)).sizes() == Shape{4});
  check_close(ops::embedding(x.detach(), scalar_tensor(2, kInt32)), values_of(x.detach().select(0, 2)), 0, 0,
              "embedding of a 0-d index");
  // index_add with an empty index: self unchanged.
  check_close(ops::index_add(x.detach(), 1, zeros({0}, kInt64), zeros({3, 0}, kFloat64)), values_of(x), 0, 0,
              "index_add empty");
  // one_hot of an empty index with num_classes: (0, C) / (2, 0, C); inferring C from nothing is refused.
  CHECK(ops::one_hot(zeros({0}, kInt32), 3).sizes() == Shape{0, 3});
  CHECK(ops::one_hot(zeros({2, 0}, kInt64), 5).sizes() == Shape{2, 0, 5});
  check_error([&] { ops::one_hot(zeros({0}, kInt64)); }, {"one_hot"});
  // Selecting from an empty dim with a non-empty index is an error, not an empty result.
  check_error([&] { ops::index_select(zeros({0, 2}), 0, zeros({1}, kInt64)); }, {"index_select", "0"});
  check_error([&] { ops::gather(zeros({2, 0}), 1, zeros({2, 1}, kInt64)); }, {"gather"});
  check_error([&] { ops::embedding(zeros({0, 3}), zeros({2}, kInt32)); }, {"embedding"});
  // Nothing to write (D = 0) does not skip the index check.
  check_error([&] { ops::embedding(zeros({4, 0}), from_vector(std::vector<int64_t>{4}, {1})); }, {"embedding", "4"});
  check_error([&] { ops::index_select(zeros({3, 0}), 0, from_vector(std::vector<int64_t>{-1}, {1})); },
              {"index_select", "-1"});
}

TEST_CASE("probe index: one_hot and embedding with int32 non-contiguous indices; embedding gradient") {
  // one_hot of a transposed int32 index, num_classes inferred (max + 1) and given.
  const std::vector<int32_t> v = {2, 0, 4, 1, 1, 3};
  const Tensor ids = from_vector(v, {2, 3}, kInt32).t();  // (3, 2): [[2,1],[0,1],[4,3]]
  const std::vector<int64_t> order = {2, 1, 0, 1, 4, 3};
  const Tensor oh = ops::one_hot(ids);
  REQUIRE(oh.sizes() == Shape{3, 2, 5});
  CHECK(oh.dtype() == kInt64);
  std::vector<int64_t> ref(30, 0);
  for (size_t i = 0; i < order.size(); ++i) ref[i * 5 + size_t(order[i])] = 1;
  CHECK(oh.tolist<int64_t>() == ref);
  CHECK(ops::one_hot(ids, 7).sizes() == Shape{3, 2, 7});
  check_error([&] { ops::one_hot(ids, 4); }, {"one_hot", "4"});
  check_error([&] { ops::one_hot(from_vector(std::vector<int64_t>{1, -1}, {2})); }, {"one_hot", "-1"});
  // embedding of the same transposed ids on a strided weight, and its gradient.
  const Base base = make_base(100, 111);
  const Tensor w = base.t.narrow(0, 0, 30).view({3, 10}).t().slice(0, 0, 10, 2);  // (5, 3)
  const std::vector<double> wv = host_read(base.v, w);
  const Tensor e = ops::embedding(w, ids);
  REQUIRE(e.sizes() == Shape{3, 2, 3});
  std::vector<double> eref;
  for (int64_t k : order)
    for (int64_t c = 0; c < 3; ++c) eref.push_back(wv[size_t(k * 3 + c)]);
  check_close(e, eref, 0, 0, "embedding");
  for (int64_t pad : {-1, 1, 4}) {
    CAPTURE(pad);
    // Finite differences see the padding row; embedding's gradient leaves it zero (torch's
    // padding_idx), so compare with a reference that zeroes that row instead.
    if (pad < 0) {
      check_gradcheck([ids](const TensorList& in) { return embedding(in[0].t(), ids); }, {leaf({3, 5}, 112)});
      continue;
    }
    const Tensor wl = leaf({5, 3}, 113);
    const Tensor g = from_vector(random_values(18, 114), {3, 2, 3}, kFloat64);
    sum(mul(embedding(wl, ids, pad), g)).backward();
    const std::vector<double> gv = values_of(g);
    std::vector<double> gref(15, 0.0);
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i] != pad)
        for (size_t c = 0; c < 3; ++c) gref[size_t(order[i]) * 3 + c] += gv[i * 3 + c];
    check_close(wl.grad(), gref, 1e-15, 1e-15, "embedding grad with padding_idx");
  }
}
