// CUDA pooling (Note [Pooling windows] in tensor/ops/pool.h).
//
// Forward kernels: one thread per output element in memory order, so stores coalesce:
// consecutive threads take consecutive output columns (NCHW) or channels (NHWC, whose
// window loads then coalesce too). NCHW adaptive pooling with large windows (global
// average pooling: 7x7 -> 1x1 in ResNet) gives each output a warp instead, whose lanes
// read the window's rows coalesced and sum with a shuffle reduction. Backward kernels
// gather: one thread per input element loops over the few outputs whose window can hold
// it, so no atomics are needed and the result is deterministic and rounded once.
//
// Note [NHWC pooling]
// Every kernel walks an (N, H, W, C) array: element (n, h, w, c) at ((n H + h) W + w) C + c.
// A channels-last (N, C, H, W) tensor is one as it lies; a contiguous one of P = N C
// planes is the case C == 1, N = P. So one kernel body serves both layouts, instanced
// for each (kNHWC; NCHW's C is the constant 1). Max pooling's indices stay the flat
// ih * W + iw in the plane in both, so its backward and autograd do not see the layout.
#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/ops/pool.h"

namespace frugal::ops::cuda {

namespace {

constexpr int64_t kWarpWindow = 32;  // adaptive windows of at least this many elements get a warp each

#define FRUGAL_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

/// One element of an (N, H, W, C) array, the layout every kernel below walks: a
/// channels-last tensor is one (N = samples), and an NCHW tensor of P planes is the case
/// C == 1, N = P (Note [NHWC pooling]).
struct Pixel {
  int64_t n, h, w, c;
};

/// The array's channel count: g.C when channels-last, else 1 (a compile-time 1, so the
/// NCHW kernels pay no extra division).
template <bool kNHWC>
__device__ __forceinline__ int64_t lanes(const Pool2dGeometry& g) {
  return kNHWC ? g.C : 1;
}

/// The flat index i of an (N, H, W, C) array as its coordinates.
template <bool kNHWC>
__device__ __forceinline__ Pixel unflatten(int64_t i, int64_t H, int64_t W, int64_t C) {
  Pixel p;
  if constexpr (kNHWC) p.c = i % C, i /= C;
  else p.c = 0;
  p.w = i % W, i /= W;
  p.h = i % H, p.n = i / H;
  return p;
}

// out, idx: (N, OH, OW, C); x: (N, H, W, C)
template <typename T, bool kNHWC>
__global__ void max_pool_forward_kernel(T* __restrict__ out, int64_t* __restrict__ idx, const T* __restrict__ x,
                                        Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = lanes<kNHWC>(g);
  FRUGAL_GRID_STRIDE(o, n) {
    const Pixel q = unflatten<kNHWC>(o, g.OH, g.OW, C);
    const T* xp = x + q.n * g.H * g.W * C + q.c;  // (H, W) with row stride W * C, column stride C
    const int64_t h0 = q.h * g.stride.h - g.padding.h, w0 = q.w * g.stride.w - g.padding.w;
    Acc best = 0;
    int64_t arg = -1;
    for (int64_t i = 0; i < g.kernel.h; ++i) {
      const int64_t ih = h0 + i * g.dilation.h;
      if (ih < 0 || ih >= g.H) continue;
      for (int64_t j = 0; j < g.kernel.w; ++j) {
        const int64_t iw = w0 + j * g.dilation.w;
        if (iw < 0 || iw >= g.W) continue;
        const Acc v = Acc(xp[(ih * g.W + iw) * C]);
        if (arg < 0 || v > best || isnan(v)) best = v, arg = ih * g.W + iw;
      }
    }
    out[o] = arg < 0 ? T(Acc(-INFINITY)) : T(best);  // a window entirely in the padding: -inf, index -1
    idx[o] = arg;  // the flat index in the plane whatever the layout (Note [Pooling windows])
  }
}

/// The outputs [lo, hi) along one dim whose window (dilated extent `eff`) can hold input i.
__device__ __forceinline__ void covering(int64_t i, int64_t pad, int64_t eff, int64_t stride, int64_t out_size,
                                         int64_t* lo, int64_t* hi) {
  *lo = i + pad < eff ? 0 : (i + pad - eff) / stride + 1;
  const int64_t h = (i + pad) / stride + 1;
  *hi = h < out_size ? h : out_size;
}

// gx: (N, H, W, C); gy, idx: (N, OH, OW, C)
template <typename T, bool kNHWC>
__global__ void max_pool_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, const int64_t* __restrict__ idx,
                                         Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = lanes<kNHWC>(g);
  const int64_t eff_h = (g.kernel.h - 1) * g.dilation.h + 1, eff_w = (g.kernel.w - 1) * g.dilation.w + 1;
  FRUGAL_GRID_STRIDE(i, n) {
    const Pixel q = unflatten<kNHWC>(i, g.H, g.W, C);
    int64_t oh0, oh1, ow0, ow1;
    covering(q.h, g.padding.h, eff_h, g.stride.h, g.OH, &oh0, &oh1);
    covering(q.w, g.padding.w, eff_w, g.stride.w, g.OW, &ow0, &ow1);
    const int64_t target = q.h * g.W + q.w, base = q.n * g.OH * g.OW * C + q.c;
    Acc s = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t o = base + (oh * g.OW + ow) * C;
        if (idx[o] == target) s += Acc(gy[o]);
      }
    gx[i] = T(s);
  }
}

// out: (N, OH, OW, C); x: (N, H, W, C)
template <typename T, bool kNHWC>
__global__ void avg_pool_forward_kernel(T* __restrict__ out, const T* __restrict__ x, Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = lanes<kNHWC>(g);
  FRUGAL_GRID_STRIDE(o, n) {
    const Pixel q = unflatten<kNHWC>(o, g.OH, g.OW, C);
    int64_t h0, h1, w0, w1;
    const int64_t ph = avg_window(q.h, g.stride.h, g.padding.h, g.kernel.h, g.H, &h0, &h1);
    const int64_t pw = avg_window(q.w, g.stride.w, g.padding.w, g.kernel.w, g.W, &w0, &w1);
    const T* xp = x + q.n * g.H * g.W * C + q.c;
    Acc s = 0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) s += Acc(xp[(ih * g.W + iw) * C]);
    out[o] = T(s / Acc(g.count_include_pad ? ph * pw : (h1 - h0) * (w1 - w0)));
  }
}

// gx: (N, H, W, C); gy: (N, OH, OW, C)
template <typename T, bool kNHWC>
__global__ void avg_pool_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = lanes<kNHWC>(g);
  FRUGAL_GRID_STRIDE(i, n) {
    const Pixel q = unflatten<kNHWC>(i, g.H, g.W, C);
    int64_t oh0, oh1, ow0, ow1;
    covering(q.h, g.padding.h, g.kernel.h, g.stride.h, g.OH, &oh0, &oh1);
    covering(q.w, g.padding.w, g.kernel.w, g.stride.w, g.OW, &ow0, &ow1);
    const T* gyp = gy + q.n * g.OH * g.OW * C + q.c;
    Acc s = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      int64_t h0, h1;
      const int64_t ph = avg_window(oh, g.stride.h, g.padding.h, g.kernel.h, g.H, &h0, &h1);
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        int64_t w0, w1;
        const int64_t pw = avg_window(ow, g.stride.w, g.padding.w, g.kernel.w, g.W, &w0, &w1);
        s += Acc(gyp[(oh * g.OW + ow) * C]) / Acc(g.count_include_pad ? ph * pw : (h1 - h0) * (w1 - w0));
      }
    }
    gx[i] = T(s);
  }
}

// out: (N, OH, OW, C); x: (N, H, W, C); one thread per output
template <typename T, bool kNHWC>
__global__ void adaptive_forward_kernel(T* __restrict__ out, const T* __restrict__ x, Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = lanes<kNHWC>(g);
  FRUGAL_GRID_STRIDE(o, n) {
    const Pixel q = unflatten<kNHWC>(o, g.OH, g.OW, C);
    const int64_t h0 = adaptive_start(q.h, g.H, g.OH), h1 = adaptive_end(q.h, g.H, g.OH);
    const int64_t w0 = adaptive_start(q.w, g.W, g.OW), w1 = adaptive_end(q.w, g.W, g.OW);
    const T* xp = x + q.n * g.H * g.W * C + q.c;
    Acc s = 0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) s += Acc(xp[(ih * g.W + iw) * C]);
    out[o] = T(s / Acc((h1 - h0) * (w1 - w0)));
  }
}

// out: (P, OH, OW); x: (P, H, W); one warp per output, lanes over the window's elements
template <typename T>
__global__ void adaptive_forward_warp_kernel(T* __restrict__ out, const T* __restrict__ x, Pool2dGeometry g,
                                             int64_t n) {
  using Acc = opmath_t<T>;
  const int lane = int(threadIdx.x % 32);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t o = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; o < n; o += warps) {
    const int64_t ow = o % g.OW, oh = (o / g.OW) % g.OH, p = o / (g.OW * g.OH);
    const int64_t h0 = adaptive_start(oh, g.H, g.OH), h1 = adaptive_end(oh, g.H, g.OH);
    const int64_t w0 = adaptive_start(ow, g.W, g.OW), w1 = adaptive_end(ow, g.W, g.OW);
    const int64_t ww = w1 - w0, count = (h1 - h0) * ww;
    const T* xp = x + p * g.H * g.W + h0 * g.W + w0;
    Acc s = 0;
    for (int64_t e = lane; e < count; e += 32) s += Acc(xp[(e / ww) * g.W + e % ww]);
    s = warp_allreduce(s, [](Acc a, Acc b) { return a + b; });
    if (lane == 0) out[o] = T(s / Acc(count));
  }
}

// gx: (N, H, W, C); gy: (N, OH, OW, C)
template <typename T, bool kNHWC>
__global__ void adaptive_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = lanes<kNHWC>(g);
  FRUGAL_GRID_STRIDE(i, n) {
    const Pixel q = unflatten<kNHWC>(i, g.H, g.W, C);
    // Outputs whose window [start, end) holds ih: floor(ih OH / H) <= oh < ceil((ih + 1) OH / H).
    const int64_t oh0 = adaptive_start(q.h, g.OH, g.H), oh1 = adaptive_end(q.h, g.OH, g.H);
    const int64_t ow0 = adaptive_start(q.w, g.OW, g.W), ow1 = adaptive_end(q.w, g.OW, g.W);
    const T* gyp = gy + q.n * g.OH * g.OW * C + q.c;
    Acc s = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t h0 = adaptive_start(oh, g.H, g.OH), h1 = adaptive_end(oh, g.H, g.OH);
      if (q.h < h0 || q.h >= h1) continue;
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t w0 = adaptive_start(ow, g.W, g.OW), w1 = adaptive_end(ow, g.W, g.OW);
        if (q.w < w0 || q.w >= w1) continue;
        s += Acc(gyp[(oh * g.OW + ow) * C]) / Acc((h1 - h0) * (w1 - w0));
      }
    }
    gx[i] = T(s);
  }
}

#undef FRUGAL_GRID_STRIDE

}  // namespace

// Each launcher takes the kernel instance of the geometry's layout.
#define FRUGAL_POOL_KERNEL(kernel) (g.channels_last ? kernel<T, true> : kernel<T, false>)

void max_pool2d_kernel(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g) {
  DeviceGuard guard(x.device());
  const int64_t n = out.numel();
  dispatch_floating(x.dtype(), "max_pool2d", x.device(), [&]<typename T>() {
    FRUGAL_POOL_KERNEL(max_pool_forward_kernel)<<<grid_for(n), kBlockSize, 0, stream_for(x)>>>(
        out.data_ptr<T>(), indices.data_ptr<int64_t>(), x.data_ptr<T>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void max_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                                const Pool2dGeometry& g) {
  DeviceGuard guard(grad_x.device());
  const int64_t n = grad_x.numel();
  dispatch_floating(grad_x.dtype(), "max_pool2d_backward", grad_x.device(), [&]<typename T>() {
    FRUGAL_POOL_KERNEL(max_pool_backward_kernel)<<<grid_for(n), kBlockSize, 0, stream_for(grad_x)>>>(
        grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), indices.data_ptr<int64_t>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g) {
  DeviceGuard guard(x.device());
  const int64_t n = out.numel();
  dispatch_floating(x.dtype(), "avg_pool2d", x.device(), [&]<typename T>() {
    FRUGAL_POOL_KERNEL(avg_pool_forward_kernel)<<<grid_for(n), kBlockSize, 0, stream_for(x)>>>(out.data_ptr<T>(),
                                                                                               x.data_ptr<T>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g) {
  DeviceGuard guard(grad_x.device());
  const int64_t n = grad_x.numel();
  dispatch_floating(grad_x.dtype(), "avg_pool2d_backward", grad_x.device(), [&]<typename T>() {
    FRUGAL_POOL_KERNEL(avg_pool_backward_kernel)<<<grid_for(n), kBlockSize, 0, stream_for(grad_x)>>>(
        grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void adaptive_avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g) {
  DeviceGuard guard(x.device());
  const int64_t n = out.numel();
  // The typical window: ceil(H / OH) rows by ceil(W / OW) columns. Channels-last windows
  // always take a thread per output: its neighbours read the neighbouring channels.
  const int64_t window = ((g.H + g.OH - 1) / g.OH) * ((g.W + g.OW - 1) / g.OW);
  dispatch_floating(x.dtype(), "adaptive_avg_pool2d", x.device(), [&]<typename T>() {
    if (window >= kWarpWindow && !g.channels_last) {
      adaptive_forward_warp_kernel<T>
          <<<grid_for(n * 32), kBlockSize, 0, stream_for(x)>>>(out.data_ptr<T>(), x.data_ptr<T>(), g, n);
    } else {
      FRUGAL_POOL_KERNEL(adaptive_forward_kernel)<<<grid_for(n), kBlockSize, 0, stream_for(x)>>>(out.data_ptr<T>(),
                                                                                                 x.data_ptr<T>(), g, n);
    }
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void adaptive_avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g) {
  DeviceGuard guard(grad_x.device());
  const int64_t n = grad_x.numel();
  dispatch_floating(grad_x.dtype(), "adaptive_avg_pool2d_backward", grad_x.device(), [&]<typename T>() {
    FRUGAL_POOL_KERNEL(adaptive_backward_kernel)<<<grid_for(n), kBlockSize, 0, stream_for(grad_x)>>>(
        grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

#undef FRUGAL_POOL_KERNEL

}  // namespace frugal::ops::cuda
