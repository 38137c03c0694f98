// CUDA batch norm backward on channels-last tensors, read and written in place
// (Note [Channels-last batch norm] in tensor/ops/batch_norm.h).
//
// Note [Channels-last batch norm backward]
// Why: without cuDNN's reserve space (eval, float32, float64, a forward cuDNN did not run,
// batch_norm_relu_backward_affine) a channels-last backward used to run the NCHW kernels
// of batch_norm.cu on NCHW copies of grad_out and x, and copy grad_x back: three
// full-tensor copies around a reduction and an elementwise pass, both memory-bound.
// How: a channels-last (N, C, H, W) tensor is dense (rows = N*H*W, C) row-major memory.
// Every kernel here runs 2-D blocks of 256 threads: threadIdx.x walks a row's channels in
// vectors of Nv channels, up to a warp's width, and threadIdx.y walks the rows, so a warp
// reads consecutive memory of one row, or of consecutive rows when a row is narrower than a
// warp. The reduction reads 16-byte vectors (Nv = 16 / sizeof(T)) when C % Nv == 0 and
// every operand is 16-byte aligned, else one channel at a time; the elementwise pass reads
// 8-byte vectors for 16-bit types, since it keeps six values per channel in registers and
// with 8 channels a thread would need ~100 registers, halving the blocks per SM. A thread
// keeps its channels for its whole life: their per-channel values are loaded once, and it
// steps over rows by blockDim.y * gridDim.y. grid.x covers the channels; grid.y ("splits")
// divides the rows, as many as fill the GPU in one wave (as many blocks as fit on each SM,
// at most 4 for the reduction, 8 for the elementwise pass) while each thread keeps at
// least kMinRows rows: many splits for few channels and many rows (C = 64 in float16: one
// block wide, up to 4 x 132 = 528 splits on an H200), few for many channels and few rows
// (C = 2048: 8 blocks wide). All row offsets are int64.
// gz, the gradient entering batch norm, is formed on the fly from grad_out: itself; or
// where ReLU passes it, by the mask of the forward's output (out <= 0 ? 0 : g, the relu
// backward of unary_grad; batch_norm_add_relu); or by the mask of relu(x * scale + shift)
// recomputed in the compute dtype as a multiply then an add, each rounded (__fmul_rn /
// __fadd_rn forbid FMA contraction), so the mask is bit for bit what separate mul and add
// ops compute, which is the CPU path of batch_norm_relu_backward_affine.
// Reduction: each thread sums (gz, gz (x - mean)) over its rows; the block sums its rows
// of threads by a fixed tree in shared memory and writes one row of a (splits, C) partials
// buffer; a finish kernel (the same 2-D blocks over (splits, C)) sums each channel's
// splits in a fixed order and writes grad_weight = invstd sum gz (x - mean), grad_bias =
// sum gz, and the totals. No atomics: the same bits run to run on a given GPU model (the
// splits depend on its SM count and the kernels' registers). Then one elementwise pass
// writes grad_x (see Note [Batch norm statistics]) and, when asked, grad_residual = gz.
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/batch_norm.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kThreads = 256;    // per block, as blockDim.x * blockDim.y
constexpr int kWarp = 32;        // blockDim.x at most: the rest of the block walks rows
constexpr int64_t kMinRows = 4;  // rows per thread below which another split costs more than it gains

/// How gz comes from grad_out (see the Note).
enum class Mask { None, Out, Affine };

template <typename Acc>
struct Sums {
  Acc g, g_xmu;  // sum gz, sum gz (x - mean)
};

/// The operands every kernel reads. 2-D ones: (rows, C) dense; (C) ones in the compute dtype.
template <typename T>
struct Operands {
  using Acc = opmath_t<T>;
  const T* g;                    // grad_out
  const T* x;                    // the forward's input
  const T* out;                  // the forward's output (Mask::Out)
  const Acc *scale, *shift;      // relu(x * scale + shift)'s affine map (Mask::Affine)
  const Acc *mean, *invstd, *w;  // w: null for weight 1
  int64_t rows, C;
};

__device__ __forceinline__ float mul_add_rn(float x, float s, float b) { return __fadd_rn(__fmul_rn(x, s), b); }
__device__ __forceinline__ double mul_add_rn(double x, double s, double b) { return __dadd_rn(__dmul_rn(x, s), b); }

/// Nv elements at p, one access of Nv * sizeof(T) bytes (p aligned by the caller's check).
template <typename T, int Nv>
__device__ __forceinline__ Vec<T, Nv> load(const T* p) {
  return *reinterpret_cast<const Vec<T, Nv>*>(p);
}

/// The per-channel values a thread keeps for its Nv channels from c0.
template <typename T, int Nv, Mask kMask>
struct Channels {
  using Acc = opmath_t<T>;
  Acc mean[Nv], scale[Nv], shift[Nv];
  __device__ Channels(const Operands<T>& a, int64_t c0) {
#pragma unroll
    for (int j = 0; j < Nv; ++j) {
      mean[j] = a.mean[c0 + j];
      if constexpr (kMask == Mask::Affine) scale[j] = a.scale[c0 + j], shift[j] = a.shift[c0 + j];
    }
  }
  /// gz of element j of a vector, from grad_out g, x and out. ReLU's backward passes g unless
  /// its output is <= 0 (NaN passes), as unary_grad's does.
  __device__ __forceinline__ Acc gz(int j, T g, T x, T out) const {
    if constexpr (kMask == Mask::Out) return Acc(out) <= Acc(0) ? Acc(0) : Acc(g);
    else if constexpr (kMask == Mask::Affine) return mul_add_rn(Acc(x), scale[j], shift[j]) <= Acc(0) ? Acc(0) : Acc(g);
    else return Acc(g);
  }
};

/// Sums each thread's 2 * Nv values over threadIdx.y (blockDim.y a power of two) by a fixed
/// tree; thread (x, 0) ends with its column's totals. Must be reached by the whole block.
template <typename Acc, int Nv>
__device__ __forceinline__ void sum_over_y(Acc (&v)[2 * Nv]) {
  __shared__ Acc smem[kThreads * 2 * Nv];
  Acc* mine = smem + (threadIdx.y * blockDim.x + threadIdx.x) * 2 * Nv;
#pragma unroll
  for (int j = 0; j < 2 * Nv; ++j) mine[j] = v[j];
  for (unsigned s = blockDim.y / 2; s > 0; s /= 2) {
    __syncthreads();
    if (threadIdx.y < s)
#pragma unroll
      for (int j = 0; j < 2 * Nv; ++j) mine[j] += mine[s * blockDim.x * 2 * Nv + j];
  }
#pragma unroll
  for (int j = 0; j < 2 * Nv; ++j) v[j] = mine[j];
}

// partial: (gridDim.y, C); sums over this block's share of the rows
template <typename T, int Nv, Mask kMask>
__global__ void __launch_bounds__(kThreads) reduce_kernel(Sums<opmath_t<T>>* __restrict__ partial, Operands<T> a) {
  using Acc = opmath_t<T>;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * Nv;
  Acc acc[2 * Nv] = {};  // sum gz of channel c0 + j at j, sum gz (x - mean) at Nv + j
  if (c0 < a.C) {
    const Channels<T, Nv, kMask> ch(a, c0);
    const int64_t step = int64_t(gridDim.y) * blockDim.y;
#pragma unroll 4  // four rows' loads in flight
    for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < a.rows; r += step) {
      const int64_t off = r * a.C + c0;
      const Vec<T, Nv> g = load<T, Nv>(a.g + off), x = load<T, Nv>(a.x + off);
      Vec<T, Nv> out{};
      if constexpr (kMask == Mask::Out) out = load<T, Nv>(a.out + off);
#pragma unroll
      for (int j = 0; j < Nv; ++j) {
        const Acc gz = ch.gz(j, g.v[j], x.v[j], out.v[j]);
        acc[j] += gz;
        acc[Nv + j] += gz * (Acc(x.v[j]) - ch.mean[j]);
      }
    }
  }
  sum_over_y<Acc, Nv>(acc);
  if (threadIdx.y == 0 && c0 < a.C)
#pragma unroll
    for (int j = 0; j < Nv; ++j) partial[blockIdx.y * a.C + c0 + j] = {acc[j], acc[Nv + j]};
}

// totals: (C) or null; gw, gb: (C) or null; partial: (splits, C); invstd: (C)
template <typename Acc>
__global__ void __launch_bounds__(kThreads)
    finish_kernel(Sums<Acc>* __restrict__ totals, Acc* __restrict__ gw, Acc* __restrict__ gb,
                  const Sums<Acc>* __restrict__ partial, const Acc* __restrict__ invstd, int64_t C, int64_t splits) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  Acc acc[2] = {};
  if (c < C)
#pragma unroll 8  // eight splits' loads in flight
    for (int64_t s = threadIdx.y; s < splits; s += blockDim.y) {
      const Sums<Acc> p = partial[s * C + c];
      acc[0] += p.g, acc[1] += p.g_xmu;
    }
  sum_over_y<Acc, 1>(acc);
  if (threadIdx.y != 0 || c >= C) return;
  if (totals) totals[c] = {acc[0], acc[1]};
  if (gw) gw[c] = acc[1] * invstd[c];
  if (gb) gb[c] = acc[0];
}

// gx, gr: (rows, C) or null; totals: (C) in training, null in eval
template <typename T, int Nv, Mask kMask>
__global__ void __launch_bounds__(kThreads)
    grad_kernel(T* __restrict__ gx, T* __restrict__ gr, Operands<T> a, const Sums<opmath_t<T>>* __restrict__ totals,
                opmath_t<T> inv_m) {
  using Acc = opmath_t<T>;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * Nv;
  if (c0 >= a.C) return;
  const Channels<T, Nv, kMask> ch(a, c0);
  // grad_x = k (gz - q - (x - mean) p): k = weight invstd, q = sum gz / M, p = invstd^2 sum gz (x - mean) / M
  Acc k[Nv], p[Nv], q[Nv];
#pragma unroll
  for (int j = 0; j < Nv; ++j) {
    const Acc is = a.invstd[c0 + j];
    k[j] = a.w ? a.w[c0 + j] * is : is;
    const Sums<Acc> t = totals ? totals[c0 + j] : Sums<Acc>{Acc(0), Acc(0)};
    q[j] = t.g * inv_m, p[j] = is * is * t.g_xmu * inv_m;
  }
  const bool need_x = totals != nullptr || kMask == Mask::Affine;
  const int64_t step = int64_t(gridDim.y) * blockDim.y;
#pragma unroll 4
  for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < a.rows; r += step) {
    const int64_t off = r * a.C + c0;
    const Vec<T, Nv> g = load<T, Nv>(a.g + off);
    Vec<T, Nv> x{}, out{}, vx, vr;
    if (need_x) x = load<T, Nv>(a.x + off);
    if constexpr (kMask == Mask::Out) out = load<T, Nv>(a.out + off);
#pragma unroll
    for (int j = 0; j < Nv; ++j) {
      const Acc gz = ch.gz(j, g.v[j], x.v[j], out.v[j]);
      vr.v[j] = T(gz);
      vx.v[j] = T(k[j] * (totals ? gz - q[j] - (Acc(x.v[j]) - ch.mean[j]) * p[j] : gz));
    }
    if (gr) *reinterpret_cast<Vec<T, Nv>*>(gr + off) = vr;
    if (gx) *reinterpret_cast<Vec<T, Nv>*>(gx + off) = vx;
  }
}

/// 2-D blocks over `rows` rows of `vectors` items each (see the Note): blockDim.x the power
/// of two up to `max_bx` that covers a row, grid.y up to `fill` blocks in all, with at least
/// kMinRows rows per thread.
struct Launch {
  dim3 grid, block;
};
Launch launch_for(int64_t rows, int64_t vectors, int64_t fill, unsigned max_bx = kWarp) {
  unsigned bx = 1;
  while (bx < max_bx && int64_t(bx) < vectors) bx *= 2;
  const unsigned by = unsigned(kThreads) / bx;
  const int64_t gx = (vectors + bx - 1) / bx;
  const int64_t by_fill = (fill + gx - 1) / gx, by_work = (rows + by * kMinRows - 1) / (by * kMinRows);
  const int64_t gy = std::clamp<int64_t>(std::min(by_fill, by_work), 1, 65535);
  return {dim3(unsigned(gx), unsigned(gy)), dim3(bx, by)};
}

/// How many blocks of `kernel` fit on one SM at once (its registers and shared memory decide),
/// at most `cap`: a grid of that many per SM runs in one wave, with no tail.
template <typename Kernel>
int resident_blocks(Kernel kernel, int cap) {
  int n = 0;
  FRUGAL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0));
  return std::clamp(n, 1, cap);
}

template <typename T, int Nv, Mask kMask>
void run(const Operands<T>& a, T* gx, T* gr, opmath_t<T>* gw, opmath_t<T>* gb, bool training, Device device,
         cudaStream_t stream) {
  using Acc = opmath_t<T>;
  // Up to 4 reduction blocks per SM (with four rows of loads in flight per thread they keep
  // HBM busy, and the finish sums half the splits 8 would leave), up to 8 elementwise ones
  // (8 x 256 threads fill an SM); fewer where the registers allow fewer.
  static const int reduce_per_sm = resident_blocks(reduce_kernel<T, Nv, kMask>, 4);
  // The elementwise pass keeps six values per channel in registers: 16-bit types move 8 bytes
  // per operand there (4 channels), so that twice as many blocks fit (see the Note).
  constexpr int NvG = Nv > 1 && sizeof(T) == 2 ? Nv / 2 : Nv;
  static const int grad_per_sm = resident_blocks(grad_kernel<T, NvG, kMask>, 8);
  Tensor totals_bytes;  // (C) Sums; the arena keeps it for the grad pass queued after
  Sums<Acc>* totals = nullptr;
  if (gw || gb || (gx && training)) {
    const Launch l = launch_for(a.rows, a.C / Nv, max_blocks(reduce_per_sm));
    const int64_t splits = l.grid.y;
    const Tensor partial = empty({int64_t(splits * a.C * sizeof(Sums<Acc>))}, {kBool, device});  // bytes
    auto* p = static_cast<Sums<Acc>*>(partial.data());
    reduce_kernel<T, Nv, kMask><<<l.grid, l.block, 0, stream>>>(p, a);
    FRUGAL_CUDA_CHECK_LAUNCH();
    if (gx && training) {
      totals_bytes = empty({int64_t(a.C * sizeof(Sums<Acc>))}, {kBool, device});
      totals = static_cast<Sums<Acc>*>(totals_bytes.data());
    }
    // One row of blocks, each summing every split of its channels: 8 channels wide (64
    // contiguous bytes per split), so 32 threads share a channel's splits.
    const Launch f = launch_for(1, a.C, 1, 8);
    finish_kernel<Acc><<<f.grid, f.block, 0, stream>>>(totals, gw, gb, p, a.invstd, a.C, splits);
    FRUGAL_CUDA_CHECK_LAUNCH();
  }
  if (!gx && !gr) return;
  const Launch l = launch_for(a.rows, a.C / NvG, max_blocks(grad_per_sm));
  grad_kernel<T, NvG, kMask><<<l.grid, l.block, 0, stream>>>(gx, gr, a, totals, Acc(1.0 / double(a.rows)));
  FRUGAL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void batch_norm_backward_channels_last_kernel(const Tensor& grad_x, const Tensor& grad_residual,
                                              const Tensor& grad_weight, const Tensor& grad_bias,
                                              const Tensor& grad_out, const Tensor& x, const Tensor& out,
                                              const Tensor& scale, const Tensor& shift, const Tensor& mean,
                                              const Tensor& invstd, const Tensor& weight, bool training, int64_t rows,
                                              int64_t C) {
  DeviceGuard guard(x.device());
  cudaStream_t stream = stream_for(x);
  const Mask mask = out.defined() ? Mask::Out : scale.defined() ? Mask::Affine : Mask::None;
  dispatch_floating(x.dtype(), "batch_norm_backward", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    const Operands<T> a{.g = grad_out.data_ptr<T>(),
                        .x = x.data_ptr<T>(),
                        .out = ptr_or_null<T>(out),
                        .scale = ptr_or_null<Acc>(scale),
                        .shift = ptr_or_null<Acc>(shift),
                        .mean = mean.data_ptr<Acc>(),
                        .invstd = invstd.data_ptr<Acc>(),
                        .w = ptr_or_null<Acc>(weight),
                        .rows = rows,
                        .C = C};
    T *gx = mut_ptr_or_null<T>(grad_x), *gr = mut_ptr_or_null<T>(grad_residual);
    Acc *gw = mut_ptr_or_null<Acc>(grad_weight), *gb = mut_ptr_or_null<Acc>(grad_bias);
    constexpr int Nv = int(16 / sizeof(T));
    auto aligned = [](const Tensor& t) { return !t.defined() || pointer_alignment(t.data(), 16) >= 16; };
    const bool vec =
        C % Nv == 0 && aligned(grad_out) && aligned(x) && aligned(out) && aligned(grad_x) && aligned(grad_residual);
    auto go = [&]<int V>() {
      switch (mask) {
        case Mask::None: return run<T, V, Mask::None>(a, gx, gr, gw, gb, training, x.device(), stream);
        case Mask::Out: return run<T, V, Mask::Out>(a, gx, gr, gw, gb, training, x.device(), stream);
        case Mask::Affine: return run<T, V, Mask::Affine>(a, gx, gr, gw, gb, training, x.device(), stream);
      }
    };
    if (vec) go.template operator()<Nv>();
    else go.template operator()<1>();
  });
}

}  // namespace frugal::ops::cuda
