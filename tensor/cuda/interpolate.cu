// CUDA interpolation (Note [Interpolation source indices] in tensor/ops/interpolate.h).
//
// Every kernel walks an (N, H, W, C) array, as the pooling kernels do (Note [NHWC pooling]
// in tensor/cuda/pool.cu): a channels-last tensor is one as it lies, and a contiguous one
// of P = N C planes is the case C == 1, N = P; the kernels are instanced for both. The
// forward takes one thread per output element in memory order, so stores coalesce (and
// with channels-last, loads too). The backward gathers instead of scattering with
// atomicAdd (what PyTorch does): one thread per input element sums the gradients of the
// outputs that read it in opmath_t, rounding once, so the result is deterministic. The
// nearest modes sum in the CPU's order (the same bits). The interpolating modes sum as the
// forward does, each output row's column sum times the row's weight, with the pixel's
// column weights in registers (kColumns at a time): a contiguous tensor's warp covers 32
// neighbouring pixels of one row, whose column taps lie in 32 different table rows, so
// reading them per output (as the forward can afford, once per element) made the backward
// several times slower than PyTorch's atomics.
//
// Each dim's taps depend only on the output index, and the outputs that reach an input
// index form a range (a binary search on the taps' monotone base finds it), so a small
// kernel first writes them into tables (OH + OW rows of taps, H + W ranges), which the
// main kernels read from cache instead of computing per element; and the main kernels
// index in 32 bits when the tensors allow, as 64-bit division costs several times more.
#include <algorithm>
#include <cstdint>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/nhwc_index.cuh"  // Pixel, unflatten
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/interpolate.h"

namespace frugal::ops::cuda {

namespace {

#define FRUGAL_GRID_STRIDE(I, i, n) \
  for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < (n); i += I(gridDim.x) * I(blockDim.x))

/// One output index's taps along one dim, as the tables hold them (aligned, so a row loads
/// in two or three 16-byte loads).
template <typename Acc>
struct alignas(16) TapRow {
  int32_t i[4];
  Acc w[4];
};

/// The outputs [first, last) whose taps reach one input index.
struct OutputRange {
  int32_t first, last;
};

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

/// The outputs of one dim whose taps reach input index q. Tap k of o is base(o) -
/// tap_offset + k clamped to [0, in - 1], and base never decreases with o, so they are the
/// o with base(o) in [q + offset - K + 1, q + offset] (unbounded below at the first index
/// and above at the last, which the clamped taps repeat).
template <InterpolateMode mode, typename Acc>
__device__ OutputRange outputs_reaching(int64_t q, const ResizeDim<Acc>& d) {
  constexpr int K = tap_count(mode), offset = tap_offset(mode);
  const auto base = [&](int64_t o) { return taps_of<mode, Acc>(o, d).base; };
  const int64_t first = q == 0 ? 0 : first_at_least(d.out, q + offset - K + 1, base);
  const int64_t last = q == d.in - 1 ? d.out : first_at_least(d.out, q + offset + 1, base);
  return {int32_t(first), int32_t(last)};
}

/// The tables of one op: taps rows [OH of H][OW of W], then (the backward's) ranges [H][W].
template <InterpolateMode mode, typename Acc>
__global__ void tables_kernel(ResizeDim<Acc> dh, ResizeDim<Acc> dw, TapRow<Acc>* __restrict__ taps,
                              OutputRange* __restrict__ ranges, int64_t n) {
  FRUGAL_GRID_STRIDE(int64_t, i, n) {
    int64_t j = i;
    const bool is_taps = j < dh.out + dw.out;
    if (!is_taps) j -= dh.out + dw.out;
    const int64_t size_h = is_taps ? dh.out : dh.in;
    const ResizeDim<Acc>& d = j < size_h ? dh : dw;
    const int64_t k = j < size_h ? j : j - size_h;
    if (is_taps) {
      const Taps<Acc> t = taps_of<mode, Acc>(k, d);
      TapRow<Acc> row;
#pragma unroll
      for (int a = 0; a < 4; ++a) row.i[a] = a < tap_count(mode) ? int32_t(t.i[a]) : 0, row.w[a] = t.w[a];
      taps[i] = row;
    } else {
      ranges[j] = outputs_reaching<mode, Acc>(k, d);
    }
  }
}

/// The sizes the main kernels index with, in I.
template <typename I>
struct Sizes {
  I H, W, OH, OW, C;
};

// out: (N, OH, OW, C); x: (N, H, W, C); one thread per output
template <InterpolateMode mode, typename T, bool kNHWC, typename I>
__global__ void resize_forward_kernel(T* __restrict__ out, const T* __restrict__ x, Sizes<I> z,
                                      const TapRow<opmath_t<T>>* __restrict__ th,
                                      const TapRow<opmath_t<T>>* __restrict__ tw, I n) {
  using Acc = opmath_t<T>;
  constexpr int K = tap_count(mode);
  const I C = kNHWC ? z.C : I(1);
  FRUGAL_GRID_STRIDE(I, o, n) {
    const Pixel<I> q = unflatten<kNHWC>(o, z.OH, z.OW, C);
    const TapRow<Acc> h = th[q.h], w = tw[q.w];
    const T* plane = x + q.n * z.H * z.W * C + q.c;
    if constexpr (K == 1) {
      out[o] = plane[(I(h.i[0]) * z.W + I(w.i[0])) * C];  // the nearest modes copy
    } else {
      // The CPU's sums: over row taps a of wh[a] (sum over column taps b of ww[b] x), left to right.
      Acc sum = 0;
#pragma unroll
      for (int a = 0; a < K; ++a) {
        const T* row = plane + I(h.i[a]) * z.W * C;
        Acc r = w.w[0] * Acc(row[I(w.i[0]) * C]);
#pragma unroll
        for (int b = 1; b < K; ++b) r += w.w[b] * Acc(row[I(w.i[b]) * C]);
        sum = a == 0 ? h.w[0] * r : sum + h.w[a] * r;
      }
      out[o] = T(sum);
    }
  }
}

/// The weight with which a tap row reads input index q: its taps' weights at q added (several
/// where clamped taps repeat an edge pixel), 0 where none reads q.
template <int K, typename Acc>
__device__ __forceinline__ Acc weight_at(const TapRow<Acc> t, int32_t q) {
  Acc w = 0;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (t.i[k] == q) w += t.w[k];
  return w;
}

/// Column weights a backward thread holds in registers at a time (bicubic x2 reads 8).
constexpr int kColumns = 8;

// gx: (N, H, W, C); gy: (N, OH, OW, C); one thread per input element
template <InterpolateMode mode, typename T, bool kNHWC, typename I>
__global__ void resize_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, Sizes<I> z,
                                       const TapRow<opmath_t<T>>* __restrict__ th,
                                       const TapRow<opmath_t<T>>* __restrict__ tw, const OutputRange* __restrict__ rh,
                                       const OutputRange* __restrict__ rw, I n) {
  using Acc = opmath_t<T>;
  constexpr int K = tap_count(mode);
  const I C = kNHWC ? z.C : I(1);
  FRUGAL_GRID_STRIDE(I, i, n) {
    const Pixel<I> q = unflatten<kNHWC>(i, z.H, z.W, C);
    const OutputRange hr = rh[q.h], wr = rw[q.w];
    const T* gyp = gy + q.n * z.OH * z.OW * C + q.c;
    Acc s = 0;
    if constexpr (K == 1) {
      // Every output in the ranges read this pixel: their sum in the CPU's order.
      for (int32_t oh = hr.first; oh < hr.last; ++oh) {
        const T* row = gyp + I(oh) * z.OW * C;
        for (int32_t ow = wr.first; ow < wr.last; ++ow) s += Acc(row[I(ow) * C]);
      }
    } else {
      for (int32_t ow0 = wr.first; ow0 < wr.last; ow0 += kColumns) {
        const int32_t columns = min(kColumns, wr.last - ow0);
        Acc ww[kColumns];
#pragma unroll
        for (int j = 0; j < kColumns; ++j) {
          if (j == columns) break;
          ww[j] = weight_at<K>(tw[ow0 + j], int32_t(q.w));
        }
        for (int32_t oh = hr.first; oh < hr.last; ++oh) {
          const T* row = gyp + (I(oh) * z.OW + I(ow0)) * C;
          Acc r = ww[0] * Acc(row[0]);
#pragma unroll
          for (int j = 1; j < kColumns; ++j) {
            if (j == columns) break;
            r += ww[j] * Acc(row[I(j) * C]);
          }
          s += weight_at<K>(th[oh], int32_t(q.h)) * r;
        }
      }
    }
    gx[i] = T(s);  // the one rounding
  }
}

#undef FRUGAL_GRID_STRIDE

/// Runs f.template operator()<kNHWC, I>() for g's layout and the narrowest index type that
/// holds every offset of the `largest` elements.
template <typename F>
void by_layout_and_index(const InterpolateGeometry& g, int64_t largest, F&& f) {
  const bool narrow = largest < (int64_t(1) << 31);
  if (g.channels_last) narrow ? f.template operator()<true, int32_t>() : f.template operator()<true, int64_t>();
  else narrow ? f.template operator()<false, int32_t>() : f.template operator()<false, int64_t>();
}

/// The taps tables (and with_ranges, the output ranges) of g on `device`: a scratch tensor
/// from the caching allocator, freed stream-ordered after the op's kernels.
template <InterpolateMode mode, typename Acc>
struct Tables {
  Tensor storage;
  const TapRow<Acc>* th;
  const TapRow<Acc>* tw;
  const OutputRange* rh;
  const OutputRange* rw;

  Tables(const InterpolateGeometry& g, bool with_ranges, Device device, cudaStream_t stream) {
    const ResizeDim<Acc> dh = resize_dim<Acc>(g.H, g.OH, g.scale_h, g.align_corners);
    const ResizeDim<Acc> dw = resize_dim<Acc>(g.W, g.OW, g.scale_w, g.align_corners);
    const int64_t tap_bytes = int64_t(sizeof(TapRow<Acc>)) * (g.OH + g.OW);
    const int64_t ranges = with_ranges ? g.H + g.W : 0;
    const int64_t words = (tap_bytes + int64_t(sizeof(OutputRange)) * ranges + 7) / 8;
    storage = empty({words}, {kInt64, device});
    auto* taps = reinterpret_cast<TapRow<Acc>*>(storage.data_ptr<int64_t>());
    auto* range = reinterpret_cast<OutputRange*>(reinterpret_cast<char*>(taps) + tap_bytes);
    th = taps, tw = taps + g.OH, rh = range, rw = range + g.H;
    const int64_t n = g.OH + g.OW + ranges;
    tables_kernel<mode, Acc><<<grid_for(n), kBlockSize, 0, stream>>>(dh, dw, taps, range, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  }
};

template <typename I>
Sizes<I> sizes_of(const InterpolateGeometry& g) {
  return {I(g.H), I(g.W), I(g.OH), I(g.OW), I(g.C)};
}

}  // namespace

void interpolate_kernel(const Tensor& out, const Tensor& x, const InterpolateGeometry& g) {
  DeviceGuard guard(x.device());
  const cudaStream_t stream = stream_for(x);
  const int64_t n = out.numel();
  dispatch_floating(x.dtype(), "interpolate", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    visit_tap_mode(g.mode, "CUDA", [&]<InterpolateMode mode>() {
      const Tables<mode, Acc> t(g, /*with_ranges=*/false, x.device(), stream);
      by_layout_and_index(g, std::max(n, x.numel()), [&]<bool kNHWC, typename I>() {
        resize_forward_kernel<mode, T, kNHWC, I><<<grid_for(n), kBlockSize, 0, stream>>>(
            out.data_ptr<T>(), x.data_ptr<T>(), sizes_of<I>(g), t.th, t.tw, I(n));
        FRUGAL_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void interpolate_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const InterpolateGeometry& g) {
  DeviceGuard guard(grad_x.device());
  const cudaStream_t stream = stream_for(grad_x);
  const int64_t n = grad_x.numel();
  dispatch_floating(grad_x.dtype(), "interpolate_backward", grad_x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    visit_tap_mode(g.mode, "CUDA", [&]<InterpolateMode mode>() {
      const Tables<mode, Acc> t(g, /*with_ranges=*/true, grad_x.device(), stream);
      by_layout_and_index(g, std::max(n, grad_out.numel()), [&]<bool kNHWC, typename I>() {
        resize_backward_kernel<mode, T, kNHWC, I><<<grid_for(n), kBlockSize, 0, stream>>>(
            grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), sizes_of<I>(g), t.th, t.tw, t.rh, t.rw, I(n));
        FRUGAL_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace frugal::ops::cuda
