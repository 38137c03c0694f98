#pragma once
// Flat indices of (N, H, W, C) arrays as coordinates, for the kernels that walk an NCHW
// tensor of P planes as the case C == 1, N = P, and a channels-last one as it lies (the
// pools, Note [NHWC pooling] in tensor/cuda/pool.cu, and interpolate).
namespace frugal::ops::cuda {

/// Element (n, h, w, c) of an (N, H, W, C) array.
template <typename I>
struct Pixel {
  I n, h, w, c;
};

/// The flat index i of an (N, H, W, C) array as its coordinates; C is ignored (the constant
/// 1) unless kNHWC, so NCHW kernels pay no division for it.
template <bool kNHWC, typename I>
__device__ __forceinline__ Pixel<I> unflatten(I i, I H, I W, I C) {
  Pixel<I> p;
  if constexpr (kNHWC) p.c = i % C, i /= C;
  else p.c = 0;
  p.w = i % W, i /= W;
  p.h = i % H, p.n = i / H;
  return p;
}

}  // namespace frugal::ops::cuda
