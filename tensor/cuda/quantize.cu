// CUDA blockwise quantization (Note [Blockwise quantization]) and the 1-bit masks of Note
// [ReLU masks]. e4m3 goes through the hardware conversion of cuda_fp8.h; the scale's division
// and inverse are __fdiv_rn and __frcp_rn, so the codes are the CPU's under any flags.
//
// Note [Vectorized quantization]
// A dense tensor whose block is a multiple of 8 elements (the default 256, any block a user
// is likely to pick) takes the vector paths: a warp per scale block, each lane reading 8
// elements at once (16 bytes of float16) and writing their 8 codes as one 8-byte store, the
// absmax a warp butterfly with no block barrier; dequantization and the ReLU masks move 8
// elements per thread the same way. The default block of 256 is one vector per lane, so a
// warp there takes 4 scale blocks at once and encodes them from registers: a warp holding one
// 512-byte load in flight, then reading it again, left float16 at 0.41 of a copy's bandwidth.
// That kernel was then bound by instructions per element (ncu: float32 at 67% of DRAM with
// half the issue slots busy; float16 has twice the elements per byte), so a scale block with
// no inf skips the per-element finiteness tests and converts two values per cvt.e4m3x2:
// float16 0.46 -> 0.67 of a copy, float32 0.78 -> 0.94 (bench_ops --device cuda). The general paths (any
// strides, any block) read element by element with a block-wide reduction per scale block: on ResNet-50's saved
// activations they ran at a few percent of HBM bandwidth (the FP8-compressed step took 62 ms, 42 more than keeping
// them).
#include <cuda_fp8.h>

#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"
#include "tensor/ops/quantize_math.h"

namespace frugal::ops::cuda {

using quant::LogicalIndexer;

namespace {

template <typename T>
__device__ __forceinline__ float load(const T* base, const LogicalIndexer& ix, bool dense, int64_t i) {
  return float(base[dense ? i : ix.offset(i)]);
}

__device__ __forceinline__ uint8_t encode(float v, float scale, float inverse, bool fp8, uint8_t nan) {
  if (!::isfinite(v)) return nan;
  const float s = quant::scaled(v, scale, inverse);
  if (fp8) return uint8_t(__nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3));
  return uint8_t(int8_t(min(max(__float2int_rn(s), -127), 127)));
}

__device__ __forceinline__ float decode(uint8_t c, bool fp8) {
  if (!fp8) return quant::int8_decode(c);
  __nv_fp8_e4m3 f;
  f.__x = c;
  return float(f);
}

// codes: (n), scales: (nblocks), x: n elements in any layout (ix)
template <typename T>
__global__ void quantize_blockwise_kernel_impl(uint8_t* __restrict__ codes, float* __restrict__ scales,
                                               const T* __restrict__ x, LogicalIndexer ix, bool dense, int64_t n,
                                               int64_t block, int64_t nblocks, bool fp8) {
  const float qmax = fp8 ? quant::kE4M3Max : quant::kInt8Max;
  const uint8_t nan = fp8 ? quant::kE4M3NaN : quant::kInt8NaN;
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const int64_t lo = b * block, hi = min(n, lo + block);
    float absmax = 0.0f;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const float v = load(x, ix, dense, i);
      if (::isfinite(v)) absmax = fmaxf(absmax, fabsf(v));
    }
    absmax = block_allreduce(
        absmax, [](float a, float c) { return fmaxf(a, c); }, 0.0f);
    const float scale = __fdiv_rn(absmax, qmax), inverse = quant::inverse_scale(scale);
    if (threadIdx.x == 0) scales[b] = scale;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
      codes[i] = encode(load(x, ix, dense, i), scale, inverse, fp8, nan);
  }
}

// out: (n), codes: (n), scales: (ceil(n / block))
template <typename T>
__global__ void dequantize_blockwise_kernel_impl(T* __restrict__ out, const uint8_t* __restrict__ codes,
                                                 const float* __restrict__ scales, int64_t n, int64_t block, bool fp8) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = T(quant::keep_finite(__fmul_rn(decode(codes[i], fp8), scales[i / block])));
}

// mask: (ceil(n / 8)), y: n elements in any layout (ix); one thread per byte
template <typename T>
__global__ void relu_mask_kernel_impl(uint8_t* __restrict__ mask, const T* __restrict__ y, LogicalIndexer ix,
                                      bool dense, int64_t n) {
  using M = opmath_t<T>;
  const int64_t nbytes = (n + 7) / 8, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < nbytes; k += stride) {
    uint8_t bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t i = 8 * k + j;
      if (i < n && !(M(y[dense ? i : ix.offset(i)]) <= M(0))) bits |= uint8_t(1u << j);
    }
    mask[k] = bits;
  }
}

// out: (n), g: n elements in any layout (ix), mask: (ceil(n / 8))
template <typename T>
__global__ void apply_relu_mask_kernel_impl(T* __restrict__ out, const T* __restrict__ g, LogicalIndexer ix, bool dense,
                                            const uint8_t* __restrict__ mask, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = (mask[i >> 3] >> (i & 7)) & 1u ? g[dense ? i : ix.offset(i)] : T(0.0f);
}

constexpr int kVec = 8;  // elements per vector access of the dense paths

// Whether x's elements (dense) and the byte buffers can be read and written 8 at a time.
template <typename T>
bool vectorizable(const void* x, std::initializer_list<const void*> bytes) {
  if (pointer_alignment(x, kVec * int64_t(sizeof(T))) < kVec * int64_t(sizeof(T))) return false;
  for (const void* p : bytes)
    if (pointer_alignment(p, kVec) < kVec) return false;
  return true;
}

// The dense path of quantize_blockwise (Note [Vectorized quantization]): warp w of the grid
// takes scale blocks w, w + warps, ...; block % 8 == 0, x aligned to 8 elements.
template <typename T>
__global__ void quantize_blockwise_vec_kernel(uint8_t* __restrict__ codes, float* __restrict__ scales,
                                              const T* __restrict__ x, int64_t n, int64_t block, int64_t nblocks,
                                              bool fp8) {
  const float qmax = fp8 ? quant::kE4M3Max : quant::kInt8Max;
  const uint8_t nan = fp8 ? quant::kE4M3NaN : quant::kInt8NaN;
  const int lane = int(threadIdx.x) & 31, warps_per_cta = int(blockDim.x) >> 5;
  const int64_t warps = int64_t(gridDim.x) * warps_per_cta;
  for (int64_t b = int64_t(blockIdx.x) * warps_per_cta + (threadIdx.x >> 5); b < nblocks; b += warps) {
    const int64_t lo = b * block, hi = min(n, lo + block);  // the same for every lane: the loop is warp-uniform
    float absmax = 0.0f;
    for (int64_t i = lo + kVec * lane; i < hi; i += kVec * 32) {
      if (i + kVec <= hi) {
        const Vec<T, kVec> v = *reinterpret_cast<const Vec<T, kVec>*>(x + i);
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          if (::isfinite(float(v.v[j]))) absmax = fmaxf(absmax, fabsf(float(v.v[j])));
      } else {
        for (int64_t k = i; k < hi; ++k)
          if (::isfinite(float(x[k]))) absmax = fmaxf(absmax, fabsf(float(x[k])));
      }
    }
    absmax = warp_allreduce(absmax, [](float a, float c) { return fmaxf(a, c); });
    const float scale = __fdiv_rn(absmax, qmax), inverse = quant::inverse_scale(scale);
    if (lane == 0) scales[b] = scale;
    for (int64_t i = lo + kVec * lane; i < hi; i += kVec * 32) {  // re-read from L1
      if (i + kVec <= hi) {
        const Vec<T, kVec> v = *reinterpret_cast<const Vec<T, kVec>*>(x + i);
        Vec<uint8_t, kVec> c;
#pragma unroll
        for (int j = 0; j < kVec; ++j) c.v[j] = encode(float(v.v[j]), scale, inverse, fp8, nan);
        *reinterpret_cast<Vec<uint8_t, kVec>*>(codes + i) = c;
      } else {
        for (int64_t k = i; k < hi; ++k) codes[k] = encode(float(x[k]), scale, inverse, fp8, nan);
      }
    }
  }
}

// A lane's absmax of its 8 values: inf and NaN left out (the rule of Note [Blockwise
// quantization]) when `finite_only`; otherwise NaN is left out by fmaxf and an inf makes the
// result inf, which the caller takes as the sign to redo it with finite_only.
template <typename T>
__device__ __forceinline__ float lane_absmax(const Vec<T, kVec>& v, bool finite_only) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float a = fabsf(float(v.v[j]));
    m = finite_only && !(a < INFINITY) ? m : fmaxf(m, a);
  }
  return m;
}

// The e4m3 codes of 8 values that hold no inf, as encode() gives them when inverse != 0:
// x * inverse converted two at a time (cvt.rn.satfinite.e4m3x2), then NaN codes of either
// sign (0x7F, 0xFF: no number saturates to them) made 0x7F. Byte j is value j's code.
template <typename T>
__device__ __forceinline__ uint64_t e4m3_codes(const Vec<T, kVec>& v, float inverse) {
  uint64_t packed = 0;
#pragma unroll
  for (int p = 0; p < kVec / 2; ++p) {
    const float2 f{__fmul_rn(float(v.v[2 * p]), inverse), __fmul_rn(float(v.v[2 * p + 1]), inverse)};
    packed |= uint64_t(__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3)) << (16 * p);
  }
  const uint64_t low7 = packed & 0x7F7F7F7F7F7F7F7Full;
  const uint64_t nan_bytes = (low7 + 0x0101010101010101ull) & 0x8080808080808080ull;  // low 7 bits all ones
  return packed & ~nan_bytes;
}

// The default block of 256 (Note [Vectorized quantization]): a lane's 8 elements of a scale
// block are one vector, so a warp takes kUnroll consecutive scale blocks at once, with that
// many loads in flight per lane, and encodes them from registers (no second read). A block
// without inf (almost every one) skips the per-element finiteness tests, and e4m3 codes are
// made two per conversion: float16 input was bound by instructions per element, not bytes.
constexpr int64_t kWarpBlock = kVec * 32;
template <typename T, int kUnroll>
__global__ void quantize_blockwise_256_kernel(uint8_t* __restrict__ codes, float* __restrict__ scales,
                                              const T* __restrict__ x, int64_t n, int64_t nblocks, bool fp8) {
  const float qmax = fp8 ? quant::kE4M3Max : quant::kInt8Max;
  const uint8_t nan = fp8 ? quant::kE4M3NaN : quant::kInt8NaN;
  const int lane = int(threadIdx.x) & 31, warps_per_cta = int(blockDim.x) >> 5;
  const int64_t warps = int64_t(gridDim.x) * warps_per_cta;
  for (int64_t b0 = (int64_t(blockIdx.x) * warps_per_cta + (threadIdx.x >> 5)) * kUnroll; b0 < nblocks;
       b0 += warps * kUnroll) {  // b0 is warp-uniform: every lane reaches the shuffles below
    Vec<T, kVec> v[kUnroll];
    float absmax[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = (b0 + u) * kWarpBlock + kVec * lane;
      if (i + kVec <= n) {
        v[u] = *reinterpret_cast<const Vec<T, kVec>*>(x + i);
      } else {  // the short last block, or past the end: zeros leave absmax alone
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[u].v[j] = i + j < n ? x[i + j] : T(0.0f);
      }
      absmax[u] = lane_absmax(v[u], /*finite_only=*/false);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const auto max = [](float a, float c) { return fmaxf(a, c); };
      float m = warp_allreduce(absmax[u], max);
      const bool has_inf = !(m < INFINITY);  // warp-uniform, as m is
      if (has_inf) m = warp_allreduce(lane_absmax(v[u], /*finite_only=*/true), max);
      const float scale = __fdiv_rn(m, qmax);
      if (b0 + u >= nblocks) break;  // warp-uniform
      if (lane == 0) scales[b0 + u] = scale;
      const float inverse = quant::inverse_scale(scale);
      const int64_t i = (b0 + u) * kWarpBlock + kVec * lane;
      if (fp8 && !has_inf && inverse != 0.0f && i + kVec <= n) {
        *reinterpret_cast<uint64_t*>(codes + i) = e4m3_codes(v[u], inverse);
        continue;
      }
      Vec<uint8_t, kVec> c;
#pragma unroll
      for (int j = 0; j < kVec; ++j) c.v[j] = encode(float(v[u].v[j]), scale, inverse, fp8, nan);
      if (i + kVec <= n) {
        *reinterpret_cast<Vec<uint8_t, kVec>*>(codes + i) = c;
      } else {
        for (int j = 0; j < kVec && i + j < n; ++j) codes[i + j] = c.v[j];
      }
    }
  }
}

// The dense path of dequantize_blockwise: 8 elements per thread (block % 8 == 0, so the 8
// share a scale).
template <typename T>
__global__ void dequantize_blockwise_vec_kernel(T* __restrict__ out, const uint8_t* __restrict__ codes,
                                                const float* __restrict__ scales, int64_t n, int64_t block, bool fp8) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / kVec;
  for (int64_t v = tid; v < nvec; v += stride) {
    const Vec<uint8_t, kVec> c = reinterpret_cast<const Vec<uint8_t, kVec>*>(codes)[v];
    const float s = scales[v * kVec / block];
    Vec<T, kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = T(quant::keep_finite(__fmul_rn(decode(c.v[j], fp8), s)));
    reinterpret_cast<Vec<T, kVec>*>(out)[v] = o;
  }
  for (int64_t i = nvec * kVec + tid; i < n; i += stride)
    out[i] = T(quant::keep_finite(__fmul_rn(decode(codes[i], fp8), scales[i / block])));
}

// The dense path of relu_mask: thread k reads elements 8k..8k+7 at once and writes byte k.
template <typename T>
__global__ void relu_mask_vec_kernel(uint8_t* __restrict__ mask, const T* __restrict__ y, int64_t n) {
  using M = opmath_t<T>;
  const int64_t nbytes = (n + 7) / 8, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < nbytes; k += stride) {
    uint8_t bits = 0;
    if (kVec * k + kVec <= n) {
      const Vec<T, kVec> v = reinterpret_cast<const Vec<T, kVec>*>(y)[k];
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (!(M(v.v[j]) <= M(0))) bits |= uint8_t(1u << j);
    } else {
      for (int64_t i = kVec * k; i < n; ++i)
        if (!(M(y[i]) <= M(0))) bits |= uint8_t(1u << (i - kVec * k));
    }
    mask[k] = bits;
  }
}

// The dense path of apply_relu_mask: thread k passes or zeroes elements 8k..8k+7 by byte k.
template <typename T>
__global__ void apply_relu_mask_vec_kernel(T* __restrict__ out, const T* __restrict__ g,
                                           const uint8_t* __restrict__ mask, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / kVec;
  for (int64_t k = tid; k < nvec; k += stride) {
    const uint8_t bits = mask[k];
    const Vec<T, kVec> v = reinterpret_cast<const Vec<T, kVec>*>(g)[k];
    Vec<T, kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = (bits >> j) & 1u ? v.v[j] : T(0.0f);
    reinterpret_cast<Vec<T, kVec>*>(out)[k] = o;
  }
  for (int64_t i = nvec * kVec + tid; i < n; i += stride) out[i] = (mask[i >> 3] >> (i & 7)) & 1u ? g[i] : T(0.0f);
}

template <typename F>
void dispatch_quantizable(DType t, const char* op, Device d, F&& f) {
  switch (t) {
    case DType::Float32: return f.template operator()<float>();
    case DType::Float16: return f.template operator()<Half>();
    case DType::BFloat16: return f.template operator()<BFloat16>();
    default: throw_unsupported_dtype(op, t, d);
  }
}

}  // namespace

void quantize_blockwise_kernel(const Tensor& codes, const Tensor& scales, const Tensor& x, QuantFormat format,
                               int64_t block) {
  DeviceGuard guard(x.device());
  dispatch_quantizable(x.dtype(), "quantize_blockwise", x.device(), [&]<typename T>() {
    const LogicalIndexer ix = quant::make_logical_indexer(x, "quantize_blockwise");
    const int64_t nblocks = scales.numel();
    const bool fp8 = format == QuantFormat::Fp8E4M3;
    const bool vec = ix.dense() && block % kVec == 0 && vectorizable<T>(x.data_ptr<T>(), {codes.data_ptr<uint8_t>()});
    constexpr int kWarps = kBlockSize / 32;
    if (vec && block == kWarpBlock) {
      constexpr int kUnroll = 4;
      const int64_t warps = (nblocks + kUnroll - 1) / kUnroll;
      const unsigned grid = unsigned(std::min<int64_t>((warps + kWarps - 1) / kWarps, max_blocks(8)));
      quantize_blockwise_256_kernel<T, kUnroll><<<grid, kBlockSize, 0, stream_for(x)>>>(
          codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), x.data_ptr<T>(), x.numel(), nblocks, fp8);
      FRUGAL_CUDA_CHECK_LAUNCH();
      return;
    }
    if (vec) {
      const unsigned grid = unsigned(std::min<int64_t>((nblocks + kWarps - 1) / kWarps, max_blocks(8)));
      quantize_blockwise_vec_kernel<T><<<grid, kBlockSize, 0, stream_for(x)>>>(
          codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), x.data_ptr<T>(), x.numel(), block, nblocks, fp8);
      FRUGAL_CUDA_CHECK_LAUNCH();
      return;
    }
    // A warp-multiple of threads, no more than the block has elements (up to 256).
    const int threads = int(std::min<int64_t>(kBlockSize, (block + 31) / 32 * 32));
    const unsigned grid = unsigned(std::min<int64_t>(nblocks, max_blocks(2048 / threads)));
    quantize_blockwise_kernel_impl<T>
        <<<grid, threads, 0, stream_for(x)>>>(codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), x.data_ptr<T>(), ix,
                                              ix.dense(), x.numel(), block, nblocks, fp8);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void dequantize_blockwise_kernel(const Tensor& out, const Tensor& codes, const Tensor& scales, QuantFormat format,
                                 int64_t block) {
  DeviceGuard guard(out.device());
  dispatch_quantizable(out.dtype(), "dequantize_blockwise", out.device(), [&]<typename T>() {
    const int64_t n = out.numel();
    if (block % kVec == 0 && vectorizable<T>(out.data_ptr<T>(), {codes.data_ptr<uint8_t>()})) {
      dequantize_blockwise_vec_kernel<T><<<grid_for((n + kVec - 1) / kVec), kBlockSize, 0, stream_for(out)>>>(
          out.data_ptr<T>(), codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), n, block,
          format == QuantFormat::Fp8E4M3);
      FRUGAL_CUDA_CHECK_LAUNCH();
      return;
    }
    dequantize_blockwise_kernel_impl<T><<<grid_for(n), kBlockSize, 0, stream_for(out)>>>(
        out.data_ptr<T>(), codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), n, block,
        format == QuantFormat::Fp8E4M3);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void relu_mask_kernel(const Tensor& mask, const Tensor& y) {
  DeviceGuard guard(y.device());
  dispatch_floating(y.dtype(), "relu_mask", y.device(), [&]<typename T>() {
    const LogicalIndexer ix = quant::make_logical_indexer(y, "relu_mask");
    if (ix.dense() && vectorizable<T>(y.data_ptr<T>(), {})) {
      relu_mask_vec_kernel<T><<<grid_for(mask.numel()), kBlockSize, 0, stream_for(y)>>>(mask.data_ptr<uint8_t>(),
                                                                                        y.data_ptr<T>(), y.numel());
      FRUGAL_CUDA_CHECK_LAUNCH();
      return;
    }
    relu_mask_kernel_impl<T><<<grid_for(mask.numel()), kBlockSize, 0, stream_for(y)>>>(
        mask.data_ptr<uint8_t>(), y.data_ptr<T>(), ix, ix.dense(), y.numel());
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void apply_relu_mask_kernel(const Tensor& out, const Tensor& g, const Tensor& mask) {
  DeviceGuard guard(g.device());
  dispatch_floating(g.dtype(), "apply_relu_mask", g.device(), [&]<typename T>() {
    const LogicalIndexer ix = quant::make_logical_indexer(g, "apply_relu_mask");
    const int64_t n = g.numel();
    if (ix.dense() && vectorizable<T>(g.data_ptr<T>(), {}) && vectorizable<T>(out.data_ptr<T>(), {})) {
      apply_relu_mask_vec_kernel<T><<<grid_for((n + kVec - 1) / kVec), kBlockSize, 0, stream_for(g)>>>(
          out.data_ptr<T>(), g.data_ptr<T>(), mask.data_ptr<uint8_t>(), n);
      FRUGAL_CUDA_CHECK_LAUNCH();
      return;
    }
    apply_relu_mask_kernel_impl<T><<<grid_for(n), kBlockSize, 0, stream_for(g)>>>(
        out.data_ptr<T>(), g.data_ptr<T>(), ix, ix.dense(), mask.data_ptr<uint8_t>(), n);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
