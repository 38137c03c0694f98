#include "tensor/elementwise.h"

#include <algorithm>
#include <array>
#include <vector>

#include "tensor/factory.h"
#include "tensor/memory_format.h"

namespace frugal {

// Runs on every elementwise op, so it works in fixed arrays on the stack: the
// vectors it used before were ~10 heap allocations per op (bench/op_overhead).
ElementwiseLayout make_elementwise_layout(const char* op, const Tensor& out, std::initializer_list<Tensor> inputs) {
  ElementwiseLayout L;
  L.noperands = int(inputs.size()) + 1;
  FRUGAL_CHECK(L.noperands <= kMaxOperands, op, ": too many operands (", L.noperands, ")");
  const Shape& shape = out.sizes();
  const int nd = int(shape.size());
  L.numel = numel_of(shape);
  // More dims than kMaxDims can still coalesce to kMaxDims or fewer; only those
  // rare shapes take the heap.
  constexpr int kInline = 2 * kMaxDims;
  std::array<std::array<int64_t, kInline>, kMaxOperands> st_inline;
  std::vector<std::array<int64_t, kMaxOperands>> st_heap;
  if (nd > kInline) st_heap.resize(size_t(nd));
  auto st = [&](int k, int d) -> int64_t& { return nd > kInline ? st_heap[size_t(d)][size_t(k)] : st_inline[k][d]; };

  // Per-operand strides in the output's shape (0 where broadcast), outermost first.
  const Tensor* operands[kMaxOperands] = {&out};
  int k = 1;
  for (const Tensor& t : inputs) operands[k++] = &t;
  for (k = 0; k < L.noperands; ++k) {
    const Tensor& t = *operands[k];
    check_same_device(op, out, t);
    const int td = int(t.dim());
    FRUGAL_CHECK(td <= nd, op, ": input of shape ", shape_str(t.sizes()), " cannot broadcast to ", shape_str(shape));
    for (int d = 0; d < nd - td; ++d) st(k, d) = 0;
    for (int d = 0; d < td; ++d) {
      const int od = nd - td + d;
      const int64_t s = t.sizes()[d];
      FRUGAL_CHECK(s == shape[od] || s == 1, op, ": input of shape ", shape_str(t.sizes()), " cannot broadcast to ",
                   shape_str(shape));
      st(k, od) = (s == 1 && shape[od] != 1) ? 0 : t.strides()[d];
    }
    L.data[k] = static_cast<char*>(t.data());
    L.dtypes[k] = t.dtype();
  }

  // Walk the dims in the output's memory order (Note [Elementwise dim order]).
  std::array<int, kInline> order_inline;
  std::vector<int> order_heap(nd > kInline ? size_t(nd) : 0);
  int* order = nd > kInline ? order_heap.data() : order_inline.data();
  bool writes_each_once = true;
  for (int d = 0; d < nd; ++d) {
    order[d] = d;
    if (shape[d] != 1 && st(0, d) == 0) writes_each_once = false;  // an accumulator (scatter_add)
  }
  // Insertion sort, stable and allocation-free (std::stable_sort takes a heap buffer, on
  // every elementwise op); a handful of dims, usually already in order.
  for (int i = 1; writes_each_once && i < nd; ++i)
    for (int j = i; j > 0 && st(0, order[j - 1]) < st(0, order[j]); --j) std::swap(order[j - 1], order[j]);

  // Coalesce, innermost first: drop size-1 dims; merge dim d into the dim inside
  // it when every operand steps across both as one. `n` dims so far, innermost at 0.
  int n = 0;
  std::array<int64_t, kMaxDims> sizes;
  std::array<std::array<int64_t, kMaxDims>, kMaxOperands> strides;
  for (int j = nd - 1; j >= 0; --j) {
    const int d = order[j];
    if (shape[d] == 1) continue;
    bool merge = n > 0;
    for (k = 0; merge && k < L.noperands; ++k) merge = st(k, d) == strides[k][n - 1] * sizes[n - 1];
    if (merge) {
      sizes[n - 1] *= shape[d];
    } else {
      FRUGAL_CHECK(n < kMaxDims, op, ": more than ", kMaxDims, " non-mergeable dims in ", shape_str(shape));
      sizes[n] = shape[d];
      for (k = 0; k < L.noperands; ++k) strides[k][n] = st(k, d);
      ++n;
    }
  }
  L.ndim = n;
  for (int i = 0; i < L.ndim; ++i) {
    L.sizes[i] = sizes[L.ndim - 1 - i];
    for (k = 0; k < L.noperands; ++k) L.strides[k][i] = strides[k][L.ndim - 1 - i];
  }
  L.contiguous = L.ndim == 0;
  if (L.ndim == 1) {
    L.contiguous = true;
    for (k = 0; k < L.noperands; ++k) L.contiguous = L.contiguous && L.strides[k][0] == 1;
  }
  return L;
}

void check_no_internal_overlap(const char* op, const Tensor& out) {
  for (int64_t d = 0; d < out.dim(); ++d)
    FRUGAL_CHECK(out.strides()[d] != 0 || out.sizes()[d] <= 1, op, ": cannot write in place into ", out.describe(),
                 ", whose elements share memory (an expanded view); clone() it first");
}

bool may_overlap(const Tensor& a, const Tensor& b) {
  if (!a.shares_storage(b) || a.numel() == 0 || b.numel() == 0) return false;
  auto last = [](const Tensor& t) {  // the highest element offset t touches
    int64_t off = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) off += (t.sizes()[size_t(d)] - 1) * t.strides()[size_t(d)];
    return off;
  };
  return a.storage_offset() <= last(b) && b.storage_offset() <= last(a);
}

Tensor empty_elementwise_output(const Shape& shape, TensorOptions opts, std::initializer_list<const Tensor*> inputs) {
  if (shape.size() == 4) {
    for (const Tensor* t : inputs) {
      if (!t->defined() || t->sizes() != shape) continue;
      const bool channels_last = is_channels_last(*t), contiguous = t->is_contiguous();
      if (channels_last == contiguous) continue;  // ambiguous, or neither: no say
      if (channels_last) return empty_channels_last(shape, opts);
      break;
    }
  }
  return empty(shape, opts);
}

}  // namespace frugal
