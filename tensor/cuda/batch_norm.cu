// CUDA batch norm: frugal's own kernels (Note [Batch norm statistics] in tensor/ops/batch_norm.h).
//
// Note [CUDA batch norm kernels]
// Why not cuDNN's batch norm: these kernels take float16/bfloat16 inputs with float32
// or 16-bit parameters alike, float64, any eps, and are deterministic; cuDNN's
// (deprecated in 9.x) legacy batch norm offers none of that for free, and the work is
// a reduction and an elementwise pass, memory-bound either way.
// The channel c of an (N, C, HW) tensor is N rows of HW contiguous values. A channel's
// M = N * HW values are cut into `splits` contiguous ranges, one 256-thread block
// each (grid = C * splits blocks, enough to fill the GPU however few the channels);
// consecutive threads read consecutive values, stepping (n, j) by the block size
// without a division per element. Statistics: each thread runs Welford's update,
// the block merges the threads' (count, mean, M2) with Chan's formula, and a second
// kernel, one thread per channel, merges the splits in order, writes mean and
// invstd and updates the running statistics. Backward: the same split reduction of
// (sum g, sum g (x - mean)), then one elementwise pass for grad_x. No atomics: the
// results are the same bits run to run.
#include <cmath>

#include "tensor/cuda/block_reduce.cuh"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/batch_norm.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int64_t kMinPerBlock = int64_t(kBlock) * 16;  // values per block below which splitting costs more

/// Splits per channel for the reductions (see Note [CUDA batch norm kernels]).
int64_t splits_for(int64_t C, int64_t M) {
  const int64_t by_work = (M + kMinPerBlock - 1) / kMinPerBlock;
  const int64_t by_fill = (max_blocks(8) + C - 1) / C;  // enough blocks to fill the GPU
  return std::max<int64_t>(1, std::min(by_work, by_fill));
}

template <typename Acc>
struct Welford {
  int64_t n;
  Acc mean, m2;
};

template <typename Acc>
__device__ __forceinline__ Welford<Acc> merge(const Welford<Acc>& a, const Welford<Acc>& b) {
  if (a.n == 0) return b;
  if (b.n == 0) return a;
  const int64_t n = a.n + b.n;
  const Acc delta = b.mean - a.mean, fb = Acc(b.n) / Acc(n);
  return {n, a.mean + delta * fb, a.m2 + b.m2 + delta * delta * Acc(a.n) * fb};
}

template <typename Acc>
struct MergeWelford {
  __device__ Welford<Acc> operator()(const Welford<Acc>& a, const Welford<Acc>& b) const { return merge(a, b); }
};

template <typename Acc>
struct Sums {
  Acc g, g_xmu;  // sum g, sum g (x - mean)
};

template <typename Acc>
struct AddSums {
  __device__ Sums<Acc> operator()(const Sums<Acc>& a, const Sums<Acc>& b) const {
    return {a.g + b.g, a.g_xmu + b.g_xmu};
  }
};

/// Walks the values [e0, e1) of channel c, calling f(offset) with each value's offset in
/// the (N, C, HW) tensor; thread t takes e0 + t, e0 + t + kBlock, ...
template <typename F>
__device__ __forceinline__ void for_channel_range(int64_t c, int64_t C, int64_t HW, int64_t e0, int64_t e1, F&& f) {
  int64_t e = e0 + threadIdx.x;
  if (e >= e1) return;
  int64_t n = e / HW, j = e - n * HW;  // one division per thread, then steps
  const int64_t dn = kBlock / HW, dj = kBlock % HW;
  for (; e < e1; e += kBlock) {
    f((n * C + c) * HW + j);
    n += dn, j += dj;
    if (j >= HW) j -= HW, ++n;
  }
}

// partial: (C, splits); x: (N, C, HW)
template <typename T>
__global__ void __launch_bounds__(kBlock)
    stats_partial_kernel(Welford<opmath_t<T>>* __restrict__ partial, const T* __restrict__ x, int64_t C, int64_t HW,
                         int64_t M, int64_t splits) {
  using Acc = opmath_t<T>;
  const int64_t c = blockIdx.x / splits, s = blockIdx.x % splits;
  const int64_t chunk = (M + splits - 1) / splits, e0 = s * chunk, e1 = e0 + chunk < M ? e0 + chunk : M;
  Welford<Acc> w{0, Acc(0), Acc(0)};
  for_channel_range(c, C, HW, e0, e1, [&](int64_t off) {
    const Acc v = Acc(x[off]);
    ++w.n;
    const Acc d = v - w.mean;
    w.mean += d / Acc(w.n);
    w.m2 += d * (v - w.mean);
  });
  w = block_allreduce(w, MergeWelford<Acc>{}, Welford<Acc>{0, Acc(0), Acc(0)});
  if (threadIdx.x == 0) partial[blockIdx.x] = w;
}

// mean, invstd: (C); rm, rv: (C) or null; partial: (C, splits)
template <typename Acc>
__global__ void stats_finish_kernel(Acc* __restrict__ mean, Acc* __restrict__ invstd, Acc* __restrict__ rm,
                                    Acc* __restrict__ rv, const Welford<Acc>* __restrict__ partial, int64_t C,
                                    int64_t splits, Acc momentum, Acc eps) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    Welford<Acc> w = partial[c * splits];
    for (int64_t s = 1; s < splits; ++s) w = merge(w, partial[c * splits + s]);
    mean[c] = w.mean;
    invstd[c] = Acc(1) / sqrt(w.m2 / Acc(w.n) + eps);
    if (rm) {
      rm[c] = (Acc(1) - momentum) * rm[c] + momentum * w.mean;
      rv[c] = (Acc(1) - momentum) * rv[c] + momentum * w.m2 / Acc(w.n - 1);
    }
  }
}

// out, x, r (or null): (N, C, HW) flat; mean, invstd: (C); w, b: (C) or null
template <typename T, typename Index>
__global__ void apply_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ r, bool relu,
                             const opmath_t<T>* __restrict__ mean, const opmath_t<T>* __restrict__ invstd,
                             const opmath_t<T>* __restrict__ w, const opmath_t<T>* __restrict__ b, Index C, Index HW,
                             Index numel) {
  using Acc = opmath_t<T>;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += Index(gridDim.x) * blockDim.x) {
    const Index c = (i / HW) % C;
    Acc v = (Acc(x[i]) - mean[c]) * invstd[c];
    if (w) v *= w[c];
    if (b) v += b[c];
    if (r) v += Acc(r[i]);
    out[i] = T(relu && v < Acc(0) ? Acc(0) : v);  // rounded once (Note [Batch norm add ReLU]); NaN passes
  }
}

// apply_kernel with 16-byte accesses (Note [Vectorized elementwise]), in the same arithmetic:
// vector v holds elements v * Nv ... v * Nv + Nv - 1, which are Nv consecutive channels of
// one pixel when HW == 1 (channels-last; C % Nv == 0) and Nv pixels of one channel when
// HW % Nv == 0. Recomputed ResNet activations (Note [Recomputable outputs]) run here, so
// this pass is what recompute costs.
template <typename T, int Nv, typename Index>
__global__ void apply_vec_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ r, bool relu,
                                 const opmath_t<T>* __restrict__ mean, const opmath_t<T>* __restrict__ invstd,
                                 const opmath_t<T>* __restrict__ w, const opmath_t<T>* __restrict__ b, Index C,
                                 Index HW, Index vectors) {
  using Acc = opmath_t<T>;
  using V = Vec<T, Nv>;
  for (Index v = Index(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += Index(gridDim.x) * blockDim.x) {
    const Index i = v * Nv;
    const bool per_lane = HW == 1;
    const Index c0 = per_lane ? i % C : (i / HW) % C;
    const V xv = reinterpret_cast<const V*>(x)[v];
    V rv{};
    if (r) rv = reinterpret_cast<const V*>(r)[v];
    V o;
#pragma unroll
    for (int j = 0; j < Nv; ++j) {
      const Index c = per_lane ? c0 + Index(j) : c0;
      Acc a = (Acc(xv.v[j]) - __ldg(mean + c)) * __ldg(invstd + c);
      if (w) a *= __ldg(w + c);
      if (b) a += __ldg(b + c);
      if (r) a += Acc(rv.v[j]);
      o.v[j] = T(relu && a < Acc(0) ? Acc(0) : a);
    }
    reinterpret_cast<V*>(out)[v] = o;
  }
}

// partial: (C, splits); g, x: (N, C, HW); mean: (C)
template <typename T>
__global__ void __launch_bounds__(kBlock)
    backward_partial_kernel(Sums<opmath_t<T>>* __restrict__ partial, const T* __restrict__ g, const T* __restrict__ x,
                            const opmath_t<T>* __restrict__ mean, int64_t C, int64_t HW, int64_t M, int64_t splits) {
  using Acc = opmath_t<T>;
  const int64_t c = blockIdx.x / splits, s = blockIdx.x % splits;
  const int64_t chunk = (M + splits - 1) / splits, e0 = s * chunk, e1 = e0 + chunk < M ? e0 + chunk : M;
  const Acc m = mean[c];
  Sums<Acc> acc{Acc(0), Acc(0)};
  for_channel_range(c, C, HW, e0, e1, [&](int64_t off) {
    const Acc gv = Acc(g[off]);
    acc.g += gv;
    acc.g_xmu += gv * (Acc(x[off]) - m);
  });
  acc = block_allreduce(acc, AddSums<Acc>{}, Sums<Acc>{Acc(0), Acc(0)});
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// sums: (C) totals; gw, gb: (C) or null; partial: (C, splits); invstd: (C)
template <typename Acc>
__global__ void backward_finish_kernel(Sums<Acc>* __restrict__ sums, Acc* __restrict__ gw, Acc* __restrict__ gb,
                                       const Sums<Acc>* __restrict__ partial, const Acc* __restrict__ invstd, int64_t C,
                                       int64_t splits) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    Sums<Acc> t = partial[c * splits];
    for (int64_t s = 1; s < splits; ++s) t = {t.g + partial[c * splits + s].g, t.g_xmu + partial[c * splits + s].g_xmu};
    sums[c] = t;
    if (gw) gw[c] = t.g_xmu * invstd[c];
    if (gb) gb[c] = t.g;
  }
}

// gx, g, x: (N, C, HW) flat; mean, invstd: (C); w: (C) or null; sums: (C) (training) or null (eval)
template <typename T, typename Index>
__global__ void backward_dx_kernel(T* __restrict__ gx, const T* __restrict__ g, const T* __restrict__ x,
                                   const opmath_t<T>* __restrict__ mean, const opmath_t<T>* __restrict__ invstd,
                                   const opmath_t<T>* __restrict__ w, const Sums<opmath_t<T>>* __restrict__ sums,
                                   Index C, Index HW, Index numel, opmath_t<T> inv_m) {
  using Acc = opmath_t<T>;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += Index(gridDim.x) * blockDim.x) {
    const Index c = (i / HW) % C;
    const Acc is = invstd[c], scale = w ? w[c] * is : is;
    Acc v = Acc(g[i]);
    if (sums) {  // training: the statistics depend on x too
      const Sums<Acc> t = sums[c];
      v -= t.g * inv_m + (Acc(x[i]) - mean[c]) * is * is * t.g_xmu * inv_m;
    }
    gx[i] = T(v * scale);
  }
}

/// Calls f with Index = uint32_t when every flat index fits, else int64_t.
template <typename F>
void with_index_type(int64_t numel, F&& f) {
  if (numel < (int64_t(1) << 31)) f.template operator()<uint32_t>();
  else f.template operator()<int64_t>();
}

}  // namespace

void batch_norm_stats_kernel(const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                             const Tensor& running_var, const Tensor& x, int64_t N, int64_t C, int64_t HW,
                             double momentum, double eps) {
  DeviceGuard guard(x.device());
  cudaStream_t stream = stream_for(x);
  const int64_t M = N * HW, splits = splits_for(C, M);
  dispatch_floating(x.dtype(), "batch_norm", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    const Tensor partial = empty({int64_t(C * splits * sizeof(Welford<Acc>))}, {kBool, x.device()});  // bytes
    auto* p = static_cast<Welford<Acc>*>(partial.data());
    stats_partial_kernel<T><<<unsigned(C * splits), kBlock, 0, stream>>>(p, x.data_ptr<T>(), C, HW, M, splits);
    FRUGAL_CUDA_CHECK_LAUNCH();
    stats_finish_kernel<Acc><<<grid_for(C), kBlockSize, 0, stream>>>(
        mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(), mut_ptr_or_null<Acc>(running_mean),
        mut_ptr_or_null<Acc>(running_var), p, C, splits, Acc(momentum), Acc(eps));
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_apply_kernel(const Tensor& out, const Tensor& x, const Tensor& residual, bool relu, const Tensor& mean,
                             const Tensor& invstd, const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                             int64_t HW) {
  DeviceGuard guard(x.device());
  const int64_t numel = N * C * HW;
  dispatch_floating(x.dtype(), "batch_norm", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    constexpr int Nv = int(16 / sizeof(T));
    const bool aligned = pointer_alignment(out.data(), 16) >= 16 && pointer_alignment(x.data(), 16) >= 16 &&
                         (!residual.defined() || pointer_alignment(residual.data(), 16) >= 16);
    if (Nv > 1 && aligned && ((HW == 1 && C % Nv == 0) || HW % Nv == 0)) {
      with_index_type(numel, [&]<typename Index>() {
        const int64_t vectors = numel / Nv;
        apply_vec_kernel<T, Nv, Index><<<grid_for(vectors), kBlockSize, 0, stream_for(x)>>>(
            out.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<T>(residual), relu, mean.data_ptr<Acc>(),
            invstd.data_ptr<Acc>(), ptr_or_null<Acc>(weight), ptr_or_null<Acc>(bias), Index(C), Index(HW),
            Index(vectors));
        FRUGAL_CUDA_CHECK_LAUNCH();
      });
      return;
    }
    with_index_type(numel, [&]<typename Index>() {
      apply_kernel<T, Index><<<grid_for(numel), kBlockSize, 0, stream_for(x)>>>(
          out.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<T>(residual), relu, mean.data_ptr<Acc>(),
          invstd.data_ptr<Acc>(), ptr_or_null<Acc>(weight), ptr_or_null<Acc>(bias), Index(C), Index(HW), Index(numel));
      FRUGAL_CUDA_CHECK_LAUNCH();
    });
  });
}

void batch_norm_backward_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                const Tensor& weight, bool training, int64_t N, int64_t C, int64_t HW) {
  DeviceGuard guard(x.device());
  cudaStream_t stream = stream_for(x);
  const int64_t M = N * HW, numel = N * C * HW;
  const bool need_sums = grad_weight.defined() || grad_bias.defined() || (grad_x.defined() && training);
  dispatch_floating(x.dtype(), "batch_norm_backward", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    Tensor sums_bytes;
    Sums<Acc>* sums = nullptr;
    if (need_sums) {
      const int64_t splits = splits_for(C, M);
      const Tensor partial = empty({int64_t(C * splits * sizeof(Sums<Acc>))}, {kBool, x.device()});  // bytes
      sums_bytes = empty({int64_t(C * sizeof(Sums<Acc>))}, {kBool, x.device()});
      auto* p = static_cast<Sums<Acc>*>(partial.data());
      sums = static_cast<Sums<Acc>*>(sums_bytes.data());
      backward_partial_kernel<T><<<unsigned(C * splits), kBlock, 0, stream>>>(
          p, grad_out.data_ptr<T>(), x.data_ptr<T>(), mean.data_ptr<Acc>(), C, HW, M, splits);
      FRUGAL_CUDA_CHECK_LAUNCH();
      backward_finish_kernel<Acc><<<grid_for(C), kBlockSize, 0, stream>>>(sums, mut_ptr_or_null<Acc>(grad_weight),
                                                                          mut_ptr_or_null<Acc>(grad_bias), p,
                                                                          invstd.data_ptr<Acc>(), C, splits);
      FRUGAL_CUDA_CHECK_LAUNCH();
    }
    if (!grad_x.defined()) return;
    with_index_type(numel, [&]<typename Index>() {
      backward_dx_kernel<T, Index><<<grid_for(numel), kBlockSize, 0, stream>>>(
          grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), x.data_ptr<T>(), mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(),
          ptr_or_null<Acc>(weight), training ? sums : nullptr, Index(C), Index(HW), Index(numel), Acc(1.0 / double(M)));
      FRUGAL_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace frugal::ops::cuda
