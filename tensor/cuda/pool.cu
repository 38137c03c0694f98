// CUDA pooling (Note [Pooling windows] in tensor/ops/pool.h).
//
// Forward kernels: one thread per output element, consecutive threads on consecutive
// output columns, so stores coalesce and the window loads of a warp overlap in cache.
// Adaptive pooling with large windows (global average pooling: 7x7 -> 1x1 in ResNet)
// gives each output a warp instead, whose lanes read the window's rows coalesced and
// sum with a shuffle reduction. Backward kernels gather: one thread per input element
// loops over the few outputs whose window can hold it, so no atomics are needed and
// the result is deterministic and rounded once.
#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/ops/pool.h"

namespace frugal::ops::cuda {

namespace {

constexpr int64_t kWarpWindow = 32;  // adaptive windows of at least this many elements get a warp each

#define FRUGAL_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// out, idx: (P, OH, OW); x: (P, H, W)
template <typename T>
__global__ void max_pool_forward_kernel(T* __restrict__ out, int64_t* __restrict__ idx, const T* __restrict__ x,
                                        Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  FRUGAL_GRID_STRIDE(o, n) {
    const int64_t ow = o % g.OW, oh = (o / g.OW) % g.OH, p = o / (g.OW * g.OH);
    const T* xp = x + p * g.H * g.W;
    const int64_t h0 = oh * g.stride.h - g.padding.h, w0 = ow * g.stride.w - g.padding.w;
    Acc best = 0;
    int64_t arg = -1;
    for (int64_t i = 0; i < g.kernel.h; ++i) {
      const int64_t ih = h0 + i * g.dilation.h;
      if (ih < 0 || ih >= g.H) continue;
      for (int64_t j = 0; j < g.kernel.w; ++j) {
        const int64_t iw = w0 + j * g.dilation.w;
        if (iw < 0 || iw >= g.W) continue;
        const Acc v = Acc(xp[ih * g.W + iw]);
        if (arg < 0 || v > best || isnan(v)) best = v, arg = ih * g.W + iw;
      }
    }
    out[o] = T(best);
    idx[o] = arg;
  }
}

/// The outputs [lo, hi) along one dim whose window (dilated extent `eff`) can hold input i.
__device__ __forceinline__ void covering(int64_t i, int64_t pad, int64_t eff, int64_t stride, int64_t out_size,
                                         int64_t* lo, int64_t* hi) {
  *lo = i + pad < eff ? 0 : (i + pad - eff) / stride + 1;
  const int64_t h = (i + pad) / stride + 1;
  *hi = h < out_size ? h : out_size;
}

// gx: (P, H, W); gy, idx: (P, OH, OW)
template <typename T>
__global__ void max_pool_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, const int64_t* __restrict__ idx,
                                         Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t eff_h = (g.kernel.h - 1) * g.dilation.h + 1, eff_w = (g.kernel.w - 1) * g.dilation.w + 1;
  FRUGAL_GRID_STRIDE(i, n) {
    const int64_t iw = i % g.W, ih = (i / g.W) % g.H, p = i / (g.W * g.H);
    int64_t oh0, oh1, ow0, ow1;
    covering(ih, g.padding.h, eff_h, g.stride.h, g.OH, &oh0, &oh1);
    covering(iw, g.padding.w, eff_w, g.stride.w, g.OW, &ow0, &ow1);
    const int64_t target = ih * g.W + iw, base = p * g.OH * g.OW;
    Acc s = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow)
        if (idx[base + oh * g.OW + ow] == target) s += Acc(gy[base + oh * g.OW + ow]);
    gx[i] = T(s);
  }
}

// out: (P, OH, OW); x: (P, H, W)
template <typename T>
__global__ void avg_pool_forward_kernel(T* __restrict__ out, const T* __restrict__ x, Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  FRUGAL_GRID_STRIDE(o, n) {
    const int64_t ow = o % g.OW, oh = (o / g.OW) % g.OH, p = o / (g.OW * g.OH);
    int64_t h0, h1, w0, w1;
    const int64_t ph = avg_window(oh, g.stride.h, g.padding.h, g.kernel.h, g.H, &h0, &h1);
    const int64_t pw = avg_window(ow, g.stride.w, g.padding.w, g.kernel.w, g.W, &w0, &w1);
    const T* xp = x + p * g.H * g.W;
    Acc s = 0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) s += Acc(xp[ih * g.W + iw]);
    out[o] = T(s / Acc(g.count_include_pad ? ph * pw : (h1 - h0) * (w1 - w0)));
  }
}

// gx: (P, H, W); gy: (P, OH, OW)
template <typename T>
__global__ void avg_pool_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  FRUGAL_GRID_STRIDE(i, n) {
    const int64_t iw = i % g.W, ih = (i / g.W) % g.H, p = i / (g.W * g.H);
    int64_t oh0, oh1, ow0, ow1;
    covering(ih, g.padding.h, g.kernel.h, g.stride.h, g.OH, &oh0, &oh1);
    covering(iw, g.padding.w, g.kernel.w, g.stride.w, g.OW, &ow0, &ow1);
    const T* gyp = gy + p * g.OH * g.OW;
    Acc s = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      int64_t h0, h1;
      const int64_t ph = avg_window(oh, g.stride.h, g.padding.h, g.kernel.h, g.H, &h0, &h1);
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        int64_t w0, w1;
        const int64_t pw = avg_window(ow, g.stride.w, g.padding.w, g.kernel.w, g.W, &w0, &w1);
        s += Acc(gyp[oh * g.OW + ow]) / Acc(g.count_include_pad ? ph * pw : (h1 - h0) * (w1 - w0));
      }
    }
    gx[i] = T(s);
  }
}

// out: (P, OH, OW); x: (P, H, W); one thread per output
template <typename T>
__global__ void adaptive_forward_kernel(T* __restrict__ out, const T* __restrict__ x, Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  FRUGAL_GRID_STRIDE(o, n) {
    const int64_t ow = o % g.OW, oh = (o / g.OW) % g.OH, p = o / (g.OW * g.OH);
    const int64_t h0 = adaptive_start(oh, g.H, g.OH), h1 = adaptive_end(oh, g.H, g.OH);
    const int64_t w0 = adaptive_start(ow, g.W, g.OW), w1 = adaptive_end(ow, g.W, g.OW);
    const T* xp = x + p * g.H * g.W;
    Acc s = 0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) s += Acc(xp[ih * g.W + iw]);
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

// gx: (P, H, W); gy: (P, OH, OW)
template <typename T>
__global__ void adaptive_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  FRUGAL_GRID_STRIDE(i, n) {
    const int64_t iw = i % g.W, ih = (i / g.W) % g.H, p = i / (g.W * g.H);
    // Outputs whose window [start, end) holds ih: floor(ih OH / H) <= oh < ceil((ih + 1) OH / H).
    const int64_t oh0 = adaptive_start(ih, g.OH, g.H), oh1 = adaptive_end(ih, g.OH, g.H);
    const int64_t ow0 = adaptive_start(iw, g.OW, g.W), ow1 = adaptive_end(iw, g.OW, g.W);
    const T* gyp = gy + p * g.OH * g.OW;
    Acc s = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t h0 = adaptive_start(oh, g.H, g.OH), h1 = adaptive_end(oh, g.H, g.OH);
      if (ih < h0 || ih >= h1) continue;
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t w0 = adaptive_start(ow, g.W, g.OW), w1 = adaptive_end(ow, g.W, g.OW);
        if (iw < w0 || iw >= w1) continue;
        s += Acc(gyp[oh * g.OW + ow]) / Acc((h1 - h0) * (w1 - w0));
      }
    }
    gx[i] = T(s);
  }
}

#undef FRUGAL_GRID_STRIDE

}  // namespace

void max_pool2d_kernel(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g) {
  DeviceGuard guard(x.device());
  const int64_t n = out.numel();
  dispatch_floating(x.dtype(), "max_pool2d", x.device(), [&]<typename T>() {
    max_pool_forward_kernel<T><<<grid_for(n), kBlockSize, 0, stream_for(x)>>>(
        out.data_ptr<T>(), indices.data_ptr<int64_t>(), x.data_ptr<T>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void max_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                                const Pool2dGeometry& g) {
  DeviceGuard guard(grad_x.device());
  const int64_t n = grad_x.numel();
  dispatch_floating(grad_x.dtype(), "max_pool2d_backward", grad_x.device(), [&]<typename T>() {
    max_pool_backward_kernel<T><<<grid_for(n), kBlockSize, 0, stream_for(grad_x)>>>(
        grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), indices.data_ptr<int64_t>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g) {
  DeviceGuard guard(x.device());
  const int64_t n = out.numel();
  dispatch_floating(x.dtype(), "avg_pool2d", x.device(), [&]<typename T>() {
    avg_pool_forward_kernel<T><<<grid_for(n), kBlockSize, 0, stream_for(x)>>>(out.data_ptr<T>(), x.data_ptr<T>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g) {
  DeviceGuard guard(grad_x.device());
  const int64_t n = grad_x.numel();
  dispatch_floating(grad_x.dtype(), "avg_pool2d_backward", grad_x.device(), [&]<typename T>() {
    avg_pool_backward_kernel<T>
        <<<grid_for(n), kBlockSize, 0, stream_for(grad_x)>>>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void adaptive_avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g) {
  DeviceGuard guard(x.device());
  const int64_t n = out.numel();
  // The typical window: ceil(H / OH) rows by ceil(W / OW) columns.
  const int64_t window = ((g.H + g.OH - 1) / g.OH) * ((g.W + g.OW - 1) / g.OW);
  dispatch_floating(x.dtype(), "adaptive_avg_pool2d", x.device(), [&]<typename T>() {
    if (window >= kWarpWindow) {
      adaptive_forward_warp_kernel<T>
          <<<grid_for(n * 32), kBlockSize, 0, stream_for(x)>>>(out.data_ptr<T>(), x.data_ptr<T>(), g, n);
    } else {
      adaptive_forward_kernel<T>
          <<<grid_for(n), kBlockSize, 0, stream_for(x)>>>(out.data_ptr<T>(), x.data_ptr<T>(), g, n);
    }
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void adaptive_avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g) {
  DeviceGuard guard(grad_x.device());
  const int64_t n = grad_x.numel();
  dispatch_floating(grad_x.dtype(), "adaptive_avg_pool2d_backward", grad_x.device(), [&]<typename T>() {
    adaptive_backward_kernel<T>
        <<<grid_for(n), kBlockSize, 0, stream_for(grad_x)>>>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g, n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
