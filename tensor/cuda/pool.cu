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
// The max-pool and adaptive-backward kernels go further when C is a multiple of a 16-byte
// vector's elements (8 float16/bfloat16, 4 float32) and the operands are 16-byte aligned:
// a thread then takes that many consecutive channels of one pixel, so every load and
// store is 16 bytes wide, and their index math runs in 32 bits when every offset fits
// (64-bit division costs several times as much on the GPU).
//
// Note [Fused max-pool backward]
// max_pool2d_backward_from_input is one kernel that reads x and grad_out and writes
// grad_x (ResNet-50's stem at batch 128 in float16: 205 + 51 + 205 MB), with no argmax
// buffer in memory. A block takes a tile of one sample: toh x tow output cells and a
// group of channel vectors. The cell of input row h is floor((h + pad_h) / stride_h),
// the last output whose window can start at or before it; a tile writes the input
// pixels of its cells (the last tile also those past the last cell). Every output whose
// window holds such a pixel is one of the tile's or lies at most halo =
// floor((eff - 1) / stride) rows or columns before it (eff: the dilated kernel extent).
// So the block (1) stages grad_out of those outputs in shared memory and finds the
// argmax of their windows as one-byte window offsets beside it (Note [Window-local
// max-pool indices] in tensor/ops/pool.h), with the forward's comparisons (window_max),
// then (2) gathers: each of its pixels sums, in output order, the staged grad_out of
// the outputs whose argmax it is, and stores the sum once. The halo is computed twice
// (by this tile and its neighbour): 81 argmaxes for 64 outputs at 3x3/2 with 8x8 tiles,
// cheap beside the two-pass scheme's byte per output written, read back and launched
// for. The comparisons, not the bytes, bound it: 16-bit types compare two channels per
// instruction (WindowMax), a 3x3 window's nine loads are in flight together, and the
// kernel is held to 64 registers so four blocks share an SM. Windows of over 255
// positions, or halos too large for shared memory, take int64 flat indices and the
// scatter-free gather of max_pool_backward_kernel instead.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/loops.cuh"  // Vec
#include "tensor/cuda/nhwc_index.cuh"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/pool.h"

namespace frugal::ops::cuda {

namespace {

constexpr int64_t kWarpWindow = 32;  // adaptive windows of at least this many elements get a warp each

#define FRUGAL_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// Every kernel below walks an (N, H, W, C) array (Pixel, unflatten): a channels-last tensor
// is one (N = samples), and an NCHW tensor of P planes is the case C == 1, N = P (Note
// [NHWC pooling]).

/// The array's channel count: g.C when channels-last, else 1 (a compile-time 1, so the
/// NCHW kernels pay no extra division).
template <bool kNHWC, typename I = int64_t>
__device__ __forceinline__ I lanes(const Pool2dGeometry& g) {
  return kNHWC ? I(g.C) : I(1);
}

constexpr int kSmallWindow = 9;  // windows of up to 3x3 positions are loaded whole before any comparison

/// Two channels of a 16-bit type, as one compare instruction takes them (void: none).
template <typename T>
struct PairOf {
  using type = void;
};
template <>
struct PairOf<Half> {
  using type = __half2;
};
template <>
struct PairOf<BFloat16> {
  using type = __nv_bfloat162;
};

/// The running maxima of kVec channels over a window and their window offsets: the first
/// largest in window order; NaN wins. Float16 and bfloat16 channels go two to a 32-bit
/// word (their bits, and two 16-bit offsets) and compare a pair per instruction, with
/// the outcome of comparing in float (the conversion is exact, and NaN compares false in
/// both); other types compare one channel at a time.
template <typename T, int kVec>
struct WindowMax {
  using Pair = typename PairOf<T>::type;
  static constexpr bool kPairs = !std::is_void_v<Pair> && kVec % 2 == 0;
  static constexpr int kWords = kPairs ? kVec / 2 : kVec;
  std::conditional_t<kPairs, uint32_t, opmath_t<T>> best[kWords] = {};
  int arg[kWords] = {};
  bool empty = true;  // no input pixel yet: the same for every channel

  __device__ __forceinline__ void take(const Vec<T, kVec>& xv, int pos) {
    if constexpr (kPairs) {
      uint32_t w[kWords];
      memcpy(w, &xv, sizeof(w));
      const uint32_t pp = uint32_t(pos) * 0x10001u;
#pragma unroll
      for (int q = 0; q < kWords; ++q) {
        Pair v, b;
        memcpy(&v, &w[q], 4), memcpy(&b, &best[q], 4);
        const uint32_t m = empty ? ~0u : __hgt2_mask(v, b) | __hneu2_mask(v, v);  // v > best, or v is NaN
        best[q] = (w[q] & m) | (best[q] & ~m);
        arg[q] = int((pp & m) | (uint32_t(arg[q]) & ~m));
      }
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const opmath_t<T> val = opmath_t<T>(xv.v[k]);
        if (empty || val > best[k] || ::isnan(val)) best[k] = val, arg[k] = pos;
      }
    }
    empty = false;
  }
  /// Channel k's window offset, or -1 when the window holds no input pixel.
  __device__ __forceinline__ int offset(int k) const {
    if (empty) return -1;
    if constexpr (kPairs) return int(uint32_t(arg[k / 2]) >> (16 * (k % 2)) & 0xffffu);
    else return arg[k];
  }
  /// Channel k's maximum, as the forward stores it.
  __device__ __forceinline__ T value(int k) const {
    if constexpr (kPairs) return T(float(T::from_bits(uint16_t(best[k / 2] >> (16 * (k % 2))))));
    else return T(best[k]);
  }
};

/// The maxima of kVec consecutive channels over the window whose top-left corner is
/// (h0, w0) (in input coordinates, possibly in the padding). xp: (H, W) with row stride
/// W * C and column stride C, at the first of the channels. The forward and the fused
/// backward both call this, so they pick the same element (Note [Fused max-pool
/// backward]). A window of up to kSmallWindow positions issues all its loads before the
/// first comparison, so they wait on memory together.
template <typename T, int kVec, typename I>
__device__ __forceinline__ WindowMax<T, kVec> window_max(const T* __restrict__ xp, I h0, I w0, I H, I W, I C,
                                                         const Pool2dGeometry& g) {
  const I kh = I(g.kernel.h), kw = I(g.kernel.w), dh = I(g.dilation.h), dw = I(g.dilation.w);
  WindowMax<T, kVec> m;
  if (kh * kw <= kSmallWindow) {
    Vec<T, kVec> xv[kSmallWindow];
    bool in[kSmallWindow];
    I i = 0, j = 0;  // position p's row and column in the window
#pragma unroll
    for (int p = 0; p < kSmallWindow; ++p) {
      const I ih = h0 + i * dh, iw = w0 + j * dw;
      in[p] = p < kh * kw && ih >= 0 && ih < H && iw >= 0 && iw < W;
      if (in[p]) xv[p] = *reinterpret_cast<const Vec<T, kVec>*>(xp + (ih * W + iw) * C);
      if (++j == kw) j = 0, ++i;
    }
#pragma unroll
    for (int p = 0; p < kSmallWindow; ++p)
      if (in[p]) m.take(xv[p], p);
    return m;
  }
  for (I i = 0; i < kh; ++i) {
    const I ih = h0 + i * dh;
    if (ih < 0 || ih >= H) continue;
    for (I j = 0; j < kw; ++j) {
      const I iw = w0 + j * dw;
      if (iw >= 0 && iw < W) m.take(*reinterpret_cast<const Vec<T, kVec>*>(xp + (ih * W + iw) * C), int(i * kw + j));
    }
  }
  return m;
}

// out: (N, OH, OW, C), or null for the indices alone; idx: (N, OH, OW, C) int64 flat
// indices ih * W + iw in the plane, or null for the maxima alone; x: (N, H, W, C). A
// thread takes kVec consecutive channels of one output (Note [NHWC pooling]); n: outputs / kVec.
template <typename T, bool kNHWC, int kVec, typename I>
__global__ void max_pool_forward_kernel(T* __restrict__ out, int64_t* __restrict__ idx, const T* __restrict__ x,
                                        Pool2dGeometry g, I n) {
  using Acc = opmath_t<T>;
  const I C = lanes<kNHWC, I>(g), H = I(g.H), W = I(g.W), OH = I(g.OH), OW = I(g.OW);
  const I kw = I(g.kernel.w), dh = I(g.dilation.h), dw = I(g.dilation.w);
  for (I v = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); v < n; v += I(gridDim.x) * I(blockDim.x)) {
    const I o = v * kVec;
    const auto q = unflatten<kNHWC>(o, OH, OW, C);
    const I h0 = q.h * I(g.stride.h) - I(g.padding.h), w0 = q.w * I(g.stride.w) - I(g.padding.w);
    const WindowMax<T, kVec> m = window_max<T, kVec>(x + q.n * H * W * C + q.c, h0, w0, H, W, C, g);
    if (out) {  // a window entirely in the padding: -inf (Note [Pooling windows])
      Vec<T, kVec> ov;
#pragma unroll
      for (int k = 0; k < kVec; ++k) ov.v[k] = m.empty ? T(Acc(-INFINITY)) : m.value(k);
      *reinterpret_cast<Vec<T, kVec>*>(out + o) = ov;
    }
    if (!idx) continue;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {  // the flat index in the plane whatever the layout; -1: none
      const I a = I(m.offset(k));
      idx[o + k] = m.empty ? int64_t(-1) : int64_t(h0 + a / kw * dh) * g.W + int64_t(w0 + a % kw * dw);
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

/// The tiles of one max_pool_backward_fused_kernel launch (Note [Fused max-pool backward]).
struct FusedTiling {
  int toh, tow;                  // output cells a tile
  int halo_h, halo_w;            // outputs before a tile whose windows reach its pixels
  int group;                     // channel vectors a block: its threads are group * (kBlockSize / group)
  int tiles_h, tiles_w, groups;  // tiles along OH and OW, channel groups
  int rows, cols;                // the most input rows and columns a tile writes: its coverage tables
  int64_t grad_bytes;            // shared memory: grad_out of the outputs (16-byte multiple), then
  int64_t smem;                  //   the coverage tables, then the argmax bytes; smem in all
};

/// Blocks an SM holds of max_pool_backward_fused_kernel: 64 registers a thread for the
/// 16-bit types, which need no more; 80 for the others, which spill at 64.
template <typename T>
constexpr int kFusedBlocksPerSM = sizeof(T) == 2 ? 4 : 3;

// gx, x: (N, H, W, C); gy: (N, OH, OW, C). One block per tile of t (Note [Fused max-pool
// backward]); a thread takes kVec consecutive channels, the same ones in both phases.
template <typename T, bool kNHWC, int kVec, typename I>
__global__ void __launch_bounds__(kBlockSize, kFusedBlocksPerSM<T>)
    max_pool_backward_fused_kernel(T* __restrict__ gx, const T* __restrict__ gy, const T* __restrict__ x,
                                   Pool2dGeometry g, FusedTiling t) {
  using Acc = opmath_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const I C = lanes<kNHWC, I>(g), H = I(g.H), W = I(g.W), OH = I(g.OH), OW = I(g.OW);
  // In-plane coordinates fit in an int (fused_tiling checks).
  const int sh = int(g.stride.h), sw = int(g.stride.w), ph = int(g.padding.h), pw = int(g.padding.w);
  const int dh = int(g.dilation.h), dw = int(g.dilation.w), kw = int(g.kernel.w);
  const int eff_h = (int(g.kernel.h) - 1) * dh + 1, eff_w = (kw - 1) * dw + 1;

  // The tile: sample n, output cells [oh0, oh1) x [ow0, ow1), channel group cg.
  int b = int(blockIdx.x);
  const int cg = b % t.groups;
  b /= t.groups;
  const int ow0 = b % t.tiles_w * t.tow;
  b /= t.tiles_w;
  const int oh0 = b % t.tiles_h * t.toh;
  const I n = I(b / t.tiles_h);
  const int oh1 = min(int(OH), oh0 + t.toh), ow1 = min(int(OW), ow0 + t.tow);
  // The outputs whose argmax it needs, [eh0, oh1) x [ew0, ow1), and the input pixels it
  // writes, [h_lo, h_hi) x [w_lo, w_hi): its cells', the first tile's from 0, the last's to the end.
  const int eh0 = max(0, oh0 - t.halo_h), ew0 = max(0, ow0 - t.halo_w);
  const int ext_w = ow1 - ew0, outputs = (oh1 - eh0) * ext_w;
  const int h_lo = min(int(H), max(0, oh0 * sh - ph)), w_lo = min(int(W), max(0, ow0 * sw - pw));
  const int h_hi = oh1 == int(OH) ? int(H) : min(int(H), max(0, oh1 * sh - ph));
  const int w_hi = ow1 == int(OW) ? int(W) : min(int(W), max(0, ow1 * sw - pw));
  const int nh = max(0, h_hi - h_lo), nw = max(0, w_hi - w_lo);

  auto* grad = reinterpret_cast<Vec<T, kVec>*>(smem);          // [output][vector]
  auto* cover = reinterpret_cast<int2*>(smem + t.grad_bytes);  // rows' covering outputs [x, y), then columns'
  auto* argmax = reinterpret_cast<Vec<uint8_t, kVec>*>(cover + t.rows + t.cols);  // [output][vector]
  for (int i = int(threadIdx.x); i < nh + nw; i += int(blockDim.x)) {
    int lo, hi;
    if (i < nh) covering(h_lo + i, ph, eff_h, sh, int(OH), &lo, &hi), cover[i] = make_int2(lo, hi);
    else covering(w_lo + i - nh, pw, eff_w, sw, int(OW), &lo, &hi), cover[t.rows + i - nh] = make_int2(lo, hi);
  }
  const int lane = int(threadIdx.x) % t.group, slot = int(threadIdx.x) / t.group, slots = int(blockDim.x) / t.group;
  const I c = I(cg * t.group + lane) * kVec;  // this thread's first channel
  const bool active = c < C;                  // the last group may be short
  const T* gyn = gy + n * OH * OW * C + c;
  // (1) Every output the tile needs: its grad_out and the argmax of its window.
  if (active) {
    const T* xn = x + n * H * W * C + c;
    for (int e = slot; e < outputs; e += slots) {
      const int oh = eh0 + e / ext_w, ow = ew0 + e % ext_w, at = e * t.group + lane;
      grad[at] = *reinterpret_cast<const Vec<T, kVec>*>(gyn + (I(oh) * OW + I(ow)) * C);
      const WindowMax<T, kVec> m = window_max<T, kVec>(xn, I(oh * sh - ph), I(ow * sw - pw), H, W, C, g);
      Vec<uint8_t, kVec> a;
#pragma unroll
      for (int k = 0; k < kVec; ++k) a.v[k] = m.empty ? kNoWindowArgmax : uint8_t(m.offset(k));
      argmax[at] = a;
    }
  }
  __syncthreads();
  if (!active) return;
  // (2) Each pixel sums grad_out of the outputs whose argmax it is, in output order.
  T* gxn = gx + n * H * W * C + c;
  if (nh * nw == 0) return;
  const int dr = slots / nw, ds = slots % nw;  // the step from one pixel of this thread to its next
  for (int e = slot, r = slot / nw, s = slot % nw; e < nh * nw; e += slots, r += dr, s += ds) {
    if (s >= nw) s -= nw, ++r;
    const int h = h_lo + r, w = w_lo + s;
    const int2 rows = cover[r], cols = cover[t.rows + s];
    Acc sum[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum[k] = Acc(0);
    for (int oh = rows.x; oh < rows.y; ++oh) {
      const int rh = h + ph - oh * sh;  // the pixel's row in output oh's dilated window
      if (dh != 1 && rh % dh != 0) continue;
      const int row = (dh == 1 ? rh : rh / dh) * kw;
      for (int ow = cols.x; ow < cols.y; ++ow) {
        const int rw = w + pw - ow * sw;
        if (dw != 1 && rw % dw != 0) continue;
        const uint8_t pos = uint8_t(row + (dw == 1 ? rw : rw / dw));  // never kNoWindowArgmax
        const int at = ((oh - eh0) * ext_w + (ow - ew0)) * t.group + lane;
        const Vec<uint8_t, kVec> a = argmax[at];
        const Vec<T, kVec> gv = grad[at];
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          if (a.v[k] == pos) sum[k] += Acc(gv.v[k]);
      }
    }
    Vec<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = T(sum[k]);
    *reinterpret_cast<Vec<T, kVec>*>(gxn + (I(h) * W + I(w)) * C) = out;
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

/// Adaptive pooling along one dim in I arithmetic: output o of out_size reads [start, end)
/// of in_size (adaptive_start and adaptive_end of tensor/ops/pool.h).
template <typename I>
__device__ __forceinline__ I window_start(I o, I in_size, I out_size) {
  return o * in_size / out_size;
}
template <typename I>
__device__ __forceinline__ I window_end(I o, I in_size, I out_size) {
  return ((o + 1) * in_size + out_size - 1) / out_size;
}

// gx: (N, H, W, C); gy: (N, OH, OW, C). A thread takes kVec consecutive channels of one
// input pixel (Note [NHWC pooling]); n: inputs / kVec.
template <typename T, bool kNHWC, int kVec, typename I>
__global__ void adaptive_backward_kernel(T* __restrict__ gx, const T* __restrict__ gy, Pool2dGeometry g, I n) {
  using Acc = opmath_t<T>;
  const I C = lanes<kNHWC, I>(g), H = I(g.H), W = I(g.W), OH = I(g.OH), OW = I(g.OW);
  for (I v = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); v < n; v += I(gridDim.x) * I(blockDim.x)) {
    const I i = v * kVec;
    const auto q = unflatten<kNHWC>(i, H, W, C);
    // Outputs whose window [start, end) holds ih: floor(ih OH / H) <= oh < ceil((ih + 1) OH / H).
    const I oh0 = window_start(q.h, OH, H), oh1 = window_end(q.h, OH, H);
    const I ow0 = window_start(q.w, OW, W), ow1 = window_end(q.w, OW, W);
    const T* gyp = gy + q.n * OH * OW * C + q.c;
    Acc s[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) s[k] = Acc(0);
    for (I oh = oh0; oh < oh1; ++oh) {
      const I h0 = window_start(oh, H, OH), h1 = window_end(oh, H, OH);
      if (q.h < h0 || q.h >= h1) continue;
      for (I ow = ow0; ow < ow1; ++ow) {
        const I w0 = window_start(ow, W, OW), w1 = window_end(ow, W, OW);
        if (q.w < w0 || q.w >= w1) continue;
        const Acc count = Acc((h1 - h0) * (w1 - w0));
        const Vec<T, kVec> gv = *reinterpret_cast<const Vec<T, kVec>*>(gyp + (oh * OW + ow) * C);
#pragma unroll
        for (int k = 0; k < kVec; ++k) s[k] += Acc(gv.v[k]) / count;
      }
    }
    Vec<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = T(s[k]);
    *reinterpret_cast<Vec<T, kVec>*>(gx + i) = out;
  }
}

constexpr int kTiledRun = 8;  // input pixels a thread of adaptive_backward_tiled_kernel writes

// gx: (N, H, W, C); gy: (N, OH, OW, C), whose windows tile the input: H % OH == 0 and
// W % OW == 0, as global pooling's (7x7 -> 1x1 in ResNet). Each input pixel then lies in
// one window, of kh = H / OH rows and kw = W / OW columns, and its gradient is the sum of
// one term of adaptive_backward_kernel, gy / (kh kw). A thread divides kVec channels of
// one output once and stores them at kTiledRun consecutive pixels of its window (in row
// order): n = N OH OW ceil(kh kw / kTiledRun) C / kVec items, channel vectors fastest, so
// a warp's stores cover consecutive channels (NHWC) or consecutive runs of pixels (NCHW).
template <typename T, bool kNHWC, int kVec, typename I>
__global__ void adaptive_backward_tiled_kernel(T* __restrict__ gx, const T* __restrict__ gy, Pool2dGeometry g, I n) {
  using Acc = opmath_t<T>;
  const I C = lanes<kNHWC, I>(g), H = I(g.H), W = I(g.W), OH = I(g.OH), OW = I(g.OW);
  const I kh = H / OH, kw = W / OW, vectors = C / kVec, runs = (kh * kw + kTiledRun - 1) / kTiledRun;
  const Acc count = Acc(kh * kw);
  for (I v = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); v < n; v += I(gridDim.x) * I(blockDim.x)) {
    I r = v;
    const I c = r % vectors * kVec;
    r /= vectors;
    I p = r % runs * kTiledRun;  // the run's first pixel in the window
    r /= runs;
    const I ow = r % OW;
    r /= OW;
    const I oh = r % OH, s = r / OH;  // s: the sample
    const Vec<T, kVec> gv = *reinterpret_cast<const Vec<T, kVec>*>(gy + ((s * OH + oh) * OW + ow) * C + c);
    Vec<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = T(Acc(0) + Acc(gv.v[k]) / count);  // 0 +: as that sum, -0 gives +0
    T* window = gx + ((s * H + oh * kh) * W + ow * kw) * C + c;
    const I end = min(p + I(kTiledRun), kh * kw);
    for (I i = p / kw, j = p % kw; p < end; ++p) {
      *reinterpret_cast<Vec<T, kVec>*>(window + (i * W + j) * C) = out;
      if (++j == kw) j = 0, ++i;
    }
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
/// counts as aligned), 32-bit index math when every offset fits, and `extent`, the
/// largest other value the kernel's index math forms (Note [NHWC pooling]).
template <typename T, typename Launch>
void by_layout(const Pool2dGeometry& g, std::initializer_list<const void*> operands, Launch&& launch,
               int64_t extent = 0) {
  constexpr int kVec = 16 / sizeof(T);
  bool vec = g.channels_last && g.C % kVec == 0;
  for (const void* p : operands) vec = vec && aligned16(p);
  const bool narrow = std::max({g.P * g.H * g.W, g.P * g.OH * g.OW, extent}) < (int64_t(1) << 30);
  auto with_index = [&]<bool kNHWC, int kV>() {
    if (narrow) launch.template operator()<kNHWC, kV, int32_t>();
    else launch.template operator()<kNHWC, kV, int64_t>();
  };
  if (vec) with_index.template operator()<true, kVec>();
  else if (g.channels_last) with_index.template operator()<true, 1>();
  else with_index.template operator()<false, 1>();
}

/// The max-pool forward: out (or null) and int64 flat indices (or null) from x.
template <typename T>
void launch_max_forward(T* out, int64_t* idx, const T* x, const Pool2dGeometry& g, cudaStream_t stream) {
  by_layout<T>(g, {out, x}, [&]<bool kNHWC, int kVec, typename I>() {
    const I n = I(g.P * g.OH * g.OW / kVec);
    max_pool_forward_kernel<T, kNHWC, kVec, I><<<grid_for(n), kBlockSize, 0, stream>>>(out, idx, x, g, n);
  });
  FRUGAL_CUDA_CHECK_LAUNCH();
}

constexpr int64_t kFusedSmem = 48 * 1024;  // the default per-block limit: no opt-in needed

/// Tiles for max_pool_backward_fused_kernel over `samples` samples of `vectors` channel
/// vectors of `vec` channels of `elem` bytes (Note [Fused max-pool backward]): 8 x 8
/// output cells and 8 vectors a block (ResNet's stem: 16 x 16 pixels of 64 float16
/// channels), wider where there are fewer vectors, smaller while the shared memory
/// exceeds kFusedSmem. False when the fused kernel does not apply: windows past a byte
/// of offsets, halos too large, or planes too large for int coordinates.
bool fused_tiling(const Pool2dGeometry& g, int64_t samples, int64_t vectors, int vec, int elem, FusedTiling* t) {
  if (g.kernel.h * g.kernel.w > kMaxByteWindow) return false;
  const int64_t eff_h = (g.kernel.h - 1) * g.dilation.h + 1, eff_w = (g.kernel.w - 1) * g.dilation.w + 1;
  const int64_t span = std::max({g.H, g.W, (g.OH + 1) * g.stride.h + eff_h, (g.OW + 1) * g.stride.w + eff_w});
  if (span >= (int64_t(1) << 30)) return false;
  t->group = int(std::min<int64_t>(vectors, 8));
  t->halo_h = int((eff_h - 1) / g.stride.h), t->halo_w = int((eff_w - 1) / g.stride.w);
  int64_t toh = std::min<int64_t>(g.OH, 8), tow = std::min<int64_t>(g.OW, 8 * std::max(1, 8 / t->group));
  for (;;) {
    // The most outputs a tile needs, and bounds on the rows and columns it writes (see the Note).
    const int64_t outputs = (toh + t->halo_h) * (tow + t->halo_w);
    t->rows = int(toh * g.stride.h + eff_h), t->cols = int(tow * g.stride.w + eff_w);
    t->grad_bytes = (outputs * t->group * vec * elem + 15) / 16 * 16;
    t->smem = t->grad_bytes + int64_t(t->rows + t->cols) * int64_t(sizeof(int2)) + outputs * t->group * vec;
    if (t->smem <= kFusedSmem) break;
    if (toh == 1 && tow == 1) return false;
    if (tow >= toh) tow = (tow + 1) / 2;
    else toh = (toh + 1) / 2;
  }
  t->toh = int(toh), t->tow = int(tow);
  t->tiles_h = int((g.OH + toh - 1) / toh), t->tiles_w = int((g.OW + tow - 1) / tow);
  t->groups = int((vectors + t->group - 1) / t->group);
  return samples * t->tiles_h * t->tiles_w * t->groups < (int64_t(1) << 31);
}

/// An NCHW adaptive pool that keeps the width (OW == W: each column is its own window) is
/// the channels-last pool of (N = P, C = W, H, 1) to (OH, 1): a row of the plane becomes
/// one pixel's channels, which the NHWC kernels read 16 bytes at a time.
Pool2dGeometry columns_as_channels(Pool2dGeometry g) {
  if (g.channels_last || g.OW != g.W || g.W == 1) return g;
  g.P *= g.W, g.C = g.W, g.W = g.OW = 1, g.channels_last = true;
  return g;
}

}  // namespace

void max_pool2d_kernel(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g) {
  DeviceGuard guard(x.device());
  dispatch_floating(x.dtype(), "max_pool2d", x.device(), [&]<typename T>() {
    launch_max_forward<T>(out.defined() ? out.data_ptr<T>() : nullptr,
                          indices.defined() ? indices.data_ptr<int64_t>() : nullptr, x.data_ptr<T>(), g, stream_for(x));
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
  bool fused = false;  // Note [Fused max-pool backward]
  dispatch_floating(grad_x.dtype(), "max_pool2d_backward", grad_x.device(), [&]<typename T>() {
    T* gx = grad_x.data_ptr<T>();
    const T *gy = grad_out.data_ptr<T>(), *xp = x.data_ptr<T>();
    by_layout<T>(g, {gx, gy, xp}, [&]<bool kNHWC, int kVec, typename I>() {
      const int64_t samples = kNHWC ? g.P / g.C : g.P, vectors = kNHWC ? g.C / kVec : 1;
      FusedTiling t;
      if (!fused_tiling(g, samples, vectors, kVec, int(sizeof(T)), &t)) return;
      const unsigned blocks = unsigned(samples * t.tiles_h * t.tiles_w * t.groups);
      const int threads = t.group * (kBlockSize / t.group);
      max_pool_backward_fused_kernel<T, kNHWC, kVec, I>
          <<<blocks, threads, size_t(t.smem), stream_for(grad_x)>>>(gx, gy, xp, g, t);
      FRUGAL_CUDA_CHECK_LAUNCH();
      fused = true;
    });
  });
  if (fused) return;
  const Tensor indices = g.channels_last ? empty_channels_last(grad_out.sizes(), {kInt64, x.device()})
                                         : empty(grad_out.sizes(), {kInt64, x.device()});
  max_pool2d_kernel(Tensor(), indices, x, g);
  max_pool2d_backward_kernel(grad_x, grad_out, indices, g);
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

void adaptive_avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& geometry) {
  DeviceGuard guard(grad_x.device());
  const Pool2dGeometry g = columns_as_channels(geometry);
  const bool tiled = g.H % g.OH == 0 && g.W % g.OW == 0;
  dispatch_floating(grad_x.dtype(), "adaptive_avg_pool2d_backward", grad_x.device(), [&]<typename T>() {
    T* gx = grad_x.data_ptr<T>();
    const T* gy = grad_out.data_ptr<T>();
    const cudaStream_t stream = stream_for(grad_x);
    by_layout<T>(
        g, {gx, gy},
        [&]<bool kNHWC, int kVec, typename I>() {
          if (tiled) {  // a thread per output, run of its window's pixels and channel vector
            const int64_t runs = ((g.H / g.OH) * (g.W / g.OW) + kTiledRun - 1) / kTiledRun;
            const I n = I(g.P * g.OH * g.OW * runs / kVec);
            adaptive_backward_tiled_kernel<T, kNHWC, kVec, I><<<grid_for(n), kBlockSize, 0, stream>>>(gx, gy, g, n);
          } else {
            const I n = I(g.P * g.H * g.W / kVec);
            adaptive_backward_kernel<T, kNHWC, kVec, I><<<grid_for(n), kBlockSize, 0, stream>>>(gx, gy, g, n);
          }
        },
        std::max((g.H + 1) * (g.OH + 1), (g.W + 1) * (g.OW + 1)));  // window_end's products
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

#undef FRUGAL_POOL_KERNEL

}  // namespace frugal::ops::cuda
