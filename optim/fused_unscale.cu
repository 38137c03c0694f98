// The multi-tensor kernel of GradScaler.unscale_ (see Note [Fused unscale] in
// optim/grad_scaler.h): every gradient of one (device, dtype) multiplied by 1/scale and
// checked for inf/NaN in one launch, the verdict left in a device-side flag.
#include "optim/grad_scaler.h"
#include "optim/multi_tensor_apply.cuh"
#include "tensor/dispatch.h"

namespace frugal::optim::cuda {

namespace {

using detail::NormEntry;

// entries: (count) NormEntry with (numel) gradient elements of T each, unscaled in place.
// found_inf: 0-d float32, set to 1 when any element is inf or NaN (before scaling); never
// cleared here, so several launches (dtypes) can share one flag. device_scale: null, or the
// scale in device memory, whose reciprocal then replaces inv_scale (computed as the host
// does, so both give the same bits; Note [GradScaler in a CUDA graph]).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    unscale_kernel(const NormEntry* entries, int count, int64_t chunks, float inv_scale, const float* device_scale,
                   float* found_inf) {
  using M = opmath_t<T>;
  if (device_scale != nullptr) inv_scale = float(1.0 / double(*device_scale));
  const M inv = M(inv_scale);
  const bool scale = inv_scale != 1.0f;  // a multiply by 1 changes nothing: only check
  bool bad = false;
  auto unscale = [&](T& x) {
    const M v = M(x);
    bad |= !::isfinite(v);
    if (scale) x = T(v * inv);
  };
  for_each_chunk(entries, count, chunks, [&](const NormEntry& e, int64_t, int64_t begin, int64_t n) {
    int64_t done = 0;
    if (e.flags & detail::kVec4) {
      done = n / 4 * 4;
      for (int64_t k = int64_t(threadIdx.x) * 4; k < done; k += int64_t(blockDim.x) * 4) {
        Vec4<T> x = load4<T>(e.data, begin + k);
#pragma unroll
        for (int j = 0; j < 4; ++j) unscale(x.v[j]);
        if (scale) store4<T>(e.data, begin + k, x);
      }
    }
    T* data = static_cast<T*>(e.data);
    for (int64_t k = done + threadIdx.x; k < n; k += blockDim.x) unscale(data[begin + k]);
  });
  // One store per block that saw a non-finite value (every thread reaches this barrier).
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

// The update of Note [Dynamic loss scaling] on the device: PyTorch's _amp_update_scale_,
// products in double rounded to float32 as GradScaler::update computes them on the host.
__global__ void update_scale_kernel(float* scale, int64_t* growth_tracker, const float* found_inf, double growth_factor,
                                    double backoff_factor, int64_t growth_interval) {
  if (*found_inf != 0.0f) {
    *scale = float(double(*scale) * backoff_factor);
    *growth_tracker = 0;
  } else if (++*growth_tracker >= growth_interval) {
    const float grown = float(double(*scale) * growth_factor);
    if (::isfinite(grown)) *scale = grown;
    *growth_tracker = 0;
  }
}

}  // namespace

void non_finite_check_and_unscale(Device device, DType dtype, std::vector<NormEntry>& entries, float inv_scale,
                                  float* found_inf, const float* device_scale) {
  if (entries.empty()) return;
  DeviceGuard guard(device);
  dispatch_floating(dtype, "GradScaler.unscale_", device, [&]<typename T>() {
    mark_vec4<T>(entries);
    launch_fused(device, entries, unscale_kernel<T>, inv_scale, device_scale, found_inf);
  });
}

void update_scale(Device device, float* scale, int64_t* growth_tracker, const float* found_inf, double growth_factor,
                  double backoff_factor, int64_t growth_interval) {
  DeviceGuard guard(device);
  update_scale_kernel<<<1, 1, 0, stream_for(device)>>>(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                                                       growth_interval);
  FRUGAL_CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::optim::cuda
