// CUDA interpolation (Note [Interpolation source indices] in tensor/ops/interpolate.h).
//
// Every kernel walks an (N, H, W, C) array, as the pooling kernels do (Note [NHWC pooling]
// in tensor/cuda/pool.cu): a channels-last tensor is one as it lies, and a contiguous one
// of P = N C planes is the case C == 1, N = P; the kernels are instanced for both. The
// forward takes one thread per output element in memory order, so stores coalesce (and
// with channels-last, loads too). The backward gathers instead of scattering with
// atomicAdd (what PyTorch does): one thread per input element finds, by binary search
// on the monotone source index of each dim, the range of outputs that read it, and sums
// their gradients in output order in opmath_t, rounding once. The result is deterministic
// and has the CPU's summation order, so the two backends differ only by contraction of
// the multiply-adds.
#include <cstdint>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/ops/interpolate.h"

namespace frugal::ops::cuda {

namespace {

#define FRUGAL_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

/// Element i of an (N, H, W, C) array as (n, h, w, c); C is the constant 1 for NCHW planes.
struct Pixel {
  int64_t n, h, w, c;
};
template <bool kNHWC>
__device__ __forceinline__ Pixel unflatten(int64_t i, int64_t H, int64_t W, int64_t C) {
  Pixel p;
  if constexpr (kNHWC) p.c = i % C, i /= C;
  else p.c = 0;
  p.w = i % W, i /= W;
  p.h = i % H, p.n = i / H;
  return p;
}

/// The first o in [0, n) with f(o) >= target, or n; f non-decreasing.
template <typename F>
__device__ __forceinline__ int64_t first_at_least(int64_t n, int64_t target, F f) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (f(mid) >= target) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// out: (N, OH, OW, C); x: (N, H, W, C); one thread per output
template <typename T, bool kNHWC>
__global__ void nearest_forward_kernel(T* __restrict__ out, const T* __restrict__ x, InterpolateGeometry g, int64_t n) {
  const int64_t C = kNHWC ? g.C : 1;
  FRUGAL_GRID_STRIDE(o, n) {
    const Pixel q = unflatten<kNHWC>(o, g.OH, g.OW, C);
    const int64_t ih = nearest_source(q.h, g.H, g.OH, g.scale_h), iw = nearest_source(q.w, g.W, g.OW, g.scale_w);
    out[o] = x[((q.n * g.H + ih) * g.W + iw) * C + q.c];
  }
}

// gx: (N, H, W, C); gy: (N, OH, OW, C); one thread per input element
template <typename T, bool kNHWC>
__global__ void nearest_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, InterpolateGeometry g,
                                        int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = kNHWC ? g.C : 1;
  const auto src_h = [&](int64_t oh) { return nearest_source(oh, g.H, g.OH, g.scale_h); };
  const auto src_w = [&](int64_t ow) { return nearest_source(ow, g.W, g.OW, g.scale_w); };
  FRUGAL_GRID_STRIDE(i, n) {
    const Pixel q = unflatten<kNHWC>(i, g.H, g.W, C);
    // The outputs whose source is (q.h, q.w): a rectangle, as the sources are monotone.
    const int64_t oh0 = first_at_least(g.OH, q.h, src_h), oh1 = first_at_least(g.OH, q.h + 1, src_h);
    const int64_t ow0 = first_at_least(g.OW, q.w, src_w), ow1 = first_at_least(g.OW, q.w + 1, src_w);
    const T* gyp = gy + q.n * g.OH * g.OW * C + q.c;
    Acc s = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) s += Acc(gyp[(oh * g.OW + ow) * C]);
    gx[i] = T(s);  // the one rounding
  }
}

// out: (N, OH, OW, C); x: (N, H, W, C); one thread per output; sh, sw: linear_scale's
template <typename T, bool kNHWC>
__global__ void bilinear_forward_kernel(T* __restrict__ out, const T* __restrict__ x, InterpolateGeometry g,
                                        opmath_t<T> sh, opmath_t<T> sw, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = kNHWC ? g.C : 1;
  FRUGAL_GRID_STRIDE(o, n) {
    const Pixel q = unflatten<kNHWC>(o, g.OH, g.OW, C);
    const LinearTaps<Acc> h = linear_taps<Acc>(q.h, g.H, sh, g.align_corners);
    const LinearTaps<Acc> w = linear_taps<Acc>(q.w, g.W, sw, g.align_corners);
    const T* r0 = x + (q.n * g.H + h.i0) * g.W * C + q.c;
    const T* r1 = x + (q.n * g.H + h.i1) * g.W * C + q.c;
    out[o] = T(h.l0 * (w.l0 * Acc(r0[w.i0 * C]) + w.l1 * Acc(r0[w.i1 * C])) +
               h.l1 * (w.l0 * Acc(r1[w.i0 * C]) + w.l1 * Acc(r1[w.i1 * C])));
  }
}

// gx: (N, H, W, C); gy: (N, OH, OW, C); one thread per input element; sh, sw: linear_scale's
template <typename T, bool kNHWC>
__global__ void bilinear_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, InterpolateGeometry g,
                                         opmath_t<T> sh, opmath_t<T> sw, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = kNHWC ? g.C : 1;
  const auto i0_h = [&](int64_t oh) { return linear_taps<Acc>(oh, g.H, sh, g.align_corners).i0; };
  const auto i0_w = [&](int64_t ow) { return linear_taps<Acc>(ow, g.W, sw, g.align_corners).i0; };
  FRUGAL_GRID_STRIDE(i, n) {
    const Pixel q = unflatten<kNHWC>(i, g.H, g.W, C);
    // An output reads row ih when its i0 is ih, or ih - 1 (i1 = i0 + 1, or i0 at the last row).
    const int64_t oh0 = first_at_least(g.OH, q.h - 1, i0_h), oh1 = first_at_least(g.OH, q.h + 1, i0_h);
    const int64_t ow0 = first_at_least(g.OW, q.w - 1, i0_w), ow1 = first_at_least(g.OW, q.w + 1, i0_w);
    const T* gyp = gy + q.n * g.OH * g.OW * C + q.c;
    Acc s = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const LinearTaps<Acc> h = linear_taps<Acc>(oh, g.H, sh, g.align_corners);
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const LinearTaps<Acc> w = linear_taps<Acc>(ow, g.W, sw, g.align_corners);
        const Acc v = Acc(gyp[(oh * g.OW + ow) * C]);
        // The CPU's order: taps (i0h, i0w), (i0h, i1w), (i1h, i0w), (i1h, i1w).
        if (h.i0 == q.h) {
          if (w.i0 == q.w) s += h.l0 * w.l0 * v;
          if (w.i1 == q.w) s += h.l0 * w.l1 * v;
        }
        if (h.i1 == q.h) {
          if (w.i0 == q.w) s += h.l1 * w.l0 * v;
          if (w.i1 == q.w) s += h.l1 * w.l1 * v;
        }
      }
    }
    gx[i] = T(s);  // the one rounding
  }
}

/// Calls f.template operator()<kNHWC>() for g's layout.
template <typename F>
void by_layout(const InterpolateGeometry& g, F&& f) {
  if (g.channels_last) f.template operator()<true>();
  else f.template operator()<false>();
}

#undef FRUGAL_GRID_STRIDE

}  // namespace

void interpolate_kernel(const Tensor& out, const Tensor& x, const InterpolateGeometry& g) {
  DeviceGuard guard(x.device());
  const int64_t n = out.numel();
  const cudaStream_t stream = stream_for(x);
  dispatch_floating(x.dtype(), "interpolate", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    by_layout(g, [&]<bool kNHWC>() {
      if (g.mode == InterpolateMode::Nearest) {
        nearest_forward_kernel<T, kNHWC>
            <<<grid_for(n), kBlockSize, 0, stream>>>(out.data_ptr<T>(), x.data_ptr<T>(), g, n);
      } else {
        const Acc sh = linear_scale<Acc>(g.H, g.OH, g.align_corners, g.scale_h);
        const Acc sw = linear_scale<Acc>(g.W, g.OW, g.align_corners, g.scale_w);
        bilinear_forward_kernel<T, kNHWC>
            <<<grid_for(n), kBlockSize, 0, stream>>>(out.data_ptr<T>(), x.data_ptr<T>(), g, sh, sw, n);
      }
      FRUGAL_CUDA_CHECK_LAUNCH();
    });
  });
}

void interpolate_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const InterpolateGeometry& g) {
  DeviceGuard guard(grad_x.device());
  const int64_t n = grad_x.numel();
  const cudaStream_t stream = stream_for(grad_x);
  dispatch_floating(grad_x.dtype(), "interpolate_backward", grad_x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    by_layout(g, [&]<bool kNHWC>() {
      if (g.mode == InterpolateMode::Nearest) {
        nearest_backward_kernel<T, kNHWC>
            <<<grid_for(n), kBlockSize, 0, stream>>>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g, n);
      } else {
        const Acc sh = linear_scale<Acc>(g.H, g.OH, g.align_corners, g.scale_h);
        const Acc sw = linear_scale<Acc>(g.W, g.OW, g.align_corners, g.scale_w);
        bilinear_backward_kernel<T, kNHWC>
            <<<grid_for(n), kBlockSize, 0, stream>>>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g, sh, sw, n);
      }
      FRUGAL_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace frugal::ops::cuda
