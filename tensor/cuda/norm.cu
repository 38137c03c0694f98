// CUDA layer norm forward and backward (see Note [Layer norm statistics]); with mean null,
// RMS norm (Note [RMS norm is layer norm around zero]).
//
// Note [CUDA layer norm kernels]
// As llm.c's layernorm_forward/backward kernels: a row of N elements is taken by one
// warp when N <= 1024 (transformer widths: 768, 1024) and by a 512-thread block when
// longer, lanes striding the row so loads coalesce. Forward: sum -> mean, sum of
// squared deviations -> rstd (the second and third reads of the row hit L1/L2), then
// the write; lane 0 stores mean and rstd. Backward dx: one read folding the pair
// (sum(dxhat), sum(dxhat * xhat)), an all-reduce, one write. dweight and dbias: a
// column reduction; a 32 x 8 block owns 32 columns and a slice of the rows (threadIdx.x
// walks columns: coalesced), the 8 row lanes merge in shared memory into one partial per
// (row slice, column), and a second kernel adds the slices in a fixed order (again 32
// columns a block, 8 lanes over the slices). No atomics, so the
// parameter gradients are bitwise reproducible run to run. When dx and a parameter
// gradient are both wanted for rows of at most 1024 elements (every transformer's layer
// norm), one kernel does both, so g and x are read once instead of twice: each warp also
// sums its columns' g * xhat and g into its own slice of shared memory, the block adds the
// slices in warp order, and the same finishing kernel adds the blocks' partials in order
// (still no atomics). RMS norm takes the same kernels with mean null: the forward skips
// the mean's pass and every xhat is x * rstd.
#include <cmath>

#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/norm.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kWarpRowsBlock = 128;  // warp per row: 4 rows per block
constexpr int kLongRowBlock = 512;   // block per row
constexpr int64_t kWarpRowMax = 1024;
constexpr int kColX = 32, kColY = 8;  // parameter-gradient column reduction
constexpr int kFusedBlock = 128;      // the fused backward: 4 warps, 32 KiB of shared sums

template <typename Acc>
__device__ __forceinline__ Acc rsqrt_acc(Acc v) {
  if constexpr (std::is_same_v<Acc, float>) return rsqrtf(v);
  else return ::rsqrt(v);
}

/// a * b rounded to Acc before any later use: the product may not be fused into an FMA with
/// the subtraction that follows, which would subtract a rounded sum of these products from the
/// unrounded product and leave its rounding error behind. For a row of one element dx must be
/// exactly 0 (PyTorch's), and that error times rstd (1 / sqrt(eps) there) was not.
template <typename Acc>
__device__ __forceinline__ Acc mul_rn(Acc a, Acc b) {
  if constexpr (std::is_same_v<Acc, float>) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
}

template <typename Acc>
struct Pair {
  Acc a, b;
};

/// Sum over the kThreads lanes of a row (a warp, or the whole block).
template <int kThreads, typename S>
__device__ __forceinline__ S row_sum(S v, S zero) {
  const auto add = [](S x, S y) {
    if constexpr (std::is_arithmetic_v<S>) return x + y;
    else return S{x.a + y.a, x.b + y.b};
  };
  if constexpr (kThreads == 32) return warp_allreduce(v, add);
  else return block_allreduce(v, add, zero);
}

// y, x: (M, N); w, b: (N) or null; mean (null: RMS norm), rstd: (M)
template <typename T, int kThreads, int kBlock>
__global__ void __launch_bounds__(kBlock)
    layer_norm_forward_kernel(T* __restrict__ y, opmath_t<T>* __restrict__ mean, opmath_t<T>* __restrict__ rstd,
                              const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, int64_t M,
                              int64_t N, opmath_t<T> eps) {
  using Acc = opmath_t<T>;
  constexpr int kRowsPerBlock = kBlock / kThreads;
  const int lane = int(threadIdx.x % kThreads);
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads; row < M;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * N;
    // RMS norm (mean null) takes deviations from zero. mean is null or not for the whole
    // grid, so no thread of a block skips the block reduction the others enter.
    Acc m = 0;
    if (mean) {
      Acc s = 0;
      for (int64_t j = lane; j < N; j += kThreads) s += Acc(xr[j]);
      m = row_sum<kThreads>(s, Acc(0)) / Acc(N);
    }
    Acc ss = 0;
    for (int64_t j = lane; j < N; j += kThreads) {
      const Acc d = Acc(xr[j]) - m;
      ss += d * d;
    }
    const Acc rs = rsqrt_acc(row_sum<kThreads>(ss, Acc(0)) / Acc(N) + eps);
    if (lane == 0) {
      if (mean) mean[row] = m;
      rstd[row] = rs;
    }
    T* yr = y + row * N;
    for (int64_t j = lane; j < N; j += kThreads) {
      Acc v = (Acc(xr[j]) - m) * rs;
      if (w) v *= Acc(w[j]);
      if (b) v += Acc(b[j]);
      yr[j] = T(v);
    }
  }
}

// y, x: (M, N); mean (null: RMS norm), rstd: (M); w, b: (N) or null. The forward's write, from given
// statistics: one thread per element, grid-stride.
template <typename T>
__global__ void layer_norm_apply_elementwise_kernel(T* __restrict__ y, const T* __restrict__ x,
                                                    const opmath_t<T>* __restrict__ mean,
                                                    const opmath_t<T>* __restrict__ rstd, const T* __restrict__ w,
                                                    const T* __restrict__ b, int64_t N, int64_t numel) {
  using Acc = opmath_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / N, j = i - row * N;
    Acc v = (Acc(x[i]) - (mean ? mean[row] : Acc(0))) * rstd[row];
    if (w) v *= Acc(w[j]);
    if (b) v += Acc(b[j]);
    y[i] = T(v);
  }
}

// gx, g, x: (M, N); mean (null: RMS norm), rstd: (M); w: (N) or null
template <typename T, int kThreads, int kBlock>
__global__ void __launch_bounds__(kBlock)
    layer_norm_backward_dx_kernel(T* __restrict__ gx, const T* __restrict__ g, const T* __restrict__ x,
                                  const opmath_t<T>* __restrict__ mean, const opmath_t<T>* __restrict__ rstd,
                                  const T* __restrict__ w, int64_t M, int64_t N) {
  using Acc = opmath_t<T>;
  constexpr int kRowsPerBlock = kBlock / kThreads;
  const int lane = int(threadIdx.x % kThreads);
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads; row < M;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + row * N;
    const T* gr = g + row * N;
    const Acc m = mean ? mean[row] : Acc(0), rs = rstd[row];
    Pair<Acc> p{0, 0};  // sum(dxhat), sum(dxhat * xhat)
    for (int64_t j = lane; j < N; j += kThreads) {
      const Acc dxhat = w ? mul_rn(Acc(gr[j]), Acc(w[j])) : Acc(gr[j]);
      p.a += dxhat;
      p.b += dxhat * ((Acc(xr[j]) - m) * rs);
    }
    p = row_sum<kThreads>(p, Pair<Acc>{0, 0});
    const Acc c1 = mean ? p.a / Acc(N) : Acc(0), c2 = p.b / Acc(N);  // RMS norm: no mean(dxhat) term
    T* gxr = gx + row * N;
    for (int64_t j = lane; j < N; j += kThreads) {
      const Acc dxhat = w ? mul_rn(Acc(gr[j]), Acc(w[j])) : Acc(gr[j]);
      gxr[j] = T(rs * (dxhat - c1 - ((Acc(xr[j]) - m) * rs) * c2));
    }
  }
}

// The backward of rows of at most kWarpRowMax elements in one pass over g and x (Note [CUDA
// layer norm kernels]): a warp per row writes dx as layer_norm_backward_dx_kernel does, and
// each lane also adds g * xhat and g of its columns (j = lane + 32 k) into its warp's slice
// of shared memory over the rows the warp takes. The block's warps then add their slices in
// warp order, and the block writes one partial per column: partial (gridDim.x, 2, N).
template <typename T>
__global__ void __launch_bounds__(kFusedBlock)
    layer_norm_backward_fused_kernel(T* __restrict__ gx, float* __restrict__ partial, const T* __restrict__ g,
                                     const T* __restrict__ x, const float* __restrict__ mean,
                                     const float* __restrict__ rstd, const T* __restrict__ w, int64_t M, int64_t N) {
  constexpr int kWarps = kFusedBlock / 32;
  __shared__ float sums[kWarps][2][kWarpRowMax];  // per warp: sum(g * xhat), then sum(g)
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  float* dw = sums[warp][0];
  float* db = sums[warp][1];
  for (int64_t j = lane; j < N; j += 32) dw[j] = db[j] = 0;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + warp; row < M; row += int64_t(gridDim.x) * kWarps) {
    const T* xr = x + row * N;
    const T* gr = g + row * N;
    const float m = mean ? mean[row] : 0.0f, rs = rstd[row];
    Pair<float> p{0, 0};  // sum(dxhat), sum(dxhat * xhat)
    for (int64_t j = lane; j < N; j += 32) {
      const float gv = float(gr[j]), xhat = (float(xr[j]) - m) * rs;
      const float dxhat = w ? __fmul_rn(gv, float(w[j])) : gv;
      p.a += dxhat;
      p.b += dxhat * xhat;
      dw[j] += gv * xhat;
      db[j] += gv;
    }
    p = row_sum<32>(p, Pair<float>{0, 0});
    const float c1 = mean ? p.a / float(N) : 0.0f, c2 = p.b / float(N);
    T* gxr = gx + row * N;
    for (int64_t j = lane; j < N; j += 32) {
      const float dxhat = w ? __fmul_rn(float(gr[j]), float(w[j])) : float(gr[j]);
      gxr[j] = T(rs * (dxhat - c1 - ((float(xr[j]) - m) * rs) * c2));
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < N; j += kFusedBlock) {
    float a = 0, b = 0;
    for (int k = 0; k < kWarps; ++k) {  // warp order: the same sums every run
      a += sums[k][0][j];
      b += sums[k][1][j];
    }
    partial[int64_t(blockIdx.x) * 2 * N + j] = a;
    partial[int64_t(blockIdx.x) * 2 * N + N + j] = b;
  }
}

/// The column kernels' merge: a kColX x kColY block's row lanes add their (dw, db) in lane
/// order; returns true on lane ty == 0, which then holds the block's sums for its column.
template <typename Acc>
__device__ __forceinline__ bool merge_row_lanes(Acc& dw, Acc& db) {
  __shared__ Acc sw[kColY][kColX], sb[kColY][kColX];
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  sw[ty][tx] = dw;
  sb[ty][tx] = db;
  __syncthreads();
  if (ty != 0) return false;
  for (int k = 1; k < kColY; ++k) {
    dw += sw[k][tx];
    db += sb[k][tx];
  }
  return true;
}

// g, x: (M, N); mean (null: RMS norm), rstd: (M); partial: (gridDim.y, 2, N): per row slice,
// sum(g * xhat) then sum(g)
template <typename T>
__global__ void __launch_bounds__(kColX* kColY)
    layer_norm_param_partial_kernel(opmath_t<T>* __restrict__ partial, const T* __restrict__ g, const T* __restrict__ x,
                                    const opmath_t<T>* __restrict__ mean, const opmath_t<T>* __restrict__ rstd,
                                    int64_t M, int64_t N) {
  using Acc = opmath_t<T>;
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const int64_t j = int64_t(blockIdx.x) * kColX + tx;
  Acc dw = 0, db = 0;
  if (j < N) {
    for (int64_t r = int64_t(blockIdx.y) * kColY + ty; r < M; r += int64_t(gridDim.y) * kColY) {
      const Acc gv = Acc(g[r * N + j]);
      dw += gv * ((Acc(x[r * N + j]) - (mean ? mean[r] : Acc(0))) * rstd[r]);
      db += gv;
    }
  }
  if (merge_row_lanes(dw, db) && j < N) {
    Acc* out = partial + int64_t(blockIdx.y) * 2 * N;
    out[j] = dw;
    out[N + j] = db;
  }
}

// partial: (slices, 2, N); gw, gb: (N) or null. A 32 x 8 block owns 32 columns; row lane ty
// adds slices ty, ty + 8, ... and the 8 lanes merge in shared memory in lane order.
template <typename T>
__global__ void __launch_bounds__(kColX* kColY)
    layer_norm_param_finish_kernel(T* __restrict__ gw, T* __restrict__ gb, const opmath_t<T>* __restrict__ partial,
                                   int64_t slices, int64_t N) {
  using Acc = opmath_t<T>;
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const int64_t j = int64_t(blockIdx.x) * kColX + tx;
  Acc dw = 0, db = 0;
  if (j < N) {
    for (int64_t s = ty; s < slices; s += kColY) {
      dw += partial[s * 2 * N + j];
      db += partial[s * 2 * N + N + j];
    }
  }
  if (merge_row_lanes(dw, db) && j < N) {
    if (gw) gw[j] = T(dw);
    if (gb) gb[j] = T(db);
  }
}

/// Calls f.template operator()<kThreads, kBlock>() for the row kernels' shape (Note [CUDA layer norm kernels]).
template <typename F>
void with_row_shape(int64_t N, F&& f) {
  if (N <= kWarpRowMax) f.template operator()<32, kWarpRowsBlock>();
  else f.template operator()<kLongRowBlock, kLongRowBlock>();
}

template <int kThreads, int kBlock>
unsigned row_grid(int64_t M) {
  constexpr int64_t rows_per_block = kBlock / kThreads;
  return unsigned(std::clamp<int64_t>((M + rows_per_block - 1) / rows_per_block, 1, max_blocks(16)));
}

}  // namespace

void layer_norm_kernel(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, int64_t M, int64_t N, double eps) {
  DeviceGuard guard(x.device());
  cudaStream_t stream = stream_for(x);
  dispatch_floating(x.dtype(), "layer_norm", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    with_row_shape(N, [&]<int kThreads, int kBlock>() {
      layer_norm_forward_kernel<T, kThreads, kBlock><<<row_grid<kThreads, kBlock>(M), kBlock, 0, stream>>>(
          out.data_ptr<T>(), mut_ptr_or_null<Acc>(mean), rstd.data_ptr<Acc>(), x.data_ptr<T>(), ptr_or_null<T>(weight),
          ptr_or_null<T>(bias), M, N, Acc(eps));
      FRUGAL_CUDA_CHECK_LAUNCH();
    });
  });
}

void layer_norm_apply_kernel(const Tensor& out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                             const Tensor& weight, const Tensor& bias, int64_t M, int64_t N) {
  DeviceGuard guard(x.device());
  dispatch_floating(x.dtype(), "layer_norm_apply", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    const int64_t numel = M * N;
    layer_norm_apply_elementwise_kernel<T><<<grid_for(numel), kBlockSize, 0, stream_for(x)>>>(
        out.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<Acc>(mean), rstd.data_ptr<Acc>(), ptr_or_null<T>(weight),
        ptr_or_null<T>(bias), N, numel);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void layer_norm_backward_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                const Tensor& weight, int64_t M, int64_t N) {
  DeviceGuard guard(x.device());
  cudaStream_t stream = stream_for(x);
  dispatch_floating(x.dtype(), "layer_norm_backward", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    if constexpr (std::is_same_v<Acc, float>) {
      if (grad_x.defined() && (grad_weight.defined() || grad_bias.defined()) && N <= kWarpRowMax) {
        // One pass (layer_norm_backward_fused_kernel), about 4 row-owning blocks per SM.
        const int64_t blocks = std::clamp<int64_t>((M + kFusedBlock / 32 - 1) / (kFusedBlock / 32), 1, max_blocks(4));
        const Tensor partial = empty({blocks, 2, N}, {kFloat32, x.device()});
        layer_norm_backward_fused_kernel<T><<<unsigned(blocks), kFusedBlock, 0, stream>>>(
            grad_x.data_ptr<T>(), partial.data_ptr<float>(), grad_out.data_ptr<T>(), x.data_ptr<T>(),
            ptr_or_null<float>(mean), rstd.data_ptr<float>(), ptr_or_null<T>(weight), M, N);
        FRUGAL_CUDA_CHECK_LAUNCH();
        layer_norm_param_finish_kernel<T><<<unsigned((N + kColX - 1) / kColX), dim3(kColX, kColY), 0, stream>>>(
            mut_ptr_or_null<T>(grad_weight), mut_ptr_or_null<T>(grad_bias), partial.data_ptr<float>(), blocks, N);
        FRUGAL_CUDA_CHECK_LAUNCH();
        return;
      }
    }
    if (grad_x.defined()) {
      with_row_shape(N, [&]<int kThreads, int kBlock>() {
        layer_norm_backward_dx_kernel<T, kThreads, kBlock><<<row_grid<kThreads, kBlock>(M), kBlock, 0, stream>>>(
            grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<Acc>(mean), rstd.data_ptr<Acc>(),
            ptr_or_null<T>(weight), M, N);
        FRUGAL_CUDA_CHECK_LAUNCH();
      });
    }
    if (!grad_weight.defined() && !grad_bias.defined()) return;
    // Row slices: enough blocks to fill the GPU, each thread summing at least ~8 rows.
    const int64_t col_blocks = (N + kColX - 1) / kColX;
    const int64_t slices = std::clamp<int64_t>(
        std::min<int64_t>((M + 8 * kColY - 1) / (8 * kColY), (2 * max_blocks(16) + col_blocks - 1) / col_blocks), 1,
        65535);
    const Tensor partial = empty({slices, 2, N}, {dtype_of<Acc>(), x.device()});
    layer_norm_param_partial_kernel<T><<<dim3(unsigned(col_blocks), unsigned(slices)), dim3(kColX, kColY), 0, stream>>>(
        partial.data_ptr<Acc>(), grad_out.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<Acc>(mean), rstd.data_ptr<Acc>(),
        M, N);
    FRUGAL_CUDA_CHECK_LAUNCH();
    layer_norm_param_finish_kernel<T><<<unsigned(col_blocks), dim3(kColX, kColY), 0, stream>>>(
        mut_ptr_or_null<T>(grad_weight), mut_ptr_or_null<T>(grad_bias), partial.data_ptr<Acc>(), slices, N);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
