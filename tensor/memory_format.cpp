// Channels-last layout helpers (Note [Channels-last layout] in tensor/memory_format.h).
#include "tensor/memory_format.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "tensor/factory.h"

namespace frugal {

Shape channels_last_strides(const Shape& s) {
  FRUGAL_CHECK(s.size() == 4, "channels_last: expected a 4-D shape (N, C, H, W), got ", shape_str(s));
  numel_of(s, "channels_last");  // the products below are partial products of a checked shape
  const int64_t C = s[1], H = s[2], W = s[3];
  return {H * W * C, 1, W * C, C};
}

bool is_channels_last(const Tensor& x) {
  if (!x.defined() || x.dim() != 4) return false;
  int64_t expected = 1;
  for (int64_t d : {1, 3, 2, 0}) {  // innermost first: C, W, H, N
    const int64_t size = x.sizes()[size_t(d)];
    if (size == 1) continue;
    if (x.strides()[size_t(d)] != expected) return false;
    expected *= size;
  }
  return true;
}

bool suggests_channels_last(const Tensor& x) { return is_channels_last(x) && !x.is_contiguous(); }

Tensor empty_channels_last(const Shape& sizes, TensorOptions opts) {
  return empty_strided(sizes, channels_last_strides(sizes), opts);
}

bool is_dense(const Tensor& x) {
  if (x.numel() == 0) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that move
  for (int64_t d = 0; d < x.dim(); ++d)
    if (x.sizes()[d] != 1) dims.emplace_back(x.strides()[d], x.sizes()[d]);
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

bool same_dense_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || !is_dense(a) || !is_dense(b)) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.sizes()[d] != 1 && a.strides()[d] != b.strides()[d]) return false;
  return true;
}

Tensor empty_in_layout(const Tensor& like, TensorOptions opts) {
  // A dense layout's strides describe a fresh allocation of numel() elements (a size-1
  // dim's stride adds nothing to the span).
  return is_dense(like) ? empty_strided(like.sizes(), like.strides(), opts) : empty(like.sizes(), opts);
}

Tensor copy_in_layout(const Tensor& t, const Tensor& like) { return copy_in_layout(t, like, t.options()); }

Tensor copy_in_layout(const Tensor& t, const Tensor& like, TensorOptions opts) {
  Tensor out = empty_in_layout(like, opts);
  out.copy_(t);
  return out;
}

Tensor to_channels_last(const Tensor& x) {
  FRUGAL_CHECK(x.defined() && x.dim() == 4, "to_channels_last: expected a 4-D tensor (N, C, H, W), got ",
               x.defined() ? x.describe() : "undefined");
  if (is_channels_last(x)) return x;
  return x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
}

}  // namespace frugal
