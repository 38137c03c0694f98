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
// The max-pool kernels go further when C is a multiple of a 16-byte vector's elements
// (8 float16/bfloat16, 4 float32) and the operands are 16-byte aligned: a thread then
// takes that many consecutive channels of one pixel, so every load and store is 16
// bytes wide (8 bytes for the one-byte argmax offsets of Note [Window-local max-pool
// indices] in tensor/ops/pool.h), and their index math runs in 32 bits when every
// offset fits (64-bit division costs several times as much on the GPU).
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/loops.cuh"  // Vec
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/pool.h"

namespace frugal::ops::cuda {

namespace {

constexpr int64_t kWarpWindow = 32;  // adaptive windows of at least this many elements get a warp each

#define FRUGAL_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

/// One element of an (N, H, W, C) array, the layout every kernel below walks: a
/// channels-last tensor is one (N = samples), and an NCHW tensor of P planes is the case
/// C == 1, N = P (Note [NHWC pooling]).
template <typename I>
struct Pixel {
  I n, h, w, c;
};

/// The array's channel count: g.C when channels-last, else 1 (a compile-time 1, so the
/// NCHW kernels pay no extra division).
template <bool kNHWC, typename I = int64_t>
__device__ __forceinline__ I lanes(const Pool2dGeometry& g) {
  return kNHWC ? I(g.C) : I(1);
}

/// The flat index i of an (N, H, W, C) array as its coordinates.
template <bool kNHWC, typename I>
__device__ __forceinline__ Pixel<I> unflatten(I i, I H, I W, I C) {
  Pixel<I> p;
  if constexpr (kNHWC) p.c = i % C, i /= C;
  else p.c = 0;
  p.w = i % W, i /= W;
  p.h = i % H, p.n = i / H;
  return p;
}

/// Which argmax a max-pool forward writes: PyTorch's int64 flat index ih * W + iw in the
/// plane, or the one-byte window offset i * kernel_w + j (Note [Window-local max-pool
/// indices] in tensor/ops/pool.h).
enum class Argmax { kFlat, kWindow };

// out: (N, OH, OW, C), or null for the argmax alone; idx: (N, OH, OW, C), int64 (kFlat) or
// uint8 (kWindow), or null for the maxima alone; x: (N, H, W, C). A thread takes kVec
// consecutive channels of one output (Note [NHWC pooling]); n: outputs / kVec.
template <typename T, bool kNHWC, int kVec, Argmax kArg, typename I>
__global__ void max_pool_forward_kernel(T* __restrict__ out, void* __restrict__ idx, const T* __restrict__ x,
                                        Pool2dGeometry g, I n) {
  using Acc = opmath_t<T>;
  const I C = lanes<kNHWC, I>(g), H = I(g.H), W = I(g.W), OH = I(g.OH), OW = I(g.OW);
  const I kh = I(g.kernel.h), kw = I(g.kernel.w), dh = I(g.dilation.h), dw = I(g.dilation.w);
  for (I v = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); v < n; v += I(gridDim.x) * I(blockDim.x)) {
    const I o = v * kVec;
    const auto q = unflatten<kNHWC>(o, OH, OW, C);
    const T* xp = x + q.n * H * W * C + q.c;  // (H, W) with row stride W * C, column stride C
    const I h0 = q.h * I(g.stride.h) - I(g.padding.h), w0 = q.w * I(g.stride.w) - I(g.padding.w);
    Acc best[kVec];
    int arg[kVec];  // the window offset i * kw + j of the maximum so far; -1: no input pixel yet
#pragma unroll
    for (int k = 0; k < kVec; ++k) best[k] = Acc(0), arg[k] = -1;
    for (I i = 0; i < kh; ++i) {
      const I ih = h0 + i * dh;
      if (ih < 0 || ih >= H) continue;
      for (I j = 0; j < kw; ++j) {
        const I iw = w0 + j * dw;
        if (iw < 0 || iw >= W) continue;
        const Vec<T, kVec> xv = *reinterpret_cast<const Vec<T, kVec>*>(xp + (ih * W + iw) * C);
        const int pos = int(i * kw + j);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {  // the first largest in window order; NaN wins
          const Acc val = Acc(xv.v[k]);
          if (arg[k] < 0 || val > best[k] || isnan(val)) best[k] = val, arg[k] = pos;
        }
      }
    }
    if (out) {  // a window entirely in the padding: -inf (Note [Pooling windows])
      Vec<T, kVec> ov;
#pragma unroll
      for (int k = 0; k < kVec; ++k) ov.v[k] = arg[k] < 0 ? T(Acc(-INFINITY)) : T(best[k]);
      *reinterpret_cast<Vec<T, kVec>*>(out + o) = ov;
    }
    if (!idx) continue;
    if constexpr (kArg == Argmax::kWindow) {
      Vec<uint8_t, kVec> iv;
#pragma unroll
      for (int k = 0; k < kVec; ++k) iv.v[k] = arg[k] < 0 ? kNoWindowArgmax : uint8_t(arg[k]);
      *reinterpret_cast<Vec<uint8_t, kVec>*>(static_cast<uint8_t*>(idx) + o) = iv;
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k)  // the flat index in the plane whatever the layout; -1: none
        static_cast<int64_t*>(idx)[o + k] =
            arg[k] < 0 ? int64_t(-1) : int64_t(h0 + I(arg[k]) / kw * dh) * g.W + int64_t(w0 + I(arg[k]) % kw * dw);
    }
  }
}

/// The outputs [lo, hi) along one dim whose window (dilated extent `eff`) can hold input i.
template <typename I>
__device__ __forceinline__ void covering(I i, I pad, I eff, I stride, I out_size, I* lo, I* hi) {
  *lo = i + pad < eff ? 0 : (i + pad - eff) / stride + 1;
  const I h = (i + pad) / stride + 1;
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
    const auto q = unflatten<kNHWC>(i, g.H, g.W, C);
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

// gx: (N, H, W, C); gy, idx: (N, OH, OW, C), idx the argmax's uint8 window offsets (Note
// [Window-local max-pool indices]). A thread gathers kVec consecutive channels of one
// input pixel from the outputs whose window holds it, in output order; n: inputs / kVec.
template <typename T, bool kNHWC, int kVec, typename I>
__global__ void max_pool_backward_window_kernel(T* __restrict__ gx, const T* __restrict__ gy,
                                                const uint8_t* __restrict__ idx, Pool2dGeometry g, I n) {
  using Acc = opmath_t<T>;
  const I C = lanes<kNHWC, I>(g), H = I(g.H), W = I(g.W), OH = I(g.OH), OW = I(g.OW), kw = I(g.kernel.w);
  const I sh = I(g.stride.h), sw = I(g.stride.w), ph = I(g.padding.h), pw = I(g.padding.w);
  const I dh = I(g.dilation.h), dw = I(g.dilation.w);
  const I eff_h = (I(g.kernel.h) - 1) * dh + 1, eff_w = (kw - 1) * dw + 1;
  for (I v = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); v < n; v += I(gridDim.x) * I(blockDim.x)) {
    const I i = v * kVec;
    const auto q = unflatten<kNHWC>(i, H, W, C);
    I oh0, oh1, ow0, ow1;
    covering(q.h, ph, eff_h, sh, OH, &oh0, &oh1);
    covering(q.w, pw, eff_w, sw, OW, &ow0, &ow1);
    const I base = q.n * OH * OW * C + q.c;
    Acc s[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) s[k] = Acc(0);
    for (I oh = oh0; oh < oh1; ++oh) {
      const I rh = q.h + ph - oh * sh;  // the pixel's row in output oh's dilated window
      if (dh != 1 && rh % dh != 0) continue;
      const I row = (dh == 1 ? rh : rh / dh) * kw;
      for (I ow = ow0; ow < ow1; ++ow) {
        const I rw = q.w + pw - ow * sw;
        if (dw != 1 && rw % dw != 0) continue;
        const uint8_t pos = uint8_t(row + (dw == 1 ? rw : rw / dw));  // never kNoWindowArgmax
        const I o = base + (oh * OW + ow) * C;
        const Vec<uint8_t, kVec> iv = *reinterpret_cast<const Vec<uint8_t, kVec>*>(idx + o);
        const Vec<T, kVec> gv = *reinterpret_cast<const Vec<T, kVec>*>(gy + o);
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          if (iv.v[k] == pos) s[k] += Acc(gv.v[k]);
      }
    }
    Vec<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = T(s[k]);
    *reinterpret_cast<Vec<T, kVec>*>(gx + i) = out;
  }
}

// out: (N, OH, OW, C); x: (N, H, W, C)
template <typename T, bool kNHWC>
__global__ void avg_pool_forward_kernel(T* __restrict__ out, const T* __restrict__ x, Pool2dGeometry g, int64_t n) {
  using Acc = opmath_t<T>;
  const int64_t C = lanes<kNHWC>(g);
  FRUGAL_GRID_STRIDE(o, n) {
    const auto q = unflatten<kNHWC>(o, g.OH, g.OW, C);
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
    const auto q = unflatten<kNHWC>(i, g.H, g.W, C);
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
    const auto q = unflatten<kNHWC>(o, g.OH, g.OW, C);
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
    const auto q = unflatten<kNHWC>(i, g.H, g.W, C);
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

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Runs launch<kNHWC, kVec, I>(): kVec channels per thread when channels-last with C a
/// multiple of a 16-byte vector and every pointer in `operands` 16-byte aligned (null
/// counts as aligned), 32-bit index math when every offset fits (Note [NHWC pooling]).
template <typename T, typename Launch>
void by_layout(const Pool2dGeometry& g, std::initializer_list<const void*> operands, Launch&& launch) {
  constexpr int kVec = 16 / sizeof(T);
  bool vec = g.channels_last && g.C % kVec == 0;
  for (const void* p : operands) vec = vec && aligned16(p);
  const bool narrow = std::max(g.P * g.H * g.W, g.P * g.OH * g.OW) < (int64_t(1) << 30);
  auto with_index = [&]<bool kNHWC, int kV>() {
    if (narrow) launch.template operator()<kNHWC, kV, int32_t>();
    else launch.template operator()<kNHWC, kV, int64_t>();
  };
  if (vec) with_index.template operator()<true, kVec>();
  else if (g.channels_last) with_index.template operator()<true, 1>();
  else with_index.template operator()<false, 1>();
}

/// The max-pool forward: out (or null) and idx of kind kArg (or null) from x.
template <typename T, Argmax kArg>
void launch_max_forward(T* out, void* idx, const T* x, const Pool2dGeometry& g, cudaStream_t stream) {
  by_layout<T>(g, {out, x}, [&]<bool kNHWC, int kVec, typename I>() {
    const I n = I(g.P * g.OH * g.OW / kVec);
    max_pool_forward_kernel<T, kNHWC, kVec, kArg, I><<<grid_for(n), kBlockSize, 0, stream>>>(out, idx, x, g, n);
  });
  FRUGAL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void max_pool2d_kernel(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g) {
  DeviceGuard guard(x.device());
  dispatch_floating(x.dtype(), "max_pool2d", x.device(), [&]<typename T>() {
    launch_max_forward<T, Argmax::kFlat>(out.defined() ? out.data_ptr<T>() : nullptr,
                                         indices.defined() ? indices.data_ptr<int64_t>() : nullptr, x.data_ptr<T>(), g,
                                         stream_for(x));
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

void max_pool2d_backward_from_input_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& x,
                                           const Pool2dGeometry& g) {
  DeviceGuard guard(grad_x.device());
  if (g.kernel.h * g.kernel.w > kMaxByteWindow) {  // too many positions for a byte: int64 flat indices
    const Tensor indices = g.channels_last ? empty_channels_last(grad_out.sizes(), {kInt64, x.device()})
                                           : empty(grad_out.sizes(), {kInt64, x.device()});
    max_pool2d_kernel(Tensor(), indices, x, g);
    max_pool2d_backward_kernel(grad_x, grad_out, indices, g);
    return;
  }
  // One byte per output, in grad_out's memory order (Note [Window-local max-pool indices]).
  const Tensor argmax = empty({grad_out.numel()}, {kBool, x.device()});  // bytes; see factory.h
  uint8_t* idx = reinterpret_cast<uint8_t*>(argmax.data_ptr<bool>());
  dispatch_floating(grad_x.dtype(), "max_pool2d_backward", grad_x.device(), [&]<typename T>() {
    const cudaStream_t stream = stream_for(grad_x);
    launch_max_forward<T, Argmax::kWindow>(nullptr, idx, x.data_ptr<T>(), g, stream);
    T* gx = grad_x.data_ptr<T>();
    const T* gy = grad_out.data_ptr<T>();
    by_layout<T>(g, {gx, gy}, [&]<bool kNHWC, int kVec, typename I>() {
      const I n = I(g.P * g.H * g.W / kVec);
      max_pool_backward_window_kernel<T, kNHWC, kVec, I><<<grid_for(n), kBlockSize, 0, stream>>>(gx, gy, idx, g, n);
    });
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
