// Multi-tensor kernels for clip_grad_norm_ (optim/clip_grad.cpp): per-chunk partial
// norms of every gradient in one launch, the clip coefficient on the device, and one
// scaling launch that reads it - so clipping never waits for the host.
#include <cmath>

#include "optim/multi_tensor_apply.cuh"
#include "tensor/cuda/block_reduce.cuh"
#include "tensor/dispatch.h"

namespace frugal::optim::cuda {

namespace {

using detail::NormEntry;

/// Which power sum a norm needs.
enum class NormKind : int { Inf, One, Two, Pow };

NormKind kind_of(double p) {
  return std::isinf(p) ? NormKind::Inf : p == 1.0 ? NormKind::One : p == 2.0 ? NormKind::Two : NormKind::Pow;
}

/// max that lets a NaN win, as torch.max does.
__device__ __forceinline__ double nan_max(double a, double b) { return a != a ? a : (b != b ? b : fmax(a, b)); }

struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct MaxOp {
  __device__ double operator()(double a, double b) const { return nan_max(a, b); }
};

/// |x|^p (or |x| for the max), accumulated in double.
template <NormKind K>
__device__ __forceinline__ double power_of(double x, double p) {
  if constexpr (K == NormKind::Two) return x * x;
  else if constexpr (K == NormKind::Pow) return ::pow(fabs(x), p);
  else return fabs(x);
}

// entries: (count) NormEntry with (numel) elements of T each. partials: (chunks) float64,
// the sum of |x|^p (the max of |x| for Inf) over each chunk.
template <typename T, NormKind K>
__global__ void __launch_bounds__(kThreads)
    norm_kernel(const NormEntry* entries, int count, int64_t chunks, double p, double* partials) {
  for_each_chunk(entries, count, chunks, [&](const NormEntry& e, int64_t chunk, int64_t begin, int64_t n) {
    double acc = 0.0;
    auto add = [&](T x) {
      const double y = power_of<K>(double(opmath_t<T>(x)), p);
      acc = K == NormKind::Inf ? nan_max(acc, y) : acc + y;
    };
    int64_t done = 0;
    if (e.flags & detail::kVec4) {
      done = n / 4 * 4;
      for (int64_t k = int64_t(threadIdx.x) * 4; k < done; k += int64_t(blockDim.x) * 4) {
        const Vec4<T> x = load4<T>(e.data, begin + k);
#pragma unroll
        for (int j = 0; j < 4; ++j) add(x.v[j]);
      }
    }
    const T* data = static_cast<const T*>(e.data);
    for (int64_t k = done + threadIdx.x; k < n; k += blockDim.x) add(data[begin + k]);
    const double total = K == NormKind::Inf ? ops::cuda::block_allreduce(acc, MaxOp{}, 0.0)
                                            : ops::cuda::block_allreduce(acc, SumOp{}, 0.0);
    if (threadIdx.x == 0) partials[chunk] = total;
  });
}

// reduced: the 0-d float64 sum (or max) of the partials. total: 0-d Out (the norm's dtype);
// coef: 0-d float64 holding the Out-precision coefficient.
template <typename Out>
__global__ void clip_coefficient_kernel(const double* reduced, int kind, double p, double max_norm, Out* total,
                                        double* coef) {
  const double s = *reduced;
  const NormKind k = NormKind(kind);
  const double norm = k == NormKind::Inf || k == NormKind::One ? s : k == NormKind::Two ? ::sqrt(s) : ::pow(s, 1.0 / p);
  // As torch.nn.utils.clip_grad_norm_ with a norm of dtype Out: clamp(max_norm / (norm + 1e-6), max=1).
  const Out t = Out(norm);
  const Out c = Out(max_norm) / (t + Out(1e-6));
  *total = t;
  *coef = c > Out(1) ? 1.0 : double(c);  // a NaN stays NaN, and so do the scaled gradients
}

// entries: (count) NormEntry of T. x *= *coef, computed in opmath_t<T>.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    scale_kernel(const NormEntry* entries, int count, int64_t chunks, const double* coef) {
  using M = opmath_t<T>;
  const double cf = *coef;
  if (cf == 1.0) return;  // nothing to clip: x * 1 == x
  const M c = M(cf);
  for_each_chunk(entries, count, chunks, [&](const NormEntry& e, int64_t, int64_t begin, int64_t n) {
    int64_t done = 0;
    if (e.flags & detail::kVec4) {
      done = n / 4 * 4;
      for (int64_t k = int64_t(threadIdx.x) * 4; k < done; k += int64_t(blockDim.x) * 4) {
        Vec4<T> x = load4<T>(e.data, begin + k);
#pragma unroll
        for (int j = 0; j < 4; ++j) x.v[j] = T(M(x.v[j]) * c);
        store4<T>(e.data, begin + k, x);
      }
    }
    T* data = static_cast<T*>(e.data);
    for (int64_t k = done + threadIdx.x; k < n; k += blockDim.x) data[begin + k] = T(M(data[begin + k]) * c);
  });
}

}  // namespace

void norm_partials(Device device, DType dtype, std::vector<NormEntry>& entries, double p, double* partials,
                   int64_t chunk_offset) {
  if (entries.empty()) return;
  DeviceGuard guard(device);
  dispatch_floating(dtype, "clip_grad_norm_", device, [&]<typename T>() {
    mark_vec4<T>(entries);
    void (*kernel)(const NormEntry*, int, int64_t, double, double*) = nullptr;
    switch (kind_of(p)) {
      case NormKind::Inf: kernel = norm_kernel<T, NormKind::Inf>; break;
      case NormKind::One: kernel = norm_kernel<T, NormKind::One>; break;
      case NormKind::Two: kernel = norm_kernel<T, NormKind::Two>; break;
      case NormKind::Pow: kernel = norm_kernel<T, NormKind::Pow>; break;
    }
    launch_fused(device, entries, kernel, p, partials + chunk_offset);
  });
}

void clip_coefficient(Device device, const double* reduced, double p, double max_norm, DType total_dtype, void* total,
                      double* coef) {
  DeviceGuard guard(device);
  const int kind = int(kind_of(p));
  if (total_dtype == DType::Float64)
    clip_coefficient_kernel<<<1, 1, 0, stream_for(device)>>>(reduced, kind, p, max_norm, static_cast<double*>(total),
                                                             coef);
  else
    clip_coefficient_kernel<<<1, 1, 0, stream_for(device)>>>(reduced, kind, p, max_norm, static_cast<float*>(total),
                                                             coef);
  FRUGAL_CUDA_CHECK_LAUNCH();
}

void scale(Device device, DType dtype, std::vector<NormEntry>& entries, const double* coef) {
  if (entries.empty()) return;
  DeviceGuard guard(device);
  dispatch_floating(dtype, "clip_grad_norm_", device, [&]<typename T>() {
    mark_vec4<T>(entries);
    launch_fused(device, entries, scale_kernel<T>, coef);
  });
}

}  // namespace frugal::optim::cuda
