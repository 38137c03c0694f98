// Channels-last layout helpers (Note [Channels-last layout] in tensor/memory_format.h).
#include "tensor/memory_format.h"

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

Tensor to_channels_last(const Tensor& x) {
  FRUGAL_CHECK(x.defined() && x.dim() == 4, "to_channels_last: expected a 4-D tensor (N, C, H, W), got ",
               x.defined() ? x.describe() : "undefined");
  if (is_channels_last(x)) return x;
  return x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
}

}  // namespace frugal
