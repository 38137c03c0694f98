// flip, repeat, tril and triu: flip as recorded index_selects, one node each for repeat and
// the triangles, forward and backward side by side. pad is in autograd/ops/pad.cpp.
#include <algorithm>

#include "autograd/function.h"
#include "autograd/ops/index.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape_ops.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/dims.h"

namespace frugal {

using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::TensorList;

Tensor flip(const Tensor& x, const std::vector<int64_t>& dims) {
  constexpr const char* op = "flip";
  core::OpScope scope(op);
  FRUGAL_CHECK(x.defined(), op, ": undefined tensor");
  const std::vector<bool> flipped = ops::dims_mask(op, x, dims, /*empty_means_all=*/false);  // 0-d: none
  Tensor out = x;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!flipped[size_t(d)] || x.size(d) <= 1) continue;  // nothing to reverse
    const int64_t n = x.size(d);
    out = index_select(out, d, arange(double(n - 1), -1.0, -1.0, {kInt64, x.device()}));
  }
  return out.shares_storage(x) ? out.clone() : out;  // a fresh tensor, as torch.flip
}

namespace {

// out = x seen as (1, s0, 1, s1, ...), expanded to (r0, s0, r1, s1, ...) and flattened to
// (r0 s0, r1 s1, ...), with leading 1s in s for the dims repeat adds
// grad_x = g seen as (r0, s0, r1, s1, ...), summed over the copies (the r dims)
struct RepeatBackward final : Node {
  Shape in_sizes, expanded;
  DType dtype = kFloat32;
  std::string name() const override { return "RepeatBackward"; }
  TensorList apply(TensorList&& grads) override {
    std::vector<int64_t> copies;
    for (int64_t d = 0; d < int64_t(expanded.size()); d += 2) copies.push_back(d);
    return {in_dtype(ops::sum(grads[0].reshape(expanded), copies), dtype).reshape(in_sizes)};
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    std::vector<int64_t> copies;
    for (int64_t d = 0; d < int64_t(expanded.size()); d += 2) copies.push_back(d);
    return {in_dtype(frugal::sum(grads[0].reshape(expanded), copies), dtype).reshape(in_sizes)};
  }
};

}  // namespace

Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats) {
  constexpr const char* op = "repeat";
  core::OpScope scope(op);
  FRUGAL_CHECK(x.defined(), op, ": undefined tensor");
  const int64_t n = int64_t(repeats.size());
  FRUGAL_CHECK(n >= x.dim(), op, ": the number of repeats (", n, ") can not be smaller than the number of dims of ",
               x.describe());
  Shape paired, expanded, result;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = repeats[size_t(i)];
    FRUGAL_CHECK(r >= 0, op, ": repeats must be >= 0, got ", r, " at position ", i, " for ", x.describe());
    const int64_t s = i < n - x.dim() ? 1 : x.size(i - (n - x.dim()));
    paired.insert(paired.end(), {1, s});
    expanded.insert(expanded.end(), {r, s});
    result.push_back(r * s);
  }
  Tensor out = autograd::raw([&] {
    const Tensor t = x.reshape(paired).expand(expanded).reshape(result);
    return t.shares_storage(x) ? t.clone() : t;  // a fresh tensor, as torch.Tensor.repeat
  });
  if (auto node = make_node<RepeatBackward>({x})) {
    node->in_sizes = x.sizes();
    node->expanded = expanded;
    node->dtype = x.dtype();
    autograd::record(node, {out});
  }
  return out;
}

namespace {

/// bool (rows, cols): true at the entries tril (upper: triu) sets to 0, those with j - i
/// above (below) the diagonal: j against i + diagonal, broadcast, so that only the bool
/// result is (rows, cols).
Tensor dropped(int64_t rows, int64_t cols, int64_t diagonal, bool upper, Device device) {
  // Beyond [-rows, cols] every diagonal keeps or drops the same entries: clamp, so that
  // i + k stays small.
  const int64_t k = std::clamp<int64_t>(diagonal, -rows, cols);
  const Tensor i_plus_k = arange(double(k), double(rows + k), 1.0, {kInt64, device}).reshape({rows, 1});
  const Tensor j = arange(cols, {kInt64, device}).reshape({1, cols});
  return upper ? ops::lt(j, i_plus_k) : ops::gt(j, i_plus_k);
}

Tensor triangle(const Tensor& x, int64_t diagonal, bool upper) {
  return ops::masked_fill(x, dropped(x.size(-2), x.size(-1), diagonal, upper, x.device()), 0.0);
}

// out = tril(x, diagonal) (triu alike): x with the entries off the triangle set to 0
// grad_x = g with the same entries set to 0
struct TrilTriuBackward final : Node {
  DType dtype = kFloat32;
  int64_t diagonal = 0;
  bool upper = false;
  std::string name() const override { return upper ? "TriuBackward" : "TrilBackward"; }
  TensorList apply(TensorList&& grads) override { return {triangle(in_dtype(grads[0], dtype), diagonal, upper)}; }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    return {upper ? frugal::triu(g, diagonal) : frugal::tril(g, diagonal)};
  }
};

Tensor tril_triu(const char* op, const Tensor& x, int64_t diagonal, bool upper) {
  core::OpScope scope(op);
  FRUGAL_CHECK(x.defined(), op, ": undefined tensor");
  FRUGAL_CHECK(x.dim() >= 2, op, ": input tensor must have at least 2 dimensions, got ", x.describe());
  FRUGAL_CHECK(x.dtype() != kUInt8, op, ": not implemented for ", x.describe(), " (uint8 is storage only)");
  Tensor out = autograd::raw([&] { return triangle(x, diagonal, upper); });
  if (auto node = make_node<TrilTriuBackward>({x})) {
    node->dtype = x.dtype();
    node->diagonal = diagonal;
    node->upper = upper;
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace

Tensor tril(const Tensor& x, int64_t diagonal) { return tril_triu("tril", x, diagonal, false); }
Tensor triu(const Tensor& x, int64_t diagonal) { return tril_triu("triu", x, diagonal, true); }

}  // namespace frugal
