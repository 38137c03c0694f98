// flip, repeat, tril/triu and pad (autograd/ops/shape_ops.h), cumsum (the raw op and the
// differentiable one) and logsumexp against naive loops in double, on contiguous,
// transposed and strided inputs, size-0 dims, 0-d tensors, negative dims and integer
// inputs where PyTorch takes them; gradients through gradcheck in float64; errors that name
// the op.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/cumsum.h"
#include "autograd/ops/logsumexp.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape_ops.h"
#include "autograd/ops/softmax.h"
#include "tensor/factory.h"
#include "tensor/ops/cumsum.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};
constexpr double kInf = std::numeric_limits<double>::infinity();

using Index = std::vector<int64_t>;

/// The values of a tensor of `shape` whose element at each index is at(index).
std::vector<double> build(const Shape& shape, const std::function<double(const Index&)>& at) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (int64_t i = 0; i < int64_t(v.size()); ++i) v[size_t(i)] = at(unravel(i, shape));
  return v;
}

int64_t wrap(int64_t d, int64_t n) { return d < 0 ? d + n : d; }

// ---- references -----------------------------------------------------------------------

// reverse: the sums run from the end of the dim (ops::reverse_cumsum).
std::vector<double> ref_cumsum(const std::vector<double>& x, const Shape& s, int64_t dim, bool reverse = false) {
  if (s.empty()) return x;
  const size_t d = size_t(dim);
  return build(s, [&](const Index& i) {
    Index j = i;
    double acc = 0.0;
    for (j[d] = reverse ? i[d] : 0; j[d] < (reverse ? s[d] : i[d] + 1); ++j[d]) acc += x[size_t(ravel(j, s))];
    return acc;
  });
}

std::vector<double> ref_flip(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& dims) {
  return build(s, [&](const Index& i) {
    Index j = i;
    for (int64_t d : dims) {
      const size_t w = size_t(wrap(d, int64_t(s.size())));
      j[w] = s[w] - 1 - i[w];
    }
    return x[size_t(ravel(j, s))];
  });
}

std::vector<double> ref_repeat(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& reps,
                               Shape& out_shape) {
  const size_t lead = reps.size() - s.size();
  out_shape.clear();
  for (size_t d = 0; d < reps.size(); ++d) out_shape.push_back(reps[d] * (d < lead ? 1 : s[d - lead]));
  return build(out_shape, [&](const Index& i) {
    Index j(s.size());
    for (size_t d = 0; d < s.size(); ++d) j[d] = i[lead + d] % s[d];
    return x[size_t(ravel(j, s))];
  });
}

std::vector<double> ref_triangle(const std::vector<double>& x, const Shape& s, int64_t diagonal, bool upper) {
  return build(s, [&](const Index& i) {
    const int64_t off = i[s.size() - 1] - i[s.size() - 2];
    const bool keep = upper ? off >= diagonal : off <= diagonal;
    return keep ? x[size_t(ravel(i, s))] : 0.0;
  });
}

// mode: 0 constant, 1 reflect, 2 replicate, 3 circular.
std::vector<double> ref_pad(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& pad, int mode,
                            double value, Shape& out_shape) {
  out_shape = s;
  const size_t nd = s.size();
  for (size_t k = 0; k < pad.size() / 2; ++k) out_shape[nd - 1 - k] += pad[2 * k] + pad[2 * k + 1];
  return build(out_shape, [&](const Index& o) {
    Index j = o;
    for (size_t k = 0; k < pad.size() / 2; ++k) {
      const size_t d = nd - 1 - k;
      const int64_t n = s[d];
      int64_t i = o[d] - pad[2 * k];
      if (mode == 1) i = i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i;
      if (mode == 2) i = std::min(std::max<int64_t>(i, 0), n - 1);
      if (mode == 3) {  // crop, then wrap the entries left
        const int64_t crop_l = std::max<int64_t>(-pad[2 * k], 0);
        const int64_t kept = n - crop_l - std::max<int64_t>(-pad[2 * k + 1], 0);
        const int64_t w = o[d] - std::max<int64_t>(pad[2 * k], 0);
        i = crop_l + ((w % kept) + kept) % kept;
      }
      if (i < 0 || i >= n) return value;
      j[d] = i;
    }
    return x[size_t(ravel(j, s))];
  });
}

// Over the dims in `reduced` (wrapped), keepdim.
std::vector<double> ref_logsumexp(const std::vector<double>& x, const Shape& s, const std::vector<bool>& reduced,
                                  Shape& kept) {
  kept = s;
  for (size_t d = 0; d < s.size(); ++d)
    if (reduced[d]) kept[d] = 1;
  std::vector<double> m(size_t(numel_of(kept)), -kInf), sum(m.size(), 0.0);
  const auto out_of = [&](const Index& i) {
    Index k = i;
    for (size_t d = 0; d < s.size(); ++d)
      if (reduced[d]) k[d] = 0;
    return size_t(ravel(k, kept));
  };
  for (int64_t i = 0; i < int64_t(x.size()); ++i) {
    const size_t o = out_of(unravel(i, s));
    m[o] = std::max(m[o], x[size_t(i)]);
  }
  for (int64_t i = 0; i < int64_t(x.size()); ++i) {
    const size_t o = out_of(unravel(i, s));
    sum[o] += std::exp(x[size_t(i)] - (std::isinf(m[o]) ? 0.0 : m[o]));
  }
  std::vector<double> out(m.size());
  for (size_t o = 0; o < m.size(); ++o) out[o] = std::log(sum[o]) + (std::isinf(m[o]) ? 0.0 : m[o]);
  return out;
}

/// Every value of v rounded through dtype dt (the values an input of dt holds).
std::vector<double> rounded(const std::vector<double>& v, DType dt) {
  return values_of(from_vector(v, {int64_t(v.size())}, TensorOptions(kFloat64)).to(dt));
}

}  // namespace

// ---- cumsum -----------------------------------------------------------------------------

TEST_CASE("shape_ops: cumsum along every dim, dtype and layout") {
  const Shape shape = {3, 4, 5};
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      for (int64_t dim = -3; dim < 3; ++dim) {
        CAPTURE(name_of(dt, layout));
        CAPTURE(dim);
        const Tensor x = random_tensor(shape, dt, 5, layout);
        const Tensor out = ops::cumsum(x, dim);
        CHECK(out.dtype() == dt);
        CHECK(out.sizes() == shape);
        // 16-bit: summed in float32, each output rounded once.
        check_close(out, ref_cumsum(values_of(x), shape, wrap(dim, 3)), default_rtol(dt), 4 * default_rtol(dt));
        check_close(cumsum(x, dim), values_of(out), 0.0, 0.0, "differentiable cumsum");
        const Tensor back = ops::reverse_cumsum(x, dim);
        CHECK(back.dtype() == dt);
        check_close(back, ref_cumsum(values_of(x), shape, wrap(dim, 3), true), default_rtol(dt), 4 * default_rtol(dt),
                    "reverse_cumsum");
      }
    }
  }
}

TEST_CASE("shape_ops: cumsum of 16-bit values sums in float32") {
  // 3000 ones: a float16 running sum stops at 2048 (2048 + 1 rounds back to 2048).
  const Tensor out = ops::cumsum(ones({3000}, kFloat16), 0);
  CHECK(out.dtype() == kFloat16);
  const std::vector<double> v = values_of(out);
  CHECK(v[2047] == 2048.0);
  CHECK(v.back() == 3000.0);
  CHECK(values_of(ops::cumsum(ones({3000}, kBFloat16), 0)).back() == 3008.0);  // 3000 rounded to bfloat16
}

TEST_CASE("shape_ops: float32 cumsum keeps a float64 running total, as PyTorch's CPU kernel") {
  // 10^6 entries of 0.1f: a float32 running total drifts by about 1% by the end; a float64
  // one rounds each prefix once. Both directions, and across chunk boundaries.
  const int64_t n = 1000000;
  const double tenth = double(0.1f);
  for (bool reverse : {false, true}) {
    CAPTURE(reverse);
    const Tensor x = full({n}, 0.1, kFloat32);
    const std::vector<float> v = (reverse ? ops::reverse_cumsum(x, 0) : ops::cumsum(x, 0)).tolist<float>();
    for (int64_t k : {ops::kCumsumChunk - 1, ops::kCumsumChunk, int64_t(123456), n - 1}) {
      const int64_t terms = reverse ? n - k : k + 1;
      CHECK(std::abs(double(v[size_t(k)]) - double(terms) * tenth) <= 1e-7 * double(terms) * tenth);
    }
  }
}

TEST_CASE("shape_ops: a long float64 cumsum (and cumprod) adds in Note [Cumulative sum order]'s order, bit for bit") {
  // 3 spans and a part: chunk carries restart at each span; the span carries add the spans'
  // totals in order. float64 in and out, so the running total's bits are the output's.
  // cumprod multiplies in the same order (factors near 1 keep the products finite).
  const int64_t chunk = ops::kCumsumChunk, span = chunk * ops::kCumsumSpan, n = 3 * span + 517;
  for (bool product : {false, true}) {
    const std::vector<double> v = product ? random_values(n, 32, 0.999, 1.001) : random_values(n, 31, -1.0, 1.0);
    const auto combine = [product](double a, double b) { return product ? a * b : a + b; };
    const double identity = product ? 1.0 : 0.0;
    for (bool reverse : product ? std::vector<bool>{false} : std::vector<bool>{false, true}) {
      CAPTURE(product);
      CAPTURE(reverse);
      std::vector<double> expected(static_cast<size_t>(n));
      double span_carry = identity, chunk_carry = identity, local = identity;
      for (int64_t step = 0; step < n; ++step) {
        if (step > 0 && step % chunk == 0) {
          chunk_carry = combine(chunk_carry, local), local = identity;
          if (step % span == 0) span_carry = combine(span_carry, chunk_carry), chunk_carry = identity;
        }
        const size_t j = size_t(reverse ? n - 1 - step : step);
        local = combine(local, v[j]);
        expected[j] = combine(combine(span_carry, chunk_carry), local);
      }
      const Tensor x = make_tensor(v, {n}, kFloat64);
      const Tensor out = product ? ops::cumprod(x, 0) : reverse ? ops::reverse_cumsum(x, 0) : ops::cumsum(x, 0);
      const std::vector<double> got = out.tolist<double>();
      int64_t differs_from_one_fold = 0, mismatches = 0;
      double fold = identity;
      for (int64_t step = 0; step < n; ++step) {
        const size_t j = size_t(reverse ? n - 1 - step : step);
        fold = combine(fold, v[j]);
        mismatches += got[j] != expected[j];
        differs_from_one_fold += fold != expected[j];
      }
      CHECK(mismatches == 0);
      CHECK(differs_from_one_fold > 0);  // the order is visible in these values: the check can fail
    }
  }
}

TEST_CASE("shape_ops: cumsum of integers and bool gives int64") {
  const std::vector<double> v = {3, -1, 7, 2000000000, 2000000000, -5};
  for (DType dt : {kInt32, kInt64}) {
    const Tensor x = make_tensor(v, {2, 3}, dt, Layout::Transposed);
    for (int64_t dim : {0, 1, -1}) {
      const Tensor out = cumsum(x, dim);
      CHECK(out.dtype() == kInt64);
      check_close(out, ref_cumsum(v, {2, 3}, wrap(dim, 2)), 0.0, 0.0, name_of(dt));  // no int32 wrap
    }
  }
  const std::vector<double> b = {1, 0, 1, 1, 0, 1, 1, 1};
  const Tensor out = ops::cumsum(make_tensor(b, {8}, kBool), 0);
  CHECK(out.dtype() == kInt64);
  check_close(out, ref_cumsum(b, {8}, 0), 0.0, 0.0, "bool");
}

TEST_CASE("shape_ops: cumsum's dtype converts the input first, as torch.cumsum(dtype=)") {
  // 3000 float16 ones summed into float32: exact, where float16 prefixes stop at 2048 past 2^11.
  const Tensor h = ones({3000}, kFloat16);
  const Tensor f = ops::cumsum(h, 0, kFloat32);
  CHECK(f.dtype() == kFloat32);
  CHECK(values_of(f).back() == 3000.0);
  // A float16 value that float32 keeps: converted before the sums, not after.
  const Tensor x = random_tensor({4, 6}, kFloat16, 21, Layout::Transposed);
  check_close(cumsum(x, 1, kFloat64), ref_cumsum(values_of(x), {4, 6}, 1), 1e-15, 1e-15, "float16 into float64");
  // int64 into int32 wraps as int32 does; floats into int64 truncate each value first.
  const Tensor big = make_tensor({2147483647, 1, 5}, {3}, kInt64);
  CHECK(ops::cumsum(big, 0, kInt32).dtype() == kInt32);
  const int32_t lowest = std::numeric_limits<int32_t>::min();
  CHECK(ops::cumsum(big, 0, kInt32).tolist<int32_t>() == std::vector<int32_t>{2147483647, lowest, -2147483643});
  CHECK(ops::cumsum(make_tensor({1.7, -0.5, 2.9}, {3}, kFloat32), 0, kInt64).tolist<int64_t>() ==
        std::vector<int64_t>{1, 1, 3});
  CHECK(ops::cumsum(make_tensor({1, 2}, {2}, kInt32), 0, kInt32).dtype() == kInt32);
  // Its gradient comes back in x's dtype; an integral result cannot carry one.
  const Tensor leaf_h = make_tensor({1, 2, 3}, {3}, kFloat16).requires_grad_();
  sum(cumsum(leaf_h, 0, kFloat32)).backward();
  CHECK(leaf_h.grad().dtype() == kFloat16);
  check_close(leaf_h.grad(), {3, 2, 1}, 0.0, 0.0, "gradient in float16");
  check_error([&] { cumsum(leaf_h, 0, kInt64); }, {"cumsum", "requires grad", "int64"});
  check_error([] { ops::cumsum(zeros({2}), 0, kUInt8); }, {"cumsum", "uint8"});
  check_error([] { ops::cumsum(zeros({2}), 1, kFloat64); }, {"cumsum", "dim 1", "float32[2]"});
}

TEST_CASE("shape_ops: cumsum of 0-d and size-0 tensors, and its errors") {
  const Tensor s = scalar_tensor(2.5, kFloat32);
  CHECK(ops::cumsum(s, 0).dim() == 0);
  CHECK(ops::cumsum(s, -1).item<float>() == 2.5f);
  for (int64_t dim : {0, 1, 2}) {
    const Tensor out = ops::cumsum(zeros({2, 0, 3}, kFloat32), dim);
    CHECK(out.sizes() == Shape{2, 0, 3});
  }
  CHECK(ops::cumsum(zeros({0}, kInt32), 0).dtype() == kInt64);
  check_error([&] { ops::cumsum(s, 1); }, {"cumsum", "dim 1", "float32[]"});
  check_error([&] { cumsum(zeros({2, 3}), -3); }, {"cumsum", "dim -3", "float32[2, 3]"});
  check_error([&] { cumsum(Tensor(), 0); }, {"cumsum", "undefined"});
}

TEST_CASE("shape_ops: cumsum's gradient is the reversed cumsum of g") {
  const Tensor x = leaf({4, 3, 2}, 7);
  for (int64_t dim = -3; dim < 3; ++dim) {
    CAPTURE(dim);
    check_gradcheck([dim](const TensorList& in) { return cumsum(in[0].transpose(0, 2), dim); }, {x});
  }
  Tensor y = cumsum(x, 1);
  CHECK(y.grad_fn_name() == "CumsumBackward");
  // sum(cumsum(v)) weighs v[k] by the number of prefixes holding it: n - k.
  const Tensor v = leaf({5}, 3);
  sum(cumsum(v, 0)).backward();
  check_close(v.grad(), {5, 4, 3, 2, 1}, 0.0, 0.0, "prefix counts");
  const Tensor s = leaf({}, 4);
  cumsum(s, 0).backward();
  check_close(s.grad(), {1.0}, 0.0, 0.0, "0-d");
}

// ---- flip -------------------------------------------------------------------------------

TEST_CASE("shape_ops: flip over any set of dims and layouts") {
  const Shape shape = {3, 4, 5};
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {-1}, {1, 2}, {-3, 1}, {0, 1, 2}};
  for (DType dt : {kFloat32, kFloat16, kInt64}) {
    for (Layout layout : kAllLayouts) {
      for (const auto& dims : dim_sets) {
        CAPTURE(name_of(dt, layout));
        const Tensor x = dt == kInt64 ? make_tensor(random_values(60, 2, -50, 50), shape, dt, layout)
                                      : random_tensor(shape, dt, 2, layout);
        const Tensor out = flip(x, dims);
        CHECK(out.dtype() == dt);
        CHECK(!out.shares_storage(x));  // a fresh tensor, as torch.flip
        check_close(out, ref_flip(values_of(x), shape, dims), 0.0, 0.0);
      }
    }
  }
  CHECK(flip(scalar_tensor(3.0), {0}).item<float>() == 3.0f);
  CHECK(flip(zeros({2, 0, 3}), {0, 1, 2}).sizes() == Shape{2, 0, 3});
  check_error([] { flip(zeros({2, 3}), {0, -2}); }, {"flip", "dim -2", "more than once", "float32[2, 3]"});
  check_error([] { flip(zeros({2, 3}), {2}); }, {"flip", "dim 2", "out of range", "float32[2, 3]"});
}

TEST_CASE("shape_ops: flip's gradient") {
  const Tensor x = leaf({3, 4}, 8);
  check_gradcheck([](const TensorList& in) { return flip(in[0].t(), {0, 1}); }, {x});
  check_gradcheck([](const TensorList& in) { return flip(in[0].slice(1, 0, 4, 2), {-1}); }, {x});
}

// ---- repeat -----------------------------------------------------------------------------

TEST_CASE("shape_ops: repeat with new leading dims, zeros and layouts") {
  const Shape shape = {2, 3};
  const std::vector<std::vector<int64_t>> rep_sets = {{1, 1}, {2, 3}, {3, 1, 2}, {2, 0}, {0, 2, 1, 1}};
  for (DType dt : {kFloat64, kBFloat16, kInt32, kBool}) {
    for (Layout layout : kAllLayouts) {
      for (const auto& reps : rep_sets) {
        CAPTURE(name_of(dt, layout));
        std::vector<double> v = random_values(6, 4);
        if (dt == kBool)
          for (double& e : v) e = e > 0;
        const Tensor x = make_tensor(v, shape, dt, layout);
        Shape out_shape;
        const std::vector<double> expected = ref_repeat(values_of(x), shape, reps, out_shape);
        const Tensor out = repeat(x, reps);
        CHECK(out.sizes() == out_shape);
        CHECK(out.dtype() == dt);
        CHECK(!out.shares_storage(x));
        check_close(out, expected, 0.0, 0.0);
      }
    }
  }
  // 0-d: the repeats make every dim.
  CHECK(repeat(scalar_tensor(1.5), {}).dim() == 0);
  check_close(repeat(scalar_tensor(1.5), {2, 3}), std::vector<double>(6, 1.5), 0.0, 0.0, "0-d");
  CHECK(repeat(zeros({0, 2}), {3, 2}).sizes() == Shape{0, 4});
  check_error([] { repeat(zeros({2, 3}), {2}); }, {"repeat", "can not be smaller", "float32[2, 3]"});
  check_error([] { repeat(zeros({2, 3}), {2, -1}); }, {"repeat", ">= 0", "-1"});
}

TEST_CASE("shape_ops: repeat's gradient sums the copies") {
  const Tensor x = leaf({2, 3}, 9);
  check_gradcheck([](const TensorList& in) { return repeat(in[0].t(), {2, 1, 3}); }, {x});
  const Tensor v = leaf({3}, 1);
  sum(repeat(v, {4, 2})).backward();
  check_close(v.grad(), {8, 8, 8}, 0.0, 0.0, "8 copies");
  // A fresh tensor, not a view: in-place ops on it are recorded, as in PyTorch.
  const Tensor w = leaf({3}, 2);
  Tensor y = repeat(w, {2});
  CHECK(y.grad_fn_name() == "RepeatBackward");
  mul_(y, 3.0);
  sum(y).backward();
  check_close(w.grad(), {6, 6, 6}, 0.0, 0.0, "in-place after repeat");
}

// ---- tril / triu ------------------------------------------------------------------------

TEST_CASE("shape_ops: tril and triu over batches, diagonals and layouts") {
  for (const Shape& shape : {Shape{4, 6}, Shape{2, 5, 3}, Shape{2, 1, 3, 3}}) {
    for (Layout layout : kAllLayouts) {
      for (int64_t diagonal = -7; diagonal <= 7; ++diagonal) {
        for (DType dt : {kFloat32, kFloat16, kInt64}) {
          CAPTURE(name_of(dt, shape));
          CAPTURE(std::string(layout_name(layout)));
          CAPTURE(diagonal);
          const Tensor x =
              make_tensor(rounded(random_values(numel_of(shape), 6), dt == kInt64 ? kFloat64 : dt), shape, dt, layout);
          const std::vector<double> vx = values_of(x);
          check_close(tril(x, diagonal), ref_triangle(vx, shape, diagonal, false), 0.0, 0.0, "tril");
          check_close(triu(x, diagonal), ref_triangle(vx, shape, diagonal, true), 0.0, 0.0, "triu");
        }
      }
    }
  }
  // Entries off the triangle become 0 even when they are inf or NaN (not 0 * inf).
  const Tensor special = make_tensor({1, kInf, std::nan(""), 2}, {2, 2}, kFloat32);
  check_close(tril(special), {1, 0, std::nan(""), 2}, 0.0, 0.0, "tril of inf");
  check_close(triu(special), {1, kInf, 0, 2}, 0.0, 0.0, "triu of NaN");
  // Bool, size-0 and default diagonal.
  check_close(triu(ones({3, 3}, kBool), 1), {0, 1, 1, 0, 0, 1, 0, 0, 0}, 0.0, 0.0, "bool");
  CHECK(tril(zeros({0, 3, 0})).sizes() == Shape{0, 3, 0});
  check_error([] { tril(zeros({4})); }, {"tril", "at least 2 dimensions", "float32[4]"});
  check_error([] { triu(scalar_tensor(1.0)); }, {"triu", "at least 2 dimensions"});
  check_error([] { tril(empty({2, 2}, kUInt8)); }, {"tril", "uint8[2, 2]"});
}

TEST_CASE("shape_ops: the gradient of tril and triu is the same mask on g") {
  const Tensor x = leaf({2, 3, 4}, 10);
  for (int64_t diagonal : {-2, 0, 1, 5}) {
    check_gradcheck([diagonal](const TensorList& in) { return tril(in[0].transpose(1, 2), diagonal); }, {x});
    check_gradcheck([diagonal](const TensorList& in) { return triu(in[0], diagonal); }, {x});
  }
  CHECK(triu(x).grad_fn_name() == "TriuBackward");
  CHECK(tril(x).grad_fn_name() == "TrilBackward");
  const Tensor y = leaf({3, 3}, 2);
  sum(tril(y, -1)).backward();
  check_close(y.grad(), {0, 0, 0, 1, 0, 0, 1, 1, 0}, 0.0, 0.0, "strictly lower");
}

// ---- pad --------------------------------------------------------------------------------

TEST_CASE("shape_ops: constant pad, including negative pads that crop") {
  const Shape shape = {2, 3, 4};
  const std::vector<std::vector<int64_t>> pads = {
      {}, {1, 2}, {0, 0, 2, 1}, {-1, 2, 1, -2}, {1, 1, 1, 1, 1, 1}, {-4, 1}, {-2, -2, 0, 0, 1, 0}, {0, 0, -3, 0}};
  for (DType dt : {kFloat64, kFloat16, kInt32}) {
    for (Layout layout : kAllLayouts) {
      for (const auto& p : pads) {
        CAPTURE(name_of(dt, layout));
        CAPTURE(p.size());
        const Tensor x = make_tensor(rounded(random_values(24, 12), dt == kInt32 ? kFloat64 : dt), shape, dt, layout);
        const double value = dt == kInt32 ? 7.0 : -1.5;
        Shape out_shape;
        const std::vector<double> expected = ref_pad(values_of(x), shape, p, 0, value, out_shape);
        const Tensor out = pad(x, p, "constant", value);
        CHECK(out.sizes() == out_shape);
        CHECK(out.dtype() == dt);
        check_close(out, dt == kInt32 ? values_of(out) : expected, 0.0, 0.0);
        if (dt == kInt32) check_close(out, ref_pad(values_of(x), shape, p, 0, 7.0, out_shape), 0.0, 0.0, "int32");
      }
    }
  }
  CHECK(pad(scalar_tensor(2.0), {}).item<float>() == 2.0f);  // 0-d with no pairs
  check_close(pad(zeros({0}), {1, 2}, "constant", 3.0), {3, 3, 3}, 0.0, 0.0, "size-0");
  check_close(pad(make_tensor({1, 2, 3}, {3}, kFloat32), {-1, -2}), std::vector<double>{}, 0.0, 0.0, "cropped away");
  check_error([] { pad(zeros({2, 3}), {1, 2, 3}); }, {"pad", "divisible by 2", "float32[2, 3]"});
  check_error([] { pad(zeros({3}), {1, 1, 1, 1}); }, {"pad", "at most twice", "float32[3]"});
  check_error([] { pad(zeros({3}), {-2, -2}); }, {"pad", "negative output size", "float32[3]"});
  check_error([] { pad(zeros({3}), {-4, 2}); }, {"pad", "crops 4 entries from dim 0, which has 3", "float32[3]"});
  check_error([] { pad(zeros({3}), {1, 1}, "wrap"); }, {"pad", "unknown mode", "wrap"});
  check_error([] { pad(empty({3}, kUInt8), {1, 1}); }, {"pad", "uint8[3]"});
  check_error([] { pad(zeros({3}, kInt32), {1, 1}, "constant", 1e20); }, {"pad", "int32"});
}

TEST_CASE("shape_ops: reflect, replicate and circular pads over the last 1-3 dims") {
  struct Case {
    Shape shape;
    std::vector<int64_t> pad;
  };
  const std::vector<Case> cases = {{{2, 5}, {2, 3}},
                                   {{2, 3, 4}, {3, 0}},
                                   {{1, 2, 3, 4}, {1, 2, 0, 2}},
                                   {{2, 4, 3}, {-1, 2, 2, 1}},
                                   {{1, 2, 3, 3, 4}, {1, 1, 2, 2, 1, 0}},
                                   {{2, 3, 3, 4}, {0, 3, 1, 1, 2, 0}},
                                   {{0, 2, 3}, {2, 2}},
                                   {{2, 4}, {-2, 2}}};
  const char* const names[] = {"", "reflect", "replicate", "circular"};
  for (const Case& c : cases) {
    for (Layout layout : kAllLayouts) {
      for (int mode : {1, 2, 3}) {
        CAPTURE(shape_str(c.shape));
        CAPTURE(std::string(layout_name(layout)));
        CAPTURE(mode);
        const Tensor x = random_tensor(c.shape, kFloat32, 13, layout);
        Shape out_shape;
        const std::vector<double> expected = ref_pad(values_of(x), c.shape, c.pad, mode, 0.0, out_shape);
        const Tensor out = pad(x, c.pad, names[mode]);
        CHECK(out.sizes() == out_shape);
        check_close(out, expected, 0.0, 0.0);
      }
    }
  }
  // The documented example of torch.nn.ReflectionPad1d(2) on [0, 1, 2, 3].
  check_close(pad(arange(0.0, 4.0).reshape({1, 4}), {2, 2}, "reflect"), {2, 1, 0, 1, 2, 3, 2, 1}, 0.0, 0.0,
              "ReflectionPad1d");
  check_close(pad(arange(0.0, 4.0).reshape({1, 4}), {2, 2}, "replicate"), {0, 0, 0, 1, 2, 3, 3, 3}, 0.0, 0.0,
              "ReplicationPad1d");
  check_close(pad(arange(int64_t(3)).reshape({1, 3}), {1, 1}, "reflect"), {1, 0, 1, 2, 1}, 0.0, 0.0, "int64");
  // torch.nn.CircularPad1d(2) on [0, 1, 2, 3], and a pad of the whole dim on each side.
  check_close(pad(arange(0.0, 4.0).reshape({1, 4}), {2, 2}, "circular"), {2, 3, 0, 1, 2, 3, 0, 1}, 0.0, 0.0,
              "CircularPad1d");
  check_close(pad(arange(0.0, 2.0).reshape({1, 2}), {2, 2}, "circular"), {0, 1, 0, 1, 0, 1}, 0.0, 0.0, "wrap once");
  // A negative pad crops before the copies are taken (PyTorch 1.13:
  // F.pad(torch.arange(1., 6).reshape(1, 1, 5), (-2, 3), "circular") is [3, 4, 5, 3, 4, 5]).
  check_close(pad(arange(1.0, 6.0).reshape({1, 1, 5}), {-2, 3}, "circular"), {3, 4, 5, 3, 4, 5}, 0.0, 0.0,
              "crop then wrap");
  check_close(pad(arange(1.0, 3.0).reshape({1, 1, 2}), {-1, 1}, "circular"), {2, 2}, 0.0, 0.0, "crop to one");
  check_close(pad(arange(1.0, 6.0).reshape({1, 5}), {2, -2}, "circular"), {2, 3, 1, 2, 3}, 0.0, 0.0, "crop right");
  check_error(
      [] {
        pad(zeros({1, 3}), {-1, 3}, "circular");
      },
      {"pad", "circular padding (-1, 3)", "more than once", "2 entries left"});
  check_error(
      [] {
        pad(zeros({1, 3}), {4, 0}, "circular");
      },
      {"pad", "circular padding (4, 0)", "more than once", "float32[1, 3]"});
  check_error([] { pad(zeros({3}), {1, 1}, "circular"); }, {"pad", "circular", "2-D or 3-D", "float32[3]"});
  check_error(
      [] {
        pad(zeros({1, 3}), {3, 1}, "reflect");
      },
      {"pad", "reflect padding (3, 1)", "less than", "float32[1, 3]"});
  check_error([] { pad(zeros({1, 3}), {0, 3}, "reflect"); }, {"pad", "reflect padding (0, 3)"});
  check_error([] { pad(zeros({4}), {1, 1}, "reflect"); }, {"pad", "reflect", "2-D or 3-D", "float32[4]"});
  check_error([] { pad(zeros({1, 2, 3, 4}), {1, 1}, "replicate"); }, {"pad", "replicate", "float32[1, 2, 3, 4]"});
  check_error([] { pad(zeros({2, 0}), {1, 1}, "replicate"); }, {"pad", "non-empty", "float32[2, 0]"});
  check_error([] { pad(zeros({0, 3}), {1, 1}, "reflect"); }, {"pad", "non-empty", "float32[0, 3]"});
  check_error([] { pad(zeros({2, 3}), {1, 1}, "reflect", 2.0); }, {"pad", "reflect", "no fill value"});
  check_error([] { pad(zeros({2, 3}), {-2, -1}, "replicate"); }, {"pad", "leaves no entries"});
}

TEST_CASE("shape_ops: pad's gradients") {
  const Tensor x = leaf({2, 3, 4}, 14);
  for (const std::vector<int64_t>& p :
       std::vector<std::vector<int64_t>>{{1, 2}, {-1, 2, 1, -2}, {-4, 1}, {2, 1, 0, 0, -1, 1}}) {
    check_gradcheck([p](const TensorList& in) { return pad(in[0].transpose(0, 1), p, "constant", 0.5); }, {x});
  }
  CHECK(pad(x, {1, 1}).grad_fn_name() == "ConstantPadBackward");
  for (const char* mode : {"reflect", "replicate", "circular"}) {
    CAPTURE(mode);
    check_gradcheck([mode](const TensorList& in) { return pad(in[0], {3, 2, -1, 2}, mode); }, {x});
    check_gradcheck([mode](const TensorList& in) { return pad(in[0].transpose(1, 2), {2, 1}, mode); }, {x});
  }
  // replicate: the edge entries collect the gradients of their copies.
  const Tensor v = leaf({1, 3}, 5);
  sum(pad(v, {2, 1}, "replicate")).backward();
  check_close(v.grad(), {3, 1, 2}, 0.0, 0.0, "replicate copies");
  v.set_grad({});
  sum(pad(v, {3, 1}, "circular")).backward();
  check_close(v.grad(), {3, 2, 2}, 0.0, 0.0, "circular copies");
}

// ---- logsumexp --------------------------------------------------------------------------

TEST_CASE("shape_ops: logsumexp over dims, keepdim and layouts") {
  const Shape shape = {3, 4, 5};
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {-1}, {0, 2}, {-2, 0}, {0, 1, 2}};
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      for (const auto& dims : dim_sets) {
        for (bool keepdim : {false, true}) {
          CAPTURE(name_of(dt, layout));
          CAPTURE(keepdim);
          const Tensor x = random_tensor(shape, dt, 15, layout, -4.0, 4.0);
          std::vector<bool> reduced(3, dims.empty());
          for (int64_t d : dims) reduced[size_t(wrap(d, 3))] = true;
          Shape kept;
          const std::vector<double> expected = ref_logsumexp(values_of(x), shape, reduced, kept);
          Shape squeezed;
          for (size_t d = 0; d < 3; ++d)
            if (!reduced[d]) squeezed.push_back(shape[d]);
          const Tensor out = logsumexp(x, dims, keepdim);
          CHECK(out.dtype() == dt);
          CHECK(out.sizes() == (keepdim ? kept : squeezed));
          check_close(out, expected, default_rtol(dt), default_rtol(dt));
        }
      }
    }
  }
}

TEST_CASE("shape_ops: logsumexp of large, infinite, empty, 0-d and integer inputs") {
  // No overflow: log(e^1000 + e^1000) = 1000 + log 2.
  check_close(logsumexp(full({2}, 1000.0), {0}), {1000.0 + std::log(2.0)}, 1e-6, 0.0, "large");
  check_close(logsumexp(full({2}, -1000.0), {0}), {-1000.0 + std::log(2.0)}, 1e-6, 0.0, "small");
  const Tensor special = make_tensor({-kInf, -kInf, -kInf, 1.0, kInf, 2.0, std::nan(""), 0.0}, {4, 2}, kFloat32);
  check_close(logsumexp(special, {1}), {-kInf, 1.0, kInf, std::nan("")}, 1e-6, 0.0, "inf and NaN rows");
  // Reductions over nothing give log(0) = -inf, as PyTorch.
  check_close(logsumexp(zeros({2, 0}), {1}), {-kInf, -kInf}, 0.0, 0.0, "empty slices");
  CHECK(logsumexp(zeros({0, 3}), {1}).sizes() == Shape{0});
  // 0-d: its own logsumexp.
  CHECK(logsumexp(scalar_tensor(1.25), {0}).item<float>() == 1.25f);
  CHECK(logsumexp(scalar_tensor(1.25), {-1}, true).dim() == 0);
  // Integers compute in float32.
  const Tensor ints = make_tensor({1, 2, 3}, {3}, kInt64);
  const Tensor out = logsumexp(ints, {0});
  CHECK(out.dtype() == kFloat32);
  check_close(out, {std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0))}, 1e-6, 0.0, "int64");
  check_error([] { logsumexp(zeros({2, 3}), {2}); }, {"logsumexp", "dim 2", "float32[2, 3]"});
  check_error([] { logsumexp(zeros({2, 3}), {1, -1}); }, {"logsumexp", "more than once"});
}

TEST_CASE("shape_ops: logsumexp's gradient is softmax, and 0 on -inf rows") {
  const Tensor x = leaf({3, 4}, 16);
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{1}, {0}, {}, {-1, 0}}) {
    check_gradcheck([dims](const TensorList& in) { return logsumexp(in[0].t(), dims); }, {x});
    check_gradcheck([dims](const TensorList& in) { return logsumexp(in[0], dims, true); }, {x});
  }
  // Large values: the gradient is still softmax, no overflow.
  const Tensor big = make_tensor({1000.0, 1000.0, -kInf, -kInf}, {2, 2}, kFloat64);
  big.requires_grad_();
  const Tensor y = logsumexp(big, {1});
  check_close(y, {1000.0 + std::log(2.0), -kInf}, 1e-12, 0.0, "forward");
  sum(y).backward();
  check_close(big.grad(), {0.5, 0.5, 0.0, 0.0}, 1e-12, 0.0, "no NaN on the -inf row");
  // Its result is no view, keepdim or not: in-place ops on it are recorded, as in PyTorch.
  for (bool keepdim : {false, true}) {
    CAPTURE(keepdim);
    const Tensor v = leaf({2, 3}, 17);
    Tensor r = logsumexp(v, {1}, keepdim);
    mul_(r, 2.0);
    sum(r).backward();
    const Tensor expected = mul(softmax(v.detach(), 1), 2.0);
    check_close(v.grad(), values_of(expected), 1e-6, 1e-6, "in-place after logsumexp");
  }
}
