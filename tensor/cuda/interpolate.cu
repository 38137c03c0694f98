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
template <InterpolateMode mode, typename T, bool kNHWC>
__global__ void resize_forward_kernel(T* __restrict__ out, const T* __restrict__ x, InterpolateGeometry g,
                                      ResizeDim<opmath_t<T>> dh, ResizeDim<opmath_t<T>> dw, int64_t n) {
  using Acc = opmath_t<T>;
  constexpr int K = tap_count(mode);
  const int64_t C = kNHWC ? g.C : 1;
  FRUGAL_GRID_STRIDE(o, n) {
    const Pixel q = unflatten<kNHWC>(o, g.OH, g.OW, C);
    const Taps<Acc> h = taps_of<mode, Acc>(q.h, dh), w = taps_of<mode, Acc>(q.w, dw);
    const T* plane = x + q.n * g.H * g.W * C + q.c;
    if constexpr (K == 1) {
      out[o] = plane[(h.i[0] * g.W + w.i[0]) * C];  // the nearest modes copy
    } else {
      // The CPU's sums: over row taps a of wh[a] (sum over column taps b of ww[b] x), left to right.
      Acc sum = 0;
#pragma unroll
      for (int a = 0; a < K; ++a) {
        const T* row = plane + h.i[a] * g.W * C;
        Acc r = w.w[0] * Acc(row[w.i[0] * C]);
#pragma unroll
        for (int b = 1; b < K; ++b) r += w.w[b] * Acc(row[w.i[b] * C]);
        sum = a == 0 ? h.w[0] * r : sum + h.w[a] * r;
      }
      out[o] = T(sum);
    }
  }
}

/// The outputs of one dim whose taps reach input index q: [first, last) of o. Tap k of o is
/// base(o) - tap_offset + k clamped to [0, in - 1], and base never decreases with o, so
/// they are the o with base(o) in [q + offset - K + 1, q + offset] (unbounded below at the
/// first index and above at the last, which the clamped taps repeat).
template <InterpolateMode mode, typename Acc>
__device__ __forceinline__ void outputs_reaching(int64_t q, const ResizeDim<Acc>& d, int64_t& first, int64_t& last) {
  constexpr int K = tap_count(mode), offset = tap_offset(mode);
  const auto base = [&](int64_t o) { return taps_of<mode, Acc>(o, d).base; };
  first = q == 0 ? 0 : first_at_least(d.out, q + offset - K + 1, base);
  last = q == d.in - 1 ? d.out : first_at_least(d.out, q + offset + 1, base);
}

// gx: (N, H, W, C); gy: (N, OH, OW, C); one thread per input element
template <InterpolateMode mode, typename T, bool kNHWC>
__global__ void resize_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, InterpolateGeometry g,
                                       ResizeDim<opmath_t<T>> dh, ResizeDim<opmath_t<T>> dw, int64_t n) {
  using Acc = opmath_t<T>;
  constexpr int K = tap_count(mode);
  const int64_t C = kNHWC ? g.C : 1;
  FRUGAL_GRID_STRIDE(i, n) {
    const Pixel q = unflatten<kNHWC>(i, g.H, g.W, C);
    int64_t oh0, oh1, ow0, ow1;
    outputs_reaching<mode, Acc>(q.h, dh, oh0, oh1);
    outputs_reaching<mode, Acc>(q.w, dw, ow0, ow1);
    const T* gyp = gy + q.n * g.OH * g.OW * C + q.c;
    Acc s = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const Taps<Acc> h = taps_of<mode, Acc>(oh, dh);
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const Taps<Acc> w = taps_of<mode, Acc>(ow, dw);
        const Acc v = Acc(gyp[(oh * g.OW + ow) * C]);
        // The CPU's order: row taps a, then column taps b.
#pragma unroll
        for (int a = 0; a < K; ++a) {
          if (h.i[a] != q.h) continue;
#pragma unroll
          for (int b = 0; b < K; ++b)
            if (w.i[b] == q.w) s += K == 1 ? v : h.w[a] * w.w[b] * v;
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

/// Launches kernel<mode, T, kNHWC> over n threads for g's mode and layout.
template <typename T, template <InterpolateMode, typename, bool> class Launch>
void launch(const InterpolateGeometry& g, int64_t n, cudaStream_t stream, T* dst, const T* src) {
  using Acc = opmath_t<T>;
  const ResizeDim<Acc> dh = resize_dim<Acc>(g.H, g.OH, g.scale_h, g.align_corners);
  const ResizeDim<Acc> dw = resize_dim<Acc>(g.W, g.OW, g.scale_w, g.align_corners);
  by_layout(g, [&]<bool kNHWC>() {
    switch (g.mode) {
      case InterpolateMode::Nearest:
        Launch<InterpolateMode::Nearest, T, kNHWC>::run(g, n, stream, dst, src, dh, dw);
        break;
      case InterpolateMode::NearestExact:
        Launch<InterpolateMode::NearestExact, T, kNHWC>::run(g, n, stream, dst, src, dh, dw);
        break;
      case InterpolateMode::Bilinear:
        Launch<InterpolateMode::Bilinear, T, kNHWC>::run(g, n, stream, dst, src, dh, dw);
        break;
      case InterpolateMode::Bicubic:
        Launch<InterpolateMode::Bicubic, T, kNHWC>::run(g, n, stream, dst, src, dh, dw);
        break;
      case InterpolateMode::Area: FRUGAL_FAIL("interpolate: the CUDA kernel has no mode area");
    }
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

template <InterpolateMode mode, typename T, bool kNHWC>
struct Forward {
  static void run(const InterpolateGeometry& g, int64_t n, cudaStream_t stream, T* out, const T* x,
                  const ResizeDim<opmath_t<T>>& dh, const ResizeDim<opmath_t<T>>& dw) {
    resize_forward_kernel<mode, T, kNHWC><<<grid_for(n), kBlockSize, 0, stream>>>(out, x, g, dh, dw, n);
  }
};

template <InterpolateMode mode, typename T, bool kNHWC>
struct Backward {
  static void run(const InterpolateGeometry& g, int64_t n, cudaStream_t stream, T* gx, const T* gy,
                  const ResizeDim<opmath_t<T>>& dh, const ResizeDim<opmath_t<T>>& dw) {
    resize_backward_kernel<mode, T, kNHWC><<<grid_for(n), kBlockSize, 0, stream>>>(gx, gy, g, dh, dw, n);
  }
};

}  // namespace

void interpolate_kernel(const Tensor& out, const Tensor& x, const InterpolateGeometry& g) {
  DeviceGuard guard(x.device());
  const cudaStream_t stream = stream_for(x);
  dispatch_floating(x.dtype(), "interpolate", x.device(), [&]<typename T>() {
    launch<T, Forward>(g, out.numel(), stream, out.data_ptr<T>(), x.data_ptr<T>());
  });
}

void interpolate_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const InterpolateGeometry& g) {
  DeviceGuard guard(grad_x.device());
  const cudaStream_t stream = stream_for(grad_x);
  dispatch_floating(grad_x.dtype(), "interpolate_backward", grad_x.device(), [&]<typename T>() {
    launch<T, Backward>(g, grad_x.numel(), stream, grad_x.data_ptr<T>(), grad_out.data_ptr<T>());
  });
}

}  // namespace frugal::ops::cuda
