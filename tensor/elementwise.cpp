#include "tensor/elementwise.h"

#include "tensor/factory.h"
#include "tensor/memory_format.h"

namespace frugal {

ElementwiseLayout make_elementwise_layout(const char* op, const Tensor& out, const std::vector<Tensor>& inputs) {
  ElementwiseLayout L;
  L.noperands = int(inputs.size()) + 1;
  FRUGAL_CHECK(L.noperands <= kMaxOperands, op, ": too many operands (", L.noperands, ")");
  const Shape& shape = out.sizes();
  const int nd = int(shape.size());
  L.numel = numel_of(shape);

  // Per-operand strides in the output's shape (0 where broadcast), outermost first.
  std::vector<std::vector<int64_t>> st(L.noperands, std::vector<int64_t>(nd, 0));
  for (int k = 0; k < L.noperands; ++k) {
    const Tensor& t = k == 0 ? out : inputs[k - 1];
    check_same_device(op, out, t);
    const int td = int(t.dim());
    FRUGAL_CHECK(td <= nd, op, ": input of shape ", shape_str(t.sizes()), " cannot broadcast to ", shape_str(shape));
    for (int d = 0; d < td; ++d) {
      const int od = nd - td + d;
      const int64_t s = t.sizes()[d];
      FRUGAL_CHECK(s == shape[od] || s == 1, op, ": input of shape ", shape_str(t.sizes()), " cannot broadcast to ",
                   shape_str(shape));
      st[k][od] = (s == 1 && shape[od] != 1) ? 0 : t.strides()[d];
    }
    L.data[k] = static_cast<char*>(t.data());
    L.dtypes[k] = t.dtype();
  }

  // Coalesce, innermost first: drop size-1 dims; merge dim d into the dim inside
  // it when every operand steps across both as one.
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> strides(L.noperands);
  for (int d = nd - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (int k = 0; merge && k < L.noperands; ++k) merge = st[k][d] == strides[k].back() * sizes.back();
    if (merge) {
      sizes.back() *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      for (int k = 0; k < L.noperands; ++k) strides[k].push_back(st[k][d]);
    }
  }
  FRUGAL_CHECK(int(sizes.size()) <= kMaxDims, op, ": more than ", kMaxDims, " non-mergeable dims in ",
               shape_str(shape));
  L.ndim = int(sizes.size());
  for (int i = 0; i < L.ndim; ++i) {
    L.sizes[i] = sizes[L.ndim - 1 - i];
    for (int k = 0; k < L.noperands; ++k) L.strides[k][i] = strides[k][L.ndim - 1 - i];
  }
  L.contiguous = L.ndim == 0;
  if (L.ndim == 1) {
    L.contiguous = true;
    for (int k = 0; k < L.noperands; ++k) L.contiguous = L.contiguous && L.strides[k][0] == 1;
  }
  return L;
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
